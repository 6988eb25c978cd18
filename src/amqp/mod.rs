//! RabbitMQ: the connection, confirm channels, and publishing a batch with
//! publisher confirms — the relay's sink ([`crate::sink`]) as [`AmqpSink`].
//!
//! [`Broker`] owns one connection, opened lazily and reopened with
//! exponential backoff after it is lost (no automatic recovery inside lapin:
//! the relay must know when a channel died, to replay from its first
//! unconfirmed row). Given several node URLs (a cluster), it connects to
//! the first that answers, starting with the node that worked last, and
//! moves to another when its node is lost. It watches `connection.blocked`
//! so the relay stops claiming while the broker refuses publishes, and it
//! tracks whether the broker can be reached at all ([`Reach`]): the fleet
//! coordinator gives a worker's buckets up when it could not for longer
//! than `worker.broker_grace`. [`Broker::keep_connected`] keeps trying
//! while no bucket does, so recovery is noticed.
//!
//! [`ConfirmChannel::publish_batch`] publishes rows in order on one confirm
//! channel (persistent, `mandatory`, AMQP `message_id` = the row's
//! `message_id`), pipelining runs of rows to the same destination — their
//! frames are queued in order without waiting for each socket write — and
//! awaits the writes and the confirms in order under one deadline (lapin's
//! confirm future has no timeout of its own). It reports the length
//! of the confirmed prefix and, if the batch stopped early, why — classified
//! as the row's own fault, a timeout, or a lost broker ([`PublishError`]).
//! An ack that carries a returned message means *unroutable*: a failure.
//!
//! An `amqps://` node is reached over TLS that outboxd wraps around the
//! socket itself ([`gate::BrokerStream`], [`crate::tls`]): the server's
//! certificate and name verified against `amqp.tls.ca_file` or the system's
//! roots, an optional client certificate (with the EXTERNAL mechanism when
//! the URL has no password), the files re-read at every connect, and never
//! a fall-back to plain TCP.
//!
//! Every connection's socket writes pass a [`gate::SendGate`]: frames of a
//! batch published under a lease are never written after that lease's trust
//! deadline, even when the process stalled with them buffered.

pub mod gate;
mod sink;

pub use sink::AmqpSink;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;
use tracing::Instrument;

use futures_util::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Event,
    PublisherConfirm,
};
use serde_json::Value as Json;
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{AmqpConfig, Redacted};
use crate::sink::reach::{self, Reach, mark_unreachable};
use crate::sink::{BatchOutcome, PublishError, PublishLimits};
use crate::store::outbox::ClaimedMessage;

/// Header carrying the outbox row id.
pub const HEADER_ID: &str = "outbox-id";
/// Header carrying the bucket label.
pub const HEADER_PARTITION_KEY: &str = "outbox-partition-key";
/// Header carrying the message key.
pub const HEADER_MESSAGE_KEY: &str = "outbox-message-key";
/// Header carrying the lease epoch the message was published under (fleet
/// mode only): consumers and tests can tell which lease published what.
pub const HEADER_LEASE_EPOCH: &str = "outbox-lease-epoch";

