//! PostgreSQL: the `outbox` table's statements (see [`crate::store::outbox`]
//! for what they promise).
//!
//! The claim is one statement: a CTE reads the bucket's first rows from the
//! pending index, keeps the ready prefix, and takes the claim on the
//! bucket's row with the lease fence; the records check token and fence in
//! an `EXISTS` on that row, in the statement that writes.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::{PgExecutor, Postgres};

use super::{DbPool, PgBackend, is_cancelled};
use crate::config::TablesConfig;
use crate::store::outbox::{
    Claim, ClaimedMessage, Failure, FailureRecord, HeadAction, Holder, Message, MessageState,
    MessageSummary, OutboxStore, ParkedStore, Published,
};
use crate::store::statements::{BucketReadsSql, fleet_fingerprinted, pending_fingerprinted};
use crate::store::{Bounded, Bounds, QueryContext, Sql, StoreError, bounded_op, query_error};

const SUMMARY_COLUMNS: &str =
    "o.id, o.partition_key, o.message_key, o.exchange, o.routing_key, o.message_id,
    o.created_at, o.available_at, o.published_at, o.failed_at, o.attempts, o.last_error,
    octet_length(o.payload) AS payload_bytes";

/// The condition every write of a drainer carries: the bucket's claim is
/// still this drainer's (`$token`), and, in fleet mode, the lease is still
/// the one it drains under (`$owner`, `$epoch`; NULL without leasing). One
/// row of the partitions table holds both.
const HELD_CLAIM: &str = "EXISTS (
        SELECT 1 FROM {partitions} p
        WHERE p.partition_key = $F_KEY AND p.claim_token = $F_TOKEN
          AND ($F_OWNER::uuid IS NULL OR (p.lease_owner = $F_OWNER AND p.lease_epoch = $F_EPOCH)))";

fn held_claim(key: &str, token: &str, owner: &str, epoch: &str) -> String {
    HELD_CLAIM
        .replace("$F_KEY", key)
        .replace("$F_TOKEN", token)
        .replace("$F_OWNER", owner)
        .replace("$F_EPOCH", epoch)
}

/// A page of messages in `state` (a predicate on `o`), newest first below
/// the cursor `$1`, `$2` rows, of the key `$3` when `by_key`.
fn newest_first(state: &str, by_key: bool) -> String {
    let key = if by_key {
        "o.message_key = $3 AND "
    } else {
        ""
    };
    format!(
        "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
         WHERE {key}{state} AND o.id < $1 ORDER BY o.id DESC LIMIT $2"
    )
}

/// The rendered statements of this module.
#[derive(Debug)]
pub struct OutboxSql {
    enqueue: Sql,
    claim: Sql,
    record_published: Sql,
    delete_published: Sql,
    record_failure: Sql,
    list_pending: Sql,
    list_pending_key: Sql,
    list_published: Sql,
    list_published_key: Sql,
    list_failed: Sql,
    list_failed_key: Sql,
    requeue: Sql,
    drop_parked: Sql,
    park_heads: Sql,
    retry_heads: Sql,
    purge_batch: Sql,
}

