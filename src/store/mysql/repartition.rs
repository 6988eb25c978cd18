//! MySQL/MariaDB: `outboxd repartition` and the parking of rows with
//! unknown labels (see [`crate::store::repartition`] for the argument).
//!
//! Producers are held back through the settings row: the insert trigger
//! reads `partition_count` with a shared lock, and the repartition locks
//! that row for update first, so it waits for the producer transactions
//! in flight (they hold the shared lock until they commit) and new inserts
//! wait for it.

use async_trait::async_trait;
use serde_json::json;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::driver::Tx;
use super::{MySqlBackend, placeholders};
use crate::partitioner::Partitioner;
use crate::store::driver::Statements;
use crate::store::repartition::{
    ParkedUnknown, RepartitionError, RepartitionReport, RepartitionStore, unknown_label_error,
};
use crate::store::workers;
use crate::store::{QueryContext, StoreError, label_literal, render};

#[async_trait]
impl RepartitionStore for MySqlBackend {
    async fn repartition(
        &self,
        to: u32,
        dry_run: bool,
        actor: &str,
    ) -> Result<RepartitionReport, RepartitionError> {
        let sql = |template: &str| AssertSqlSafe(render(&self.tables, template));
        let mut tx = self
            .pool
            .begin()
            .await
            .doing("starting the repartition transaction")?;

        let lock = &self.workers.lock_registrations;
        Statements::execute(&mut tx, lock, &[], "taking the registration lock").await?;
        let live = workers::live_others(&self.workers, &mut tx, Uuid::nil()).await?;
        if !live.is_empty() {
            return Err(RepartitionError::WorkersLive(live));
        }
        // Waits for producers in flight, holds new ones (see the module docs).
        let from: i32 = sqlx::query_scalar(sql(
            "SELECT partition_count FROM {outbox}_settings FOR UPDATE",
        ))
        .fetch_optional(&mut *tx)
        .await
        .doing("reading partition_count")?
        .ok_or(RepartitionError::NotMigrated)?;
        sqlx::query(sql("UPDATE {outbox}_settings SET partition_count = ?"))
            .bind(to as i32)
            .execute(&mut *tx)
            .await
            .doing("recording the new partition_count")?;

        let unpublished: i64 = sqlx::query_scalar(sql(
            "SELECT COUNT(*) FROM {outbox} WHERE published_at IS NULL",
        ))
        .fetch_one(&mut *tx)
        .await
        .doing("counting unpublished rows")?;
        // The label function reads the count this transaction just wrote.
        let relabelled = if dry_run {
            sqlx::query_scalar(sql(
                "SELECT COUNT(*) FROM {outbox}
                 WHERE published_at IS NULL AND partition_key <> {outbox}_partition_for(message_key)",
            ))
            .fetch_one(&mut *tx)
            .await
            .doing("counting the rows to re-label")?
        } else {
            sqlx::query(sql(
                "UPDATE {outbox} SET partition_key = {outbox}_partition_for(message_key)
                 WHERE published_at IS NULL AND partition_key <> {outbox}_partition_for(message_key)",
            ))
            .execute(&mut *tx)
            .await
            .doing("re-labelling unpublished rows")?
            .rows_affected() as i64
        };
        let report = RepartitionReport {
            from: from as u32,
            to,
            unpublished,
            relabelled,
        };
        if dry_run {
            tx.rollback().await.doing("rolling back the dry run")?;
            return Ok(report);
        }

        self.replace_bucket_rows(&mut tx, to).await?;
        let detail = json!({
            "from": from, "to": to, "unpublished": unpublished, "relabelled": relabelled,
        });
        sqlx::query(sql(
            "INSERT INTO {outbox}_audit (actor, action, detail) VALUES (?, 'repartition', ?)",
        ))
        .bind(actor)
        .bind(detail)
        .execute(&mut *tx)
        .await
        .doing("recording the audit entry")?;
        tx.commit().await.doing("committing the repartition")?;
        Ok(report)
    }

