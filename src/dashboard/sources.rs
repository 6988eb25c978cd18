//! The all-sources dashboard: `outboxd ui` with several `[[source]]`s.
//!
//! `<path>/` is an overview, one row per source — healthy or why not, live
//! workers, pending, oldest pending, blocked heads, parked, published in
//! the last minute — refreshed every 2 seconds from `<path>/api/sources`.
//! Each source's own dashboard, exactly the single-source one, is at
//! `<path>/s/<name>/`. One login (token, session cookie on `<path>`)
//! covers them all. `/metrics` is every source's figures in one
//! exposition, each sample labelled `source="<name>"`; `/healthz` is 200
//! while any source's database answers, with one line per source (one
//! tenant's database being down must not get the dashboard restarted).
//!
//! A source whose database does not answer when `ui` starts is a [`Slot`]
//! waiting: shown unhealthy with the reason, its pages 503, tried again
//! every [`RECONNECT_EVERY`]; `ui` serves once one source has answered.
//!
//! A source whose database is down, slow or not migrated is unhealthy in
//! its row (with the reason) and the others are unaffected: each source
//! is read on its own, within [`SOURCE_WITHIN`]. A read that takes longer
//! is not stopped (see [`super::within`]): it finishes on its own task,
//! and polls that come meanwhile wait on it rather than start another.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::{any, get, post};
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::{DashboardState, api, asset, login, login_page, logout, metrics, pages};
use crate::config::Config;
use crate::store::{Store, schema};

const SOURCES_HTML: &str = include_str!("../../ui/sources.html");
const SOURCES_JS: &str = include_str!("../../ui/sources.js");
const STYLE_CSS: &str = include_str!("../../ui/style.css");

/// How long the overview and `/metrics` wait for one source's database.
pub const SOURCE_WITHIN: Duration = Duration::from_secs(2);
/// How often a source whose database could not be reached at start-up is
/// tried again.
const RECONNECT_EVERY: Duration = Duration::from_secs(5);

/// What the overview's handlers read: the home state (`<path>`, the shared
/// login) and each source, in configuration order.
pub struct Sources {
    pub home: Arc<DashboardState>,
    pub sources: Vec<Arc<Slot>>,
}

/// One source: its dashboard once its database was reached, or why not yet.
pub struct Slot {
    pub name: String,
    /// `<path>/s/<name>`.
    pub path: String,
    /// The overview's path (its login, the session cookie's path).
    home: String,
    auth: Option<Arc<super::auth::Auth>>,
    config: Config,
    served: RwLock<Served>,
    /// The overview's read of this source in flight, if any.
    reading: Mutex<Option<Read>>,
}

/// One read of a source's summary, shared by the polls that wait on it.
type Read = Shared<BoxFuture<'static, Result<Arc<api::Summary>, String>>>;

enum Served {
    Waiting(String),
    Ready(Arc<DashboardState>, Router),
}

impl Sources {
    /// Every source of `config`, each connected if its database answers;
    /// the others are tried again every few seconds until `cancel`.
    pub async fn connect(config: &Config, cancel: CancellationToken) -> anyhow::Result<Arc<Self>> {
        let home_path = config.dashboard.path.clone();
        let auth = super::auth::Auth::new(&config.dashboard.token, config.dashboard.session_ttl);
        let mut sources = Vec::new();
        for source in config.sources()? {
            let path = format!("{home_path}/s/{}", source.name);
            sources.push(Arc::new(Slot {
                name: source.name,
                path,
                home: home_path.clone(),
                auth: auth.clone(),
                config: source.config,
                served: RwLock::new(Served::Waiting("not connected yet".into())),
                reading: Mutex::new(None),
            }));
        }
        let tries = sources.iter().map(|slot| slot.try_connect());
        futures_util::future::join_all(tries).await;
        for slot in sources.iter().filter(|s| s.state().is_none()) {
            let (slot, cancel) = (slot.clone(), cancel.clone());
            tokio::spawn(async move {
                while cancel
                    .run_until_cancelled(tokio::time::sleep(RECONNECT_EVERY))
                    .await
                    .is_some()
                    && !slot.try_connect().await
                {}
            });
        }
        // The overview's own state needs a store (none of its pages reads
        // it): the first source's that answers.
        let store = loop {
            if let Some(st) = sources.iter().find_map(|s| s.state()) {
                break st.store.clone();
            }
            if cancel
                .run_until_cancelled(tokio::time::sleep(Duration::from_secs(1)))
                .await
                .is_none()
            {
                anyhow::bail!("stopped before any source's database answered");
            }
        };
        let home = Arc::new(DashboardState::with_auth(config, store, auth));
        Ok(Arc::new(Self { home, sources }))
    }
}

