//! SQLite: the `outbox` table's statements (see [`crate::store::outbox`]
//! for what they promise, [`crate::store::drain`] for the flows over them,
//! and [`super`] for how this backend keeps it).
//!
//! A claim is a read and at most one write: a read of the bucket's ready
//! prefix on a reader connection, together with whether the caller still
//! holds the bucket's claim (no lock; a bucket with nothing ready costs the
//! writer nothing). If it holds it — its token, at least the claim's
//! `min_left`, and (fleet mode) its lease still valid — the rows read are
//! the batch: that is exactly the state the taking `UPDATE` would have
//! checked, read in the same snapshot as the rows, so a trickle costs the
//! writer one record per batch and no claim. Records are single `UPDATE`s
//! whose `WHERE` checks the claim token and the fence on the bucket's row
//! (`EXISTS`) in the same statement. Lists are one JSON argument
//! (`json_each`).

use super::{VIEWS, render, seconds_between, sql};
use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::{
    BucketReadsSql, ClaimSql, DrainSql, TakeSql, fleet_fingerprinted, pending_fingerprinted,
    plain_enqueue,
};

/// The fence every write of a drainer carries (see [`DrainSql`]): the
/// bucket's claim is this drainer's and, in fleet mode, the lease is the
/// one it drains under. Parameters: bucket, token, owner, owner, epoch.
const HELD_CLAIM: &str = "EXISTS (
        SELECT 1 FROM {partitions} p
        WHERE p.partition_key = ? AND p.claim_token = ?
          AND (? IS NULL OR (p.lease_owner = ? AND p.lease_epoch = ?)))";

/// A drainer's statements ([`DrainSql`]), in SQLite's SQL.
pub(crate) fn drain(t: &Tables) -> DrainSql {
    let record = |write: &str| {
        sql(
            t,
            &format!(
                "{write}
                 WHERE id IN (SELECT value FROM json_each(?)) AND partition_key = ?
                   AND published_at IS NULL AND {HELD_CLAIM}"
            ),
        )
    };
    DrainSql {
        enqueue: enqueue_statement(t),
        claim: ClaimSql {
            // The partial pending index, in id order.
            read: sql(
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
                   AND (id > ? OR id NOT IN (SELECT value FROM json_each(?)))
                 ORDER BY id LIMIT ?",
            ),
            take: TakeSql::ThenRead(sql(
                t,
                "UPDATE {partitions} SET claim_token = ?, claimed_until = {now+?}
                 WHERE partition_key = ?
                   AND (claim_token IS NULL OR claim_token = ? OR claimed_until <= {now}
                        OR claimed_until > {now+?})
                   AND (? IS NULL OR (lease_owner = ? AND lease_epoch = ?
                                      AND lease_until > {now}))",
            )),
        },
        record_published: record("UPDATE {outbox} SET published_at = {now}"),
        delete_published: record("DELETE FROM {outbox}"),
        // SQLite's SET expressions all see the row as it was, so the
        // backoff and the parking use the attempt count before this
        // failure.
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
        parked: None,
        // One writer at a time: purges by several workers take turns.
        purge_lock: None,
        purge: sql(
            t,
            "DELETE FROM {outbox} WHERE id IN (
                 SELECT id FROM {outbox} INDEXED BY {outbox}_published_idx
                 WHERE published_at IS NOT NULL
                   AND published_at < strftime('%Y-%m-%d %H:%M:%f', 'now',
                                               printf('%+.3f seconds', -? / 1000.0))
                 ORDER BY published_at LIMIT ?)",
        ),
        // Fresh statistics where they matter and a WAL checkpoint; the
        // freed pages are reused by later inserts (a `VACUUM` would rewrite
        // the whole file under the write lock).
        tidy: sql(t, "PRAGMA optimize; PRAGMA wal_checkpoint(PASSIVE)"),
    }
}

/// The plain `INSERT` every producer may use (the table's trigger
/// computes the bucket label).
pub(crate) fn enqueue_statement(t: &Tables) -> Sql {
    plain_enqueue(t)
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
pub(crate) fn bucket_reads(t: &Tables) -> BucketReadsSql {
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
