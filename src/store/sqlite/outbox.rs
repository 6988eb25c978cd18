//! SQLite: the `outbox` table's statements (see [`crate::store::outbox`]
//! for what they promise, and [`super`] for how this backend keeps it).
//!
//! A claim is a read and at most one write: a read of the bucket's ready
//! prefix together with whether the caller still holds the bucket's claim
//! (no lock; a bucket with nothing ready costs the writer nothing). If it
//! holds it — its token, at least the claim's `min_left`, and (fleet mode)
//! its lease still valid — the rows read are the batch: that is exactly
//! the state the taking `UPDATE` would have checked, read in the same
//! snapshot as the rows, so a trickle costs the writer one record per
//! batch and no claim. Otherwise one `UPDATE` of the bucket's row takes
//! the claim under the lease fence, and, once the claim is the caller's,
//! the ready prefix is read again — no other drainer records in the bucket
//! then, so those rows are its unpublished prefix in id order. Records are
//! single `UPDATE`s whose `WHERE` checks the claim token and the fence on
//! the bucket's row (`EXISTS`) in the same statement.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Sqlite, SqliteExecutor};

use super::driver::millis;
use super::{SqliteBackend, VIEWS, json_list, render, seconds_between, sql};
use crate::config::TablesConfig;
use crate::store::outbox::{
    Claim, ClaimedMessage, Failure, FailureRecord, Holder, Message, MessageState, MessageSummary,
    OutboxStore, Published,
};
use crate::store::statements::{BucketReadsSql, fleet_fingerprinted, pending_fingerprinted};
use crate::store::views;
use crate::store::{Bounded, Bounds, QueryContext, Sql, StoreError, bounded_op};

/// The condition every write of a drainer carries (see the PostgreSQL
/// backend): the bucket's claim is this drainer's and, in fleet mode, the
/// lease is the one it drains under. Parameters: bucket, token, owner,
/// owner, epoch.
const HELD_CLAIM: &str = "EXISTS (
        SELECT 1 FROM {partitions} p
        WHERE p.partition_key = ? AND p.claim_token = ?
          AND (? IS NULL OR (p.lease_owner = ? AND p.lease_epoch = ?)))";

/// Records a batch as published with `write` (an update that sets
/// `published_at`, or a delete): ids (JSON), bucket, then HELD_CLAIM's.
fn record_published(write: &str) -> String {
    format!(
        "{write}
         WHERE id IN (SELECT value FROM json_each(?)) AND partition_key = ?
           AND published_at IS NULL AND {HELD_CLAIM}"
    )
}

/// A claimed row as read, with whether it is ready and whether the
/// reader held the bucket's claim when it read it.
#[derive(sqlx::FromRow)]
struct Candidate {
    #[sqlx(flatten)]
    row: ClaimedMessage,
    not_ready: bool,
    held: Option<bool>,
}

/// The rendered statements of this module.
#[derive(Debug)]
pub struct OutboxSql {
    tables: TablesConfig,
    enqueue: Sql,
    claim_read: Sql,
    take_claim: Sql,
    record_published: Sql,
    delete_published: Sql,
    record_failure: Sql,
}

