//! SQLite: the `outbox_partitions` table's statements (see
//! [`crate::store::partitions`] for what they promise).
//!
//! A change of owner reads the rows it will change and changes them, with
//! its lease events, in one write transaction (`BEGIN IMMEDIATE`): no other
//! writer runs between the read and the write, so the epoch each acquirer
//! computes (`old + 1`) is the one it writes, and no epoch goes to two
//! owners. A renew is one `UPDATE … RETURNING` matching owner and epoch.
//! Held leases travel as one JSON argument: `[["p01", 3], …]`.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::driver::{Tx, millis};
use super::{SqliteBackend, VIEWS, json_list, render, seconds_between, sql};
use crate::config::TablesConfig;
use crate::store::partitions::{Acquired, BucketView, PartitionStore, acquire_reason};
use crate::store::statements::PartitionLookupsSql;
use crate::store::views;
use crate::store::{Bounded, QueryContext, Sql, StoreError, bounded_op};

/// `(partition_key, lease_epoch)` is one of the held pairs (parameter: the
/// pairs as JSON).
const HELD: &str = "(partition_key, lease_epoch) IN (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))";

/// The rendered statements of this module.
#[derive(Debug)]
pub struct PartitionsSql {
    tables: TablesConfig,
    /// Every bucket's lease and head, as `views::LeaseLine`.
    overview_lines: Sql,
    acquirable: Sql,
    acquire: Sql,
    renew: Sql,
    held: Sql,
    owned: Sql,
    free: Sql,
    log_event: Sql,
}

impl PartitionsSql {
    pub fn new(t: &TablesConfig) -> Self {
        Self {
            tables: t.clone(),
            overview_lines: sql(
                t,
                &format!(
                    "SELECT p.partition_key, p.lease_owner, p.lease_epoch,
                            {ttl} AS lease_ttl_seconds,
                            h.id AS head_id,
                            COALESCE({lag}, 0.0) AS lag_seconds,
                            h.attempts AS head_attempts,
                            CASE WHEN h.attempts > 0 THEN h.last_error END AS head_error,
                            CASE WHEN h.attempts > 0 THEN h.available_at END AS head_retry_at
                     FROM {{partitions}} p
                     LEFT JOIN {{outbox}} h ON h.id = (
                         SELECT o.id FROM {{outbox}} o INDEXED BY {{outbox}}_pending_idx
                         WHERE o.partition_key = p.partition_key
                           AND o.published_at IS NULL AND o.failed_at IS NULL
                         ORDER BY o.id LIMIT 1)
                     ORDER BY p.partition_key",
                    ttl = seconds_between("{now}", "p.lease_until"),
                    lag = seconds_between("h.created_at", "{now}"),
                ),
            ),
            // Free or expired. Parameters: wanted labels (JSON).
            acquirable: sql(
                t,
                "SELECT partition_key, lease_owner, lease_epoch FROM {partitions}
                 WHERE partition_key IN (SELECT value FROM json_each(?))
                   AND (lease_owner IS NULL OR lease_until <= {now})
                 ORDER BY partition_key",
            ),
            // Parameters: owner, ttl, labels (JSON).
            acquire: sql(
                t,
                "UPDATE {partitions}
                 SET lease_owner = ?, lease_until = {now+?}, lease_epoch = lease_epoch + 1,
                     updated_at = {now}
                 WHERE partition_key IN (SELECT value FROM json_each(?))",
            ),
            // Parameters: ttl, owner, held pairs (JSON).
            renew: sql(
                t,
                &format!(
                    "UPDATE {{partitions}} SET lease_until = {{now+?}}, updated_at = {{now}}
                     WHERE lease_owner = ? AND {HELD}
                     RETURNING partition_key"
                ),
            ),
            // Parameters: owner, held pairs (JSON).
            held: sql(
                t,
                &format!(
                    "SELECT partition_key, lease_epoch FROM {{partitions}}
                     WHERE lease_owner = ? AND {HELD} ORDER BY partition_key"
                ),
            ),
            owned: sql(
                t,
                "SELECT partition_key, lease_epoch FROM {partitions}
                 WHERE lease_owner = ? ORDER BY partition_key",
            ),
            // Parameters: owner, labels (JSON).
            free: sql(
                t,
                "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL, updated_at = {now}
                 WHERE lease_owner = ? AND partition_key IN (SELECT value FROM json_each(?))",
            ),
            log_event: sql(
                t,
                "INSERT INTO {outbox}_lease_events
                     (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            ),
        }
    }

    fn sql(&self, template: &str) -> String {
        render(&self.tables, template)
    }
}

/// A lease change to record in `<outbox>_lease_events`.
struct Event<'a> {
    partition_key: &'a str,
    action: &'static str,
    old_owner: Option<Uuid>,
    old_epoch: i64,
    new_epoch: i64,
    reason: String,
}

