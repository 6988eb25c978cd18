//! PostgreSQL: `outboxd repartition` and the parking of rows with unknown
//! labels (see [`crate::store::repartition`] for the argument). The outbox
//! is locked against inserts with `LOCK TABLE … IN SHARE ROW EXCLUSIVE
//! MODE`; `<outbox>_enqueue()` and the insert trigger take their `ROW
//! EXCLUSIVE` lock before they read the bucket count. The flow is
//! [`crate::store::repartition::flow`]; here are its statements, and the
//! search for unknown labels.

use async_trait::async_trait;
use sqlx::AssertSqlSafe;

use super::PgBackend;
use crate::config::TablesConfig;
use crate::store::repartition::flow;
use crate::store::repartition::{
    ParkedUnknown, RepartitionError, RepartitionReport, RepartitionStore,
};
use crate::store::statements::{Relabel, RepartitionSql};
use crate::store::{QueryContext, Sql, StoreError, render};

/// Labels are computed once per distinct key, not once per row: the CRC
/// in SQL is the expensive part.
const KEYS: &str = "WITH keys AS (
    SELECT message_key, {outbox}_partition_for(message_key) AS label
    FROM (SELECT DISTINCT message_key FROM {outbox} WHERE published_at IS NULL) k
)";

pub(crate) fn statements(t: &TablesConfig) -> RepartitionSql {
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
        park: sql("UPDATE {outbox} SET failed_at = now(), last_error = $1 WHERE id = $2"),
    }
}

#[async_trait]
impl RepartitionStore for PgBackend {
    async fn repartition(
        &self,
        to: u32,
        dry_run: bool,
        actor: &str,
    ) -> Result<RepartitionReport, RepartitionError> {
        flow::repartition(self, to, dry_run, actor).await
    }

    async fn park_unknown_labels(&self) -> Result<Vec<ParkedUnknown>, StoreError> {
        // In a transaction: its two statements stay on one server session
        // behind a transaction pooler.
        let mut tx = self.pool.begin().await.doing("starting a transaction")?;
        // Two statements: with the UPDATE in the same statement the planner
        // cannot know the list is (almost always) empty and scans the table.
        let unknown: Vec<String> = sqlx::query_scalar(AssertSqlSafe(render(
            &self.tables,
            "WITH RECURSIVE labels(l) AS (
                 SELECT min(partition_key) FROM {outbox}
                 WHERE published_at IS NULL AND failed_at IS NULL
               UNION ALL
                 SELECT (SELECT min(partition_key) FROM {outbox}
                         WHERE published_at IS NULL AND failed_at IS NULL AND partition_key > l)
                 FROM labels WHERE l IS NOT NULL
             )
             SELECT l FROM labels
             WHERE l IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM {partitions} p WHERE p.partition_key = l)",
        )))
        .fetch_all(&mut tx)
        .await
        .doing("looking for unknown bucket labels")?;
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let parked = sqlx::query_as(AssertSqlSafe(render(
            &self.tables,
            "UPDATE {outbox} o
             SET failed_at = now(),
                 last_error = format('unknown bucket label %s: this deployment has %s buckets, '
                                     'and key %L belongs to bucket %s; requeue it to re-label it',
                                     o.partition_key, s.partition_count, o.message_key,
                                     {outbox}_partition_for(o.message_key))
             FROM {outbox}_settings s
             WHERE o.partition_key = ANY($1::text[])
               AND o.published_at IS NULL AND o.failed_at IS NULL
             RETURNING o.id, o.partition_key",
        )))
        .bind(&unknown)
        .fetch_all(&mut tx)
        .await
        .doing("parking rows with unknown bucket labels")?;
        tx.commit()
            .await
            .doing("committing the maintenance transaction")?;
        Ok(parked)
    }
}
