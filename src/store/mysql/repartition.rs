//! MySQL/MariaDB: `outboxd repartition` and the parking of rows with
//! unknown labels (see [`crate::store::repartition`] for the argument).
//!
//! Producers are held back through the settings row: the insert trigger
//! reads `partition_count` with a shared lock, and the repartition locks
//! that row for update first, so it waits for the producer transactions
//! in flight (they hold the shared lock until they commit) and new inserts
//! wait for it. The flow is [`crate::store::repartition::flow`]; here are
//! its statements.

use super::steps::{IDS, LABELS};
use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::{Relabel, RepartitionSql, pending_up_to};

/// Unpublished rows whose label the new count (recorded in this
/// transaction, read by the label function) changes.
const MOVED: &str =
    "WHERE published_at IS NULL AND partition_key <> {outbox}_partition_for(message_key)";

pub(crate) fn statements(t: &Tables) -> RepartitionSql {
    let sql = |s: &str| Sql::render(t, &s.replace("{labels}", LABELS).replace("{ids}", IDS));
    RepartitionSql {
        settings: sql("SELECT partition_count FROM {outbox}_settings FOR UPDATE"),
        count: sql("SELECT partition_count FROM {outbox}_settings"),
        hold_producers: None,
        set_count: sql("UPDATE {outbox}_settings SET partition_count = ?"),
        relabel: Relabel::InSql {
            unpublished: sql("SELECT COUNT(*) FROM {outbox} WHERE published_at IS NULL"),
            count_moved: sql(&format!("SELECT COUNT(*) FROM {{outbox}} {MOVED}")),
            relabel: sql(&format!(
                "UPDATE {{outbox}} SET partition_key = {{outbox}}_partition_for(message_key) {MOVED}"
            )),
        },
        next_epoch: sql("SELECT COALESCE(MAX(lease_epoch), 0) + 1 FROM {partitions}"),
        drop_buckets: sql(
            "DELETE FROM {partitions} WHERE partition_key NOT IN (SELECT j.v FROM {labels})",
        ),
        reset_buckets: sql(
            "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL,
                    claim_token = NULL, claimed_until = NULL,
                    lease_epoch = lease_epoch + 1, updated_at = UTC_TIMESTAMP(6)",
        ),
        add_buckets: sql(
            "INSERT IGNORE INTO {partitions} (partition_key, lease_epoch)
             SELECT j.v, ? FROM {labels}",
        ),
        audit: sql(
            "INSERT INTO {outbox}_audit (actor, action, detail) VALUES (?, 'repartition', ?)",
        ),
        known: sql("SELECT partition_key FROM {partitions} ORDER BY partition_key"),
        strays: sql(
            "SELECT id, partition_key, message_key FROM {outbox} FORCE INDEX ({outbox}_pending_idx)
             WHERE ({gaps}) AND published_at IS NULL AND failed_at IS NULL
             ORDER BY id FOR UPDATE",
        ),
        park: sql("UPDATE {outbox} SET failed_at = UTC_TIMESTAMP(6), last_error = ? WHERE id = ?"),
        pending_up_to: sql(&pending_up_to(super::VIEWS.pending)),
        record_stored: sql("UPDATE {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v
             SET o.published_at = UTC_TIMESTAMP(6)
             WHERE o.published_at IS NULL AND o.failed_at IS NULL"),
        delete_stored: sql("DELETE o FROM {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v
             WHERE o.published_at IS NULL AND o.failed_at IS NULL"),
    }
}
