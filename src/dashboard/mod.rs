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
//! - `GET /metrics` Prometheus text ([`metrics`]); `GET /healthz` whether
//!   this process can serve the dashboard: `ok` (200) while the database
//!   answers, 503 otherwise — with the reason only for a caller with the
//!   token, when one is set (always open);
//! - `GET /favicon.ico`, `<path>/favicon.svg` the icon (open).
//!
//! With several `[[source]]`s, `outboxd ui` serves [`sources`]: an overview
//! at `<path>/` and this dashboard per source at `<path>/s/<name>/`.
//!
//! Access control is [`auth`]; errors are [`error::ApiError`]; HTTPS on
//! the dashboard's own listener is [`https`]; connections and their limits
//! are [`server`]; the words for a worker's and a bucket's state are
//! [`states`]. Every response carries a content security policy (no inline
//! script or style, no framing), `nosniff` / `no-referrer`, and HSTS over
//! HTTPS (tower-http's `SetResponseHeaderLayer`); the API's answers are
//! never cached.
//!
//! What is written here rather than taken from a crate, and why: the
//! connection limits ([`server`]: `axum::serve` sets no header deadline and
//! caps nothing, and tower's limits act per request, after the header); the
//! token check and sessions ([`auth`]: a token compared in time independent
//! of its length, which `subtle` does not offer for slices of different
//! lengths; sessions are a map of random ids with an expiry — a session
//! crate would bring a store abstraction and signed cookies for what one
//! `HashMap` does; the per-address and global guess limits count wrong
//! tokens, not requests, which a request rate limiter such as `governor`
//! does not).

pub mod api;
pub mod auth;
pub mod destinations;
pub mod error;
pub mod https;
pub mod metrics;
pub mod server;
pub mod sources;
pub mod states;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use tokio_util::sync::CancellationToken;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::relay::RelayStats;
use crate::store::Store;

const INDEX_HTML: &str = include_str!("../../ui/index.html");
const LOGIN_HTML: &str = include_str!("../../ui/login.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const STYLE_CSS: &str = include_str!("../../ui/style.css");
pub(crate) const FAVICON_SVG: &str = include_str!("../../ui/favicon.svg");

/// What every handler reads.
pub struct DashboardState {
    pub store: Store,
    /// URL path prefix, e.g. `/outbox`.
    pub path: String,
    /// Where the login page is and the session cookie's path: `path`
    /// itself, or the overview's when this is one of several sources
    /// ([`sources`]).
    pub home: String,
    pub auth: Option<Arc<auth::Auth>>,
    /// The serving worker's own counters (`outboxd work --ui`).
    pub process: Option<Arc<RelayStats>>,
    pub partition_count: u32,
    /// `outbox.keep_published`.
    pub keep_published: bool,
    /// `dashboard.allowed_hosts`.
    pub allowed_hosts: Vec<String>,
    /// `dashboard.tls_cert_file` / `tls_key_file`, when HTTPS.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl DashboardState {
    /// The state for a configuration; `process` is the serving worker's
    /// counters, if it is a worker.
    pub fn new(
        config: &crate::config::Config,
        store: Store,
        process: Option<Arc<RelayStats>>,
    ) -> Arc<Self> {
        let auth = auth::Auth::new(&config.dashboard.token, config.dashboard.session_ttl);
        Arc::new(Self {
            process,
            ..Self::with_auth(config, store, auth)
        })
    }

    /// The state for a configuration whose login is `auth` (shared by the
    /// sources of one dashboard), served at `dashboard.path`.
    pub fn with_auth(
        config: &crate::config::Config,
        store: Store,
        auth: Option<Arc<auth::Auth>>,
    ) -> Self {
        Self {
            store,
            path: config.dashboard.path.clone(),
            home: config.dashboard.path.clone(),
            auth,
            process: None,
            partition_count: config.outbox.partition_count,
            keep_published: config.outbox.keep_published,
            allowed_hosts: config.dashboard.allowed_hosts.clone(),
            tls: Some((
                config.dashboard.tls_cert_file.trim(),
                config.dashboard.tls_key_file.trim(),
            ))
            .filter(|(c, k)| !c.is_empty() && !k.is_empty())
            .map(|(c, k)| (c.into(), k.into())),
        }
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
    #[error("dashboard HTTPS: {0}")]
    Tls(String),
}

/// The dashboard's routes.
pub fn router(state: Arc<DashboardState>) -> Router {
    let top = Router::new()
        .route("/", to_home(&state.path))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::metrics))
        .route("/favicon.ico", get(favicon))
        .with_state(state.clone())
        .merge(pages(state.clone()));
    guarded(top, state)
}

