//! MySQL/MariaDB: the `outbox` table's statements (see
//! [`crate::store::outbox`] for what they promise, and [`super`] for how
//! this backend keeps it).
//!
//! The claim is at most two statements: a consistent read of the bucket's
//! first rows from the pending index (no locks), with whether the caller
//! already holds the bucket's claim (its token, at least the claim's
//! `min_left`, and in fleet mode its valid lease) — then the rows read are
//! the batch and nothing is written; otherwise, when a ready prefix exists,
//! one `UPDATE` of the bucket's row that takes the claim under the lease
//! fence; the claim is the caller's only if that `UPDATE` matched. The
//! records are single-table `UPDATE`s whose `WHERE` checks the claim token
//! and the fence on the bucket's row (`EXISTS`) in the same statement.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{MySql, MySqlExecutor};

use super::{MySqlBackend, VIEWS, micros, placeholders};
use crate::config::TablesConfig;
use crate::store::driver::BoundTx;
use crate::store::outbox::{
    Claim, ClaimedMessage, Failure, FailureRecord, Holder, Message, MessageState, MessageSummary,
    OutboxStore, Published,
};
use crate::store::statements::{BucketReadsSql, fleet_fingerprinted, pending_fingerprinted};
use crate::store::views;
use crate::store::{Bounded, Bounds, QueryContext, Sql, StoreError, bounded_op, render};

/// The condition every write of a drainer carries (see the PostgreSQL
/// backend): the bucket's claim is this drainer's and, in fleet mode, the
/// lease is the one it drains under. Parameters: bucket, token, owner,
/// owner, epoch.
const HELD_CLAIM: &str = "EXISTS (
        SELECT 1 FROM {partitions} p
        WHERE p.partition_key = ? AND p.claim_token = ?
          AND (? IS NULL OR (p.lease_owner = ? AND p.lease_epoch = ?)))";

/// A claimed row as read, with whether it is ready.
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
    claim_read: String,
    take_claim: Sql,
}

impl OutboxSql {
    pub fn new(t: &TablesConfig) -> Self {
        // The read half of a claim: the bucket's first unpublished,
        // unparked rows in id order, from the pending index (forced: the
        // primary key would walk every published row of every bucket),
        // each with whether the caller's token holds the bucket's claim
        // with at least the given time left (and, in fleet mode, under
        // its valid lease): then nothing needs writing. Parameters:
        // token, time left (µs), owner, owner, epoch, bucket, bucket.
        let claim_read = render(
            t,
            "SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                    headers, content_type, payload, attempts, created_at,
                    available_at > UTC_TIMESTAMP(6) AS not_ready,
                    (SELECT p.claim_token = ?
                            AND p.claimed_until > UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
                            AND (? IS NULL OR (p.lease_owner = ? AND p.lease_epoch = ?
                                               AND p.lease_until > UTC_TIMESTAMP(6)))
                     FROM {partitions} p WHERE p.partition_key = ?) AS held
             FROM {outbox} FORCE INDEX ({outbox}_pending_idx)
             WHERE partition_key = ? AND published_at IS NULL AND failed_at IS NULL",
        );
        Self {
            tables: t.clone(),
            enqueue: enqueue_statement(t),
            claim_read,
            // Takes (or renews) the bucket's claim, only if no other live
            // claim holds it and (fleet mode) the lease is the caller's and
            // valid. A claim lasting longer than the claim TTL was not made
            // by any worker and is ignored.
            take_claim: Sql::render(
                t,
                "UPDATE {partitions}
                 SET claim_token = ?, claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
                 WHERE partition_key = ?
                   AND (claim_token IS NULL OR claim_token = ? OR claimed_until <= UTC_TIMESTAMP(6)
                        OR claimed_until > UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
                   AND (? IS NULL OR (lease_owner = ? AND lease_epoch = ?
                                      AND lease_until > UTC_TIMESTAMP(6)))",
            ),
        }
    }

    /// The claim's read, for diagnostics.
    pub fn claim_statement(&self) -> &str {
        &self.claim_read
    }

    fn sql(&self, template: &str) -> String {
        render(&self.tables, template)
    }

    async fn record_published<'e, E: MySqlExecutor<'e>>(
        &self,
        bounds: &Bounds,
        exec: E,
        h: Holder<'_>,
        ids: &[i64],
    ) -> Result<u64, StoreError> {
        let write = match h.published {
            Published::Kept => "UPDATE {outbox} SET published_at = UTC_TIMESTAMP(6)",
            Published::Deleted => "DELETE FROM {outbox}",
        };
        let sql = self.sql(&format!(
            "{write}
             WHERE id IN ({}) AND partition_key = ? AND published_at IS NULL AND {HELD_CLAIM}",
            placeholders(ids.len())
        ));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in ids {
            q = q.bind(id);
        }
        let q = bind_holder(q.bind(h.partition_key), h);
        Ok(q.execute(exec)
            .bounded(bounds, "recording published rows")
            .await?
            .rows_affected())
    }
}

/// Binds the parameters of [`HELD_CLAIM`].
fn bind_holder<'q>(
    q: sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>,
    h: Holder<'q>,
) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
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
    Sql::render(
        t,
        "INSERT INTO {outbox} (message_key, exchange, routing_key, payload, headers, content_type)
         VALUES (?, ?, ?, ?, ?, ?)",
    )
}

