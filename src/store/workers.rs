//! The `outbox_workers` table: one row per live worker process.
//!
//! A worker inserts its row at start, pushes `heartbeat_until` forward from
//! its own task, and deletes the row on a clean exit. A worker is *live*
//! while `heartbeat_until > now()` (the database's clock, never the worker's).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{Bounded, Sql, StoreError};
use crate::config::TablesConfig;

/// Advisory lock key serialising registrations (fixed; "outboxd" in ASCII).
pub const REGISTRATION_LOCK: i64 = 0x006f_7574_626f_7864;

/// How a worker drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerMode {
    /// Fleet member: publishes only buckets it holds a lease on.
    Leasing,
    /// Single development worker: every bucket, no leases.
    NoLeasing,
}

impl WorkerMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerMode::Leasing => "leasing",
            WorkerMode::NoLeasing => "no-leasing",
        }
    }
}

/// A live worker other than the caller.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LiveWorker {
    pub worker_id: Uuid,
    pub hostname: String,
    pub pid: i32,
    pub mode: String,
    /// Seconds until its heartbeat expires.
    pub expires_in: f64,
}

/// A worker as the dashboard shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct WorkerView {
    pub worker_id: Uuid,
    pub hostname: String,
    pub pid: i32,
    pub version: String,
    pub mode: String,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// Seconds until the heartbeat expires (negative: expired, not yet
    /// cleaned up — the worker is gone).
    pub heartbeat_ttl_seconds: f64,
    pub live: bool,
    /// Buckets it holds a valid lease on.
    pub buckets: i64,
    pub published_total: i64,
    pub failed_total: i64,
    /// Rows per second over its last heartbeat period.
    pub published_rate: f64,
    /// False while it cannot reach the broker (beyond `broker_grace`): it
    /// holds no buckets and is left out of every worker's targets.
    pub can_publish: bool,
    /// Why it cannot publish, while it cannot.
    pub broker_error: Option<String>,
    /// Why RabbitMQ blocked its connection (a resource alarm), while it does.
    pub broker_blocked: Option<String>,
}

/// What a heartbeat reports besides being alive.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkerCounts {
    pub published_total: u64,
    pub failed_total: u64,
    pub published_rate: f64,
}

/// The rendered statements of this module.
#[derive(Debug)]
pub struct WorkersSql {
    list: Sql,
    register: Sql,
    heartbeat: Sql,
    remove: Sql,
    live_others: Sql,
    live_leasing: Sql,
    remove_dead: Sql,
    set_broker_state: Sql,
    set_broker_blocked: Sql,
}

fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

