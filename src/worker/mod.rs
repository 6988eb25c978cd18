//! One `outboxd work` process, from start-up checks to a clean exit.
//!
//! - [`startup`]: connect, check the schema, bind the listeners, join.
//! - [`supervisor`]: the background tasks (heartbeat, wake-ups, broker
//!   connection, flow-control record, maintenance, dashboard, probes),
//!   started in one place and stopped in one.
//! - the drain itself: the fleet coordinator (leases) or, with
//!   `--no-leasing`, one drainer per bucket, under the process's
//!   [`CancellationToken`];
//! - [`report`]: the periodic report while it drains, its lines written
//!   by [`stdout`]'s thread (a stalled reader never holds the worker up);
//! - [`probes`]: `/livez`, `/readyz` and `/metrics` (`worker.health_listen`);
//! - [`sources`]: several outboxes (`[[source]]`) — one such worker per
//!   source in this process, each retried on its own, reloaded on SIGHUP.
//!
//! Shutdown (SIGTERM / Ctrl-C cancels the token): the probes say "not
//! ready" at once; drainers finish their in-flight batch — published rows
//! are recorded, unsent ones handed back — within
//! `worker.shutdown_timeout`; then the background tasks stop, the worker row
//! is deleted and the process exits 0. A batch still running at the
//! deadline is abandoned: its claim lapses and its rows are published again
//! later (at least once).

mod probes;
mod report;
pub mod sources;
mod startup;
mod stdout;
mod supervisor;

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::amqp::AmqpSink;
use crate::config::Config;
use crate::coordinator::JoinError;
use crate::coordinator::fleet::{self, Fleet, FleetSettings};
use crate::coordinator::housekeeping::Housekeeping;
use crate::otel::{ExportConfig, Tracer};
use crate::relay::stats::StatsSnapshot;
use crate::relay::{Drain, Relay, RelayContext, RelaySettings, RelayStats, Wakeups};
use crate::store::workers::{LateWatch, WorkerMode};
use crate::store::{Channel, Store, StoreError};
use crate::stream::{StreamLink, StreamSink};
use probes::{Beat, Probes};
use report::Report;
use startup::Started;
use supervisor::Supervisor;

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
    /// Export spans and metrics (`OTEL_*` variables ask for it).
    pub telemetry: Option<ExportConfig>,
    /// The source served, named in the report, when there are several.
    pub source: Option<String>,
    /// With several sources and `worker.health_listen`: where this source's
    /// probes go (one listener serves them all).
    pub(crate) board: Option<probes::Board>,
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
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// The relay's sink: the AMQP broker, and the stream port for the rows
/// `amqp.streams` names when it is set (tried once here, as the broker is
/// at start-up).
async fn sink(
    config: &Config,
    opts: &WorkOptions,
    started: &Started,
    bucket_count: usize,
    stats: &RelayStats,
) -> Result<Arc<dyn crate::sink::Sink>, WorkError> {
    let queues: Arc<dyn crate::sink::Sink> = Arc::new(AmqpSink::new(
        started.broker.clone(),
        stats.delivered.clone(),
    ));
    if config.amqp.streams.is_empty() {
        return Ok(queues);
    }
    let link = StreamLink::new(&config.amqp).map_err(|e| WorkError::Broker(e.to_string()))?;
    let source = opts
        .source
        .as_deref()
        .unwrap_or(crate::config::sources::DEFAULT_SOURCE);
    let prefix = StreamSink::producer_prefix(source, &config.tables.outbox, bucket_count as u32);
    let streams = StreamSink::new(
        link,
        &config.amqp.streams,
        prefix,
        queues,
        stats.delivered.clone(),
    );
    if let Err(e) = streams.connect_once().await {
        tracing::warn!(error = %e, "the stream port is not reachable yet; the relay keeps retrying");
    }
    Ok(Arc::new(streams))
}

