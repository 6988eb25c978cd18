//! SQLite: `outboxd repartition` and the parking of rows with unknown
//! labels (see [`crate::store::repartition`] for the argument).
//!
//! Producers are held back by the file's write lock: the repartition is one
//! write transaction (`BEGIN IMMEDIATE`), so it starts once the producer
//! transactions in flight have committed, and new inserts wait for it
//! (their busy timeout). New labels are computed here by the Rust
//! partitioner, the same function as the insert trigger's SQL.

use async_trait::async_trait;
use serde_json::json;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::driver::Tx;
use super::{SqliteBackend, json_list, render};
use crate::partitioner::Partitioner;
use crate::store::driver::Statements;
use crate::store::repartition::{
    ParkedUnknown, RepartitionError, RepartitionReport, RepartitionStore, unknown_label_error,
};
use crate::store::workers;
use crate::store::{QueryContext, StoreError};

#[async_trait]
impl RepartitionStore for SqliteBackend {
    async fn repartition(
        &self,
        to: u32,
        dry_run: bool,
        actor: &str,
    ) -> Result<RepartitionReport, RepartitionError> {
        let sql = |template: &str| AssertSqlSafe(render(&self.tables, template));
        let mut tx = self.write().await?;

        let lock = &self.workers.lock_registrations;
        Statements::execute(&mut tx, lock, &[], "taking the registration lock").await?;
        let live = workers::live_others(&self.workers, &mut tx, Uuid::nil()).await?;
        if !live.is_empty() {
            return Err(RepartitionError::WorkersLive(live));
        }
        let from: i32 = sqlx::query_scalar(sql("SELECT partition_count FROM {outbox}_settings"))
            .fetch_optional(&mut *tx)
            .await
            .doing("reading partition_count")?
            .ok_or(RepartitionError::NotMigrated)?;
        let rows: Vec<(i64, String, String)> = sqlx::query_as(sql(
            "SELECT id, partition_key, message_key FROM {outbox} WHERE published_at IS NULL",
        ))
        .fetch_all(&mut *tx)
        .await
        .doing("reading unpublished rows")?;
        let partitioner = Partitioner::new(to);
        let moved: Vec<(i64, String)> = rows
            .iter()
            .map(|(id, label, key)| (*id, label, partitioner.label_for(key)))
            .filter(|(_, old, new)| *old != new)
            .map(|(id, _, new)| (id, new))
            .collect();
        let report = RepartitionReport {
            from: from as u32,
            to,
            unpublished: rows.len() as i64,
            relabelled: moved.len() as i64,
        };
        if dry_run {
            tx.rollback().await.doing("rolling back the dry run")?;
            return Ok(report);
        }
        sqlx::query(sql("UPDATE {outbox}_settings SET partition_count = ?"))
            .bind(to as i32)
            .execute(&mut *tx)
            .await
            .doing("recording the new partition_count")?;
        let relabel = render(
            &self.tables,
            "UPDATE {outbox} SET partition_key = json_extract(m.value, '$[1]')
             FROM json_each(?) m WHERE {outbox}.id = json_extract(m.value, '$[0]')",
        );
        for chunk in moved.chunks(10_000) {
            sqlx::query(AssertSqlSafe(relabel.clone()))
                .bind(json_list(chunk))
                .execute(&mut *tx)
                .await
                .doing("re-labelling unpublished rows")?;
        }
        self.replace_bucket_rows(&mut tx, to).await?;
        let detail = json!({
            "from": from, "to": to, "unpublished": report.unpublished,
            "relabelled": report.relabelled,
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
        let sql = |template: &str| AssertSqlSafe(render(&self.tables, template));
        let mut tx = self.write().await?;
        let strays: Vec<(i64, String, String)> = sqlx::query_as(sql(
            "SELECT id, partition_key, message_key FROM {outbox} INDEXED BY {outbox}_pending_idx
             WHERE published_at IS NULL AND failed_at IS NULL
               AND partition_key NOT IN (SELECT partition_key FROM {partitions})
             ORDER BY id",
        ))
        .fetch_all(&mut *tx)
        .await
        .doing("looking for unknown bucket labels")?;
        if strays.is_empty() {
            return Ok(Vec::new());
        }
        let count: i32 = sqlx::query_scalar(sql("SELECT partition_count FROM {outbox}_settings"))
            .fetch_one(&mut *tx)
            .await
            .doing("reading partition_count")?;
        let partitioner = Partitioner::new(count as u32);
        for (id, label, key) in &strays {
            let error = unknown_label_error(label, count as u32, key, &partitioner.label_for(key));
            sqlx::query(sql(
                "UPDATE {outbox} SET failed_at = {now}, last_error = ? WHERE id = ?",
            ))
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

impl SqliteBackend {
    /// The bucket rows for `to` buckets, in the repartition's transaction:
    /// removed ones go, kept ones lose lease and claim and get a new epoch,
    /// new ones start above every epoch so far.
    async fn replace_bucket_rows(&self, tx: &mut Tx, to: u32) -> Result<(), StoreError> {
        let sql = |template: &str| AssertSqlSafe(render(&self.tables, template));
        let labels = json_list(&Partitioner::new(to).labels());
        let top: i64 = sqlx::query_scalar(sql(
            "SELECT COALESCE(MAX(lease_epoch), 0) + 1 FROM {partitions}",
        ))
        .fetch_one(&mut **tx)
        .await
        .doing("replacing the bucket rows")?;
        sqlx::query(sql(
            "DELETE FROM {partitions} WHERE partition_key NOT IN (SELECT value FROM json_each(?))",
        ))
        .bind(&labels)
        .execute(&mut **tx)
        .await
        .doing("replacing the bucket rows")?;
        sqlx::query(sql(
            "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL,
                    claim_token = NULL, claimed_until = NULL,
                    lease_epoch = lease_epoch + 1, updated_at = {now}",
        ))
        .execute(&mut **tx)
        .await
        .doing("replacing the bucket rows")?;
        sqlx::query(sql(
            "INSERT OR IGNORE INTO {partitions} (partition_key, lease_epoch)
             SELECT value, ? FROM json_each(?)",
        ))
        .bind(top)
        .bind(&labels)
        .execute(&mut **tx)
        .await
        .doing("replacing the bucket rows")?;
        Ok(())
    }
}
