//! The driver contract: what a backend gives the flows written once in the
//! neutral modules, and nothing more.
//!
//! A backend renders each table's statements in its own SQL — one struct
//! of [`Sql`] per table, the same fields on every backend, **the same
//! parameters in the same order** (each field's doc names them) — and runs
//! a statement with neutral arguments ([`Arg`]) on its pool or in one of
//! its transactions ([`Statements`]). The flows (which statement, in what
//! order, inside which transaction, what the rows mean) live once, in the
//! neutral module of their table; what differs between databases stays
//! behind the driver:
//!
//! - the **dialect**: the SQL text of each statement;
//! - the **time unit** of a duration argument ([`Arg::Duration`]: each
//!   backend binds it as its SQL expects, PostgreSQL and SQLite
//!   milliseconds, MySQL/MariaDB microseconds);
//! - the **locking statement** a flow starts its transaction with (e.g.
//!   serialising registrations: an advisory lock, a locked row, or nothing
//!   where the transaction itself holds the only write lock);
//! - **error classification** (`StoreError::is_transient`), per backend;
//! - how a **list** is bound: always one argument ([`Arg::Ids`],
//!   [`Arg::Labels`], [`Arg::Pairs`]), whatever its length, so a statement
//!   is rendered once.
//!
//! To add a backend: implement [`Binding`] for its sqlx database (how each
//! [`Arg`] is bound), [`Runs`] for its pool and its transaction, and
//! [`Driver`]; render every statement set (`store::statements::Rendered`);
//! make every [`Record`] decode from its rows; and run the store
//! conformance suite (`tests/store.rs`) on it. A backend without
//! data-modifying `WITH` renders `StepsSql` too and implements
//! `stepwise::Stepwise`: it then has the lease changes and the operator's
//! actions on parked rows whole.
//!
//! On the contract: `outbox_workers` ([`super::workers`]), the throughput
//! tables ([`super::stats`]), the one-statement operations and the reads
//! across buckets ([`super::lookups`]), the multi-bucket views
//! ([`super::views`]), the repartition ([`super::repartition::flow`]), and
//! on MySQL/MariaDB and SQLite the lease changes and the operator's actions
//! ([`super::stepwise`]; PostgreSQL makes each of those one statement).
//! Still per backend, as genuinely different flows: the claim and the
//! records of a drainer (the hot path: one statement on PostgreSQL, a read
//! then a fenced write elsewhere), enqueueing, purging, migrations and
//! notifications.

use std::time::Duration;

use sqlx::error::BoxDynError;
use sqlx::mysql::MySqlRow;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{Database, Executor};
use uuid::Uuid;

use super::paced::Lent;
use super::statements::Rendered;
use super::{Bounded, Bounds, Sql, StoreError, query_error};

