//! MySQL/MariaDB: the `outbox_workers` table's statements (see
//! [`crate::store::workers`] for what they promise). Registrations are
//! serialised by the `registration` row of `<outbox>_locks`, locked
//! `FOR UPDATE` for the length of the registering transaction.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::MySqlExecutor;
use uuid::Uuid;

use super::{MySqlBackend, micros};
use crate::config::TablesConfig;
use crate::store::workers::{
    Admission, Joined, LiveWorker, Registration, WorkerCounts, WorkerStore, WorkerView,
};
use crate::store::{Bounded, QueryContext, Sql, StoreError, bounded_op};

/// The lock row serialising registrations (and repartitioning).
pub(crate) const REGISTRATION_LOCK: &str = "registration";

/// The rendered statements of this module.
#[derive(Debug)]
pub struct WorkersSql {
    lock_registrations: Sql,
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

impl WorkersSql {
    pub fn new(t: &TablesConfig) -> Self {
        Self {
            lock_registrations: Sql::render(
                t,
                "SELECT name FROM {outbox}_locks WHERE name = ? FOR UPDATE",
            ),
            register: Sql::render(
                t,
                "INSERT INTO {workers} (worker_id, hostname, pid, version, mode, heartbeat_until, can_publish)
                 VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?)",
            ),
            heartbeat: Sql::render(
                t,
                "UPDATE {workers} SET heartbeat_at = UTC_TIMESTAMP(6),
                     heartbeat_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                     published_total = ?, failed_total = ?, published_rate = ?
                 WHERE worker_id = ?",
            ),
            list: Sql::render(
                t,
                "SELECT w.worker_id, w.hostname, w.pid, w.version, w.mode, w.started_at, w.heartbeat_at,
                        TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), w.heartbeat_until) / 1e6
                            AS heartbeat_ttl_seconds,
                        w.heartbeat_until > UTC_TIMESTAMP(6) AS live,
                        (SELECT COUNT(*) FROM {partitions} p
                         WHERE p.lease_owner = w.worker_id AND p.lease_until > UTC_TIMESTAMP(6)) AS buckets,
                        w.published_total, w.failed_total, w.published_rate,
                        w.can_publish, w.broker_error, w.broker_blocked
                 FROM {workers} w ORDER BY w.worker_id",
            ),
            remove: Sql::render(t, "DELETE FROM {workers} WHERE worker_id = ?"),
            live_leasing: Sql::render(
                t,
                "SELECT worker_id FROM {workers}
                 WHERE heartbeat_until > UTC_TIMESTAMP(6) AND mode = 'leasing' AND can_publish
                 ORDER BY worker_id",
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
                "SELECT worker_id, hostname, pid, mode,
                        TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), heartbeat_until) / 1e6 AS expires_in
                 FROM {workers}
                 WHERE heartbeat_until > UTC_TIMESTAMP(6) AND worker_id <> ? ORDER BY worker_id",
            ),
        }
    }

    /// Serialises registrations until the caller's transaction ends.
    pub(crate) async fn lock_registrations<'e, E: MySqlExecutor<'e>>(
        &self,
        exec: E,
    ) -> Result<(), StoreError> {
        sqlx::query(self.lock_registrations.q())
            .bind(REGISTRATION_LOCK)
            .execute(exec)
            .bounded("taking the registration lock")
            .await?;
        Ok(())
    }

    /// Live workers other than `me`.
    pub(crate) async fn live_others<'e, E: MySqlExecutor<'e>>(
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

#[async_trait]
impl WorkerStore for MySqlBackend {
    async fn register(
        &self,
        me: Registration<'_>,
        admit: Admission<'_>,
    ) -> Result<Joined, StoreError> {
        bounded_op("registering the worker", async {
            let w = &self.workers;
            let mut tx = self.pool.begin().await.doing("starting a transaction")?;
            w.lock_registrations(&mut *tx).await?;
            let others = w.live_others(&mut *tx, me.worker_id).await?;
            if !admit(&others) {
                return Ok(Joined::Refused(others));
            }
            sqlx::query(w.register.q())
                .bind(me.worker_id)
                .bind(me.hostname)
                .bind(std::process::id() as i32)
                .bind(env!("CARGO_PKG_VERSION"))
                .bind(me.mode.as_str())
                .bind(micros(me.heartbeat_ttl))
                .bind(me.can_publish)
                .execute(&mut *tx)
                .await
                .doing("registering the worker")?;
            tx.commit().await.doing("committing the registration")?;
            Ok(Joined::Registered)
        })
        .await
    }

    async fn heartbeat(
        &self,
        worker_id: Uuid,
        ttl: Duration,
        counts: WorkerCounts,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(self.workers.heartbeat.q())
            .bind(micros(ttl))
            .bind(counts.published_total as i64)
            .bind(counts.failed_total as i64)
            .bind(counts.published_rate)
            .bind(worker_id)
            .execute(&self.pool)
            .bounded("heartbeating")
            .await?
            .rows_affected()
            == 1)
    }

    async fn list_workers(&self) -> Result<Vec<WorkerView>, StoreError> {
        sqlx::query_as(self.workers.list.q())
            .fetch_all(&self.pool)
            .bounded("listing workers")
            .await
    }

    async fn remove_worker(&self, worker_id: Uuid) -> Result<(), StoreError> {
        sqlx::query(self.workers.remove.q())
            .bind(worker_id)
            .execute(&self.pool)
            .bounded("removing the worker row")
            .await?;
        Ok(())
    }

    async fn set_broker_state(
        &self,
        worker_id: Uuid,
        can_publish: bool,
        broker_error: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(self.workers.set_broker_state.q())
            .bind(can_publish)
            .bind(broker_error)
            .bind(worker_id)
            .execute(&self.pool)
            .bounded("recording the broker state")
            .await?
            .rows_affected()
            == 1)
    }

    async fn set_broker_blocked(
        &self,
        worker_id: Uuid,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(self.workers.set_broker_blocked.q())
            .bind(reason)
            .bind(worker_id)
            .execute(&self.pool)
            .bounded("recording broker flow control")
            .await?;
        Ok(())
    }

    async fn live_leasing(&self) -> Result<Vec<Uuid>, StoreError> {
        sqlx::query_scalar(self.workers.live_leasing.q())
            .fetch_all(&self.pool)
            .bounded("listing live workers")
            .await
    }

    async fn remove_dead(&self, grace: Duration) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.workers.remove_dead.q())
            .bind(micros(grace))
            .execute(&self.pool)
            .bounded("removing dead worker rows")
            .await?
            .rows_affected())
    }

    async fn live_others(&self, me: Uuid) -> Result<Vec<LiveWorker>, StoreError> {
        self.workers.live_others(&self.pool, me).await
    }
}
