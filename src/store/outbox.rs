//! The `outbox` table: enqueue, claim, and the outcome of a publish.
//!
//! Claiming is one statement: it reads the first `batch_size` unpublished,
//! unparked rows of one bucket in `id` order, keeps the prefix of them that
//! is ready, and records the claim once, on the bucket's row (claim token
//! and expiry), not on every row. A row that is not ready — a failing head
//! waiting for its backoff — stops the prefix, so nothing behind it in the
//! bucket is claimed: head-of-line blocking per bucket, and only per bucket.
//! A bucket has one claim at a time: another token's live claim blocks it.
//!
//! Every write after the claim matches the bucket's claim token, and, in
//! fleet mode, the lease fence `(partition_key, lease_owner, lease_epoch)`
//! in the same statement (both live on the bucket's row): a worker that lost
//! its claim or its lease writes nothing. A published message costs one
//! row update, the record.

use chrono::{DateTime, Utc};
use serde_json::Value as Json;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{Bounded, QueryContext, Sql, StoreError};
use crate::config::TablesConfig;

/// Identifies one batch claim; rows carry it in `claim_token`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimToken(pub Uuid);

impl ClaimToken {
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

/// The lease a write is made under (fleet mode). `None` in `--no-leasing`
/// mode, where the single worker owns every bucket by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub owner: Uuid,
    pub epoch: i64,
}

/// A claimed row, everything needed to publish it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClaimedMessage {
    pub id: i64,
    pub message_id: Uuid,
    pub partition_key: String,
    pub message_key: String,
    pub exchange: String,
    pub routing_key: String,
    pub headers: Json,
    pub content_type: Option<String>,
    pub payload: Vec<u8>,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

/// How to treat a failed row.
#[derive(Debug, Clone, Copy)]
pub struct FailurePolicy {
    /// Park after this many attempts; 0 never parks.
    pub max_attempts: u32,
    /// Whether this failure may park the row: only failures caused by the
    /// row itself do; a slow or absent broker never parks anything.
    pub may_park: bool,
    pub backoff_initial_ms: f64,
    pub backoff_max_ms: f64,
}

/// Which messages a view lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageState {
    /// Not yet published, not parked; oldest first.
    Pending,
    /// Published; newest first.
    Published,
    /// Parked after max_attempts; newest first.
    Failed,
}

const SUMMARY_COLUMNS: &str =
    "o.id, o.partition_key, o.message_key, o.exchange, o.routing_key, o.message_id,
    o.created_at, o.available_at, o.published_at, o.failed_at, o.attempts, o.last_error,
    octet_length(o.payload) AS payload_bytes";

/// A message in a list.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct MessageSummary {
    pub id: i64,
    pub partition_key: String,
    pub message_key: String,
    pub exchange: String,
    pub routing_key: String,
    pub message_id: Uuid,
    pub created_at: DateTime<Utc>,
    pub available_at: DateTime<Utc>,
    pub published_at: Option<DateTime<Utc>>,
    pub failed_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub payload_bytes: i32,
}

/// One message with everything.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MessageDetail {
    #[sqlx(flatten)]
    pub summary: MessageSummary,
    pub headers: Json,
    pub content_type: Option<String>,
    pub payload: Vec<u8>,
}

/// The head of one bucket: its oldest pending row, if any.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BucketHead {
    pub partition_key: String,
    pub id: Option<i64>,
    pub created_at: Option<DateTime<Utc>>,
    pub attempts: Option<i32>,
    pub last_error: Option<String>,
    /// Seconds since the head was created (0 when the bucket is empty).
    pub lag_seconds: f64,
}

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
    record_failure: Sql,
    release: Sql,
    clear_claims: Sql,
    bucket_heads: Sql,
    ready_buckets: Sql,
    list_pending: Sql,
    list_pending_key: Sql,
    list_published: Sql,
    list_published_key: Sql,
    list_failed: Sql,
    list_failed_key: Sql,
    detail: Sql,
    requeue: Sql,
    parked_in_bucket: Sql,
    drop_parked: Sql,
    purge_batch: Sql,
    count_purgeable: Sql,
}

