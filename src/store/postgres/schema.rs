//! PostgreSQL: migrations (`migrations/postgres`, embedded at build time
//! and rendered with the configured table names) and the deployment
//! settings (see [`crate::store::schema`]).

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::{AssertSqlSafe, PgExecutor};

use super::PgBackend;
use crate::config::{Pooler, TablesConfig};
use crate::partitioner::Partitioner;
use crate::store::schema::{
    MIGRATE_NEEDS_SESSION, MigrateReport, SchemaStore, migrations_table, partition_count_mismatch,
    rendered_migrator,
};
use crate::store::{QueryContext, StoreError, render};

static EMBEDDED: Migrator = sqlx::migrate!("./migrations/postgres");

/// The migrator for these table names.
pub fn migrator(tables: &TablesConfig) -> Migrator {
    rendered_migrator(&EMBEDDED, tables)
}

/// The bucket count the database was set up with, if recorded.
pub(crate) async fn partition_count<'e, E: PgExecutor<'e>>(
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
impl SchemaStore for PgBackend {
    async fn migrate(&self, partitioner: Partitioner) -> Result<MigrateReport, StoreError> {
        if self.pool.pooler() == Pooler::Transaction {
            return Err(StoreError::Schema(MIGRATE_NEEDS_SESSION.into()));
        }
        let before = self.applied_versions().await?;
        migrator(&self.tables)
            .run(self.pool.sqlx())
            .await
            .map_err(|e| StoreError::Schema(format!("migration failed: {e}")))?;
        let after = self.applied_versions().await?;

        let mut tx = self
            .pool
            .begin()
            .await
            .doing("starting the settings transaction")?;
        let inserted = sqlx::query(AssertSqlSafe(render(
            &self.tables,
            "INSERT INTO {outbox}_settings (partition_count) VALUES ($1) ON CONFLICT (singleton) DO NOTHING",
        )))
        .bind(partitioner.count() as i32)
        .execute(&mut tx)
        .await
        .doing("recording partition_count")?
        .rows_affected();
        let recorded = partition_count(&mut tx, &self.tables)
            .await?
            .unwrap_or(partitioner.count());
        if recorded != partitioner.count() {
            return Err(partition_count_mismatch(recorded, partitioner.count()));
        }
        super::partitions::ensure_rows(&mut tx, &self.tables, &partitioner.labels()).await?;
        tx.commit()
            .await
            .doing("committing the settings transaction")?;
        Ok(MigrateReport {
            applied: after.len().saturating_sub(before.len()),
            version: after.last().copied().unwrap_or(0),
            partition_count_recorded: inserted == 1,
        })
    }

    async fn applied_versions(&self) -> Result<Vec<i64>, StoreError> {
        let table = migrations_table(&self.tables);
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&table)
            .fetch_one(&self.pool)
            .await
            .doing("looking for the migrations table")?;
        if !exists {
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
