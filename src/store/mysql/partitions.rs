//! MySQL/MariaDB: the `outbox_partitions` table's statements (see
//! [`crate::store::partitions`] for what they promise).
//!
//! Without `UPDATE … RETURNING`, lease changes run as the steps of
//! [`crate::store::stepwise::leases`] (statements in [`super::steps`]): the
//! rows to change read `FOR UPDATE`, changed under those row locks with
//! their lease events in one transaction, so the epoch each acquirer
//! computes (`old + 1`) is the one it writes. Here: the bucket overview's
//! lines and the partitions table's reads.

use super::VIEWS;
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
            overview_lines: Sql::render(
                t,
                &"SELECT p.partition_key, p.lease_owner, p.lease_epoch,
                        TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), p.lease_until) / 1e6
                            AS lease_ttl_seconds,
                        h.id AS head_id,
                        COALESCE(TIMESTAMPDIFF(MICROSECOND, h.created_at, UTC_TIMESTAMP(6)) / 1e6, 0e0)
                            AS lag_seconds,
                        h.attempts AS head_attempts,
                        CASE WHEN h.attempts > 0 THEN h.last_error END AS head_error,
                        CASE WHEN h.attempts > 0 THEN h.available_at END AS head_retry_at
                 FROM {partitions} p
                 LEFT JOIN {outbox} h ON h.id = {head}
                 ORDER BY p.partition_key"
                    .replace("{head}", &VIEWS.head("id")),
            ),
        }
    }
}

/// The partitions table's reads (`store::lookups`), in this backend's SQL.
pub(crate) fn lookups(t: &Tables) -> PartitionLookupsSql {
    PartitionLookupsSql {
        leases: Sql::render(
            t,
            "SELECT partition_key, lease_owner, lease_until, lease_epoch,
                    COALESCE(lease_until > UTC_TIMESTAMP(6), FALSE) AS valid
             FROM {partitions} ORDER BY partition_key",
        ),
        events_since: Sql::render(
            t,
            "SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
             FROM {outbox}_lease_events WHERE id > ? ORDER BY id LIMIT ?",
        ),
        events_within: Sql::render(
            t,
            "SELECT * FROM (
                SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
                FROM {outbox}_lease_events
                WHERE at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
                ORDER BY at DESC, id DESC LIMIT ?
             ) recent ORDER BY id",
        ),
    }
}
