//! The PostgreSQL backend: one module per table, each with its rendered
//! statements and their [`super::Backend`] trait implementation, plus the
//! pool ([`pool`]: transaction poolers, switchovers) and `LISTEN`
//! ([`listen`]).
//!
//! Every claim and record is one statement (`UPDATE … RETURNING`, CTEs
//! that read and write), the producers' label function and `NOTIFY` live
//! in the database (`migrations/postgres`), and the lease fence is checked
//! in the statement that writes.

mod driver;
pub mod listen;
pub mod outbox;
pub mod partitions;
pub mod pool;
pub mod repartition;
pub mod schema;
pub mod stats;
pub mod workers;

use futures_util::future::BoxFuture;
use sqlx::error::DatabaseError;
use sqlx::postgres::PgDatabaseError;

pub use pool::{DbPool, Tx};

use super::{Backend, BackendKind, Sql, StoreError};
use crate::config::{DatabaseConfig, TablesConfig};

/// A store on PostgreSQL.
#[derive(Debug)]
pub struct PgBackend {
    pool: DbPool,
    db: DatabaseConfig,
    tables: TablesConfig,
    outbox: outbox::OutboxSql,
    partitions: partitions::PartitionsSql,
    sql: crate::store::statements::Rendered,
}

impl PgBackend {
    /// Connects to `db.url` (one connection first, to report why it fails)
    /// and renders every statement for `tables`.
    pub async fn connect(
        db: &DatabaseConfig,
        tables: &TablesConfig,
        application_name: &str,
    ) -> Result<Self, StoreError> {
        let pool = pool::connect(db, application_name).await?;
        Ok(Self {
            pool,
            db: db.clone(),
            tables: tables.clone(),
            outbox: outbox::OutboxSql::new(tables),
            partitions: partitions::PartitionsSql::new(tables),
            sql: crate::store::statements::Rendered {
                workers: workers::statements(tables),
                stats: stats::statements(tables),
                lookups: crate::store::lookups::statements(
                    |s| Sql::render(tables, s),
                    true,
                    outbox::bucket_reads(tables),
                ),
                partition_lookups: partitions::lookups(tables),
                repartition: repartition::statements(tables),
            },
        })
    }

    /// The pool (for tests and tools that run their own SQL).
    pub fn pool(&self) -> &DbPool {
        &self.pool
    }

    /// The claim statement's text, for diagnostics (`EXPLAIN`). Parameters:
    /// bucket, limit, token, claim TTL in ms, lease owner, lease epoch,
    /// ids in flight.
    pub fn claim_statement(&self) -> &str {
        self.outbox.claim_statement()
    }
}

impl Backend for PgBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    fn tables(&self) -> &TablesConfig {
        &self.tables
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        use super::Bounded;
        Box::pin(async move {
            sqlx::query("SELECT 1")
                .execute(self.pool.sqlx())
                .bounded(self.pool.bounds(), "checking that the database answers")
                .await
                .map(|_| ())
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.pool.close())
    }
}

/// What to add to a PostgreSQL error's message, if anything.
pub(crate) fn hint(db: &dyn DatabaseError) -> Option<&'static str> {
    db.try_downcast_ref::<PgDatabaseError>()?;
    // 42P05 duplicate / 26000 unknown prepared statement: named statements
    // meeting a transaction pooler.
    matches!(db.code().as_deref(), Some("42P05" | "26000")).then_some(
        " (is the database reached through a pooler in transaction mode? \
         set database.pooler = \"transaction\")",
    )
}

/// True when PostgreSQL cancelled the statement (57014: its
/// `statement_timeout` ran out, or it was cancelled by request).
pub(crate) fn is_cancelled(e: &sqlx::Error) -> bool {
    e.as_database_error().and_then(|db| db.code()).as_deref() == Some("57014")
}

/// True for a PostgreSQL error that retrying later may get past.
pub(crate) fn is_transient_error(db: &dyn DatabaseError) -> bool {
    if db.try_downcast_ref::<PgDatabaseError>().is_none() {
        return false;
    }
    // 08: connection exception, 57P: operator intervention (admin
    // shutdown, crash shutdown, cannot connect now), 40: serialization
    // failure / deadlock, 53: insufficient resources, 25006: a read-only
    // server (a standby, a switchover in progress).
    db.code().is_some_and(|c| {
        c == "25006"
            || c.starts_with("08")
            || c.starts_with("57P")
            || c.starts_with("40")
            || c.starts_with("53")
    })
}