impl Slot {
    fn state(&self) -> Option<Arc<DashboardState>> {
        self.current().ok()
    }

    /// Its dashboard's state, or why it has none yet.
    fn current(&self) -> Result<Arc<DashboardState>, String> {
        match &*self.served.read().expect("slot lock") {
            Served::Ready(state, _) => Ok(state.clone()),
            Served::Waiting(why) => Err(why.clone()),
        }
    }

    /// Connects this source's store; true once it has one.
    async fn try_connect(&self) -> bool {
        let connected = tokio::time::timeout(
            self.config.database.connect_timeout + SOURCE_WITHIN,
            Store::connect(
                &crate::store::StoreSettings::from_config(&self.config),
                "outboxd ui",
            ),
        )
        .await;
        let store = match connected {
            Ok(Ok(store)) => store,
            Ok(Err(e)) => return self.waiting(format!("database: {e}")),
            Err(_) => return self.waiting("database: no answer".into()),
        };
        // A database without this binary's schema has nothing to show
        // (and its workers refuse it): say so, as they do.
        let checked = tokio::time::timeout(SOURCE_WITHIN, schema::check_version(&*store)).await;
        let unready = match checked {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!(
                "database: {e} (this source: `outboxd migrate --source {}`)",
                self.name
            )),
            Err(_) => Some("database: no answer".into()),
        };
        if let Some(why) = unready {
            store.close().await;
            return self.waiting(why);
        }
        let state = Arc::new(DashboardState {
            path: self.path.clone(),
            home: self.home.clone(),
            ..DashboardState::with_auth(&self.config, store, self.auth.clone())
        });
        let router = pages(state.clone());
        *self.served.write().expect("slot lock") = Served::Ready(state, router);
        tracing::info!(source = %self.name, "dashboard: source connected");
        true
    }

    /// The read of this source's summary in flight, or a new one if none
    /// is (see the module docs).
    fn read(&self, st: &Arc<DashboardState>) -> Read {
        let mut reading = self.reading.lock().expect("slot lock");
        if let Some(read) = reading.as_ref().filter(|r| r.peek().is_none()) {
            return read.clone();
        }
        let st = st.clone();
        let task = tokio::spawn(async move {
            api::load_summary(&st.store, st.partition_count)
                .await
                .map(Arc::new)
                .map_err(|e| format!("database: {e}"))
        });
        let read = async move {
            task.await
                .unwrap_or_else(|e| Err(format!("reading it failed: {e}")))
        }
        .boxed()
        .shared();
        *reading = Some(read.clone());
        read
    }

    fn waiting(&self, why: String) -> bool {
        let mut served = self.served.write().expect("slot lock");
        if !matches!(&*served, Served::Waiting(w) if *w == why) {
            tracing::warn!(source = %self.name, error = %why, "dashboard: cannot reach the source; retrying");
        }
        *served = Served::Waiting(why);
        false
    }

    /// A request under `<path>/s/<name>`: its dashboard, or 503 and why.
    async fn route(self: Arc<Self>, req: Request) -> Response {
        let router = match &*self.served.read().expect("slot lock") {
            Served::Ready(_, router) => Ok(router.clone()),
            Served::Waiting(why) => Err(why.clone()),
        };
        match router {
            Ok(router) => router.oneshot(req).await.into_response(),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("source {}: {why}\n", self.name),
            )
                .into_response(),
        }
    }
}

/// One source's row in the overview.
#[derive(Debug, Default, Serialize)]
pub struct SourceHealth {
    pub name: String,
    /// Its own dashboard, `<path>/s/<name>/`.
    pub href: String,
    pub healthy: bool,
    /// Why it is not healthy (one line).
    pub error: Option<String>,
    pub workers_live: usize,
    pub pending: i64,
    pub pending_capped: bool,
    pub max_lag_seconds: f64,
    pub blocked_buckets: usize,
    pub parked: i64,
    pub published_last_60s: i64,
}

