//! RabbitMQ streams as the relay's [`Sink`], effectively once.
//!
//! A row whose `exchange` is empty and whose `routing_key` names one of
//! `amqp.streams` goes to that stream through the stream protocol; every
//! other row goes through the AMQP sink this one wraps, in the batch's
//! order (a batch that mixes them is sent in runs, each confirmed before
//! the next starts).
//!
//! **A producer per bucket.** Each bucket publishes to a stream through a
//! producer named `{source}/{outbox table}/{bucket count}/{bucket}` —
//! the same for every worker and across restarts — and each row's
//! publishing id is its `id`. The broker stores a named producer's message
//! only if its id is greater than the last it stored for that name, and
//! confirms the repeat it drops. So a row sent again (a worker killed
//! between the broker's confirm and the database's record, a batch
//! replayed after a timeout, a bucket handed over mid-batch) is stored
//! once.
//!
//! **Taking a bucket.** When a session first publishes for a bucket it
//! asks the broker for the producer's last stored id. After taking over an
//! expired lease (the previous owner crashed or stalled), a row at or
//! below it that this process never saw was either sent by the previous
//! owner and not recorded, or committed late and never sent: the session
//! reads the stream to tell ([`StreamSession::stored_among`]). A row found
//! there is reported confirmed without being sent, and the drain loop
//! records it published (under the lease's fence, as every record); the
//! others committed late (below). After taking a free lease — released by
//! an owner that recorded all it sent (`crate::lease`, point 7) — such a
//! row was never sent: it committed late, and nothing is read.
//!
//! **A row committed late.** Ids are given at insert, rows become visible
//! at commit: a row can become visible after a later row of its bucket was
//! stored, and the named producer would drop it. The sink remembers the
//! ids it handed to each producer and the ids it found stored; a row below
//! the highest of them that is in neither (or that the broker refused) was
//! not visible when the drain passed its place, and is sent through an
//! unnamed producer, which stores what it is sent: once, but without the
//! broker's de-duplication. The counters (and the log) count each path.
//!
//! A bucket count change names new producers, of which the broker
//! remembers nothing: `outboxd repartition` first records the pending rows
//! the old producers stored ([`super::repartition`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rabbitmq_stream_protocol::ResponseCode;
use rabbitmq_stream_protocol::message::Message;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::{Confirm, Publisher, StreamClient, StreamError};
use super::gather::Gather;
use super::link::StreamLink;
use super::lookup::LookupError;
use super::message::stream_message;
use crate::sink::destinations::Kind;
use crate::sink::reach::{self, Reach};
use crate::sink::{BatchOutcome, Destinations, PublishError, PublishLimits, Session, Sink};
use crate::store::outbox::ClaimedMessage;

/// How the stream port is named in a reach's error.
const STREAM_PORT: &str = "stream port";

/// Ids a producer's memory keeps (the lowest are forgotten first).
const MEMORY_LIMIT: usize = 100_000;

/// Streams through the stream protocol; every other row through `queues`.
pub struct StreamSink {
    shared: Arc<Shared>,
    queues: Arc<dyn Sink>,
    /// The worse of the AMQP link's reach and the stream port's.
    reach_tx: watch::Sender<Reach>,
}

/// What the sink's sessions share.
struct Shared {
    link: StreamLink,
    streams: HashSet<String>,
    /// The producer name's prefix: source, outbox table, bucket count.
    prefix: String,
    memory: Mutex<HashMap<ProducerKey, Memory>>,
    delivered: Arc<Destinations>,
    /// The sessions' look-ups after taking leases over, read together.
    lookups: Arc<Gather>,
}

/// A stream and a bucket: one named producer.
type ProducerKey = (String, String);

/// What this process did with a named producer's rows.
#[derive(Default)]
struct Memory {
    /// Ids handed over and not refused.
    handed: BTreeSet<u64>,
    /// Ids found at or below the broker's last stored id and counted
    /// without being sent.
    found: BTreeSet<u64>,
    /// Ids the broker refused.
    refused: BTreeSet<u64>,
    /// The highest id handed over or found: a row below it that is in
    /// neither set was not visible when the drain passed its place.
    highest: u64,
}

