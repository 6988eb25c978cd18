//! Before a bucket count change (`outboxd repartition`): the pending rows
//! the streams already hold.
//!
//! A bucket's producer is named after the bucket count ([`super::sink`]),
//! so after a change each row goes out under a new name, of which the
//! broker remembers nothing. A row that the old count's producer stored and
//! that no worker recorded — its worker was killed between the broker's
//! confirm and the database's record, and no worker took the bucket over
//! before the fleet stopped — would be stored a second time. So, for each
//! old bucket and each stream, the pending rows at or below the last id the
//! broker stored for that producer are looked up in the stream
//! ([`super::lookup`]; one read of each stream for every bucket), and the
//! repartition records those it finds published, in its own transaction
//! ([`crate::store::repartition`]). The others committed late or were
//! never sent: they go out under the new names. No worker is live while
//! the repartition runs (it refuses otherwise), so nothing is sent
//! meanwhile.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use anyhow::Context;
use rabbitmq_stream_protocol::ResponseCode;

use super::client::StreamError;
use super::link::StreamLink;
use super::lookup::{self, Rows};
use super::sink::StreamSink;
use crate::config::Config;
use crate::partitioner::Partitioner;
use crate::store::Store;

/// The ids of the pending rows that `store`'s streams (`amqp.streams`)
/// hold, sent under the producers of `buckets` buckets of `source`. None
/// without streams.
pub async fn stored_pending(
    config: &Config,
    source: &str,
    store: &Store,
    buckets: u32,
) -> anyhow::Result<Vec<i64>> {
    let streams = &config.amqp.streams;
    if streams.is_empty() {
        return Ok(Vec::new());
    }
    let link = StreamLink::new(&config.amqp)?;
    let client = link
        .client()
        .await
        .context("the stream port, to find the rows the streams already hold")?;
    let wait = link.request_timeout();
    let prefix = StreamSink::producer_prefix(source, &config.tables.outbox, buckets);
    // Per stream: the rows to look for, by bucket, and the oldest of them.
    let mut wanted: HashMap<&str, (Rows, Option<DateTime<Utc>>)> = HashMap::new();
    for bucket in Partitioner::new(buckets).labels() {
        let name = format!("{prefix}/{bucket}");
        let mut last = Vec::with_capacity(streams.len());
        for stream in streams {
            match client.publisher_sequence(&name, stream).await {
                Ok(id) => last.push(id),
                // A stream that does not exist holds nothing.
                Err(StreamError::Refused {
                    code: ResponseCode::StreamDoesNotExist,
                    ..
                }) => last.push(0),
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("reading the last id the broker stored for {name} on {stream}")
                    });
                }
            }
        }
        let Some(&up_to) = last.iter().max().filter(|&&id| id > 0) else {
            continue;
        };
        let pending = store.pending_up_to(&bucket, up_to as i64).await?;
        for (stream, &last) in streams.iter().zip(&last) {
            let rows: Vec<_> = pending
                .iter()
                .filter(|r| r.exchange.is_empty() && r.routing_key == *stream)
                .filter(|r| r.id as u64 <= last)
                .collect();
            let Some(oldest) = rows.iter().map(|r| r.created_at).min() else {
                continue;
            };
            let (rows_of, oldest_of) = wanted.entry(stream.as_str()).or_default();
            rows_of.insert(bucket.clone(), rows.iter().map(|r| r.id as u64).collect());
            *oldest_of = Some(oldest_of.map_or(oldest, |o| o.min(oldest)));
        }
    }
    let mut stored = Vec::new();
    for (stream, (rows, oldest)) in wanted {
        let oldest = oldest.expect("set with the first rows");
        let found = lookup::stored_among(&client, stream, &rows, oldest, wait)
            .await
            .with_context(|| format!("reading stream {stream}"))?;
        for (bucket, ids) in &rows {
            let in_stream = found.get(bucket).map_or(0, HashSet::len);
            tracing::info!(
                bucket,
                stream,
                in_stream,
                not_in_stream = ids.len() - in_stream,
                "pending rows below the broker's last stored id of the old bucket count's producer, looked up in the stream"
            );
        }
        stored.extend(found.into_values().flatten().map(|id| id as i64));
    }
    stored.sort_unstable();
    Ok(stored)
}