/// The plan must stay a bounded range scan of the pending index
/// whatever the statistics say, so the statement is written to leave
/// the planner no other good choice: the bucket is a range (`BETWEEN
/// $1 AND $1`), not an equality, and rows are ordered by
/// `(partition_key, id)`: only the pending index yields that order
/// without a sort. With `= $1 ORDER BY id` the planner walked the
/// primary key from the lowest id, reading every published row of
/// every bucket on the way.
///
/// The claim writes nothing into the outbox: it takes (or renews) the
/// bucket's claim on its row in the partitions table, and only if the
/// bucket has ready rows. A claim held under another token blocks the
/// bucket while it lasts; one that outlasts the claim TTL was not
/// made by any worker (written by hand, a clock far off) and is
/// ignored. A claim the caller's token holds with at least $9 ms left
/// (and, in fleet mode, under its valid lease) is `held`: the rows are
/// read under it and nothing is written, so the statement commits no
/// write and waits for no WAL flush. Nobody else can take a live claim,
/// so reading it in the statement's snapshot is enough; the records
/// check the claim and the fence again in the statements that write.
/// Rows still in flight from this drainer's previous batch ($7) are
/// skipped, never a row behind them; a row above the highest of them
/// ($8) skips the array's comparisons.
const CLAIM: &str = "WITH first_rows AS (
            SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                   headers, content_type, payload, attempts, created_at,
                   bool_or(available_at > now()) OVER (ORDER BY partition_key, id) AS blocked
            FROM (
                SELECT * FROM {outbox}
                WHERE partition_key BETWEEN $1 AND $1
                  AND published_at IS NULL AND failed_at IS NULL
                  AND (id > $8 OR id <> ALL($7::bigint[]))
                ORDER BY partition_key, id
                LIMIT $2
            ) head
        ), ready AS (
            SELECT * FROM first_rows WHERE NOT blocked
        ), held AS (
            SELECT 1 FROM {partitions} p
            WHERE p.partition_key = $1 AND p.claim_token = $3
              AND p.claimed_until > now() + make_interval(secs => $9::float8 / 1000)
              AND ($5::uuid IS NULL OR (p.lease_owner = $5 AND p.lease_epoch = $6
                                       AND p.lease_until > now()))
        ), bucket AS (
            UPDATE {partitions} p
            SET claim_token = $3, claimed_until = now() + make_interval(secs => $4::float8 / 1000)
            WHERE p.partition_key = $1 AND EXISTS (SELECT 1 FROM ready)
              AND NOT EXISTS (SELECT 1 FROM held)
              AND (p.claim_token IS NULL OR p.claim_token = $3 OR p.claimed_until <= now()
                   OR p.claimed_until > now() + make_interval(secs => $4::float8 / 1000))
              AND ($5::uuid IS NULL OR (p.lease_owner = $5 AND p.lease_epoch = $6
                                       AND p.lease_until > now()))
            RETURNING 1
        )
        SELECT id, message_id, partition_key, message_key, exchange, routing_key,
               headers, content_type, payload, attempts, created_at
        FROM ready WHERE EXISTS (SELECT 1 FROM bucket) OR EXISTS (SELECT 1 FROM held)
        ORDER BY id";

/// Records a batch as published: ids ($1), under the held claim; the
/// rows are kept (`published_at` set) or deleted.
fn record_published(published: Published) -> String {
    let write = match published {
        Published::Kept => "UPDATE {outbox} SET published_at = now()",
        Published::Deleted => "DELETE FROM {outbox}",
    };
    format!(
        "{write}
         WHERE id = ANY($1) AND partition_key = $3 AND published_at IS NULL AND {claim}",
        claim = held_claim("$3", "$2", "$4", "$5"),
    )
}

/// Backoff doubles per attempt from the initial delay, capped; the
/// attempt count in the expression is the one before this failure.
fn record_failure() -> String {
    format!(
        "UPDATE {{outbox}}
         SET attempts = attempts + 1,
             last_error = $3,
             available_at = now() + make_interval(secs =>
                 least($7::float8, $6::float8 * power(2, least(attempts, 30))) / 1000),
             failed_at = CASE WHEN $4 AND $5::int > 0 AND attempts + 1 >= $5::int THEN now() END
         WHERE id = $1 AND partition_key = $8 AND published_at IS NULL AND {claim}
         RETURNING failed_at IS NOT NULL AS parked",
        claim = held_claim("$8", "$2", "$9", "$10"),
    )
}

