//! SQLite: the `outbox_workers` table's statements (see
//! [`crate::store::workers`] for what they promise and the flows that run
//! them). Registrations are serialised by the registering transaction
//! itself: it is a write transaction (`BEGIN IMMEDIATE`), and SQLite has
//! one writer at a time.

use super::{seconds_between, sql};
use crate::store::settings::Tables;
use crate::store::statements::WorkersSql;

/// The statements, in SQLite (parameters as [`WorkersSql`] orders them).
pub fn statements(t: &Tables) -> WorkersSql {
    WorkersSql {
        // The write transaction already holds the file's write lock.
        lock_registrations: sql(t, "SELECT 1"),
        register: sql(
            t,
            "INSERT INTO {workers} (worker_id, hostname, pid, version, mode, heartbeat_until, can_publish, name)
             VALUES (?, ?, ?, ?, ?, {now+?}, ?, ?)",
        ),
        heartbeat: sql(
            t,
            "UPDATE {workers} SET heartbeat_at = {now}, heartbeat_until = {now+?},
                 published_total = ?, failed_total = ?, published_rate = ?,
                 bucket_activity = ?, destinations = ?
             WHERE worker_id = ?",
        ),
        list: sql(
            t,
            &format!(
                "SELECT w.worker_id, COALESCE(w.name, w.hostname || ':' || w.pid) AS name, w.hostname, w.pid, w.version, w.mode, w.started_at, w.heartbeat_at,
                        {} AS heartbeat_ttl_seconds,
                        w.heartbeat_until > {{now}} AS live,
                        (SELECT count(*) FROM {{partitions}} p
                         WHERE p.lease_owner = w.worker_id AND p.lease_until > {{now}}) AS buckets,
                        w.published_total, w.failed_total, w.published_rate,
                        w.can_publish, w.broker_error, w.broker_blocked, w.bucket_activity,
                    w.destinations
                 FROM {{workers}} w ORDER BY w.worker_id",
                seconds_between("{now}", "w.heartbeat_until")
            ),
        ),
        remove: sql(t, "DELETE FROM {workers} WHERE worker_id = ?"),
        live_leasing: sql(
            t,
            &format!(
                "SELECT w.worker_id, {} , {}
                 FROM {{workers}} w
                 WHERE w.heartbeat_until > {{now}} AND w.mode = 'leasing' AND w.can_publish
                   AND (w.worker_id = ? OR w.heartbeat_at > strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', -? / 1000.0))
                        OR EXISTS (SELECT 1 FROM {{partitions}} p
                                   WHERE p.lease_owner = w.worker_id AND p.lease_until > {{now}}))
                 ORDER BY w.worker_id",
                seconds_between("w.heartbeat_at", "{now}"),
                seconds_between("{now}", "w.heartbeat_until")
            ),
        ),
        set_broker_state: sql(
            t,
            "UPDATE {workers} SET can_publish = ?, broker_error = ? WHERE worker_id = ?",
        ),
        set_broker_blocked: sql(
            t,
            "UPDATE {workers} SET broker_blocked = ? WHERE worker_id = ?",
        ),
        remove_dead: sql(
            t,
            "DELETE FROM {workers}
             WHERE heartbeat_until < strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', -? / 1000.0))",
        ),
        live_others: sql(
            t,
            &format!(
                "SELECT worker_id, COALESCE(name, hostname || ':' || pid) AS name, hostname, pid, mode, {} AS expires_in
                 FROM {{workers}}
                 WHERE heartbeat_until > {{now}} AND worker_id <> ? ORDER BY worker_id",
                seconds_between("{now}", "heartbeat_until")
            ),
        ),
    }
}
