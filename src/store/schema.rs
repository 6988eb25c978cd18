//! Migrations, the schema version check, and deployment-wide settings —
//! the interface every backend implements ([`SchemaStore`]) and the checks
//! built on it.
//!
//! Each backend embeds its own migrations (`migrations/postgres`,
//! `migrations/mysql`), renders them with the configured table names, and
//! tracks applied versions in `<outbox>_schema_migrations`, not in sqlx's
//! default `_sqlx_migrations`, so outboxd never collides with an
//! application's own sqlx migrations in the same database.
//!
//! `outboxd work` calls [`check`] first: an unmigrated database, one with
//! migrations this binary does not have yet, or one whose recorded
//! `partition_count` differs from the configuration, stops start-up with a
//! message that says what to run.

use std::borrow::Cow;

use async_trait::async_trait;
use sqlx::migrate::{Migration, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr};

use super::error::StoreError;
use super::sql::render;
use crate::partitioner::Partitioner;
use crate::store::settings::Tables;

/// What [`SchemaStore::migrate`] did.
#[derive(Debug)]
pub struct MigrateReport {
    /// Migrations applied by this run.
    pub applied: usize,
    /// Schema version now.
    pub version: i64,
    /// Whether this run recorded `partition_count` (first migration).
    pub partition_count_recorded: bool,
    /// Indexes an interrupted build had left invalid, rebuilt by this run.
    pub rebuilt: Vec<String>,
}

/// The schema, as every backend implements it.
#[async_trait]
pub trait SchemaStore {
    /// The configured table names the statements were rendered with.
    fn tables(&self) -> &Tables;

    /// Applies pending migrations, records `partition_count` on first run,
    /// and makes sure every bucket has its row in the partitions table.
    async fn migrate(&self, partitioner: Partitioner) -> Result<MigrateReport, StoreError>;

    /// Successfully applied migration versions, ascending; empty when the
    /// migrations table does not exist.
    async fn applied_versions(&self) -> Result<Vec<i64>, StoreError>;

    /// The versions this binary's migrations for this backend have.
    fn known_versions(&self) -> Vec<i64>;

    /// The bucket count the database was set up with, if recorded.
    async fn partition_count(&self) -> Result<Option<u32>, StoreError>;
}

/// A backend's embedded migrations rendered with the configured table
/// names, tracked in [`migrations_table`].
pub(crate) fn rendered_migrator(embedded: &Migrator, tables: &Tables) -> Migrator {
    let migrations = embedded
        .iter()
        .map(|m| {
            Migration::new(
                m.version,
                m.description.clone(),
                m.migration_type,
                AssertSqlSafe(render(tables, m.sql.as_str())).into_sql_str(),
                m.no_tx,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(Cow::Owned(migrations_table(tables)));
    migrator
}

/// Where applied migrations are recorded: `<outbox>_schema_migrations`.
pub(crate) fn migrations_table(tables: &Tables) -> String {
    format!("{}_schema_migrations", tables.outbox)
}

/// Why `migrate` refuses a pool behind a transaction pooler.
pub const MIGRATE_NEEDS_SESSION: &str = "outboxd migrate holds a lock for the length of its session, \
     which a pooler in transaction mode does not keep (database.pooler = \"transaction\"): \
     set database.listen_url to a direct connection to the database (migrate uses it), \
     or run migrate with a direct database.url and database.pooler = \"none\"";

/// Refuses to run against a database that is not at exactly this binary's
/// schema, or that was set up with another bucket count.
pub async fn check(
    store: &(impl SchemaStore + ?Sized),
    partitioner: Partitioner,
) -> Result<(), StoreError> {
    check_version(store).await?;
    match store.partition_count().await? {
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
pub async fn check_version(store: &(impl SchemaStore + ?Sized)) -> Result<(), StoreError> {
    let applied = store.applied_versions().await?;
    let known = store.known_versions();
    let latest = known.iter().copied().max().unwrap_or(0);
    if applied.is_empty() {
        return Err(StoreError::Schema(format!(
            "the database has no outboxd schema ({} not found): run `outboxd migrate` first",
            migrations_table(store.tables())
        )));
    }
    if let Some(newer) = applied.iter().find(|v| !known.contains(v)) {
        return Err(StoreError::SchemaNewer(format!(
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
    StoreError::Config(format!(
        "outbox.partition_count is {configured} but the database has {recorded} buckets: \
         set partition_count = {recorded}, or change the database's count with \
         `outboxd repartition --to {configured}` (see docs/operations.md) — a worker with another count would break per-key order"
    ))
}
