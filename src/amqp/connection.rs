//! The broker connection: [`Broker`] opens one connection lazily, to the
//! first node of a cluster that answers (the one that worked last first),
//! reopens it with exponential backoff after it is lost, moves to another
//! node when its node stops confirming, and hands out confirm channels on
//! it. It watches `connection.blocked` and tracks whether the broker can be
//! reached at all ([`Reach`]). An `amqps://` node is wrapped in TLS by
//! outboxd itself, over the [`gate`]'s socket.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::ConfirmSelectOptions;
use lapin::{Connection, ConnectionProperties, Event};
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::gate;
use super::publish::{ConfirmChannel, classify};
use crate::backoff::Backoff;
use crate::config::{AmqpConfig, Redacted};
use crate::sink::PublishError;
use crate::sink::reach::{self, Reach, mark_unreachable};

/// The largest AMQP frame this client asks for, unless the URL sets its
/// own `frame_max`. lapin keeps a send and a receive buffer of 32 frames
/// per connection, zeroed when allocated: at RabbitMQ's default 128 KiB
/// that was 8 MiB per connection — most of what a source cost a worker
/// with many sources. At 16 KiB they are 1 MiB; a body longer than a frame is
/// sent as several body frames, 8 bytes of framing each.
pub const FRAME_MAX: u32 = 16 * 1024;

/// A hint for a connection the server cut before it answered, without a
/// word: RabbitMQ does that to a plain client on a TLS port, and (with TLS
/// 1.3, racing its alert) to a TLS client whose certificate it refused.
fn cut_hint(url: &str, has_client_cert: bool, error: &lapin::Error) -> &'static str {
    let text = error.to_string().to_lowercase();
    let cut = text.contains("reset by peer")
        || text.contains("unexpected eof")
        || text.contains("closed");
    match (cut, url.starts_with("amqps://"), has_client_cert) {
        (false, ..) => "",
        (true, false, _) => " (if this port speaks TLS, use an amqps:// URL)",
        (true, true, false) => {
            " (the server cut the TLS connection: if it requires a client certificate, set amqp.tls.cert_file and amqp.tls.key_file)"
        }
        (true, true, true) => {
            " (the server cut the TLS connection: it may have refused the client certificate in amqp.tls.cert_file)"
        }
    }
}

/// After a failed attempt to connect, how long callers are given its
/// error instead of a new attempt. Every attempt lapin fails leaves that
/// connection's internal task and state behind (lapin 4.12's I/O thread
/// returns before it stops the connection's RPC loop): with sixteen
/// drainers each retrying on their own, a worker kept about 80 failed
/// connections' state per broker restart, ~1.7 MB (the nemesis soak:
/// RSS 28 → 43 MB in thirty minutes; heaptrack: 627 connection states
/// alive at the peak). At most four attempts a second, and, after a
/// failure, a plain TCP connect first ([`Broker::port_open`]), so that a
/// broker that is down costs no AMQP connection at all.
const RETRY_AFTER: Duration = Duration::from_millis(250);

/// A broker's connection state, kept under [`Broker`]'s one lock.
#[derive(Default)]
struct Link {
    /// The current connection and its generation (one more per connect).
    current: Option<(u64, Arc<Connection>)>,
    /// When the last attempt to connect failed, and why (cleared by a
    /// connection): see [`RETRY_AFTER`].
    failed: Option<(tokio::time::Instant, String)>,
}

/// One connection to the broker, shared by every bucket of a worker.
pub struct Broker {
    urls: Vec<String>,
    /// Index in `urls` of the node to try first: the one that worked last.
    preferred: std::sync::atomic::AtomicUsize,
    name: String,
    rpc_timeout: Duration,
    connect_timeout: Duration,
    dead_peer_timeout: Duration,
    backoff_max: Duration,
    /// `amqp.tls`: CA, client certificate and key for `amqps://` nodes.
    tls: crate::tls::AmqpTls,
    /// The connection and the last failed attempt, under one lock: one
    /// caller connects at a time.
    link: Mutex<Link>,
    generations: std::sync::atomic::AtomicU64,
    /// Set by the first drainer that could not open a channel, cleared by
    /// the next that could: one warning per outage, not one per attempt.
    channel_failing: AtomicBool,
    blocked_tx: watch::Sender<Option<String>>,
    reach_tx: watch::Sender<Reach>,
    gate: Arc<gate::SendGate>,
}

