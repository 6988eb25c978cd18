//! Traces: W3C trace context from the producer to the consumer, and
//! OpenTelemetry spans of the relay's own part, exported over OTLP/HTTP.
//!
//! - [`context`]: `traceparent` / `tracestate`. The producer writes them
//!   into the row's headers in the business transaction
//!   ([`crate::producer::Producer::with_trace_source`], or any SQL
//!   producer by hand); the relay copies every header to the AMQP message
//!   unchanged, so the consumer continues the producer's trace (its parent
//!   is the producer's span, exported or not).
//! - [`config`]: the standard `OTEL_*` variables; no endpoint, no export.
//! - [`export`]: one span per message of a *sampled* trace, from the start
//!   of its batch's publish to its confirm (or its failure, with an error
//!   status), a child of the row's span, with the bucket, lease epoch and
//!   outbox id as attributes; queued without waiting and posted in batches
//!   by one task. Why per message and not per batch with links: a span per
//!   message is what puts the relay *inside* each producer's trace (links
//!   would leave every trace without it), and its cost is one small struct
//!   per message, encoded off the drain path in batches (bench section
//!   `traces`).
//! - [`span`]: the span a published message gets, and its resource.
//! - `proto`: the OTLP protobuf request, encoded by hand (a few
//!   messages; no code generator, no OpenTelemetry SDK in the build).

pub mod config;
pub mod context;
pub mod export;
mod proto;
pub mod span;

pub use config::ExportConfig;
pub use context::{TraceContext, TraceParent};
pub use export::{Exporter, PublishSpan, Tracer};
