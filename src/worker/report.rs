//! What a running worker reports: a *tick* every `--interval-ms` on
//! stdout (the counts since the previous tick and the lag, the age of the
//! oldest pending row; one JSON object with `--json`, a rate line every
//! `--window` otherwise), its counts added to the throughput tables,
//! RabbitMQ's flow control of its connection written to its row, and an
//! error line, again and again, while RabbitMQ cannot be reached.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::WorkOptions;
use super::probes::Beat;
use crate::config::fmt_duration;
use crate::coordinator::housekeeping::Housekeeping;
use crate::relay::RelayStats;
use crate::relay::stats::StatsSnapshot;
use crate::sink::Reach;
use crate::store::Store;
use crate::store::outbox::BucketHead;
use crate::store::workers::WorkerMode;

/// The periodic report of one worker.
pub(super) struct Report {
    store: Store,
    stats: Arc<RelayStats>,
    reporter: Reporter,
    throughput: ThroughputRecorder,
    interval: Duration,
    once: bool,
}

impl Report {
    pub(super) fn new(
        opts: &WorkOptions,
        worker_id: uuid::Uuid,
        mode: WorkerMode,
        store: Store,
        stats: Arc<RelayStats>,
        housekeeping: Housekeeping,
        reach: watch::Receiver<Reach>,
    ) -> Self {
        Self {
            store,
            stats,
            reporter: Reporter::new(opts, worker_id, mode, reach),
            throughput: ThroughputRecorder {
                recorded: StatsSnapshot::default(),
                ticks: 0,
                housekeeping,
            },
            interval: opts.interval,
            once: opts.once,
        }
    }

    /// Reports every tick until `coordination` ends (the worker stopped
    /// draining); `turned` beats at every turn of this loop. With
    /// `--once`, only waits.
    pub(super) async fn run(
        &mut self,
        coordination: &mut JoinHandle<()>,
        owned: watch::Receiver<Vec<String>>,
        cancel: &CancellationToken,
        turned: Beat,
    ) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            turned.beat();
            tokio::select! {
                _ = &mut *coordination => return,
                _ = ticks.tick(), if !self.once => {
                    let now = self.stats.snapshot();
                    let buckets = owned.borrow().clone();
                    let report = async {
                        self.throughput.record(&self.store, now).await;
                        self.reporter.tick(&self.store, &buckets, now, false).await;
                    };
                    // A shutdown does not wait for a tick's database calls.
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = report => {}
                    }
                }
            }
        }
    }

    /// The last report, within `deadline`: the final counts recorded, and
    /// with `--once` the line for `labels`. The totals.
    pub(super) async fn finish(
        &mut self,
        labels: &[String],
        deadline: tokio::time::Instant,
    ) -> StatsSnapshot {
        let totals = self.stats.snapshot();
        let record = self.throughput.record(&self.store, totals);
        let _ = tokio::time::timeout_at(deadline, record).await;
        if self.once {
            let line = self.reporter.tick(&self.store, labels, totals, true);
            let _ = tokio::time::timeout_at(deadline, line).await;
        }
        self.reporter.finish();
        totals
    }
}

/// One tick's report.
#[derive(Debug, Serialize)]
struct Tick {
    pub ts: chrono::DateTime<chrono::Utc>,
    /// The source (`[[source]]`) this worker serves, when there are several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
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
    /// Why nothing is published: RabbitMQ cannot be reached, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker_error: Option<String>,
}