/// Each bucket's head ($1: the buckets), ready or not.
const BUCKET_HEADS: &str = "SELECT b.partition_key, h.id, h.created_at, h.attempts, h.last_error,
                   coalesce(extract(epoch FROM now() - h.created_at)::float8, 0) AS lag_seconds
            FROM unnest($1::text[]) AS b(partition_key)
            LEFT JOIN LATERAL (
                SELECT id, created_at, attempts, last_error FROM {outbox} o
                WHERE o.partition_key BETWEEN b.partition_key AND b.partition_key
                  AND o.published_at IS NULL AND o.failed_at IS NULL
                ORDER BY o.partition_key, o.id LIMIT 1
            ) h ON true
            ORDER BY b.partition_key";

/// One index probe per bucket: its head, if ready.
const READY_BUCKETS: &str = "SELECT b.partition_key FROM unnest($1::text[]) AS b(partition_key)
            CROSS JOIN LATERAL (
                SELECT available_at FROM {outbox} o
                WHERE o.partition_key BETWEEN b.partition_key AND b.partition_key
                  AND o.published_at IS NULL AND o.failed_at IS NULL
                ORDER BY o.partition_key, o.id LIMIT 1
            ) h
            WHERE h.available_at <= now()";

/// A listed bucket (`$1`) with a pending row, ready or not: one probe of
/// the pending index, no head read (`statements::pending_fingerprinted`).
const ANY_PENDING: &str = "SELECT o.partition_key FROM {outbox} o
            WHERE o.partition_key = ANY($1::text[]) AND o.published_at IS NULL AND o.failed_at IS NULL
            LIMIT 1";

/// The workers table's fingerprint (`statements::fleet_fingerprinted`):
/// its row count and a sum of hashes of each row's id, `can_publish` and
/// whether it is near (`LateWatch`: `$2` and `$3` in milliseconds).
const WORKERS_FINGERPRINT: &str = "SELECT count(*) || ':'
                || coalesce(sum(hashtext(worker_id::text || can_publish::text
                    || (heartbeat_at < now() - make_interval(secs => $2::float8 / 1000)
                        OR heartbeat_until < now() + make_interval(secs => $3::float8 / 1000))::text)), 0)
            FROM {workers}";

/// Dropping is never silent: what was dropped, by whom and why
/// goes to the audit table in the same statement. Parked rows and
/// blocked heads waiting for their retry may be dropped.
const DROP_PARKED: &str = "WITH dropped AS (
                    DELETE FROM {outbox}
                    WHERE id = ANY($1::bigint[]) AND published_at IS NULL
                      AND (failed_at IS NOT NULL OR (attempts > 0 AND available_at > now()))
                    RETURNING id, message_id, partition_key, message_key, exchange, routing_key,
                              attempts, last_error
                 ), audit AS (
                    INSERT INTO {outbox}_audit (actor, action, detail)
                    SELECT $2, 'drop', jsonb_build_object('reason', $3::text,
                           'messages', jsonb_agg(to_jsonb(d) ORDER BY d.id))
                    FROM dropped d HAVING count(*) > 0
                 )
                 SELECT d.id FROM dropped d
                 CROSS JOIN LATERAL (SELECT pg_notify('{outbox}_enqueued', d.partition_key)) n
                 ORDER BY d.id";

/// Parking or retrying a blocked head is never silent either; only a head
/// waiting for its retry is changed (one whose retry time has come may be
/// in a batch), and its bucket's worker is woken at commit. `{change}`
/// is the assignment, `{action}` the audit's name for it.
const ACT_ON_HEADS: &str = "WITH heads AS (
                    UPDATE {outbox} SET {change}
                    WHERE id = ANY($1::bigint[]) AND failed_at IS NULL AND published_at IS NULL
                      AND attempts > 0 AND available_at > now()
                    RETURNING id, message_id, partition_key, message_key, exchange, routing_key,
                              attempts, last_error
                 ), audit AS (
                    INSERT INTO {outbox}_audit (actor, action, detail)
                    SELECT $2, '{action}', jsonb_build_object('reason', $3::text,
                           'messages', jsonb_agg(to_jsonb(h) ORDER BY h.id))
                    FROM heads h HAVING count(*) > 0
                 )
                 SELECT h.id FROM heads h
                 CROSS JOIN LATERAL (SELECT pg_notify('{outbox}_enqueued', h.partition_key)) n
                 ORDER BY h.id";