    async fn park_unknown_labels(&self) -> Result<Vec<ParkedUnknown>, StoreError> {
        let sql = |template: &str| render(&self.tables, template);
        let mut tx = self.pool.begin().await.doing("starting a transaction")?;
        let known: Vec<String> = sqlx::query_scalar(AssertSqlSafe(sql(
            "SELECT partition_key FROM {partitions} ORDER BY partition_key",
        )))
        .fetch_all(&mut *tx)
        .await
        .doing("looking for unknown bucket labels")?;
        // The pending index between (and around) the known labels holds
        // only rows of unknown labels: a range scan of those gaps, however
        // many rows the known buckets hold.
        let literals: Vec<String> = known.iter().filter_map(|l| label_literal(l)).collect();
        let gaps =
            match (literals.first(), literals.last()) {
                (Some(first), Some(last)) => {
                    let mut gaps = vec![format!("partition_key < {first}")];
                    gaps.extend(literals.windows(2).map(|w| {
                        format!("(partition_key > {} AND partition_key < {})", w[0], w[1])
                    }));
                    gaps.push(format!("partition_key > {last}"));
                    gaps.join(" OR ")
                }
                _ => "TRUE".to_string(),
            };
        let strays: Vec<(i64, String, String)> = sqlx::query_as(AssertSqlSafe(sql(&format!(
            "SELECT id, partition_key, message_key FROM {{outbox}} FORCE INDEX ({{outbox}}_pending_idx)
             WHERE ({gaps}) AND published_at IS NULL AND failed_at IS NULL
             ORDER BY id FOR UPDATE"
        ))))
        .fetch_all(&mut *tx)
        .await
        .doing("looking for unknown bucket labels")?;
        if strays.is_empty() {
            return Ok(Vec::new());
        }
        let count: i32 = sqlx::query_scalar(AssertSqlSafe(sql(
            "SELECT partition_count FROM {outbox}_settings",
        )))
        .fetch_one(&mut *tx)
        .await
        .doing("reading partition_count")?;
        let partitioner = Partitioner::new(count as u32);
        for (id, label, key) in &strays {
            let error = unknown_label_error(label, count as u32, key, &partitioner.label_for(key));
            sqlx::query(AssertSqlSafe(sql(
                "UPDATE {outbox} SET failed_at = UTC_TIMESTAMP(6), last_error = ? WHERE id = ?",
            )))
            .bind(error)
            .bind(id)
            .execute(&mut *tx)
            .await
            .doing("parking rows with unknown bucket labels")?;
        }
        tx.commit()
            .await
            .doing("committing the maintenance transaction")?;
        Ok(strays
            .into_iter()
            .map(|(id, partition_key, _)| ParkedUnknown { id, partition_key })
            .collect())
    }
}

impl MySqlBackend {
    /// The bucket rows for `to` buckets, in the repartition's transaction:
    /// removed ones go, kept ones lose lease and claim and get a new epoch,
    /// new ones start above every epoch so far.
    async fn replace_bucket_rows(&self, tx: &mut Tx, to: u32) -> Result<(), StoreError> {
        let sql = |template: &str| AssertSqlSafe(render(&self.tables, template));
        let labels = Partitioner::new(to).labels();
        let top: i64 = sqlx::query_scalar(sql(
            "SELECT COALESCE(MAX(lease_epoch), 0) + 1 FROM {partitions}",
        ))
        .fetch_one(&mut **tx)
        .await
        .doing("replacing the bucket rows")?;
        let list = placeholders(labels.len());
        let mut gone = sqlx::query(AssertSqlSafe(render(
            &self.tables,
            &format!("DELETE FROM {{partitions}} WHERE partition_key NOT IN ({list})"),
        )));
        for l in &labels {
            gone = gone.bind(l);
        }
        gone.execute(&mut **tx)
            .await
            .doing("replacing the bucket rows")?;
        sqlx::query(sql(
            "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL,
                    claim_token = NULL, claimed_until = NULL,
                    lease_epoch = lease_epoch + 1, updated_at = UTC_TIMESTAMP(6)",
        ))
        .execute(&mut **tx)
        .await
        .doing("replacing the bucket rows")?;
        let rows = vec!["(?, ?)"; labels.len()].join(", ");
        let mut added = sqlx::query(AssertSqlSafe(render(
            &self.tables,
            &format!(
                "INSERT IGNORE INTO {{partitions}} (partition_key, lease_epoch) VALUES {rows}"
            ),
        )));
        for l in &labels {
            added = added.bind(l).bind(top);
        }
        added
            .execute(&mut **tx)
            .await
            .doing("replacing the bucket rows")?;
        Ok(())
    }
}