/// The site's root: a redirect to the dashboard at `path`.
fn to_home<S: Clone + Send + Sync + 'static>(path: &str) -> axum::routing::MethodRouter<S> {
    let home = format!("{path}/");
    get(move || {
        let home = home.clone();
        async move { Redirect::to(&home) }
    })
}

/// One database's dashboard under its `path`: the page, its assets, the
/// login and the JSON API.
fn pages(state: Arc<DashboardState>) -> Router {
    let api = Router::new()
        .route("/summary", get(api::summary))
        .route("/workers", get(api::workers))
        .route("/partitions", get(api::partitions))
        .route("/throughput", get(api::throughput))
        .route("/messages", get(api::messages))
        .route("/messages/{id}", get(api::message))
        .route("/lease-events", get(api::lease_events))
        .route("/requeue", post(api::requeue))
        .route("/head", post(api::head));
    let api = api.layer(uncached_layer());
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
        .route("/favicon.svg", get(favicon))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .nest("/api", api);
    // Nested, "/" answers `<path>` itself; `<path>/` is routed explicitly.
    Router::new()
        .route(&format!("{}/", state.path), get(index))
        .nest(&state.path, pages)
        .with_state(state)
}

/// `router` behind the access control of `home` (its token and session
/// cookie).
fn guarded(router: Router, home: Arc<DashboardState>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(home, auth::guard))
}

/// The page's content security policy: its own script and style only (no
/// inline script or style attribute), no framing by any other page.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'self'";

/// Headers on every response, refusals included (the host check's too):
/// the CSP and the framing ban (clickjacking), no content sniffing, no
/// referrer, and over HTTPS, HSTS.
fn with_security_headers(app: Router, https: bool) -> Router {
    let set =
        |name, value| SetResponseHeaderLayer::overriding(name, HeaderValue::from_static(value));
    let app = app
        .layer(set(
            header::CONTENT_SECURITY_POLICY,
            CONTENT_SECURITY_POLICY,
        ))
        .layer(set(header::X_FRAME_OPTIONS, "DENY"))
        .layer(set(header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .layer(set(header::REFERRER_POLICY, "no-referrer"));
    if https {
        app.layer(set(header::STRICT_TRANSPORT_SECURITY, "max-age=31536000"))
    } else {
        app
    }
}

/// The API's answers are never cached.
pub(crate) fn uncached_layer() -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::overriding(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))
}

/// How long `/healthz` waits for the database.
const HEALTHZ_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// `read`'s answer if it comes within `limit`, `None` if not — the read
/// goes on regardless, on its own task. Stopping a database read part-way
/// drops the connection it was opening or using; on a loaded machine, where
/// opening one takes longer than the limit, a read stopped at every poll
/// never got a connection, and every source said "no answer" for as long as
/// the load lasted. Left to finish, it leaves its connections in the pool
/// and the next poll is answered. (The read itself is bounded by the
/// store's own timeouts.)
pub async fn within<T: Send + 'static>(
    limit: std::time::Duration,
    read: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    let task = tokio::spawn(read);
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(answer)) => Some(answer),
        // The read panicked: as good as no answer (the panic is logged).
        Ok(Err(_)) | Err(_) => None,
    }
}

/// `ok` (200) while the database answers, 503 when not; why not (the
/// driver's error, which names the database's user and host) only to a
/// caller who may see details ([`auth::may_see_details`]).
async fn healthz(
    State(st): State<Arc<DashboardState>>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
) -> Response {
    let store = st.store.clone();
    let reason = match within(HEALTHZ_WITHIN, async move { store.ping().await }).await {
        Some(Ok(())) => return "ok\n".into_response(),
        Some(Err(e)) => e.to_string(),
        None => format!(
            "no answer within {}",
            crate::config::fmt_duration(HEALTHZ_WITHIN)
        ),
    };
    let body = if auth::may_see_details(&st, &headers, auth::client_in(&extensions)) {
        format!("database unreachable: {reason}\n")
    } else {
        "database unreachable\n".to_string()
    };
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

/// The icon, at `/favicon.ico` (where browsers look) and `<path>/favicon.svg`.
pub(crate) async fn favicon() -> Response {
    asset("image/svg+xml", FAVICON_SVG)
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
            .replace("{{HOME}}", &st.home)
            .replace("{{AUTH}}", if st.auth.is_some() { "token" } else { "open" }),
    )
}

