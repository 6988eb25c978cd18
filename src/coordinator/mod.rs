//! Fleet coordination: membership and heartbeats (this file), target
//! computation ([`assignment`]), the per-worker coordination loop
//! ([`fleet`]) and which worker does the fleet-wide chores
//! ([`housekeeping`]). The lease and its fencing argument are [`crate::lease`],
//! where the relay and the broker's send gate import them too.
//!
//! A worker registers a row in the workers table and keeps
//! `heartbeat_until = now() + heartbeat_ttl` fresh from its own task, so a
//! slow publish never delays a heartbeat. Where a lease renewal pushes the
//! heartbeat too (PostgreSQL, MariaDB: [`RenewalBeats`]), that task skips a beat
//! that would write nothing new. The row is deleted on a clean exit.
//! Registration runs under a transaction-scoped lock: a
//! `--no-leasing` worker joins only when no other worker is live, a fleet
//! worker only when no `--no-leasing` worker is, and two workers cannot both
//! pass those checks.

pub mod assignment;
pub mod fleet;
pub mod housekeeping;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::relay::RelayStats;
use crate::relay::stats::BucketActivity;
use crate::sink::destinations;
use crate::store::workers::{Joined, LiveWorker, Registration, WorkerCounts, WorkerMode};
use crate::store::{Store, StoreError};

