//! Who may use the dashboard.
//!
//! Without `dashboard.token` every request is served (the default bind
//! address is loopback). With a token, every request except `/healthz`, the
//! stylesheet and the login page must carry it, as `Authorization: Bearer <token>` (API
//! clients, Prometheus) or as the session cookie the login form sets
//! (browsers: HttpOnly, SameSite=Strict). Requests without it get 401; page
//! requests are sent to the login form instead.
//!
//! Actions are POST only, and a POST authenticated by cookie — or by nothing,
//! on an open dashboard — must carry the `X-Outboxd-Action` header (not
//! empty), which a cross-site form cannot send: no cross-site request
//! forgery.
//!
//! Sessions expire after `dashboard.session_ttl`. Guessing is bounded: after
//! [`MAX_FAILURES`] wrong tokens (login form or Bearer) from one address
//! within a minute, that address is refused until the minute has passed,
//! even with the right token; after [`MAX_FAILURES_IN_ALL`] from all
//! addresses together, every address that has not logged in recently is
//! ([`Auth::may_try`] says how that is balanced). Every wrong token is
//! logged with the address; a lock-out's refusals are logged once, at its
//! start, and counted in one line at its end.
//! The token is compared in time that does not depend on its length.
//! Handlers learn which credential was checked from the request's [`Caller`]
//! (for the audit trail), never from what else the request carries.
//!
//! [`host_guard`] refuses a request whose `Host` names a host this dashboard
//! is not (DNS rebinding): IP addresses, `localhost` and
//! `dashboard.allowed_hosts` pass.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::DashboardState;

/// The header dashboard actions must carry when not sent with a Bearer token.
pub const ACTION_HEADER: &str = "x-outboxd-action";
/// The header the page sends its session's key in.
pub const SESSION_KEY_HEADER: &str = "x-outboxd-session";
const COOKIE: &str = "outboxd_session";
const SECURE_COOKIE: &str = "__Host-outboxd_session";
const MAX_SESSIONS: usize = 10_000;
/// Wrong tokens one address may send within [`FAILURE_WINDOW`].
pub const MAX_FAILURES: usize = 10;
/// Wrong tokens all addresses together may send within [`FAILURE_WINDOW`]
/// before addresses that have not logged in recently are refused too.
pub const MAX_FAILURES_IN_ALL: usize = 30;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);
const MAX_TRACKED_CLIENTS: usize = 10_000;

/// The configured token, the browser sessions created from it, and the
/// recent wrong tokens per client address.
pub struct Auth {
    token: String,
    session_ttl: Duration,
    /// Session id → when it expires, and its key.
    sessions: Mutex<HashMap<String, (Instant, String)>>,
    /// Client address → when its recent wrong tokens came.
    failures: Mutex<HashMap<IpAddr, Vec<Instant>>>,
    /// When the recent wrong tokens of every address came.
    all_failures: Mutex<Vec<Instant>>,
    /// Addresses that presented the right token within the session's
    /// lifetime, and when they last did: the global limit spares them.
    trusted: Mutex<HashMap<IpAddr, Instant>>,
    /// Refusals not yet logged, by address: the first of a lock-out is
    /// logged, the rest counted and said once it ends.
    refused: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a token is not even compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This address sent [`MAX_FAILURES`] wrong tokens within a minute.
    Address,
    /// All addresses together sent [`MAX_FAILURES_IN_ALL`], and this one
    /// has not logged in recently.
    Everyone,
}

impl Auth {
    pub fn new(token: &str, session_ttl: Duration) -> Option<Arc<Self>> {
        (!token.is_empty()).then(|| {
            Arc::new(Self {
                token: token.to_string(),
                session_ttl,
                sessions: Mutex::new(HashMap::new()),
                failures: Mutex::new(HashMap::new()),
                all_failures: Mutex::new(Vec::new()),
                trusted: Mutex::new(HashMap::new()),
                refused: Mutex::new(HashMap::new()),
            })
        })
    }

    pub fn token_matches(&self, given: &str) -> bool {
        constant_time_eq(self.token.as_bytes(), given.as_bytes())
    }