impl StreamSink {
    /// `prefix` names the producers (see the module docs); rows for
    /// `streams` go through `link`, the others through `queues`; what
    /// happened to them is counted per stream in `delivered`.
    pub fn new(
        link: StreamLink,
        streams: &[String],
        prefix: String,
        queues: Arc<dyn Sink>,
        delivered: Arc<Destinations>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                link,
                streams: streams.iter().cloned().collect(),
                prefix,
                memory: Mutex::default(),
                delivered,
                lookups: Arc::default(),
            }),
            queues,
            reach_tx: watch::channel(Reach::Never { error: None }).0,
        }
    }

    /// Connects to the stream port once, without retrying: for start-up
    /// checks (a failure is also the link's reach until it connects).
    pub async fn connect_once(&self) -> Result<(), StreamError> {
        let connected = self.shared.link.client().await.map(|_| ());
        // The reach as of now, before [`Sink::keep_connected`] follows it.
        let worst = Reach::worst(
            &self.queues.reach().borrow(),
            &self.shared.link.watch_reach().borrow(),
            STREAM_PORT,
        );
        self.reach_tx.send_replace(worst);
        connected
    }

    /// The producer name of a source's bucket: stable across workers and
    /// restarts, new when the bucket count changes.
    pub fn producer_prefix(source: &str, outbox_table: &str, bucket_count: u32) -> String {
        format!("{source}/{outbox_table}/{bucket_count}")
    }
}

#[async_trait]
impl Sink for StreamSink {
    async fn open(&self, cancel: &CancellationToken) -> Option<Box<dyn Session>> {
        let queues = self.queues.open(cancel).await?;
        Some(Box::new(StreamSession {
            shared: self.shared.clone(),
            queues,
            client: None,
            named: HashMap::new(),
            unnamed: HashMap::new(),
            broken: false,
            queues_failed: false,
        }))
    }

    fn blocked(&self) -> watch::Receiver<Option<String>> {
        self.queues.blocked()
    }

    fn reach(&self) -> watch::Receiver<Reach> {
        self.reach_tx.subscribe()
    }

    async fn keep_connected(&self, cancel: CancellationToken) {
        let follow = reach::follow_worst(
            self.queues.reach(),
            self.shared.link.watch_reach(),
            STREAM_PORT,
            self.reach_tx.clone(),
            cancel.clone(),
        );
        tokio::join!(
            self.queues.keep_connected(cancel.clone()),
            self.shared.link.keep_connected(cancel),
            follow,
        );
    }

    fn deduplicates(&self, row: &ClaimedMessage) -> bool {
        row.exchange.is_empty() && self.shared.streams.contains(&row.routing_key)
    }

    fn deduplicates_any(&self) -> bool {
        !self.shared.streams.is_empty()
    }
}

/// One drainer's producers, on one connection of the link.
struct StreamSession {
    shared: Arc<Shared>,
    queues: Box<dyn Session>,
    client: Option<Arc<StreamClient>>,
    named: HashMap<ProducerKey, Producer>,
    /// One per stream, for rows committed late.
    unnamed: HashMap<String, Producer>,
    /// The stream connection failed or timed out: forget it on close.
    broken: bool,
    /// The last failure was the AMQP session's.
    queues_failed: bool,
}

struct Producer {
    publisher: Publisher,
    /// The broker's last stored id (named producers).
    stored: u64,
}

/// What happens to one row of a stream run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// At or below the last stored id, handed over before: counted.
    Stored,
    /// Through the bucket's named producer.
    Named,
    /// Committed late (or refused before): through the unnamed producer.
    Late,
    /// At or below the last stored id, never seen here, after taking over
    /// an expired lease: sent by the previous owner and not recorded, or
    /// committed late and never sent. The stream says which
    /// ([`StreamSession::stored_among`]).
    Unknown,
}

impl Memory {
    /// What to do with row `id` when the broker stored up to `stored`;
    /// `lease_was_free`: see [`PublishLimits::lease_was_free`].
    fn plan(&self, id: u64, stored: u64, lease_was_free: bool) -> Plan {
        if self.refused.contains(&id) {
            return Plan::Late;
        }
        let known = self.handed.contains(&id) || self.found.contains(&id);
        match (known, id > stored) {
            (true, true) => Plan::Named,
            (true, false) => Plan::Stored,
            (false, _) if id <= self.highest => Plan::Late,
            (false, true) => Plan::Named,
            // Below what the broker stored, never seen here: committed
            // late when the previous owner released the lease, having
            // recorded all it sent; otherwise it may have sent it.
            (false, false) if lease_was_free => Plan::Late,
            (false, false) => Plan::Unknown,
        }
    }

