//! The `outbox_workers` flows, written once over the driver contract
//! (`store::driver`) for every backend ([`WorkerStore`]; the types and
//! what they promise are [`super::workers`]'s): registration under the
//! registrations lock, heartbeats, listing, broker state and sweeping.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::bounds::bounded_op;
use super::driver::{Arg, Driver, Statements};
use super::error::StoreError;
use super::statements::WorkersSql;
use super::workers::{
    Admission, Joined, LiveWorker, Membership, Registration, WorkerCounts, WorkerStore, WorkerView,
};

/// The live workers other than `me`, inside the caller's transaction when
/// `on` is one (registration, repartitioning).
pub(crate) async fn live_others(
    sql: &WorkersSql,
    on: &mut impl Statements,
    me: Uuid,
) -> Result<Vec<LiveWorker>, StoreError> {
    on.fetch_all(&sql.live_others, &[Arg::Uuid(me)], "listing live workers")
        .await
}

#[async_trait]
impl<D: Driver> WorkerStore for D {
    async fn register(
        &self,
        me: Registration<'_>,
        admit: Admission<'_>,
    ) -> Result<Joined, StoreError> {
        let sql = &self.sql().workers;
        bounded_op(self.bounds(), "registering the worker", async {
            let mut tx = self.begin().await?;
            tx.execute(&sql.lock_registrations, &[], "taking the registration lock")
                .await?;
            let others = live_others(sql, &mut tx, me.worker_id).await?;
            if !admit(&others) {
                return Ok(Joined::Refused(others));
            }
            let args = [
                Arg::Uuid(me.worker_id),
                Arg::Text(Some(me.hostname)),
                Arg::Int(i64::from(std::process::id())),
                Arg::Text(Some(env!("CARGO_PKG_VERSION"))),
                Arg::Text(Some(me.mode.as_str())),
                Arg::Duration(me.heartbeat_ttl),
                Arg::Bool(me.can_publish),
                Arg::Text(Some(me.name)),
            ];
            tx.execute(&sql.register, &args, "registering the worker")
                .await?;
            D::commit(tx).await?;
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
        let args = [
            Arg::Duration(ttl),
            Arg::Int(counts.published_total as i64),
            Arg::Int(counts.failed_total as i64),
            Arg::Float(counts.published_rate),
            Arg::Text((!counts.bucket_activity.is_empty()).then_some(&counts.bucket_activity)),
            Arg::Text((!counts.destinations.is_empty()).then_some(&counts.destinations)),
            Arg::Uuid(worker_id),
        ];
        let changed = self
            .pool()
            .execute(&self.sql().workers.heartbeat, &args, "heartbeating")
            .await?;
        Ok(changed == 1)
    }

    async fn list_workers(&self) -> Result<Vec<WorkerView>, StoreError> {
        self.reads()
            .fetch_all(&self.sql().workers.list, &[], "listing workers")
            .await
    }

    async fn remove_worker(&self, worker_id: Uuid) -> Result<(), StoreError> {
        let sql = &self.sql().workers.remove;
        self.pool()
            .execute(sql, &[Arg::Uuid(worker_id)], "removing the worker row")
            .await?;
        Ok(())
    }

    async fn set_broker_state(
        &self,
        worker_id: Uuid,
        can_publish: bool,
        broker_error: Option<&str>,
    ) -> Result<bool, StoreError> {
        let args = [
            Arg::Bool(can_publish),
            Arg::Text(broker_error),
            Arg::Uuid(worker_id),
        ];
        let sql = &self.sql().workers.set_broker_state;
        let changed = self
            .pool()
            .execute(sql, &args, "recording the broker state")
            .await?;
        Ok(changed == 1)
    }

    async fn set_broker_blocked(
        &self,
        worker_id: Uuid,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        let args = [Arg::Text(reason), Arg::Uuid(worker_id)];
        let sql = &self.sql().workers.set_broker_blocked;
        self.pool()
            .execute(sql, &args, "recording broker flow control")
            .await?;
        Ok(())
    }

    async fn membership(
        &self,
        me: Uuid,
        suspect_after: Duration,
    ) -> Result<Membership, StoreError> {
        let sql = &self.sql().workers.live_leasing;
        let rows: Vec<(Uuid, f64, f64)> = self
            .reads()
            .fetch_all(
                sql,
                &[Arg::Uuid(me), Arg::Duration(suspect_after)],
                "listing live workers",
            )
            .await?;
        let suspect = suspect_after.as_secs_f64();
        let stable_for = rows
            .iter()
            .filter(|(id, _, _)| *id != me)
            .map(|&(_, age, expires_in)| (suspect - age).min(expires_in))
            .min_by(f64::total_cmp)
            .map(|s| Duration::try_from_secs_f64(s).unwrap_or_default());
        Ok(Membership {
            live: rows.into_iter().map(|(id, _, _)| id).collect(),
            stable_for,
        })
    }

    async fn remove_dead(&self, grace: Duration) -> Result<u64, StoreError> {
        let sql = &self.sql().workers.remove_dead;
        self.pool()
            .execute(sql, &[Arg::Duration(grace)], "removing dead worker rows")
            .await
    }

    async fn live_others(&self, me: Uuid) -> Result<Vec<LiveWorker>, StoreError> {
        live_others(&self.sql().workers, &mut self.reads(), me).await
    }
}
