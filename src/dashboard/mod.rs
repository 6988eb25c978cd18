//! The web dashboard: pages, JSON API, Prometheus metrics, liveness.
//!
//! Served by `outboxd ui` and by `outboxd work --ui ADDR`. Everything it
//! shows is read from the database, so any process shows the whole fleet.
//! The HTML, CSS and JavaScript in `ui/` are compiled into the binary: one
//! file to deploy, no CDN, works offline.
//!
//! Routes (`<path>` defaults to `/outbox`):
//!
//! - `GET <path>/` the page (it polls `api/summary` every 2 seconds);
//!   `<path>/app.js`, `<path>/style.css` its assets;
//! - `GET|POST <path>/login`, `POST <path>/logout` (only with a token);
//! - `<path>/api/…` the JSON API ([`api`]);
//! - `GET /metrics` Prometheus text ([`metrics`]); `GET /healthz` liveness
//!   (always open).
//!
//! Access control is [`auth`]; errors are [`error::ApiError`].

pub mod api;
pub mod auth;
pub mod error;
pub mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use tokio_util::sync::CancellationToken;

use crate::relay::RelayStats;
use crate::store::Store;

const INDEX_HTML: &str = include_str!("../../ui/index.html");
const LOGIN_HTML: &str = include_str!("../../ui/login.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const STYLE_CSS: &str = include_str!("../../ui/style.css");

/// What every handler reads.
pub struct DashboardState {
    pub store: Store,
    /// URL path prefix, e.g. `/outbox`.
    pub path: String,
    pub auth: Option<Arc<auth::Auth>>,
    /// The serving worker's own counters (`outboxd work --ui`).
    pub process: Option<Arc<RelayStats>>,
    pub partition_count: u32,
}

impl DashboardState {
    /// The state for a configuration; `process` is the serving worker's
    /// counters, if it is a worker.
    pub fn new(
        config: &crate::config::Config,
        store: Store,
        process: Option<Arc<RelayStats>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            path: config.dashboard.path.clone(),
            auth: auth::Auth::new(&config.dashboard.token),
            process,
            partition_count: config.outbox.partition_count,
        })
    }
}

/// Why the dashboard could not be served.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("dashboard server failed: {0}")]
    Serve(std::io::Error),
}

/// The dashboard's routes.
pub fn router(state: Arc<DashboardState>) -> Router {
    let p = state.path.clone();
    let api = Router::new()
        .route("/summary", get(api::summary))
        .route("/workers", get(api::workers))
        .route("/partitions", get(api::partitions))
        .route("/throughput", get(api::throughput))
        .route("/messages", get(api::messages))
        .route("/messages/{id}", get(api::message))
        .route("/lease-events", get(api::lease_events))
        .route("/requeue", post(api::requeue));
    let pages = Router::new()
        .route("/", get(index))
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .nest("/api", api);
    // Nested, "/" answers `<path>` itself; `<path>/` is routed explicitly.
    // The site's root leads to the dashboard.
    let home = format!("{p}/");
    Router::new()
        .route(
            "/",
            get(move || {
                let home = home.clone();
                async move { Redirect::to(&home) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics::metrics))
        .route(&format!("{p}/"), get(index))
        .nest(&p, pages)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .with_state(state)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn index(State(st): State<Arc<DashboardState>>) -> Html<String> {
    Html(
        INDEX_HTML
            .replace("{{BASE}}", &st.path)
            .replace("{{AUTH}}", if st.auth.is_some() { "token" } else { "open" }),
    )
}

async fn login_page(State(st): State<Arc<DashboardState>>) -> Response {
    if st.auth.is_none() {
        return Redirect::to(&format!("{}/", st.path)).into_response();
    }
    Html(
        LOGIN_HTML
            .replace("{{BASE}}", &st.path)
            .replace("{{ERROR}}", ""),
    )
    .into_response()
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(st): State<Arc<DashboardState>>, Form(form): Form<LoginForm>) -> Response {
    let Some(auth) = &st.auth else {
        return Redirect::to(&format!("{}/", st.path)).into_response();
    };
    if !auth.token_matches(form.token.trim()) {
        tracing::warn!("dashboard login with a wrong token");
        let page = LOGIN_HTML.replace("{{BASE}}", &st.path).replace(
            "{{ERROR}}",
            "<p class=\"error\">That token is not right.</p>",
        );
        return (StatusCode::UNAUTHORIZED, Html(page)).into_response();
    }
    let session = auth.open_session();
    tracing::info!("dashboard login");
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, auth::cookie_header(&session, &st.path)),
            (header::LOCATION, format!("{}/", st.path)),
        ],
    )
        .into_response()
}

async fn logout(State(st): State<Arc<DashboardState>>, headers: HeaderMap) -> Response {
    if let (Some(auth), Some(s)) = (&st.auth, auth::session_cookie(&headers)) {
        auth.close_session(&s);
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, auth::cookie_header("", &st.path)),
            (header::LOCATION, format!("{}/login", st.path)),
        ],
    )
        .into_response()
}

/// Binds the dashboard's address (separately from serving, so a taken
/// port fails start-up).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, DashboardError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| DashboardError::Bind { addr, source })
}

/// Serves on `listener` until `cancel` fires.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<DashboardState>,
    cancel: CancellationToken,
) -> Result<(), DashboardError> {
    let local = listener.local_addr().map_err(DashboardError::Serve)?;
    tracing::info!(url = %format!("http://{local}{}/", state.path), auth = state.auth.is_some(), "dashboard listening");
    if !local.ip().is_loopback() && state.auth.is_none() {
        tracing::warn!(%local, "the dashboard is reachable from other hosts without a token; set dashboard.token");
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
        .map_err(DashboardError::Serve)
}
