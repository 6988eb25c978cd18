//! MySQL/MariaDB: the `outbox_partitions` table's statements (see
//! [`crate::store::partitions`] for what they promise).
//!
//! Without `UPDATE … RETURNING`, a change of owner reads the rows it will
//! change with `FOR UPDATE` and changes them under those row locks, with
//! its lease events, in one transaction: between the read and the write no
//! other worker can touch the rows, so the epoch each acquirer computes
//! (`old + 1`) is the one it writes, and no epoch goes to two owners. A
//! renew is one `UPDATE` matching owner and epoch; only when it matched
//! fewer rows than asked does it read back which.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::MySql;
use uuid::Uuid;

use super::{MySqlBackend, VIEWS, micros, placeholders};
use crate::config::TablesConfig;
use crate::store::partitions::{Acquired, BucketView, PartitionStore, acquire_reason};
use crate::store::statements::PartitionLookupsSql;
use crate::store::views;
use crate::store::{Bounded, QueryContext, Sql, StoreError, bounded_op, render};

/// The rendered statements of this module.
#[derive(Debug)]
pub struct PartitionsSql {
    tables: TablesConfig,
    /// Every bucket's lease and head, as `views::LeaseLine`.
    overview_lines: Sql,
}

impl PartitionsSql {
    pub fn new(t: &TablesConfig) -> Self {
        Self {
            tables: t.clone(),
            overview_lines: Sql::render(
                t,
                "SELECT p.partition_key, p.lease_owner, p.lease_epoch,
                        TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), p.lease_until) / 1e6
                            AS lease_ttl_seconds,
                        h.id AS head_id,
                        COALESCE(TIMESTAMPDIFF(MICROSECOND, h.created_at, UTC_TIMESTAMP(6)) / 1e6, 0e0)
                            AS lag_seconds,
                        h.attempts AS head_attempts,
                        CASE WHEN h.attempts > 0 THEN h.last_error END AS head_error,
                        CASE WHEN h.attempts > 0 THEN h.available_at END AS head_retry_at
                 FROM {partitions} p
                 LEFT JOIN {outbox} h ON h.id = (
                     SELECT o.id FROM {outbox} o FORCE INDEX ({outbox}_pending_idx)
                     WHERE o.partition_key = p.partition_key
                       AND o.published_at IS NULL AND o.failed_at IS NULL
                     ORDER BY o.id LIMIT 1)
                 ORDER BY p.partition_key",
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
    tx: &mut sqlx::Transaction<'_, MySql>,
    worker: Uuid,
    events: &[Event<'_>],
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let rows = vec!["(?, ?, ?, ?, ?, ?, ?)"; events.len()].join(", ");
    let sql = p.sql(&format!(
        "INSERT INTO {{outbox}}_lease_events
             (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
         VALUES {rows}"
    ));
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
    for e in events {
        q = q
            .bind(e.partition_key)
            .bind(e.action)
            .bind(worker)
            .bind(e.old_owner)
            .bind(e.old_epoch)
            .bind(e.new_epoch)
            .bind(&e.reason);
    }
    q.execute(&mut **tx).await.doing("recording lease events")?;
    Ok(())
}

/// `(partition_key, lease_epoch) IN ((?, ?), …)` for `held`.
fn held_pairs(n: usize) -> String {
    if n == 0 {
        return "FALSE".into();
    }
    format!(
        "(partition_key, lease_epoch) IN ({})",
        vec!["(?, ?)"; n].join(", ")
    )
}

/// Frees the leases `rows` (read `FOR UPDATE` in `tx`) of `me`, logging.
async fn free(
    p: &PartitionsSql,
    tx: &mut sqlx::Transaction<'_, MySql>,
    me: Uuid,
    rows: &[(String, i64)],
    reason: &str,
) -> Result<Vec<String>, StoreError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let sql = p.sql(&format!(
        "UPDATE {{partitions}} SET lease_owner = NULL, lease_until = NULL,
                updated_at = UTC_TIMESTAMP(6)
         WHERE lease_owner = ? AND partition_key IN ({})",
        placeholders(rows.len())
    ));
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(me);
    for (k, _) in rows {
        q = q.bind(k);
    }
    q.execute(&mut **tx).await.doing("releasing leases")?;
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
impl PartitionStore for MySqlBackend {
    async fn ensure_bucket_rows(&self, labels: &[String]) -> Result<u64, StoreError> {
        if labels.is_empty() {
            return Ok(0);
        }
        let rows = vec!["(?)"; labels.len()].join(", ");
        let sql = self.partitions.sql(&format!(
            "INSERT IGNORE INTO {{partitions}} (partition_key) VALUES {rows}"
        ));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for l in labels {
            q = q.bind(l);
        }
        Ok(q.execute(&self.pool)
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
            let mut tx = self.pool.begin().await.doing("starting a transaction")?;
            // Free or expired, and not being changed by another worker right
            // now (skipped: it is someone else's move).
            let sql = p.sql(&format!(
                "SELECT partition_key, lease_owner, lease_epoch FROM {{partitions}}
                 WHERE partition_key IN ({})
                   AND (lease_owner IS NULL OR lease_until <= UTC_TIMESTAMP(6))
                 ORDER BY partition_key FOR UPDATE SKIP LOCKED",
                placeholders(wanted.len())
            ));
            let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql));
            for w in wanted {
                q = q.bind(w);
            }
            let candidates: Vec<(String, Option<Uuid>, i64)> =
                q.fetch_all(&mut *tx).await.doing("acquiring leases")?;
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let sql = p.sql(&format!(
                "UPDATE {{partitions}}
                 SET lease_owner = ?, lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                     lease_epoch = lease_epoch + 1, updated_at = UTC_TIMESTAMP(6)
                 WHERE partition_key IN ({})",
                placeholders(candidates.len())
            ));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(me)
                .bind(micros(ttl));
            for (k, _, _) in &candidates {
                q = q.bind(k);
            }
            q.execute(&mut *tx).await.doing("acquiring leases")?;
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
        let p = &self.partitions;
        bounded_op("renewing leases", async {
            let sql = p.sql(&format!(
                "UPDATE {{partitions}}
                 SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                     updated_at = UTC_TIMESTAMP(6)
                 WHERE lease_owner = ? AND {}",
                held_pairs(held.len())
            ));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(micros(ttl))
                .bind(me);
            for (k, e) in held {
                q = q.bind(k).bind(e);
            }
            let matched = q
                .execute(&self.pool)
                .await
                .doing("renewing leases")?
                .rows_affected();
            if matched as usize == held.len() {
                return Ok(held.iter().map(|(k, _)| k.clone()).collect());
            }
            // Some were lost: the ones still ours at this epoch are the ones
            // renewed (nobody else can hold our owner id and epoch).
            let sql = p.sql(&format!(
                "SELECT partition_key FROM {{partitions}} WHERE lease_owner = ? AND {}",
                held_pairs(held.len())
            ));
            let mut q = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(me);
            for (k, e) in held {
                q = q.bind(k).bind(e);
            }
            q.fetch_all(&self.pool).await.doing("renewing leases")
        })
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
            let mut tx = self.pool.begin().await.doing("starting a transaction")?;
            let sql = p.sql(&format!(
                "SELECT partition_key, lease_epoch FROM {{partitions}}
                 WHERE lease_owner = ? AND {} FOR UPDATE",
                held_pairs(held.len())
            ));
            let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(me);
            for (k, e) in held {
                q = q.bind(k).bind(e);
            }
            let rows: Vec<(String, i64)> = q.fetch_all(&mut *tx).await.doing("releasing leases")?;
            let released = free(p, &mut tx, me, &rows, reason).await?;
            tx.commit().await.doing("committing released leases")?;
            Ok(released)
        })
        .await
    }

    async fn release_all_leases(&self, me: Uuid, reason: &str) -> Result<Vec<String>, StoreError> {
        let p = &self.partitions;
        bounded_op("releasing leases", async {
            let mut tx = self.pool.begin().await.doing("starting a transaction")?;
            let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(p.sql(
                "SELECT partition_key, lease_epoch FROM {partitions}
                 WHERE lease_owner = ? FOR UPDATE",
            )))
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
        leases: Sql::render(
            t,
            "SELECT partition_key, lease_owner, lease_until, lease_epoch,
                    COALESCE(lease_until > UTC_TIMESTAMP(6), FALSE) AS valid
             FROM {partitions} ORDER BY partition_key",
        ),
        events_since: Sql::render(
            t,
            "SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
             FROM {outbox}_lease_events WHERE id > ? ORDER BY id LIMIT ?",
        ),
        events_within: Sql::render(
            t,
            "SELECT * FROM (
                SELECT id, at, partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason
                FROM {outbox}_lease_events
                WHERE at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
                ORDER BY at DESC, id DESC LIMIT ?
             ) recent ORDER BY id",
        ),
    }
}