/// Deepest nesting of JSON headers converted to AMQP tables.
const MAX_HEADER_DEPTH: usize = 16;

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
        let mut delay = Duration::from_millis(500);
        loop {
            let connected = self.connection().await.is_ok();
            delay = match connected {
                true => Duration::from_millis(500),
                false => (delay * 2).min(self.backoff_max),
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
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
        let mut delay = Duration::from_millis(100);
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
                    delay = (delay * 2).min(self.backoff_max);
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
            Ok(Ok(channel)) => Ok(ConfirmChannel {
                channel,
                generation,
                confirm_timeout: self.rpc_timeout,
                gate: self.gate.clone(),
                hold: None,
            }),
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

/// A channel in confirm mode, used by one bucket at a time.
pub struct ConfirmChannel {
    channel: Channel,
    /// The broker connection it is on ([`Broker::abandon_node`]).
    generation: u64,
    confirm_timeout: Duration,
    gate: Arc<gate::SendGate>,
    /// Held from the start of a batch under a lease until its frames are
    /// known to be written: all confirmed, or the channel closed cleanly.
    hold: Option<gate::GateHold>,
}

impl ConfirmChannel {
    /// The generation of the connection it is on.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the channel can still be used.
    pub fn is_usable(&self) -> bool {
        self.channel.status().connected()
    }

    /// Publishes `rows` in order and awaits their confirms in order.
    ///
    /// Consecutive rows to the same destination (exchange, routing key) are
    /// pipelined; before a row to another destination is sent, every row in
    /// flight must be confirmed. A row the broker returns as unroutable can
    /// therefore only have rows to the *same* destination in flight behind
    /// it, which the broker routes the same way: nothing of the bucket
    /// reaches a queue ahead of a failed head, unless the destination's
    /// routing changes during the few milliseconds that run is in flight.
    ///
    /// Sending stops at the first row that cannot be sent (too large,
    /// invalid headers). Rows already sent when an earlier confirm fails are
    /// not counted as confirmed: they are replayed after the failed row (a
    /// duplicate, never a gap).
    pub async fn publish_batch(
        &mut self,
        rows: &[ClaimedMessage],
        limits: PublishLimits,
    ) -> BatchOutcome {
        // A trust that lapsed before the batch (a slow claim) sends nothing,
        // and holding it would close the gate — drop the connection — for
        // every other bucket on it.
        if limits.trust.as_ref().is_some_and(|t| !t.is_valid()) {
            return BatchOutcome {
                confirmed: 0,
                failure: Some(PublishError::LeaseLapsed),
            };
        }
        // Until every frame of this batch is known to be written, no byte
        // goes to the socket once the lease's trust has lapsed. The hold is
        // kept after a failure: only a clean close proves the frames left.
        if let Some(trust) = limits.trust.clone()
            && let Some(earlier) = self.hold.replace(self.gate.hold(trust))
        {
            earlier.linger();
        }
        let outcome = self.publish_rows(rows, &limits).await;
        if outcome.failure.is_none() {
            self.hold = None;
        }
        outcome
    }

    async fn publish_rows(&self, rows: &[ClaimedMessage], limits: &PublishLimits) -> BatchOutcome {
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        // Each row's publish future (lapin's, over 1 KiB: beyond the
        // allocator's per-thread cache) lives in one allocation for the
        // batch rather than a box of its own.
        let mut slots: Pin<Box<[Option<_>]>> = rows.iter().map(|_| None).collect::<Box<_>>().into();
        let mut free_slots = pinned_elements(slots.as_mut());
        let mut in_flight = Vec::new();
        let mut confirmed = 0;
        let mut destination: Option<(&str, &str)> = None;
        for row in rows {
            let here = (row.exchange.as_str(), row.routing_key.as_str());
            if destination.is_some_and(|d| d != here)
                && let Err(e) = self
                    .await_confirms(&mut in_flight, &mut confirmed, deadline)
                    .await
            {
                return BatchOutcome {
                    confirmed,
                    failure: Some(e),
                };
            }
            destination = Some(here);
            let lapsed = limits
                .stop_sending_at
                .is_some_and(|stop| tokio::time::Instant::now() >= stop);
            let sent = if lapsed {
                Err(PublishError::LeaseLapsed)
            } else {
                match prepare(row, limits) {
                    Ok(prepared) => {
                        let slot = free_slots.next().expect("a slot for every row");
                        start_send(slot, self.send(prepared, &row.payload)).await
                    }
                    Err(e) => Err(e),
                }
            };
            match sent {
                Ok(confirm) => in_flight.push(confirm),
                Err(e) => {
                    // Rows before this one may still be confirmed.
                    let failure = match self
                        .await_confirms(&mut in_flight, &mut confirmed, deadline)
                        .await
                    {
                        Ok(()) => e,
                        Err(earlier) => earlier,
                    };
                    return BatchOutcome {
                        confirmed,
                        failure: Some(failure),
                    };
                }
            }
        }
        let failure = self
            .await_confirms(&mut in_flight, &mut confirmed, deadline)
            .await
            .err();
        BatchOutcome { confirmed, failure }
    }

    /// Publishes one row, `mandatory`, its frames queued when the returned
    /// future is first polled (see [`start_send`]).
    fn send<'a>(
        &'a self,
        prepared: Prepared,
        payload: &'a [u8],
    ) -> impl Future<Output = Result<PublisherConfirm, lapin::Error>> + Send + 'a {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        self.channel.basic_publish(
            prepared.exchange,
            prepared.routing_key,
            options,
            payload,
            prepared.properties,
        )
    }

    /// Awaits one of lapin's futures (a queued publish's write, a confirm)
    /// by the batch's deadline, classifying its error.
    async fn by_deadline<T>(
        &self,
        deadline: tokio::time::Instant,
        step: impl Future<Output = Result<T, lapin::Error>>,
    ) -> Result<T, PublishError> {
        match tokio::time::timeout_at(deadline, step).await {
            Err(_) => Err(PublishError::Timeout(self.confirm_timeout)),
            Ok(Err(e)) => Err(classify(&e)),
            Ok(Ok(done)) => Ok(done),
        }
    }

    /// Awaits the writes and then the confirms of `in_flight` in order,
    /// counting each success into `confirmed`; stops at the first failure.
    async fn await_confirms(
        &self,
        in_flight: &mut Vec<
            InFlight<'_, impl Future<Output = Result<PublisherConfirm, lapin::Error>>>,
        >,
        confirmed: &mut usize,
        deadline: tokio::time::Instant,
    ) -> Result<(), PublishError> {
        for sent in in_flight.drain(..) {
            let confirm = match sent {
                InFlight::Sent(confirm) => confirm,
                InFlight::Sending(publish) => self.by_deadline(deadline, publish).await?,
            };
            accepted(self.by_deadline(deadline, confirm).await?)?;
            *confirmed += 1;
        }
        Ok(())
    }

    /// Closes the channel; errors are irrelevant, it is being discarded.
    pub async fn close(mut self) {
        let closed = tokio::time::timeout(
            Duration::from_secs(1),
            self.channel.close(200, "done".into()),
        )
        .await;
        // A clean close-ok means everything sent before it was written.
        if let Some(hold) = self.hold.take()
            && !matches!(closed, Ok(Ok(())))
        {
            hold.linger();
        }
    }
}