impl WorkersSql {
    pub fn new(t: &TablesConfig) -> Self {
        Self {
            register: Sql::render(
                t,
                "INSERT INTO {workers} (worker_id, hostname, pid, version, mode, heartbeat_until, can_publish)
                 VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6::float8 / 1000), $7)",
            ),
            heartbeat: Sql::render(
                t,
                "UPDATE {workers} SET heartbeat_at = now(),
                     heartbeat_until = now() + make_interval(secs => $2::float8 / 1000),
                     published_total = $3, failed_total = $4, published_rate = $5
                 WHERE worker_id = $1",
            ),
            list: Sql::render(
                t,
                "SELECT w.worker_id, w.hostname, w.pid, w.version, w.mode, w.started_at, w.heartbeat_at,
                        extract(epoch FROM w.heartbeat_until - now())::float8 AS heartbeat_ttl_seconds,
                        w.heartbeat_until > now() AS live,
                        (SELECT count(*) FROM {partitions} p
                         WHERE p.lease_owner = w.worker_id AND p.lease_until > now()) AS buckets,
                        w.published_total, w.failed_total, w.published_rate,
                        w.can_publish, w.broker_error, w.broker_blocked
                 FROM {workers} w ORDER BY w.worker_id",
            ),
            remove: Sql::render(t, "DELETE FROM {workers} WHERE worker_id = $1"),
            live_leasing: Sql::render(
                t,
                "SELECT worker_id FROM {workers}
                 WHERE heartbeat_until > now() AND mode = 'leasing' AND can_publish
                 ORDER BY worker_id",
            ),
            set_broker_state: Sql::render(
                t,
                "UPDATE {workers} SET can_publish = $2, broker_error = $3 WHERE worker_id = $1",
            ),
            set_broker_blocked: Sql::render(
                t,
                "UPDATE {workers} SET broker_blocked = $2 WHERE worker_id = $1",
            ),
            remove_dead: Sql::render(
                t,
                "DELETE FROM {workers} WHERE heartbeat_until < now() - make_interval(secs => $1::float8 / 1000)",
            ),
            live_others: Sql::render(
                t,
                "SELECT worker_id, hostname, pid, mode,
                        extract(epoch FROM heartbeat_until - now())::float8 AS expires_in
                 FROM {workers}
                 WHERE heartbeat_until > now() AND worker_id <> $1 ORDER BY worker_id",
            ),
        }
    }

    /// Serialises registrations until the caller's transaction ends.
    pub async fn lock_registrations<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
    ) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(REGISTRATION_LOCK)
            .execute(exec)
            .bounded("taking the registration lock")
            .await?;
        Ok(())
    }

    /// Inserts this worker's row. A fleet worker joins with `can_publish =
    /// false`: its coordinator sets it once it runs, so peers hand buckets
    /// over only to a worker ready to take them.
    pub async fn register<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        worker_id: Uuid,
        hostname: &str,
        mode: WorkerMode,
        ttl: Duration,
        can_publish: bool,
    ) -> Result<(), StoreError> {
        sqlx::query(self.register.q())
            .bind(worker_id)
            .bind(hostname)
            .bind(std::process::id() as i32)
            .bind(env!("CARGO_PKG_VERSION"))
            .bind(mode.as_str())
            .bind(ms(ttl))
            .bind(can_publish)
            .execute(exec)
            .bounded("registering the worker")
            .await?;
        Ok(())
    }

    /// Pushes `heartbeat_until` forward; false when the row is gone (another
    /// process cleaned it up as dead), so the caller can re-register.
    pub async fn heartbeat<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        worker_id: Uuid,
        ttl: Duration,
        counts: WorkerCounts,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(self.heartbeat.q())
            .bind(worker_id)
            .bind(ms(ttl))
            .bind(counts.published_total as i64)
            .bind(counts.failed_total as i64)
            .bind(counts.published_rate)
            .execute(exec)
            .bounded("heartbeating")
            .await?
            .rows_affected()
            == 1)
    }

    /// Every worker row, live or expired, for the dashboard.
    pub async fn list<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
    ) -> Result<Vec<WorkerView>, StoreError> {
        sqlx::query_as(self.list.q())
            .fetch_all(exec)
            .bounded("listing workers")
            .await
    }

    /// Deletes this worker's row (clean exit).
    pub async fn remove<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        worker_id: Uuid,
    ) -> Result<(), StoreError> {
        sqlx::query(self.remove.q())
            .bind(worker_id)
            .execute(exec)
            .bounded("removing the worker row")
            .await?;
        Ok(())
    }

    /// Records whether this worker can reach the broker; false when its row
    /// is gone.
    pub async fn set_broker_state<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        worker_id: Uuid,
        can_publish: bool,
        broker_error: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(self.set_broker_state.q())
            .bind(worker_id)
            .bind(can_publish)
            .bind(broker_error)
            .execute(exec)
            .bounded("recording the broker state")
            .await?
            .rows_affected()
            == 1)
    }

    /// Records why RabbitMQ blocks this worker's connection (`None`: it
    /// does not), for the dashboard.
    pub async fn set_broker_blocked<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        worker_id: Uuid,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(self.set_broker_blocked.q())
            .bind(worker_id)
            .bind(reason)
            .execute(exec)
            .bounded("recording broker flow control")
            .await?;
        Ok(())
    }

    /// Ids of the live fleet-mode workers that can publish, sorted: the
    /// input of target computation.
    pub async fn live_leasing<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
    ) -> Result<Vec<Uuid>, StoreError> {
        sqlx::query_scalar(self.live_leasing.q())
            .fetch_all(exec)
            .bounded("listing live workers")
            .await
    }

    /// Deletes rows whose heartbeat expired more than `grace` ago (workers
    /// that died without cleaning up). Returns how many.
    pub async fn remove_dead<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        grace: Duration,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.remove_dead.q())
            .bind(ms(grace))
            .execute(exec)
            .bounded("removing dead worker rows")
            .await?
            .rows_affected())
    }

    /// Live workers other than `me`.
    pub async fn live_others<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        me: Uuid,
    ) -> Result<Vec<LiveWorker>, StoreError> {
        sqlx::query_as(self.live_others.q())
            .bind(me)
            .fetch_all(exec)
            .bounded("listing live workers")
            .await
    }
}
