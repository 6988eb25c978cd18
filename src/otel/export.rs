//! Exporting through OpenTelemetry's SDK: the relay hands finished spans
//! to a [`Tracer`] (never a wait), the SDK's batch span processor posts
//! them over OTLP/HTTP from its own thread, and, when asked, a periodic
//! reader posts the worker's counters as OTLP metrics.
//!
//! What outboxd adds to the SDK, and why:
//! - **A bound it can count.** The SDK's batch processor drops spans when
//!   its queue is full without saying how many; the tracer keeps the
//!   number handed over and not yet exported, refuses spans beyond
//!   `OTEL_BSP_MAX_QUEUE_SIZE` itself, and counts them
//!   (`outboxd_trace_spans_dropped_total`), so the SDK's queue never
//!   overflows unseen.
//! - **Export outcomes in `/metrics` and the log.** A wrapper around the
//!   OTLP exporter counts accepted spans and failed requests, and says a
//!   failure at most once a minute. A failed export is not retried:
//!   traces are diagnostics, and holding them would hold memory.
//! - **The links' TLS.** The exporter's HTTP client is given the rustls
//!   configuration every other link uses (its CA and client certificate
//!   from the `OTEL_EXPORTER_OTLP_*CERTIFICATE` variables, which the SDK's
//!   HTTP exporter does not read).
//!
//! On shutdown what is queued is sent once, within the worker's farewell
//! (2 s; a collector slower than that loses the last spans).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};
use tokio_util::sync::CancellationToken;

use super::config::{ExportConfig, Signal};
pub use super::span::PublishSpan;

/// Export counters, for `/metrics`.
#[derive(Debug, Default)]
pub struct TraceCounts {
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans dropped: the export queue was full, or their export failed.
    pub dropped: AtomicU64,
    /// Export requests that failed.
    pub failed_exports: AtomicU64,
    /// Spans handed to the SDK and not yet through an export.
    queued: AtomicU64,
}

/// A cumulative counter the worker keeps, exported as an observable OTLP
/// sum read at each export (the worker's `COUNTERS` table).
pub struct Observed {
    /// The OTLP metric (`outboxd.…`).
    pub name: &'static str,
    /// Its unit (UCUM annotation).
    pub unit: &'static str,
    pub help: &'static str,
    pub read: Box<dyn Fn() -> u64 + Send + Sync>,
}

/// Where the relay records spans; a disabled tracer (the default: no
/// endpoint, or traces off) records nothing and costs one branch.
#[derive(Clone, Default)]
pub struct Tracer {
    inner: Option<Arc<Recording>>,
}

struct Recording {
    tracer: SdkTracer,
    counts: Arc<TraceCounts>,
    max_queue: u64,
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
        self.inner.is_some()
    }

    /// Hands `spans` to the SDK; what does not fit is dropped and counted.
    pub fn record(&self, spans: Vec<PublishSpan>) {
        let Some(r) = &self.inner else { return };
        let queued = r.counts.queued.load(Ordering::Relaxed);
        let room = r.max_queue.saturating_sub(queued) as usize;
        let dropped = spans.len().saturating_sub(room);
        if dropped > 0 {
            r.counts
                .dropped
                .fetch_add(dropped as u64, Ordering::Relaxed);
        }
        let taken = spans.len() - dropped;
        r.counts.queued.fetch_add(taken as u64, Ordering::Relaxed);
        for span in spans.into_iter().take(taken) {
            r.start(span);
        }
    }
}

impl Recording {
    /// One span of `span`'s trace, a child of the producer's span, ended.
    fn start(&self, span: PublishSpan) {
        let parent = SpanContext::new(
            TraceId::from_bytes(span.parent.trace_id),
            SpanId::from_bytes(span.parent.span_id),
            TraceFlags::new(span.parent.flags),
            true,
            span.trace_state
                .as_deref()
                .and_then(|s| s.parse::<TraceState>().ok())
                .unwrap_or_default(),
        );
        let context = opentelemetry::Context::new().with_remote_span_context(parent);
        let destination = if span.exchange.is_empty() {
            "amq.default".to_string()
        } else {
            span.exchange
        };
        let mut attributes = vec![
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("messaging.destination.name", destination.clone()),
            KeyValue::new(
                "messaging.rabbitmq.destination.routing_key",
                span.routing_key,
            ),
            KeyValue::new("messaging.message.id", span.message_id.to_string()),
            KeyValue::new("messaging.message.body.size", span.body_size),
            KeyValue::new("outboxd.outbox_id", span.outbox_id),
            KeyValue::new("outboxd.bucket", span.bucket),
        ];
        if let Some(epoch) = span.lease_epoch {
            attributes.push(KeyValue::new("outboxd.lease_epoch", epoch));
        }
        let mut started = self
            .tracer
            .span_builder(format!("publish {destination}"))
            .with_kind(SpanKind::Producer)
            .with_start_time(span.started)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &context);
        if let Some(error) = span.error {
            started.set_status(Status::error(error));
        }
        started.end_with_timestamp(span.ended);
    }
}

/// The SDK's providers, shut down (flushed once) by [`Telemetry::run`].
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
}