impl Drop for ConfirmChannel {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            hold.linger();
        }
    }
}

/// A channel-level (soft) protocol error is caused by what was published —
/// a missing exchange, a refused or oversized message — so it is the row's
/// fault; anything else means the broker or the network is gone.
fn classify(e: &lapin::Error) -> PublishError {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind()
        && let AMQPErrorKind::Soft(soft) = amqp.kind()
        && matches!(
            soft,
            AMQPSoftError::NOTFOUND
                | AMQPSoftError::ACCESSREFUSED
                | AMQPSoftError::PRECONDITIONFAILED
                | AMQPSoftError::CONTENTTOOLARGE
                | AMQPSoftError::NOROUTE
        )
    {
        // The broker's reply text names the problem and the object, e.g.
        // "NOT_FOUND - no exchange 'orders' in vhost '/'".
        return PublishError::Rejected(format!("refused by the broker: {}", amqp.get_message()));
    }
    PublishError::Unavailable(e.to_string())
}

/// Whether a confirm accepted its message: an ack without a returned
/// message; anything else is a failure.
fn accepted(confirmation: Confirmation) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(PublishError::Rejected(format!(
            "unroutable: returned by the broker ({} {})",
            returned.reply_code, returned.reply_text
        ))),
        Confirmation::Nack(_) => Err(PublishError::Rejected(
            "rejected by the broker (basic.nack)".into(),
        )),
        Confirmation::NotRequested => Err(PublishError::Unavailable(
            "channel is not in confirm mode".into(),
        )),
    }
}