fn act_on_heads(t: &TablesConfig, action: HeadAction) -> Sql {
    let change = match action {
        HeadAction::Park => "failed_at = now()",
        HeadAction::Retry => "available_at = now()",
    };
    Sql::render(
        t,
        &ACT_ON_HEADS
            .replace("{change}", change)
            .replace("{action}", action.name()),
    )
}

/// Retention: one short transaction per batch, only by whoever
/// holds the purge lock (other workers skip the round), oldest ids
/// first (they are the published ones), never a pending or parked
/// row.
const PURGE_BATCH: &str = "WITH lock AS (SELECT pg_try_advisory_xact_lock($3) AS ok)
                 DELETE FROM {outbox}
                 WHERE (SELECT ok FROM lock)
                   AND id IN (SELECT id FROM {outbox}
                              WHERE published_at < now() - make_interval(secs => $1::float8)
                              ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// Requeue: parked rows become pending again with a fresh attempt
/// count. A requeued row keeps its id, so it is again ahead of every
/// later pending row of its bucket. Audited and announced in the
/// same statement.
const REQUEUE: &str = "WITH requeued AS (
                    UPDATE {outbox}
                    SET failed_at = NULL, attempts = 0, available_at = now(),
                        claim_token = NULL, claimed_until = NULL,
                        -- a row parked for an unknown bucket label gets its key's label
                        partition_key = CASE
                            WHEN EXISTS (SELECT 1 FROM {partitions} p
                                         WHERE p.partition_key = {outbox}.partition_key)
                            THEN partition_key
                            ELSE {outbox}_partition_for(message_key) END
                    WHERE failed_at IS NOT NULL AND published_at IS NULL
                      AND (id = ANY($1::bigint[]) OR partition_key = ANY($2::text[]) OR $4)
                    RETURNING id, partition_key
                 ), audit AS (
                    INSERT INTO {outbox}_audit (actor, action, detail)
                    SELECT $3, 'requeue', jsonb_build_object('ids', jsonb_agg(id ORDER BY id), 'buckets', $2::text[], 'all', $4)
                    FROM requeued HAVING count(*) > 0
                 )
                 SELECT r.id FROM requeued r
                 CROSS JOIN LATERAL (SELECT pg_notify('{outbox}_enqueued', r.partition_key)) n
                 ORDER BY r.id";

const COUNT_PURGEABLE: &str = "SELECT count(*) FROM {outbox} WHERE published_at < now() - make_interval(secs => $1::float8 / 1000)";

impl OutboxSql {
    pub fn new(t: &TablesConfig) -> Self {
        Self {
            enqueue: enqueue_statement(t),
            claim: Sql::render(t, CLAIM),
            record_published: Sql::render(t, &record_published(Published::Kept)),
            delete_published: Sql::render(t, &record_published(Published::Deleted)),
            record_failure: Sql::render(t, &record_failure()),
            // Pending, oldest first: a merge of per-bucket range scans of
            // the pending index (bounded by buckets × limit rows).
            list_pending: Sql::render(
                t,
                &format!(
                    "SELECT m.* FROM {{partitions}} p CROSS JOIN LATERAL (
                        SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
                        WHERE o.partition_key BETWEEN p.partition_key AND p.partition_key
                          AND o.published_at IS NULL AND o.failed_at IS NULL AND o.id > $1
                        ORDER BY o.partition_key, o.id LIMIT $2) m
                     ORDER BY m.id LIMIT $2"
                ),
            ),
            list_pending_key: Sql::render(
                t,
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
                     WHERE o.message_key = $3 AND o.published_at IS NULL AND o.failed_at IS NULL AND o.id > $1
                     ORDER BY o.id LIMIT $2"
                ),
            ),
            list_published: Sql::render(t, &newest_first("o.published_at IS NOT NULL", false)),
            list_published_key: Sql::render(t, &newest_first("o.published_at IS NOT NULL", true)),
            list_failed: Sql::render(t, &newest_first("o.failed_at IS NOT NULL", false)),
            // A parked row is never published; saying so lets the key
            // index over unpublished rows (migration 0012) serve this search.
            list_failed_key: Sql::render(
                t,
                &newest_first("o.failed_at IS NOT NULL AND o.published_at IS NULL", true),
            ),
            drop_parked: Sql::render(t, DROP_PARKED),
            park_heads: act_on_heads(t, HeadAction::Park),
            retry_heads: act_on_heads(t, HeadAction::Retry),