/// Runs a worker until `cancel` fires (or, with `--once`, until the ready
/// rows are drained). Returns the totals.
pub async fn run(
    config: &Config,
    opts: &WorkOptions,
    cancel: CancellationToken,
) -> Result<StatsSnapshot, WorkError> {
    for caution in config.cautions() {
        tracing::warn!("{caution}");
    }
    let mut started = startup::start(config, opts).await?;
    let labels = started.partitioner.labels();
    let stats = Arc::new(RelayStats::counting_late_writes_in(
        started.broker.late_writes(),
    ));
    let w = &config.worker;
    let wakeups = Wakeups::new(
        &labels,
        LateWatch::for_fleet(w.lease_ttl, w.lease_renew, w.heartbeat_ttl),
    );
    let mut tasks = Supervisor::new();
    let tracer = match &opts.telemetry {
        Some(export) => {
            let worker_id = started.membership.worker_id.to_string();
            let counters = crate::relay::stats::observed(&stats);
            let traces = stats.traces.clone();
            let (tracer, telemetry) =
                crate::otel::export::start(export, worker_id, traces, counters)
                    .await
                    .map_err(|e| {
                        WorkError::Config(crate::config::ConfigError::Env(format!(
                            "telemetry: {e}"
                        )))
                    })?;
            tasks.spawn("telemetry export", telemetry.run(tasks.token()));
            tracer
        }
        None => Tracer::default(),
    };
    let relay = Arc::new(Relay::new(
        Arc::new(RelayContext {
            store: started.store.clone(),
            broker: started.broker.clone(),
            sink: sink(config, opts, &started, labels.len(), &stats).await?,
            settings: RelaySettings::from_config(config),
            stats: stats.clone(),
            tracer,
        }),
        wakeups.clone(),
    ));
    let housekeeping = start_background(
        &mut tasks,
        config,
        opts,
        &mut started,
        &relay,
        &wakeups,
        &cancel,
    )
    .await;
    let Draining {
        owned,
        publishing,
        mut coordination,
    } = start_draining(
        config,
        opts,
        &started,
        &relay,
        &wakeups,
        &housekeeping,
        &cancel,
    );

    let report_turns = Beat::new("report");
    let listener = started.probes.take();
    let mut _on_board = None;
    if listener.is_some() || opts.board.is_some() {
        let mut loops = vec![report_turns.clone()];
        if publishing.is_some() {
            let coordinator = Beat::new("coordinator");
            tasks.spawn(
                "coordinator turns",
                watch_turns(owned.clone(), coordinator.clone()),
            );
            loops.push(coordinator);
        }
        let probes = Probes::new(
            config,
            cancel.clone(),
            relay.context().sink.reach(),
            publishing,
            loops,
            stats.clone(),
        );
        let ping = probes
            .clone()
            .ping_database(started.store.clone(), tasks.token());
        tasks.spawn("database ping", ping);
        if let (Some(board), Some(source)) = (&opts.board, &opts.source) {
            _on_board = Some(board.put(source, probes.clone()));
        }
        if let Some(listener) = listener {
            tasks.spawn("probes", probes::serve(listener, probes, tasks.token()));
        }
    }

    let mut report = Report::new(
        opts,
        started.membership.worker_id,
        started.mode,
        started.store.clone(),
        stats,
        housekeeping,
        relay.context().sink.reach(),
    );
    report
        .run(&mut coordination, owned, &cancel, report_turns)
        .await;

    // After the drain, everything below shares one short budget, so a
    // worker whose database stopped answering still exits promptly (its
    // row and leases then expire on their own).
    let farewell = tokio::time::Instant::now() + FAREWELL;
    let totals = report.finish(&labels, farewell).await;
    let fatal = tasks.stop(farewell).await;
    let Started {
        store,
        membership,
        mode,
        ..
    } = started;
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
    // Last, as a stalled reader of stdout may take the whole budget.
    stdout::flush(farewell).await;
    match fatal {
        Some(e) => Err(e),
        None => Ok(totals),
    }
}

/// How long the steps after the drain may take together on exit: the last
/// throughput record, stopping the background tasks, removing the worker
/// row, closing the pool, writing the report lines still queued.
const FAREWELL: Duration = Duration::from_secs(2);

