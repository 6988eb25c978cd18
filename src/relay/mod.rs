//! The relay: drains buckets to the broker.
//!
//! One [`bucket::BucketDrainer`] task per drained bucket, each with its own
//! session of the sink ([`crate::sink`]; a confirm channel on the AMQP
//! path), so buckets progress independently and a failing head blocks only
//! its own bucket. Idle drainers sleep until a wake-up names
//! their bucket ([`wakeups`]: a `NOTIFY` from `<outbox>_enqueue()`,
//! polling where `LISTEN` cannot work, and beside `LISTEN` one poll of
//! every bucket per `idle_backoff_ms`, backing off to 30 s on an idle
//! worker — the fallback for rows nobody announced and for drainers that
//! went idle before their head was claimable), or until the head that
//! failed in their bucket is ready again (timed by the drainer itself).
//!
//! The relay decides nothing about *which* buckets to drain: in
//! `--no-leasing` mode that is all of them; in fleet mode the coordinator
//! starts and stops drainers as leases come and go.

pub mod bucket;
mod spans;
pub mod stats;
pub mod wakeups;

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::amqp::Broker;
use crate::config::Config;
use crate::lease::LeaseGrant;
use crate::otel::Tracer;
use crate::sink::Sink;
use crate::store::Store;
use crate::store::outbox::Published;
pub use stats::RelayStats;
pub use wakeups::Wakeups;

/// The relay's share of the configuration.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub batch_size: u32,
    /// The claim's size after a batch whose every row went to a stream.
    pub stream_batch_size: u32,
    pub claim_ttl: Duration,
    /// A claim held with at least this left is not renewed
    /// ([`crate::store::outbox::Claim::min_left`]): a second more than a
    /// batch may wait for its confirms, or the whole TTL if that is less.
    pub claim_min_left: Duration,
    pub retry_backoff_initial: Duration,
    pub retry_backoff: Duration,
    pub max_attempts: u32,
    pub max_payload_bytes: u64,
    /// What recording a publish does with the rows (`outbox.keep_published`).
    pub published: Published,
}

impl RelaySettings {
    pub fn from_config(c: &Config) -> Self {
        Self {
            batch_size: c.outbox.batch_size,
            stream_batch_size: c.outbox.stream_batch_size,
            claim_ttl: c.outbox.claim_ttl,
            claim_min_left: (c.amqp.confirm_timeout + Duration::from_secs(1))
                .min(c.outbox.claim_ttl),
            retry_backoff_initial: c.outbox.retry_backoff_initial,
            retry_backoff: c.outbox.retry_backoff,
            max_attempts: c.outbox.max_attempts,
            max_payload_bytes: c.outbox.max_payload_bytes,
            published: Published::from_keep(c.outbox.keep_published),
        }
    }
}

/// What every drainer shares.
pub struct RelayContext {
    pub store: Store,
    /// The broker connection: its reach, for the coordinator.
    pub broker: Arc<Broker>,
    /// Where the drainers send their rows.
    pub sink: Arc<dyn Sink>,
    pub settings: RelaySettings,
    pub stats: Arc<RelayStats>,
    /// Where published messages' spans go (disabled: no `OTEL_*` endpoint).
    pub tracer: Tracer,
}

/// How long a drainer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Until cancelled, sleeping when idle.
    Forever,
    /// Until nothing in the bucket is ready (`--once`).
    UntilEmpty,
}

/// Runs drainers for a set of buckets.
pub struct Relay {
    ctx: Arc<RelayContext>,
    wakeups: Wakeups,
    tracker: TaskTracker,
    /// One drainer at a time runs its first statements (see
    /// [`STARTING_AT_ONCE`]).
    starting: Arc<Semaphore>,
}

/// How many drainers run their first statements (clearing an earlier
/// lease's claims, the first claim) at the same moment. When a worker
/// joins, every bucket it leases starts at once; unthrottled, their first
/// statements overlapped and the pool opened `database.max_connections`
/// connections for a moment's work — per source, so a worker starting
/// with 50 sources took 500 connections from one server. One at a time,
/// each start costs about a round trip, and a start-up opens about six
/// (the coordinator's and the wake-ups' statements run beside), then
/// settles at three (`store::trim`). Publishing is not held back: the
/// permit is returned as soon as the first claim has answered.
pub const STARTING_AT_ONCE: usize = 1;

impl Relay {
    pub fn new(ctx: Arc<RelayContext>, wakeups: Wakeups) -> Self {
        Self {
            ctx,
            wakeups,
            tracker: TaskTracker::new(),
            starting: Arc::new(Semaphore::new(STARTING_AT_ONCE)),
        }
    }

    pub fn context(&self) -> &Arc<RelayContext> {
        &self.ctx
    }

    /// Starts draining one bucket until `cancel` fires (then the in-flight
    /// batch is finished) — under `lease` in fleet mode.
    pub fn spawn_bucket(
        &self,
        label: &str,
        lease: Option<LeaseGrant>,
        drain: Drain,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let drainer = bucket::BucketDrainer::new(
            label.to_string(),
            lease,
            self.ctx.clone(),
            self.wakeups.of(label),
            cancel,
            self.starting.clone(),
        );
        self.tracker.spawn(drainer.run(drain).in_current_span())
    }

    /// Waits for every drainer to finish, at most `timeout`; true when all
    /// finished. Drainers finish their in-flight batch before they stop.
    pub async fn wait(&self, timeout: Option<Duration>) -> bool {
        self.tracker.close();
        match timeout {
            None => {
                self.tracker.wait().await;
                true
            }
            Some(t) => tokio::time::timeout(t, self.tracker.wait()).await.is_ok(),
        }
    }
}