/// Why a worker may not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(
        "refusing to start in --no-leasing mode: {0} other outboxd worker(s) are live ({1}); stop them first, or run without --no-leasing"
    )]
    OthersLive(usize, String),
    #[error(
        "refusing to start: a --no-leasing worker is live ({0}); it drains every bucket without leases, so stop it before starting a fleet"
    )]
    NoLeasingLive(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a worker in `mode` may not join beside the live workers `others`:
/// a `--no-leasing` worker only joins alone, a fleet worker only while no
/// `--no-leasing` worker is live.
fn refusal(mode: WorkerMode, others: &[LiveWorker]) -> Option<JoinError> {
    match mode {
        WorkerMode::Leasing => others
            .iter()
            .find(|w| w.mode == WorkerMode::NoLeasing.as_str())
            .map(|w| {
                JoinError::NoLeasingLive(format!(
                    "{} ({}), heartbeat expires in {:.0}s",
                    w.name, w.worker_id, w.expires_in
                ))
            }),
        WorkerMode::NoLeasing if others.is_empty() => None,
        WorkerMode::NoLeasing => {
            let list = others
                .iter()
                .map(|w| {
                    format!(
                        "{} ({}), {}, heartbeat expires in {:.0}s",
                        w.name, w.worker_id, w.mode, w.expires_in
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            Some(JoinError::OthersLive(others.len(), list))
        }
    }
}

/// This worker's identity and registration.
#[derive(Debug, Clone)]
pub struct Membership {
    pub worker_id: Uuid,
    pub hostname: String,
    /// The name it is shown by in logs, `status` and the dashboard:
    /// `worker.name`, or `host:pid`.
    pub name: String,
    pub mode: WorkerMode,
    pub heartbeat_ttl: Duration,
    /// When a lease renewal last beat for this worker (set by its
    /// coordinator, read by its heartbeat task).
    pub renewal_beats: RenewalBeats,
}

/// When a lease renewal last pushed this worker's heartbeat forward
/// ([`PartitionStore::renew_and_beat`](crate::store::partitions::PartitionStore::renew_and_beat)).
/// The heartbeat task skips its beat while one did within the beat's
/// period and the counts it would write are those it wrote last: an idle
/// PostgreSQL fleet worker that holds leases then runs no heartbeat
/// statement of its own.
#[derive(Debug, Clone, Default)]
pub struct RenewalBeats(Arc<std::sync::Mutex<Option<Instant>>>);

impl RenewalBeats {
    /// A renewal that started at `at` beat (its `now()` is no earlier).
    pub fn record(&self, at: Instant) {
        *self.0.lock().expect("renewal beats") = Some(at);
    }

    /// How long ago a renewal last beat.
    fn age(&self) -> Option<Duration> {
        self.0.lock().expect("renewal beats").map(|at| at.elapsed())
    }
}

impl Membership {
    /// A new identity; `name` empty means `host:pid`.
    pub fn new(name: &str, mode: WorkerMode, heartbeat_ttl: Duration) -> Self {
        let hostname = hostname();
        let name = match name {
            "" => format!("{hostname}:{}", std::process::id()),
            name => name.to_string(),
        };
        Self {
            worker_id: Uuid::new_v4(),
            hostname,
            name,
            mode,
            heartbeat_ttl,
            renewal_beats: RenewalBeats::default(),
        }
    }

    /// Registers this worker; in `--no-leasing` mode only if it is alone.
    pub async fn join(&self, store: &Store) -> Result<(), JoinError> {
        // A fleet worker counts in the targets once its coordinator says it
        // can publish (coordinator::fleet).
        let me = self.registration(self.mode == WorkerMode::NoLeasing);
        let mode = self.mode;
        match store
            .register(me, &|others| refusal(mode, others).is_none())
            .await?
        {
            Joined::Registered => {
                tracing::info!(worker_id = %self.worker_id, host = %self.hostname, mode = ?self.mode, "worker registered");
                Ok(())
            }
            Joined::Refused(others) => {
                Err(refusal(mode, &others)
                    .expect("the store refuses only what the admission refused"))
            }
        }
    }

    fn registration(&self, can_publish: bool) -> Registration<'_> {
        Registration {
            worker_id: self.worker_id,
            hostname: &self.hostname,
            name: &self.name,
            mode: self.mode,
            heartbeat_ttl: self.heartbeat_ttl,
            can_publish,
        }
    }

    /// Heartbeats every third of the TTL until cancelled. Survives database
    /// outages (retrying faster), and re-registers if the row vanished.
    /// Each heartbeat also reports the worker's totals and recent rate
    /// (read by the dashboard). A beat is skipped while a lease renewal beat
    /// within the period and the counts are those last written (so an idle
    /// worker's rate reads 0 first), and is then due a period after that
    /// renewal; never skipped after a failed or a refused beat.
    pub async fn heartbeat_loop(
        self,
        store: Store,
        stats: Arc<RelayStats>,
        cancel: CancellationToken,
    ) {
        let period = self.heartbeat_ttl / 3;
        let mut delay = period;
        let (mut last, mut last_at) = (stats.snapshot(), Instant::now());
        let mut activity = BucketActivity::new(last_at, stats.published_by_bucket());
        let mut delivered = stats.delivered.snapshot();
        let mut written: Option<WorkerCounts> = None;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            let now = stats.snapshot();
            let delivered_now = stats.delivered.snapshot();
            let elapsed = last_at.elapsed().as_secs_f64().max(1e-3);
            let counts = WorkerCounts {
                published_total: now.published,
                failed_total: now.failed,
                published_rate: now.since(&last).published as f64 / elapsed,
                bucket_activity: activity.sample(Instant::now(), stats.published_by_bucket()),
                destinations: destinations::report(&delivered_now, &delivered, elapsed),
            };
            (last, last_at, delivered) = (now, Instant::now(), delivered_now);
            // Skipped, the next beat is due a period after the renewal's,
            // so the row is never written less often than every period.
            if written.as_ref() == Some(&counts)
                && let Some(age) = self.renewal_beats.age().filter(|age| *age < period)
            {
                delay = period - age;
                continue;
            }
            written = None;
            match store
                .heartbeat(self.worker_id, self.heartbeat_ttl, counts.clone())
                .await
            {
                Ok(true) => {
                    written = Some(counts);
                    delay = period;
                }
                Ok(false) => {
                    tracing::warn!(worker_id = %self.worker_id, "worker row was removed; registering again");
                    if let Err(e) = store.register(self.registration(true), &|_| true).await {
                        tracing::warn!(error = %e, "re-registering failed");
                    }
                    delay = period;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "heartbeat failed");
                    delay = Duration::from_millis(500).min(period);
                }
            }
        }
    }

    /// Deletes the worker row (clean exit).
    pub async fn leave(&self, store: &Store) {
        match store.remove_worker(self.worker_id).await {
            Ok(()) => tracing::info!(worker_id = %self.worker_id, "worker row removed"),
            Err(e) => {
                tracing::warn!(error = %e, "could not remove the worker row; it expires after heartbeat_ttl")
            }
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}
