//! Which of some buckets' rows a stream holds, read from the stream itself:
//! from a time up to the stream's end as it is when the read starts, each
//! message's row id and bucket taken from its application properties. One
//! read answers for every bucket asked about.
//!
//! Two callers ask it about rows the broker's de-duplication can no longer
//! tell apart: the sessions that took leases over after they expired,
//! about rows their predecessors may have sent and not recorded
//! ([`super::sink`], their questions gathered by [`super::gather`]); and
//! `outboxd repartition`, about rows the old bucket count's producers may
//! have stored ([`super::repartition`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rabbitmq_stream_protocol::commands::subscribe::OffsetSpecification;
use rabbitmq_stream_protocol::message::{Message, SimpleValue};

use super::client::{StreamClient, StreamError};
use crate::amqp::{HEADER_ID, HEADER_PARTITION_KEY};

/// How long before the oldest row's creation a read starts: room for the
/// difference between the database's clock and the broker's.
pub const LOOKUP_MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// Where a read starts again, before the oldest row's creation, when
/// nothing at all followed [`LOOKUP_MARGIN`]: a broker whose clock is
/// behind the database's (a clock stepped forward under the broker's
/// Erlang VM, which catches up by 0.6 s a minute) stamped the rows earlier
/// than they were created. (A read that finds nothing ends after waiting
/// for a chunk: one more wait, only then.)
const FURTHER_BACK: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// Why a read did not finish.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// Subscribing was refused or failed.
    #[error("subscribing: {0}")]
    Subscribe(StreamError),
    /// Asking for the next chunk failed.
    #[error("asking for the next chunk: {0}")]
    Credit(StreamError),
    /// The connection closed under the read.
    #[error("the stream connection closed")]
    Closed,
    /// No chunk came within the wait, after some had.
    #[error("no chunk within {0:?}")]
    Timeout(Duration),
}

/// Row ids, by bucket.
pub type Rows = HashMap<String, HashSet<u64>>;

/// The ids among `wanted` (rows by bucket, the oldest of them created at
/// `oldest`) that `stream` holds. It is read from [`LOOKUP_MARGIN`] before
/// `oldest` (a row is stored after its insert) up to its end as it is now
/// — from further back ([`FURTHER_BACK`]) when nothing follows that start
/// — each chunk awaited at most `wait`: the caller knows that whatever was
/// sent of them lies below that end. One read answers for every bucket in
/// `wanted` ([`super::gather`] gathers the buckets that ask at once).
pub async fn stored_among(
    client: &StreamClient,
    stream: &str,
    wanted: &Rows,
    oldest: DateTime<Utc>,
    wait: Duration,
) -> Result<Rows, LookupError> {
    let mut last = client
        .subscribe(stream, OffsetSpecification::Last, 1)
        .await
        .map_err(LookupError::Subscribe)?;
    let chunk = tokio::time::timeout(wait, last.chunks.recv()).await;
    let _ = client.unsubscribe(last.id).await;
    let end = match chunk {
        Ok(Some(chunk)) => chunk.next_offset(),
        Ok(None) => return Err(LookupError::Closed),
        // Nothing to deliver: the stream is empty (its retention removed
        // everything), and holds none of them.
        Err(_) => return Ok(Rows::new()),
    };
    for margin in [LOOKUP_MARGIN, FURTHER_BACK] {
        let from = OffsetSpecification::Timestamp((oldest - margin).timestamp_millis());
        if let Some(found) = read(client, stream, wanted, from, end, wait).await? {
            return Ok(found);
        }
    }
    // Nothing from the furthest start on: those rows are sent again
    // rather than lost.
    tracing::warn!(
        stream,
        "the stream holds nothing from {FURTHER_BACK:?} before the rows were created; taking them for rows never sent"
    );
    Ok(Rows::new())
}

/// The ids among `wanted` that `stream` holds from `from` up to the offset
/// `end`; `None` when nothing at all came from `from` on.
async fn read(
    client: &StreamClient,
    stream: &str,
    wanted: &Rows,
    from: OffsetSpecification,
    end: u64,
    wait: Duration,
) -> Result<Option<Rows>, LookupError> {
    let all: usize = wanted.values().map(HashSet::len).sum();
    let mut found = Rows::new();
    let mut found_count = 0;
    let mut reader = client
        .subscribe(stream, from, 4)
        .await
        .map_err(LookupError::Subscribe)?;
    let started = std::time::Instant::now();
    let mut read = 0usize;
    let outcome = loop {
        match tokio::time::timeout(wait, reader.chunks.recv()).await {
            Ok(Some(chunk)) => {
                read += chunk.len();
                let next = chunk.next_offset();
                for (bucket, id) in chunk.messages.iter().filter_map(row_of) {
                    if wanted.get(bucket).is_some_and(|ids| ids.contains(&id))
                        && found.entry(bucket.to_string()).or_default().insert(id)
                    {
                        found_count += 1;
                    }
                }
                if next >= end || found_count == all {
                    break Ok(Some(found));
                }
                if let Err(e) = client.credit(reader.id, 1).await {
                    break Err(LookupError::Credit(e));
                }
            }
            Ok(None) => break Err(LookupError::Closed),
            Err(_) if read == 0 => break Ok(None),
            Err(_) => break Err(LookupError::Timeout(wait)),
        }
    };
    let _ = client.unsubscribe(reader.id).await;
    tracing::info!(
        stream,
        messages = read,
        buckets = wanted.len(),
        ms = started.elapsed().as_millis() as u64,
        "read the stream for rows an earlier owner may have sent"
    );
    outcome
}

/// The bucket and row id of a message (by its application properties).
fn row_of(message: &Message) -> Option<(&str, u64)> {
    let properties = message.application_properties()?;
    let Some(SimpleValue::String(bucket)) = properties.get(HEADER_PARTITION_KEY) else {
        return None;
    };
    match properties.get(HEADER_ID) {
        Some(SimpleValue::Ulong(id)) => Some((bucket.as_str(), *id)),
        _ => None,
    }
}
