//! SQLite: `outboxd repartition` and the parking of rows with unknown
//! labels (see [`crate::store::repartition`] for the argument).
//!
//! Producers are held back by the file's write lock: the repartition is one
//! write transaction (`BEGIN IMMEDIATE`), so it starts once the producer
//! transactions in flight have committed, and new inserts wait for it
//! (their busy timeout). New labels are computed by the Rust partitioner,
//! the same function as the insert trigger's SQL. The flow is
//! [`crate::store::repartition::flow`]; here are its statements, and the
//! search for unknown labels.

use async_trait::async_trait;
use sqlx::AssertSqlSafe;

use super::{SqliteBackend, render, sql};
use crate::config::TablesConfig;
use crate::store::repartition::flow;
use crate::store::repartition::{
    ParkedUnknown, RepartitionError, RepartitionReport, RepartitionStore,
};
use crate::store::statements::{Relabel, RepartitionSql};
use crate::store::{QueryContext, StoreError};

pub(crate) fn statements(t: &TablesConfig) -> RepartitionSql {
    let sql = |s: &str| sql(t, s);
    RepartitionSql {
        settings: sql("SELECT partition_count FROM {outbox}_settings"),
        count: sql("SELECT partition_count FROM {outbox}_settings"),
        hold_producers: None,
        set_count: sql("UPDATE {outbox}_settings SET partition_count = ?"),
        relabel: Relabel::Here {
            unpublished_rows: sql(
                "SELECT id, partition_key, message_key FROM {outbox} WHERE published_at IS NULL",
            ),
            set_labels: sql(
                "UPDATE {outbox} SET partition_key = json_extract(m.value, '$[0]')
                 FROM json_each(?) m WHERE {outbox}.id = json_extract(m.value, '$[1]')",
            ),
        },
        next_epoch: sql("SELECT COALESCE(MAX(lease_epoch), 0) + 1 FROM {partitions}"),
        drop_buckets: sql(
            "DELETE FROM {partitions} WHERE partition_key NOT IN (SELECT value FROM json_each(?))",
        ),
        reset_buckets: sql(
            "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL,
                    claim_token = NULL, claimed_until = NULL,
                    lease_epoch = lease_epoch + 1, updated_at = {now}",
        ),
        add_buckets: sql(
            "INSERT OR IGNORE INTO {partitions} (partition_key, lease_epoch)
             SELECT l.value, t.e FROM (SELECT ? AS e) t, json_each(?) l",
        ),
        audit: sql(
            "INSERT INTO {outbox}_audit (actor, action, detail) VALUES (?, 'repartition', ?)",
        ),
        park: sql("UPDATE {outbox} SET failed_at = {now}, last_error = ? WHERE id = ?"),
    }
}

#[async_trait]
impl RepartitionStore for SqliteBackend {
    async fn repartition(
        &self,
        to: u32,
        dry_run: bool,
        actor: &str,
    ) -> Result<RepartitionReport, RepartitionError> {
        flow::repartition(self, to, dry_run, actor).await
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
        let parked = flow::park(self, &mut tx, strays).await?;
        tx.commit()
            .await
            .doing("committing the maintenance transaction")?;
        Ok(parked)
    }
}
