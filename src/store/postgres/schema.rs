//! PostgreSQL: migrations (`migrations/postgres`, embedded at build time
//! and rendered with the configured table names) and the deployment
//! settings (see [`crate::store::schema`]).

use super::ERRORS;
use sqlx::migrate::Migrator;
use sqlx::{AssertSqlSafe, PgConnection};

use super::PgBackend;
use crate::store::bounds::QueryContext;
use crate::store::error::StoreError;
use crate::store::schema::{MIGRATE_NEEDS_SESSION, rendered_migrator};
use crate::store::settings::{Pooler, Tables};
use crate::store::sql::Sql;
use crate::store::statements::SchemaSql;

static EMBEDDED: Migrator = sqlx::migrate!("./migrations/postgres");

/// The migrator for these table names.
pub fn migrator(tables: &Tables) -> Migrator {
    rendered_migrator(&EMBEDDED, tables)
}

/// The embedded migrations.
pub(crate) fn embedded() -> &'static Migrator {
    &EMBEDDED
}

/// The schema's statements ([`SchemaSql`]), in PostgreSQL's SQL.
pub(crate) fn statements(t: &Tables) -> SchemaSql {
    SchemaSql::new(
        t,
        Sql::render(
            t,
            "SELECT count(*) FROM (SELECT to_regclass($1) AS r) t WHERE r IS NOT NULL",
        ),
        "INSERT INTO {outbox}_settings (partition_count) VALUES ($1)
         ON CONFLICT (singleton) DO NOTHING",
        Sql::render(
            t,
            "INSERT INTO {partitions} (partition_key) SELECT unnest($1::text[])
             ON CONFLICT (partition_key) DO NOTHING",
        ),
    )
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
    /// Runs the migrations on a session of their own — refused behind a
    /// transaction pooler, which keeps no session — and builds again the
    /// indexes an interrupted build left invalid.
    pub(crate) async fn run_migrations(&self) -> Result<Vec<String>, StoreError> {
        if self.pool.pooler() == Pooler::Transaction {
            return Err(StoreError::Schema(MIGRATE_NEEDS_SESSION.into()));
        }
        let migrator = migrator(&self.tables);
        migrator
            .run(self.pool.sqlx())
            .await
            .map_err(|e| StoreError::Schema(format!("migration failed: {e}")))?;
        self.rebuild_invalid_indexes(&migrator).await
    }

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
            .doing(&ERRORS, "connecting to check the indexes")?;
        let lock = format!("outboxd migrate {}", self.tables.outbox);
        sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
            .bind(&lock)
            .execute(&mut *conn)
            .await
            .doing(&ERRORS, "taking the index rebuild lock")?;
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
        .doing(&ERRORS, "checking an index")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_indexes_built_concurrently_are_found_with_their_migrations() {
        let tables = Tables {
            outbox: "events".into(),
            ..Tables::default()
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
