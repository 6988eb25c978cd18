//! `outboxd work` with `[[source]]` entries: one worker per source in this
//! process, each joined to its source's fleet on its own — its row,
//! targets, leases, claims and wake-ups in that source's database, its own
//! connection pool (`database.max_connections` each) and broker
//! connection — so sources share no bucket space and no connection.
//!
//! Isolation: a source that cannot start (database or broker unreachable,
//! wrong password, schema not migrated) or that stops with an error is
//! reported in one line naming it and tried again with a growing pause (1 s
//! doubling to 1 min), while the others run on untouched. Every log line
//! of a source's worker carries its name (a `source` span).
//!
//! Reload: on SIGHUP — or, with `worker.reload_on_change`, when the
//! configuration file's content changes — the configuration is read again
//! and the served sources made to match it ([`run`]).
//!
//! Probes (`worker.health_listen`): one listener for the process, each
//! source's worker on its board while it runs (see `probes::Board` for what
//! live and ready mean with several sources).
//!
//! Dashboard (`--ui`): the overview and every source's dashboard, as
//! `outboxd ui` serves them, following reloads.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::probes::{Board, serve_board};
use super::{WorkError, WorkOptions};
use crate::backoff::Backoff;
use crate::config::sources::Source;
use crate::config::{Config, ConfigError};

/// The first pause before a failed source is tried again; it doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Reads the configuration again (file and environment, as at start-up),
/// for SIGHUP.
pub type Reload = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// Serves every source of `config` until `cancel` fires (with `--once`,
/// until each has drained what was ready). On SIGHUP, `reload` gives the
/// new configuration: sources added are joined, removed ones left (after
/// their in-flight batches, leases released), changed ones left and joined
/// again, unchanged ones not touched; a configuration that cannot be read
/// or is invalid is one line and the running one is kept.
///
/// With `watched` (`worker.reload_on_change`), a change of that file's
/// content does the same as SIGHUP.
pub async fn run(
    config: &Config,
    opts: &WorkOptions,
    cancel: CancellationToken,
    reload: Reload,
    watched: Option<PathBuf>,
) -> Result<(), WorkError> {
    let sources = config.sources()?;
    let mut opts = opts.clone();
    // One probes' listener for every source (each source's worker puts its
    // probes on the board while it runs).
    let probes = match config.worker.health_listen {
        Some(addr) => {
            let listener = crate::dashboard::bind(addr).await?;
            let board = Board::default();
            let stop = CancellationToken::new();
            let server = serve_board(listener, board.clone(), cancel.clone(), stop.clone());
            opts.board = Some(board);
            Some((stop, tokio::spawn(server)))
        }
        None => None,
    };
    // One dashboard for every source, as `outboxd ui` serves it.
    let mut dashboard = match opts.ui {
        true => Some(Dashboard::bind(config).await?),
        false => None,
    };
    opts.ui = false;
    if let Some(d) = &mut dashboard {
        d.serve(config, &cancel).await;
    }
    let served =
        serve_until_cancelled(sources, &opts, &cancel, reload, watched, &mut dashboard).await;
    let result = served.finish().await;
    if let Some(d) = &mut dashboard {
        d.stop().await;
    }
    if let Some((stop, server)) = probes {
        stop.cancel();
        let _ = server.await;
    }
    result
}

/// Serves `sources`, reloading on SIGHUP or a changed file, until `cancel`
/// fires (with `--once`, returns at once); the dashboard, if any, follows
/// each reload.
async fn serve_until_cancelled(
    sources: Vec<Source>,
    opts: &WorkOptions,
    cancel: &CancellationToken,
    reload: Reload,
    watched: Option<PathBuf>,
    dashboard: &mut Option<Dashboard>,
) -> Served {
    let mut served = Served::default();
    served.apply(sources, opts, cancel).await;
    if opts.once {
        return served;
    }
    let mut hangups = hangups();
    let mut changes = changes(watched, cancel.clone());
    loop {
        let why = tokio::select! {
            _ = cancel.cancelled() => break,
            Some(()) = hangups.recv() => "SIGHUP",
            Some(()) = changes.recv() => "the configuration file changed",
        };
        tracing::info!("{why}: reading the configuration again");
        match reload().and_then(|new| new.sources().map(|sources| (new, sources))) {
            Ok((new, sources)) => {
                served.apply(sources, opts, cancel).await;
                if let Some(d) = dashboard {
                    d.serve(&new, cancel).await;
                }
            }
            Err(e) => tracing::error!("configuration not reloaded, the running one is kept: {e}"),
        }
    }
    served
}

/// `work --ui` with several sources: the overview and every source's
/// dashboard (as `outboxd ui` serves them) on `dashboard.listen`, served
/// again with the new sources after a reload — on the same socket, so the
/// address stays the same.
struct Dashboard {
    socket: std::net::TcpListener,
    current: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Dashboard {
    async fn bind(config: &Config) -> Result<Self, WorkError> {
        let listener = crate::dashboard::bind(config.dashboard.listen).await?;
        let socket =
            listener
                .into_std()
                .map_err(|source| crate::dashboard::DashboardError::Bind {
                    addr: config.dashboard.listen,
                    source,
                })?;
        Ok(Self {
            socket,
            current: None,
        })
    }

    /// Serves `config`'s sources, in place of what was served before.
    async fn serve(&mut self, config: &Config, cancel: &CancellationToken) {
        self.stop().await;
        let listener = match self
            .socket
            .try_clone()
            .and_then(tokio::net::TcpListener::from_std)
        {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(error = %e, "the dashboard cannot be served");
                return;
            }
        };
        let (config, stop) = (config.clone(), cancel.child_token());
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                use crate::dashboard::{serve_router, sources};
                let all = match sources::Sources::connect(&config, stop.clone()).await {
                    Ok(all) => all,
                    Err(e) => return tracing::error!("the dashboard is not served: {e:#}"),
                };
                let app = sources::router(all.clone());
                if let Err(e) = serve_router(listener, app, &all.home, stop).await {
                    tracing::error!("the dashboard stopped: {e}");
                }
            }
        });
        self.current = Some((stop, task));
    }

    async fn stop(&mut self) {
        if let Some((stop, task)) = self.current.take() {
            stop.cancel();
            let _ = task.await;
        }
    }
}

