//! A worker's connections to the stream port, shared by its drainers.
//!
//! Every connection goes through the same send gate as the AMQP path
//! ([`crate::amqp::gate`]): a batch publishes under its lease's trust, and a
//! process that stalls past that trust can write nothing more — the write
//! fails and the connection drops with whatever it had buffered. A
//! `rabbitmq-stream+tls://` connection is TLS above the gate, with the
//! `[amqp.tls]` files, and never falls back to plain text; every connection
//! is hardened against a silent peer like the broker's.
//!
//! A connection carries at most 256 producers; the link opens another when
//! the ones it has are nearly full, and forgets a connection that failed so
//! that the next session connects afresh. After a failed attempt it waits
//! (doubling, up to `amqp.reconnect_backoff_max`, [`crate::backoff`]) before trying again,
//! answering the failure meanwhile: a dead port costs one attempt per
//! backoff, not one per drainer.
//!
//! The link keeps its own [`Reach`]: reachable from a successful connect,
//! unreachable from the first failed one after it.
//! [`StreamLink::keep_connected`] keeps one connection open while no
//! drainer does, so that the reach stays current when the worker has
//! given its buckets up (the stream sink reports it with the AMQP link's,
//! [`crate::sink::reach`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_rs::traits::Reactor;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;
use tokio_util::compat::FuturesAsyncReadCompatExt;
use tokio_util::sync::CancellationToken;

use super::client::{StreamClient, StreamError, StreamUrl};
use crate::amqp::gate::{GatedTokio, SendGate, TlsTarget};
use crate::backoff::Backoff;
use crate::config::AmqpConfig;
use crate::sink::reach::{self, Reach};
use crate::tls::AmqpTls;

/// Producers a connection is given before the link opens another (the
/// protocol allows 256; the rest is room for a session's late producer).
const PRODUCERS_PER_CONNECTION: usize = 200;

/// The reach's error when a connection ended.
const CLOSED: &str = "the stream connection closed";

/// The first pause after a failed connection attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// The stream port, as the relay reaches it.
pub struct StreamLink {
    url: StreamUrl,
    tls: AmqpTls,
    connect_timeout: Duration,
    dead_peer_timeout: Duration,
    /// How long a request waits for its answer.
    request_timeout: Duration,
    gate: Arc<SendGate>,
    state: Mutex<State>,
    reach_tx: watch::Sender<Reach>,
}

struct State {
    clients: Vec<Arc<StreamClient>>,
    /// The last failed attempt: its error, and when the next may be made.
    failed: Option<(StreamError, Instant)>,
    /// The pauses between failed attempts; reset by a connect.
    backoff: Backoff,
}

impl StreamLink {
    /// The link `amqp.stream_url` names (checked by the configuration).
    pub fn new(config: &AmqpConfig) -> Result<Self, StreamError> {
        Ok(Self {
            url: StreamUrl::parse(config.stream_url.trim())?,
            tls: config.tls.client_tls(),
            connect_timeout: config.connect_timeout,
            dead_peer_timeout: config.dead_peer_timeout,
            request_timeout: config.confirm_timeout,
            gate: Arc::default(),
            state: Mutex::new(State {
                clients: Vec::new(),
                failed: None,
                backoff: Backoff::new(FIRST_BACKOFF, config.reconnect_backoff_max),
            }),
            reach_tx: watch::channel(Reach::Never { error: None }).0,
        })
    }

    /// The gate every connection of the link writes through.
    pub fn gate(&self) -> &Arc<SendGate> {
        &self.gate
    }

    /// How long a request or a batch's confirmations may take.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// An open connection with room for a session's producers; connects
    /// when there is none (or, during the backoff after a failure, answers
    /// that failure at once).
    pub async fn client(&self) -> Result<Arc<StreamClient>, StreamError> {
        self.client_where(|c| c.publishers() < PRODUCERS_PER_CONNECTION)
            .await
    }

    /// Whether the stream port could be reached, as last seen and as it
    /// changes.
    pub fn watch_reach(&self) -> watch::Receiver<Reach> {
        self.reach_tx.subscribe()
    }

