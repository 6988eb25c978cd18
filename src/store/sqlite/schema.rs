//! SQLite: migrations (`migrations/sqlite`, embedded at build time and
//! rendered with the configured table names) and the deployment settings
//! (see [`crate::store::schema`]).

use sqlx::migrate::Migrator;

use super::SqliteBackend;
use crate::store::error::StoreError;
use crate::store::schema::rendered_migrator;
use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::SchemaSql;

static EMBEDDED: Migrator = sqlx::migrate!("./migrations/sqlite");

/// The migrator for these table names.
pub fn migrator(tables: &Tables) -> Migrator {
    rendered_migrator(&EMBEDDED, tables)
}

/// The embedded migrations.
pub(crate) fn embedded() -> &'static Migrator {
    &EMBEDDED
}

/// The schema's statements ([`SchemaSql`]), in SQLite's SQL.
pub(crate) fn statements(t: &Tables) -> SchemaSql {
    SchemaSql::new(
        t,
        Sql::render(
            t,
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
        ),
        "INSERT OR IGNORE INTO {outbox}_settings (singleton, partition_count) VALUES (1, ?)",
        Sql::render(
            t,
            "INSERT OR IGNORE INTO {partitions} (partition_key) SELECT value FROM json_each(?)",
        ),
    )
}

impl SqliteBackend {
    /// Runs the migrations.
    pub(crate) async fn run_migrations(&self) -> Result<Vec<String>, StoreError> {
        migrator(&self.tables)
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Schema(format!("migration failed: {e}")))?;
        Ok(Vec::new())
    }
}
