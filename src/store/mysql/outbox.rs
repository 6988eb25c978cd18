//! MySQL/MariaDB: the `outbox` table's statements (see
//! [`crate::store::outbox`] for what they promise, and
//! [`crate::store::drain`] for the flows over them).
//!
//! A claim is a read and, when the caller does not hold the bucket's claim
//! already, one `UPDATE` of the bucket's row that takes it under the lease
//! fence: a consistent read of the bucket's first rows from the pending
//! index (no locks). Lists of ids are one JSON argument joined first
//! (`STRAIGHT_JOIN`), so each listed row is found by its primary key. The
//! records check the claim token and the fence on the bucket's row
//! (`EXISTS`) in the statement that writes; an `UPDATE` has no
//! `RETURNING`, so whether a failed row is parked is read after it.

use super::VIEWS;
use super::steps::IDS;
use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::{
    BucketReadsSql, ClaimSql, DrainSql, TakeSql, fleet_fingerprinted, pending_fingerprinted,
    plain_enqueue,
};

/// The fence every write of a drainer carries (see
/// [`DrainSql`]): the bucket's claim is this drainer's and, in fleet mode,
/// the lease is the one it drains under. Parameters: bucket, token, owner,
/// owner, epoch.
const HELD_CLAIM: &str = "EXISTS (
        SELECT 1 FROM {partitions} p
        WHERE p.partition_key = ? AND p.claim_token = ?
          AND (? IS NULL OR (p.lease_owner = ? AND p.lease_epoch = ?)))";

fn sql(t: &Tables, template: &str) -> Sql {
    Sql::render(
        t,
        &template.replace("{ids}", IDS).replace("{held}", HELD_CLAIM),
    )
}

/// A drainer's statements ([`DrainSql`]), in MySQL's SQL.
pub(crate) fn drain(t: &Tables) -> DrainSql {
    // Both records find the batch's rows by primary key through the list.
    let record = |write: &str| {
        sql(
            t,
            &format!(
                "{write}
                 WHERE o.partition_key = ? AND o.published_at IS NULL AND {{held}}"
            ),
        )
    };
    DrainSql {
        enqueue: enqueue_statement(t),
        claim: ClaimSql {
            // From the pending index (forced: the primary key would walk
            // every published row of every bucket).
            read: sql(
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
                 WHERE partition_key = ? AND published_at IS NULL AND failed_at IS NULL
                   AND (id > ? OR id NOT IN (SELECT j.v FROM {ids}))
                 ORDER BY id LIMIT ?",
            ),
            take: TakeSql::ThenRead(sql(
                t,
                "UPDATE {partitions}
                 SET claim_token = ?, claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
                 WHERE partition_key = ?
                   AND (claim_token IS NULL OR claim_token = ? OR claimed_until <= UTC_TIMESTAMP(6)
                        OR claimed_until > UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
                   AND (? IS NULL OR (lease_owner = ? AND lease_epoch = ?
                                      AND lease_until > UTC_TIMESTAMP(6)))",
            )),
        },
        record_published: record(
            "UPDATE {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v
             SET o.published_at = UTC_TIMESTAMP(6)",
        ),
        delete_published: record("DELETE o FROM {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v"),
        // MySQL assigns left to right, each assignment seeing the ones
        // before: the backoff and the parking use the attempt count before
        // this failure, so `attempts` is assigned last.
        record_failure: sql(
            t,
            "UPDATE {outbox}
             SET available_at = UTC_TIMESTAMP(6) + INTERVAL
                     CAST(LEAST(?, ? * POW(2, LEAST(attempts, 30))) * 1000 AS SIGNED) MICROSECOND,
                 failed_at = CASE WHEN ? AND ? > 0 AND attempts + 1 >= ? THEN UTC_TIMESTAMP(6) END,
                 last_error = ?,
                 attempts = attempts + 1
             WHERE id = ? AND partition_key = ? AND published_at IS NULL AND {held}",
        ),
        parked: Some(sql(
            t,
            "SELECT failed_at IS NOT NULL FROM {outbox} WHERE id = ?",
        )),
        // The lock rows of `<outbox>_locks` (see the module docs of
        // [`super`]).
        purge_lock: Some(sql(
            t,
            "SELECT name FROM {outbox}_locks WHERE name = 'purge' FOR UPDATE SKIP LOCKED",
        )),
        // Oldest ids first: they are the published ones.
        purge: sql(
            t,
            "DELETE FROM {outbox}
             WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
             ORDER BY id LIMIT ?",
        ),
        // Fresh statistics for the optimizer. InnoDB's purge thread removes
        // the deleted rows' index entries by itself; a rebuild (`OPTIMIZE
        // TABLE`) is not worth its cost here.
        tidy: sql(t, "ANALYZE TABLE {outbox}"),
    }
}

/// The plain `INSERT` every producer may use (the table's trigger
/// computes the bucket label).
pub(crate) fn enqueue_statement(t: &Tables) -> Sql {
    plain_enqueue(t)
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
pub(crate) fn bucket_reads(t: &Tables) -> BucketReadsSql {
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
