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
//! - **error classification**: the backend's [`ErrorDialect`](super::error::ErrorDialect),
//!   which its [`Bounds`] attach to every error of its statements;
//! - how a **list** is bound: always one argument ([`Arg::Ids`],
//!   [`Arg::Labels`], [`Arg::Pairs`]), whatever its length, so a statement
//!   is rendered once;
//! - whatever a database genuinely does another way, as a **named hook**
//!   of the contract used by every backend that needs it: an insert that
//!   cannot return its id ([`Binding::INSERT_RETURNS_ID`]), a claim's take
//!   that returns its rows or is followed by a read
//!   (`statements::TakeSql`), an `UPDATE` that cannot return its row
//!   (`DrainSql::parked`), a lock a purge takes first
//!   (`DrainSql::purge_lock`), producers held during a repartition
//!   (`RepartitionSql::hold_producers`), a wake-up after an operator's
//!   change (`OperatorStepsSql::wake`), how migrations run
//!   ([`Driver::run_migrations`]).
//!
//! Written once over it, for every backend: the drainer's flows
//! ([`super::drain`]: enqueue, claim, records, purge), the schema
//! ([`super::migrate`]), `outbox_workers` ([`super::workers`]), the
//! throughput tables ([`super::stats`]), the one-statement operations and
//! the reads across buckets ([`super::lookups`]), the views
//! (`super::views`), the repartition (`super::repartition::flow`), the
//! lease changes and the operator's actions (`super::stepwise`). Still
//! per backend: its pool and its wake-up mechanism (`LISTEN`, a probe of
//! the newest ids, a watch of the file). The book's *Adding a database*
//! (`docs/adding-a-database.md`) walks through a new backend.

use std::time::Duration;

use sqlx::error::BoxDynError;
use sqlx::migrate::Migrator;
use sqlx::{Database, Encode, Executor, Type};
use uuid::Uuid;

use super::bounds::{Bounded, Bounds};
use super::error::StoreError;
use super::paced::{Lent, PacedPool};
use super::rows::{Decodes, Rows};
use super::settings::Tables;
use super::sql::Sql;
use super::statements::Rendered;

