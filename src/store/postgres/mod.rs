//! The PostgreSQL backend: one module per table, each with its rendered
//! statements and their [`crate::store::backend::Backend`] trait implementation, plus the
//! pool ([`pool`]: transaction poolers, switchovers) and `LISTEN`
//! ([`listen`]).
//!
//! Every claim and record is one statement (`UPDATE … RETURNING`, CTEs
//! that read and write; a claim the drainer holds is a plain read), the
//! producers' label function and `NOTIFY` live in the database
//! (`migrations/postgres`), and the lease fence is checked in the
//! statement that writes.

mod driver;
pub mod listen;
pub mod outbox;
pub mod partitions;
pub mod pool;
pub mod repartition;
pub mod schema;
pub mod stats;
mod steps;
pub mod workers;

use futures_util::future::BoxFuture;
use sqlx::error::DatabaseError;

use crate::store::error::ErrorDialect;
use sqlx::postgres::PgDatabaseError;

pub use pool::{DbPool, Tx};

use crate::store::backend::Backend;
use crate::store::error::StoreError;
use crate::store::settings::BackendKind;
use crate::store::settings::{StoreSettings, Tables};
use crate::store::sql::Sql;
use crate::store::statements::TakeSql;

/// A store on PostgreSQL.
#[derive(Debug)]
pub struct PgBackend {
    pool: DbPool,
    db: StoreSettings,
    tables: Tables,
    partitions: partitions::PartitionsSql,
    sql: crate::store::statements::Rendered,
    steps: crate::store::statements::StepsSql,
}

impl PgBackend {
    /// Connects to `db.url` (one connection first, to report why it fails)
    /// and renders every statement for `tables`.
    pub async fn connect(db: &StoreSettings, application_name: &str) -> Result<Self, StoreError> {
        let tables = &db.tables;
        let pool = pool::connect(db, application_name).await?;
        Ok(Self {
            pool,
            db: db.clone(),
            tables: tables.clone(),
            partitions: partitions::PartitionsSql::new(tables),
            sql: crate::store::statements::Rendered {
                tables: tables.clone(),
                migrations: schema::embedded(),
                schema: schema::statements(tables),
                drain: outbox::drain(tables),
                messages: outbox::messages(tables),
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
            steps: crate::store::statements::StepsSql {
                leases: steps::lease_steps(tables),
                operator: steps::operator_steps(tables),
            },
        })
    }

    /// The pool (for tests and tools that run their own SQL).
    pub fn pool(&self) -> &DbPool {
        &self.pool
    }

    /// The claim's read of a bucket's first rows, for diagnostics
    /// (`EXPLAIN`); its parameters are `ClaimSql::read`'s.
    pub fn claim_statement(&self) -> &str {
        self.sql.drain.claim.read.as_str()
    }

    /// The claim's take, which also reads the rows, for diagnostics
    /// (`EXPLAIN`); its parameters are `TakeSql::Returning`'s.
    pub fn claim_take_statement(&self) -> &str {
        match &self.sql.drain.claim.take {
            TakeSql::Returning(sql) | TakeSql::ThenRead(sql) => sql.as_str(),
        }
    }
}

impl Backend for PgBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(crate::store::driver::Driver::answers(self))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.pool.close())
    }
}

/// How this database's errors read (see `crate::store::error`).
pub static ERRORS: ErrorDialect = ErrorDialect {
    transient: is_transient_error,
    // 57014: its `statement_timeout` ran out, or it was cancelled by
    // request.
    cancelled: |db| db.code().as_deref() == Some("57014"),
    hint,
};

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