/// How often a watched configuration file is read.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// A message each time `file`'s content differs from when it was last
/// read (never without a file). Reading the content, not the time it was
/// changed: a Kubernetes ConfigMap volume swaps a symbolic link.
fn changes(file: Option<PathBuf>, cancel: CancellationToken) -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    if let Some(file) = file {
        tokio::spawn(async move {
            let mut last = std::fs::read(&file).ok();
            while cancel
                .run_until_cancelled(tokio::time::sleep(WATCH_EVERY))
                .await
                .is_some()
            {
                let now = std::fs::read(&file).ok();
                if now != last {
                    last = now;
                    let _ = tx.try_send(());
                }
            }
        });
    }
    rx
}

/// SIGHUPs, as a channel (empty if the handler cannot be installed).
fn hangups() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                tokio::spawn(async move {
                    while hup.recv().await.is_some() {
                        let _ = tx.try_send(());
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot handle SIGHUP: no reloads"),
        }
    }
    rx
}

/// The sources being served: each its configuration (as TOML, to tell a
/// change), its stop token and its task.
#[derive(Default)]
struct Served(BTreeMap<String, Serving>);

struct Serving {
    fingerprint: String,
    stop: CancellationToken,
    task: JoinHandle<Result<(), WorkError>>,
}

impl Served {
    /// Makes the served sources `sources`: leaves the removed and the
    /// changed ones (each finishing its in-flight batches and releasing its
    /// leases), then joins the added and the changed ones.
    async fn apply(
        &mut self,
        sources: Vec<Source>,
        opts: &WorkOptions,
        cancel: &CancellationToken,
    ) {
        if let Some(board) = &opts.board {
            board.configure(sources.iter().map(|s| s.name.clone()).collect());
        }
        let fingerprint = |s: &Source| toml::to_string(&s.config).unwrap_or_default();
        let (mut added, mut changed, mut removed, mut unchanged) = (vec![], vec![], vec![], 0);
        let leaving: Vec<String> = self
            .0
            .iter()
            .filter(|(name, serving)| {
                sources
                    .iter()
                    .find(|s| &s.name == *name)
                    .is_none_or(|s| fingerprint(s) != serving.fingerprint)
            })
            .map(|(name, _)| name.clone())
            .collect();
        let mut stopping = Vec::new();
        for name in &leaving {
            let serving = self.0.remove(name).expect("listed");
            serving.stop.cancel();
            stopping.push((name.clone(), serving.task));
        }
        for (name, task) in stopping {
            match task.await {
                Ok(Err(e)) => tracing::warn!(source = %name, "left with an error: {e}"),
                Err(e) => tracing::warn!(source = %name, "its task ended abnormally: {e}"),
                Ok(Ok(())) => {}
            }
            if sources.iter().any(|s| s.name == name) {
                changed.push(name);
            } else {
                removed.push(name);
            }
        }
        for source in sources {
            if self.0.contains_key(&source.name) {
                unchanged += 1;
                continue;
            }
            if !changed.contains(&source.name) {
                added.push(source.name.clone());
            }
            let stop = cancel.child_token();
            let serving = Serving {
                fingerprint: fingerprint(&source),
                task: tokio::spawn(serve(source.clone(), opts.clone(), stop.clone())),
                stop,
            };
            self.0.insert(source.name, serving);
        }
        tracing::info!(
            added = ?added, removed = ?removed, changed = ?changed, unchanged,
            "serving {} source(s)", self.0.len()
        );
    }

    /// Waits for every source's worker to stop; the first error, if any.
    async fn finish(self) -> Result<(), WorkError> {
        let mut failed = None;
        for (_, serving) in self.0 {
            if let Ok(Err(e)) = serving.task.await {
                failed.get_or_insert(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// One source's worker, started again after an error until `cancel`
/// fires; with `--once` its first result is final.
async fn serve(
    source: Source,
    mut opts: WorkOptions,
    cancel: CancellationToken,
) -> Result<(), WorkError> {
    // At ERROR level, so it is on whenever any line is (`--silent` included).
    let span = tracing::error_span!("source", source = %source.name);
    opts.source = Some(source.name.clone());
    // The process serves every source's probes on one listener.
    let mut config = source.config.clone();
    config.worker.health_listen = None;
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
    loop {
        let ran = super::run(&config, &opts, cancel.clone())
            .instrument(span.clone())
            .await;
        let error = match ran {
            Ok(_) => return Ok(()),
            Err(e) if opts.once => return Err(e),
            Err(e) => e,
        };
        if cancel.is_cancelled() {
            return Ok(());
        }
        let pause = backoff.pause();
        span.in_scope(|| {
            tracing::error!(
                retry_in = ?pause,
                "source {} is not served: {error}; the other sources are not affected",
                source.name
            )
        });
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