    fn hand(&mut self, ids: &[u64]) {
        Self::keep(&mut self.handed, &mut self.highest, ids);
    }

    fn find(&mut self, ids: &[u64]) {
        Self::keep(&mut self.found, &mut self.highest, ids);
    }

    fn keep(set: &mut BTreeSet<u64>, highest: &mut u64, ids: &[u64]) {
        set.extend(ids.iter().copied());
        if let Some(&last) = ids.iter().max() {
            *highest = (*highest).max(last);
        }
        while set.len() > MEMORY_LIMIT {
            set.pop_first();
        }
    }
}

#[async_trait]
impl Session for StreamSession {
    fn is_usable(&self) -> bool {
        !self.broken && self.queues.is_usable() && self.client.as_ref().is_none_or(|c| c.is_open())
    }

    async fn send(&mut self, rows: &[ClaimedMessage], limits: PublishLimits) -> BatchOutcome {
        let mut done = 0;
        while done < rows.len() {
            let to = self.destination(&rows[done]);
            let end = rows[done..]
                .iter()
                .position(|r| self.destination(r) != to)
                .map_or(rows.len(), |n| done + n);
            let run = &rows[done..end];
            let outcome = match to {
                None => {
                    let outcome = self.queues.send(run, limits.clone()).await;
                    self.queues_failed = outcome.failure.is_some();
                    outcome
                }
                Some((stream, bucket)) => {
                    let (stream, bucket) = (stream.to_string(), bucket.to_string());
                    self.send_stream(&stream, &bucket, run, &limits).await
                }
            };
            done += outcome.confirmed;
            if outcome.failure.is_some() {
                return BatchOutcome {
                    confirmed: done,
                    failure: outcome.failure,
                };
            }
        }
        BatchOutcome {
            confirmed: done,
            failure: None,
        }
    }

    async fn close(self: Box<Self>, after: Option<&PublishError>) {
        if let Some(client) = &self.client {
            if self.broken {
                self.shared.link.forget(client).await;
            } else if client.is_open() {
                for producer in self.named.values().chain(self.unnamed.values()) {
                    let _ = client.delete_publisher(producer.publisher.id).await;
                }
            }
        }
        let after = after.filter(|_| self.queues_failed);
        self.queues.close(after).await;
    }
}

