//! Wake-up notifications — the interface every backend implements
//! ([`NotifyStore`]).
//!
//! Two channels: [`Channel::Enqueued`] (payload: a bucket label; sent by
//! the database when a row is enqueued, delivered at commit) and
//! [`Channel::Fleet`] (workers joining, leaving, releasing buckets).
//! PostgreSQL has them (`NOTIFY` / `LISTEN`); MySQL/MariaDB does not, and
//! its workers poll instead ([`crate::relay::wakeups`]).

use async_trait::async_trait;

use super::error::StoreError;

/// What a notification is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// A bucket has new rows (payload: its label).
    Enqueued,
    /// The fleet changed (payload: what happened).
    Fleet,
}

/// One notification received.
#[derive(Debug, Clone)]
pub struct Notification {
    pub channel: Channel,
    pub payload: String,
}

/// A connection listening on both channels.
#[async_trait]
pub trait Listener: Send {
    /// The next notification. `Ok(None)`: the connection was lost and
    /// re-established, so notifications sent meanwhile may be lost.
    async fn recv(&mut self) -> Result<Option<Notification>, StoreError>;

    /// Stops listening (best effort: behind a pooler the registration may
    /// stay on a server session other clients get).
    async fn stop(self: Box<Self>);
}

/// Notifications, as every backend implements them.
#[async_trait]
pub trait NotifyStore {
    /// Whether this database delivers notifications at all. Without them,
    /// workers poll (and [`NotifyStore::notify`] does nothing).
    fn has_notifications(&self) -> bool;

    /// Sends a notification (on its own, delivered at once).
    async fn notify(&self, channel: Channel, payload: &str) -> Result<(), StoreError>;

    /// Starts listening on both channels: on `direct_url` when given (a
    /// direct connection that bypasses a pooler), else with the store's own
    /// connection settings.
    async fn listen(&self, direct_url: Option<&str>) -> Result<Box<dyn Listener>, StoreError>;

    /// For a database without notifications whose platform can tell when
    /// it changed (SQLite: the kernel reports writes to its files): a
    /// signal raised on every change, after which the poller probes for
    /// added rows at once instead of at its next turn. `None`: polling
    /// alone.
    fn changes(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }
}
