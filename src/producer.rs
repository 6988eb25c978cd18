//! The Rust producer API: enqueue a message inside the caller's transaction.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outboxd::producer::{Message, Producer};
//!
//! let producer = Producer::default();
//! let mut tx = pool.begin().await?;
//! // ... the business write, in the same transaction ...
//! let id = producer
//!     .enqueue(&mut *tx, Message::new("order-42", "orders", "order.created", br#"{"total":12}"#.to_vec())
//!         .content_type("application/json"))
//!     .await?;
//! tx.commit().await?; // the message exists if and only if the business write does
//! # let _ = id; Ok(()) }
//! ```
//!
//! The same call works on MySQL/MariaDB with a `sqlx::MySqlPool` and on
//! SQLite with a `sqlx::SqlitePool`, or one of their transactions.
//!
//! # Trace context
//!
//! A message carries its producer's span when it has a `traceparent` header
//! (W3C trace context; `tracestate` beside it when the trace has one): set
//! it per message with [`Message::trace_context`], or once per producer
//! with [`Producer::with_trace_source`], a function returning the current
//! span's context — with the `opentelemetry` crate, for example:
//!
//! ```ignore
//! use opentelemetry::trace::TraceContextExt;
//! let producer = Producer::default().with_trace_source(|| {
//!     let context = opentelemetry::Context::current();
//!     let span = context.span().span_context().clone();
//!     span.is_valid().then(|| {
//!         TraceContext::new(span.trace_id().to_bytes(), span.span_id().to_bytes(), span.is_sampled())
//!             .with_state(span.trace_state().header())
//!     })
//! });
//! ```
//!
//! A message that already has a `traceparent` keeps it. outboxd depends on
//! no tracing library for this: the source is the application's.
//!
//! The message key is the first argument of [`Message::new`]: a message
//! cannot be built without one. The bucket is computed by the database
//! (PostgreSQL's `<outbox>_enqueue()`, MySQL's insert trigger), the same
//! code that labels the rows of producers in other languages, so every
//! producer agrees on it.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::config::TablesConfig;
pub use crate::otel::TraceContext;
pub use crate::store::outbox::Message;
use crate::store::{Bounds, ErrorDialect, Sql, StoreError, StoreSettings, Tables};

/// Enqueues messages into one deployment's outbox table, on PostgreSQL or
/// MySQL/MariaDB: whichever database the executor it is given talks to.
pub struct Producer {
    postgres: Enqueue,
    mysql: Enqueue,
    sqlite: Enqueue,
    trace_source: Option<TraceSource>,
}

/// One database's enqueue statement, and what bounds it: each enqueue
/// fails after `database.query_timeout`'s default, its error read as that
/// database's.
#[derive(Debug)]
struct Enqueue {
    sql: Sql,
    bounds: Bounds,
}

impl Enqueue {
    fn new(sql: Sql, dialect: &'static ErrorDialect) -> Self {
        let bounds = Bounds::new(StoreSettings::default_query_timeout(), dialect);
        Self { sql, bounds }
    }
}

/// Where a producer finds the current span's context.
type TraceSource = Arc<dyn Fn() -> Option<TraceContext> + Send + Sync>;

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("postgres", &self.postgres.sql)
            .field("mysql", &self.mysql.sql)
            .field("sqlite", &self.sqlite.sql)
            .field("trace_source", &self.trace_source.is_some())
            .finish()
    }
}

impl Default for Producer {
    /// A producer for the default table names.
    fn default() -> Self {
        Self::new(&TablesConfig::default())
    }
}

impl Producer {
    /// A producer for the given table names.
    pub fn new(tables: &TablesConfig) -> Self {
        use crate::store::{mysql, postgres, sqlite};
        let tables = &Tables::from(tables);
        Self {
            postgres: Enqueue::new(
                postgres::outbox::enqueue_statement(tables),
                &postgres::ERRORS,
            ),
            mysql: Enqueue::new(mysql::outbox::enqueue_statement(tables), &mysql::ERRORS),
            sqlite: Enqueue::new(sqlite::outbox::enqueue_statement(tables), &sqlite::ERRORS),
            trace_source: None,
        }
    }

    /// Asks `source` for the current span's context at every enqueue and
    /// writes it into the message's headers (`traceparent`, `tracestate`),
    /// inside the caller's transaction; a message that has a `traceparent`
    /// already, or a call where `source` returns `None`, is left as it is.
    pub fn with_trace_source(
        mut self,
        source: impl Fn() -> Option<TraceContext> + Send + Sync + 'static,
    ) -> Self {
        self.trace_source = Some(Arc::new(source));
        self
    }

    /// Enqueues `message` on `exec` — pass `&mut *tx` to make it part of the
    /// caller's transaction. Returns the message's outbox id.
    pub async fn enqueue<'e, E>(&self, exec: E, mut message: Message) -> Result<i64, StoreError>
    where
        E: sqlx::Executor<'e>,
        E::Database: ProducerDatabase,
    {
        if let Some(source) = &self.trace_source
            && !message.has_trace_context()
            && let Some(context) = source()
        {
            message = message.trace_context(&context);
        }
        <E::Database as ProducerDatabase>::enqueue(self, exec, &message).await
    }
}

/// A database a [`Producer`] enqueues into: [`sqlx::Postgres`] (through
/// `<outbox>_enqueue()`), [`sqlx::MySql`] or [`sqlx::Sqlite`] (a plain
/// `INSERT`; the table's trigger computes the bucket).
pub trait ProducerDatabase: sqlx::Database {
    #[doc(hidden)]
    fn enqueue<'a, 'e: 'a, E: sqlx::Executor<'e, Database = Self> + 'a>(
        producer: &'a Producer,
        exec: E,
        message: &'a Message,
    ) -> BoxFuture<'a, Result<i64, StoreError>>;
}

impl ProducerDatabase for sqlx::Postgres {
    fn enqueue<'a, 'e: 'a, E: sqlx::Executor<'e, Database = Self> + 'a>(
        producer: &'a Producer,
        exec: E,
        message: &'a Message,
    ) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(crate::store::drain::enqueue(
            &producer.postgres.sql,
            exec,
            &producer.postgres.bounds,
            message,
        ))
    }
}

impl ProducerDatabase for sqlx::MySql {
    fn enqueue<'a, 'e: 'a, E: sqlx::Executor<'e, Database = Self> + 'a>(
        producer: &'a Producer,
        exec: E,
        message: &'a Message,
    ) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(crate::store::drain::enqueue(
            &producer.mysql.sql,
            exec,
            &producer.mysql.bounds,
            message,
        ))
    }
}

impl ProducerDatabase for sqlx::Sqlite {
    fn enqueue<'a, 'e: 'a, E: sqlx::Executor<'e, Database = Self> + 'a>(
        producer: &'a Producer,
        exec: E,
        message: &'a Message,
    ) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(crate::store::drain::enqueue(
            &producer.sqlite.sql,
            exec,
            &producer.sqlite.bounds,
            message,
        ))
    }
}
