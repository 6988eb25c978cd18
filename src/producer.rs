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
//! The message key is the first argument of [`Message::new`]: a message
//! cannot be built without one. The bucket is computed by the database's
//! `<outbox>_enqueue()`, the same function producers in other languages
//! call, so every producer agrees on it.

use serde_json::Value as Json;
use sqlx::PgExecutor;

use crate::config::TablesConfig;
use crate::store::StoreError;
use crate::store::outbox::OutboxSql;

/// A message to enqueue.
#[derive(Debug, Clone)]
pub struct Message {
    message_key: String,
    exchange: String,
    routing_key: String,
    payload: Vec<u8>,
    headers: Json,
    content_type: Option<String>,
}

impl Message {
    /// A message for `message_key` (the aggregate or stream id whose messages
    /// must stay in order), to `exchange` (`""` = the default exchange) with
    /// `routing_key`.
    pub fn new(
        message_key: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            message_key: message_key.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            payload: payload.into(),
            headers: Json::Object(Default::default()),
            content_type: None,
        }
    }

    /// Adds an AMQP header (a JSON value: string, number, bool, null, array
    /// or object).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Json>) -> Self {
        if let Json::Object(map) = &mut self.headers {
            map.insert(name.into(), value.into());
        }
        self
    }

    /// Sets the AMQP content type.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }
}

/// Enqueues messages into one deployment's outbox table.
#[derive(Debug)]
pub struct Producer {
    sql: OutboxSql,
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
            sql: OutboxSql::new(tables),
        }
    }

    /// Enqueues `message` on `exec` — pass `&mut *tx` to make it part of the
    /// caller's transaction. Returns the message's outbox id.
    pub async fn enqueue<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        message: Message,
    ) -> Result<i64, StoreError> {
        self.sql
            .enqueue(
                exec,
                &message.message_key,
                &message.exchange,
                &message.routing_key,
                &message.payload,
                &message.headers,
                message.content_type.as_deref(),
            )
            .await
    }
}
