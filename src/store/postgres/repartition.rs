//! PostgreSQL: `outboxd repartition` and the parking of rows with unknown
//! labels (see [`crate::store::repartition`] for the argument). The outbox
//! is locked against inserts with `LOCK TABLE … IN SHARE ROW EXCLUSIVE
//! MODE`; `<outbox>_enqueue()` and the insert trigger take their `ROW
//! EXCLUSIVE` lock before they read the bucket count. The flow is
//! [`crate::store::repartition::flow`]; here are its statements.

use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::{Relabel, RepartitionSql, SUMMARY_COLUMNS};

/// Labels are computed once per distinct key, not once per row: the CRC
/// in SQL is the expensive part.
const KEYS: &str = "WITH keys AS (
    SELECT message_key, {outbox}_partition_for(message_key) AS label
    FROM (SELECT DISTINCT message_key FROM {outbox} WHERE published_at IS NULL) k
)";

pub(crate) fn statements(t: &Tables) -> RepartitionSql {
    let sql = |s: &str| Sql::render(t, s);
    RepartitionSql {
        settings: sql("SELECT partition_count FROM {outbox}_settings FOR UPDATE"),
        count: sql("SELECT partition_count FROM {outbox}_settings"),
        hold_producers: Some(sql("LOCK TABLE {outbox} IN SHARE ROW EXCLUSIVE MODE")),
        set_count: sql("UPDATE {outbox}_settings SET partition_count = $1"),
        relabel: Relabel::InSql {
            unpublished: sql("SELECT count(*) FROM {outbox} WHERE published_at IS NULL"),
            count_moved: sql(&format!(
                "{KEYS} SELECT count(*) FROM {{outbox}} o JOIN keys USING (message_key)
                 WHERE o.published_at IS NULL AND o.partition_key <> keys.label"
            )),
            relabel: sql(&format!(
                "{KEYS} UPDATE {{outbox}} o SET partition_key = keys.label
                 FROM keys
                 WHERE o.message_key = keys.message_key AND o.published_at IS NULL
                   AND o.partition_key <> keys.label"
            )),
        },
        next_epoch: sql("SELECT coalesce(max(lease_epoch), 0) + 1 FROM {partitions}"),
        drop_buckets: sql("DELETE FROM {partitions} WHERE partition_key <> ALL($1::text[])"),
        reset_buckets: sql(
            "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL,
                    claim_token = NULL, claimed_until = NULL,
                    lease_epoch = lease_epoch + 1, updated_at = now()",
        ),
        add_buckets: sql("INSERT INTO {partitions} (partition_key, lease_epoch)
             SELECT l, $1 FROM unnest($2::text[]) l
             ON CONFLICT (partition_key) DO NOTHING"),
        audit: sql("INSERT INTO {outbox}_audit (actor, action, detail)
             VALUES ($1, 'repartition', $2::jsonb)"),
        known: sql("SELECT partition_key FROM {partitions} ORDER BY partition_key"),
        strays: sql("SELECT id, partition_key, message_key FROM {outbox}
             WHERE ({gaps}) AND published_at IS NULL AND failed_at IS NULL
             ORDER BY id FOR UPDATE"),
        park: sql("UPDATE {outbox} SET failed_at = now(), last_error = $1 WHERE id = $2"),
        // A range of the pending index (see `CLAIM` in `super::outbox` for
        // the `BETWEEN`).
        pending_up_to: sql(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
             WHERE o.partition_key BETWEEN $1 AND $1
               AND o.published_at IS NULL AND o.failed_at IS NULL AND o.id <= $2
             ORDER BY o.partition_key, o.id"
        )),
        record_stored: sql("UPDATE {outbox} SET published_at = now()
             WHERE id = ANY($1) AND published_at IS NULL AND failed_at IS NULL"),
        delete_stored: sql("DELETE FROM {outbox}
             WHERE id = ANY($1) AND published_at IS NULL AND failed_at IS NULL"),
    }
}