    /// Keeps a connection open until `cancel` fires: while no drainer
    /// connects, this is what notices that the port is back (or gone).
    pub async fn keep_connected(&self, cancel: CancellationToken) {
        loop {
            // Any open connection will do; a failure backs off in `client_where`.
            let _ = self.client_where(|_| true).await;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// An open connection `fits` accepts, connecting when there is none.
    async fn client_where(
        &self,
        fits: impl Fn(&StreamClient) -> bool,
    ) -> Result<Arc<StreamClient>, StreamError> {
        let mut state = self.state.lock().await;
        let had = state.clients.len();
        state.clients.retain(|c| c.is_open());
        if had > 0 && state.clients.is_empty() {
            reach::mark_unreachable(&self.reach_tx, CLOSED);
        }
        if let Some(client) = state.clients.iter().find(|c| fits(c)) {
            return Ok(client.clone());
        }
        if let Some((error, next)) = &state.failed
            && Instant::now() < *next
        {
            return Err(error.clone());
        }
        // Holds that lingered on the connections just dropped (a batch
        // that failed with frames perhaps unsent) end with them: left, a
        // lapsed one would close the gate on the new connection's
        // handshake, and on every connection after it.
        self.gate.connection_replaced();
        match self.connect().await {
            Ok(client) => {
                state.failed = None;
                state.backoff.reset();
                if let Some(Reach::Unreachable { since, .. }) =
                    reach::mark_reachable(&self.reach_tx)
                {
                    tracing::info!(after = ?since.elapsed(), "stream port reachable again");
                }
                let client = Arc::new(client);
                state.clients.push(client.clone());
                Ok(client)
            }
            Err(e) => {
                let pause = state.backoff.pause();
                tracing::warn!(error = %e, retry_in = ?pause, "cannot reach the stream port");
                reach::mark_unreachable(&self.reach_tx, &e.to_string());
                state.failed = Some((e.clone(), Instant::now() + pause));
                Err(e)
            }
        }
    }

    /// Drops `client` (it failed, or timed out): the next session connects
    /// afresh, and whatever it had buffered dies with it. A connection
    /// that ended counts as the port lost until one connects again.
    pub async fn forget(&self, client: &Arc<StreamClient>) {
        let mut state = self.state.lock().await;
        state.clients.retain(|c| !Arc::ptr_eq(c, client));
        if !client.is_open() {
            reach::mark_unreachable(&self.reach_tx, CLOSED);
        }
    }

    /// A failed connection, explained as the AMQP link explains its own
    /// when the TLS handshake failed (an untrusted certificate, another
    /// name, a port that does not speak TLS).
    fn handshake_failed(
        &self,
        failure: Option<&std::sync::Mutex<Option<rustls::Error>>>,
        e: std::io::Error,
    ) -> StreamError {
        let url = &self.url;
        let cause = failure.and_then(|f| f.lock().unwrap_or_else(|p| p.into_inner()).take());
        let why = match cause {
            Some(cause) => {
                let shown = format!("amqps://{}:{}", url.host, url.port);
                crate::tls::explain(crate::tls::Link::Amqp, &shown, &self.tls.files, &cause)
                    .unwrap_or_else(|| cause.to_string())
            }
            None if url.tls && e.to_string().to_lowercase().contains("eof") => format!(
                "{e} (the server cut the TLS handshake: is this port a TLS stream listener, 5551, and not the plain one, 5552?)"
            ),
            None => e.to_string(),
        };
        StreamError::Io(format!("{}:{}: {why}", url.host, url.port))
    }

    async fn connect(&self) -> Result<StreamClient, StreamError> {
        let url = &self.url;
        let io = |e: std::io::Error| StreamError::Io(format!("{}:{}: {e}", url.host, url.port));
        let addr: SocketAddr = tokio::net::lookup_host((url.host.as_str(), url.port))
            .await
            .map_err(io)?
            .next()
            .ok_or_else(|| StreamError::Io(format!("{}: no address", url.host)))?;
        let tls = if url.tls {
            Some(TlsTarget {
                config: self.tls.client_config().map_err(StreamError::Url)?,
                name: crate::tls::server_name(&url.host).map_err(StreamError::Url)?,
                failure: Default::default(),
            })
        } else {
            None
        };
        let failure = tls.as_ref().map(|t| t.failure.clone());
        let kit = GatedTokio::new(self.gate.clone(), self.dead_peer_timeout, tls);
        let socket = tokio::time::timeout(self.connect_timeout, kit.tcp_connect_addr(addr))
            .await
            .map_err(|_| StreamError::Timeout(self.connect_timeout))?
            .map_err(|e| self.handshake_failed(failure.as_deref(), e))?;
        let client = StreamClient::over(Box::new(socket.compat()), url, self.connect_timeout);
        let mut client = tokio::time::timeout(self.connect_timeout, client)
            .await
            .map_err(|_| StreamError::Timeout(self.connect_timeout))??;
        client.answer_within(self.request_timeout);
        Ok(client)
    }
}