    /// Whether `client` may present a token now: fewer than
    /// [`MAX_FAILURES`] wrong ones from it within the last minute, and
    /// fewer than [`MAX_FAILURES_IN_ALL`] from everyone unless it logged in
    /// within the session's lifetime.
    ///
    /// The balance: a guesser cannot lock the right user out for long — an
    /// address that proved the token recently is spared the global limit,
    /// sessions are never affected, and every lock-out ends a minute after
    /// the last wrong token — while guessing from many addresses (an IPv6
    /// /64) is held to 30 wrong tokens a minute in all (three addresses'
    /// worth).
    pub fn may_try(&self, client: IpAddr) -> Result<(), Refusal> {
        let refusal = {
            let mut failures = lock(&self.failures);
            let recent = failures.entry(client).or_default();
            recent.retain(|t| t.elapsed() < FAILURE_WINDOW);
            let over = recent.len() >= MAX_FAILURES;
            if recent.is_empty() {
                failures.remove(&client);
            }
            if over {
                Some(Refusal::Address)
            } else {
                let mut all = lock(&self.all_failures);
                all.retain(|t| t.elapsed() < FAILURE_WINDOW);
                let trusted = lock(&self.trusted)
                    .get(&client)
                    .is_some_and(|t| t.elapsed() < self.session_ttl);
                (all.len() >= MAX_FAILURES_IN_ALL && !trusted).then_some(Refusal::Everyone)
            }
        };
        match refusal {
            Some(r) => {
                let mut refused = lock(&self.refused);
                let n = refused.entry(client).or_default();
                *n += 1;
                if *n == 1 {
                    tracing::warn!(%client, "dashboard: {}; further refusals are counted and said when it ends", r.why());
                }
                Err(r)
            }
            None => {
                if let Some(n) = lock(&self.refused).remove(&client)
                    && n > 1
                {
                    tracing::warn!(%client, refused = n - 1, "dashboard: the lock-out ended; {} more tokens from this address were refused during it", n - 1);
                }
                Ok(())
            }
        }
    }

    /// Counts a wrong token from `client`.
    pub fn failed(&self, client: IpAddr) {
        let mut failures = lock(&self.failures);
        if failures.len() >= MAX_TRACKED_CLIENTS {
            failures.retain(|_, times| times.iter().any(|t| t.elapsed() < FAILURE_WINDOW));
        }
        failures.entry(client).or_default().push(Instant::now());
        let mut all = lock(&self.all_failures);
        all.retain(|t| t.elapsed() < FAILURE_WINDOW);
        all.push(Instant::now());
    }

    /// Remembers that `client` presented the right token.
    pub fn succeeded(&self, client: IpAddr) {
        let mut trusted = lock(&self.trusted);
        if trusted.len() >= MAX_TRACKED_CLIENTS {
            trusted.retain(|_, t| t.elapsed() < self.session_ttl);
        }
        trusted.insert(client, Instant::now());
    }

    /// A new session for a successful login: its id (the cookie) and its
    /// key, which the page gets once, in the login's redirect, and sends
    /// with every API request. A cookie alone — sent by the browser to
    /// another port of the same host, which no cookie attribute prevents
    /// on loopback — reads nothing.
    pub fn open_session(&self) -> (String, String) {
        let random = || {
            format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            )
        };
        let (id, key) = (random(), random());
        let mut sessions = lock(&self.sessions);
        if sessions.len() >= MAX_SESSIONS {
            let now = Instant::now();
            sessions.retain(|_, (expires, _)| *expires > now);
            if sessions.len() >= MAX_SESSIONS {
                sessions.clear();
            }
        }
        sessions.insert(id.clone(), (Instant::now() + self.session_ttl, key.clone()));
        (id, key)
    }

    pub fn close_session(&self, id: &str) {
        lock(&self.sessions).remove(id);
    }

    /// The key of `id` when it is a session that has not expired (an
    /// expired one is forgotten).
    fn session_key(&self, id: &str) -> Option<String> {
        let mut sessions = lock(&self.sessions);
        match sessions.get(id) {
            Some((expires, key)) if *expires > Instant::now() => Some(key.clone()),
            Some(_) => {
                sessions.remove(id);
                None
            }
            None => None,
        }
    }

    /// Whether `id` is a session that has not expired.
    fn session_valid(&self, id: &str) -> bool {
        self.session_key(id).is_some()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave the maps inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Equal or not, in a time that depends only on the length of `given` (the
/// caller's own input), never on the secret's length or content.
fn constant_time_eq(secret: &[u8], given: &[u8]) -> bool {
    if secret.is_empty() {
        return given.is_empty();
    }
    let mut diff = secret.len() ^ given.len();
    for (i, g) in given.iter().enumerate() {
        diff |= usize::from(secret[i % secret.len()] ^ g);
    }
    diff == 0
}

/// The client's address, when the server recorded it.
pub fn client_of(req: &Request) -> Option<IpAddr> {
    client_in(req.extensions())
}

/// [`client_of`], from a request's extensions.
pub fn client_in(extensions: &axum::http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<ConnectInfo<super::https::ClientAddr>>()
        .map(|ConnectInfo(client)| client.0.ip())
}

/// The session cookies of a request: every value of the session's name,
/// so that a cookie another page set under a narrower path (sent first)
/// cannot hide the real one.
pub fn session_cookies(headers: &HeaderMap, secure: bool) -> Vec<String> {
    let name = cookie_name(secure);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
        .collect()
}

/// The session cookie's name: over HTTPS with the `__Host-` prefix, which
/// a browser accepts only from a secure page, for the whole host, without
/// a domain — a plain-HTTP page on the same host can neither set nor
/// shadow it.
fn cookie_name(secure: bool) -> &'static str {
    if secure { SECURE_COOKIE } else { COOKIE }
}

/// `Set-Cookie` value for a session (empty id: expire it); `secure` when
/// the dashboard is served over HTTPS (`__Host-`, `Secure`, `Path=/`).
pub fn cookie_header(id: &str, path: &str, secure: bool) -> String {
    let expire = if id.is_empty() { "; Max-Age=0" } else { "" };
    if secure {
        format!("{SECURE_COOKIE}={id}; Path=/; Secure; HttpOnly; SameSite=Strict{expire}")
    } else {
        format!("{COOKIE}={id}; Path={path}; HttpOnly; SameSite=Strict{expire}")
    }
}

/// Which credential the guard checked for a request (a request extension,
/// for the audit trail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Bearer,
    Session,
    /// No token is configured.
    Anonymous,
}