            purge_batch: Sql::render(t, PURGE_BATCH),

            requeue: Sql::render(t, REQUEUE),
        }
    }

    /// The claim statement's text, for diagnostics (`EXPLAIN`).
    pub fn claim_statement(&self) -> &str {
        self.claim.as_str()
    }

    async fn claim<'e, E: PgExecutor<'e>>(
        &self,
        bounds: &Bounds,
        exec: E,
        c: Claim<'_>,
    ) -> Result<Vec<ClaimedMessage>, StoreError> {
        let fence = c.holder.fence;
        sqlx::query_as(self.claim.q())
            .bind(c.holder.partition_key)
            .bind(i64::from(c.limit))
            .bind(c.holder.token.0)
            .bind(c.claim_ttl.as_millis() as f64)
            .bind(fence.map(|f| f.owner))
            .bind(fence.map(|f| f.epoch))
            .bind(c.in_flight)
            .bind(c.in_flight.iter().max())
            .bind(c.min_left.as_millis() as f64)
            .fetch_all(exec)
            .bounded(bounds, "claiming a batch")
            .await
    }

    async fn record_published<'e, E: PgExecutor<'e>>(
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
        Ok(sqlx::query(statement.q())
            .bind(ids)
            .bind(h.token.0)
            .bind(h.partition_key)
            .bind(h.fence.map(|f| f.owner))
            .bind(h.fence.map(|f| f.epoch))
            .execute(exec)
            .bounded(bounds, "recording published rows")
            .await?
            .rows_affected())
    }

    async fn record_failure<'e, E: PgExecutor<'e>>(
        &self,
        bounds: &Bounds,
        exec: E,
        h: Holder<'_>,
        f: Failure<'_>,
    ) -> Result<Option<bool>, StoreError> {
        sqlx::query_scalar(self.record_failure.q())
            .bind(f.id)
            .bind(h.token.0)
            .bind(f.error)
            .bind(f.policy.may_park)
            .bind(f.policy.max_attempts as i32)
            .bind(f.policy.backoff_initial_ms)
            .bind(f.policy.backoff_max_ms)
            .bind(h.partition_key)
            .bind(h.fence.map(|f| f.owner))
            .bind(h.fence.map(|f| f.epoch))
            .fetch_optional(exec)
            .bounded(bounds, "recording a failed publish")
            .await
    }
}

/// How long the Published view's search by key may run, in milliseconds.
/// No index serves it by default (migration 0013): it reads the table,
/// 0.1–0.3 s per million rows here, so the database stops it at this
/// bound rather than let it load the primary for as long as the table is
/// large. The book's *Searching published messages by key* (docs/operations.md)
/// gives the index
/// that makes it a probe.
const PUBLISHED_KEY_SEARCH_MS: u64 = 5_000;

/// What the Published view's search by key says when it fails.
const SEARCHING_PUBLISHED: &str = "searching published messages by key \
     (a scan of the table without the index of docs/operations.md, \"Searching published messages by key\")";

