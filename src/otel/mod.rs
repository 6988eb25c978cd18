//! Traces and metrics: W3C trace context from the producer to the
//! consumer, and OpenTelemetry spans and metrics of the relay's own part,
//! exported over OTLP/HTTP by OpenTelemetry's SDK.
//!
//! - [`context`]: `traceparent` / `tracestate`. The producer writes them
//!   into the row's headers in the business transaction
//!   ([`crate::producer::Producer::with_trace_source`], or any SQL
//!   producer by hand); the relay copies every header to the AMQP message
//!   unchanged, so the consumer continues the producer's trace (its parent
//!   is the producer's span, exported or not).
//! - [`config`]: the standard `OTEL_*` variables, checked at start-up; no
//!   endpoint, no export.
//! - [`export`]: one span per message of a *sampled* trace, from the start
//!   of its batch's publish to its confirm (or its failure, with an error
//!   status), a child of the row's span, with the bucket, lease epoch and
//!   outbox id as attributes; and, when asked, the worker's counters as
//!   OTLP metrics. Why a span per message and not per batch with links: a
//!   span per message is what puts the relay *inside* each producer's
//!   trace (links would leave every trace without it); its cost is bench
//!   section `traces`.
//! - [`span`]: what the relay records of a published message.
//!
//! The spans are made with the OpenTelemetry API directly, not through
//! `tracing` and `tracing-opentelemetry`: a span's start and end are its
//! batch's, known only once the broker has confirmed it, and a `tracing`
//! span per message held open across the publish would cost the drain
//! path what the SDK's explicit timestamps do not.

pub mod config;
pub mod context;
pub mod export;
pub mod span;

pub use config::ExportConfig;
pub use context::{TraceContext, TraceParent};
pub use export::{PublishSpan, Telemetry, Tracer};