impl Caller {
    /// How the audit trail names the caller.
    pub fn actor(self) -> &'static str {
        match self {
            Caller::Bearer => "dashboard API (bearer token)",
            Caller::Session => "dashboard session",
            Caller::Anonymous => "dashboard (no token configured)",
        }
    }
}

impl Refusal {
    fn why(self) -> String {
        match self {
            Refusal::Address => format!(
                "refused a token from an address that sent {MAX_FAILURES} wrong ones within a minute"
            ),
            Refusal::Everyone => format!(
                "refused a token: {MAX_FAILURES_IN_ALL} wrong ones came from all addresses within a minute, and this one has not logged in recently"
            ),
        }
    }
}

fn too_many_attempts(refusal: Refusal) -> Response {
    let text = match refusal {
        Refusal::Address => format!(
            "429 too many attempts: {MAX_FAILURES} wrong tokens from this address within a minute; try again later\n"
        ),
        Refusal::Everyone => "429 too many attempts: too many wrong tokens from all addresses within a minute; try again later\n".to_string(),
    };
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, "60")],
        text,
    )
        .into_response()
}

/// Checks the login form's token for `client`: `Err` is the answer when
/// the address is over its limit.
pub fn check_login(
    auth: &Auth,
    client: Option<IpAddr>,
    token: &str,
) -> Result<bool, Box<Response>> {
    if let Some(c) = client
        && let Err(refusal) = auth.may_try(c)
    {
        return Err(Box::new(too_many_attempts(refusal)));
    }
    if auth.token_matches(token) {
        if let Some(c) = client {
            auth.succeeded(c);
        }
        return Ok(true);
    }
    if let Some(c) = client {
        auth.failed(c);
    }
    tracing::warn!(client = %client.map(|c| c.to_string()).unwrap_or_default(),
        "dashboard login with a wrong token");
    Ok(false)
}

/// Whether a request to an open route (`/healthz`) may see details: no
/// token is configured, or it carries the token or a session. A wrong
/// Bearer token counts against its address as anywhere else.
pub fn may_see_details(
    state: &DashboardState,
    req_headers: &HeaderMap,
    client: Option<IpAddr>,
) -> bool {
    let Some(auth) = &state.auth else {
        return true;
    };
    if client.is_some_and(|c| auth.may_try(c).is_err()) {
        return false;
    }
    let bearer = req_headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match bearer {
        Some(t) if auth.token_matches(t.trim()) => true,
        Some(_) => {
            if let Some(c) = client {
                auth.failed(c);
            }
            false
        }
        None => session_cookies(req_headers, state.tls.is_some())
            .iter()
            .any(|s| auth.session_valid(s)),
    }
}

