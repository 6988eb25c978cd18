//! SQLite: `outboxd repartition` and the parking of rows with unknown
//! labels (see [`crate::store::repartition`] for the argument).
//!
//! Producers are held back by the file's write lock: the repartition is one
//! write transaction (`BEGIN IMMEDIATE`), so it starts once the producer
//! transactions in flight have committed, and new inserts wait for it
//! (their busy timeout). New labels are computed by the Rust partitioner,
//! the same function as the insert trigger's SQL. The flow is
//! [`crate::store::repartition::flow`]; here are its statements.

use super::sql;
use crate::store::settings::Tables;
use crate::store::statements::{Relabel, RepartitionSql, pending_up_to};

pub(crate) fn statements(t: &Tables) -> RepartitionSql {
    let sql = |s: &str| sql(t, s);
    RepartitionSql {
        settings: sql("SELECT partition_count FROM {outbox}_settings"),
        count: sql("SELECT partition_count FROM {outbox}_settings"),
        hold_producers: None,
        set_count: sql("UPDATE {outbox}_settings SET partition_count = ?"),
        relabel: Relabel::Here {
            unpublished_rows: sql(
                "SELECT id, partition_key, message_key FROM {outbox} WHERE published_at IS NULL",
            ),
            set_labels: sql(
                "UPDATE {outbox} SET partition_key = json_extract(m.value, '$[0]')
                 FROM json_each(?) m WHERE {outbox}.id = json_extract(m.value, '$[1]')",
            ),
        },
        next_epoch: sql("SELECT COALESCE(MAX(lease_epoch), 0) + 1 FROM {partitions}"),
        drop_buckets: sql(
            "DELETE FROM {partitions} WHERE partition_key NOT IN (SELECT value FROM json_each(?))",
        ),
        reset_buckets: sql(
            "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL,
                    claim_token = NULL, claimed_until = NULL,
                    lease_epoch = lease_epoch + 1, updated_at = {now}",
        ),
        add_buckets: sql(
            "INSERT OR IGNORE INTO {partitions} (partition_key, lease_epoch)
             SELECT l.value, t.e FROM (SELECT ? AS e) t, json_each(?) l",
        ),
        audit: sql(
            "INSERT INTO {outbox}_audit (actor, action, detail) VALUES (?, 'repartition', ?)",
        ),
        known: sql("SELECT partition_key FROM {partitions} ORDER BY partition_key"),
        strays: sql(
            "SELECT id, partition_key, message_key FROM {outbox} INDEXED BY {outbox}_pending_idx
             WHERE ({gaps}) AND published_at IS NULL AND failed_at IS NULL
             ORDER BY id",
        ),
        park: sql("UPDATE {outbox} SET failed_at = {now}, last_error = ? WHERE id = ?"),
        pending_up_to: sql(&pending_up_to(super::VIEWS.pending)),
        record_stored: sql("UPDATE {outbox} SET published_at = {now}
             WHERE id IN (SELECT value FROM json_each(?))
               AND published_at IS NULL AND failed_at IS NULL"),
        delete_stored: sql("DELETE FROM {outbox}
             WHERE id IN (SELECT value FROM json_each(?))
               AND published_at IS NULL AND failed_at IS NULL"),
    }
}
