//! Who may use the dashboard.
//!
//! Without `dashboard.token` every request is served (the default bind
//! address is loopback). With a token, every request except `/healthz` and
//! the login page must carry it, as `Authorization: Bearer <token>` (API
//! clients, Prometheus) or as the session cookie the login form sets
//! (browsers: HttpOnly, SameSite=Strict). Requests without it get 401; page
//! requests are sent to the login form instead.
//!
//! Actions are POST only, and a POST authenticated by cookie — or by nothing,
//! on an open dashboard — must carry the `X-Outboxd-Action` header, which a
//! cross-site form cannot send: no cross-site request forgery.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::DashboardState;

/// The header dashboard actions must carry when not sent with a Bearer token.
pub const ACTION_HEADER: &str = "x-outboxd-action";
const COOKIE: &str = "outboxd_session";
const MAX_SESSIONS: usize = 10_000;

/// The configured token and the browser sessions created from it.
pub struct Auth {
    token: String,
    sessions: Mutex<HashSet<String>>,
}

impl Auth {
    pub fn new(token: &str) -> Option<Arc<Self>> {
        (!token.is_empty()).then(|| {
            Arc::new(Self {
                token: token.to_string(),
                sessions: Mutex::new(HashSet::new()),
            })
        })
    }

    pub fn token_matches(&self, given: &str) -> bool {
        constant_time_eq(self.token.as_bytes(), given.as_bytes())
    }

    /// A new session id for a successful login.
    pub fn open_session(&self) -> String {
        let id = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let mut sessions = self.sessions.lock().expect("sessions lock");
        if sessions.len() >= MAX_SESSIONS {
            sessions.clear();
        }
        sessions.insert(id.clone());
        id
    }

    pub fn close_session(&self, id: &str) {
        self.sessions.lock().expect("sessions lock").remove(id);
    }

    fn session_valid(&self, id: &str) -> bool {
        self.sessions.lock().expect("sessions lock").contains(id)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The session cookie of a request, if any.
pub fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// `Set-Cookie` value for a session (empty id: expire it).
pub fn cookie_header(id: &str, path: &str) -> String {
    if id.is_empty() {
        format!("{COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0")
    } else {
        format!("{COOKIE}={id}; Path={path}; HttpOnly; SameSite=Strict")
    }
}

enum Caller {
    Bearer,
    Session,
    Anonymous,
}

/// The middleware in front of every route.
pub async fn guard(State(state): State<Arc<DashboardState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let login = format!("{}/login", state.path);
    // A forged logout is harmless, so the logout form needs no action header.
    let logout = format!("{}/logout", state.path);
    if path == "/healthz" || path == login || path == logout {
        return next.run(req).await;
    }
    let caller = match &state.auth {
        None => Caller::Anonymous,
        Some(auth) => {
            let bearer = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if bearer.is_some_and(|t| auth.token_matches(t.trim())) {
                Caller::Bearer
            } else if session_cookie(req.headers()).is_some_and(|s| auth.session_valid(&s)) {
                Caller::Session
            } else {
                let wants_page = req.method() == Method::GET
                    && !path.starts_with(&format!("{}/api", state.path))
                    && path != "/metrics";
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
    if unsafe_method
        && !matches!(caller, Caller::Bearer)
        && !req.headers().contains_key(ACTION_HEADER)
    {
        return (
            StatusCode::FORBIDDEN,
            format!("403 forbidden: actions need the {ACTION_HEADER} header (cross-site requests are refused)\n"),
        )
            .into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_exactly() {
        let auth = Auth::new("a-long-enough-token").unwrap();
        assert!(auth.token_matches("a-long-enough-token"));
        assert!(!auth.token_matches("a-long-enough-tokeN"));
        assert!(!auth.token_matches("a-long-enough"));
        assert!(Auth::new("").is_none());
    }

    #[test]
    fn sessions_come_and_go() {
        let auth = Auth::new("a-long-enough-token").unwrap();
        let s = auth.open_session();
        assert!(auth.session_valid(&s));
        auth.close_session(&s);
        assert!(!auth.session_valid(&s));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; outboxd_session=xyz; b=2".parse().unwrap(),
        );
        assert_eq!(session_cookie(&h).as_deref(), Some("xyz"));
    }
}