/// A statement's argument, bound by each backend as its SQL expects.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Uuid(Uuid),
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(Option<&'a str>),
    /// A duration, in the backend's unit (see the module docs).
    Duration(Duration),
    /// A list of ids, as **one** argument whatever its length: an array on
    /// PostgreSQL, one JSON array elsewhere (`json_each(?)`, `JSON_TABLE`).
    Ids(&'a [i64]),
    /// A list of bucket labels, bound as [`Arg::Ids`] is.
    Labels(&'a [String]),
    /// A list of (label, number) pairs — held leases (bucket, epoch), new
    /// labels (label, id) — as one JSON array of pairs (`[["p01", 3], …]`)
    /// on every backend.
    Pairs(&'a [(String, i64)]),
}

/// A list argument as one JSON array (how MySQL/MariaDB and SQLite take
/// lists; PostgreSQL takes held leases so).
pub(crate) fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).expect("a list of ids, labels or leases serializes")
}

/// A row type every backend decodes (a `sqlx::FromRow` for each).
pub trait Record:
    for<'r> sqlx::FromRow<'r, PgRow>
    + for<'r> sqlx::FromRow<'r, MySqlRow>
    + for<'r> sqlx::FromRow<'r, SqliteRow>
    + Send
    + Unpin
    + 'static
{
}

impl<T> Record for T where
    T: for<'r> sqlx::FromRow<'r, PgRow>
        + for<'r> sqlx::FromRow<'r, MySqlRow>
        + for<'r> sqlx::FromRow<'r, SqliteRow>
        + Send
        + Unpin
        + 'static
{
}

/// Runs statements: on the pool (each statement on its own) or inside a
/// transaction. Every statement is bounded by `database.query_timeout` and
/// its error says what was being done.
pub trait Statements: Send {
    /// Runs `sql`; the number of rows it changed.
    fn execute(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Runs `sql`; every row it returned.
    fn fetch_all<T: Record>(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>> + Send;
}

/// How a database takes the neutral arguments.
pub trait Binding: Database {
    type Args: sqlx::IntoArguments<Self> + Send;

    /// `args`, in order, as this database's arguments.
    fn arguments(args: &[Arg<'_>]) -> Result<Self::Args, BoxDynError>;

    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// A row as `T` (every [`Record`] decodes from every backend's rows).
    fn decode<T: Record>(row: &Self::Row) -> Result<T, sqlx::Error>;
}

/// Something statements run on: a pool or a transaction of `Db`, with
/// its store's [`Bounds`].
pub trait Runs: Send {
    type Db: Binding;

    fn on(&mut self) -> impl Executor<'_, Database = Self::Db>;

    fn bounds(&self) -> &Bounds;
}

/// A pool (MySQL/MariaDB's `MyPool`, SQLite's sqlx pool) with its store's
/// [`Bounds`]: where the single statements of those backends run
/// (PostgreSQL's `DbPool` carries its own).
#[derive(Debug, Clone, Copy)]
pub struct OnPool<'a, P> {
    pub pool: &'a P,
    pub bounds: &'a Bounds,
}

/// A sqlx transaction with its store's [`Bounds`] (MySQL/MariaDB and
/// SQLite; PostgreSQL's `Tx` carries its own). Dereferences to the
/// connection, as a sqlx transaction does.
#[derive(Debug)]
pub struct BoundTx<DB: Database> {
    inner: sqlx::Transaction<'static, DB>,
    bounds: Bounds,
    /// A paced pool's mark on the connection ([`crate::store::paced`]).
    _lent: Option<Lent>,
}

impl<DB: Database> BoundTx<DB> {
    pub(crate) fn new(inner: sqlx::Transaction<'static, DB>, bounds: &Bounds) -> Self {
        Self {
            inner,
            bounds: bounds.clone(),
            _lent: None,
        }
    }

    /// A transaction on a connection a paced pool lent.
    pub(crate) fn lent(
        (inner, lent): (sqlx::Transaction<'static, DB>, Lent),
        bounds: &Bounds,
    ) -> Self {
        Self {
            inner,
            bounds: bounds.clone(),
            _lent: Some(lent),
        }
    }

    pub(crate) fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.inner.commit().await
    }

    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.inner.rollback().await
    }
}

impl<DB: Database> std::ops::Deref for BoundTx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.inner
    }
}

impl<DB: Database> std::ops::DerefMut for BoundTx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.inner
    }
}

fn bind<DB: Binding>(args: &[Arg<'_>], doing: &'static str) -> Result<DB::Args, StoreError> {
    DB::arguments(args).map_err(|e| query_error(doing, sqlx::Error::Encode(e)))
}

impl<R: Runs> Statements for R {
    async fn execute(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> Result<u64, StoreError> {
        let bounds = self.bounds().clone();
        let done = sqlx::query_with(sql.q(), bind::<R::Db>(args, doing)?)
            .execute(self.on())
            .bounded(&bounds, doing)
            .await?;
        Ok(R::Db::rows_affected(&done))
    }

    async fn fetch_all<T: Record>(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> Result<Vec<T>, StoreError> {
        let bounds = self.bounds().clone();
        let rows = sqlx::query_with(sql.q(), bind::<R::Db>(args, doing)?)
            .fetch_all(self.on())
            .bounded(&bounds, doing)
            .await?;
        rows.iter()
            .map(R::Db::decode)
            .collect::<Result<_, _>>()
            .map_err(|e| query_error(doing, e))
    }
}

/// A backend, as the neutral flows use it.
pub trait Driver: Send + Sync + 'static {
    /// The pool, as a runner of single statements.
    type Pool<'a>: Statements
    where
        Self: 'a;
    /// A transaction.
    type Tx: Statements;

    /// Where single writes run (and reads that belong with them).
    fn pool(&self) -> Self::Pool<'_>;

    /// Where single reads run: the pool, unless the backend keeps its
    /// writes apart (SQLite's one writer).
    fn reads(&self) -> Self::Pool<'_> {
        self.pool()
    }

    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn rollback(tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// What bounds this store's statements.
    fn bounds(&self) -> &Bounds;

    /// Every statement set, in this backend's SQL.
    fn sql(&self) -> &Rendered;
}