/// Queues one row's frames on the channel: lapin queues them (and takes
/// the row's delivery tag) when its publish future is first polled, which
/// happens here, before the next row's, so rows go out in the order they
/// are started. Waiting for the socket write is left to
/// [`ConfirmChannel::await_confirms`], so a batch costs the I/O thread one
/// wake-up, not one round trip per row.
async fn start_send<F>(
    mut slot: Pin<&mut Option<F>>,
    publish: F,
) -> Result<InFlight<'_, F>, PublishError>
where
    F: Future<Output = Result<PublisherConfirm, lapin::Error>>,
{
    slot.set(Some(publish));
    let mut publish = slot.as_pin_mut().expect("just set");
    match futures_util::poll!(publish.as_mut()) {
        Poll::Ready(Ok(confirm)) => Ok(InFlight::Sent(confirm)),
        Poll::Ready(Err(e)) => Err(classify(&e)),
        Poll::Pending => Ok(InFlight::Sending(publish)),
    }
}

/// The elements of a pinned slice, each pinned in place.
fn pinned_elements<T>(slice: Pin<&mut [T]>) -> impl Iterator<Item = Pin<&mut T>> {
    // SAFETY: the elements of a pinned slice never move (a slice cannot
    // grow or shrink), and each is handed out once, only ever pinned.
    unsafe { slice.get_unchecked_mut() }
        .iter_mut()
        .map(|element| unsafe { Pin::new_unchecked(element) })
}

/// A row sent on a channel: its frames queued (the publish, until lapin
/// has written them) or written, its confirm due.
enum InFlight<'s, F> {
    Sending(Pin<&'s mut F>),
    Sent(PublisherConfirm),
}

struct Prepared {
    exchange: ShortString,
    routing_key: ShortString,
    properties: BasicProperties,
}

/// Everything about a row that can be checked before it is sent.
fn prepare(row: &ClaimedMessage, limits: &PublishLimits) -> Result<Prepared, PublishError> {
    let max_payload_bytes = limits.max_payload_bytes;
    if row.payload.len() as u64 > max_payload_bytes {
        return Err(PublishError::Rejected(format!(
            "payload is {} bytes, more than outbox.max_payload_bytes ({max_payload_bytes})",
            row.payload.len()
        )));
    }
    let exchange = ShortString::try_new(row.exchange.as_str())
        .map_err(|e| PublishError::Rejected(format!("invalid exchange name: {e}")))?;
    let routing_key = ShortString::try_new(row.routing_key.as_str())
        .map_err(|e| PublishError::Rejected(format!("invalid routing key: {e}")))?;
    let properties = message_properties(row, limits.lease_epoch)?;
    Ok(Prepared {
        exchange,
        routing_key,
        properties,
    })
}

/// The AMQP properties the relay sends `row` with: its JSON headers plus
/// the `outbox-*` headers (`lease_epoch` stamped when set), persistent
/// delivery, message id, timestamp, app id and content type. Public so
/// that the benchmark's ceiling sends the same messages as the relay.
pub fn message_properties(
    row: &ClaimedMessage,
    lease_epoch: Option<i64>,
) -> Result<BasicProperties, PublishError> {
    let mut headers = match &row.headers {
        Json::Object(map) => json_table(map, 0)
            .map_err(|e| PublishError::Rejected(format!("invalid headers: {e}")))?,
        other => {
            return Err(PublishError::Rejected(format!(
                "invalid headers: expected a JSON object, found {}",
                json_kind(other)
            )));
        }
    };
    headers.insert(HEADER_ID.into(), AMQPValue::LongLongInt(row.id));
    headers.insert(
        HEADER_PARTITION_KEY.into(),
        AMQPValue::LongString(row.partition_key.as_str().into()),
    );
    headers.insert(
        HEADER_MESSAGE_KEY.into(),
        AMQPValue::LongString(row.message_key.as_str().into()),
    );
    if let Some(epoch) = lease_epoch {
        headers.insert(HEADER_LEASE_EPOCH.into(), AMQPValue::LongLongInt(epoch));
    }
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(row.message_id.to_string().into())
        .with_timestamp(row.created_at.timestamp().max(0) as u64)
        .with_app_id("outboxd".into())
        .with_headers(headers);
    if let Some(ct) = &row.content_type {
        let ct = ShortString::try_new(ct.as_str())
            .map_err(|e| PublishError::Rejected(format!("invalid content_type: {e}")))?;
        properties = properties.with_content_type(ct);
    }
    Ok(properties)
}

fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn json_table(map: &serde_json::Map<String, Json>, depth: usize) -> Result<FieldTable, String> {
    let mut table = FieldTable::default();
    for (k, v) in map {
        let key = ShortString::try_new(k.as_str()).map_err(|_| {
            format!(
                "header name '{}…' is longer than 255 bytes",
                k.chars().take(20).collect::<String>()
            )
        })?;
        table.insert(key, json_value(v, depth + 1)?);
    }
    Ok(table)
}

fn json_value(v: &Json, depth: usize) -> Result<AMQPValue, String> {
    if depth > MAX_HEADER_DEPTH {
        return Err(format!("nested deeper than {MAX_HEADER_DEPTH} levels"));
    }
    Ok(match v {
        Json::Null => AMQPValue::Void,
        Json::Bool(b) => AMQPValue::Boolean(*b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            (None, Some(f)) => AMQPValue::Double(f),
            (None, None) => return Err(format!("number {n} does not fit an AMQP header")),
        },
        Json::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        Json::Array(items) => AMQPValue::FieldArray(FieldArray::from(
            items
                .iter()
                .map(|i| json_value(i, depth + 1))
                .collect::<Result<Vec<_>, _>>()?,
        )),
        Json::Object(map) => AMQPValue::FieldTable(json_table(map, depth)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(headers: Json, payload_len: usize, routing_key: &str) -> ClaimedMessage {
        ClaimedMessage {
            id: 7,
            message_id: uuid::Uuid::nil(),
            partition_key: "p03".into(),
            message_key: "order-1".into(),
            exchange: String::new(),
            routing_key: routing_key.into(),
            headers,
            content_type: Some("application/json".into()),
            payload: vec![b'x'; payload_len],
            attempts: 0,
            created_at: chrono::Utc::now(),
        }
    }

    fn limits(max_payload_bytes: u64) -> PublishLimits {
        PublishLimits {
            max_payload_bytes,
            stop_sending_at: None,
            lease_epoch: Some(4),
            trust: None,
            lease_was_free: false,
        }
    }

    #[test]
    fn headers_carry_id_partition_and_key_and_user_values() {
        let p = prepare(
            &row(
                json!({"tenant": "acme", "n": 3, "nested": {"a": [1, true]}}),
                10,
                "q",
            ),
            &limits(100),
        )
        .unwrap();
        let h = p.properties.headers().as_ref().unwrap();
        assert_eq!(h.inner().get(HEADER_ID), Some(&AMQPValue::LongLongInt(7)));
        assert_eq!(
            h.inner().get(HEADER_PARTITION_KEY),
            Some(&AMQPValue::LongString("p03".into()))
        );
        assert_eq!(h.inner().get("n"), Some(&AMQPValue::LongLongInt(3)));
        assert_eq!(
            h.inner().get(HEADER_LEASE_EPOCH),
            Some(&AMQPValue::LongLongInt(4))
        );
        assert!(matches!(
            h.inner().get("nested"),
            Some(AMQPValue::FieldTable(_))
        ));
        assert_eq!(p.properties.delivery_mode(), &Some(2));
    }

    #[test]
    fn bad_rows_are_rejected_before_sending() {
        let too_big = prepare(&row(json!({}), 101, "q"), &limits(100))
            .err()
            .unwrap();
        assert!(too_big.is_rows_fault() && too_big.to_string().contains("101 bytes"));
        let long_rk = prepare(&row(json!({}), 1, &"r".repeat(256)), &limits(100))
            .err()
            .unwrap();
        assert!(long_rk.to_string().contains("routing key"));
        let long_header = prepare(&row(json!({ "h".repeat(300): 1 }), 1, "q"), &limits(100))
            .err()
            .unwrap();
        assert!(long_header.to_string().contains("invalid headers"));
        let not_object = prepare(&row(json!([1, 2]), 1, "q"), &limits(100))
            .err()
            .unwrap();
        assert!(not_object.to_string().contains("expected a JSON object"));
        let mut deep = json!(1);
        for _ in 0..20 {
            deep = json!({ "d": deep });
        }
        assert!(prepare(&row(deep, 1, "q"), &limits(100)).is_err());
    }
}