/// Runs the Published view's search by key under
/// [`PUBLISHED_KEY_SEARCH_MS`] (a `statement_timeout` local to its
/// transaction, so it holds behind a transaction pooler too).
async fn published_of_key(
    pool: &DbPool,
    q: QueryAs<'_, Postgres, MessageSummary, PgArguments>,
) -> Result<Vec<MessageSummary>, StoreError> {
    bounded_op(pool.bounds(), SEARCHING_PUBLISHED, async {
        let mut tx = pool.begin().await.doing("starting a transaction")?;
        sqlx::query("SELECT set_config('statement_timeout', $1, true)")
            .bind(PUBLISHED_KEY_SEARCH_MS.to_string())
            .execute(&mut tx)
            .await
            .doing(SEARCHING_PUBLISHED)?;
        let rows = match q.fetch_all(&mut tx).await {
            Ok(rows) => rows,
            Err(e) if is_cancelled(&e) => {
                return Err(StoreError::Timeout {
                    doing: SEARCHING_PUBLISHED,
                    after: Duration::from_millis(PUBLISHED_KEY_SEARCH_MS),
                });
            }
            Err(e) => return Err(query_error(SEARCHING_PUBLISHED, e)),
        };
        tx.commit().await.doing(SEARCHING_PUBLISHED)?;
        Ok(rows)
    })
    .await
}

#[async_trait]
impl OutboxStore for PgBackend {
    async fn enqueue(&self, message: &Message) -> Result<i64, StoreError> {
        enqueue(
            &self.outbox.enqueue,
            &self.pool,
            self.pool.bounds(),
            message,
        )
        .await
    }

    async fn claim(&self, claim: Claim<'_>) -> Result<Vec<ClaimedMessage>, StoreError> {
        self.outbox
            .claim(self.pool.bounds(), &self.pool, claim)
            .await
    }

    async fn record_published(&self, holder: Holder<'_>, ids: &[i64]) -> Result<u64, StoreError> {
        self.outbox
            .record_published(self.pool.bounds(), &self.pool, holder, ids)
            .await
    }

    async fn record_failure(
        &self,
        holder: Holder<'_>,
        confirmed: &[i64],
        failure: Option<Failure<'_>>,
    ) -> Result<FailureRecord, StoreError> {
        let bounds = self.pool.bounds();
        bounded_op(bounds, "recording a failed publish", async {
            let mut tx = self.pool.begin().await.doing("starting a transaction")?;
            let published = if confirmed.is_empty() {
                0
            } else {
                self.outbox
                    .record_published(bounds, &mut tx, holder, confirmed)
                    .await?
            };
            let parked = match failure {
                Some(f) => {
                    self.outbox
                        .record_failure(bounds, &mut tx, holder, f)
                        .await?
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
        let o = &self.outbox;
        // Only the Published view's search by key may read the table.
        let (sql, default_cursor, scans_table) = match (state, message_key.is_some()) {
            (MessageState::Pending, false) => (&o.list_pending, 0, false),
            (MessageState::Pending, true) => (&o.list_pending_key, 0, false),
            (MessageState::Published, false) => (&o.list_published, i64::MAX, false),
            (MessageState::Published, true) => (&o.list_published_key, i64::MAX, true),
            (MessageState::Failed, false) => (&o.list_failed, i64::MAX, false),
            (MessageState::Failed, true) => (&o.list_failed_key, i64::MAX, false),
        };
        let mut q = sqlx::query_as(sql.q())
            .bind(cursor.unwrap_or(default_cursor))
            .bind(limit);
        if let Some(key) = message_key {
            q = q.bind(key);
        }
        if scans_table {
            return published_of_key(&self.pool, q).await;
        }
        q.fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "listing messages")
            .await
    }

    async fn purge_batch(&self, older_than: Duration, limit: i64) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.outbox.purge_batch.q())
            .bind(older_than.as_secs_f64())
            .bind(limit)
            .bind(PURGE_LOCK)
            .execute(&self.pool)
            .bounded(self.pool.bounds(), "purging published rows")
            .await?
            .rows_affected())
    }