impl OutboxSql {
    pub fn new(t: &TablesConfig) -> Self {
        Self {
            tables: t.clone(),
            enqueue: enqueue_statement(t),
            // The bucket's first unpublished, unparked rows in id order
            // (the partial pending index), skipping the batch still in
            // flight, each with whether the caller holds the bucket's claim
            // with at least the given time left (take_claim's conditions).
            // Parameters: token, time left (ms), owner, owner, epoch,
            // bucket, then bucket, in-flight ids (JSON), limit.
            claim_read: sql(
                t,
                "SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                        headers, content_type, payload, attempts, created_at,
                        available_at > {now} AS not_ready,
                        (SELECT p.claim_token = ? AND p.claimed_until > {now+?}
                                AND (? IS NULL OR (p.lease_owner = ? AND p.lease_epoch = ?
                                                   AND p.lease_until > {now}))
                         FROM {partitions} p WHERE p.partition_key = ?) AS held
                 FROM {outbox} INDEXED BY {outbox}_pending_idx
                 WHERE partition_key = ? AND published_at IS NULL AND failed_at IS NULL
                   AND id NOT IN (SELECT value FROM json_each(?))
                 ORDER BY id LIMIT ?",
            ),
            // Takes (or renews) the bucket's claim, only if no other live
            // claim holds it and (fleet mode) the lease is the caller's and
            // valid. A claim lasting longer than the claim TTL was not made
            // by any worker and is ignored. Parameters: token, ttl, bucket,
            // token, ttl, owner, owner, epoch.
            take_claim: sql(
                t,
                "UPDATE {partitions} SET claim_token = ?, claimed_until = {now+?}
                 WHERE partition_key = ?
                   AND (claim_token IS NULL OR claim_token = ? OR claimed_until <= {now}
                        OR claimed_until > {now+?})
                   AND (? IS NULL OR (lease_owner = ? AND lease_epoch = ?
                                      AND lease_until > {now}))",
            ),
            // Parameters: ids (JSON), bucket, then HELD_CLAIM's.
            record_published: sql(
                t,
                &record_published("UPDATE {outbox} SET published_at = {now}"),
            ),
            delete_published: sql(t, &record_published("DELETE FROM {outbox}")),
            // SQLite's SET expressions all see the row as it was, so the
            // backoff and the parking use the attempt count before this
            // failure. Backoff doubles per attempt from the initial delay,
            // capped. Parameters: backoff max ms, backoff initial ms,
            // may park, max attempts, max attempts, error, id, bucket, then
            // HELD_CLAIM's.
            record_failure: sql(
                t,
                &format!(
                    "UPDATE {{outbox}}
                     SET available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds',
                             min(?, ? * (1 << min(attempts, 30))) / 1000.0)),
                         failed_at = CASE WHEN ? AND ? > 0 AND attempts + 1 >= ? THEN {{now}} END,
                         last_error = ?,
                         attempts = attempts + 1
                     WHERE id = ? AND partition_key = ? AND published_at IS NULL AND {HELD_CLAIM}
                     RETURNING failed_at IS NOT NULL"
                ),
            ),
        }
    }

    fn sql(&self, template: &str) -> String {
        render(&self.tables, template)
    }

    async fn record_published<'e, E: SqliteExecutor<'e>>(
        &self,
        bounds: &Bounds,
        exec: E,
        h: Holder<'_>,
        ids: &[i64],
    ) -> Result<u64, StoreError> {
        let statement = match h.published {
            Published::Kept => &self.record_published,
            Published::Deleted => &self.delete_published,
        };
        let q = sqlx::query(statement.q())
            .bind(json_list(ids))
            .bind(h.partition_key);
        Ok(bind_holder(q, h)
            .execute(exec)
            .bounded(bounds, "recording published rows")
            .await?
            .rows_affected())
    }
}

type Query<'q> = sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments>;

/// Binds the parameters of [`HELD_CLAIM`].
fn bind_holder<'q>(q: Query<'q>, h: Holder<'q>) -> Query<'q> {
    let owner = h.fence.map(|f| f.owner);
    q.bind(h.partition_key)
        .bind(h.token.0)
        .bind(owner)
        .bind(owner)
        .bind(h.fence.map(|f| f.epoch))
}

/// The plain `INSERT` every producer may use: the table's trigger computes
/// the bucket label; the message id and the timestamps are the columns'
/// defaults.
pub(crate) fn enqueue_statement(t: &TablesConfig) -> Sql {
    sql(
        t,
        "INSERT INTO {outbox} (message_key, exchange, routing_key, payload, headers, content_type)
         VALUES (?, ?, ?, ?, ?, ?)",
    )
}

/// Enqueues one message with `sql` (from [`enqueue_statement`]) on `exec`;
/// returns its id.
pub(crate) async fn enqueue<'e, E: SqliteExecutor<'e>>(
    sql: &Sql,
    exec: E,
    bounds: &Bounds,
    m: &Message,
) -> Result<i64, StoreError> {
    let done = sqlx::query(sql.q())
        .bind(&m.message_key)
        .bind(&m.exchange)
        .bind(&m.routing_key)
        .bind(&m.payload)
        .bind(&m.headers)
        .bind(m.content_type.as_deref())
        .execute(exec)
        .bounded(bounds, "enqueueing a message")
        .await?;
    Ok(done.last_insert_rowid())
}