/// The middleware in front of every route.
pub async fn guard(State(state): State<Arc<DashboardState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let login = format!("{}/login", state.home);
    // A forged logout is harmless, so the logout form needs no action header.
    let logout = format!("{}/logout", state.home);
    // The login page's own stylesheet (static, holds nothing).
    let style = format!("{}/style.css", state.home);
    let icon = format!("{}/favicon.svg", state.home);
    if path == "/healthz"
        || path == login
        || path == logout
        || path == style
        || path == icon
        || path == "/favicon.ico"
    {
        return next.run(req).await;
    }
    let mut session_keys = Vec::new();
    let caller = match &state.auth {
        None => Caller::Anonymous,
        Some(auth) => {
            let client = client_of(&req);
            let bearer = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if bearer.is_some()
                && let Some(Err(refusal)) = client.map(|c| auth.may_try(c))
            {
                return too_many_attempts(refusal);
            }
            if bearer.is_some_and(|t| auth.token_matches(t.trim())) {
                if let Some(c) = client {
                    auth.succeeded(c);
                }
                Caller::Bearer
            } else if let Some(keys) = Some(
                session_cookies(req.headers(), state.tls.is_some())
                    .iter()
                    .filter_map(|s| auth.session_key(s))
                    .collect::<Vec<_>>(),
            )
            .filter(|keys| !keys.is_empty())
            {
                session_keys = keys;
                Caller::Session
            } else {
                if bearer.is_some() {
                    if let Some(c) = client {
                        auth.failed(c);
                    }
                    tracing::warn!(client = %client.map(|c| c.to_string()).unwrap_or_default(),
                        %path, "dashboard request with a wrong Bearer token");
                }
                let wants_page =
                    req.method() == Method::GET && !path.contains("/api/") && path != "/metrics";
                if wants_page {
                    return Redirect::to(&login).into_response();
                }
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "401 unauthorized: a dashboard token is required\n",
                )
                    .into_response();
            }
        }
    };
    let unsafe_method = !matches!(*req.method(), Method::GET | Method::HEAD);
    let action_header = req
        .headers()
        .get(ACTION_HEADER)
        .is_some_and(|v| !v.as_bytes().iter().all(u8::is_ascii_whitespace));
    if unsafe_method && !matches!(caller, Caller::Bearer) && !action_header {
        return (
            StatusCode::FORBIDDEN,
            format!("403 forbidden: actions need the {ACTION_HEADER} header (cross-site requests are refused)\n"),
        )
            .into_response();
    }
    // Data read with a session needs its key too (see `open_session`).
    let reads_data = path.contains("/api/") || path == "/metrics";
    let key = req
        .headers()
        .get(SESSION_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if caller == Caller::Session
        && reads_data
        && !session_keys
            .iter()
            .any(|k| constant_time_eq(k.as_bytes(), key.as_bytes()))
    {
        return (
            StatusCode::UNAUTHORIZED,
            format!("401 unauthorized: this session's key is missing ({SESSION_KEY_HEADER}); log in again\n"),
        )
            .into_response();
    }
    let mut req = req;
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// The hosts a dashboard answers to: see [`host_guard`].
pub struct HostRule {
    /// The address it listens on.
    listen: IpAddr,
    /// `dashboard.allowed_hosts`, lower-case.
    names: Vec<String>,
}

impl HostRule {
    pub fn new(listen: IpAddr, allowed_hosts: &[String]) -> Self {
        Self {
            listen,
            names: allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        }
    }

    /// Whether a `Host` header (with or without a port) names this
    /// dashboard: its listen address (any IP address when it listens on
    /// all of them, which a rebinding page cannot name), `localhost` when
    /// it listens on loopback or everywhere, or an allowed name.
    pub fn allows(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
        }
        .to_ascii_lowercase();
        let everywhere = self.listen.is_unspecified();
        match name.parse::<IpAddr>() {
            Ok(ip) => everywhere || ip == self.listen,
            Err(_) if name == "localhost" => everywhere || self.listen.is_loopback(),
            Err(_) => self.names.contains(&name),
        }
    }
}

