//! The span queue and the exporter: the relay hands finished spans to a
//! [`Tracer`] (a lock, a push; never a wait), and one task posts them in
//! batches to the OTLP/HTTP endpoint.
//!
//! Like the SDK's batch span processor: a batch goes when `max_batch`
//! spans are queued or `schedule_delay` has passed; beyond `max_queue`
//! queued spans new ones are dropped and counted, so a slow or absent
//! collector costs the relay nothing but the spans. A failed export is
//! dropped too (said at most once a minute), not retried: traces are
//! diagnostics, and holding them would hold memory. On shutdown what is
//! queued is sent once, within the worker's farewell (2 s; a collector
//! slower than that loses the last spans).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::config::ExportConfig;
use super::proto;
pub use super::span::{PublishSpan, Resource};

/// Export counters, for `/metrics`.
#[derive(Debug, Default)]
pub struct TraceCounts {
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans dropped: queue full, or their export failed.
    pub dropped: AtomicU64,
    /// Export requests that failed.
    pub failed_exports: AtomicU64,
}

struct Queue {
    spans: Mutex<Vec<PublishSpan>>,
    ready: Notify,
    max_queue: usize,
    max_batch: usize,
    counts: Arc<TraceCounts>,
}

/// Where the relay records spans; a disabled tracer (the default, no
/// endpoint) records nothing and costs one branch.
#[derive(Clone, Default)]
pub struct Tracer {
    queue: Option<Arc<Queue>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("enabled", &self.enabled())
            .finish()
    }
}

impl Tracer {
    /// Whether spans are exported at all.
    pub fn enabled(&self) -> bool {
        self.queue.is_some()
    }

    /// Queues `spans` for export; what does not fit is dropped and counted.
    pub fn record(&self, spans: Vec<PublishSpan>) {
        let Some(q) = &self.queue else { return };
        if spans.is_empty() {
            return;
        }
        let (queued, dropped) = {
            let mut queued = q.spans.lock().unwrap_or_else(|e| e.into_inner());
            let room = q.max_queue.saturating_sub(queued.len());
            let dropped = spans.len().saturating_sub(room);
            queued.extend(spans.into_iter().take(room));
            (queued.len(), dropped)
        };
        if dropped > 0 {
            q.counts
                .dropped
                .fetch_add(dropped as u64, Ordering::Relaxed);
        }
        if queued >= q.max_batch {
            q.ready.notify_one();
        }
    }
}

/// Starts exporting: the tracer to record into, and the exporter to run
/// (see [`Exporter::run`]); both count into `counts`.
pub fn start(
    config: &ExportConfig,
    instance_id: String,
    counts: Arc<TraceCounts>,
) -> (Tracer, Exporter) {
    let queue = Arc::new(Queue {
        spans: Mutex::new(Vec::new()),
        ready: Notify::new(),
        max_queue: config.max_queue,
        max_batch: config.max_batch,
        counts,
    });
    // The user's OTEL_RESOURCE_ATTRIBUTES win over these defaults.
    let mut attributes = config.resource.clone();
    for (key, value) in [
        ("service.instance.id", instance_id),
        ("service.version", env!("CARGO_PKG_VERSION").to_string()),
    ] {
        if !attributes.iter().any(|(k, _)| k == key) {
            attributes.push((key.into(), value));
        }
    }
    let exporter = Exporter {
        queue: queue.clone(),
        client: Client::new(config),
        resource: Resource { attributes },
        schedule_delay: config.schedule_delay,
        ids: SpanIds::new(),
        last_complaint: None,
    };
    (Tracer { queue: Some(queue) }, exporter)
}

/// Sends the queued spans in batches.
pub struct Exporter {
    queue: Arc<Queue>,
    client: Client,
    resource: Resource,
    schedule_delay: Duration,
    ids: SpanIds,
    last_complaint: Option<Instant>,
}

