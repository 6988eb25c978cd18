//! PostgreSQL: the `outbox_partitions` table's statements (see
//! [`crate::store::partitions`] for what they promise). Each is one
//! statement: the change, its condition and its lease event together.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::PgBackend;
use super::driver::millis;
use crate::config::TablesConfig;
use crate::store::partitions::{Acquired, BucketView, PartitionStore};
use crate::store::statements::PartitionLookupsSql;
use crate::store::{Bounded, Bounds, Sql, StoreError, render};

/// Inserts a row for every bucket label that has none.
pub(crate) async fn ensure_rows<'e, E: PgExecutor<'e>>(
    exec: E,
    bounds: &Bounds,
    tables: &TablesConfig,
    labels: &[String],
) -> Result<u64, StoreError> {
    Ok(sqlx::query(sqlx::AssertSqlSafe(render(
        tables,
        "INSERT INTO {partitions} (partition_key) SELECT unnest($1::text[]) ON CONFLICT (partition_key) DO NOTHING",
    )))
    .bind(labels)
    .execute(exec)
    .bounded(bounds, "creating bucket rows").await?
    .rows_affected())
}

/// The rendered statements of this module.
#[derive(Debug)]
pub struct PartitionsSql {
    acquire: Sql,
    renew: Sql,
    renew_and_beat: Sql,
    release: Sql,
    release_all: Sql,
    overview: Sql,
}

/// Extends the leases `$3` (buckets) under `$4` (epochs) still held by `$1`
/// to `$2` ms; returns the buckets renewed (alone, or inside
/// `renew_and_beat`).
const RENEW: &str = "UPDATE {partitions} p
    SET lease_until = now() + make_interval(secs => $2::float8 / 1000), updated_at = now()
    FROM unnest($3::text[], $4::bigint[]) AS h(partition_key, epoch)
    WHERE p.partition_key = h.partition_key AND p.lease_owner = $1 AND p.lease_epoch = h.epoch
    RETURNING p.partition_key";

impl PartitionsSql {
    pub fn new(t: &TablesConfig) -> Self {
        Self {
            acquire: Sql::render(
                t,
                "WITH candidates AS (
                    SELECT partition_key, lease_owner, lease_epoch FROM {partitions}
                    WHERE partition_key = ANY($2::text[]) AND (lease_owner IS NULL OR lease_until <= now())
                    FOR UPDATE SKIP LOCKED
                 ), acquired AS (
                    UPDATE {partitions} p
                    SET lease_owner = $1, lease_until = now() + make_interval(secs => $3::float8 / 1000),
                        lease_epoch = p.lease_epoch + 1, updated_at = now()
                    FROM candidates c
                    WHERE p.partition_key = c.partition_key
                    RETURNING p.partition_key, c.lease_owner AS old_owner, c.lease_epoch AS old_epoch,
                              p.lease_epoch AS new_epoch
                 ), logged AS (
                    INSERT INTO {outbox}_lease_events
                        (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
                    SELECT partition_key, 'acquire', $1, old_owner, old_epoch, new_epoch,
                           CASE WHEN old_owner IS NULL THEN 'free: ' || $4
                                ELSE 'expired lease of ' || old_owner || ': ' || $4 END
                    FROM acquired
                 )
                 SELECT partition_key, new_epoch AS lease_epoch FROM acquired",
            ),
            renew: Sql::render(t, RENEW),
            // The renewal's rows, then one NULL if the worker row was beaten.
            renew_and_beat: Sql::render(
                t,
                &format!(
                    "WITH renewed AS ({RENEW}), beat AS (
                        UPDATE {{workers}} SET heartbeat_at = now(),
                            heartbeat_until = now() + make_interval(secs => $5::float8 / 1000)
                        WHERE worker_id = $1
                        RETURNING worker_id
                     )
                     SELECT partition_key FROM renewed
                     UNION ALL SELECT NULL FROM beat"
                ),
            ),
            release: Sql::render(
                t,
                "WITH released AS (
                    UPDATE {partitions} p
                    SET lease_owner = NULL, lease_until = NULL, updated_at = now()
                    FROM unnest($2::text[], $3::bigint[]) AS h(partition_key, epoch)
                    WHERE p.partition_key = h.partition_key AND p.lease_owner = $1 AND p.lease_epoch = h.epoch
                    RETURNING p.partition_key, p.lease_epoch
                 ), logged AS (
                    INSERT INTO {outbox}_lease_events
                        (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
                    SELECT partition_key, 'release', $1, $1, lease_epoch, lease_epoch, $4 FROM released
                 )
                 SELECT partition_key FROM released",
            ),
            release_all: Sql::render(
                t,
                "WITH released AS (
                    UPDATE {partitions}
                    SET lease_owner = NULL, lease_until = NULL, updated_at = now()
                    WHERE lease_owner = $1
                    RETURNING partition_key, lease_epoch
                 ), logged AS (
                    INSERT INTO {outbox}_lease_events
                        (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
                    SELECT partition_key, 'release', $1, $1, lease_epoch, lease_epoch, $2 FROM released
                 )
                 SELECT partition_key FROM released",
            ),
            // Every count is capped (`LIMIT $1` inside), so the cost is
            // bounded by buckets × cap whatever the table size.
            overview: Sql::render(
                t,
                "SELECT p.partition_key, p.lease_owner, p.lease_epoch,
                        extract(epoch FROM p.lease_until - now())::float8 AS lease_ttl_seconds,
                        c.n AS pending, c.n >= $1 AS pending_capped,
                        (SELECT count(*) FROM (SELECT 1 FROM {outbox} o
                            WHERE o.partition_key = p.partition_key AND o.failed_at IS NOT NULL LIMIT $1) f) AS parked,
                        h.id AS head_id,
                        coalesce(extract(epoch FROM now() - h.created_at)::float8, 0) AS lag_seconds,
                        h.attempts AS head_attempts,
                        CASE WHEN h.attempts > 0 THEN h.last_error END AS head_error,
                        CASE WHEN h.attempts > 0 THEN h.available_at END AS head_retry_at
                 FROM {partitions} p
                 CROSS JOIN LATERAL (SELECT count(*) AS n FROM (SELECT 1 FROM {outbox} o
                     WHERE o.partition_key BETWEEN p.partition_key AND p.partition_key
                       AND o.published_at IS NULL AND o.failed_at IS NULL LIMIT $1) x) c
                 LEFT JOIN LATERAL (SELECT id, created_at, attempts, last_error, available_at FROM {outbox} o
                     WHERE o.partition_key BETWEEN p.partition_key AND p.partition_key
                       AND o.published_at IS NULL AND o.failed_at IS NULL
                     ORDER BY o.partition_key, o.id LIMIT 1) h ON true
                 ORDER BY p.partition_key",
            ),
        }
    }
}

