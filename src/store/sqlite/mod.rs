//! The SQLite backend: one module per table, each with its statements and
//! its [`crate::store::backend::Backend`] trait implementation, plus the pool ([`pool`]).
//!
//! SQLite is one file on one host, written by one writer at a time. What
//! differs from the server databases, and how the guarantees are kept:
//!
//! - **One writer.** A worker writes on one connection of its own (its
//!   writes queue in the process, first come first served); every
//!   transaction that reads and then writes starts
//!   with `BEGIN IMMEDIATE` (it takes the file's write lock first), so the
//!   rows it read cannot change before it writes: a lease's epoch is never
//!   handed to two owners, and no transaction has to upgrade a read lock to
//!   a write lock (SQLite's deadlock). Single writes are one statement. A
//!   writer that holds the lock longer than the busy timeout
//!   (`database.query_timeout`) makes statements fail as transient
//!   (`SQLITE_BUSY`), retried like a lost connection.
//! - **WAL mode**: readers never wait for the writer nor the writer for
//!   readers; `synchronous = NORMAL` (a power cut may lose the last
//!   commits of the relay's own records: at worst rows are published
//!   again, as after any crash).
//! - **Ids commit in order.** `AUTOINCREMENT` ids are assigned while the
//!   inserting transaction holds the write lock, so a lower id always
//!   commits first; rows are still found by state, never by a high-water
//!   mark.
//! - **The fence is in the statement that writes**, as on the other
//!   backends: records check the bucket's claim token and lease in an
//!   `EXISTS` on the partitions row.
//! - **Labels in plain SQL.** A trigger computes each inserted row's bucket
//!   label with a CRC-32 written in SQL (see the migration), so producers
//!   in any language insert with a plain `INSERT` and no extension.
//! - **Time is UTC text** `YYYY-MM-DD HH:MM:SS.SSS` (`{now}` in a
//!   statement template); durations are bound in milliseconds (`{now+?}`).
//! - **Lists are one JSON argument** (`IN (SELECT value FROM json_each(?))`).
//! - **No notifications.** Workers poll adaptively
//!   ([`crate::relay::wakeups`]) and probe for added rows as soon as the
//!   kernel reports a write to the database's files ([`watch`]); `NOTIFY`
//!   is a no-op here.

mod driver;
pub mod notify;
pub mod outbox;
pub mod partitions;
pub mod pool;
pub mod repartition;
pub mod schema;
pub mod stats;
mod steps;
mod watch;
pub mod workers;

use futures_util::future::BoxFuture;
use sqlx::SqlitePool;
use sqlx::error::DatabaseError;

use crate::store::error::ErrorDialect;
use sqlx::sqlite::SqliteError;

use crate::store::backend::Backend;
use crate::store::bounds::Bounds;
use crate::store::error::StoreError;
use crate::store::settings::BackendKind;
use crate::store::settings::{StoreSettings, Tables};
use crate::store::sql::Sql;

/// The database's time now, as every column holds it.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";

/// The database's time now plus a duration parameter (milliseconds, may be
/// negative).
const NOW_PLUS: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', ? / 1000.0))";

/// Renders a statement template: the table names (as
/// [`crate::store::sql::render`]), `{now}` and `{now+?}` (a duration parameter).
pub(crate) fn render(t: &Tables, template: &str) -> String {
    crate::store::sql::render(t, template)
        .replace("{now+?}", NOW_PLUS)
        .replace("{now}", NOW)
}

/// [`render`], as a statement.
pub(crate) fn sql(t: &Tables, template: &str) -> Sql {
    Sql::from_rendered(render(t, template))
}

/// Seconds between two times (text columns or `{now}`), as a real.
pub(crate) fn seconds_between(from: &str, to: &str) -> String {
    format!("((julianday({to}) - julianday({from})) * 86400.0)")
}