    /// `VACUUM (ANALYZE)` of the outbox table. Until a vacuum, the pending
    /// index still holds an entry for every row published since the last
    /// one, and each claim steps over those of its bucket: measured, a
    /// claim + record cost 1.5–2.1 × as much right after 2M rows were
    /// published and purged, and again 1.0 × after the vacuum
    /// (BENCHMARKS.md). It takes no lock that producers or the relay wait
    /// for.
    async fn tidy_after_purge(&self) -> Result<(), StoreError> {
        let sql = format!("VACUUM (ANALYZE) {}", self.tables.outbox);
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .doing("vacuuming the outbox table")?;
        Ok(())
    }
}

#[async_trait]
impl ParkedStore for PgBackend {
    async fn drop_parked(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<Vec<i64>, StoreError> {
        sqlx::query_scalar(self.outbox.drop_parked.q())
            .bind(ids)
            .bind(actor)
            .bind(reason)
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "dropping parked messages")
            .await
    }

    async fn requeue(
        &self,
        ids: &[i64],
        buckets: &[String],
        all: bool,
        actor: &str,
    ) -> Result<Vec<i64>, StoreError> {
        sqlx::query_scalar(self.outbox.requeue.q())
            .bind(ids)
            .bind(buckets)
            .bind(actor)
            .bind(all)
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "requeueing messages")
            .await
    }

    async fn act_on_heads(
        &self,
        ids: &[i64],
        action: HeadAction,
        actor: &str,
        reason: &str,
    ) -> Result<Vec<i64>, StoreError> {
        let sql = match action {
            HeadAction::Park => &self.outbox.park_heads,
            HeadAction::Retry => &self.outbox.retry_heads,
        };
        sqlx::query_scalar(sql.q())
            .bind(ids)
            .bind(actor)
            .bind(reason)
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "acting on blocked heads")
            .await
    }
}

/// `SELECT <outbox>_enqueue(…)`, the enqueue every producer uses.
pub(crate) fn enqueue_statement(t: &TablesConfig) -> Sql {
    Sql::render(t, "SELECT {outbox}_enqueue($1, $2, $3, $4, $5, $6)")
}

/// Enqueues one message through `<outbox>_enqueue()` (`sql`, from
/// [`enqueue_statement`]) on `exec`; returns its id.
pub(crate) async fn enqueue<'e, E: PgExecutor<'e>>(
    sql: &Sql,
    exec: E,
    bounds: &Bounds,
    m: &Message,
) -> Result<i64, StoreError> {
    sqlx::query_scalar(sql.q())
        .bind(&m.message_key)
        .bind(&m.exchange)
        .bind(&m.routing_key)
        .bind(&m.payload)
        .bind(&m.headers)
        .bind(m.content_type.as_deref())
        .fetch_one(exec)
        .bounded(bounds, "enqueueing a message")
        .await
}

/// Advisory lock that lets one process purge at a time ("purge" in ASCII).
pub const PURGE_LOCK: i64 = 0x0070_7572_6765;

/// The reads across buckets (`store::lookups`), in PostgreSQL's SQL.
pub(crate) fn bucket_reads(t: &TablesConfig) -> BucketReadsSql {
    let ready_buckets = Sql::render(t, READY_BUCKETS);
    let fingerprint = Sql::render(t, WORKERS_FINGERPRINT);
    BucketReadsSql {
        ready_and_fleet: fleet_fingerprinted(&ready_buckets, fingerprint.as_str()),
        pending_and_fleet: pending_fingerprinted(
            Sql::render(t, ANY_PENDING).as_str(),
            fingerprint.as_str(),
        ),
        ready_buckets,
        bucket_heads: Sql::render(t, BUCKET_HEADS),
        count_purgeable: Sql::render(t, COUNT_PURGEABLE),
    }
}