#[async_trait]
impl OutboxStore for SqliteBackend {
    async fn enqueue(&self, message: &Message) -> Result<i64, StoreError> {
        enqueue(&self.outbox.enqueue, &self.writer, &self.bounds, message).await
    }

    async fn claim(&self, c: Claim<'_>) -> Result<Vec<ClaimedMessage>, StoreError> {
        bounded_op(&self.bounds, "claiming a batch", async {
            // A read first (no lock): a bucket with nothing ready costs
            // the writer nothing, and a claim still held is not taken again.
            let (rows, held) = self.ready_prefix(&c, c.limit).await?;
            if rows.is_empty() || held {
                return Ok(rows);
            }
            let (ttl, fence) = (millis(c.claim_ttl), c.holder.fence);
            let owner = fence.map(|f| f.owner);
            let taken = sqlx::query(self.outbox.take_claim.q())
                .bind(c.holder.token.0)
                .bind(ttl)
                .bind(c.holder.partition_key)
                .bind(c.holder.token.0)
                .bind(ttl)
                .bind(owner)
                .bind(owner)
                .bind(fence.map(|f| f.epoch))
                .execute(&self.writer)
                .await
                .doing("claiming a batch")?
                .rows_affected();
            if taken != 1 {
                return Ok(Vec::new());
            }
            // Read again once the claim is ours: no other drainer records
            // in the bucket now, so these rows are its unpublished prefix.
            Ok(self.ready_prefix(&c, c.limit).await?.0)
        })
        .await
    }

    async fn record_published(&self, holder: Holder<'_>, ids: &[i64]) -> Result<u64, StoreError> {
        self.outbox
            .record_published(&self.bounds, &self.writer, holder, ids)
            .await
    }

    async fn record_failure(
        &self,
        holder: Holder<'_>,
        confirmed: &[i64],
        failure: Option<Failure<'_>>,
    ) -> Result<FailureRecord, StoreError> {
        bounded_op(&self.bounds, "recording a failed publish", async {
            let mut tx = self.write().await?;
            let published = if confirmed.is_empty() {
                0
            } else {
                self.outbox
                    .record_published(&self.bounds, &mut *tx, holder, confirmed)
                    .await?
            };
            let parked = match failure {
                Some(f) => {
                    let max_attempts = f.policy.max_attempts as i64;
                    let q = sqlx::query_scalar(self.outbox.record_failure.q())
                        .bind(f.policy.backoff_max_ms)
                        .bind(f.policy.backoff_initial_ms)
                        .bind(f.policy.may_park)
                        .bind(max_attempts)
                        .bind(max_attempts)
                        .bind(f.error)
                        .bind(f.id)
                        .bind(holder.partition_key);
                    let owner = holder.fence.map(|f| f.owner);
                    q.bind(holder.partition_key)
                        .bind(holder.token.0)
                        .bind(owner)
                        .bind(owner)
                        .bind(holder.fence.map(|f| f.epoch))
                        .fetch_optional(&mut *tx)
                        .await
                        .doing("recording a failed publish")?
                }
                None => None,
            };
            tx.commit().await.doing("committing a failure")?;
            Ok(FailureRecord { published, parked })
        })
        .await
    }

    async fn list_messages(
        &self,
        state: MessageState,
        message_key: Option<&str>,
        cursor: Option<i64>,
        limit: i64,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let t = &self.tables;
        views::list_messages(self, t, VIEWS, state, message_key, cursor, limit).await
    }

    async fn purge_batch(&self, older_than: Duration, limit: i64) -> Result<u64, StoreError> {
        // One writer at a time: purges by several workers take turns.
        sqlx::query(sqlx::AssertSqlSafe(self.outbox.sql(
            "DELETE FROM {outbox} WHERE id IN (
                 SELECT id FROM {outbox} INDEXED BY {outbox}_published_idx
                 WHERE published_at IS NOT NULL
                   AND published_at < strftime('%Y-%m-%d %H:%M:%f', 'now',
                                               printf('%+.3f seconds', -? / 1000.0))
                 ORDER BY published_at LIMIT ?)",
        )))
        .bind(millis(older_than))
        .bind(limit)
        .execute(&self.writer)
        .bounded(&self.bounds, "purging published rows")
        .await
        .map(|done| done.rows_affected())
    }

    /// `PRAGMA optimize` (fresh statistics where they matter) and a WAL
    /// checkpoint; the freed pages are reused by later inserts (a `VACUUM`
    /// would rewrite the whole file under the write lock).
    async fn tidy_after_purge(&self) -> Result<(), StoreError> {
        sqlx::raw_sql("PRAGMA optimize; PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&self.writer)
            .await
            .doing("tidying the database file")?;
        Ok(())
    }
}

