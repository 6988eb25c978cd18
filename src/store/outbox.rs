//! The `outbox` table: enqueue, claim, and the outcome of a publish — the
//! types and the interface every backend implements ([`OutboxStore`]).
//!
//! Claiming reads the first `batch_size` unpublished, unparked rows of one
//! bucket in `id` order, keeps the prefix of them that is ready, and records
//! the claim once, on the bucket's row (claim token and expiry), not on
//! every row. A row that is not ready — a failing head waiting for its
//! backoff — stops the prefix, so nothing behind it in the bucket is
//! claimed: head-of-line blocking per bucket, and only per bucket. A bucket
//! has one claim at a time: another token's live claim blocks it.
//!
//! Every write after the claim matches the bucket's claim token, and, in
//! fleet mode, the lease fence `(partition_key, lease_owner, lease_epoch)`
//! in the same statement (both live on the bucket's row): a worker that lost
//! its claim or its lease writes nothing. A published message costs one
//! row write, the record: an update that sets `published_at`, or, with
//! `outbox.keep_published = false`, a delete ([`Published`]).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{Value as Json, json};
use uuid::Uuid;

use super::error::StoreError;

/// A claimed row as `ClaimSql::read` returns it: with whether it is
/// ready, and whether the reader held the bucket's claim (decoded by
/// position, [`super::rows`]).
pub struct ClaimCandidate {
    pub(crate) row: ClaimedMessage,
    pub(crate) not_ready: bool,
    pub(crate) held: Option<bool>,
}

/// A message to enqueue.
#[derive(Debug, Clone)]
pub struct Message {
    pub(crate) message_key: String,
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: Json,
    pub(crate) content_type: Option<String>,
}
impl Message {
    /// A message for `message_key` (the aggregate or stream id whose messages
    /// must stay in order), to `exchange` (`""` = the default exchange) with
    /// `routing_key`.
    pub fn new(
        message_key: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            message_key: message_key.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            payload: payload.into(),
            headers: Json::Object(Default::default()),
            content_type: None,
        }
    }

    /// Adds an AMQP header (a JSON value: string, number, bool, null, array
    /// or object).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Json>) -> Self {
        if let Json::Object(map) = &mut self.headers {
            map.insert(name.into(), value.into());
        }
        self
    }

    /// Carries a trace context: its `traceparent` and `tracestate` become
    /// the message's headers of those names (W3C trace context), which the
    /// relay copies to the AMQP message and continues in its own span.
    pub fn trace_context(self, context: &crate::otel::TraceContext) -> Self {
        let message = self.header("traceparent", context.parent.to_string());
        match &context.state {
            Some(state) => message.header("tracestate", state.clone()),
            None => message,
        }
    }

    /// Whether a `traceparent` header is set.
    pub fn has_trace_context(&self) -> bool {
        self.headers.get("traceparent").is_some()
    }

    /// Sets the AMQP content type.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }
}

/// Identifies one batch claim of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimToken(pub Uuid);

impl ClaimToken {
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

/// The lease a write is made under (fleet mode). `None` in `--no-leasing`
/// mode, where the single worker owns every bucket by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub owner: Uuid,
    pub epoch: i64,
}

/// What a drainer's writes to its bucket are checked against — its claim
/// token and, in fleet mode, its lease — and what recording a publish
/// does with the rows.
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    pub partition_key: &'a str,
    pub token: ClaimToken,
    pub fence: Option<Fence>,
    pub published: Published,
}

/// What recording a publish does with a row (`outbox.keep_published`).
/// Either way the statement carries the same fence and matches only rows
/// still unpublished, so what it reports affected is what this holder
/// recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Published {
    /// Sets `published_at`; the row stays for the Published view until
    /// `outbox.retention` purges it.
    #[default]
    Kept,
    /// Deletes the row.
    Deleted,
}

impl Published {
    pub fn from_keep(keep_published: bool) -> Self {
        if keep_published {
            Self::Kept
        } else {
            Self::Deleted
        }
    }
}

