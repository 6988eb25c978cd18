//! A worker's own probes (`worker.health_listen`): `/livez`, `/readyz` and
//! this worker's `/metrics`, without a token (they reveal no message
//! content) and without asking the database for anything but a ping, so
//! they answer while it is away.
//!
//! - **Live** while every loop registered with a [`Beat`] (the report loop;
//!   in fleet mode the coordinator's cycle too) has turned within
//!   [`stall_after`]: long enough for a turn whose every statement waits
//!   out its timeouts, so a database or broker outage never fails it —
//!   only a wedged loop does.
//! - **Ready** while the worker is not shutting down (SIGTERM makes it
//!   unready at once, before its buckets are handed over), has joined, has
//!   heard the database answer within `database.dead_peer_timeout` (a ping
//!   every second), reaches the broker, and (fleet mode) takes part in the
//!   fleet's targets. Otherwise 503 with the first reason, e.g.
//!   `{"ready":false,"reason":"broker unreachable for 12s: …"}`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, fmt_duration};
use crate::relay::RelayStats;
use crate::sink::Reach;
use crate::stamp::Stamp;
use crate::store::Store;

/// How often the database is pinged.
const PING_EVERY: Duration = Duration::from_secs(1);

/// How long a loop may go without turning before the worker is not live:
/// ten turns in which every statement waits out its connect and query
/// timeouts, and at least 30 s.
pub(super) fn stall_after(config: &Config) -> Duration {
    let db = &config.database;
    ((db.connect_timeout + db.query_timeout) * 10).max(Duration::from_secs(30))
}

/// When a loop last turned.
#[derive(Clone)]
pub(super) struct Beat {
    name: &'static str,
    last: Stamp,
}

impl Beat {
    pub(super) fn new(name: &'static str) -> Self {
        Self {
            name,
            last: Stamp::default(),
        }
    }

    pub(super) fn beat(&self) {
        self.last.mark();
    }

    fn silent_for(&self) -> Duration {
        self.last.ago()
    }
}

/// The database as the pings saw it.
struct DatabaseSeen {
    answered_at: Instant,
    error: Option<String>,
}

/// What the probes read.
pub(super) struct Probes {
    /// The process's shutdown token: cancelled means shutting down.
    pub shutdown: CancellationToken,
    pub broker: watch::Receiver<Reach>,
    /// Fleet mode: whether the worker takes part in the targets.
    pub publishing: Option<watch::Receiver<bool>>,
    pub loops: Vec<Beat>,
    pub stall_after: Duration,
    /// `database.dead_peer_timeout`: how long without an answer makes the
    /// database unreachable.
    pub database_grace: Duration,
    pub stats: Arc<RelayStats>,
    database: Mutex<DatabaseSeen>,
}

impl Probes {
    pub(super) fn new(
        config: &Config,
        shutdown: CancellationToken,
        broker: watch::Receiver<Reach>,
        publishing: Option<watch::Receiver<bool>>,
        loops: Vec<Beat>,
        stats: Arc<RelayStats>,
    ) -> Arc<Self> {
        Arc::new(Self {
            shutdown,
            broker,
            publishing,
            loops,
            stall_after: stall_after(config),
            database_grace: config.database.dead_peer_timeout,
            stats,
            database: Mutex::new(DatabaseSeen {
                answered_at: Instant::now(),
                error: None,
            }),
        })
    }

    /// Why the worker is not live, if it is not.
    fn not_live(&self) -> Option<String> {
        let stalled = self
            .loops
            .iter()
            .find(|b| b.silent_for() > self.stall_after)?;
        Some(format!(
            "the {} loop has not turned for {}",
            stalled.name,
            secs(stalled.silent_for())
        ))
    }