impl SqliteBackend {
    /// The ready prefix of the claimed bucket's first `limit` pending rows
    /// not in flight (a head waiting for its retry stops it), read on a
    /// reader connection; and whether the caller held the bucket's claim,
    /// with at least the claim's `min_left` left, as it read them.
    async fn ready_prefix(
        &self,
        c: &Claim<'_>,
        limit: u32,
    ) -> Result<(Vec<ClaimedMessage>, bool), StoreError> {
        let owner = c.holder.fence.map(|f| f.owner);
        let rows: Vec<Candidate> = sqlx::query_as(self.outbox.claim_read.q())
            .bind(c.holder.token.0)
            .bind(millis(c.min_left))
            .bind(owner)
            .bind(owner)
            .bind(c.holder.fence.map(|f| f.epoch))
            .bind(c.holder.partition_key)
            .bind(c.holder.partition_key)
            .bind(json_list(c.in_flight))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .doing("claiming a batch")?;
        let held = rows.first().is_some_and(|r| r.held == Some(true));
        let ready = rows
            .into_iter()
            .take_while(|r| !r.not_ready)
            .map(|r| r.row)
            .collect();
        Ok((ready, held))
    }
}

/// The workers table's fingerprint (`statements::fleet_fingerprinted`):
/// its row count and every row's id, `can_publish` and whether it is near
/// (`LateWatch`: two durations in milliseconds), in id order (no
/// hash function in SQLite; the table is local, the text never crosses a
/// network).
const WORKERS_FINGERPRINT: &str =
    "SELECT count(*) || ':' || coalesce(group_concat(hex(worker_id) || can_publish || near, ','), '')
            FROM (SELECT worker_id, can_publish,
                         heartbeat_at < strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', -? / 1000.0))
                         OR heartbeat_until < {now+?} AS near
                  FROM {workers} ORDER BY worker_id)";

/// The reads across buckets (`store::lookups`), in SQLite's SQL.
pub(crate) fn bucket_reads(t: &TablesConfig) -> BucketReadsSql {
    let ready_buckets = sql(
        t,
        &"SELECT p.partition_key FROM {partitions} p
             WHERE p.partition_key IN (SELECT value FROM json_each(?))
               AND {head.available_at} <= {now}"
            .replace("{head.available_at}", &VIEWS.head("available_at")),
    );
    let fingerprint = render(t, WORKERS_FINGERPRINT);
    let pending = render(
        t,
        "SELECT o.partition_key FROM {outbox} o
             WHERE o.partition_key IN (SELECT value FROM json_each(?))
               AND o.published_at IS NULL AND o.failed_at IS NULL
             LIMIT 1",
    );
    BucketReadsSql {
        ready_and_fleet: fleet_fingerprinted(&ready_buckets, &fingerprint),
        pending_and_fleet: pending_fingerprinted(&pending, &fingerprint),
        ready_buckets,
        bucket_heads: sql(
            t,
            &format!(
                "SELECT p.partition_key, h.id, h.created_at, h.attempts, h.last_error,
                        COALESCE({}, 0.0) AS lag_seconds
                 FROM {{partitions}} p
                 LEFT JOIN {{outbox}} h ON h.id = {head}
                 WHERE p.partition_key IN (SELECT value FROM json_each(?))
                 ORDER BY p.partition_key",
                seconds_between("h.created_at", "{now}"),
                head = VIEWS.head("id"),
            ),
        ),
        count_purgeable: sql(
            t,
            "SELECT COUNT(*) FROM {outbox}
             WHERE published_at IS NOT NULL
               AND published_at < strftime('%Y-%m-%d %H:%M:%f', 'now',
                                           printf('%+.3f seconds', -? / 1000.0))",
        ),
    }
}
