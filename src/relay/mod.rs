//! The relay: drains buckets to the broker.
//!
//! One [`bucket::BucketDrainer`] task per drained bucket, each with its own
//! confirm channel, so buckets progress independently and a failing head
//! blocks only its own bucket. Idle drainers sleep until a `NOTIFY` from
//! `<outbox>_enqueue()` names their bucket ([`Wakeups`]), or
//! `idle_backoff_ms` passes (the fallback for plain `INSERT`s and for
//! notifications lost while the listener reconnected).
//!
//! The relay decides nothing about *which* buckets to drain: in
//! `--no-leasing` mode that is all of them; in fleet mode the coordinator
//! starts and stops drainers as leases come and go.

pub mod bucket;
pub mod stats;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::amqp::Broker;
use crate::config::Config;
use crate::coordinator::lease::LeaseGrant;
use crate::store::Store;
pub use stats::RelayStats;

/// The relay's share of the configuration.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub batch_size: u32,
    pub claim_ttl: Duration,
    pub idle_backoff: Duration,
    pub retry_backoff_initial: Duration,
    pub retry_backoff: Duration,
    pub max_attempts: u32,
    pub max_payload_bytes: u64,
}

impl RelaySettings {
    pub fn from_config(c: &Config) -> Self {
        Self {
            batch_size: c.outbox.batch_size,
            claim_ttl: c.outbox.claim_ttl,
            idle_backoff: Duration::from_millis(c.outbox.idle_backoff_ms),
            retry_backoff_initial: c.outbox.retry_backoff_initial,
            retry_backoff: c.outbox.retry_backoff,
            max_attempts: c.outbox.max_attempts,
            max_payload_bytes: c.outbox.max_payload_bytes,
        }
    }
}

/// What every drainer shares.
pub struct RelayContext {
    pub store: Store,
    pub broker: Arc<Broker>,
    pub settings: RelaySettings,
    pub stats: Arc<RelayStats>,
}

/// How long a drainer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Until cancelled, sleeping when idle.
    Forever,
    /// Until nothing in the bucket is ready (`--once`).
    UntilEmpty,
}

/// Wake-up signals fed by `LISTEN`: one per bucket (new rows), one for the
/// fleet coordinator (workers joining, leaving, releasing buckets).
#[derive(Clone, Default)]
pub struct Wakeups {
    buckets: Arc<HashMap<String, Arc<Notify>>>,
    fleet: Arc<Notify>,
}

impl Wakeups {
    pub fn new(labels: &[String]) -> Self {
        Self {
            buckets: Arc::new(
                labels
                    .iter()
                    .map(|l| (l.clone(), Arc::new(Notify::new())))
                    .collect(),
            ),
            fleet: Arc::new(Notify::new()),
        }
    }

    /// The coordinator's signal.
    pub fn fleet(&self) -> Arc<Notify> {
        self.fleet.clone()
    }

    /// The signal of one bucket.
    pub fn of(&self, label: &str) -> Arc<Notify> {
        self.buckets.get(label).cloned().unwrap_or_default()
    }

    fn wake(&self, label: &str) {
        if let Some(n) = self.buckets.get(label) {
            // notify_one keeps a permit when the drainer is busy, so a
            // notification that arrives mid-batch is not lost.
            n.notify_one();
        }
    }

    fn wake_all(&self) {
        self.buckets.values().for_each(|n| n.notify_one());
        self.fleet.notify_one();
    }

    /// Listens for `<outbox>_enqueued` and `<outbox>_fleet` notifications
    /// until cancelled. Reconnects by itself; after a reconnect everything is
    /// woken, since notifications sent meanwhile are lost.
    pub async fn listen(self, store: Store, cancel: CancellationToken) {
        let channel = store.tables.notify_channel();
        let fleet_channel = store.tables.fleet_channel();
        let mut delay = Duration::from_millis(100);
        while !cancel.is_cancelled() {
            let listener = async {
                let mut l = PgListener::connect_with(&store.pool).await?;
                l.listen_all([channel.as_str(), fleet_channel.as_str()])
                    .await?;
                Ok::<_, sqlx::Error>(l)
            }
            .await;
            let mut listener = match listener {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot LISTEN for wake-ups; polling meanwhile");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            delay = Duration::from_millis(100);
            self.wake_all();
            loop {
                let next = tokio::select! {
                    _ = cancel.cancelled() => return,
                    n = listener.try_recv() => n,
                };
                match next {
                    Ok(Some(n)) if n.channel() == fleet_channel => self.fleet.notify_one(),
                    Ok(Some(n)) => self.wake(n.payload()),
                    // The connection was lost and re-established.
                    Ok(None) => self.wake_all(),
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}

/// Runs drainers for a set of buckets.
pub struct Relay {
    ctx: Arc<RelayContext>,
    wakeups: Wakeups,
    tracker: TaskTracker,
}

impl Relay {
    pub fn new(ctx: Arc<RelayContext>, wakeups: Wakeups) -> Self {
        Self {
            ctx,
            wakeups,
            tracker: TaskTracker::new(),
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
        );
        self.tracker.spawn(drainer.run(drain))
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