impl Broker {
    pub fn new(config: &AmqpConfig, connection_name: String) -> Self {
        Self {
            urls: config.urls().map(String::from).collect(),
            preferred: Default::default(),
            name: connection_name,
            rpc_timeout: config.confirm_timeout,
            connect_timeout: config.connect_timeout,
            dead_peer_timeout: config.dead_peer_timeout,
            backoff_max: config.reconnect_backoff_max,
            tls: config.tls.client_tls(),
            link: Mutex::default(),
            generations: Default::default(),
            channel_failing: AtomicBool::new(false),
            gate: Arc::default(),
            blocked_tx: watch::channel(None).0,
            reach_tx: watch::channel(Reach::Never { error: None }).0,
        }
    }

    /// The count of socket writes that went out after a held lease's
    /// trust lapsed ([`gate::SendGate::late_writes`]).
    pub fn late_writes(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.gate.late_writes()
    }

    /// Whether the broker can be reached, as last seen.
    pub fn reach(&self) -> Reach {
        self.reach_tx.borrow().clone()
    }

    /// [`Broker::reach`] as it changes.
    pub fn watch_reach(&self) -> watch::Receiver<Reach> {
        self.reach_tx.subscribe()
    }

    fn mark_reachable(&self) {
        match reach::mark_reachable(&self.reach_tx) {
            Some(Reach::Unreachable { since, .. }) => {
                tracing::info!(after = ?since.elapsed(), "RabbitMQ reachable again")
            }
            Some(Reach::Never { error: Some(_) }) => tracing::info!("RabbitMQ reachable"),
            _ => {}
        }
    }

    fn mark_unreachable(&self, error: &str) {
        mark_unreachable(&self.reach_tx, error);
    }

