//! The `outbox_partitions` table: one row per bucket, carrying its lease —
//! the types and the interface every backend implements
//! ([`PartitionStore`]).
//!
//! Each operation changes a lease only under the conditions that make the
//! change safe, checked atomically with the change (in one statement, or
//! under the rows' locks in one transaction):
//!
//! - **acquire** takes a bucket only while it is free or its lease has
//!   expired (`lease_until <= now()`), and bumps `lease_epoch`;
//! - **renew** extends a lease only where owner *and* epoch still match;
//! - **release** frees a lease only where owner and epoch still match
//!   (on shutdown, once no drainer runs: every lease of the owner).
//!
//! Acquire and release write a row to `<outbox>_lease_events` atomically
//! with the change, so every change of owner is on record.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::error::StoreError;

/// A lease this worker just acquired.
#[derive(Debug, Clone)]
pub struct Acquired {
    pub partition_key: String,
    pub lease_epoch: i64,
    /// The lease had no owner (released, or never held); false when an
    /// expired lease was taken over.
    pub was_free: bool,
}

/// One bucket's lease as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LeaseRow {
    pub partition_key: String,
    pub lease_owner: Option<Uuid>,
    pub lease_until: Option<DateTime<Utc>>,
    pub lease_epoch: i64,
    /// Whether `lease_until` is in the future.
    pub valid: bool,
}

/// One bucket as the dashboard shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BucketView {
    pub partition_key: String,
    pub lease_owner: Option<Uuid>,
    pub lease_epoch: i64,
    /// Seconds the lease stays valid (negative: expired).
    pub lease_ttl_seconds: Option<f64>,
    /// Pending rows, counted up to the cap (`pending_capped` when reached).
    pub pending: i64,
    pub pending_capped: bool,
    /// Parked rows, counted up to the cap.
    pub parked: i64,
    pub head_id: Option<i64>,
    /// Age in seconds of the oldest pending row.
    pub lag_seconds: f64,
    pub head_attempts: Option<i32>,
    /// The head's last error while it keeps failing: the bucket is blocked.
    pub head_error: Option<String>,
    pub head_retry_at: Option<DateTime<Utc>>,
    /// Rows a second it published over the last ten seconds (from its
    /// owners' heartbeats; `crate::dashboard::states`).
    pub rate: f64,
    /// Its state in the shared vocabulary (`crate::dashboard::states`).
    pub state: String,
}

/// One recorded lease change.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct LeaseEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub partition_key: String,
    pub action: String,
    pub worker_id: Uuid,
    pub old_owner: Option<Uuid>,
    pub old_epoch: i64,
    pub new_epoch: i64,
    pub reason: String,
}

/// The text of a lease event's reason for an acquisition.
pub(crate) fn acquire_reason(old_owner: Option<Uuid>, reason: &str) -> String {
    match old_owner {
        None => format!("free: {reason}"),
        Some(old) => format!("expired lease of {old}: {reason}"),
    }
}

/// The partitions table, as every backend implements it.
#[async_trait]
pub trait PartitionStore {
    /// Inserts a row for every bucket label that has none.
    async fn ensure_bucket_rows(&self, labels: &[String]) -> Result<u64, StoreError>;

    /// Takes every bucket of `wanted` that is free or whose lease expired.
    async fn acquire(
        &self,
        me: Uuid,
        wanted: &[String],
        ttl: Duration,
        reason: &str,
    ) -> Result<Vec<Acquired>, StoreError>;

    /// Extends the given leases (bucket, epoch) that are still ours; returns
    /// the buckets renewed — any other was lost.
    async fn renew(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        ttl: Duration,
    ) -> Result<Vec<String>, StoreError>;

    /// [`PartitionStore::renew`], and where the backend does both in one
    /// statement (PostgreSQL, MariaDB) also `me`'s heartbeat as
    /// [`WorkerStore::heartbeat`](super::workers::WorkerStore::heartbeat)
    /// pushes it (`heartbeat_at`, `heartbeat_until = now() +
    /// heartbeat_ttl`), without the counts. Returns the buckets renewed and
    /// whether the worker row was beaten: false where the backend does not
    /// (this default) or the row is gone. The heartbeat task skips a beat
    /// that a renewal made and that would write nothing new
    /// ([`crate::coordinator::RenewalBeats`]).
    async fn renew_and_beat(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        ttl: Duration,
        _heartbeat_ttl: Duration,
    ) -> Result<(Vec<String>, bool), StoreError> {
        Ok((self.renew(me, held, ttl).await?, false))
    }

    /// Frees the given leases (bucket, epoch) that are still ours.
    async fn release_leases(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        reason: &str,
    ) -> Result<Vec<String>, StoreError>;

    /// Frees every lease `me` holds, whatever its epoch: on shutdown, when
    /// no drainer of `me` runs any more (so also a lease it took in a
    /// statement whose answer it never saw).
    async fn release_all_leases(&self, me: Uuid, reason: &str) -> Result<Vec<String>, StoreError>;

    /// Every bucket with its lease, capped pending/parked counts and head.
    async fn overview(&self, cap: i64) -> Result<Vec<BucketView>, StoreError>;
}

/// A bucket's lease and head, before the counts are added: what a
/// backend's overview lines statement returns (`store::views::overview`), one row per bucket.
#[derive(sqlx::FromRow)]
pub struct LeaseLine {
    pub(crate) partition_key: String,
    pub(crate) lease_owner: Option<uuid::Uuid>,
    pub(crate) lease_epoch: i64,
    pub(crate) lease_ttl_seconds: Option<f64>,
    pub(crate) head_id: Option<i64>,
    pub(crate) lag_seconds: f64,
    pub(crate) head_attempts: Option<i32>,
    pub(crate) head_error: Option<String>,
    pub(crate) head_retry_at: Option<chrono::DateTime<chrono::Utc>>,
}
