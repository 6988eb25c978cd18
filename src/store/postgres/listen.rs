//! PostgreSQL: `NOTIFY` and `LISTEN` on `<outbox>_enqueued` (sent by the
//! enqueue function and the insert trigger, delivered at commit) and
//! `<outbox>_fleet` (see [`crate::store::notify`]).

use async_trait::async_trait;
use sqlx::postgres::PgListener;

use super::PgBackend;
use super::pool::{DbPool, connect_to};
use crate::store::bounds::Bounded;
use crate::store::error::StoreError;
use crate::store::notify::{Channel, Listener, Notification, NotifyStore};
use crate::store::paced::Lent;
use crate::store::settings::Pooler;

impl PgBackend {
    fn channel_name(&self, channel: Channel) -> String {
        match channel {
            Channel::Enqueued => format!("{}_enqueued", self.tables.outbox),
            Channel::Fleet => format!("{}_fleet", self.tables.outbox),
        }
    }
}

#[async_trait]
impl NotifyStore for PgBackend {
    fn has_notifications(&self) -> bool {
        true
    }

    async fn notify(&self, channel: Channel, payload: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(self.channel_name(channel))
            .bind(payload)
            .execute(&self.pool)
            .bounded(self.pool.bounds(), "sending a notification")
            .await?;
        Ok(())
    }

    async fn listen(&self, direct_url: Option<&str>) -> Result<Box<dyn Listener>, StoreError> {
        let pool = match direct_url {
            None => self.pool.clone(),
            Some(url) => {
                tracing::debug!(url = %crate::store::settings::redacted(url), "connecting to LISTEN");
                connect_to(&self.db, url, Pooler::None, 2, "outboxd listen").await?
            }
        };
        let mut listener = PgListener::connect_with(pool.sqlx())
            .await
            .map_err(|source| StoreError::query(&super::ERRORS, "connecting to LISTEN", source))?;
        let lent = pool.lend();
        let (enqueued, fleet) = (
            self.channel_name(Channel::Enqueued),
            self.channel_name(Channel::Fleet),
        );
        // Bounded like any statement (the connection's own timeouts bound
        // the connect): the worker makes its first attempt before it
        // drains, and a server that took the connection but never answered
        // the LISTEN would otherwise hold its start.
        listener
            .listen_all([enqueued.as_str(), fleet.as_str()])
            .bounded(pool.bounds(), "starting to LISTEN")
            .await?;
        Ok(Box::new(PgNotifications {
            listener,
            fleet,
            _lent: lent,
            _pool: pool,
        }))
    }
}

/// A `LISTEN` connection.
struct PgNotifications {
    listener: PgListener,
    fleet: String,
    /// The listener's connection, counted as lent by its pool for good.
    _lent: Lent,
    /// The pool the listener's connection came from (a direct one when
    /// `listen_url` is set), kept open while it listens.
    _pool: DbPool,
}

#[async_trait]
impl Listener for PgNotifications {
    async fn recv(&mut self) -> Result<Option<Notification>, StoreError> {
        let next = self.listener.try_recv().await.map_err(|source| {
            StoreError::query(&super::ERRORS, "listening for notifications", source)
        })?;
        Ok(next.map(|n| Notification {
            channel: if n.channel() == self.fleet {
                Channel::Fleet
            } else {
                Channel::Enqueued
            },
            payload: n.payload().to_string(),
        }))
    }

    async fn stop(mut self: Box<Self>) {
        let _ = self.listener.unlisten_all().await;
    }
}