/// Starts exporting what `config` asks for: the tracer to record into (a
/// disabled one when traces are off) and the providers to run until the
/// worker stops. The SDK's exporters own blocking HTTP clients, which are
/// built off the async runtime.
pub async fn start(
    config: &ExportConfig,
    instance_id: String,
    counts: Arc<TraceCounts>,
    counters: Vec<Observed>,
) -> Result<(Tracer, Telemetry), String> {
    let config = config.clone();
    tokio::task::spawn_blocking(move || {
        let resource = resource(&config, instance_id);
        let scope = InstrumentationScope::builder("outboxd")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let mut tracer = Tracer::default();
        let traces = match &config.traces {
            Some(signal) => {
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(signal.endpoint.as_str())
                    .with_http_client(client(signal)?)
                    .build()
                    .map_err(|e| format!("traces: {e}"))?;
                let exporter = Counting {
                    inner: exporter,
                    counts: counts.clone(),
                    endpoint: signal.endpoint.to_string(),
                    last_complaint: Mutex::new(None),
                };
                let provider = SdkTracerProvider::builder()
                    .with_span_processor(BatchSpanProcessor::builder(exporter).build())
                    .with_resource(resource.clone())
                    .build();
                tracer.inner = Some(Arc::new(Recording {
                    tracer: provider.tracer_with_scope(scope.clone()),
                    counts,
                    max_queue: config.max_queue as u64,
                }));
                tracing::info!(endpoint = %signal.endpoint, "exporting a span per published message of a sampled trace");
                Some(provider)
            }
            None => None,
        };
        let metrics = match &config.metrics {
            Some(signal) => {
                let exporter = opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(signal.endpoint.as_str())
                    .with_http_client(client(signal)?)
                    .build()
                    .map_err(|e| format!("metrics: {e}"))?;
                let provider = SdkMeterProvider::builder()
                    .with_reader(PeriodicReader::builder(exporter).build())
                    .with_resource(resource)
                    .build();
                instruments(&provider.meter_with_scope(scope), counters);
                tracing::info!(endpoint = %signal.endpoint, "exporting the worker's counters as OTLP metrics");
                Some(provider)
            }
            None => None,
        };
        Ok((tracer, Telemetry { traces, metrics }))
    })
    .await
    .map_err(|e| format!("cannot start the exporter: {e}"))?
}

impl Telemetry {
    /// Waits for `cancel`, then sends what is queued, once, within 2 s.
    pub async fn run(self, cancel: CancellationToken) {
        cancel.cancelled().await;
        let flushed = tokio::task::spawn_blocking(move || {
            let farewell = Duration::from_secs(2);
            if let Some(p) = self.traces {
                let _ = p.shutdown_with_timeout(farewell);
            }
            if let Some(p) = self.metrics {
                let _ = p.shutdown_with_timeout(farewell);
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(3), flushed).await;
    }
}

/// The worker's resource: the user's `OTEL_RESOURCE_ATTRIBUTES` win over
/// the instance id and version given here.
fn resource(config: &ExportConfig, instance_id: String) -> Resource {
    let mut attributes = config.resource.clone();
    for (key, value) in [
        ("service.instance.id", instance_id),
        ("service.version", env!("CARGO_PKG_VERSION").to_string()),
    ] {
        if !attributes.iter().any(|(k, _)| k == key) {
            attributes.push((key.into(), value));
        }
    }
    Resource::builder_empty()
        .with_attributes(attributes.into_iter().map(|(k, v)| KeyValue::new(k, v)))
        .build()
}

/// A blocking HTTP client with the links' TLS stack and this signal's
/// CA and client certificate.
fn client(signal: &Signal) -> Result<reqwest::blocking::Client, String> {
    let keys = signal.tls_keys.each_ref().map(String::as_str);
    let tls = signal.tls.client_config(keys)?;
    reqwest::blocking::Client::builder()
        .use_preconfigured_tls(Arc::unwrap_or_clone(tls))
        .timeout(signal.timeout)
        .user_agent(concat!("outboxd/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the OTLP client for {}: {e}", signal.endpoint))
}

/// The worker's counters as observable instruments, read at each export.
/// The latency histograms stay on `/metrics` only: the SDK has no
/// observable histogram, and recording into one would put a second
/// histogram on the drain path.
fn instruments(meter: &opentelemetry::metrics::Meter, counters: Vec<Observed>) {
    for c in counters {
        let read = c.read;
        meter
            .u64_observable_counter(c.name)
            .with_unit(c.unit)
            .with_description(c.help)
            .with_callback(move |observer| observer.observe(read(), &[]))
            .build();
    }
}

/// The OTLP span exporter, counting what it exports and saying failures.
#[derive(Debug)]
struct Counting<E> {
    inner: E,
    counts: Arc<TraceCounts>,
    endpoint: String,
    last_complaint: Mutex<Option<Instant>>,
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let result = self.inner.export(batch).await;
        let counts = &self.counts;
        match &result {
            Ok(()) => {
                counts.exported.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                counts.failed_exports.fetch_add(1, Ordering::Relaxed);
                counts.dropped.fetch_add(n, Ordering::Relaxed);
                let mut last = self
                    .last_complaint
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if !last.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
                    *last = Some(Instant::now());
                    tracing::warn!(
                        "cannot export spans to {}: {e} ({n} spans dropped; said at most once a minute)",
                        self.endpoint
                    );
                }
            }
        }
        counts.queued.fetch_sub(n, Ordering::Relaxed);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