/// Writes RabbitMQ's flow control of this worker's connection (a resource
/// alarm) to its row whenever it changes, for the dashboard.
pub(super) async fn report_blocked(
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

/// How long the broker may be unreachable before it is said as an error
/// (a broker restart takes a second or two), and the pauses between the
/// lines while it stays so: doubling from the first to the most, so an
/// outage is said at least once a minute for as long as it lasts.
const QUIET_OUTAGE: Duration = Duration::from_secs(5);
const FIRST_REPEAT: Duration = Duration::from_secs(10);
const MOST_REPEAT: Duration = Duration::from_secs(60);

/// Says at ERROR, with the reason, that RabbitMQ cannot be reached and
/// nothing is published: at once when it was never reached (a wrong
/// password, a wrong address), after [`QUIET_OUTAGE`] when it was lost,
/// then again after 10, 20, 40 and every 60 s until it is reached.
pub(super) async fn complain_while_unreachable(
    mut reach: watch::Receiver<Reach>,
    cancel: CancellationToken,
) {
    let mut pause = FIRST_REPEAT;
    let mut next: Option<tokio::time::Instant> = None;
    loop {
        let now = tokio::time::Instant::now();
        let failing = match &*reach.borrow_and_update() {
            Reach::Reachable | Reach::Never { error: None } => None,
            Reach::Never { error: Some(error) } => Some((error.clone(), now, None)),
            Reach::Unreachable { since, error } => {
                Some((error.clone(), *since + QUIET_OUTAGE, Some(since.elapsed())))
            }
        };
        let wake = match failing {
            None => {
                pause = FIRST_REPEAT;
                next = None;
                None
            }
            Some((error, first_at, unreachable_for)) => {
                let due = next.unwrap_or(first_at);
                if now >= due {
                    match unreachable_for {
                        Some(d) => tracing::error!(
                            %error,
                            "RabbitMQ unreachable for {}: nothing is published until it can be reached (said again in {})",
                            fmt_duration(d),
                            fmt_duration(pause)
                        ),
                        None => tracing::error!(
                            %error,
                            "RabbitMQ cannot be reached: nothing is published until it can (said again in {})",
                            fmt_duration(pause)
                        ),
                    }
                    next = Some(now + pause);
                    pause = (pause * 2).min(MOST_REPEAT);
                }
                Some(next.unwrap_or(due))
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = reach.changed() => if changed.is_err() { return },
            _ = sleep_until_some(wake) => {}
        }
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Adds this worker's counts to the throughput tables (per minute, per
/// second) once per tick, and prunes old rows every minute or so while it
/// keeps the fleet's house.
struct ThroughputRecorder {
    recorded: StatsSnapshot,
    ticks: u64,
    housekeeping: Housekeeping,
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
        if self.ticks.is_multiple_of(60) && self.housekeeping.is_mine() {
            let _ = store.prune_throughput().await;
        }
        self.ticks += 1;
    }
}

/// How much later than the next a tick may wake (see [`Reporter::tick`]).
const LATE_WAKE: Duration = Duration::from_millis(20);

/// Prints ticks (`--json`) and the rate line (`--window`).
struct Reporter {
    json: bool,
    human: bool,
    tty: bool,
    worker_id: uuid::Uuid,
    mode: &'static str,
    source: Option<String>,
    last: StatsSnapshot,
    last_at: Instant,
    window: Duration,
    window_start: StatsSnapshot,
    window_at: Instant,
    /// Whether RabbitMQ can be reached, and why not: said on every line.
    reach: watch::Receiver<Reach>,
}

impl Reporter {
    fn new(
        opts: &WorkOptions,
        worker_id: uuid::Uuid,
        mode: WorkerMode,
        reach: watch::Receiver<Reach>,
    ) -> Self {
        let now = Instant::now();
        Self {
            json: opts.json && !opts.silent,
            human: !opts.json && !opts.silent,
            tty: std::io::stdout().is_terminal(),
            worker_id,
            mode: mode.as_str(),
            source: opts.source.clone(),
            last: StatsSnapshot::default(),
            last_at: now,
            window: opts.window,
            window_start: StatsSnapshot::default(),
            window_at: now,
            reach,
        }
    }

    async fn tick(
        &mut self,
        store: &Store,
        labels: &[String],
        now_stats: StatsSnapshot,
        force_line: bool,
    ) {
        // The heads are read for a line that is printed: every tick with
        // `--json`, every `--window` for the rate line (a statement a tick
        // otherwise, for every worker of a fleet). A tick that wakes a
        // little earlier after the last line than that one did still counts.
        let began = Instant::now();
        let line_due = force_line || began + LATE_WAKE >= self.window_at + self.window;
        if !(self.json || self.human && line_due) {
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
            source: self.source.clone(),
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
            broker_error: match &*self.reach.borrow() {
                Reach::Never { error: Some(e) } | Reach::Unreachable { error: e, .. } => {
                    Some(e.clone())
                }
                _ => None,
            },
        };
        self.last = now_stats;
        self.last_at = now;
        if self.json {
            let line = serde_json::to_string(&tick).expect("tick serialises");
            super::stdout::print(line + "\n");
        } else if line_due {
            let d = now_stats.since(&self.window_start);
            let secs = began.duration_since(self.window_at).as_secs_f64().max(1e-3);
            let line = format!(
                "{}{} last {:.0}s: published {} ({:.0}/s) failed {} parked {} | now: lag {} buckets {} ({} with pending rows)",
                tick.ts.format("%H:%M:%S"),
                self.source
                    .as_ref()
                    .map_or(String::new(), |s| format!(" [{s}]")),
                secs,
                d.published,
                d.published as f64 / secs,
                d.failed,
                d.parked,
                tick.lag_seconds.map_or("?".into(), |l| format!("{l:.1}s")),
                labels.len(),
                tick.pending_buckets.map_or("?".into(), |p| p.to_string()),
            );
            let line = match &tick.broker_error {
                Some(e) => {
                    format!("{line} | nothing is published: RabbitMQ cannot be reached: {e}")
                }
                None => line,
            };
            super::stdout::print(if self.tty {
                format!("\r\x1b[K{line}")
            } else {
                line + "\n"
            });
            self.window_start = now_stats;
            self.window_at = began;
        }
    }

    /// Ends the rate line on a terminal.
    fn finish(&self) {
        if self.human && self.tty {
            super::stdout::print("\n".into());
        }
    }
}