/// A statement's argument, bound by each backend as its SQL expects.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Uuid(Uuid),
    /// A UUID or NULL (a lease owner without leasing).
    OptUuid(Option<Uuid>),
    Int(i64),
    /// A number or NULL (a lease epoch without leasing).
    OptInt(Option<i64>),
    Float(f64),
    Bool(bool),
    Text(Option<&'a str>),
    /// A duration, in the backend's unit (see the module docs).
    Duration(Duration),
    /// Bytes (a payload).
    Bytes(&'a [u8]),
    /// A JSON document (headers).
    Json(&'a serde_json::Value),
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

/// `args` bound in order: each as itself, but for what the backend binds
/// its own way in `own` — a duration in its unit, a list as its SQL takes
/// it — which returns whether it bound the argument.
pub(crate) fn arguments<'x, A>(
    args: &[Arg<'x>],
    own: impl Fn(&mut A, Arg<'x>) -> Result<bool, BoxDynError>,
) -> Result<A, BoxDynError>
where
    A: sqlx::Arguments,
    Uuid: for<'t> Encode<'t, A::Database> + Type<A::Database>,
    Option<Uuid>: for<'t> Encode<'t, A::Database> + Type<A::Database>,
    i64: for<'t> Encode<'t, A::Database> + Type<A::Database>,
    Option<i64>: for<'t> Encode<'t, A::Database> + Type<A::Database>,
    f64: for<'t> Encode<'t, A::Database> + Type<A::Database>,
    bool: for<'t> Encode<'t, A::Database> + Type<A::Database>,
    String: for<'t> Encode<'t, A::Database> + Type<A::Database>,
    Option<&'x str>: Encode<'x, A::Database> + Type<A::Database>,
    &'x [u8]: Encode<'x, A::Database> + Type<A::Database>,
    &'x serde_json::Value: Encode<'x, A::Database> + Type<A::Database>,
{
    let mut bound = A::default();
    for &arg in args {
        if own(&mut bound, arg)? {
            continue;
        }
        match arg {
            Arg::Uuid(v) => bound.add(v)?,
            Arg::OptUuid(v) => bound.add(v)?,
            Arg::Int(v) => bound.add(v)?,
            Arg::OptInt(v) => bound.add(v)?,
            Arg::Float(v) => bound.add(v)?,
            Arg::Bool(v) => bound.add(v)?,
            Arg::Text(v) => bound.add(v)?,
            Arg::Bytes(v) => bound.add(v)?,
            Arg::Json(v) => bound.add(v)?,
            Arg::Duration(d) => bound.add(d.as_millis().min(i64::MAX as u128) as i64)?,
            Arg::Ids(v) => bound.add(json_list(v))?,
            Arg::Labels(v) => bound.add(json_list(v))?,
            Arg::Pairs(v) => bound.add(json_list(v))?,
        }
    }
    Ok(bound)
}

/// A list argument as one JSON array (how MySQL/MariaDB and SQLite take
/// lists; PostgreSQL takes held leases so).
pub(crate) fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).expect("a list of ids, labels or leases serializes")
}

/// Runs statements: on the pool (each statement on its own) or inside a
/// transaction. Every statement is bounded by `database.query_timeout` and
/// its error says what was being done.
pub trait Statements: Send {
    /// The database they run on.
    type Db: Binding;

    /// Runs `sql`; the number of rows it changed.
    fn execute(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Runs `sql`; every row it returned.
    fn fetch_all<T: Send>(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>> + Send
    where
        Self::Db: Decodes<T>;

    /// Runs the insert `sql`; the id it assigned (see `insert`).
    fn insert(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Runs `sql` unprepared, perhaps several statements without
    /// arguments (maintenance: statistics, space).
    fn execute_script(
        &mut self,
        sql: &Sql,
        doing: &'static str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// How a database takes the neutral arguments (and, by sqlx's type
/// mapping for it, decodes every row the flows read: [`Rows`]).
pub trait Binding: Database + Rows {
    type Args: sqlx::IntoArguments<Self> + Send;

    /// `args`, in order, as this database's arguments.
    fn arguments(args: &[Arg<'_>]) -> Result<Self::Args, BoxDynError>;

    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// Whether an `INSERT` can return the new row's id as a row
    /// (`RETURNING`, or a function's result). Where it cannot (MySQL's
    /// `INSERT` has no `RETURNING`), the id is read from the insert's
    /// result: [`Binding::last_insert_id`].
    const INSERT_RETURNS_ID: bool;

    /// The id the insert that gave `done` assigned (where
    /// [`Binding::INSERT_RETURNS_ID`] is false).
    fn last_insert_id(done: &Self::QueryResult) -> i64;
}

/// Runs the insert `sql` on `exec` and returns the id it assigned, as the
/// database gives it ([`Binding::INSERT_RETURNS_ID`]): the one place an
/// insert's id is read, for the store's enqueue and the producer's.
pub(crate) async fn insert<'e, DB: Binding, E: Executor<'e, Database = DB>>(
    exec: E,
    bounds: &Bounds,
    sql: &Sql,
    args: &[Arg<'_>],
    doing: &'static str,
) -> Result<i64, StoreError> {
    let query = sqlx::query_with(sql.q(), bind::<DB>(bounds, args, doing)?);
    if DB::INSERT_RETURNS_ID {
        let row = query.fetch_one(exec).bounded(bounds, doing).await?;
        let (id,) = <DB as Decodes<(i64,)>>::decode(&row).map_err(|e| bounds.error(doing, e))?;
        Ok(id)
    } else {
        let done = query.execute(exec).bounded(bounds, doing).await?;
        Ok(DB::last_insert_id(&done))
    }
}

/// Something statements run on: a pool or a transaction of `Db`, with
/// its store's [`Bounds`].
pub trait Runs: Send {
    type Db: Binding;

    fn on(&mut self) -> impl Executor<'_, Database = Self::Db>;

    fn bounds(&self) -> &Bounds;
}

/// A transaction of a backend's: where its statements run, and its end.
pub trait Transaction: Runs + Sized {
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    fn rollback(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// A pool (MySQL/MariaDB's `MyPool`, SQLite's sqlx pool) with its store's
/// [`Bounds`]: where the single statements of those backends run
/// (PostgreSQL's `DbPool` carries its own).
#[derive(Debug, Clone, Copy)]
pub struct OnPool<'a, P> {
    pub pool: &'a P,
    pub bounds: &'a Bounds,
}

/// A pool a backend runs single statements on: sqlx's, or a paced one.
pub trait Pooled: Sync {
    type Db: Binding;
}

impl<DB: Binding> Pooled for sqlx::Pool<DB> {
    type Db = DB;
}

impl<DB: Binding> Pooled for PacedPool<DB> {
    type Db = DB;
}

impl<P: Pooled> Runs for OnPool<'_, P>
where
    for<'c> &'c P: Executor<'c, Database = P::Db>,
{
    type Db = P::Db;

    fn on(&mut self) -> impl Executor<'_, Database = P::Db> {
        self.pool
    }

    fn bounds(&self) -> &Bounds {
        self.bounds
    }
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

impl<DB: Binding> Runs for BoundTx<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    type Db = DB;

    fn on(&mut self) -> impl Executor<'_, Database = DB> {
        &mut **self
    }

    fn bounds(&self) -> &Bounds {
        BoundTx::bounds(self)
    }
}

impl<DB: Binding> Transaction for BoundTx<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    async fn commit(self) -> Result<(), sqlx::Error> {
        self.inner.commit().await
    }

    async fn rollback(self) -> Result<(), sqlx::Error> {
        self.inner.rollback().await
    }
}

fn bind<DB: Binding>(
    bounds: &Bounds,
    args: &[Arg<'_>],
    doing: &'static str,
) -> Result<DB::Args, StoreError> {
    DB::arguments(args).map_err(|e| bounds.error(doing, sqlx::Error::Encode(e)))
}

impl<R: Runs> Statements for R {
    type Db = R::Db;

    async fn execute(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> Result<u64, StoreError> {
        let bounds = self.bounds().clone();
        let done = sqlx::query_with(sql.q(), bind::<R::Db>(&bounds, args, doing)?)
            .execute(self.on())
            .bounded(&bounds, doing)
            .await?;
        Ok(R::Db::rows_affected(&done))
    }

    async fn fetch_all<T: Send>(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> Result<Vec<T>, StoreError>
    where
        R::Db: Decodes<T>,
    {
        let bounds = self.bounds().clone();
        let rows = sqlx::query_with(sql.q(), bind::<R::Db>(&bounds, args, doing)?)
            .fetch_all(self.on())
            .bounded(&bounds, doing)
            .await?;
        rows.iter()
            .map(<R::Db as Decodes<T>>::decode)
            .collect::<Result<_, _>>()
            .map_err(|e| bounds.error(doing, e))
    }

    async fn insert(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        doing: &'static str,
    ) -> Result<i64, StoreError> {
        let bounds = self.bounds().clone();
        insert(self.on(), &bounds, sql, args, doing).await
    }

    async fn execute_script(&mut self, sql: &Sql, doing: &'static str) -> Result<(), StoreError> {
        let bounds = self.bounds().clone();
        sqlx::raw_sql(sql.q())
            .execute(self.on())
            .bounded(&bounds, doing)
            .await?;
        Ok(())
    }
}

/// A backend, as the neutral flows use it.
pub trait Driver: Send + Sync + 'static {
    /// The pool, as a runner of single statements.
    type Pool<'a>: Statements
    where
        Self: 'a;
    /// A transaction.
    type Tx: Transaction;

    /// Where single writes run (and reads that belong with them).
    fn pool(&self) -> Self::Pool<'_>;

    /// Where single reads run: the pool, unless the backend keeps its
    /// writes apart (SQLite's one writer).
    fn reads(&self) -> Self::Pool<'_> {
        self.pool()
    }

    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            let bounds = tx.bounds().clone();
            tx.commit().await.map_err(|e| bounds.error("committing", e))
        }
    }

    fn rollback(tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            let bounds = tx.bounds().clone();
            tx.rollback()
                .await
                .map_err(|e| bounds.error("rolling back", e))
        }
    }

    /// What bounds this store's statements.
    fn bounds(&self) -> &Bounds;

    /// One trivial statement: whether the database answers now (for the
    /// probes and `/healthz`).
    fn answers(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            let sql = Sql::from_rendered("SELECT 1".into());
            let doing = "checking that the database answers";
            self.reads().execute(&sql, &[], doing).await.map(|_| ())
        }
    }

    /// Every statement set, in this backend's SQL.
    fn sql(&self) -> &Rendered;

    /// The table names the statements were rendered with.
    fn tables(&self) -> &Tables {
        &self.sql().tables
    }

    /// This backend's migrations, embedded at build time (not rendered).
    fn migrations(&self) -> &'static Migrator {
        self.sql().migrations
    }

    /// Runs the migrations, rendered for [`Driver::tables`], on a session
    /// of their own (sqlx's migrator holds a lock for its length); returns
    /// the indexes an interrupted earlier run had left invalid and this
    /// run built again.
    fn run_migrations(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
}
