//! The MySQL/MariaDB backend: one module per table, each with its
//! statements and its [`crate::store::backend::Backend`] trait implementation, plus the
//! pool ([`pool`]).
//!
//! What differs from PostgreSQL, and how the guarantees are kept:
//!
//! - **No `UPDATE … RETURNING`, no writing CTEs.** Where PostgreSQL reads
//!   and writes in one statement, this backend either writes in one
//!   statement whose outcome it knows without reading back (the claim: read
//!   the bucket's ready prefix, then take the claim on the bucket's row with
//!   the fence — `rows_affected` says whether it is ours), or reads with
//!   `FOR UPDATE` and writes under those row locks in one transaction (lease
//!   acquire and release: the rows cannot change between the read and the
//!   write, so no epoch is handed to two owners).
//! - **The fence is in the statement that writes.** Records of publishes
//!   and failures are single-table `UPDATE`s of the outbox whose `WHERE`
//!   checks the bucket's claim token and lease `(partition_key,
//!   lease_owner, lease_epoch)` in an `EXISTS` on the partitions row.
//! - **READ COMMITTED** for every relay connection: a plain `SELECT` is a
//!   consistent read that takes no locks, and no statement takes gap locks
//!   in the outbox, so a producer's `INSERT` never waits for a claim.
//! - **Rows are found by state, never by a high-water mark.** InnoDB
//!   assigns auto-increment ids at insert, not at commit, so a lower id can
//!   commit after a higher one; the claim reads the bucket's unpublished
//!   rows in id order each time and so finds it (at the head of the bucket
//!   once it commits).
//! - **No partial indexes.** The pending index is `(partition_key,
//!   published_at, failed_at, id)`: "next unpublished rows of bucket b in id
//!   order" is `partition_key = b AND published_at IS NULL AND failed_at IS
//!   NULL ORDER BY id`, a range scan of one contiguous slice of it whatever
//!   the table size.
//! - **No notifications.** Workers poll adaptively
//!   ([`crate::relay::wakeups`]); `NOTIFY` is a no-op here.
//! - **Time is the database's, in UTC** (`UTC_TIMESTAMP(6)`; `DATETIME(6)`
//!   columns hold UTC), whatever a session's time zone.
//! - **Locks are rows.** Registrations and the purge are serialised by
//!   `SELECT … FOR UPDATE` on rows of `<outbox>_locks`, held for one
//!   transaction (MySQL's named locks belong to a session, not a
//!   transaction).
//!
//! Tested on MariaDB 10.11 (Debian 12); the SQL keeps to what MySQL 8 also
//! accepts, but MySQL itself is not tested here.

mod driver;
pub mod notify;
pub mod outbox;
pub mod partitions;
pub mod pool;
pub mod repartition;
pub mod schema;
pub mod stats;
mod steps;
pub mod workers;

use futures_util::future::BoxFuture;
use sqlx::MySqlPool;
use sqlx::error::DatabaseError;

use crate::store::error::ErrorDialect;
use sqlx::mysql::MySqlDatabaseError;

use pool::MyPool;

use crate::store::backend::Backend;
use crate::store::bounds::Bounds;
use crate::store::error::StoreError;
use crate::store::settings::BackendKind;
use crate::store::settings::{StoreSettings, Tables};
use crate::store::sql::Sql;

/// A store on MySQL or MariaDB.
#[derive(Debug)]
pub struct MySqlBackend {
    pool: MyPool,
    bounds: Bounds,
    tables: Tables,
    partitions: partitions::PartitionsSql,
    sql: crate::store::statements::Rendered,
    steps: crate::store::statements::StepsSql,
}

impl MySqlBackend {
    /// Connects to `db.url` (one connection first, to report why it fails)
    /// and renders every statement for `tables`.
    pub async fn connect(db: &StoreSettings, application_name: &str) -> Result<Self, StoreError> {
        let tables = &db.tables;
        let bounds = Bounds::new(db.query_timeout, &ERRORS);
        let pool = pool::connect(db, &bounds, application_name).await?;
        Ok(Self {
            pool,
            bounds,
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
                    |s| Sql::render(tables, s),
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
    pub fn pool(&self) -> &MySqlPool {
        self.pool.sqlx()
    }

    /// The claim's read of a bucket's first rows, for diagnostics
    /// (`EXPLAIN`); its parameters are `ClaimSql::read`'s.
    pub fn claim_statement(&self) -> &str {
        self.sql.drain.claim.read.as_str()
    }
}

impl Backend for MySqlBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::MySql
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
    cancelled: |_| false,
    hint,
};

/// True for a MySQL/MariaDB error that retrying later may get past.
pub(crate) fn is_transient_error(db: &dyn DatabaseError) -> bool {
    let Some(my) = db.try_downcast_ref::<MySqlDatabaseError>() else {
        return false;
    };
    // 1205 lock wait timeout, 1213 deadlock, 1040 too many connections,
    // 1053 server shutdown in progress, 1927 connection killed (MariaDB),
    // 1290 / 1836 read-only (a switchover in progress), 4031 idle session
    // closed by the server, 1969 statement time limit (MariaDB), 1114 a
    // table is full and 1021 the disk is full (space may be freed);
    // SQLSTATE 08: connection exceptions.
    matches!(
        my.number(),
        1205 | 1213 | 1040 | 1053 | 1927 | 1290 | 1836 | 4031 | 1969 | 1114 | 1021
    ) || my.code().is_some_and(|c| c.starts_with("08"))
}

/// What to add to a MySQL/MariaDB error's message, if anything.
pub(crate) fn hint(db: &dyn DatabaseError) -> Option<&'static str> {
    let my = db.try_downcast_ref::<MySqlDatabaseError>()?;
    // InnoDB says a table is full when its file cannot grow: almost always
    // the server's disk.
    (my.number() == 1114).then_some(" (is the database server's disk full?)")
}

/// How MySQL reads the outbox through its pending index (which holds the
/// parked rows too: `(partition_key, published_at, failed_at, id)`).
pub(crate) const VIEWS: crate::store::statements::Dialect = crate::store::statements::Dialect {
    pending: "{outbox} o FORCE INDEX ({outbox}_pending_idx)",
    parked: "{outbox} o FORCE INDEX ({outbox}_pending_idx)",
};

/// Microseconds of a duration, for `INTERVAL ? MICROSECOND`.
pub(crate) fn micros(d: std::time::Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}
