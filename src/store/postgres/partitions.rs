//! PostgreSQL: the `outbox_partitions` table's statements (see
//! [`crate::store::partitions`] for what they promise). Lease changes run
//! as the steps of [`crate::store::stepwise::leases`] (statements in
//! [`super::steps`]); here: the bucket overview's lines and the
//! partitions table's reads.

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
                "SELECT p.partition_key, p.lease_owner, p.lease_epoch,
                        extract(epoch FROM p.lease_until - now())::float8 AS lease_ttl_seconds,
                        h.id AS head_id,
                        coalesce(extract(epoch FROM now() - h.created_at)::float8, 0) AS lag_seconds,
                        h.attempts AS head_attempts,
                        CASE WHEN h.attempts > 0 THEN h.last_error END AS head_error,
                        CASE WHEN h.attempts > 0 THEN h.available_at END AS head_retry_at
                 FROM {partitions} p
                 LEFT JOIN LATERAL (SELECT id, created_at, attempts, last_error, available_at
                     FROM {outbox} o
                     WHERE o.partition_key BETWEEN p.partition_key AND p.partition_key
                       AND o.published_at IS NULL AND o.failed_at IS NULL
                     ORDER BY o.partition_key, o.id LIMIT 1) h ON true
                 ORDER BY p.partition_key",
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
                    coalesce(lease_until > now(), false) AS valid
             FROM {partitions} ORDER BY partition_key",
        ),
        events_since: Sql::render(
            t,
            "SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
             FROM {outbox}_lease_events WHERE id > $1 ORDER BY id LIMIT $2",
        ),
        events_within: Sql::render(
            t,
            "SELECT * FROM (
                SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
                FROM {outbox}_lease_events
                WHERE at > now() - make_interval(secs => $1::float8 / 1000.0)
                ORDER BY at DESC, id DESC LIMIT $2
             ) recent ORDER BY id",
        ),
    }
}
