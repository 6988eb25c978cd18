//! PostgreSQL: `outboxd repartition` and the parking of rows with unknown
//! labels (see [`crate::store::repartition`] for the argument). The outbox
//! is locked against inserts with `LOCK TABLE … IN SHARE ROW EXCLUSIVE
//! MODE`; `<outbox>_enqueue()` and the insert trigger take their `ROW
//! EXCLUSIVE` lock before they read the bucket count.

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::PgBackend;
use crate::store::driver::Statements;
use crate::store::repartition::{
    ParkedUnknown, RepartitionError, RepartitionReport, RepartitionStore,
};
use crate::store::workers;
use crate::store::{QueryContext, StoreError, render};

#[async_trait]
impl RepartitionStore for PgBackend {
    async fn repartition(
        &self,
        to: u32,
        dry_run: bool,
        actor: &str,
    ) -> Result<RepartitionReport, RepartitionError> {
        let sql = |template: &str| AssertSqlSafe(render(&self.tables, template));
        let mut tx = self
            .pool
            .begin()
            .await
            .doing("starting the repartition transaction")?;

        let lock = &self.workers.lock_registrations;
        Statements::execute(&mut tx, lock, &[], "taking the registration lock").await?;
        let live = workers::live_others(&self.workers, &mut tx, Uuid::nil()).await?;
        if !live.is_empty() {
            return Err(RepartitionError::WorkersLive(live));
        }
        let from: i32 = sqlx::query_scalar(sql(
            "SELECT partition_count FROM {outbox}_settings FOR UPDATE",
        ))
        .fetch_optional(&mut tx)
        .await
        .doing("reading partition_count")?
        .ok_or(RepartitionError::NotMigrated)?;

        if !dry_run {
            sqlx::query(sql("LOCK TABLE {outbox} IN SHARE ROW EXCLUSIVE MODE"))
                .execute(&mut tx)
                .await
                .doing("locking the outbox table against producers")?;
        }
        sqlx::query(sql("UPDATE {outbox}_settings SET partition_count = $1"))
            .bind(to as i32)
            .execute(&mut tx)
            .await
            .doing("recording the new partition_count")?;

        let unpublished: i64 = sqlx::query_scalar(sql(
            "SELECT count(*) FROM {outbox} WHERE published_at IS NULL",
        ))
        .fetch_one(&mut tx)
        .await
        .doing("counting unpublished rows")?;
        // The label is computed once per distinct key, not once per row: the
        // CRC in SQL is the expensive part.
        let relabelled = if dry_run {
            sqlx::query_scalar(sql("WITH keys AS (
                     SELECT message_key, {outbox}_partition_for(message_key) AS label
                     FROM (SELECT DISTINCT message_key FROM {outbox} WHERE published_at IS NULL) k
                 )
                 SELECT count(*) FROM {outbox} o JOIN keys USING (message_key)
                 WHERE o.published_at IS NULL AND o.partition_key <> keys.label"))
            .fetch_one(&mut tx)
            .await
            .doing("counting the rows to re-label")?
        } else {
            let moved = sqlx::query(sql("WITH keys AS (
                     SELECT message_key, {outbox}_partition_for(message_key) AS label
                     FROM (SELECT DISTINCT message_key FROM {outbox} WHERE published_at IS NULL) k
                 )
                 UPDATE {outbox} o SET partition_key = keys.label
                 FROM keys
                 WHERE o.message_key = keys.message_key AND o.published_at IS NULL
                   AND o.partition_key <> keys.label"))
            .execute(&mut tx)
            .await
            .doing("re-labelling unpublished rows")?
            .rows_affected();
            moved as i64
        };

        let report = RepartitionReport {
            from: from as u32,
            to,
            unpublished,
            relabelled,
        };
        if dry_run {
            tx.rollback().await.doing("rolling back the dry run")?;
            return Ok(report);
        }

        let labels = crate::partitioner::Partitioner::new(to).labels();
        sqlx::query(sql(
            "WITH top AS (SELECT coalesce(max(lease_epoch), 0) + 1 AS epoch FROM {partitions}),
             gone AS (DELETE FROM {partitions} WHERE partition_key <> ALL($1::text[])),
             kept AS (
                 UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL,
                        claim_token = NULL, claimed_until = NULL,
                        lease_epoch = lease_epoch + 1, updated_at = now()
                 WHERE partition_key = ANY($1::text[])
             )
             INSERT INTO {partitions} (partition_key, lease_epoch)
             SELECT l, top.epoch FROM unnest($1::text[]) l, top
             ON CONFLICT (partition_key) DO NOTHING",
        ))
        .bind(&labels)
        .execute(&mut tx)
        .await
        .doing("replacing the bucket rows")?;
        sqlx::query(sql("INSERT INTO {outbox}_audit (actor, action, detail)
             VALUES ($1, 'repartition', jsonb_build_object('from', $2::int, 'to', $3::int,
                     'unpublished', $4::bigint, 'relabelled', $5::bigint))"))
        .bind(actor)
        .bind(from)
        .bind(to as i32)
        .bind(unpublished)
        .bind(relabelled)
        .execute(&mut tx)
        .await
        .doing("recording the audit entry")?;
        tx.commit().await.doing("committing the repartition")?;
        Ok(report)
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
