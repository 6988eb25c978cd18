//! SQLite: no notifications (see [`crate::store::notify`]); workers poll
//! adaptively instead ([`crate::relay::wakeups`]).

use async_trait::async_trait;

use super::SqliteBackend;
use crate::store::StoreError;
use crate::store::notify::{Channel, Listener, NotifyStore};

#[async_trait]
impl NotifyStore for SqliteBackend {
    fn has_notifications(&self) -> bool {
        false
    }

    async fn notify(&self, _channel: Channel, _payload: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn listen(&self, _direct_url: Option<&str>) -> Result<Box<dyn Listener>, StoreError> {
        Err(StoreError::Schema(
            "SQLite has no notifications to listen for".into(),
        ))
    }
}
