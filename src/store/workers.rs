//! The `outbox_workers` table: one row per live worker process — the types
//! and the interface every backend implements ([`WorkerStore`]).
//!
//! A worker inserts its row at start, pushes `heartbeat_until` forward from
//! its own task, and deletes the row on a clean exit. A worker is *live*
//! while `heartbeat_until > now()` (the database's clock, never the worker's).
//! Registrations are serialised by a transaction-scoped lock, so two workers
//! cannot both pass the checks that decide whether they may join.
//!
//! The flows are written once, over the driver contract, in
//! [`super::membership`]: each backend renders
//! [`WorkersSql`](super::statements::WorkersSql) in its own SQL.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::error::StoreError;

/// How a worker drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerMode {
    /// Fleet member: publishes only buckets it holds a lease on.
    Leasing,
    /// Single development worker: every bucket, no leases.
    NoLeasing,
}

impl WorkerMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerMode::Leasing => "leasing",
            WorkerMode::NoLeasing => "no-leasing",
        }
    }
}

/// A live worker other than the caller.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LiveWorker {
    pub worker_id: Uuid,
    /// The name it is shown by: `worker.name`, or `host:pid`.
    pub name: String,
    pub hostname: String,
    pub pid: i32,
    pub mode: String,
    /// Seconds until its heartbeat expires.
    pub expires_in: f64,
}

/// The fleet's members as target computation reads them
/// ([`WorkerStore::membership`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Membership {
    /// The ids of [`WorkerStore::live_leasing`], sorted.
    pub live: Vec<Uuid>,
    /// How long the list stands at least, unless a member changes its row
    /// (a worker joins, leaves, steps aside or comes back — each announced
    /// on the fleet channel, except a stalled worker's return): until the
    /// first of the others could be left out, for lateness
    /// (`suspect_after` after its last heartbeat) or because its heartbeat
    /// expires. Zero while one is late but still holds a valid lease;
    /// `None` without others.
    pub stable_for: Option<Duration>,
}

/// A worker as the dashboard shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct WorkerView {
    pub worker_id: Uuid,
    /// The name it is shown by: `worker.name`, or `host:pid`.
    pub name: String,
    pub hostname: String,
    pub pid: i32,
    pub version: String,
    pub mode: String,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// Seconds until the heartbeat expires (negative: expired, not yet
    /// cleaned up — the worker is gone).
    pub heartbeat_ttl_seconds: f64,
    pub live: bool,
    /// Buckets it holds a valid lease on.
    pub buckets: i64,
    pub published_total: i64,
    pub failed_total: i64,
    /// Rows per second over its last heartbeat period.
    pub published_rate: f64,
    /// False while it cannot reach the broker (beyond `broker_grace`): it
    /// holds no buckets and is left out of every worker's targets.
    pub can_publish: bool,
    /// Why it cannot publish, while it cannot.
    pub broker_error: Option<String>,
    /// Why RabbitMQ blocked its connection (a resource alarm), while it does.
    pub broker_blocked: Option<String>,
    /// The buckets it published from in the last ten seconds, with their
    /// rates: `p03=12.5 p07=0.4` ([`bucket_rates`] reads it).
    #[serde(skip)]
    pub bucket_activity: Option<String>,
    /// What it delivered where: a JSON array
    /// ([`crate::sink::destinations::parse`] reads it).
    #[serde(skip)]
    pub destinations: Option<String>,
    /// Its state, in the one vocabulary the page, the API, `outboxd
    /// status` and the metrics share (`crate::dashboard::states`).
    #[sqlx(skip)]
    pub state: String,
}

/// What a heartbeat reports besides being alive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerCounts {
    pub published_total: u64,
    pub failed_total: u64,
    pub published_rate: f64,
    /// [`WorkerView::bucket_activity`]; empty when nothing was published.
    pub bucket_activity: String,
    /// [`WorkerView::destinations`]; empty when nothing was delivered.
    pub destinations: String,
}

/// The `(bucket, rows a second)` pairs of a [`WorkerView::bucket_activity`].
pub fn bucket_rates(activity: &str) -> impl Iterator<Item = (&str, f64)> {
    activity.split_whitespace().filter_map(|pair| {
        let (bucket, rate) = pair.split_once('=')?;
        Some((bucket, rate.parse().ok()?))
    })
}

/// A worker's row, as it registers.
#[derive(Debug, Clone, Copy)]
pub struct Registration<'a> {
    pub worker_id: Uuid,
    pub hostname: &'a str,
    /// `worker.name`, or `host:pid`.
    pub name: &'a str,
    pub mode: WorkerMode,
    pub heartbeat_ttl: Duration,
    /// A fleet worker joins with `false`: its coordinator sets it once it
    /// runs, so peers hand buckets over only to a worker ready to take them.
    pub can_publish: bool,
}

/// Whether a worker may join, given the other live workers.
pub type Admission<'a> = &'a (dyn Fn(&[LiveWorker]) -> bool + Send + Sync);

/// What [`WorkerStore::register`] did.
#[derive(Debug)]
pub enum Joined {
    Registered,
    /// The admission refused, given these live workers; nothing was written.
    Refused(Vec<LiveWorker>),
}