impl Exporter {
    /// Sends batches until `cancel` fires, then what is queued, once.
    pub async fn run(mut self, cancel: CancellationToken) {
        if let Some(asked) = &self.client.ignored_compression {
            tracing::warn!(
                "{asked}: compression is not built into outboxd; spans are sent uncompressed"
            );
        }
        tracing::info!(endpoint = %self.client.endpoint, "exporting a span per published message of a sampled trace");
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = self.queue.ready.notified() => {}
                _ = tokio::time::sleep(self.schedule_delay) => {}
            }
            self.send_queued().await;
        }
        self.send_queued().await;
    }

    /// Takes everything queued and sends it in requests of `max_batch`.
    async fn send_queued(&mut self) {
        let spans =
            std::mem::take(&mut *self.queue.spans.lock().unwrap_or_else(|e| e.into_inner()));
        for batch in spans.chunks(self.queue.max_batch) {
            let with_ids: Vec<(&PublishSpan, [u8; 8])> =
                batch.iter().map(|s| (s, self.ids.next())).collect();
            let body = proto::export_request(&self.resource, &with_ids);
            let counts = &self.queue.counts;
            match self.client.post(body).await {
                Ok(()) => {
                    counts
                        .exported
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    counts.failed_exports.fetch_add(1, Ordering::Relaxed);
                    counts
                        .dropped
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    let quiet = self
                        .last_complaint
                        .is_some_and(|t| t.elapsed() < Duration::from_secs(60));
                    if !quiet {
                        self.last_complaint = Some(Instant::now());
                        tracing::warn!(
                            "cannot export spans to {}: {e} ({} spans dropped; said at most once a minute)",
                            self.client.endpoint,
                            batch.len()
                        );
                    }
                }
            }
        }
    }
}

/// Span ids: distinct and unpredictable — a random start passed through
/// splitmix64, a bijection, so no two spans of this process share an id.
struct SpanIds {
    next: u64,
}

impl SpanIds {
    fn new() -> Self {
        let seed = uuid::Uuid::new_v4().as_u64_pair().0;
        Self { next: seed }
    }

    fn next(&mut self) -> [u8; 8] {
        loop {
            self.next = self.next.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.next;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            if z != 0 {
                return z.to_be_bytes();
            }
        }
    }
}

/// An HTTP/1.1 client for one endpoint, keeping its connection between
/// requests.
struct Client {
    endpoint: url::Url,
    headers: Vec<(String, String)>,
    timeout: Duration,
    tls: Option<crate::tls::TlsFiles>,
    ignored_compression: Option<String>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Client {
    fn new(config: &ExportConfig) -> Self {
        Self {
            endpoint: config.endpoint.clone(),
            headers: config.headers.clone(),
            timeout: config.timeout,
            tls: (config.endpoint.scheme() == "https").then(|| config.tls.clone()),
            ignored_compression: config.ignored_compression.clone(),
            sender: None,
        }
    }

    /// Posts one export request, within the timeout.
    async fn post(&mut self, body: Vec<u8>) -> Result<(), String> {
        match tokio::time::timeout(self.timeout, self.try_post(body)).await {
            Ok(result) => result.inspect_err(|_| self.sender = None),
            Err(_) => {
                self.sender = None;
                Err(format!("no answer within {:?}", self.timeout))
            }
        }
    }

    async fn try_post(&mut self, body: Vec<u8>) -> Result<(), String> {
        let reusable = self.sender.as_ref().is_some_and(|s| !s.is_closed());
        if !reusable {
            self.sender = Some(self.connect().await?);
        }
        let sender = self.sender.as_mut().expect("connected above");
        sender.ready().await.map_err(|e| e.to_string())?;
        let host = match self.endpoint.port() {
            Some(port) => format!("{}:{port}", self.endpoint.host_str().unwrap_or_default()),
            None => self.endpoint.host_str().unwrap_or_default().to_string(),
        };
        let path = match self.endpoint.query() {
            Some(q) => format!("{}?{q}", self.endpoint.path()),
            None => self.endpoint.path().to_string(),
        };
        let mut request = hyper::Request::post(path)
            .header(hyper::header::HOST, host)
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                hyper::header::USER_AGENT,
                concat!("outboxd/", env!("CARGO_PKG_VERSION")),
            );
        for (k, v) in &self.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("invalid request header: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let answer = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if status.is_success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
        Err(format!(
            "{status} {}",
            text.replace(['\n', '\r'], " ").trim()
        ))
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let host = self.endpoint.host_str().unwrap_or_default().to_string();
        let port = self.endpoint.port_or_known_default().unwrap_or(4318);
        let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        tcp.set_nodelay(true).ok();
        let io: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(files) => {
                let config = files.client_config(ExportConfig::tls_keys())?;
                let name = crate::tls::server_name(&host)?;
                let stream = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                Box::new(stream)
            }
        };
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}