/// A claim request: up to `limit` ready rows of the holder's bucket, not
/// among `in_flight` (the batch the drainer is still publishing).
///
/// A claim takes (or renews) the bucket's claim for `claim_ttl`, a write,
/// unless the caller says it `held` the claim and the holder's token does
/// hold it with at least `min_left` to run: then the rows are read under
/// it and nothing is written (no commit to wait for on the way to the
/// broker). So every claim returns rows covered by the claim for at least
/// `min_left`, and one made without `held` that returns rows has taken or
/// renewed it: it is the holder's for `claim_ttl` from the call.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub holder: Holder<'a>,
    pub limit: u32,
    pub claim_ttl: Duration,
    /// At most `claim_ttl`.
    pub min_left: Duration,
    pub in_flight: &'a [i64],
    /// The caller believes its token holds the claim with at least
    /// `min_left` to run (it took or renewed it less than `claim_ttl -
    /// min_left` ago): the claim starts with a read that may be all it
    /// costs. A wrong belief costs that read; it never lets rows out
    /// unclaimed, since the read checks the claim in the database.
    pub held: bool,
}

/// A claimed row, everything needed to publish it (decoded by position,
/// [`super::rows`]).
#[derive(Debug, Clone)]
pub struct ClaimedMessage {
    pub id: i64,
    pub message_id: Uuid,
    pub partition_key: String,
    pub message_key: String,
    pub exchange: String,
    pub routing_key: String,
    pub headers: Json,
    pub content_type: Option<String>,
    pub payload: Vec<u8>,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

/// How to treat a failed row.
#[derive(Debug, Clone, Copy)]
pub struct FailurePolicy {
    /// Park after this many attempts; 0 never parks.
    pub max_attempts: u32,
    /// Whether this failure may park the row: only failures caused by the
    /// row itself do; a slow or absent broker never parks anything.
    pub may_park: bool,
    pub backoff_initial_ms: f64,
    pub backoff_max_ms: f64,
}

impl FailurePolicy {
    /// How long a row that failed after `attempts` earlier attempts waits
    /// before it is ready again: the initial delay doubled per earlier
    /// attempt, capped — what every backend's `record_failure` statement
    /// adds to the database's clock.
    pub fn backoff_after(&self, attempts: i32) -> Duration {
        let doubled = self.backoff_initial_ms * 2f64.powi(attempts.clamp(0, 30));
        Duration::from_secs_f64(self.backoff_max_ms.min(doubled).max(0.0) / 1000.0)
    }
}

/// A failed publish of one row of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    pub id: i64,
    pub error: &'a str,
    pub policy: FailurePolicy,
}

/// What recording a batch that ended in a failure did.
#[derive(Debug, Clone, Copy, Default)]
pub struct FailureRecord {
    /// Confirmed rows recorded as published.
    pub published: u64,
    /// For a failure that counts an attempt: `None` when the row no longer
    /// matched (claim or lease lost), else whether it was parked.
    pub parked: Option<bool>,
}

/// Which messages a view lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageState {
    /// Not yet published, not parked; oldest first.
    Pending,
    /// Published; newest first.
    Published,
    /// Parked after max_attempts; newest first.
    Failed,
}

/// A message in a list.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct MessageSummary {
    pub id: i64,
    pub partition_key: String,
    pub message_key: String,
    pub exchange: String,
    pub routing_key: String,
    pub message_id: Uuid,
    pub created_at: DateTime<Utc>,
    pub available_at: DateTime<Utc>,
    pub published_at: Option<DateTime<Utc>>,
    pub failed_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub payload_bytes: i32,
}

/// One message with everything.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MessageDetail {
    #[sqlx(flatten)]
    pub summary: MessageSummary,
    pub headers: Json,
    pub content_type: Option<String>,
    pub payload: Vec<u8>,
}

/// The head of one bucket: its oldest pending row, if any.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BucketHead {
    pub partition_key: String,
    pub id: Option<i64>,
    pub created_at: Option<DateTime<Utc>>,
    pub attempts: Option<i32>,
    pub last_error: Option<String>,
    /// Seconds since the head was created (0 when the bucket is empty).
    pub lag_seconds: f64,
}

/// The `outbox` table, as every backend implements it.
#[async_trait]
pub trait OutboxStore {
    /// Enqueues one message in a transaction of its own; returns its id.
    /// (Producers enqueue inside their own transactions with the Rust
    /// `Producer` of `src/producer.rs`, which sits above the store.)
    async fn enqueue(&self, message: &Message) -> Result<i64, StoreError>;

