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

/// Where a read starts again, before the oldest row's creation, when the
/// read from [`LOOKUP_MARGIN`] before it started too late: a broker whose
/// clock is behind the database's (a clock stepped forward under the
/// broker's Erlang VM, which catches up by 0.6 s a minute) stamped the
/// rows earlier than they were created. A read started too late when
/// nothing at all followed its start, or when a bucket has a row not found
/// and the read's first message of that bucket has a higher id or there is
/// none ([`Read::started_late`]). (A read that finds nothing ends after
/// waiting for a chunk: one more wait, only then.)
const FURTHER_BACK: [chrono::TimeDelta; 2] = [
    chrono::TimeDelta::minutes(2),
    chrono::TimeDelta::minutes(10),
];

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
/// — from further back ([`FURTHER_BACK`]) when that read started too late
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
    let furthest = FURTHER_BACK[FURTHER_BACK.len() - 1];
    // What the reads so far found; a read from further back stops where
    // the one before it started.
    let mut later: Option<Read> = None;
    for margin in std::iter::once(LOOKUP_MARGIN).chain(FURTHER_BACK) {
        let from = OffsetSpecification::Timestamp((oldest - margin).timestamp_millis());
        let until = later.as_ref().map_or(end, |later| later.start);
        let Some(read) = read(client, stream, wanted, from, until, wait).await? else {
            continue;
        };
        let read = match later.take() {
            Some(later) => read.followed_by(later),
            None => read,
        };
        match read.started_late(wanted) {
            Some(bucket) if margin < furthest => {
                tracing::info!(
                    stream,
                    bucket,
                    "the read from {} s before the rows were created holds none of a bucket's rows \
                     below one not found: reading from further back (the broker's clock behind the database's?)",
                    margin.num_seconds()
                );
                later = Some(read);
            }
            _ => return Ok(read.found),
        }
    }
    if let Some(read) = later {
        return Ok(read.found);
    }
    // Nothing from the furthest start on: those rows are sent again
    // rather than lost.
    tracing::warn!(
        stream,
        "the stream holds nothing from {} s before the rows were created; taking them for rows never sent",
        furthest.num_seconds()
    );
    Ok(Rows::new())
}

/// What a read found.
struct Read {
    /// The offset it started at.
    start: u64,
    /// The ids among those wanted that the stream holds.
    found: Rows,
    /// The id of the read's first message of each bucket asked about.
    first: HashMap<String, u64>,
}

impl Read {
    /// A bucket whose rows may have been stored before the read's start:
    /// it has a row not found, and the read holds no message of the bucket
    /// or its first has a higher id. A bucket's producer stores ids in
    /// rising order, so a row it stored lies before the first message the
    /// read holds with a higher id. (A row that committed after higher
    /// ids were stored, and was not sent yet, looks the same: then the
    /// stream is read from further back for nothing.)
    fn started_late<'w>(&self, wanted: &'w Rows) -> Option<&'w str> {
        wanted.iter().find_map(|(bucket, ids)| {
            let found = self.found.get(bucket);
            let lowest_missing = ids
                .iter()
                .filter(|id| !found.is_some_and(|found| found.contains(id)))
                .min()?;
            match self.first.get(bucket) {
                Some(first) if first <= lowest_missing => None,
                _ => Some(bucket.as_str()),
            }
        })
    }

    /// This read, from further back, and `later`, the read that started
    /// where this one stopped, as one.
    fn followed_by(mut self, later: Read) -> Read {
        for (bucket, ids) in later.found {
            self.found.entry(bucket).or_default().extend(ids);
        }
        for (bucket, id) in later.first {
            self.first.entry(bucket).or_insert(id);
        }
        self
    }
}

/// What `stream` holds of `wanted` from `from` up to the offset `end`
/// (the chunk that holds it read whole); `None` when nothing at all came
/// from `from` on.
async fn read(
    client: &StreamClient,
    stream: &str,
    wanted: &Rows,
    from: OffsetSpecification,
    end: u64,
    wait: Duration,
) -> Result<Option<Read>, LookupError> {
    let all: usize = wanted.values().map(HashSet::len).sum();
    let mut found = Rows::new();
    let mut first = HashMap::new();
    let mut start = None;
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
                let began = *start.get_or_insert(chunk.first_offset);
                let next = chunk.next_offset();
                for (bucket, id) in chunk.messages.iter().filter_map(row_of) {
                    let Some(ids) = wanted.get(bucket) else {
                        continue;
                    };
                    if !first.contains_key(bucket) {
                        first.insert(bucket.to_string(), id);
                    }
                    if ids.contains(&id) && found.entry(bucket.to_string()).or_default().insert(id)
                    {
                        found_count += 1;
                    }
                }
                if next >= end || found_count == all {
                    break Ok(Some(Read {
                        start: began,
                        found,
                        first,
                    }));
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