    /// Keeps a connection open until cancelled: while no bucket is being
    /// drained (e.g. after the buckets were given up because the broker was
    /// unreachable), this is what notices that the broker is back.
    pub async fn keep_connected(self: Arc<Self>, cancel: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_secs(1), self.backoff_max);
        loop {
            let pause = match self.connection().await {
                Ok(_) => {
                    backoff.reset();
                    Duration::from_millis(500)
                }
                Err(_) => backoff.pause(),
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// `Some(reason)` while the broker has blocked publishing (resource alarm).
    pub fn blocked(&self) -> watch::Receiver<Option<String>> {
        self.blocked_tx.subscribe()
    }

    /// Connects once, without retrying: for start-up checks.
    pub async fn connect_once(&self) -> Result<(), PublishError> {
        self.connection().await.map(|_| ())
    }

    /// A fresh confirm channel, reconnecting with exponential backoff while
    /// the broker is unreachable. `None` only when cancelled.
    pub async fn open_channel(&self, cancel: &CancellationToken) -> Option<ConfirmChannel> {
        let mut backoff = Backoff::new(Duration::from_millis(100), self.backoff_max);
        loop {
            // Cancellation also ends an attempt in progress: a worker giving
            // its buckets up must not wait for connects to a lost broker.
            let attempt = tokio::select! {
                _ = cancel.cancelled() => return None,
                attempt = self.try_open_channel() => attempt,
            };
            match attempt {
                Ok(channel) => {
                    self.channel_failing.store(false, Ordering::Relaxed);
                    return Some(channel);
                }
                Err(e) => {
                    let delay = backoff.pause();
                    // Every drainer retries on its own: one line per outage
                    // says it, the rest go to debug.
                    if self.channel_failing.swap(true, Ordering::Relaxed) {
                        tracing::debug!(error = %e, retry_in = ?delay, "cannot open a confirm channel");
                    } else {
                        tracing::warn!(error = %e, retry_in = ?delay,
                            "cannot open a confirm channel; every drainer retries until the broker answers (further failures at debug level)");
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return None,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn try_open_channel(&self) -> Result<ConfirmChannel, PublishError> {
        let (generation, conn) = self.connection().await?;
        let opened = tokio::time::timeout(self.rpc_timeout, async {
            let channel = conn.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>(channel)
        })
        .await;
        match opened {
            Ok(Ok(channel)) => Ok(ConfirmChannel::new(
                channel,
                generation,
                self.rpc_timeout,
                self.gate.clone(),
            )),
            Ok(Err(e)) => {
                self.forget(&conn).await;
                self.mark_unreachable(&e.to_string());
                Err(PublishError::Unavailable(e.to_string()))
            }
            Err(_) => {
                self.forget(&conn).await;
                self.mark_unreachable("opening a channel timed out");
                Err(PublishError::Unavailable(
                    "opening a channel timed out".into(),
                ))
            }
        }
    }

    /// The live connection, opening one if there is none: each node in
    /// turn, starting with the one that worked last.
    async fn connection(&self) -> Result<(u64, Arc<Connection>), PublishError> {
        let mut link = self.link.lock().await;
        if let Some((generation, conn)) = link
            .current
            .as_ref()
            .filter(|(_, c)| c.status().connected())
        {
            return Ok((*generation, conn.clone()));
        }
        link.current = None;
        // The connection being replaced is gone, and its buffers with it.
        self.gate.connection_replaced();
        if let Some((at, error)) = &link.failed
            && at.elapsed() < RETRY_AFTER
        {
            return Err(PublishError::Unavailable(error.clone()));
        }
        let after_failure = link.failed.is_some();
        let first = self.preferred.load(std::sync::atomic::Ordering::Relaxed);
        let mut errors = Vec::new();
        for i in 0..self.urls.len() {
            let index = (first + i) % self.urls.len();
            match self.connect_to(&self.urls[index], after_failure).await {
                Ok(conn) => {
                    self.preferred
                        .store(index, std::sync::atomic::Ordering::Relaxed);
                    link.failed = None;
                    self.mark_reachable();
                    let conn = Arc::new(conn);
                    let generation = self
                        .generations
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    link.current = Some((generation, conn.clone()));
                    return Ok((generation, conn));
                }
                Err(e) => errors.push(e),
            }
        }
        let error = errors.join("; ");
        link.failed = Some((tokio::time::Instant::now(), error.clone()));
        self.mark_unreachable(&error);
        Err(PublishError::Unavailable(error))
    }

    /// Whether the node takes a TCP connection at all (a plain connect to
    /// `lapin_url`'s host and port, closed at once): asked before a
    /// connection after a failed one, so that a broker that is down costs
    /// no AMQP connection (see [`RETRY_AFTER`]).
    async fn port_open(&self, url: &str, lapin_url: &str) -> Result<(), String> {
        let parsed = url::Url::parse(lapin_url).map_err(|e| format!("{}: {e}", Redacted(url)))?;
        let host = parsed.host_str().unwrap_or("localhost");
        // `secure` gave an amqps:// node its port; lapin's default otherwise.
        let port = parsed.port().unwrap_or(5672);
        let connect = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port));
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!(
                "cannot connect to {}: IO error: {e}",
                Redacted(url)
            )),
            Err(_) => Err(self.timed_out(url)),
        }
    }

    fn timed_out(&self, url: &str) -> String {
        format!(
            "connecting to {} timed out after {}",
            Redacted(url),
            crate::config::fmt_duration(self.connect_timeout)
        )
    }

    async fn connect_to(&self, url: &str, after_failure: bool) -> Result<Connection, String> {
        let (lapin_url, tls) = self.secure(url)?;
        if after_failure {
            self.port_open(url, &lapin_url).await?;
        }
        let props = ConnectionProperties::default().with_connection_name(self.name.clone().into());
        let failure = tls.as_ref().map(|t| t.failure.clone());
        let runtime = async_rs::Runtime::new(gate::GatedTokio::new(
            self.gate.clone(),
            self.dead_peer_timeout,
            tls,
        ));
        let connect = Connection::connect_with_runtime(&lapin_url, props, runtime);
        let conn = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| self.timed_out(url))?
            .map_err(|e| {
                let handshake =
                    failure.and_then(|f| f.lock().unwrap_or_else(|p| p.into_inner()).take());
                match handshake {
                    Some(cause) => format!(
                        "cannot connect to {}: {}",
                        Redacted(url),
                        crate::tls::explain(crate::tls::Link::Amqp, url, &self.tls.files, &cause)
                            .unwrap_or_else(|| cause.to_string())
                    ),
                    None => format!(
                        "cannot connect to {}: {e}{}",
                        Redacted(url),
                        cut_hint(url, self.tls.has_client_cert(), &e)
                    ),
                }
            })?;
        tracing::info!(url = %Redacted(url), "connected to RabbitMQ");
        self.watch_events(&conn);
        Ok(conn)
    }

    /// The URL lapin is given, and the TLS to wrap its socket in: lapin is
    /// built without TLS, so an `amqps://` node is handed to it as
    /// `amqp://` on the same port (5671 unless given), over a socket that
    /// is TLS already — never plain. Without a password and with a client
    /// certificate, the EXTERNAL mechanism (the certificate is the login).
    fn secure(&self, url: &str) -> Result<(String, Option<gate::TlsTarget>), String> {
        let mut parsed = url::Url::parse(url).map_err(|e| format!("{}: {e}", Redacted(url)))?;
        if !parsed.query_pairs().any(|(k, _)| k == "frame_max") {
            parsed
                .query_pairs_mut()
                .append_pair("frame_max", &FRAME_MAX.to_string());
        }
        if parsed.scheme() != "amqps" {
            return Ok((parsed.to_string(), None));
        }
        let host = parsed.host_str().unwrap_or_default().to_string();
        let config = self.tls.client_config()?;
        let name = crate::tls::server_name(&host)?;
        if parsed.port().is_none() {
            let _ = parsed.set_port(Some(5671));
        }
        let _ = parsed.set_scheme("amqp");
        let external = parsed.password().is_none()
            && self.tls.has_client_cert()
            && !parsed.query_pairs().any(|(k, _)| k == "auth_mechanism");
        if external {
            parsed
                .query_pairs_mut()
                .append_pair("auth_mechanism", "external");
        }
        let target = gate::TlsTarget {
            config,
            name,
            failure: Default::default(),
        };
        Ok((parsed.to_string(), Some(target)))
    }

    /// Drops `conn` if it is still the current connection, so the next
    /// caller reconnects.
    async fn forget(&self, conn: &Arc<Connection>) {
        let mut link = self.link.lock().await;
        if link
            .current
            .as_ref()
            .is_some_and(|(_, c)| Arc::ptr_eq(c, conn))
        {
            link.current = None;
        }
    }

    /// A node that leaves publishes unconfirmed past `confirm_timeout` while
    /// the connection stays up (e.g. cut off from its cluster's majority,
    /// before the cluster noticed): with other nodes listed, the connection
    /// of `generation` is dropped and the next connect starts with the next
    /// node. Does nothing with one node, or when that connection was
    /// already replaced.
    pub async fn abandon_node(&self, generation: u64) {
        if self.urls.len() < 2 {
            return;
        }
        let mut link = self.link.lock().await;
        if link.current.as_ref().is_none_or(|(g, _)| *g != generation) {
            return;
        }
        let (_, conn) = link.current.take().expect("checked");
        let ordering = std::sync::atomic::Ordering::Relaxed;
        let node = self.preferred.load(ordering);
        self.preferred.store((node + 1) % self.urls.len(), ordering);
        tracing::warn!(url = %Redacted(&self.urls[node]), timeout = ?self.rpc_timeout,
            "this RabbitMQ node confirmed nothing in time; moving to another node");
        // Closing waits for the broker; nothing here may.
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                conn.close(
                    320,
                    "outboxd: no publisher confirms; moving to another node".into(),
                ),
            )
            .await;
        });
    }

    fn watch_events(&self, conn: &Connection) {
        let blocked = self.blocked_tx.clone();
        let reach = self.reach_tx.clone();
        let mut events = conn.events_listener();
        blocked.send_replace(None);
        let watching = async move {
            while let Some(event) = events.next().await {
                match event {
                    Event::ConnectionBlocked(reason) => {
                        tracing::warn!(%reason, "RabbitMQ blocked publishing on this connection; claiming paused");
                        blocked.send_replace(Some(reason));
                    }
                    Event::ConnectionUnblocked => {
                        tracing::info!("RabbitMQ unblocked publishing; claiming resumes");
                        blocked.send_replace(None);
                    }
                    // A channel closed by the broker (a missing exchange, a
                    // refused message) is the row's problem, reported by
                    // its bucket; the connection is fine.
                    Event::Error(e) if classify(&e).is_rows_fault() => {
                        tracing::debug!(error = %e, "RabbitMQ closed a channel");
                    }
                    Event::Error(e) => {
                        tracing::warn!(error = %e, "RabbitMQ connection lost");
                        blocked.send_replace(None);
                        mark_unreachable(&reach, &e.to_string());
                    }
                    _ => {}
                }
            }
        };
        tokio::spawn(watching.in_current_span());
    }
}
