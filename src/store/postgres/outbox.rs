//! PostgreSQL: the `outbox` table's statements (see [`crate::store::outbox`]
//! for what they promise, and [`crate::store::drain`] for the flows over
//! them).
//!
//! A claim under a claim the drainer holds is a plain read of the
//! bucket's first rows from the pending index; taking or renewing it is
//! one statement, a CTE that reads those rows, keeps the ready prefix and
//! takes the claim on the bucket's row with the lease fence. The records
//! check token and fence in an `EXISTS` on that row, in the statement
//! that writes.

use std::time::Duration;

use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::{
    BucketReadsSql, ClaimSql, DrainSql, MessagesSql, PendingPage, TakeSql, fleet_fingerprinted,
    pending_fingerprinted,
};

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

/// [`HELD_CLAIM`] on the parameters from `$first` on, in the contract's
/// order: bucket, token, owner, owner (the same again), epoch.
fn held_claim(first: usize) -> String {
    HELD_CLAIM
        .replace("$F_KEY", &format!("${first}"))
        .replace("$F_TOKEN", &format!("${}", first + 1))
        .replace("$F_OWNER", &format!("${}", first + 2))
        .replace("$F_EPOCH", &format!("${}", first + 4))
}

/// A page of messages in `state` (a predicate on `o`), newest first below
/// the cursor, of the key when `by_key`: (key,) cursor, limit.
fn newest_first(state: &str, by_key: bool) -> String {
    let (key, cursor, limit) = if by_key {
        ("o.message_key = $1 AND ", "$2", "$3")
    } else {
        ("", "$1", "$2")
    };
    format!(
        "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
         WHERE {key}{state} AND o.id < {cursor} ORDER BY o.id DESC LIMIT {limit}"
    )
}

/// Both claim statements read the bucket's head the same way, and its
/// plan must stay a bounded range scan of the pending index whatever the
/// statistics say, so the statements are written to leave the planner no
/// other good choice: the bucket is a range (`BETWEEN $b AND $b`), not an
/// equality, and rows are ordered by `(partition_key, id)`: only the
/// pending index yields that order without a sort. With `= $b ORDER BY
/// id` the planner walked the primary key from the lowest id, reading
/// every published row of every bucket on the way.
///
/// Rows still in flight from this drainer's previous batch are skipped,
/// never a row behind them; a row above the highest of them skips the
/// look-up. The look-up is `NOT IN` a sub-select of the array, which
/// PostgreSQL hashes once per execution: `<> ALL($array)` compares every
/// row with the array's elements one by one in a generic plan (only a
/// constant array is hashed), and at batch 1,000, with 2,000 ids in
/// flight, that took 8 ms of a 10 ms claim.
///
/// The claim's read: the bucket's first rows, with whether each is ready
/// and whether the caller's token holds the bucket's claim with at least
/// $2 ms left (and, in fleet mode, under its valid lease). A drainer
/// that holds its claim, as through a whole drain, claims with this read
/// alone: no write, no WAL flush to wait for, and a statement PostgreSQL
/// plans in about half the time of the take's data-modifying `WITH` (at
/// batch 100, 0.12 ms planning and 0.09 ms running against 0.23 and
/// 0.27, and the take is planned afresh on every execution). Nobody else
/// can take a live claim, so reading it in the statement's snapshot is
/// enough; the records check the claim and the fence again in the
/// statements that write. The parameters are the contract's
/// (`ClaimSql::read`).
const CLAIM_READ: &str = "SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                headers, content_type, payload, attempts, created_at,
                available_at > now() AS not_ready,
                (SELECT p.claim_token = $1
                        AND p.claimed_until > now() + make_interval(secs => $2::float8 / 1000)
                        AND ($3::uuid IS NULL OR (p.lease_owner = $4 AND p.lease_epoch = $5
                                                 AND p.lease_until > now()))
                 FROM {partitions} p WHERE p.partition_key = $6) AS held
         FROM {outbox}
         WHERE partition_key BETWEEN $7 AND $7
           AND published_at IS NULL AND failed_at IS NULL
           AND (id > $8 OR id NOT IN (SELECT unnest($9::bigint[])))
         ORDER BY partition_key, id
         LIMIT $10";

