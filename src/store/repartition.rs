//! Changing the bucket count of a deployment (`outboxd repartition`), and
//! parking rows whose bucket label this deployment does not have.
//!
//! Per-key order survives a change of bucket count because all pending
//! rows of one key carry one label before the change and one label after
//! it, and a bucket is drained in `id` order whatever rows it holds. What
//! must not happen is a row labelled under the old count after the change
//! (a producer transaction that computed its label before the change and
//! commits after it) or a worker draining under the old count. So
//! [`repartition`] runs in one transaction that
//!
//! 1. takes the registration lock and refuses while any worker is live, so
//!    no worker drains during the change and none can join in the middle;
//! 2. locks the outbox table in `SHARE ROW EXCLUSIVE` mode: it waits for the
//!    producer transactions in flight to commit, and holds new inserts
//!    (reads go on) until the change commits — producers wait, they do not
//!    fail;
//! 3. records the new count (which `<outbox>_partition_for()` and so
//!    `<outbox>_enqueue()` read), re-labels every unpublished row, pending
//!    and parked, from its message key, and drops every claim;
//! 4. replaces the bucket rows: removed buckets go, new ones come, every
//!    lease is cleared and every epoch bumped, so a write of any earlier
//!    lease holder matches no row;
//! 5. writes an audit record.
//!
//! Workers started afterwards with the old count refuse to start, and a
//! worker that somehow outlived the change (a stopped process that
//! resumes) stops when its maintenance task sees the new count.

use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::{DbPool, QueryContext, StoreError, Tables, Tx, render};

/// What [`repartition`] did, or (dry run) would do.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RepartitionReport {
    pub from: u32,
    pub to: u32,
    /// Unpublished rows (pending and parked).
    pub unpublished: i64,
    /// Unpublished rows whose label changes.
    pub relabelled: i64,
}

/// Why a repartition did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RepartitionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "{0} worker(s) are live: {1}. Stop every `outboxd work` first (their rows disappear on a clean exit, or when the heartbeat expires)"
    )]
    WorkersLive(usize, String),
    #[error("the database has no recorded partition_count: run `outboxd migrate` first")]
    NotMigrated,
}

/// Changes the bucket count to `to` (see the module docs). `dry_run`
/// counts what would change and changes nothing. `actor` goes to the
/// audit record.
pub async fn repartition(
    pool: &DbPool,
    tables: &Tables,
    to: u32,
    dry_run: bool,
    actor: &str,
) -> Result<RepartitionReport, RepartitionError> {
    let sql = |template: &str| AssertSqlSafe(render(&tables.names, template));
    let mut tx = pool
        .begin()
        .await
        .doing("starting the repartition transaction")?;

    tables.workers.lock_registrations(&mut tx).await?;
    let live = tables.workers.live_others(&mut tx, Uuid::nil()).await?;
    if !live.is_empty() {
        let list = live
            .iter()
            .map(|w| {
                format!(
                    "{} pid {} on {} ({}, heartbeat expires in {:.0}s)",
                    w.worker_id, w.pid, w.hostname, w.mode, w.expires_in
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(RepartitionError::WorkersLive(live.len(), list));
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

/// A row parked because its bucket does not exist in this deployment.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ParkedUnknown {
    pub id: i64,
    pub partition_key: String,
}

/// Parks every pending row whose label is not one of this deployment's
/// buckets (a producer that computed labels with another bucket count, or
/// wrote one by hand): no worker would ever drain it, so it is made visible
/// instead, with an error that says what is wrong and what the label should
/// be. `outboxd failed requeue` re-labels such a row.
///
/// Finding the labels costs one probe of the pending index per distinct
/// pending label (a skip scan), whatever the number of rows.
pub async fn park_unknown_labels(
    tx: &mut Tx,
    tables: &Tables,
) -> Result<Vec<ParkedUnknown>, StoreError> {
    // Two statements: with the UPDATE in the same statement the planner
    // cannot know the list is (almost always) empty and scans the table.
    let unknown: Vec<String> = sqlx::query_scalar(AssertSqlSafe(render(
        &tables.names,
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
    .fetch_all(&mut *tx)
    .await
    .doing("looking for unknown bucket labels")?;
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(AssertSqlSafe(render(
        &tables.names,
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
    .fetch_all(&mut *tx)
    .await
    .doing("parking rows with unknown bucket labels")
}
