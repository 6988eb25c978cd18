//! # outboxd
//!
//! A transactional-outbox relay. Applications insert the messages they must
//! publish into an `outbox` table in the same transaction as their business
//! data, on PostgreSQL, MySQL/MariaDB or SQLite; outboxd workers drain that table to
//! RabbitMQ with publisher confirms, in `id` order per bucket, at least
//! once, and record what was published. The guarantees, the lease and fencing argument, the schema and
//! what can still reorder are in `docs/DESIGN.md`; how to run it is in the
//! book, `docs/`.
//!
//! # Layout
//!
//! - [`cli`]: clap definitions and dispatch; every error ends as one line.
//! - [`config`]: the typed configuration, its defaults and validation.
//! - [`partitioner`]: message key → bucket (CRC-32), pure.
//! - [`store`]: all SQL, behind one backend-neutral interface (a trait per
//!   table); `store::postgres`, `store::mysql` and `store::sqlite`
//!   implement it.
//! - [`coordinator`]: membership, target assignment, leases, the fleet loop.
//! - [`lease`]: a granted lease, its fence and how long it is trusted.
//! - [`relay`]: per-bucket claim → publish → record loops and wake-ups.
//! - [`sink`]: the contract between a drainer and a broker (send a batch
//!   in order, confirmations, refusals), and what each destination got.
//! - [`amqp`]: the broker connection, confirm channels, batch publishing,
//!   and the send gate that keeps a stalled worker's frames off the wire.
//! - [`stream`]: RabbitMQ streams through the stream protocol, effectively
//!   once: a named producer per bucket, the row's id as publishing id.
//! - [`net`]: dead-peer detection (keepalive, `TCP_USER_TIMEOUT`) on the
//!   database and broker connections.
//! - [`tls`]: TLS on the database and broker links (rustls): client
//!   configuration from PEM files, and failed handshakes explained in one line.
//! - [`otel`]: W3C trace context from producer to consumer, and the
//!   relay's spans exported over OTLP/HTTP (`OTEL_*` variables).
//! - [`worker`]: one `outboxd work` process: start-up checks, ticks, shutdown.
//! - [`dashboard`]: the axum web monitor, JSON API, `/metrics`, `/healthz`.
//! - [`producer`]: the Rust API to enqueue inside a caller's transaction.
//! - [`checker`]: consumer-side verification of loss, duplicates and order.
//! - [`demo`]: the demo producer and consumer (`outboxd produce|consume`).
//! - [`logs`]: log lines (text or JSON, filters), each naming the worker.
//! - [`backoff`], [`jitter`], [`stamp`]: small shared helpers (pauses
//!   between failed attempts; spread pauses; a lock-free "when did this
//!   last happen").
//! - [`ops`]: operator commands (`status`, `failed`, `purge`, `repartition`)
//!   and the workers' maintenance task (retention, stray labels).

// The module docs are written for whoever changes the code: they name the
// private items that do the work (`cargo doc --document-private-items`
// renders those links).
#![allow(rustdoc::private_intra_doc_links)]

/// Prints a line on stdout. A closed stdout (the reader went away, e.g. a
/// pipe) is not worth a panic: the line is dropped.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Like [`say!`], on stderr.
#[macro_export]
macro_rules! complain {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod amqp;
pub mod backoff;
pub mod checker;
pub mod cli;
pub mod config;
pub mod coordinator;
pub mod dashboard;
pub mod demo;
pub mod jitter;
pub mod lease;
pub mod logs;
pub mod net;
pub mod ops;
pub mod otel;
pub mod partitioner;
pub mod producer;
pub mod relay;
pub mod sink;
pub mod stamp;
pub mod store;
pub mod stream;
pub mod tls;
pub mod worker;