impl StreamSession {
    /// The stream and bucket a row goes to, or `None` for AMQP.
    fn destination<'r>(&self, row: &'r ClaimedMessage) -> Option<(&'r str, &'r str)> {
        (row.exchange.is_empty() && self.shared.streams.contains(&row.routing_key))
            .then_some((row.routing_key.as_str(), row.partition_key.as_str()))
    }

    async fn client(&mut self) -> Result<Arc<StreamClient>, PublishError> {
        if let Some(client) = &self.client {
            if client.is_open() {
                return Ok(client.clone());
            }
            self.broken = true;
            return Err(PublishError::Unavailable(
                "the stream connection closed".into(),
            ));
        }
        let client = self.shared.link.client().await.map_err(unavailable)?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// The bucket's named producer on `stream`, declared (and its last
    /// stored id read) on first use.
    async fn named(&mut self, stream: &str, bucket: &str) -> Result<&mut Producer, PublishError> {
        let key = (stream.to_string(), bucket.to_string());
        if !self.named.contains_key(&key) {
            let client = self.client().await?;
            let name = format!("{}/{bucket}", self.shared.prefix);
            let publisher = client
                .declare_publisher(Some(&name), stream)
                .await
                .map_err(|e| self.refusal(stream, e))?;
            let stored = match client.publisher_sequence(&name, stream).await {
                Ok(stored) => stored,
                Err(e) => {
                    let _ = client.delete_publisher(publisher.id).await;
                    return Err(self.refusal(stream, e));
                }
            };
            self.named
                .insert(key.clone(), Producer { publisher, stored });
        }
        Ok(self.named.get_mut(&key).expect("declared above"))
    }

    /// Which of `rows` the stream holds ([`super::lookup`]), read with the
    /// other sessions' questions about it ([`super::gather`]). Each is
    /// of `bucket`, at or below what the broker stored for the bucket's
    /// producer, and was never seen by this process, which took the lease
    /// over after it expired: its previous owner sent it and never recorded
    /// it, or it committed late and nobody sent it. Only the stream can
    /// tell. The previous owner's trust ended before this lease was taken,
    /// so whatever it sent lies below the stream's end as it is now.
    async fn stored_among(
        &mut self,
        stream: &str,
        bucket: &str,
        rows: &[&ClaimedMessage],
    ) -> Result<HashSet<u64>, PublishError> {
        let client = self.client().await?;
        let wait = self.shared.link.request_timeout();
        let wanted: HashSet<u64> = rows.iter().map(|r| r.id as u64).collect();
        let oldest = rows.iter().map(|r| r.created_at).min().unwrap_or_default();
        let gather = &self.shared.lookups;
        let read = gather
            .stored_among(client, stream, bucket, wanted, oldest, wait)
            .await;
        read.map_err(|e| match e {
            LookupError::Subscribe(e) => self.refusal(stream, e),
            LookupError::Credit(e) => unavailable(e),
            LookupError::Closed => self.lost(),
            LookupError::Timeout(d) => PublishError::Timeout(d),
        })
    }

    /// The stream connection closed under a request.
    fn lost(&mut self) -> PublishError {
        self.broken = true;
        PublishError::Unavailable("stream port: the connection closed".into())
    }

    async fn unnamed(&mut self, stream: &str) -> Result<&mut Producer, PublishError> {
        if !self.unnamed.contains_key(stream) {
            let client = self.client().await?;
            let publisher = client
                .declare_publisher(None, stream)
                .await
                .map_err(|e| self.refusal(stream, e))?;
            self.unnamed.insert(
                stream.to_string(),
                Producer {
                    publisher,
                    stored: 0,
                },
            );
        }
        Ok(self.unnamed.get_mut(stream).expect("declared above"))
    }

    /// What a failed request means for the row: a missing stream is the
    /// row's (it is retried, and parked after `max_attempts`), a lost
    /// connection is not.
    fn refusal(&mut self, stream: &str, error: StreamError) -> PublishError {
        match error {
            StreamError::Refused { code, .. } => refused(stream, &code),
            StreamError::Timeout(d) => {
                self.broken = true;
                PublishError::Timeout(d)
            }
            other => {
                self.broken = true;
                unavailable(other)
            }
        }
    }

    /// Sends one bucket's rows for `stream`, in order.
    async fn send_stream(
        &mut self,
        stream: &str,
        bucket: &str,
        run: &[ClaimedMessage],
        limits: &PublishLimits,
    ) -> BatchOutcome {
        let fail = |confirmed, failure| BatchOutcome {
            confirmed,
            failure: Some(failure),
        };
        if limits.stop_sending_at.is_some_and(|t| Instant::now() >= t) {
            return fail(0, PublishError::LeaseLapsed);
        }
        let stored = match self.named(stream, bucket).await {
            Ok(producer) => producer.stored,
            Err(e) => return fail(0, e),
        };
        let key = (stream.to_string(), bucket.to_string());
        let mut plans: Vec<Plan> = {
            let memory = self.shared.memory.lock().expect("not poisoned");
            let none = Memory::default();
            let memory = memory.get(&key).unwrap_or(&none);
            run.iter()
                .map(|r| memory.plan(r.id as u64, stored, limits.lease_was_free))
                .collect()
        };
        let unknown: Vec<&ClaimedMessage> = run
            .iter()
            .zip(&plans)
            .filter(|(_, p)| **p == Plan::Unknown)
            .map(|(r, _)| r)
            .collect();
        if !unknown.is_empty() {
            let found = match self.stored_among(stream, bucket, &unknown).await {
                Ok(found) => found,
                Err(e) => return fail(0, e),
            };
            tracing::info!(
                bucket,
                stream,
                in_stream = found.len(),
                not_in_stream = unknown.len() - found.len(),
                "rows below the broker's last stored id ({stored}) after taking over an expired lease, looked up in the stream: those in it are recorded without being sent again, the others committed late"
            );
            for (row, plan) in run.iter().zip(plans.iter_mut()) {
                if *plan == Plan::Unknown {
                    *plan = if found.contains(&(row.id as u64)) {
                        Plan::Stored
                    } else {
                        Plan::Late
                    };
                }
            }
        }
        let mut done = 0;
        while done < run.len() {
            let plan = plans[done];
            let end = plans[done..]
                .iter()
                .position(|p| *p != plan)
                .map_or(run.len(), |n| done + n);
            if plan == Plan::Stored {
                let ids: Vec<u64> = run[done..end].iter().map(|r| r.id as u64).collect();
                let mut memory = self.shared.memory.lock().expect("not poisoned");
                memory.entry(key.clone()).or_default().find(&ids);
                drop(memory);
                let found = (end - done) as u64;
                self.shared.delivered.add(Kind::Stream, stream, |t| {
                    t.delivered += found;
                    t.already_stored += found;
                });
                tracing::info!(
                    bucket,
                    stream,
                    rows = end - done,
                    first = run[done].id,
                    last = run[end - 1].id,
                    "rows already in the stream (the broker's last stored id is {stored}): recorded without sending them again"
                );
                done = end;
                continue;
            }
            if plan == Plan::Late {
                tracing::info!(
                    bucket,
                    stream,
                    rows = end - done,
                    first = run[done].id,
                    "rows committed after later rows of their bucket were stored: sent through an unnamed producer"
                );
            }
            // Rows are checked before any is sent: the first bad one ends
            // the segment, and the batch after it.
            let mut messages = Vec::with_capacity(end - done);
            let mut bad = None;
            for row in &run[done..end] {
                match stream_message(row, limits) {
                    Ok(m) => messages.push((row.id as u64, m)),
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                }
            }
            let sent = messages.len();
            if sent > 0 {
                let result = self.publish(stream, bucket, plan, messages, limits).await;
                let confirmed = match &result {
                    Ok(()) => sent,
                    Err((n, _)) => *n,
                };
                self.shared.delivered.add(Kind::Stream, stream, |t| {
                    t.delivered += confirmed as u64;
                    if plan == Plan::Late {
                        t.late += confirmed as u64;
                    }
                });
                if let Err((n, failure)) = result {
                    return fail(done + n, failure);
                }
            }
            done += sent;
            if let Some(e) = bad {
                return fail(done, e);
            }
        }
        BatchOutcome {
            confirmed: done,
            failure: None,
        }
    }

    /// Publishes one segment through the producer `plan` names and waits
    /// for the broker's answer to each message: `Err((n, why))` when only
    /// the first `n` were stored.
    async fn publish(
        &mut self,
        stream: &str,
        bucket: &str,
        plan: Plan,
        messages: Vec<(u64, Message)>,
        limits: &PublishLimits,
    ) -> Result<(), (usize, PublishError)> {
        let ids: Vec<u64> = messages.iter().map(|(id, _)| *id).collect();
        let key = (stream.to_string(), bucket.to_string());
        let client = self.client().await.map_err(|e| (0, e))?;
        let shared = self.shared.clone();
        let producer = match plan {
            Plan::Named => self.named(stream, bucket).await,
            _ => self.unnamed(stream).await,
        }
        .map_err(|e| (0, e))?;
        let publisher = producer.publisher.id;
        if plan == Plan::Named {
            let mut memory = shared.memory.lock().expect("not poisoned");
            memory.entry(key.clone()).or_default().hand(&ids);
        }
        let hold = limits.trust.clone().map(|t| shared.link.gate().hold(t));
        let timeout = shared.link.request_timeout();
        let deadline = Instant::now() + timeout;
        let answers = async {
            client
                .publish(publisher, messages)
                .await
                .map_err(unavailable)?;
            // Only this segment's ids count: an answer for another id
            // (none is expected) cannot end the wait early.
            let waiting: HashSet<u64> = ids.iter().copied().collect();
            let mut answered: HashMap<u64, Option<ResponseCode>> = HashMap::new();
            while answered.len() < waiting.len() {
                match producer.publisher.confirms.recv().await {
                    Some(Confirm::Stored(stored)) => {
                        for id in stored.into_iter().filter(|id| waiting.contains(id)) {
                            answered.insert(id, None);
                        }
                    }
                    Some(Confirm::Refused(refused)) => {
                        for (id, code) in refused {
                            if waiting.contains(&id) {
                                answered.insert(id, Some(code));
                            }
                        }
                    }
                    None => {
                        return Err(PublishError::Unavailable(
                            "the stream connection closed".into(),
                        ));
                    }
                }
            }
            Ok(answered)
        };
        let answered = match tokio::time::timeout_at(deadline, answers).await {
            Ok(Ok(answered)) => answered,
            Ok(Err(e)) => {
                self.broken = true;
                if let Some(hold) = hold {
                    hold.linger();
                }
                return Err((0, e));
            }
            Err(_) => {
                self.broken = true;
                if let Some(hold) = hold {
                    hold.linger();
                }
                return Err((0, PublishError::Timeout(timeout)));
            }
        };
        drop(hold);
        if plan == Plan::Named {
            let last = ids
                .iter()
                .take_while(|id| matches!(answered.get(id), Some(None)))
                .last();
            if let (Some(&last), Some(producer)) = (last, self.named.get_mut(&key)) {
                producer.stored = producer.stored.max(last);
            }
        }
        let mut memory = self.shared.memory.lock().expect("not poisoned");
        let memory = memory.entry(key).or_default();
        for (n, id) in ids.iter().enumerate() {
            match answered.get(id) {
                Some(None) => {
                    memory.refused.remove(id);
                }
                Some(Some(code)) => {
                    // Every refused id is sent again through the unnamed
                    // producer: the named one may have stored a later id.
                    for id in &ids[n..] {
                        if matches!(answered.get(id), Some(Some(_))) {
                            memory.refused.insert(*id);
                            memory.handed.remove(id);
                        }
                    }
                    return Err((n, refused(stream, code)));
                }
                // The wait above ends only once every id is answered.
                None => return Err((n, PublishError::Timeout(timeout))),
            }
        }
        Ok(())
    }
}