/// The routes for several sources (see the module docs).
pub fn router(all: Arc<Sources>) -> Router {
    let home = all.home.clone();
    let p = home.path.clone();
    let mut router = Router::new()
        .route("/", super::to_home(&p))
        .route("/healthz", get(healthz))
        .route("/metrics", get(all_metrics))
        .route(&format!("{p}/"), get(overview))
        .route(
            &format!("{p}/api/sources"),
            get(health_of_all).layer(super::uncached_layer()),
        )
        .route(
            &format!("{p}/sources.js"),
            get(|| async { asset("text/javascript; charset=utf-8", SOURCES_JS) }),
        )
        .with_state(all.clone());
    let shared = Router::new()
        .route(
            &format!("{p}/style.css"),
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route(&format!("{p}/favicon.svg"), get(super::favicon))
        .route("/favicon.ico", get(super::favicon))
        .route(&format!("{p}/login"), get(login_page).post(login))
        .route(&format!("{p}/logout"), post(logout))
        .with_state(home.clone());
    router = router.merge(shared);
    for slot in &all.sources {
        let to = |slot: &Arc<Slot>| {
            let slot = slot.clone();
            any(move |req: Request| slot.clone().route(req))
        };
        router = router
            .route(&slot.path, to(slot))
            .route(&format!("{}/", slot.path), to(slot))
            .route(&format!("{}/{{*rest}}", slot.path), to(slot));
    }
    super::guarded(router, home)
}

async fn overview(State(all): State<Arc<Sources>>) -> Html<String> {
    let home = &all.home;
    Html(SOURCES_HTML.replace("{{BASE}}", &home.path).replace(
        "{{AUTH}}",
        if home.auth.is_some() { "token" } else { "open" },
    ))
}

async fn health_of_all(State(all): State<Arc<Sources>>) -> Json<Vec<SourceHealth>> {
    let rows = all.sources.iter().map(|slot| health_of(slot));
    Json(futures_util::future::join_all(rows).await)
}

/// One source's row: its summary, or why it could not be read.
async fn health_of(slot: &Slot) -> SourceHealth {
    let mut row = SourceHealth {
        name: slot.name.clone(),
        href: format!("{}/", slot.path),
        ..SourceHealth::default()
    };
    let st = match slot.current() {
        Ok(st) => st,
        Err(why) => {
            row.error = Some(why);
            return row;
        }
    };
    match tokio::time::timeout(SOURCE_WITHIN, slot.read(&st)).await {
        Ok(Ok(s)) => {
            let t = &s.totals;
            row.healthy = true;
            row.workers_live = t.workers_live;
            row.pending = t.pending;
            row.pending_capped = t.pending_capped;
            row.max_lag_seconds = t.max_lag_seconds;
            row.blocked_buckets = t.blocked_buckets;
            row.parked = t.parked;
            row.published_last_60s = s.throughput.published_last_60s;
        }
        Ok(Err(why)) => row.error = Some(why),
        Err(_) => {
            row.error = Some(format!(
                "database: no answer within {}",
                crate::config::fmt_duration(SOURCE_WITHIN)
            ))
        }
    }
    row
}

/// 200 while this process serves; a line per source says whether its
/// database answers (503 only when none does), and why not to a caller who
/// may see details ([`super::auth::may_see_details`]); others get the
/// status and each source's `ok` or `unreachable`.
async fn healthz(
    State(all): State<Arc<Sources>>,
    headers: axum::http::HeaderMap,
    extensions: axum::http::Extensions,
) -> Response {
    let client = super::auth::client_in(&extensions);
    let details = super::auth::may_see_details(&all.home, &headers, client);
    let pings = all.sources.iter().map(|slot| async move {
        let name = &slot.name;
        let st = match slot.current() {
            Ok(st) => st,
            Err(why) => return (false, format!("{name}: {why}")),
        };
        let store = st.store.clone();
        match super::within(SOURCE_WITHIN, async move { store.ping().await }).await {
            Some(Ok(())) => (true, format!("{name}: ok")),
            Some(Err(e)) => (false, format!("{name}: database unreachable: {e}")),
            None => (false, format!("{name}: database unreachable: no answer")),
        }
    });
    let pinged = futures_util::future::join_all(pings).await;
    let line = |(up, l): &(bool, String)| match (details, up) {
        (true, _) | (false, true) => format!("{l}\n"),
        (false, false) => format!("{}: unreachable\n", l.split(':').next().unwrap_or_default()),
    };
    let lines: String = pinged.iter().map(line).collect();
    if pinged.iter().any(|(up, _)| *up) {
        format!("ok\n{lines}").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, lines).into_response()
    }
}

async fn all_metrics(State(all): State<Arc<Sources>>) -> Response {
    let parts = all.sources.iter().map(|slot| async move {
        let text = match slot.state() {
            Some(st) => metrics::render(&st).await,
            None => metrics::unreached(),
        };
        (slot.name.clone(), text)
    });
    let parts: Vec<(String, String)> = futures_util::future::join_all(parts).await;
    metrics::text(metrics::labelled(&parts, "source"))
}
