//! MySQL/MariaDB: migrations (`migrations/mysql`, embedded at build time
//! and rendered with the configured table names) and the deployment
//! settings (see [`crate::store::schema`]). sqlx's MySQL migrator holds a
//! named lock for the length of its session.

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::{AssertSqlSafe, MySqlExecutor};

use super::MySqlBackend;
use crate::config::TablesConfig;
use crate::partitioner::Partitioner;
use crate::store::schema::{
    MigrateReport, SchemaStore, migrations_table, partition_count_mismatch, rendered_migrator,
};
use crate::store::{PartitionStore, QueryContext, StoreError, render};

static EMBEDDED: Migrator = sqlx::migrate!("./migrations/mysql");

/// The migrator for these table names.
pub fn migrator(tables: &TablesConfig) -> Migrator {
    rendered_migrator(&EMBEDDED, tables)
}

async fn partition_count<'e, E: MySqlExecutor<'e>>(
    exec: E,
    tables: &TablesConfig,
) -> Result<Option<u32>, StoreError> {
    let n: Option<i32> = sqlx::query_scalar(AssertSqlSafe(render(
        tables,
        "SELECT partition_count FROM {outbox}_settings",
    )))
    .fetch_optional(exec)
    .await
    .doing("reading partition_count")?;
    Ok(n.map(|n| n as u32))
}

#[async_trait]
impl SchemaStore for MySqlBackend {
    async fn migrate(&self, partitioner: Partitioner) -> Result<MigrateReport, StoreError> {
        let before = self.applied_versions().await?;
        migrator(&self.tables)
            .run(self.pool.sqlx())
            .await
            .map_err(|e| StoreError::Schema(format!("migration failed: {e}")))?;
        let after = self.applied_versions().await?;

        let inserted = sqlx::query(AssertSqlSafe(render(
            &self.tables,
            "INSERT IGNORE INTO {outbox}_settings (singleton, partition_count) VALUES (1, ?)",
        )))
        .bind(partitioner.count() as i32)
        .execute(&self.pool)
        .await
        .doing("recording partition_count")?
        .rows_affected();
        let recorded = partition_count(&self.pool, &self.tables)
            .await?
            .unwrap_or(partitioner.count());
        if recorded != partitioner.count() {
            return Err(partition_count_mismatch(recorded, partitioner.count()));
        }
        self.ensure_bucket_rows(&partitioner.labels()).await?;
        Ok(MigrateReport {
            applied: after.len().saturating_sub(before.len()),
            version: after.last().copied().unwrap_or(0),
            partition_count_recorded: inserted == 1,
            rebuilt: Vec::new(),
        })
    }

    async fn applied_versions(&self) -> Result<Vec<i64>, StoreError> {
        let table = migrations_table(&self.tables);
        let exists: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        )
        .bind(&table)
        .fetch_one(&self.pool)
        .await
        .doing("looking for the migrations table")?;
        if exists == 0 {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT version FROM {table} WHERE success ORDER BY version"
        )))
        .fetch_all(&self.pool)
        .await
        .doing("reading applied migrations")
    }

    fn known_versions(&self) -> Vec<i64> {
        EMBEDDED.iter().map(|m| m.version).collect()
    }

    async fn partition_count(&self) -> Result<Option<u32>, StoreError> {
        partition_count(&self.pool, &self.tables).await
    }
}