/// Enqueues one message with `sql` (from [`enqueue_statement`]) on `exec`;
/// returns its id.
pub(crate) async fn enqueue<'e, E: MySqlExecutor<'e>>(
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
    Ok(done.last_insert_id() as i64)
}

/// The lock rows of `<outbox>_locks` (see the module docs of [`super`]).
pub(crate) const PURGE_LOCK: &str = "purge";

#[async_trait]
impl OutboxStore for MySqlBackend {
    async fn enqueue(&self, message: &Message) -> Result<i64, StoreError> {
        enqueue(&self.outbox.enqueue, &self.pool, &self.bounds, message).await
    }

    async fn claim(&self, c: Claim<'_>) -> Result<Vec<ClaimedMessage>, StoreError> {
        bounded_op(&self.bounds, "claiming a batch", async {
            // Rows still in flight from the previous batch are skipped, never
            // a row behind them (a lower id that committed late is taken).
            let sql = if c.in_flight.is_empty() {
                format!("{} ORDER BY id LIMIT ?", self.outbox.claim_read)
            } else {
                format!(
                    "{} AND id NOT IN ({}) ORDER BY id LIMIT ?",
                    self.outbox.claim_read,
                    placeholders(c.in_flight.len())
                )
            };
            let (ttl, fence) = (micros(c.claim_ttl), c.holder.fence);
            let owner = fence.map(|f| f.owner);
            let mut read = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(c.holder.token.0)
                .bind(micros(c.min_left))
                .bind(owner)
                .bind(owner)
                .bind(fence.map(|f| f.epoch))
                .bind(c.holder.partition_key)
                .bind(c.holder.partition_key);
            for id in c.in_flight {
                read = read.bind(id);
            }
            // Both statements on one connection, so the claim is taken on
            // the server that was read.
            let (mut conn, _lent) = self.pool.acquire().await.doing("claiming a batch")?;
            let rows: Vec<Candidate> = read
                .bind(i64::from(c.limit))
                .fetch_all(&mut *conn)
                .await
                .doing("claiming a batch")?;
            // The ready prefix: a head waiting for its retry stops it.
            let held = rows.first().is_some_and(|r| r.held == Some(true));
            let ready: Vec<ClaimedMessage> = rows
                .into_iter()
                .take_while(|r| !r.not_ready)
                .map(|r| r.row)
                .collect();
            if ready.is_empty() || held {
                return Ok(ready);
            }
            let taken = sqlx::query(self.outbox.take_claim.q())
                .bind(c.holder.token.0)
                .bind(ttl)
                .bind(c.holder.partition_key)
                .bind(c.holder.token.0)
                .bind(ttl)
                .bind(owner)
                .bind(owner)
                .bind(fence.map(|f| f.epoch))
                .execute(&mut *conn)
                .await
                .doing("claiming a batch")?
                .rows_affected();
            Ok(if taken == 1 { ready } else { Vec::new() })
        })
        .await
    }

