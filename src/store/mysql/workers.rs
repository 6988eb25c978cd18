//! MySQL/MariaDB: the `outbox_workers` table's statements (see
//! [`crate::store::workers`] for what they promise and the flows that run
//! them). Registrations are serialised by the `registration` row of
//! `<outbox>_locks`, locked `FOR UPDATE` for the length of the registering
//! transaction.

use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::WorkersSql;

/// The lock row serialising registrations (and repartitioning).
pub(crate) const REGISTRATION_LOCK: &str = "registration";

/// The statements, in MySQL (parameters as [`WorkersSql`] orders them).
pub fn statements(t: &Tables) -> WorkersSql {
    WorkersSql {
    lock_registrations: Sql::render(
            t,
            &format!("SELECT name FROM {{outbox}}_locks WHERE name = '{REGISTRATION_LOCK}' FOR UPDATE"),
        ),
        register: Sql::render(
            t,
            "INSERT INTO {workers} (worker_id, hostname, pid, version, mode, heartbeat_until, can_publish, name)
             VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?, ?)",
        ),
        heartbeat: Sql::render(
            t,
            "UPDATE {workers} SET heartbeat_at = UTC_TIMESTAMP(6),
                 heartbeat_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                 published_total = ?, failed_total = ?, published_rate = ?,
                 bucket_activity = ?, destinations = ?
             WHERE worker_id = ?",
        ),
        list: Sql::render(
            t,
            "SELECT w.worker_id, COALESCE(w.name, CONCAT(w.hostname, ':', w.pid)) AS name, w.hostname, w.pid, w.version, w.mode, w.started_at, w.heartbeat_at,
                    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), w.heartbeat_until) / 1e6
                        AS heartbeat_ttl_seconds,
                    w.heartbeat_until > UTC_TIMESTAMP(6) AS live,
                    (SELECT COUNT(*) FROM {partitions} p
                     WHERE p.lease_owner = w.worker_id AND p.lease_until > UTC_TIMESTAMP(6)) AS buckets,
                    w.published_total, w.failed_total, w.published_rate,
                    w.can_publish, w.broker_error, w.broker_blocked, w.bucket_activity,
                    w.destinations
             FROM {workers} w ORDER BY w.worker_id",
        ),
        remove: Sql::render(t, "DELETE FROM {workers} WHERE worker_id = ?"),
        live_leasing: Sql::render(
            t,
            "SELECT w.worker_id, TIMESTAMPDIFF(MICROSECOND, w.heartbeat_at, UTC_TIMESTAMP(6)) / 1e6,
                    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), w.heartbeat_until) / 1e6
             FROM {workers} w
             WHERE w.heartbeat_until > UTC_TIMESTAMP(6) AND w.mode = 'leasing' AND w.can_publish
               AND (w.worker_id = ? OR w.heartbeat_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
                    OR EXISTS (SELECT 1 FROM {partitions} p
                               WHERE p.lease_owner = w.worker_id AND p.lease_until > UTC_TIMESTAMP(6)))
             ORDER BY w.worker_id",
        ),
        set_broker_state: Sql::render(
            t,
            "UPDATE {workers} SET can_publish = ?, broker_error = ? WHERE worker_id = ?",
        ),
        set_broker_blocked: Sql::render(
            t,
            "UPDATE {workers} SET broker_blocked = ? WHERE worker_id = ?",
        ),
        remove_dead: Sql::render(
            t,
            "DELETE FROM {workers}
             WHERE heartbeat_until < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
        ),
        live_others: Sql::render(
            t,
            "SELECT worker_id, COALESCE(name, CONCAT(hostname, ':', pid)) AS name, hostname, pid, mode,
                    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), heartbeat_until) / 1e6 AS expires_in
             FROM {workers}
             WHERE heartbeat_until > UTC_TIMESTAMP(6) AND worker_id <> ? ORDER BY worker_id",
        ),
    }
}
