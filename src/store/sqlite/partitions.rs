//! SQLite: the `outbox_partitions` table's statements (see
//! [`crate::store::partitions`] for what they promise).
//!
//! Lease changes run as the steps of [`crate::store::stepwise::leases`]
//! (statements in [`super::steps`]) inside one write transaction (`BEGIN
//! IMMEDIATE`): no other writer runs between the read and the write, so
//! the epoch each acquirer computes (`old + 1`) is the one it writes. Here:
//! the bucket overview's lines and the partitions table's reads.

use super::{VIEWS, seconds_between, sql};
use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::PartitionLookupsSql;

/// The rendered statements of this module.
#[derive(Debug)]
pub struct PartitionsSql {
    /// Every bucket's lease and head, as `views::LeaseLine`.
    pub(crate) overview_lines: Sql,
}

impl PartitionsSql {
    pub fn new(t: &Tables) -> Self {
        Self {
            overview_lines: sql(
                t,
                &format!(
                    "SELECT p.partition_key, p.lease_owner, p.lease_epoch,
                            {ttl} AS lease_ttl_seconds,
                            h.id AS head_id,
                            COALESCE({lag}, 0.0) AS lag_seconds,
                            h.attempts AS head_attempts,
                            CASE WHEN h.attempts > 0 THEN h.last_error END AS head_error,
                            CASE WHEN h.attempts > 0 THEN h.available_at END AS head_retry_at
                     FROM {{partitions}} p
                     LEFT JOIN {{outbox}} h ON h.id = {head}
                     ORDER BY p.partition_key",
                    ttl = seconds_between("{now}", "p.lease_until"),
                    lag = seconds_between("h.created_at", "{now}"),
                    head = VIEWS.head("id"),
                ),
            ),
        }
    }
}

/// The partitions table's reads (`store::lookups`), in this backend's SQL.
pub(crate) fn lookups(t: &Tables) -> PartitionLookupsSql {
    PartitionLookupsSql {
        leases: sql(
            t,
            "SELECT partition_key, lease_owner, lease_until, lease_epoch,
                    COALESCE(lease_until > {now}, 0) AS valid
             FROM {partitions} ORDER BY partition_key",
        ),
        events_since: sql(
            t,
            "SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
             FROM {outbox}_lease_events WHERE id > ? ORDER BY id LIMIT ?",
        ),
        events_within: sql(
            t,
            "SELECT * FROM (
                SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
                FROM {outbox}_lease_events
                WHERE at > strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', -? / 1000.0))
                ORDER BY at DESC, id DESC LIMIT ?
             ) ORDER BY id",
        ),
    }
}