    async fn record_published(&self, holder: Holder<'_>, ids: &[i64]) -> Result<u64, StoreError> {
        self.outbox
            .record_published(&self.bounds, &self.pool, holder, ids)
            .await
    }

    async fn record_failure(
        &self,
        holder: Holder<'_>,
        confirmed: &[i64],
        failure: Option<Failure<'_>>,
    ) -> Result<FailureRecord, StoreError> {
        bounded_op(&self.bounds, "recording a failed publish", async {
            let tx = self.pool.begin().await.doing("starting a transaction")?;
            let mut tx = BoundTx::lent(tx, &self.bounds);
            let published = if confirmed.is_empty() {
                0
            } else {
                self.outbox
                    .record_published(&self.bounds, &mut *tx, holder, confirmed)
                    .await?
            };
            let parked = match failure {
                Some(f) => record_one_failure(&self.outbox, &mut tx, holder, f).await?,
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
        bounded_op(&self.bounds, "purging published rows", async {
            let (mut tx, _lent) = self.pool.begin().await.doing("starting a transaction")?;
            // Only whoever holds the purge lock purges; the others skip.
            let locked: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(
                self.outbox
                    .sql("SELECT name FROM {outbox}_locks WHERE name = ? FOR UPDATE SKIP LOCKED"),
            ))
            .bind(PURGE_LOCK)
            .fetch_optional(&mut *tx)
            .await
            .doing("taking the purge lock")?;
            if locked.is_none() {
                return Ok(0);
            }
            // Oldest ids first: they are the published ones.
            let n = sqlx::query(sqlx::AssertSqlSafe(self.outbox.sql(
                "DELETE FROM {outbox}
                 WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
                 ORDER BY id LIMIT ?",
            )))
            .bind(micros(older_than))
            .bind(limit)
            .execute(&mut *tx)
            .await
            .doing("purging published rows")?
            .rows_affected();
            tx.commit().await.doing("committing the purge")?;
            Ok(n)
        })
        .await
    }

    /// `ANALYZE TABLE` (fresh statistics for the optimizer). InnoDB's purge
    /// thread removes the deleted rows' index entries by itself; a rebuild
    /// (`OPTIMIZE TABLE`) is not worth its cost here.
    async fn tidy_after_purge(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(
            self.outbox.sql("ANALYZE TABLE {outbox}"),
        ))
        .execute(&self.pool)
        .await
        .doing("analyzing the outbox table")?;
        Ok(())
    }
}

/// Records a failed attempt at one row (in the caller's transaction):
/// `attempts + 1`, `last_error`, `available_at` pushed back, maybe parked.
/// `None` when the row no longer matched (claim or lease lost).
async fn record_one_failure(
    sql: &OutboxSql,
    tx: &mut BoundTx<MySql>,
    h: Holder<'_>,
    f: Failure<'_>,
) -> Result<Option<bool>, StoreError> {
    // MySQL assigns left to right, each assignment seeing the ones before:
    // the backoff and the parking use the attempt count before this
    // failure, so `attempts` is assigned last. Backoff doubles per attempt
    // from the initial delay, capped.
    let update = sql.sql(&format!(
        "UPDATE {{outbox}}
         SET available_at = UTC_TIMESTAMP(6) + INTERVAL
                 CAST(LEAST(?, ? * POW(2, LEAST(attempts, 30))) * 1000 AS SIGNED) MICROSECOND,
             failed_at = CASE WHEN ? AND ? > 0 AND attempts + 1 >= ? THEN UTC_TIMESTAMP(6) END,
             last_error = ?,
             attempts = attempts + 1
         WHERE id = ? AND partition_key = ? AND published_at IS NULL AND {HELD_CLAIM}"
    ));
    let max_attempts = f.policy.max_attempts as i64;
    let q = sqlx::query(sqlx::AssertSqlSafe(update))
        .bind(f.policy.backoff_max_ms)
        .bind(f.policy.backoff_initial_ms)
        .bind(f.policy.may_park)
        .bind(max_attempts)
        .bind(max_attempts)
        .bind(f.error)
        .bind(f.id)
        .bind(h.partition_key);
    let matched = bind_holder(q, h)
        .execute(&mut **tx)
        .await
        .doing("recording a failed publish")?
        .rows_affected();
    if matched == 0 {
        return Ok(None);
    }
    let parked: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(
        sql.sql("SELECT failed_at IS NOT NULL FROM {outbox} WHERE id = ?"),
    ))
    .bind(f.id)
    .fetch_one(&mut **tx)
    .await
    .doing("recording a failed publish")?;
    Ok(Some(parked))
}

