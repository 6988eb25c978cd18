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
//! The same call works on MySQL/MariaDB with a `sqlx::MySqlPool` or one of
//! its transactions.
//!
//! The message key is the first argument of [`Message::new`]: a message
//! cannot be built without one. The bucket is computed by the database
//! (PostgreSQL's `<outbox>_enqueue()`, MySQL's insert trigger), the same
//! code that labels the rows of producers in other languages, so every
//! producer agrees on it.

use futures_util::future::BoxFuture;

use crate::config::TablesConfig;
pub use crate::store::outbox::Message;
use crate::store::{Sql, StoreError};

/// Enqueues messages into one deployment's outbox table, on PostgreSQL or
/// MySQL/MariaDB: whichever database the executor it is given talks to.
#[derive(Debug)]
pub struct Producer {
    postgres: Sql,
    mysql: Sql,
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
        Self {
            postgres: crate::store::postgres::outbox::enqueue_statement(tables),
            mysql: crate::store::mysql::outbox::enqueue_statement(tables),
        }
    }

    /// Enqueues `message` on `exec` — pass `&mut *tx` to make it part of the
    /// caller's transaction. Returns the message's outbox id.
    pub async fn enqueue<'e, E>(&self, exec: E, message: Message) -> Result<i64, StoreError>
    where
        E: sqlx::Executor<'e>,
        E::Database: ProducerDatabase,
    {
        <E::Database as ProducerDatabase>::enqueue(self, exec, &message).await
    }
}

/// A database a [`Producer`] enqueues into: [`sqlx::Postgres`] (through
/// `<outbox>_enqueue()`) or [`sqlx::MySql`] (a plain `INSERT`; the table's
/// trigger computes the bucket).
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
        Box::pin(crate::store::postgres::outbox::enqueue(
            &producer.postgres,
            exec,
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
        Box::pin(crate::store::mysql::outbox::enqueue(
            &producer.mysql,
            exec,
            message,
        ))
    }
}