#[async_trait]
impl PartitionStore for PgBackend {
    async fn ensure_bucket_rows(&self, labels: &[String]) -> Result<u64, StoreError> {
        ensure_rows(&self.pool, self.pool.bounds(), &self.tables, labels).await
    }

    /// Takes every bucket of `wanted` that is free or whose lease expired.
    async fn acquire(
        &self,
        me: Uuid,
        wanted: &[String],
        ttl: Duration,
        reason: &str,
    ) -> Result<Vec<Acquired>, StoreError> {
        sqlx::query_as(self.partitions.acquire.q())
            .bind(me)
            .bind(wanted)
            .bind(millis(ttl))
            .bind(reason)
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "acquiring leases")
            .await
    }

    /// Extends the given leases (bucket, epoch) that are still ours; returns
    /// the buckets renewed — any other was lost.
    async fn renew(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        ttl: Duration,
    ) -> Result<Vec<String>, StoreError> {
        let (keys, epochs): (Vec<String>, Vec<i64>) = held.iter().cloned().unzip();
        sqlx::query_scalar(self.partitions.renew.q())
            .bind(me)
            .bind(millis(ttl))
            .bind(keys)
            .bind(epochs)
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "renewing leases")
            .await
    }

    async fn renew_and_beat(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        ttl: Duration,
        heartbeat_ttl: Duration,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let (keys, epochs): (Vec<String>, Vec<i64>) = held.iter().cloned().unzip();
        let rows: Vec<Option<String>> = sqlx::query_scalar(self.partitions.renew_and_beat.q())
            .bind(me)
            .bind(millis(ttl))
            .bind(keys)
            .bind(epochs)
            .bind(millis(heartbeat_ttl))
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "renewing leases")
            .await?;
        let beat = rows.iter().any(Option::is_none);
        Ok((rows.into_iter().flatten().collect(), beat))
    }

    /// Frees the given leases (bucket, epoch) that are still ours.
    async fn release_leases(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        reason: &str,
    ) -> Result<Vec<String>, StoreError> {
        let (keys, epochs): (Vec<String>, Vec<i64>) = held.iter().cloned().unzip();
        sqlx::query_scalar(self.partitions.release.q())
            .bind(me)
            .bind(keys)
            .bind(epochs)
            .bind(reason)
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "releasing leases")
            .await
    }

    /// Frees every lease `me` holds, whatever its epoch: on shutdown, when
    /// no drainer of `me` runs any more (so also a lease it took in a
    /// statement whose answer it never saw).
    async fn release_all_leases(&self, me: Uuid, reason: &str) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(self.partitions.release_all.q())
            .bind(me)
            .bind(reason)
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "releasing leases")
            .await
    }

    /// Every bucket with its lease, capped pending/parked counts and head.
    async fn overview(&self, cap: i64) -> Result<Vec<BucketView>, StoreError> {
        sqlx::query_as(self.partitions.overview.q())
            .bind(cap)
            .fetch_all(&self.pool)
            .bounded(self.pool.bounds(), "reading the bucket overview")
            .await
    }
}

/// The partitions table's reads (`store::lookups`), in this backend's SQL.
pub(crate) fn lookups(t: &TablesConfig) -> PartitionLookupsSql {
    PartitionLookupsSql {
        leases: Sql::render(
            t,
            "SELECT partition_key, lease_owner, lease_until, lease_epoch,
                    coalesce(lease_until > now(), false) AS valid
             FROM {partitions} ORDER BY partition_key",
        ),
        events_since: Sql::render(
            t,
            "SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
             FROM {outbox}_lease_events WHERE id > $1 ORDER BY id LIMIT $2",
        ),
        events_within: Sql::render(
            t,
            "SELECT * FROM (
                SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
                FROM {outbox}_lease_events
                WHERE at > now() - make_interval(secs => $1::float8 / 1000.0)
                ORDER BY at DESC, id DESC LIMIT $2
             ) recent ORDER BY id",
        ),
    }
}
