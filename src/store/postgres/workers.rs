//! PostgreSQL: the `outbox_workers` table's statements (see
//! [`crate::store::workers`] for what they promise and the flows that run
//! them). Registrations are serialised by a transaction-scoped advisory
//! lock.

use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::WorkersSql;

/// Advisory lock key serialising registrations (fixed; "outboxd" in ASCII).
pub const REGISTRATION_LOCK: i64 = 0x006f_7574_626f_7864;

/// The statements, in PostgreSQL (parameters as [`WorkersSql`] orders them).
pub fn statements(t: &Tables) -> WorkersSql {
    WorkersSql {
        lock_registrations: Sql::render(
            t,
            &format!("SELECT pg_advisory_xact_lock({REGISTRATION_LOCK})"),
        ),
        register: Sql::render(
            t,
            "INSERT INTO {workers} (worker_id, hostname, pid, version, mode, heartbeat_until, can_publish, name)
             VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6::float8 / 1000), $7, $8)",
        ),
        heartbeat: Sql::render(
            t,
            "UPDATE {workers} SET heartbeat_at = now(),
                 heartbeat_until = now() + make_interval(secs => $1::float8 / 1000),
                 published_total = $2, failed_total = $3, published_rate = $4,
                 bucket_activity = $5, destinations = $6
             WHERE worker_id = $7",
        ),
        list: Sql::render(
            t,
            "SELECT w.worker_id, COALESCE(w.name, w.hostname || ':' || w.pid) AS name, w.hostname, w.pid, w.version, w.mode, w.started_at, w.heartbeat_at,
                    extract(epoch FROM w.heartbeat_until - now())::float8 AS heartbeat_ttl_seconds,
                    w.heartbeat_until > now() AS live,
                    (SELECT count(*) FROM {partitions} p
                     WHERE p.lease_owner = w.worker_id AND p.lease_until > now()) AS buckets,
                    w.published_total, w.failed_total, w.published_rate,
                    w.can_publish, w.broker_error, w.broker_blocked, w.bucket_activity,
                    w.destinations
             FROM {workers} w ORDER BY w.worker_id",
        ),
        remove: Sql::render(t, "DELETE FROM {workers} WHERE worker_id = $1"),
        live_leasing: Sql::render(
            t,
            "SELECT w.worker_id, extract(epoch FROM now() - w.heartbeat_at)::float8,
                    extract(epoch FROM w.heartbeat_until - now())::float8
             FROM {workers} w
             WHERE w.heartbeat_until > now() AND w.mode = 'leasing' AND w.can_publish
               AND (w.worker_id = $1 OR w.heartbeat_at > now() - make_interval(secs => $2::float8 / 1000)
                    OR EXISTS (SELECT 1 FROM {partitions} p
                               WHERE p.lease_owner = w.worker_id AND p.lease_until > now()))
             ORDER BY w.worker_id",
        ),
        set_broker_state: Sql::render(
            t,
            "UPDATE {workers} SET can_publish = $1, broker_error = $2 WHERE worker_id = $3",
        ),
        set_broker_blocked: Sql::render(
            t,
            "UPDATE {workers} SET broker_blocked = $1 WHERE worker_id = $2",
        ),
        remove_dead: Sql::render(
            t,
            "DELETE FROM {workers} WHERE heartbeat_until < now() - make_interval(secs => $1::float8 / 1000)",
        ),
        live_others: Sql::render(
            t,
            "SELECT worker_id, COALESCE(name, hostname || ':' || pid) AS name, hostname, pid, mode,
                    extract(epoch FROM heartbeat_until - now())::float8 AS expires_in
             FROM {workers}
             WHERE heartbeat_until > now() AND worker_id <> $1 ORDER BY worker_id",
        ),
    }
}
