//! One `outboxd work` process, from start-up checks to a clean exit.
//!
//! Start-up: connect, refuse a database whose schema or bucket count does
//! not match this binary and configuration, join the membership. Then the
//! heartbeat, the `LISTEN` wake-ups and one drainer per bucket run as tasks
//! under one [`CancellationToken`], while this module's loop reports a
//! *tick* every `--interval-ms`: the counts since the previous tick and the
//! lag (age of the oldest pending row), as one JSON line with `--json`.
//!
//! Shutdown (SIGTERM / Ctrl-C cancels the token): drainers finish their
//! in-flight batch — published rows are recorded, unsent ones handed back —
//! within `worker.shutdown_timeout`; then the worker row is deleted and the
//! process exits 0. A batch still running at the deadline is abandoned: its
//! claim lapses and its rows are published again later (at least once).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::amqp::Broker;
use crate::config::Config;
use crate::coordinator::fleet::{self, Fleet, FleetSettings};
use crate::coordinator::{JoinError, Membership};
use crate::partitioner::Partitioner;
use crate::relay::stats::StatsSnapshot;
use crate::relay::{Drain, Relay, RelayContext, RelaySettings, RelayStats, Wakeups};
use crate::store::outbox::BucketHead;
use crate::store::workers::WorkerMode;
use crate::store::{Channel, Store, StoreError, schema};

/// How `outboxd work` runs and reports.
#[derive(Debug, Clone)]
pub struct WorkOptions {
    /// Drain every bucket alone, without leases.
    pub no_leasing: bool,
    /// Drain what is ready now, report once, exit.
    pub once: bool,
    /// One JSON object per tick on stdout.
    pub json: bool,
    /// Nothing on stdout.
    pub silent: bool,
    /// Length of a tick.
    pub interval: Duration,
    /// Period of the human-readable rate line.
    pub window: Duration,
    /// Also serve the dashboard (on `dashboard.listen`).
    pub ui: bool,
}

/// Why a worker stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Join(#[from] JoinError),
    #[error("{0}")]
    Broker(String),
    #[error(transparent)]
    Dashboard(#[from] crate::dashboard::DashboardError),
}

/// One tick's report.
#[derive(Debug, Serialize)]
pub struct Tick {
    pub ts: chrono::DateTime<chrono::Utc>,
    pub worker_id: uuid::Uuid,
    pub mode: &'static str,
    /// Buckets this worker drains.
    pub buckets: usize,
    /// Counts during this tick.
    #[serde(flatten)]
    pub counts: StatsSnapshot,
    /// Length of this tick in milliseconds.
    pub elapsed_ms: u64,
    /// Buckets with at least one pending row.
    pub pending_buckets: Option<usize>,
    /// Buckets whose head has failed at least once (waiting for a retry).
    pub retrying_buckets: Option<usize>,
    /// Age in seconds of the oldest pending row among the drained buckets.
    pub lag_seconds: Option<f64>,
}

