//! PostgreSQL: migrations (`migrations/postgres`, embedded at build time
//! and rendered with the configured table names) and the deployment
//! settings (see [`crate::store::schema`]).

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::{AssertSqlSafe, PgConnection, PgExecutor};

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

/// The indexes migrations build `CONCURRENTLY`: each index's name and the
/// migration that builds it (alone in its file, `CREATE [UNIQUE] INDEX
/// CONCURRENTLY IF NOT EXISTS <name> …`).
fn concurrent_builds(migrator: &Migrator) -> Vec<(String, &str)> {
    const BUILD: &str = "CONCURRENTLY IF NOT EXISTS ";
    migrator
        .iter()
        .filter(|m| m.no_tx)
        .filter_map(|m| {
            let sql = m.sql.as_str();
            let name = sql[sql.find(BUILD)? + BUILD.len()..]
                .split_whitespace()
                .next()?;
            Some((name.to_string(), sql))
        })
        .collect()
}

impl PgBackend {
    /// A concurrent build that was interrupted (`outboxd migrate` stopped,
    /// its connection lost, the build failing) leaves its index behind,
    /// marked invalid: no query uses it, and the migration's `IF NOT
    /// EXISTS` skips it when run again. Every such index of an applied
    /// migration is dropped and built again here, under a session lock so
    /// that two `outboxd migrate` never rebuild the same index at once.
    async fn rebuild_invalid_indexes(
        &self,
        migrator: &Migrator,
    ) -> Result<Vec<String>, StoreError> {
        let mut conn = self
            .pool
            .sqlx()
            .acquire()
            .await
            .doing("connecting to check the indexes")?;
        let lock = format!("outboxd migrate {}", self.tables.outbox);
        sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
            .bind(&lock)
            .execute(&mut *conn)
            .await
            .doing("taking the index rebuild lock")?;
        let mut rebuilt = Vec::new();
        let mut result = Ok(());
        for (name, build) in concurrent_builds(migrator) {
            match rebuild_if_invalid(&mut conn, &name, build).await {
                Ok(true) => rebuilt.push(name),
                Ok(false) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let _ = sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
            .bind(&lock)
            .execute(&mut *conn)
            .await;
        result.map(|()| rebuilt)
    }
}

/// Whether an index exists and is valid (`None`: there is none).
async fn index_valid(conn: &mut PgConnection, name: &str) -> Result<Option<bool>, StoreError> {
    sqlx::query_scalar("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)")
        .bind(name)
        .fetch_optional(conn)
        .await
        .doing("checking an index")
}

/// Drops and builds again (with its migration's statement) the index
/// `name` if it is invalid; whether it did.
async fn rebuild_if_invalid(
    conn: &mut PgConnection,
    name: &str,
    build: &str,
) -> Result<bool, StoreError> {
    if index_valid(conn, name).await? != Some(false) {
        return Ok(false);
    }
    tracing::warn!(index = %name, "index left invalid by an interrupted build: building it again");
    let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {name}");
    let rebuilt = async {
        sqlx::raw_sql(AssertSqlSafe(drop))
            .execute(&mut *conn)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(build.to_string()))
            .execute(&mut *conn)
            .await
    }
    .await;
    let failed = |why: String| {
        StoreError::Schema(format!(
            "index {name} was left invalid by an interrupted build and {why}"
        ))
    };
    rebuilt.map_err(|e| failed(format!("could not be built again: {e}")))?;
    if index_valid(conn, name).await? != Some(true) {
        return Err(failed(
            "is still invalid after building it again (is another build of it running?)".into(),
        ));
    }
    Ok(true)
}

#[async_trait]
impl SchemaStore for PgBackend {
    async fn migrate(&self, partitioner: Partitioner) -> Result<MigrateReport, StoreError> {
        if self.pool.pooler() == Pooler::Transaction {
            return Err(StoreError::Schema(MIGRATE_NEEDS_SESSION.into()));
        }
        let before = self.applied_versions().await?;
        let migrator = migrator(&self.tables);
        migrator
            .run(self.pool.sqlx())
            .await
            .map_err(|e| StoreError::Schema(format!("migration failed: {e}")))?;
        let after = self.applied_versions().await?;
        let rebuilt = self.rebuild_invalid_indexes(&migrator).await?;

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
        super::partitions::ensure_rows(
            &mut tx,
            self.pool.bounds(),
            &self.tables,
            &partitioner.labels(),
        )
        .await?;
        tx.commit()
            .await
            .doing("committing the settings transaction")?;
        Ok(MigrateReport {
            applied: after.len().saturating_sub(before.len()),
            version: after.last().copied().unwrap_or(0),
            partition_count_recorded: inserted == 1,
            rebuilt,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_indexes_built_concurrently_are_found_with_their_migrations() {
        let tables = TablesConfig {
            outbox: "events".into(),
            ..TablesConfig::default()
        };
        let migrator = migrator(&tables);
        let builds = concurrent_builds(&migrator);
        let names: Vec<&str> = builds.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "events_message_id_pending_key",
                "events_unpublished_key_idx"
            ]
        );
        assert!(
            builds
                .iter()
                .all(|(n, sql)| sql.contains(&format!("EXISTS {n}\n")))
        );
    }
}