impl OutboxSql {
    pub fn new(t: &TablesConfig) -> Self {
        // The plan must stay a bounded range scan of the pending index
        // whatever the statistics say, so the statement is written to leave
        // the planner no other good choice: the bucket is a range (`BETWEEN
        // $1 AND $1`), not an equality, and rows are ordered by
        // `(partition_key, id)`: only the pending index yields that order
        // without a sort. With `= $1 ORDER BY id` the planner walked the
        // primary key from the lowest id, reading every published row of
        // every bucket on the way.
        //
        // The claim writes nothing into the outbox: it takes (or renews) the
        // bucket's claim on its row in the partitions table, and only if the
        // bucket has ready rows. A claim held under another token blocks the
        // bucket while it lasts; one that outlasts the claim TTL was not
        // made by any worker (written by hand, a clock far off) and is
        // ignored. Rows still in flight from this drainer's previous batch
        // ($7) are skipped, never a row behind them.
        let claim = "WITH first_rows AS (
                SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                       headers, content_type, payload, attempts, created_at,
                       bool_or(available_at > now()) OVER (ORDER BY partition_key, id) AS blocked
                FROM (
                    SELECT * FROM {outbox}
                    WHERE partition_key BETWEEN $1 AND $1
                      AND published_at IS NULL AND failed_at IS NULL
                      AND id <> ALL($7::bigint[])
                    ORDER BY partition_key, id
                    LIMIT $2
                ) head
            ), ready AS (
                SELECT * FROM first_rows WHERE NOT blocked
            ), bucket AS (
                UPDATE {partitions} p
                SET claim_token = $3, claimed_until = now() + make_interval(secs => $4::float8 / 1000)
                WHERE p.partition_key = $1 AND EXISTS (SELECT 1 FROM ready)
                  AND (p.claim_token IS NULL OR p.claim_token = $3 OR p.claimed_until <= now()
                       OR p.claimed_until > now() + make_interval(secs => $4::float8 / 1000))
                  AND ($5::uuid IS NULL OR (p.lease_owner = $5 AND p.lease_epoch = $6
                                           AND p.lease_until > now()))
                RETURNING 1
            )
            SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                   headers, content_type, payload, attempts, created_at
            FROM ready WHERE EXISTS (SELECT 1 FROM bucket)
            ORDER BY id";
        let record_published = format!(
            "UPDATE {{outbox}} SET published_at = now()
             WHERE id = ANY($1) AND partition_key = $3 AND published_at IS NULL AND {claim}",
            claim = held_claim("$3", "$2", "$4", "$5"),
        );
        // Backoff doubles per attempt from the initial delay, capped; the
        // attempt count in the expression is the one before this failure.
        let record_failure = format!(
            "UPDATE {{outbox}}
             SET attempts = attempts + 1,
                 last_error = $3,
                 available_at = now() + make_interval(secs =>
                     least($7::float8, $6::float8 * power(2, least(attempts, 30))) / 1000),
                 failed_at = CASE WHEN $4 AND $5::int > 0 AND attempts + 1 >= $5::int THEN now() END
             WHERE id = $1 AND partition_key = $8 AND published_at IS NULL AND {claim}
             RETURNING failed_at IS NOT NULL AS parked",
            claim = held_claim("$8", "$2", "$9", "$10"),
        );
        // Releasing is harmless without a fence: it only drops our own claim.
        let release = "UPDATE {partitions} SET claim_token = NULL, claimed_until = NULL
                       WHERE partition_key = $1 AND claim_token = $2"
            .to_string();
        // A new lease owner drops the claim of an earlier owner: its writes
        // are fenced out anyway, and its claim would only hold the bucket
        // up until claim_ttl.
        let clear_claims = "UPDATE {partitions} SET claim_token = NULL, claimed_until = NULL
             WHERE partition_key = $1 AND lease_owner = $2 AND lease_epoch = $3
               AND claim_token IS NOT NULL"
            .to_string();
        let bucket_heads = "SELECT b.partition_key, h.id, h.created_at, h.attempts, h.last_error,
                   coalesce(extract(epoch FROM now() - h.created_at)::float8, 0) AS lag_seconds
            FROM unnest($1::text[]) AS b(partition_key)
            LEFT JOIN LATERAL (
                SELECT id, created_at, attempts, last_error FROM {outbox} o
                WHERE o.partition_key BETWEEN b.partition_key AND b.partition_key
                  AND o.published_at IS NULL AND o.failed_at IS NULL
                ORDER BY o.partition_key, o.id LIMIT 1
            ) h ON true
            ORDER BY b.partition_key"
            .to_string();
        // One index probe per bucket: its head, if ready.
        let ready_buckets = "SELECT b.partition_key FROM unnest($1::text[]) AS b(partition_key)
            CROSS JOIN LATERAL (
                SELECT available_at FROM {outbox} o
                WHERE o.partition_key BETWEEN b.partition_key AND b.partition_key
                  AND o.published_at IS NULL AND o.failed_at IS NULL
                ORDER BY o.partition_key, o.id LIMIT 1
            ) h
            WHERE h.available_at <= now()";
        Self {
            enqueue: Sql::render(t, "SELECT {outbox}_enqueue($1, $2, $3, $4, $5, $6)"),
            ready_buckets: Sql::render(t, ready_buckets),
            claim: Sql::render(t, claim),
            record_published: Sql::render(t, &record_published),
            record_failure: Sql::render(t, &record_failure),
            release: Sql::render(t, &release),
            clear_claims: Sql::render(t, &clear_claims),
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
            list_failed_key: Sql::render(t, &newest_first("o.failed_at IS NOT NULL", true)),
            parked_in_bucket: Sql::render(
                t,
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
                     WHERE o.partition_key = $2 AND o.failed_at IS NOT NULL
                     ORDER BY o.partition_key, o.id LIMIT $1"
                ),
            ),
            // Dropping is never silent: what was dropped, by whom and why
            // goes to the audit table in the same statement.
            drop_parked: Sql::render(
                t,
                "WITH dropped AS (
                    DELETE FROM {outbox}
                    WHERE id = ANY($1::bigint[]) AND failed_at IS NOT NULL AND published_at IS NULL
                    RETURNING id, message_id, partition_key, message_key, exchange, routing_key,
                              attempts, last_error
                 ), audit AS (
                    INSERT INTO {outbox}_audit (actor, action, detail)
                    SELECT $2, 'drop', jsonb_build_object('reason', $3::text,
                           'messages', jsonb_agg(to_jsonb(d) ORDER BY d.id))
                    FROM dropped d HAVING count(*) > 0
                 )
                 SELECT id FROM dropped ORDER BY id",
            ),
            // Retention: one short transaction per batch, only by whoever
            // holds the purge lock (other workers skip the round), oldest ids
            // first (they are the published ones), never a pending or parked
            // row.
            purge_batch: Sql::render(
                t,
                "WITH lock AS (SELECT pg_try_advisory_xact_lock($3) AS ok)
                 DELETE FROM {outbox}
                 WHERE (SELECT ok FROM lock)
                   AND id IN (SELECT id FROM {outbox}
                              WHERE published_at < now() - make_interval(secs => $1::float8)
                              ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)",
            ),
            count_purgeable: Sql::render(
                t,
                "SELECT count(*) FROM {outbox} WHERE published_at < now() - make_interval(secs => $1::float8)",
            ),
            detail: Sql::render(
                t,
                &format!(
                    "SELECT {SUMMARY_COLUMNS}, o.headers, o.content_type, o.payload FROM {{outbox}} o WHERE o.id = $1"
                ),
            ),
            // Requeue: parked rows become pending again with a fresh attempt
            // count. A requeued row keeps its id, so it is again ahead of every
            // later pending row of its bucket. Audited and announced in the
            // same statement.
            requeue: Sql::render(
                t,
                "WITH requeued AS (
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
                 ORDER BY r.id",
            ),
            bucket_heads: Sql::render(t, &bucket_heads),
        }
    }

    /// The claim statement's text, for diagnostics (`EXPLAIN`). Parameters:
    /// bucket, limit, token, claim TTL in ms, lease owner, lease epoch.
    pub fn claim_statement(&self) -> &str {
        self.claim.as_str()
    }

    /// Enqueues one message through `<outbox>_enqueue()`; returns its id.
    #[allow(clippy::too_many_arguments)]
    pub async fn enqueue<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        message_key: &str,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        headers: &Json,
        content_type: Option<&str>,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(self.enqueue.q())
            .bind(message_key)
            .bind(exchange)
            .bind(routing_key)
            .bind(payload)
            .bind(headers)
            .bind(content_type)
            .fetch_one(exec)
            .bounded("enqueueing a message")
            .await
    }

    /// Claims the ready prefix of a bucket's first `limit` pending rows not
    /// in `in_flight`, returned in `id` order, and takes or renews the
    /// bucket's claim under `token`. Empty when nothing is ready, the head
    /// is waiting for a retry, another token's claim holds the bucket, or
    /// (fleet mode) the lease is not ours or expired.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        partition_key: &str,
        limit: u32,
        token: ClaimToken,
        claim_ttl_ms: u64,
        fence: Option<Fence>,
        in_flight: &[i64],
    ) -> Result<Vec<ClaimedMessage>, StoreError> {
        sqlx::query_as(self.claim.q())
            .bind(partition_key)
            .bind(i64::from(limit))
            .bind(token.0)
            .bind(claim_ttl_ms as f64)
            .bind(fence.map(|f| f.owner))
            .bind(fence.map(|f| f.epoch))
            .bind(in_flight)
            .fetch_all(exec)
            .bounded("claiming a batch")
            .await
    }

    /// Marks confirmed rows published; returns how many rows matched (fewer
    /// than `ids.len()` means the claim or the lease was lost).
    pub async fn record_published<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        ids: &[i64],
        token: ClaimToken,
        partition_key: &str,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.record_published.q())
            .bind(ids)
            .bind(token.0)
            .bind(partition_key)
            .bind(fence.map(|f| f.owner))
            .bind(fence.map(|f| f.epoch))
            .execute(exec)
            .bounded("recording published rows")
            .await?
            .rows_affected())
    }

    /// Records a failed attempt at one row: `attempts + 1`, `last_error`,
    /// `available_at` pushed back, maybe parked. Returns `None` when the row
    /// no longer matched (claim or lease lost), else whether it was parked.
    #[allow(clippy::too_many_arguments)]
    pub async fn record_failure<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        id: i64,
        token: ClaimToken,
        error: &str,
        policy: FailurePolicy,
        partition_key: &str,
        fence: Option<Fence>,
    ) -> Result<Option<bool>, StoreError> {
        sqlx::query_scalar(self.record_failure.q())
            .bind(id)
            .bind(token.0)
            .bind(error)
            .bind(policy.may_park)
            .bind(policy.max_attempts as i32)
            .bind(policy.backoff_initial_ms)
            .bind(policy.backoff_max_ms)
            .bind(partition_key)
            .bind(fence.map(|f| f.owner))
            .bind(fence.map(|f| f.epoch))
            .fetch_optional(exec)
            .bounded("recording a failed publish")
            .await
    }

    /// Drops the bucket's claim if it is still `token`'s (a drainer that
    /// stops hands its bucket back at once instead of after claim_ttl).
    pub async fn release<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        partition_key: &str,
        token: ClaimToken,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.release.q())
            .bind(partition_key)
            .bind(token.0)
            .execute(exec)
            .bounded("releasing a claim")
            .await?
            .rows_affected())
    }

    /// A page of messages in `state`, optionally of one key. `cursor` is the
    /// last id of the previous page (pending pages go up, others down).
    pub async fn list<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        state: MessageState,
        message_key: Option<&str>,
        cursor: Option<i64>,
        limit: i64,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let (sql, default_cursor) = match (state, message_key.is_some()) {
            (MessageState::Pending, false) => (&self.list_pending, 0),
            (MessageState::Pending, true) => (&self.list_pending_key, 0),
            (MessageState::Published, false) => (&self.list_published, i64::MAX),
            (MessageState::Published, true) => (&self.list_published_key, i64::MAX),
            (MessageState::Failed, false) => (&self.list_failed, i64::MAX),
            (MessageState::Failed, true) => (&self.list_failed_key, i64::MAX),
        };
        let mut q = sqlx::query_as(sql.q())
            .bind(cursor.unwrap_or(default_cursor))
            .bind(limit);
        if let Some(key) = message_key {
            q = q.bind(key);
        }
        q.fetch_all(exec).bounded("listing messages").await
    }

    /// One message, everything included.
    pub async fn detail<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        id: i64,
    ) -> Result<Option<MessageDetail>, StoreError> {
        sqlx::query_as(self.detail.q())
            .bind(id)
            .fetch_optional(exec)
            .bounded("reading a message")
            .await
    }

    /// Deletes up to `limit` rows published more than `older_than` ago,
    /// unless another process holds the purge lock `lock_key`. Returns how
    /// many rows went.
    pub async fn purge_batch<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        older_than: std::time::Duration,
        limit: i64,
        lock_key: i64,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.purge_batch.q())
            .bind(older_than.as_secs_f64())
            .bind(limit)
            .bind(lock_key)
            .execute(exec)
            .bounded("purging published rows")
            .await?
            .rows_affected())
    }

    /// How many rows a purge with this cut-off would delete (a full scan:
    /// for `--dry-run`, not for the relay).
    pub async fn count_purgeable<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        older_than: std::time::Duration,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(self.count_purgeable.q())
            .bind(older_than.as_secs_f64())
            .fetch_one(exec)
            .await
            .doing("counting purgeable rows")
    }

    /// Parked messages of one bucket, oldest first.
    pub async fn parked_in_bucket<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        partition_key: &str,
        limit: i64,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        sqlx::query_as(self.parked_in_bucket.q())
            .bind(limit)
            .bind(partition_key)
            .fetch_all(exec)
            .bounded("listing parked messages")
            .await
    }

    /// Deletes parked messages, recording them with `actor` and `reason` in
    /// the audit table; returns the ids dropped (only parked rows are).
    pub async fn drop_parked<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<Vec<i64>, StoreError> {
        sqlx::query_scalar(self.drop_parked.q())
            .bind(ids)
            .bind(actor)
            .bind(reason)
            .fetch_all(exec)
            .bounded("dropping parked messages")
            .await
    }

    /// Requeues parked messages (by id, every parked one of `buckets`, or
    /// with `all` every parked one); returns the ids requeued. A row parked
    /// because its label is not a bucket of this deployment is re-labelled
    /// from its key. `actor` goes to the audit record.
    pub async fn requeue<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        ids: &[i64],
        buckets: &[String],
        all: bool,
        actor: &str,
    ) -> Result<Vec<i64>, StoreError> {
        sqlx::query_scalar(self.requeue.q())
            .bind(ids)
            .bind(buckets)
            .bind(actor)
            .bind(all)
            .fetch_all(exec)
            .bounded("requeueing messages")
            .await
    }

    /// Drops the claim of an earlier drainer of a bucket just leased
    /// (fenced by that lease).
    pub async fn clear_claims<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        partition_key: &str,
        fence: Fence,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.clear_claims.q())
            .bind(partition_key)
            .bind(fence.owner)
            .bind(fence.epoch)
            .execute(exec)
            .bounded("clearing earlier claims")
            .await?
            .rows_affected())
    }

    /// The oldest pending row of each given bucket (one probe of the pending
    /// index each; written like the claim, see there).
    pub async fn bucket_heads<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        partition_keys: &[String],
    ) -> Result<Vec<BucketHead>, StoreError> {
        sqlx::query_as(self.bucket_heads.q())
            .bind(partition_keys)
            .fetch_all(exec)
            .bounded("reading bucket heads")
            .await
    }

    /// Which of `partition_keys` have a head that is ready to publish (the
    /// polling that replaces `LISTEN` where it cannot work).
    pub async fn ready_buckets<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        partition_keys: &[String],
    ) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(self.ready_buckets.q())
            .bind(partition_keys)
            .fetch_all(exec)
            .bounded("polling for new rows")
            .await
    }
}

/// Records the outcome of a batch whose row `failed_at` failed: the
/// confirmed prefix is published, the failed row gets its attempt, the rest
/// of the claim is handed back. One transaction, so a crash in between
/// leaves the claim to expire rather than a half-recorded batch.
#[allow(clippy::too_many_arguments)]
pub async fn record_partial_failure(
    tx: &mut super::Tx,
    sql: &OutboxSql,
    confirmed: &[i64],
    failed: i64,
    error: &str,
    policy: FailurePolicy,
    token: ClaimToken,
    partition_key: &str,
    fence: Option<Fence>,
) -> Result<(u64, Option<bool>), StoreError> {
    let published = if confirmed.is_empty() {
        0
    } else {
        sql.record_published(&mut *tx, confirmed, token, partition_key, fence)
            .await?
    };
    let parked = sql
        .record_failure(&mut *tx, failed, token, error, policy, partition_key, fence)
        .await?;
    Ok((published, parked))
}