/// Runs a start-up step again when a query of it was lost to a transient
/// error (its connection killed, the server restarting): a worker started
/// during such a moment comes up rather than exiting. A database that
/// cannot be reached at all still ends start-up at once, with the reason.
async fn retry_lost_query<T, F, Fut>(mut step: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    const ATTEMPTS: u32 = 3;
    let mut attempt = 1;
    loop {
        match step().await {
            Err(e @ StoreError::Query { .. }) if e.is_transient() && attempt < ATTEMPTS => {
                tracing::warn!(error = %e, "start-up query failed; trying again");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// Runs a worker until `cancel` fires (or, with `--once`, until the ready
/// rows are drained). Returns the totals.
pub async fn run(
    config: &Config,
    opts: &WorkOptions,
    cancel: CancellationToken,
) -> Result<StatsSnapshot, WorkError> {
    let partitioner = Partitioner::new(config.outbox.partition_count);
    let store = Store::connect(config, "outboxd work").await?;
    retry_lost_query(|| schema::check(&store, partitioner)).await?;

    // Bound before joining, so a taken port stops start-up cleanly.
    let ui_listener = match opts.ui {
        true => {
            Some(crate::dashboard::bind(config.dashboard.listen.parse().expect("validated")).await?)
        }
        false => None,
    };

    let mode = if opts.no_leasing {
        WorkerMode::NoLeasing
    } else {
        WorkerMode::Leasing
    };
    let membership = Membership::new(mode, config.worker.heartbeat_ttl);
    // Joining first: a refusal (another worker is live) is the only thing
    // said. Peers hand buckets over only once this worker's coordinator
    // says it can publish (coordinator::fleet).
    retry_lost_query(|| async {
        match membership.join(&store).await {
            Err(JoinError::Store(e)) => Err(e),
            other => Ok(other),
        }
    })
    .await??;
    let broker = Arc::new(Broker::new(
        &config.amqp,
        format!("outboxd {} {}", membership.hostname, membership.worker_id),
    ));
    if let Err(e) = broker.connect_once().await {
        if opts.once {
            membership.leave(&store).await;
            return Err(WorkError::Broker(e.to_string()));
        }
        tracing::warn!(error = %e, "RabbitMQ is not reachable yet; the relay keeps retrying");
    }
    if mode == WorkerMode::Leasing {
        announce(&store, fleet::announce::JOIN).await;
    }

    let labels = partitioner.labels();
    let stats = Arc::new(RelayStats::default());
    let ctx = Arc::new(RelayContext {
        store: store.clone(),
        broker: broker.clone(),
        settings: RelaySettings::from_config(config),
        stats: stats.clone(),
    });
    let wakeups = Wakeups::new(&labels);
    let background = CancellationToken::new();
    let heartbeat = tokio::spawn(membership.clone().heartbeat_loop(
        store.clone(),
        stats.clone(),
        background.clone(),
    ));
    let wakeup_sources = wakeups.start(
        &store,
        &config.database,
        Duration::from_millis(config.outbox.idle_backoff_ms),
        &background,
    );
    let keep_connected = tokio::spawn(broker.clone().keep_connected(background.clone()));
    let blocked = tokio::spawn(report_blocked(
        store.clone(),
        membership.worker_id,
        broker.blocked(),
        background.clone(),
    ));
    let retention =
        (!config.outbox.retention.is_zero() && !opts.once).then_some(config.outbox.retention);
    let maintenance = tokio::spawn(crate::ops::maintenance_loop(
        store.clone(),
        partitioner.count(),
        retention,
        background.clone(),
        cancel.clone(),
    ));

    let dashboard = ui_listener.map(|listener| {
        let state =
            crate::dashboard::DashboardState::new(config, store.clone(), Some(stats.clone()));
        tokio::spawn(crate::dashboard::serve(listener, state, background.clone()))
    });

    let relay = Arc::new(Relay::new(ctx, wakeups.clone()));
    let drain = if opts.once {
        Drain::UntilEmpty
    } else {
        Drain::Forever
    };
    let shutdown_timeout = config.worker.shutdown_timeout;
    // `coordination` ends when the worker has stopped draining: after a
    // graceful shutdown, or when `--once` has drained what was ready.
    let (owned, mut coordination) = match mode {
        WorkerMode::NoLeasing => {
            for label in &labels {
                relay.spawn_bucket(label, None, drain, cancel.child_token());
            }
            tracing::info!(buckets = labels.len(), mode = "no-leasing", "draining");
            let (relay, cancel) = (relay.clone(), cancel.clone());
            let task = tokio::spawn(async move {
                if drain == Drain::Forever {
                    cancel.cancelled().await;
                    tracing::info!("shutting down: finishing in-flight batches");
                }
                let timeout = (drain == Drain::Forever).then_some(shutdown_timeout);
                if !relay.wait(timeout).await {
                    tracing::warn!(
                        ?shutdown_timeout,
                        "in-flight batches did not finish in time; abandoned (their rows are published again later)"
                    );
                }
            });
            (watch::channel(labels.clone()).1, task)
        }
        WorkerMode::Leasing => {
            let settings = FleetSettings {
                lease_ttl: config.worker.lease_ttl,
                lease_renew: config.worker.lease_renew,
                heartbeat_ttl: config.worker.heartbeat_ttl,
                broker_grace: config.worker.broker_grace,
                assignment: config.worker.assignment,
                partitioner,
            };
            let fleet = Fleet::new(
                store.clone(),
                relay.clone(),
                membership.worker_id,
                settings,
                wakeups.fleet(),
            );
            let owned = fleet.owned();
            (
                owned,
                tokio::spawn(fleet.run(drain, cancel.clone(), shutdown_timeout)),
            )
        }
    };

    let mut reporter = Reporter::new(opts, membership.worker_id, mode);
    let mut ticks = tokio::time::interval(opts.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut throughput = ThroughputRecorder::default();
    loop {
        tokio::select! {
            _ = &mut coordination => break,
            _ = ticks.tick(), if !opts.once => {
                let now = stats.snapshot();
                let buckets = owned.borrow().clone();
                let report = async {
                    throughput.record(&store, now).await;
                    reporter.tick(&store, &buckets, now, false).await;
                };
                // A shutdown does not wait for a tick's database calls.
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = report => {}
                }
            }
        }
    }
    // After the drain, everything below shares one short budget, so a
    // worker whose database stopped answering still exits promptly (its
    // row and leases then expire on their own).
    let farewell = tokio::time::Instant::now() + FAREWELL;
    background.cancel();
    let totals = stats.snapshot();
    let _ = tokio::time::timeout_at(farewell, throughput.record(&store, totals)).await;
    if opts.once {
        let _ =
            tokio::time::timeout_at(farewell, reporter.tick(&store, &labels, totals, true)).await;
    }
    reporter.finish();
    for task in [heartbeat, keep_connected, blocked]
        .into_iter()
        .chain(wakeup_sources)
    {
        finish_within(farewell, task).await;
    }
    let fatal = finish_within(farewell, maintenance)
        .await
        .and_then(Result::err);
    if let Some(ui) = dashboard
        && let Some(Err(e)) = finish_within(farewell, ui).await
    {
        tracing::error!(error = %e, "the dashboard stopped with an error");
    }
    let goodbye = async {
        membership.leave(&store).await;
        if mode == WorkerMode::Leasing {
            announce(&store, fleet::announce::LEAVE).await;
        }
    };
    if tokio::time::timeout_at(farewell, goodbye).await.is_err() {
        tracing::warn!(
            "the database did not answer in time; the worker row expires after heartbeat_ttl"
        );
    }
    let _ = tokio::time::timeout_at(farewell, store.close()).await;
    match fatal {
        Some(e) => Err(e.into()),
        None => Ok(totals),
    }
}

/// How long the steps after the drain may take together on exit: the last
/// throughput record, stopping the background tasks, removing the worker
/// row, closing the pool.
const FAREWELL: Duration = Duration::from_secs(2);

/// Waits for `task` until `deadline`, then aborts it; its output if it
/// finished.
async fn finish_within<T>(
    deadline: tokio::time::Instant,
    mut task: tokio::task::JoinHandle<T>,
) -> Option<T> {
    match tokio::time::timeout_at(deadline, &mut task).await {
        Ok(result) => result.ok(),
        Err(_) => {
            task.abort();
            None
        }
    }
}

/// Writes RabbitMQ's flow control of this worker's connection (a resource
/// alarm) to its row whenever it changes, for the dashboard.
async fn report_blocked(
    store: Store,
    worker_id: uuid::Uuid,
    mut blocked: tokio::sync::watch::Receiver<Option<String>>,
    cancel: CancellationToken,
) {
    let mut written: Option<Option<String>> = None;
    loop {
        let now = blocked.borrow_and_update().clone();
        if written.as_ref() != Some(&now) {
            match store.set_broker_blocked(worker_id, now.as_deref()).await {
                Ok(()) => written = Some(now),
                Err(e) => tracing::debug!(error = %e, "recording broker flow control failed"),
            }
        }
        let retry = written.is_none() || written.as_ref() != Some(&*blocked.borrow());
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = blocked.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)), if retry => {}
        }
    }
}

/// Adds this worker's counts to the throughput tables (per minute, per
/// second) once per tick, and prunes old rows every minute or so.
#[derive(Default)]
struct ThroughputRecorder {
    recorded: StatsSnapshot,
    ticks: u64,
}

impl ThroughputRecorder {
    async fn record(&mut self, store: &Store, now: StatsSnapshot) {
        let delta = now.since(&self.recorded);
        if delta.published > 0 || delta.failed > 0 {
            match store.record_throughput(delta.published, delta.failed).await {
                Ok(()) => self.recorded = now,
                // Kept for the next tick: nothing is lost while the database is away.
                Err(e) => tracing::debug!(error = %e, "recording throughput failed"),
            }
        }
        if self.ticks.is_multiple_of(60) {
            let _ = store.prune_throughput().await;
        }
        self.ticks += 1;
    }
}

async fn announce(store: &Store, what: &str) {
    if let Err(e) = store.notify(Channel::Fleet, what).await {
        tracing::debug!(error = %e, what, "could not announce to the fleet");
    }
}

/// Prints ticks (`--json`) and the rate line (`--window`).
struct Reporter {
    json: bool,
    human: bool,
    tty: bool,
    worker_id: uuid::Uuid,
    mode: &'static str,
    last: StatsSnapshot,
    last_at: Instant,
    window: Duration,
    window_start: StatsSnapshot,
    window_at: Instant,
}

impl Reporter {
    fn new(opts: &WorkOptions, worker_id: uuid::Uuid, mode: WorkerMode) -> Self {
        let now = Instant::now();
        Self {
            json: opts.json && !opts.silent,
            human: !opts.json && !opts.silent,
            tty: std::io::stdout().is_terminal(),
            worker_id,
            mode: mode.as_str(),
            last: StatsSnapshot::default(),
            last_at: now,
            window: opts.window,
            window_start: StatsSnapshot::default(),
            window_at: now,
        }
    }

    async fn tick(
        &mut self,
        store: &Store,
        labels: &[String],
        now_stats: StatsSnapshot,
        force_line: bool,
    ) {
        if !self.json && !self.human {
            return;
        }
        let heads = store.bucket_heads(labels).await;
        let heads: Option<Vec<BucketHead>> = match heads {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::debug!(error = %e, "lag query failed");
                None
            }
        };
        let now = Instant::now();
        let tick = Tick {
            ts: chrono::Utc::now(),
            worker_id: self.worker_id,
            mode: self.mode,
            buckets: labels.len(),
            counts: now_stats.since(&self.last),
            elapsed_ms: now.duration_since(self.last_at).as_millis() as u64,
            pending_buckets: heads
                .as_ref()
                .map(|h| h.iter().filter(|b| b.id.is_some()).count()),
            retrying_buckets: heads
                .as_ref()
                .map(|h| h.iter().filter(|b| b.attempts.unwrap_or(0) > 0).count()),
            lag_seconds: heads
                .as_ref()
                .map(|h| h.iter().map(|b| b.lag_seconds).fold(0.0, f64::max)),
        };
        self.last = now_stats;
        self.last_at = now;
        let mut out = std::io::stdout().lock();
        if self.json {
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string(&tick).expect("tick serialises")
            );
            let _ = out.flush();
        } else if force_line || now.duration_since(self.window_at) >= self.window {
            let d = now_stats.since(&self.window_start);
            let secs = now.duration_since(self.window_at).as_secs_f64().max(1e-3);
            let line = format!(
                "{} last {:.0}s: published {} ({:.0}/s) failed {} parked {} | now: lag {} buckets {} ({} with pending rows)",
                tick.ts.format("%H:%M:%S"),
                secs,
                d.published,
                d.published as f64 / secs,
                d.failed,
                d.parked,
                tick.lag_seconds.map_or("?".into(), |l| format!("{l:.1}s")),
                labels.len(),
                tick.pending_buckets.map_or("?".into(), |p| p.to_string()),
            );
            if self.tty {
                let _ = write!(out, "\r\x1b[K{line}");
            } else {
                let _ = writeln!(out, "{line}");
            }
            let _ = out.flush();
            self.window_start = now_stats;
            self.window_at = now;
        }
    }

    fn finish(&self) {
        if self.human && self.tty {
            crate::say!();
        }
    }
}
