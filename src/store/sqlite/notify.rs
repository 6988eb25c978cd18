//! SQLite: no notifications (see [`crate::store::notify`]); workers poll
//! adaptively ([`crate::relay::wakeups`]) and probe at once when the
//! kernel reports a write to the database's files ([`super::watch`]).

use async_trait::async_trait;

use super::SqliteBackend;
use crate::store::error::StoreError;
use crate::store::notify::{Channel, Listener, NotifyStore};

#[async_trait]
impl NotifyStore for SqliteBackend {
    fn has_notifications(&self) -> bool {
        false
    }

    async fn notify(&self, _channel: Channel, _payload: &str) -> Result<(), StoreError> {
        Ok(())
    }

    fn changes(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        self.changes
            .get_or_init(|| super::watch::watch(&self.file))
            .clone()
    }

    async fn listen(&self, _direct_url: Option<&str>) -> Result<Box<dyn Listener>, StoreError> {
        Err(StoreError::Schema(
            "SQLite has no notifications to listen for".into(),
        ))
    }
}
