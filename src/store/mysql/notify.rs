//! MySQL/MariaDB: no notifications (see [`crate::store::notify`]); workers
//! poll adaptively instead ([`crate::relay::wakeups`]).

use async_trait::async_trait;

use super::MySqlBackend;
use crate::store::error::StoreError;
use crate::store::notify::{Channel, Listener, NotifyStore};

#[async_trait]
impl NotifyStore for MySqlBackend {
    fn has_notifications(&self) -> bool {
        false
    }

    async fn notify(&self, _channel: Channel, _payload: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn listen(&self, _direct_url: Option<&str>) -> Result<Box<dyn Listener>, StoreError> {
        Err(StoreError::Schema(
            "MySQL/MariaDB has no notifications to listen for".into(),
        ))
    }
}