fn unavailable(e: StreamError) -> PublishError {
    PublishError::Unavailable(format!("stream port: {e}"))
}

/// A broker's refusal of a stream's message, as the drain loop sees it.
fn refused(stream: &str, code: &ResponseCode) -> PublishError {
    match code {
        ResponseCode::StreamDoesNotExist => PublishError::Rejected(format!(
            "stream {stream:?} does not exist: create it (outboxd streams declare {stream}) \
             or take it out of amqp.streams"
        )),
        ResponseCode::PublisherDoesNotExist | ResponseCode::StreamNotAvailable => {
            PublishError::Unavailable(format!("stream {stream:?}: {code:?}"))
        }
        ResponseCode::AccessRefused => PublishError::Rejected(format!(
            "stream {stream:?}: the broker refused access (the user needs write permission on it)"
        )),
        other => {
            PublishError::Rejected(format!("stream {stream:?}: the broker refused: {other:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_above_the_last_stored_id_go_named_below_it_are_counted_late_or_looked_up() {
        let mut memory = Memory::default();
        // A new owner after an expiry: the broker stored up to 10, this
        // process sent nothing; the stream says whether 7 is in it.
        assert_eq!(memory.plan(7, 10, false), Plan::Unknown);
        assert_eq!(memory.plan(11, 10, false), Plan::Named);
        memory.hand(&[11, 12, 14]);
        // 14 stored; 13 committed late.
        assert_eq!(memory.plan(13, 14, false), Plan::Late);
        assert_eq!(memory.plan(12, 14, false), Plan::Stored);
        assert_eq!(memory.plan(15, 14, false), Plan::Named);
        // Handed over but not stored (a timeout): sent again, named.
        assert_eq!(memory.plan(14, 12, false), Plan::Named);
        // Found stored at a take-over, then a row below it commits.
        let mut taken = Memory::default();
        assert_eq!(taken.plan(20, 22, false), Plan::Unknown);
        taken.find(&[20, 22]);
        assert_eq!(
            taken.plan(22, 22, false),
            Plan::Stored,
            "found again: a lost record"
        );
        assert_eq!(
            taken.plan(21, 22, false),
            Plan::Late,
            "committed after the drain passed"
        );
        // Taken from a released lease: nothing below the last stored id
        // went unrecorded, so a row there committed late.
        assert_eq!(Memory::default().plan(7, 10, true), Plan::Late);
        assert_eq!(Memory::default().plan(11, 10, true), Plan::Named);
        // Refused: through the unnamed producer, even above the last stored.
        memory.refused.insert(16);
        assert_eq!(memory.plan(16, 15, false), Plan::Late);
    }
}