/// How SQLite reads the outbox through its partial indexes.
pub(crate) const VIEWS: crate::store::statements::Dialect = crate::store::statements::Dialect {
    pending: "{outbox} o INDEXED BY {outbox}_pending_idx",
    parked: "{outbox} o INDEXED BY {outbox}_failed_idx",
};

/// A store on SQLite.
#[derive(Debug)]
pub struct SqliteBackend {
    /// Reads (any number at once).
    pool: SqlitePool,
    /// Every write, on one connection: the worker's writes wait for each
    /// other in the order they asked, in the process, instead of in
    /// SQLite's busy handler (which sleeps 1, 2, 5, 10… ms between tries
    /// and made a trickle's p99 hundreds of ms with 16 drainers).
    writer: SqlitePool,
    bounds: Bounds,
    /// The database file (for the change watch).
    file: std::path::PathBuf,
    /// Raised on every change of the file, once a poller asked.
    changes: std::sync::OnceLock<Option<std::sync::Arc<tokio::sync::Notify>>>,
    tables: Tables,
    partitions: partitions::PartitionsSql,
    sql: crate::store::statements::Rendered,
    steps: crate::store::statements::StepsSql,
}

impl SqliteBackend {
    /// Opens `db.url` (the file, created when missing) and renders every
    /// statement for `tables`.
    pub async fn connect(db: &StoreSettings, _application_name: &str) -> Result<Self, StoreError> {
        let tables = &db.tables;
        let (pool, writer, file) = pool::connect(db).await?;
        Ok(Self {
            pool,
            writer,
            bounds: Bounds::new(db.query_timeout, &ERRORS),
            file,
            changes: std::sync::OnceLock::new(),
            tables: tables.clone(),
            partitions: partitions::PartitionsSql::new(tables),
            sql: crate::store::statements::Rendered {
                tables: tables.clone(),
                migrations: schema::embedded(),
                schema: schema::statements(tables),
                drain: outbox::drain(tables),
                messages: crate::store::statements::MessagesSql::common(tables, VIEWS),
                workers: workers::statements(tables),
                stats: stats::statements(tables),
                lookups: crate::store::lookups::statements(
                    |s| sql(tables, s),
                    false,
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
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A write transaction: `BEGIN IMMEDIATE` (see the module docs).
    pub(crate) async fn write(&self) -> Result<driver::Tx, StoreError> {
        use crate::store::bounds::QueryContext;
        let tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .doing(&ERRORS, "starting a write transaction")?;
        Ok(crate::store::driver::BoundTx::new(tx, &self.bounds))
    }
}

impl Backend for SqliteBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Sqlite
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(crate::store::driver::Driver::answers(self))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.writer.close().await;
            self.pool.close().await;
        })
    }
}

/// How this database's errors read (see `crate::store::error`).
pub static ERRORS: ErrorDialect = ErrorDialect {
    transient: is_transient_error,
    cancelled: |_| false,
    hint: |_| None,
};

/// True for an SQLite error that retrying later may get past: the file is
/// locked by another writer (`SQLITE_BUSY`, 5, with its extended codes) or
/// a table is locked (`SQLITE_LOCKED`, 6).
pub(crate) fn is_transient_error(db: &dyn DatabaseError) -> bool {
    let Some(e) = db.try_downcast_ref::<SqliteError>() else {
        return false;
    };
    e.code()
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_times_and_tables() {
        let t = Tables::default();
        let s = render(&t, "UPDATE {partitions} SET a = {now}, b = {now+?}");
        assert!(
            s.starts_with("UPDATE outbox_partitions SET a = strftime("),
            "{s}"
        );
        assert!(s.contains("printf('%+.3f seconds', ? / 1000.0)"), "{s}");
        use crate::store::driver::json_list;
        assert_eq!(json_list(&["p01", "p02"]), r#"["p01","p02"]"#);
        assert_eq!(json_list::<i64>(&[]), "[]");
    }
}