    /// Why the worker is not ready, if it is not.
    fn not_ready(&self) -> Option<String> {
        if self.shutdown.is_cancelled() {
            return Some("shutting down".into());
        }
        {
            let db = self.database.lock().expect("not poisoned");
            let silent = db.answered_at.elapsed();
            if silent > self.database_grace {
                let error = db.error.as_deref().unwrap_or("no answer");
                return Some(format!(
                    "database unreachable for {}: {error}",
                    secs(silent)
                ));
            }
        }
        match &*self.broker.borrow() {
            Reach::Reachable => {}
            Reach::Never { error } => {
                let error = error.as_deref().unwrap_or("connecting");
                return Some(format!("broker not reached yet: {error}"));
            }
            Reach::Unreachable { since, error } => {
                return Some(format!(
                    "broker unreachable for {}: {error}",
                    secs(since.elapsed())
                ));
            }
        }
        if let Some(publishing) = &self.publishing
            && !*publishing.borrow()
        {
            return Some("not (yet) taking part in the fleet's targets".into());
        }
        None
    }

    /// Pings the database every second until `stop` fires.
    pub(super) async fn ping_database(self: Arc<Self>, store: Store, stop: CancellationToken) {
        loop {
            let answer = tokio::time::timeout(self.database_grace, store.ping()).await;
            {
                let mut db = self.database.lock().expect("not poisoned");
                match answer {
                    Ok(Ok(())) => {
                        db.answered_at = Instant::now();
                        db.error = None;
                    }
                    Ok(Err(e)) => db.error = Some(e.to_string()),
                    Err(_) => {
                        let within = fmt_duration(self.database_grace);
                        db.error = Some(format!("no answer within {within}"));
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(PING_EVERY) => {}
            }
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

/// The probes' routes.
pub(super) fn router(probes: Arc<Probes>) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(probes)
}

/// Serves the probes on `listener` until `stop` fires.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    probes: Arc<Probes>,
    stop: CancellationToken,
) {
    if let Ok(local) = listener.local_addr() {
        tracing::info!(%local, "probes listening (/livez, /readyz, /metrics)");
    }
    let limits = crate::dashboard::server::Limits::default();
    crate::dashboard::server::serve(listener, router(probes), None, limits, stop).await;
}

fn answer(ok: bool, field: &str, reason: Option<String>) -> Response {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = serde_json::Map::new();
    body.insert(field.into(), ok.into());
    if let Some(reason) = reason {
        body.insert("reason".into(), reason.into());
    }
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(body),
    )
        .into_response()
}

async fn livez(State(p): State<Arc<Probes>>) -> Response {
    let reason = p.not_live();
    answer(reason.is_none(), "live", reason)
}

async fn readyz(State(p): State<Arc<Probes>>) -> Response {
    let reason = p.not_ready();
    answer(reason.is_none(), "ready", reason)
}

/// This worker's counters and latencies, and its readiness as gauges.
async fn metrics(State(p): State<Arc<Probes>>) -> Response {
    use crate::dashboard::metrics as m;
    let mut out = String::with_capacity(4 * 1024);
    m::gauge(&mut out, "outboxd_up", "1 while this process answers", 1.0);
    let ready = p.not_ready().is_none();
    m::gauge(
        &mut out,
        "outboxd_ready",
        "1 while this worker is ready (see /readyz)",
        f64::from(u8::from(ready)),
    );
    m::process(&mut out, &p.stats);
    m::text(out)
}

/// Several sources' probes behind one listener (`worker.health_listen`
/// with `[[source]]` entries): each source's worker registers its
/// [`Probes`] while it runs.
///
/// - **Live** while every running source's loops turn (a wedged loop is a
///   fault of this process).
/// - **Ready** while the process is not shutting down and at least one
///   source is ready: one tenant's outage must not make the process
///   unready for all the others. The body says each configured source's
///   state; `/metrics` has `outboxd_ready{source}` to alert on one.
#[derive(Clone, Default)]
pub(crate) struct Board(Arc<Mutex<BoardState>>);

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Board")
    }
}

#[derive(Default)]
struct BoardState {
    configured: Vec<String>,
    running: std::collections::BTreeMap<String, Arc<Probes>>,
}