    /// Claims the ready prefix of a bucket's first `limit` pending rows not
    /// in `in_flight`, returned in `id` order, and takes or renews the
    /// bucket's claim under the holder's token. Empty when nothing is ready,
    /// the head is waiting for a retry, another token's claim holds the
    /// bucket, or (fleet mode) the lease is not the holder's or expired.
    async fn claim(&self, claim: Claim<'_>) -> Result<Vec<ClaimedMessage>, StoreError>;

    /// Marks confirmed rows published; returns how many rows matched (fewer
    /// than `ids.len()` means the claim or the lease was lost).
    async fn record_published(&self, holder: Holder<'_>, ids: &[i64]) -> Result<u64, StoreError>;

    /// Records the outcome of a batch that ended in a failure, in one
    /// transaction: the confirmed prefix `confirmed` is published, and the
    /// failed row (when the failure counts an attempt) gets `attempts + 1`,
    /// `last_error`, `available_at` pushed back by the backoff, maybe
    /// parked. A crash in between leaves the claim to expire rather than a
    /// half-recorded batch.
    async fn record_failure(
        &self,
        holder: Holder<'_>,
        confirmed: &[i64],
        failure: Option<Failure<'_>>,
    ) -> Result<FailureRecord, StoreError>;

    /// Deletes up to `limit` rows published more than `older_than` ago,
    /// oldest first, unless another process holds the purge lock. Returns
    /// how many rows went.
    async fn purge_batch(&self, older_than: Duration, limit: i64) -> Result<u64, StoreError>;

    /// After a large purge: gives the table's space and statistics back
    /// (PostgreSQL: `VACUUM (ANALYZE)`; MySQL: `ANALYZE TABLE`). Slow, and
    /// its failure is not fatal.
    async fn tidy_after_purge(&self) -> Result<(), StoreError>;
}

/// The dashboard's and `outboxd failed list`'s pages of messages, as every
/// backend implements them.
#[async_trait]
pub trait MessageViews {
    /// A page of messages in `state`, optionally of one key. `cursor` is the
    /// last id of the previous page (pending pages go up, others down).
    async fn list_messages(
        &self,
        state: MessageState,
        message_key: Option<&str>,
        cursor: Option<i64>,
        limit: i64,
    ) -> Result<Vec<MessageSummary>, StoreError>;
}

/// An operator's actions on parked messages, each audited, as every
/// backend implements them (the stepwise backends through
/// [`super::stepwise::operator`]).
#[async_trait]
pub trait ParkedStore {
    /// Deletes parked messages, recording them with `actor` and `reason` in
    /// the audit table; returns the ids dropped (only parked rows are).
    async fn drop_parked(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<Vec<i64>, StoreError>;

    /// Requeues parked messages (by id, every parked one of `buckets`, or
    /// with `all` every parked one); returns the ids requeued. A requeued
    /// row keeps its id, so it is again ahead of every later pending row of
    /// its bucket. A row parked because its label is not a bucket of this
    /// deployment is re-labelled from its key. Audited; the buckets' workers
    /// are woken.
    async fn requeue(
        &self,
        ids: &[i64],
        buckets: &[String],
        all: bool,
        actor: &str,
    ) -> Result<Vec<i64>, StoreError>;

    /// Acts on the blocked heads among `ids` — pending rows that failed at
    /// least once and wait for their retry — recording them with `actor`
    /// and `reason` in the audit table; returns the ids acted on. A row
    /// whose retry time has come is left alone: it may be in a batch, and
    /// changing it could race the record of its publish. The buckets'
    /// workers are woken.
    async fn act_on_heads(
        &self,
        ids: &[i64],
        action: HeadAction,
        actor: &str,
        reason: &str,
    ) -> Result<Vec<i64>, StoreError>;
}

/// What an operator does to a blocked head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadAction {
    /// Park it (`failed_at`): the rest of its bucket goes on without it,
    /// and it waits for `requeue` or `drop`.
    Park,
    /// Retry it now instead of at its retry time, its attempts kept.
    Retry,
}

impl HeadAction {
    /// Its name in the audit table and in messages.
    pub fn name(self) -> &'static str {
        match self {
            HeadAction::Park => "park",
            HeadAction::Retry => "retry",
        }
    }
}

/// A dropped row, as the audit record keeps it (the backends that read
/// it back before the delete).
#[derive(sqlx::FromRow)]
pub struct Dropped {
    pub id: i64,
    message_id: Uuid,
    pub partition_key: String,
    message_key: String,
    exchange: String,
    routing_key: String,
    attempts: i32,
    last_error: Option<String>,
}

impl Dropped {
    pub(crate) fn to_json(&self) -> Json {
        json!({
            "id": self.id, "message_id": self.message_id, "partition_key": self.partition_key,
            "message_key": self.message_key, "exchange": self.exchange,
            "routing_key": self.routing_key, "attempts": self.attempts,
            "last_error": self.last_error,
        })
    }
}