/// Refuses a request whose `Host` this dashboard is not (a web page that
/// rebound its own name to the dashboard's address cannot use it). Every
/// form of a request is checked on its parsed authority: exactly one
/// `Host` header (none, as HTTP/1.0 may send, or two, is refused), no user
/// part (`host@elsewhere`), and an absolute-form target's authority too.
/// The refusal names nothing the client sent.
pub async fn host_guard(State(rule): State<Arc<HostRule>>, req: Request, next: Next) -> Response {
    let hosts = req.headers().get_all(header::HOST);
    let mut named: Vec<Option<String>> = hosts
        .iter()
        .map(|h| h.to_str().ok().map(str::to_string))
        .collect();
    let one_host = named.len() == 1;
    if let Some(target) = req.uri().authority() {
        named.push(Some(target.to_string()));
    }
    let allowed = one_host
        && named.iter().all(|name| {
            name.as_deref()
                .and_then(|n| n.parse::<axum::http::uri::Authority>().ok())
                .is_some_and(|a| !a.as_str().contains('@') && rule.allows(a.host()))
        });
    if allowed {
        return next.run(req).await;
    }
    (
        StatusCode::MISDIRECTED_REQUEST,
        "421 misdirected request: this dashboard does not answer to that host (add it to dashboard.allowed_hosts)\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn tokens_compare_exactly() {
        let auth = Auth::new("a-long-enough-token", HOUR).unwrap();
        assert!(auth.token_matches("a-long-enough-token"));
        assert!(!auth.token_matches("a-long-enough-tokeN"));
        assert!(!auth.token_matches("a-long-enough"));
        assert!(!auth.token_matches("a-long-enough-tokena-long-enough-token"));
        assert!(!auth.token_matches(""));
        assert!(Auth::new("", HOUR).is_none());
    }

    #[test]
    fn sessions_come_go_and_expire() {
        let auth = Auth::new("a-long-enough-token", HOUR).unwrap();
        let (s, _) = auth.open_session();
        assert!(auth.session_valid(&s));
        auth.close_session(&s);
        assert!(!auth.session_valid(&s));
        let short = Auth::new("a-long-enough-token", Duration::from_millis(1)).unwrap();
        let (s, _) = short.open_session();
        std::thread::sleep(Duration::from_millis(5));
        assert!(!short.session_valid(&s));
    }

    #[test]
    fn an_address_is_refused_after_ten_wrong_tokens_in_a_minute() {
        let auth = Auth::new("a-long-enough-token", HOUR).unwrap();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..MAX_FAILURES {
            assert!(auth.may_try(a).is_ok());
            auth.failed(a);
        }
        assert_eq!(auth.may_try(a), Err(Refusal::Address));
        assert!(auth.may_try(b).is_ok());
    }

    #[test]
    fn many_addresses_together_are_limited_but_a_recent_login_is_spared() {
        let auth = Auth::new("a-long-enough-token", HOUR).unwrap();
        let known: IpAddr = "10.0.0.200".parse().unwrap();
        auth.succeeded(known);
        for i in 0..MAX_FAILURES_IN_ALL {
            let guesser = IpAddr::from([10, 1, (i / 9) as u8, (i % 9) as u8]);
            assert!(auth.may_try(guesser).is_ok(), "guess {i}");
            auth.failed(guesser);
        }
        let fresh: IpAddr = "10.2.0.1".parse().unwrap();
        assert_eq!(auth.may_try(fresh), Err(Refusal::Everyone));
        assert!(auth.may_try(known).is_ok(), "a recent login is spared");
    }

    #[test]
    fn hosts_are_the_listen_address_localhost_or_allowed_names() {
        let loopback = HostRule::new("127.0.0.1".parse().unwrap(), &["ops.example".into()]);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "ops.example",
            "ops.example:443",
        ] {
            assert!(loopback.allows(ok), "{ok}");
        }
        for refused in [
            "evil.example:8080",
            "10.0.0.1:8080",
            "127.0.0.1.evil.example",
            "[::1]:8080",
        ] {
            assert!(!loopback.allows(refused), "{refused}");
        }
        let everywhere = HostRule::new("0.0.0.0".parse().unwrap(), &[]);
        assert!(everywhere.allows("10.1.2.3:8080") && everywhere.allows("[fe80::1]:8080"));
        assert!(!everywhere.allows("rebound.example:8080"));
    }

    #[test]
    fn every_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        // A narrower path's cookie comes first: both are candidates.
        h.insert(
            header::COOKIE,
            "a=1; outboxd_session=junk; outboxd_session=xyz; __Host-outboxd_session=s; b=2"
                .parse()
                .unwrap(),
        );
        assert_eq!(session_cookies(&h, false), ["junk", "xyz"]);
        assert_eq!(session_cookies(&h, true), ["s"]);
        assert!(
            cookie_header("s", "/outbox", true)
                .starts_with("__Host-outboxd_session=s; Path=/; Secure;")
        );
    }
}