async fn login_page(State(st): State<Arc<DashboardState>>) -> Response {
    if st.auth.is_none() {
        return Redirect::to(&format!("{}/", st.home)).into_response();
    }
    Html(
        LOGIN_HTML
            .replace("{{BASE}}", &st.home)
            .replace("{{ERROR}}", ""),
    )
    .into_response()
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(st): State<Arc<DashboardState>>,
    extensions: axum::http::Extensions,
    Form(form): Form<LoginForm>,
) -> Response {
    let Some(auth) = &st.auth else {
        return Redirect::to(&format!("{}/", st.home)).into_response();
    };
    let client = auth::client_in(&extensions);
    let right = match auth::check_login(auth, client, form.token.trim()) {
        Ok(right) => right,
        Err(refused) => return *refused,
    };
    if !right {
        let page = LOGIN_HTML.replace("{{BASE}}", &st.home).replace(
            "{{ERROR}}",
            "<p class=\"error\">That token is not right.</p>",
        );
        return (StatusCode::UNAUTHORIZED, Html(page)).into_response();
    }
    let (session, key) = auth.open_session();
    tracing::info!(client = %client.map(|c| c.to_string()).unwrap_or_default(), "dashboard login");
    (
        StatusCode::SEE_OTHER,
        [
            (
                header::SET_COOKIE,
                auth::cookie_header(&session, &st.home, st.tls.is_some()),
            ),
            // The key in the fragment: the page keeps it, no request carries it.
            (header::LOCATION, format!("{}/#k={key}", st.home)),
        ],
    )
        .into_response()
}

async fn logout(State(st): State<Arc<DashboardState>>, headers: HeaderMap) -> Response {
    if let Some(auth) = &st.auth {
        for s in auth::session_cookies(&headers, st.tls.is_some()) {
            auth.close_session(&s);
        }
    }
    (
        StatusCode::SEE_OTHER,
        [
            (
                header::SET_COOKIE,
                auth::cookie_header("", &st.home, st.tls.is_some()),
            ),
            (header::LOCATION, format!("{}/login", st.home)),
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

/// Serves on `listener` until `cancel` fires: HTTPS when the state names a
/// certificate, HTTP otherwise; requests for other hosts refused
/// ([`auth::host_guard`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<DashboardState>,
    cancel: CancellationToken,
) -> Result<(), DashboardError> {
    serve_router(listener, router(state.clone()), &state, cancel).await
}

/// Serves `app` as [`serve`] does, with `state`'s HTTPS, host rule and
/// path (the overview's, for several sources).
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    state: &DashboardState,
    cancel: CancellationToken,
) -> Result<(), DashboardError> {
    let local = listener.local_addr().map_err(DashboardError::Serve)?;
    let scheme = if state.tls.is_some() { "https" } else { "http" };
    tracing::info!(url = %format!("{scheme}://{local}{}/", state.path), auth = state.auth.is_some(), "dashboard listening");
    if !local.ip().is_loopback() && state.auth.is_none() {
        tracing::warn!(%local, "the dashboard is reachable from other hosts without a token; set dashboard.token");
    }
    let hosts = Arc::new(auth::HostRule::new(local.ip(), &state.allowed_hosts));
    let tls = match &state.tls {
        None => None,
        Some((cert, key)) => Some(https::server_config(cert, key).map_err(DashboardError::Tls)?),
    };
    let app = app.layer(axum::middleware::from_fn_with_state(
        hosts,
        auth::host_guard,
    ));
    // Outside the host guard, so that its refusals carry them too.
    let app = with_security_headers(app, tls.is_some());
    server::serve(listener, app, tls, server::Limits::default(), cancel).await;
    Ok(())
}