/// Writes lease events (in the transaction of the change).
async fn log_events(
    p: &PartitionsSql,
    tx: &mut Tx,
    worker: Uuid,
    events: &[Event<'_>],
) -> Result<(), StoreError> {
    for e in events {
        sqlx::query(p.log_event.q())
            .bind(e.partition_key)
            .bind(e.action)
            .bind(worker)
            .bind(e.old_owner)
            .bind(e.old_epoch)
            .bind(e.new_epoch)
            .bind(&e.reason)
            .execute(&mut **tx)
            .await
            .doing("recording lease events")?;
    }
    Ok(())
}

/// Frees the leases `rows` (read in `tx`) of `me`, logging.
async fn free(
    p: &PartitionsSql,
    tx: &mut Tx,
    me: Uuid,
    rows: &[(String, i64)],
    reason: &str,
) -> Result<Vec<String>, StoreError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let labels: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    sqlx::query(p.free.q())
        .bind(me)
        .bind(json_list(&labels))
        .execute(&mut **tx)
        .await
        .doing("releasing leases")?;
    let events: Vec<Event> = rows
        .iter()
        .map(|(k, epoch)| Event {
            partition_key: k,
            action: "release",
            old_owner: Some(me),
            old_epoch: *epoch,
            new_epoch: *epoch,
            reason: reason.to_string(),
        })
        .collect();
    log_events(p, tx, me, &events).await?;
    Ok(rows.iter().map(|(k, _)| k.clone()).collect())
}

#[async_trait]
impl PartitionStore for SqliteBackend {
    async fn ensure_bucket_rows(&self, labels: &[String]) -> Result<u64, StoreError> {
        if labels.is_empty() {
            return Ok(0);
        }
        let sql = self.partitions.sql(
            "INSERT OR IGNORE INTO {partitions} (partition_key)
             SELECT value FROM json_each(?)",
        );
        Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(json_list(labels))
            .execute(&self.writer)
            .bounded("creating bucket rows")
            .await?
            .rows_affected())
    }

    async fn acquire(
        &self,
        me: Uuid,
        wanted: &[String],
        ttl: Duration,
        reason: &str,
    ) -> Result<Vec<Acquired>, StoreError> {
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let p = &self.partitions;
        bounded_op("acquiring leases", async {
            let mut tx = self.write().await?;
            let candidates: Vec<(String, Option<Uuid>, i64)> = sqlx::query_as(p.acquirable.q())
                .bind(json_list(wanted))
                .fetch_all(&mut *tx)
                .await
                .doing("acquiring leases")?;
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let labels: Vec<&str> = candidates.iter().map(|(k, _, _)| k.as_str()).collect();
            sqlx::query(p.acquire.q())
                .bind(me)
                .bind(millis(ttl))
                .bind(json_list(&labels))
                .execute(&mut *tx)
                .await
                .doing("acquiring leases")?;
            let events: Vec<Event> = candidates
                .iter()
                .map(|(k, old_owner, old_epoch)| Event {
                    partition_key: k,
                    action: "acquire",
                    old_owner: *old_owner,
                    old_epoch: *old_epoch,
                    new_epoch: old_epoch + 1,
                    reason: acquire_reason(*old_owner, reason),
                })
                .collect();
            log_events(p, &mut tx, me, &events).await?;
            tx.commit().await.doing("committing acquired leases")?;
            Ok(candidates
                .into_iter()
                .map(|(partition_key, _, old_epoch)| Acquired {
                    partition_key,
                    lease_epoch: old_epoch + 1,
                })
                .collect())
        })
        .await
    }

    async fn renew(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        ttl: Duration,
    ) -> Result<Vec<String>, StoreError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(self.partitions.renew.q())
            .bind(millis(ttl))
            .bind(me)
            .bind(json_list(held))
            .fetch_all(&self.writer)
            .bounded("renewing leases")
            .await
    }

    async fn release_leases(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        reason: &str,
    ) -> Result<Vec<String>, StoreError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let p = &self.partitions;
        bounded_op("releasing leases", async {
            let mut tx = self.write().await?;
            let rows: Vec<(String, i64)> = sqlx::query_as(p.held.q())
                .bind(me)
                .bind(json_list(held))
                .fetch_all(&mut *tx)
                .await
                .doing("releasing leases")?;
            let released = free(p, &mut tx, me, &rows, reason).await?;
            tx.commit().await.doing("committing released leases")?;
            Ok(released)
        })
        .await
    }

    async fn release_all_leases(&self, me: Uuid, reason: &str) -> Result<Vec<String>, StoreError> {
        let p = &self.partitions;
        bounded_op("releasing leases", async {
            let mut tx = self.write().await?;
            let rows: Vec<(String, i64)> = sqlx::query_as(p.owned.q())
                .bind(me)
                .fetch_all(&mut *tx)
                .await
                .doing("releasing leases")?;
            let released = free(p, &mut tx, me, &rows, reason).await?;
            tx.commit().await.doing("committing released leases")?;
            Ok(released)
        })
        .await
    }

    async fn overview(&self, cap: i64) -> Result<Vec<BucketView>, StoreError> {
        let lines = &self.partitions.overview_lines;
        let overview = views::overview(self, &self.tables, VIEWS, lines, cap);
        bounded_op("reading the bucket overview", overview).await
    }
}

/// The partitions table's reads (`store::lookups`), in this backend's SQL.
pub(crate) fn lookups(t: &TablesConfig) -> PartitionLookupsSql {
    PartitionLookupsSql {
        leases: sql(
            t,
            "SELECT partition_key, lease_owner, lease_until, lease_epoch,
                    COALESCE(lease_until > {now}, 0) AS valid
             FROM {partitions} ORDER BY partition_key",
        ),
        events_since: sql(
            t,
            "SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
             FROM {outbox}_lease_events WHERE id > ? ORDER BY id LIMIT ?",
        ),
        events_within: sql(
            t,
            "SELECT * FROM (
                SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
                FROM {outbox}_lease_events
                WHERE at > strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', -? / 1000.0))
                ORDER BY at DESC, id DESC LIMIT ?
             ) ORDER BY id",
        ),
    }
}