/// The workers table, as every backend implements it.
#[async_trait]
pub trait WorkerStore {
    /// Under the registration lock: reads the other live workers, and
    /// inserts this worker's row if `admit` allows it given them.
    async fn register(
        &self,
        me: Registration<'_>,
        admit: Admission<'_>,
    ) -> Result<Joined, StoreError>;

    /// Pushes `heartbeat_until` forward; false when the row is gone (another
    /// process cleaned it up as dead), so the caller can re-register.
    async fn heartbeat(
        &self,
        worker_id: Uuid,
        ttl: Duration,
        counts: WorkerCounts,
    ) -> Result<bool, StoreError>;

    /// Every worker row, live or expired, for the dashboard.
    async fn list_workers(&self) -> Result<Vec<WorkerView>, StoreError>;

    /// Deletes this worker's row (clean exit).
    async fn remove_worker(&self, worker_id: Uuid) -> Result<(), StoreError>;

    /// Records whether this worker can reach the broker; false when its row
    /// is gone.
    async fn set_broker_state(
        &self,
        worker_id: Uuid,
        can_publish: bool,
        broker_error: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// Records why RabbitMQ blocks this worker's connection (`None`: it
    /// does not), for the dashboard.
    async fn set_broker_blocked(
        &self,
        worker_id: Uuid,
        reason: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Ids of the live fleet-mode workers that can publish, sorted: the
    /// input of target computation. A worker whose last heartbeat is older
    /// than `suspect_after` and that holds no valid lease is left out,
    /// although its heartbeat has not expired yet: a live worker heartbeats
    /// every third of `heartbeat_ttl` and renews every `lease_renew`, so
    /// only a dead (or stalled) worker gets there, and its buckets are
    /// retargeted as soon as they can be taken (`lease_ttl` after its last
    /// renewal) rather than when its heartbeat expires (the longer
    /// `heartbeat_ttl`). It stays out once others took its buckets; a
    /// stalled worker that comes back heartbeats and counts again. Only
    /// targets depend on this; leases and fences are untouched. Workers
    /// with a heartbeat on time are not read further, so the statement
    /// reads the leases of the suspects only. [`suspect_after`](self::suspect_after)
    /// gives the bound for a fleet's settings. `me` (the asking worker; nil
    /// for an onlooker) is never left out for lateness: a worker that asks
    /// is alive, and one that left itself out would take no bucket, so
    /// never hold the valid lease that would count it again.
    async fn live_leasing(
        &self,
        me: Uuid,
        suspect_after: Duration,
    ) -> Result<Vec<Uuid>, StoreError> {
        Ok(self.membership(me, suspect_after).await?.live)
    }

    /// [`WorkerStore::live_leasing`], with how long the list stands.
    async fn membership(&self, me: Uuid, suspect_after: Duration)
    -> Result<Membership, StoreError>;

    /// Deletes rows whose heartbeat expired more than `grace` ago (workers
    /// that died without cleaning up). Returns how many.
    async fn remove_dead(&self, grace: Duration) -> Result<u64, StoreError>;

    /// Live workers other than `me`.
    async fn live_others(&self, me: Uuid) -> Result<Vec<LiveWorker>, StoreError>;
}

/// How old a fleet worker's last heartbeat must be before
/// [`WorkerStore::live_leasing`] may leave it out: `lease_ttl` — a dead
/// worker's leases have lapsed by then, so it is left out at most
/// `lease_ttl` after its death (its heartbeat expires up to `heartbeat_ttl`
/// after) — and at least two heartbeat periods (a period is a third of
/// `heartbeat_ttl`), so a live worker without a lease is not left out
/// because a slow link or a busy pool delayed one heartbeat: a period runs
/// from the end of one write to the start of the next, and a worker's row
/// starts with the time its registration transaction began.
pub fn suspect_after(lease_ttl: Duration, heartbeat_ttl: Duration) -> Duration {
    lease_ttl.max(heartbeat_ttl * 2 / 3)
}

/// Which rows the workers table's fingerprint marks as *near*: a worker
/// whose heartbeat is older than `older_than`, or expires within
/// `expiring_within`. The fingerprint
/// ([`OutboxLookups::pending_and_fleet`](crate::store::OutboxLookups::pending_and_fleet))
/// changes when a row becomes near or stops being so, so a coordinator
/// that sees it unchanged knows that no peer came within `expiring_within`
/// of being left out ([`LateWatch::for_fleet`]) — nor came back from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LateWatch {
    pub older_than: Duration,
    pub expiring_within: Duration,
}

impl LateWatch {
    /// Near: within `lease_renew` of being left out — for lateness
    /// ([`suspect_after`]) or because its heartbeat expires. A live worker
    /// writes its heartbeat every `lease_renew` (with its renewal) or a
    /// third of `heartbeat_ttl`, so it is near only when it missed one.
    pub fn for_fleet(lease_ttl: Duration, lease_renew: Duration, heartbeat_ttl: Duration) -> Self {
        Self {
            older_than: suspect_after(lease_ttl, heartbeat_ttl).saturating_sub(lease_renew),
            expiring_within: lease_renew,
        }
    }
}