/// The workers table's fingerprint (`statements::fleet_fingerprinted`):
/// its row count and a sum of checksums of each row's id, `can_publish`
/// and whether it is near (`LateWatch`: two durations in microseconds).
const WORKERS_FINGERPRINT: &str = "SELECT CAST(CONCAT(COUNT(*), ':',
                COALESCE(SUM(CRC32(CONCAT(HEX(worker_id), can_publish,
                    heartbeat_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
                    OR heartbeat_until < UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND))), 0)) AS CHAR)
            FROM {workers}";

/// The reads across buckets (`store::lookups`), in MySQL's SQL: the listed
/// buckets found by primary key (`JSON_TABLE` joined first), one probe of
/// the pending index each for its head.
pub(crate) fn bucket_reads(t: &TablesConfig) -> BucketReadsSql {
    let sql = |s: &str| {
        let s = s
            .replace("{labels}", super::steps::LABELS)
            .replace("{head.id}", &VIEWS.head("id"))
            .replace("{head.available_at}", &VIEWS.head("available_at"));
        Sql::render(t, &s)
    };
    let ready_buckets = sql("SELECT p.partition_key
             FROM {labels} STRAIGHT_JOIN {partitions} p ON p.partition_key = j.v
             WHERE {head.available_at} <= UTC_TIMESTAMP(6)");
    let fingerprint = sql(WORKERS_FINGERPRINT);
    let pending = sql("SELECT j.v FROM {labels}
             STRAIGHT_JOIN {outbox} o FORCE INDEX ({outbox}_pending_idx)
                 ON o.partition_key = j.v AND o.published_at IS NULL AND o.failed_at IS NULL
             LIMIT 1");
    BucketReadsSql {
        ready_and_fleet: fleet_fingerprinted(&ready_buckets, fingerprint.as_str()),
        pending_and_fleet: pending_fingerprinted(pending.as_str(), fingerprint.as_str()),
        ready_buckets,
        bucket_heads: sql(
            "SELECT p.partition_key, h.id, h.created_at, h.attempts, h.last_error,
                    COALESCE(TIMESTAMPDIFF(MICROSECOND, h.created_at, UTC_TIMESTAMP(6)) / 1e6, 0e0)
                        AS lag_seconds
             FROM {labels} STRAIGHT_JOIN {partitions} p ON p.partition_key = j.v
             LEFT JOIN {outbox} h ON h.id = {head.id}
             ORDER BY p.partition_key",
        ),
        count_purgeable: sql("SELECT COUNT(*) FROM {outbox}
             WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"),
    }
}
