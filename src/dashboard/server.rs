//! The HTTP(S) connections of the dashboard and the probes: what a client
//! may hold, and for how long.
//!
//! - **A cap on connections**, [`Limits::per_address`] from one address and
//!   [`Limits::total`] in all; a connection beyond either is closed at
//!   once (refused, not queued), so one client cannot use up the process's
//!   file descriptors and another address is still served.
//! - **A deadline on every request's header** ([`Limits::header_read`],
//!   hyper's `header_read_timeout`), which also bounds a kept-alive
//!   connection waiting idle for its next request; and on the TLS
//!   handshake ([`Limits::handshake`]). A client that sends half a request
//!   holds its slot for that long at most.
//! - Graceful shutdown: on `cancel` every connection finishes the request
//!   it is serving and closes.
//!
//! Hand-written around hyper's connection builder because `axum::serve`
//! has no header timeout and no connection cap, and `tower`'s limits work
//! per request, after the header has arrived — too late for a client that
//! never finishes one.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::https::ClientAddr;

/// What a client may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections in all.
    pub total: usize,
    /// Open connections from one address.
    pub per_address: usize,
    /// Longest a request's header may take to arrive, counted from the
    /// connection's start or the end of its previous response.
    pub header_read: Duration,
    /// Longest a TLS handshake may take.
    pub handshake: Duration,
}

impl Default for Limits {
    /// 512 connections (half the file limit systemd gives a service by
    /// default), 64 of them from one address; 10 s for a header or a
    /// handshake.
    fn default() -> Self {
        Self {
            total: 512,
            per_address: 64,
            header_read: Duration::from_secs(10),
            handshake: Duration::from_secs(10),
        }
    }
}

/// Serves `app` on `listener` until `cancel` fires, over TLS when `tls` is
/// set, within `limits`; returns when every connection has closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: Limits,
    cancel: CancellationToken,
) {
    let open = Arc::new(Open::default());
    let tracker = TaskTracker::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut refused_said = false;
    loop {
        let (tcp, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, most likely: wait for some to close.
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = open.take(peer.ip(), &limits) else {
            if !refused_said {
                refused_said = true;
                tracing::warn!(%peer, total = limits.total, per_address = limits.per_address, "connection refused: too many open (said once)");
            }
            drop(tcp);
            continue;
        };
        tcp.set_nodelay(true).ok();
        let app = app.clone();
        let acceptor = acceptor.clone();
        let cancel = cancel.clone();
        tracker.spawn(async move {
            let _slot = slot;
            match acceptor {
                None => connection(tcp, peer, app, limits, cancel).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(limits.handshake, acceptor.accept(tcp));
                    match handshake.await {
                        Ok(Ok(stream)) => connection(stream, peer, app, limits, cancel).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
}

/// Serves one connection's requests until it closes, times out or the
/// server stops.
async fn connection<S>(
    stream: S,
    peer: SocketAddr,
    app: Router,
    limits: Limits,
    cancel: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app = app.layer(axum::Extension(ConnectInfo(ClientAddr(peer))));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let served = tokio::select! {
        served = conn.as_mut() => served,
        _ = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "connection closed");
    }
}

/// Open connections, in all and by address.
#[derive(Default)]
struct Open {
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection's place; given back when dropped.
struct Slot {
    open: Arc<Open>,
    ip: IpAddr,
}

impl Open {
    fn take(self: &Arc<Self>, ip: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut by = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = by.values().sum();
        let mine = by.get(&ip).copied().unwrap_or(0);
        if total >= limits.total || mine >= limits.per_address {
            return None;
        }
        *by.entry(ip).or_default() += 1;
        Some(Slot {
            open: self.clone(),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut by = self
            .open
            .by_address
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = by.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_beyond_either_cap_is_refused_and_a_closed_one_frees_its_slot() {
        let open = Arc::new(Open::default());
        let limits = Limits {
            total: 3,
            per_address: 2,
            ..Limits::default()
        };
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = open.take(a, &limits).unwrap();
        let _second = open.take(a, &limits).unwrap();
        assert!(open.take(a, &limits).is_none(), "per address");
        let _third = open.take(b, &limits).unwrap();
        assert!(open.take(b, &limits).is_none(), "in all");
        drop(first);
        assert!(open.take(a, &limits).is_some());
    }
}