/// The claim's take, in one statement: it writes nothing into the
/// outbox; it takes (or renews) the bucket's claim on its row in the
/// partitions table, only if the bucket has ready rows, and returns them.
/// A claim held under another token blocks the bucket while it lasts;
/// one that outlasts the claim TTL was not made by any worker (written by
/// hand, a clock far off) and is ignored. The parameters are the
/// contract's (`TakeSql::Returning`).
const CLAIM_TAKE: &str = "WITH first_rows AS (
            SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                   headers, content_type, payload, attempts, created_at,
                   bool_or(available_at > now()) OVER (ORDER BY partition_key, id) AS blocked
            FROM (
                SELECT * FROM {outbox}
                WHERE partition_key BETWEEN $1 AND $1
                  AND published_at IS NULL AND failed_at IS NULL
                  AND (id > $8 OR id NOT IN (SELECT unnest($7::bigint[])))
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

/// Records a batch as published with `write` (kept or deleted rows): ids
/// ($1), bucket ($2), then the held claim's.
fn record_published(write: &str) -> String {
    format!(
        "{write}
         WHERE id = ANY($1) AND partition_key = $2 AND published_at IS NULL AND {claim}",
        claim = held_claim(3),
    )
}

/// Backoff doubles per attempt from the initial delay, capped; the
/// attempt count in the expression is the one before this failure.
fn record_failure() -> String {
    format!(
        "UPDATE {{outbox}}
         SET attempts = attempts + 1,
             last_error = $6,
             available_at = now() + make_interval(secs =>
                 least($1::float8, $2::float8 * power(2, least(attempts, 30))) / 1000),
             failed_at = CASE WHEN $3 AND $4::int > 0 AND attempts + 1 >= $5::int THEN now() END
         WHERE id = $7 AND partition_key = $8 AND published_at IS NULL AND {claim}
         RETURNING failed_at IS NOT NULL AS parked",
        claim = held_claim(9),
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

/// Retention: one short transaction per batch, only by whoever
/// holds the purge lock (other workers skip the round), oldest ids
/// first (they are the published ones), never a pending or parked
/// row.
const PURGE_BATCH: &str = "WITH lock AS (SELECT pg_try_advisory_xact_lock({lock}) AS ok)
                 DELETE FROM {outbox}
                 WHERE (SELECT ok FROM lock)
                   AND id IN (SELECT id FROM {outbox}
                              WHERE published_at < now() - make_interval(secs => $1::float8 / 1000)
                              ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)";

const COUNT_PURGEABLE: &str = "SELECT count(*) FROM {outbox} WHERE published_at < now() - make_interval(secs => $1::float8 / 1000)";

/// `SELECT <outbox>_enqueue(…)`, the enqueue every producer uses.
pub(crate) fn enqueue_statement(t: &Tables) -> Sql {
    Sql::render(t, "SELECT {outbox}_enqueue($1, $2, $3, $4, $5, $6)")
}

/// Advisory lock that lets one process purge at a time ("purge" in ASCII).
pub const PURGE_LOCK: i64 = 0x0070_7572_6765;

/// How long the Published view's search by key may run, in milliseconds.
/// No index serves it by default (migration 0013): it reads the table,
/// 0.1–0.3 s per million rows here, so the database stops it at this
/// bound rather than let it load the primary for as long as the table is
/// large. The book's *Searching published messages by key*
/// (docs/operations.md) gives the index that makes it a probe.
const PUBLISHED_KEY_SEARCH_MS: u64 = 5_000;

/// The views' statements ([`MessagesSql`]), in PostgreSQL's SQL.
pub(crate) fn messages(t: &Tables) -> MessagesSql {
    MessagesSql {
        // A merge of per-bucket range scans of the pending index (bounded
        // by buckets × limit rows).
        pending: PendingPage::OneStatement(Sql::render(
            t,
            &format!(
                "SELECT m.* FROM {{partitions}} p CROSS JOIN LATERAL (
                    SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
                    WHERE o.partition_key BETWEEN p.partition_key AND p.partition_key
                      AND o.published_at IS NULL AND o.failed_at IS NULL AND o.id > $1
                    ORDER BY o.partition_key, o.id LIMIT $2) m
                 ORDER BY m.id LIMIT $2"
            ),
        )),
        pending_key: Sql::render(
            t,
            &format!(
                "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
                 WHERE o.message_key = $1 AND o.published_at IS NULL AND o.failed_at IS NULL
                   AND o.id > $2
                 ORDER BY o.id LIMIT $3"
            ),
        ),
        published: Sql::render(t, &newest_first("o.published_at IS NOT NULL", false)),
        published_key: Sql::render(t, &newest_first("o.published_at IS NOT NULL", true)),
        failed: Sql::render(t, &newest_first("o.failed_at IS NOT NULL", false)),
        // A parked row is never published; saying so lets the key index
        // over unpublished rows (migration 0012) serve this search.
        failed_key: Sql::render(
            t,
            &newest_first("o.failed_at IS NOT NULL AND o.published_at IS NULL", true),
        ),
        // A `statement_timeout` local to the page's transaction, so it
        // holds behind a transaction pooler too.
        published_key_limit: Some((
            Sql::from_rendered(format!(
                "SELECT set_config('statement_timeout', '{PUBLISHED_KEY_SEARCH_MS}', true)"
            )),
            Duration::from_millis(PUBLISHED_KEY_SEARCH_MS),
        )),
    }
}

/// A drainer's statements ([`DrainSql`]), in PostgreSQL's SQL.
pub(crate) fn drain(t: &Tables) -> DrainSql {
    DrainSql {
        enqueue: enqueue_statement(t),
        claim: ClaimSql {
            read: Sql::render(t, CLAIM_READ),
            take: TakeSql::Returning(Sql::render(t, CLAIM_TAKE)),
        },
        record_published: Sql::render(
            t,
            &record_published("UPDATE {outbox} SET published_at = now()"),
        ),
        delete_published: Sql::render(t, &record_published("DELETE FROM {outbox}")),
        record_failure: Sql::render(t, &record_failure()),
        parked: None,
        purge_lock: None,
        purge: Sql::render(t, &PURGE_BATCH.replace("{lock}", &PURGE_LOCK.to_string())),
        // Until a vacuum, the pending index still holds an entry for every
        // row published since the last one, and each claim steps over those
        // of its bucket: measured, a claim + record cost 1.5–2.1 × as much
        // right after 2M rows were published and purged, and again 1.0 ×
        // after the vacuum (BENCHMARKS.md). It takes no lock that producers
        // or the relay wait for.
        tidy: Sql::render(t, "VACUUM (ANALYZE) {outbox}"),
    }
}

/// The reads across buckets (`store::lookups`), in PostgreSQL's SQL.
pub(crate) fn bucket_reads(t: &Tables) -> BucketReadsSql {
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
