//! MySQL/MariaDB: `outboxd repartition` and the parking of rows with
//! unknown labels (see [`crate::store::repartition`] for the argument).
//!
//! Producers are held back through the settings row: the insert trigger
//! reads `partition_count` with a shared lock, and the repartition locks
//! that row for update first, so it waits for the producer transactions
//! in flight (they hold the shared lock until they commit) and new inserts
//! wait for it. The flow is [`crate::store::repartition::flow`]; here are
//! its statements, and the search for unknown labels.

use async_trait::async_trait;
use sqlx::AssertSqlSafe;

use super::MySqlBackend;
use super::steps::LABELS;
use crate::config::TablesConfig;
use crate::store::repartition::flow;
use crate::store::repartition::{
    ParkedUnknown, RepartitionError, RepartitionReport, RepartitionStore,
};
use crate::store::statements::{Relabel, RepartitionSql};
use crate::store::{QueryContext, Sql, StoreError, label_literal, render};

/// Unpublished rows whose label the new count (recorded in this
/// transaction, read by the label function) changes.
const MOVED: &str =
    "WHERE published_at IS NULL AND partition_key <> {outbox}_partition_for(message_key)";

pub(crate) fn statements(t: &TablesConfig) -> RepartitionSql {
    let sql = |s: &str| Sql::render(t, &s.replace("{labels}", LABELS));
    RepartitionSql {
        settings: sql("SELECT partition_count FROM {outbox}_settings FOR UPDATE"),
        count: sql("SELECT partition_count FROM {outbox}_settings"),
        hold_producers: None,
        set_count: sql("UPDATE {outbox}_settings SET partition_count = ?"),
        relabel: Relabel::InSql {
            unpublished: sql("SELECT COUNT(*) FROM {outbox} WHERE published_at IS NULL"),
            count_moved: sql(&format!("SELECT COUNT(*) FROM {{outbox}} {MOVED}")),
            relabel: sql(&format!(
                "UPDATE {{outbox}} SET partition_key = {{outbox}}_partition_for(message_key) {MOVED}"
            )),
        },
        next_epoch: sql("SELECT COALESCE(MAX(lease_epoch), 0) + 1 FROM {partitions}"),
        drop_buckets: sql(
            "DELETE FROM {partitions} WHERE partition_key NOT IN (SELECT j.v FROM {labels})",
        ),
        reset_buckets: sql(
            "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL,
                    claim_token = NULL, claimed_until = NULL,
                    lease_epoch = lease_epoch + 1, updated_at = UTC_TIMESTAMP(6)",
        ),
        add_buckets: sql(
            "INSERT IGNORE INTO {partitions} (partition_key, lease_epoch)
             SELECT j.v, ? FROM {labels}",
        ),
        audit: sql(
            "INSERT INTO {outbox}_audit (actor, action, detail) VALUES (?, 'repartition', ?)",
        ),
        park: sql("UPDATE {outbox} SET failed_at = UTC_TIMESTAMP(6), last_error = ? WHERE id = ?"),
    }
}

#[async_trait]
impl RepartitionStore for MySqlBackend {
    async fn repartition(
        &self,
        to: u32,
        dry_run: bool,
        actor: &str,
    ) -> Result<RepartitionReport, RepartitionError> {
        flow::repartition(self, to, dry_run, actor).await
    }

    async fn park_unknown_labels(&self) -> Result<Vec<ParkedUnknown>, StoreError> {
        let sql = |template: &str| render(&self.tables, template);
        let mut tx = crate::store::driver::Driver::begin(self).await?;
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
        let parked = flow::park(self, &mut tx, strays).await?;
        tx.commit()
            .await
            .doing("committing the maintenance transaction")?;
        Ok(parked)
    }
}
