//! Migrations, the schema version check, and deployment-wide settings.
//!
//! The files in `migrations/` are embedded at build time and rendered with
//! the configured table names before sqlx's migrator applies them. Applied
//! versions are tracked in `<outbox>_schema_migrations`, not in sqlx's default
//! `_sqlx_migrations`, so outboxd never collides with an application's own
//! sqlx migrations in the same database.
//!
//! `outboxd work` calls [`check`] first: an unmigrated database, one with
//! migrations this binary does not have yet, or one whose recorded
//! `partition_count` differs from the configuration, stops start-up with a
//! message that says what to run.

use std::borrow::Cow;

use sqlx::migrate::{Migration, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr};

use super::{DbPool, QueryContext, StoreError, Tables, render};
use crate::config::Pooler;
use crate::partitioner::Partitioner;

static EMBEDDED: Migrator = sqlx::migrate!("./migrations");

/// The migrator for these table names.
pub fn migrator(tables: &Tables) -> Migrator {
    let migrations = EMBEDDED
        .iter()
        .map(|m| {
            Migration::new(
                m.version,
                m.description.clone(),
                m.migration_type,
                AssertSqlSafe(render(&tables.names, m.sql.as_str())).into_sql_str(),
                m.no_tx,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(Cow::Owned(migrations_table(tables)));
    migrator
}

fn migrations_table(tables: &Tables) -> String {
    format!("{}_schema_migrations", tables.names.outbox)
}

/// The newest schema version this binary knows.
pub fn latest_version() -> i64 {
    EMBEDDED.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Applies pending migrations, records `partition_count` on first run, and
/// makes sure every bucket has its row in the partitions table.
pub async fn migrate(
    pool: &DbPool,
    tables: &Tables,
    partitioner: Partitioner,
) -> Result<MigrateReport, StoreError> {
    if pool.pooler() == Pooler::Transaction {
        return Err(StoreError::Schema(MIGRATE_NEEDS_SESSION.into()));
    }
    let before = applied_versions(pool, tables).await?;
    migrator(tables)
        .run(pool.sqlx())
        .await
        .map_err(|e| StoreError::Schema(format!("migration failed: {e}")))?;
    let after = applied_versions(pool, tables).await?;

    let mut tx = pool
        .begin()
        .await
        .doing("starting the settings transaction")?;
    let inserted = sqlx::query(AssertSqlSafe(render(
        &tables.names,
        "INSERT INTO {outbox}_settings (partition_count) VALUES ($1) ON CONFLICT (singleton) DO NOTHING",
    )))
    .bind(partitioner.count() as i32)
    .execute(&mut tx)
    .await
    .doing("recording partition_count")?
    .rows_affected();
    let recorded = partition_count(&mut tx, tables)
        .await?
        .unwrap_or(partitioner.count());
    if recorded != partitioner.count() {
        return Err(partition_count_mismatch(recorded, partitioner.count()));
    }
    super::partitions::ensure_rows(&mut tx, tables, &partitioner.labels()).await?;
    tx.commit()
        .await
        .doing("committing the settings transaction")?;
    Ok(MigrateReport {
        applied: after.len().saturating_sub(before.len()),
        version: after.last().copied().unwrap_or(0),
        partition_count_recorded: inserted == 1,
    })
}

/// Why [`migrate`] refuses a pool behind a transaction pooler.
pub const MIGRATE_NEEDS_SESSION: &str = "outboxd migrate holds a lock for the length of its session, \
     which a pooler in transaction mode does not keep (database.pooler = \"transaction\"): \
     set database.listen_url to a direct connection to the database (migrate uses it), \
     or run migrate with a direct database.url and database.pooler = \"none\"";

/// What [`migrate`] did.
#[derive(Debug)]
pub struct MigrateReport {
    /// Migrations applied by this run.
    pub applied: usize,
    /// Schema version now.
    pub version: i64,
    /// Whether this run recorded `partition_count` (first migration).
    pub partition_count_recorded: bool,
}

/// Refuses to run against a database that is not at exactly this binary's
/// schema, or that was set up with another bucket count.
pub async fn check(
    pool: &DbPool,
    tables: &Tables,
    partitioner: Partitioner,
) -> Result<(), StoreError> {
    check_version(pool, tables).await?;
    match partition_count(pool, tables).await? {
        None => Err(StoreError::Schema(
            "the database has no recorded partition_count: run `outboxd migrate`".into(),
        )),
        Some(n) if n != partitioner.count() => {
            Err(partition_count_mismatch(n, partitioner.count()))
        }
        Some(_) => Ok(()),
    }
}

/// Refuses a database that is not at exactly this binary's schema version
/// (whatever its bucket count).
pub async fn check_version(pool: &DbPool, tables: &Tables) -> Result<(), StoreError> {
    let applied = applied_versions(pool, tables).await?;
    let latest = latest_version();
    let known: Vec<i64> = EMBEDDED.iter().map(|m| m.version).collect();
    if applied.is_empty() {
        return Err(StoreError::Schema(format!(
            "the database has no outboxd schema ({} not found): run `outboxd migrate` first",
            migrations_table(tables)
        )));
    }
    if let Some(newer) = applied.iter().find(|v| !known.contains(v)) {
        return Err(StoreError::Schema(format!(
            "the database schema (version {newer}) is newer than this outboxd knows (up to {latest}): upgrade outboxd"
        )));
    }
    if let Some(missing) = known.iter().find(|v| !applied.contains(v)) {
        return Err(StoreError::Schema(format!(
            "the database schema is missing migration {missing} (this outboxd needs version {latest}): run `outboxd migrate`"
        )));
    }
    Ok(())
}

pub fn partition_count_mismatch(recorded: u32, configured: u32) -> StoreError {
    StoreError::Schema(format!(
        "outbox.partition_count is {configured} but the database has {recorded} buckets: \
         set partition_count = {recorded}, or change the database's count with \
         `outboxd repartition --to {configured}` (see the README) — a worker with another count would break per-key order"
    ))
}

/// Successfully applied migration versions, ascending; empty when the
/// migrations table does not exist.
async fn applied_versions(pool: &DbPool, tables: &Tables) -> Result<Vec<i64>, StoreError> {
    let table = migrations_table(tables);
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(pool)
        .await
        .doing("looking for the migrations table")?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM {table} WHERE success ORDER BY version"
    )))
    .fetch_all(pool)
    .await
    .doing("reading applied migrations")
}

/// The bucket count the database was set up with, if recorded.
pub async fn partition_count<'e, E: sqlx::PgExecutor<'e>>(
    exec: E,
    tables: &Tables,
) -> Result<Option<u32>, StoreError> {
    let n: Option<i32> = sqlx::query_scalar(AssertSqlSafe(render(
        &tables.names,
        "SELECT partition_count FROM {outbox}_settings",
    )))
    .fetch_optional(exec)
    .await
    .doing("reading partition_count")?;
    Ok(n.map(|n| n as u32))
}