/// Starts what runs beside the drain, under `tasks`: the heartbeat, the
/// wake-ups, the sink's connections, the flow-control record, the
/// maintenance (whose failure stops the worker) and the dashboard. Returns
/// whether this worker does the fleet-wide chores, which the maintenance
/// follows and the coordinator sets ([`Housekeeping`]).
async fn start_background(
    tasks: &mut Supervisor,
    config: &Config,
    opts: &WorkOptions,
    started: &mut Started,
    relay: &Relay,
    wakeups: &Wakeups,
    cancel: &CancellationToken,
) -> Housekeeping {
    let store = &started.store;
    let stats = &relay.context().stats;
    let housekeeping = Housekeeping::default();
    let heartbeat =
        started
            .membership
            .clone()
            .heartbeat_loop(store.clone(), stats.clone(), tasks.token());
    tasks.spawn("heartbeat", heartbeat);
    let idle_backoff = Duration::from_millis(config.outbox.idle_backoff_ms);
    let token = tasks.token();
    for handle in wakeups
        .start(store, &config.database, idle_backoff, &token)
        .await
    {
        tasks.adopt("wake-ups", handle);
    }
    let sink = relay.context().sink.clone();
    let reach = sink.reach();
    let token = tasks.token();
    tasks.spawn("broker connection", async move {
        sink.keep_connected(token).await
    });
    tasks.spawn(
        "broker complaints",
        report::complain_while_unreachable(reach, tasks.token()),
    );
    let blocked = report::report_blocked(
        store.clone(),
        started.membership.worker_id,
        started.broker.blocked(),
        tasks.token(),
    );
    tasks.spawn("flow control", blocked);
    let retention =
        (!config.outbox.retention.is_zero() && !opts.once).then_some(config.outbox.retention);
    let maintenance = crate::ops::maintenance_loop(
        store.clone(),
        started.partitioner.count(),
        retention,
        housekeeping.clone(),
        tasks.token(),
        cancel.clone(),
    );
    tasks.spawn_fallible("maintenance", async { Ok(maintenance.await?) });
    if let Some(listener) = started.dashboard.take() {
        let state =
            crate::dashboard::DashboardState::new(config, store.clone(), Some(stats.clone()));
        let served = crate::dashboard::serve(listener, state, tasks.token());
        tasks.spawn("dashboard", async {
            if let Err(e) = served.await {
                tracing::error!(error = %e, "the dashboard stopped with an error");
            }
        });
    }
    housekeeping
}

/// The drain under way.
struct Draining {
    /// The buckets drained, updated every coordinator cycle.
    owned: watch::Receiver<Vec<String>>,
    /// Fleet mode: whether the worker takes part in the targets.
    publishing: Option<watch::Receiver<bool>>,
    /// Ends when the worker has stopped draining: after a graceful
    /// shutdown, or when `--once` has drained what was ready.
    coordination: JoinHandle<()>,
}

/// Starts draining: the fleet coordinator, or (`--no-leasing`) every bucket
/// at once.
fn start_draining(
    config: &Config,
    opts: &WorkOptions,
    started: &Started,
    relay: &Arc<Relay>,
    wakeups: &Wakeups,
    housekeeping: &Housekeeping,
    cancel: &CancellationToken,
) -> Draining {
    let labels = started.partitioner.labels();
    let drain = if opts.once {
        Drain::UntilEmpty
    } else {
        Drain::Forever
    };
    let shutdown_timeout = config.worker.shutdown_timeout;
    match started.mode {
        WorkerMode::NoLeasing => {
            for label in &labels {
                relay.spawn_bucket(label, None, drain, cancel.child_token());
            }
            tracing::info!(buckets = labels.len(), mode = "no-leasing", "draining");
            let (relay, cancel) = (relay.clone(), cancel.clone());
            let coordination = async move {
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
            };
            let coordination = tokio::spawn(coordination.in_current_span());
            Draining {
                owned: watch::channel(labels).1,
                publishing: None,
                coordination,
            }
        }
        WorkerMode::Leasing => {
            let settings = FleetSettings {
                lease_ttl: config.worker.lease_ttl,
                lease_renew: config.worker.lease_renew,
                heartbeat_ttl: config.worker.heartbeat_ttl,
                broker_grace: config.worker.broker_grace,
                assignment: config.worker.assignment,
                partitioner: started.partitioner,
            };
            let fleet = Fleet::new(
                started.store.clone(),
                relay.clone(),
                started.membership.worker_id,
                settings,
                wakeups.fleet(),
                housekeeping.clone(),
                started.membership.renewal_beats.clone(),
            );
            Draining {
                owned: fleet.owned(),
                publishing: Some(fleet.publishing()),
                coordination: tokio::spawn(
                    fleet
                        .run(drain, cancel.clone(), shutdown_timeout)
                        .in_current_span(),
                ),
            }
        }
    }
}

/// Beats every time the coordinator ends a cycle (it sends `owned` then),
/// until it stops.
async fn watch_turns(mut owned: watch::Receiver<Vec<String>>, turned: Beat) {
    while owned.changed().await.is_ok() {
        turned.beat();
    }
}

async fn announce(store: &Store, what: &str) {
    if let Err(e) = store.notify(Channel::Fleet, what).await {
        tracing::debug!(error = %e, what, "could not announce to the fleet");
    }
}
