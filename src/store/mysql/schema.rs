//! MySQL/MariaDB: migrations (`migrations/mysql`, embedded at build time
//! and rendered with the configured table names) and the deployment
//! settings (see [`crate::store::schema`]). sqlx's MySQL migrator holds a
//! named lock for the length of its session.

use sqlx::migrate::Migrator;

use super::MySqlBackend;
use super::steps::LABELS;
use crate::store::error::StoreError;
use crate::store::schema::rendered_migrator;
use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::SchemaSql;

static EMBEDDED: Migrator = sqlx::migrate!("./migrations/mysql");

/// The migrator for these table names.
pub fn migrator(tables: &Tables) -> Migrator {
    rendered_migrator(&EMBEDDED, tables)
}

/// The embedded migrations.
pub(crate) fn embedded() -> &'static Migrator {
    &EMBEDDED
}

/// The schema's statements ([`SchemaSql`]), in MySQL's SQL.
pub(crate) fn statements(t: &Tables) -> SchemaSql {
    SchemaSql::new(
        t,
        Sql::render(
            t,
            "SELECT COUNT(*) FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        ),
        "INSERT IGNORE INTO {outbox}_settings (singleton, partition_count) VALUES (1, ?)",
        Sql::render(
            t,
            &format!("INSERT IGNORE INTO {{partitions}} (partition_key) SELECT j.v FROM {LABELS}"),
        ),
    )
}

impl MySqlBackend {
    /// Runs the migrations on the pool's own connections (sqlx's MySQL
    /// migrator holds a named lock for the length of its session).
    pub(crate) async fn run_migrations(&self) -> Result<Vec<String>, StoreError> {
        migrator(&self.tables)
            .run(self.pool.sqlx())
            .await
            .map_err(|e| StoreError::Schema(format!("migration failed: {e}")))?;
        Ok(Vec::new())
    }
}