/// A source's probes on the [`Board`]; taken off when dropped.
pub(super) struct OnBoard {
    board: Board,
    name: String,
}

impl Drop for OnBoard {
    fn drop(&mut self) {
        self.board.state().running.remove(&self.name);
    }
}

impl Board {
    fn state(&self) -> std::sync::MutexGuard<'_, BoardState> {
        self.0.lock().expect("not poisoned")
    }

    /// The sources the configuration names (after a reload too).
    pub(super) fn configure(&self, names: Vec<String>) {
        self.state().configured = names;
    }

    pub(super) fn put(&self, name: &str, probes: Arc<Probes>) -> OnBoard {
        self.state().running.insert(name.to_string(), probes);
        OnBoard {
            board: self.clone(),
            name: name.to_string(),
        }
    }

    /// Each configured source's readiness: `None` when ready, else why not.
    fn states(&self) -> Vec<(String, Option<String>)> {
        let state = self.state();
        state
            .configured
            .iter()
            .map(|name| {
                let why = match state.running.get(name) {
                    Some(p) => p.not_ready(),
                    None => Some("not served (see the worker's log)".into()),
                };
                (name.clone(), why)
            })
            .collect()
    }

    fn running(&self) -> Vec<(String, Arc<Probes>)> {
        let state = self.state();
        state
            .running
            .iter()
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect()
    }
}

/// Serves `board`'s probes on `listener` until `stop` fires; `shutdown` is
/// the process's shutdown token.
pub(super) async fn serve_board(
    listener: tokio::net::TcpListener,
    board: Board,
    shutdown: CancellationToken,
    stop: CancellationToken,
) {
    if let Ok(local) = listener.local_addr() {
        tracing::info!(%local, "probes listening for every source (/livez, /readyz, /metrics)");
    }
    let app = Router::new()
        .route("/livez", get(board_livez))
        .route("/readyz", get(board_readyz))
        .route("/metrics", get(board_metrics))
        .with_state((board, shutdown));
    let limits = crate::dashboard::server::Limits::default();
    crate::dashboard::server::serve(listener, app, None, limits, stop).await;
}

type BoardApp = (Board, CancellationToken);

async fn board_livez(State((board, _)): State<BoardApp>) -> Response {
    let stalled = board
        .running()
        .into_iter()
        .find_map(|(name, p)| p.not_live().map(|why| format!("source {name}: {why}")));
    answer(stalled.is_none(), "live", stalled)
}

async fn board_readyz(State((board, shutdown)): State<BoardApp>) -> Response {
    let states = board.states();
    let ready = !shutdown.is_cancelled() && states.iter().any(|(_, why)| why.is_none());
    let mut sources = serde_json::Map::new();
    for (name, why) in &states {
        let state = why.clone().unwrap_or_else(|| "ready".into());
        sources.insert(name.clone(), state.into());
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = serde_json::Map::new();
    body.insert("ready".into(), ready.into());
    if shutdown.is_cancelled() {
        body.insert("reason".into(), "shutting down".into());
    } else if !ready {
        body.insert("reason".into(), "no source is ready".into());
    }
    body.insert("sources".into(), sources.into());
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(body),
    )
        .into_response()
}

/// Each running source's counters, latencies and readiness, with a
/// `source` label.
async fn board_metrics(State((board, _)): State<BoardApp>) -> Response {
    use crate::dashboard::metrics as m;
    let parts: Vec<(String, String)> = board
        .running()
        .into_iter()
        .map(|(name, p)| {
            let mut out = String::with_capacity(4 * 1024);
            let ready = p.not_ready().is_none();
            m::gauge(
                &mut out,
                "outboxd_ready",
                "1 while this source's worker is ready (see /readyz)",
                f64::from(u8::from(ready)),
            );
            m::process(&mut out, &p.stats);
            (name, out)
        })
        .collect();
    let mut out = String::new();
    m::gauge(&mut out, "outboxd_up", "1 while this process answers", 1.0);
    out.push_str(&m::labelled(&parts, "source"));
    m::text(out)
}
