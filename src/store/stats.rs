//! The `<outbox>_throughput` and `<outbox>_throughput_seconds` tables:
//! published and failed attempts per minute and per second — the types and
//! the interface every backend implements ([`StatsStore`]). Workers add
//! their counts once per tick to both; the dashboard reads the last hour as
//! 60 rows and the last five minutes as 300, never counting the outbox
//! table itself.
//!
//! The flows are written once over the driver contract in
//! [`super::throughput`]: each backend renders
//! [`StatsSql`](super::statements::StatsSql).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::error::StoreError;

/// One minute of throughput.
#[derive(Debug, Clone, Serialize)]
pub struct Minute {
    pub minute: DateTime<Utc>,
    pub published: i64,
    pub failed: i64,
}

/// One second of throughput.
#[derive(Debug, Clone, Serialize)]
pub struct Second {
    pub second: DateTime<Utc>,
    pub published: i64,
    pub failed: i64,
}

/// The throughput tables, as every backend implements them.
#[async_trait]
pub trait StatsStore {
    /// Adds counts to the current minute and second.
    async fn record_throughput(&self, published: u64, failed: u64) -> Result<(), StoreError>;

    /// The last 60 minutes, oldest first, zeros included.
    async fn last_hour(&self) -> Result<Vec<Minute>, StoreError>;

    /// The last 300 seconds, oldest first, zeros included.
    async fn last_minutes(&self) -> Result<Vec<Second>, StoreError>;

    /// Drops minutes older than a week and seconds older than ten minutes.
    async fn prune_throughput(&self) -> Result<u64, StoreError>;
}
