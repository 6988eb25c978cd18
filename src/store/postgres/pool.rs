//! The connection pool every component talks to the database through, and
//! what it does differently behind a transaction pooler or after a
//! switchover.
//!
//! [`DbPool`] is a sqlx executor like `&PgPool`. With `database.pooler =
//! "transaction"` (PgBouncer in transaction mode, Debian 12's 1.18 included,
//! which tracks no prepared statements) it keeps every statement within what
//! such a pooler carries from one client to one server session:
//!
//! - no named prepared statements: every query goes to sqlx as
//!   non-persistent, which sqlx sends unnamed (with its statement cache
//!   merely turned off, sqlx 0.9 would still name each statement, and never
//!   close it);
//! - sqlx sends an unnamed statement in two exchanges (parse, then bind and
//!   execute), and a pooler may hand the second to another server session
//!   once the first ended outside a transaction; so each statement that
//!   takes parameters runs inside a transaction of its own (`BEGIN`, the
//!   statement, `COMMIT`), which the pooler keeps on one session. Explicit
//!   transactions ([`DbPool::begin`]) are that already; plain-text
//!   statements (`raw_sql`, one exchange) run as they are;
//! - nothing relies on session state: advisory locks are transaction-level,
//!   `LISTEN` uses `database.listen_url` or is replaced by polling
//!   ([`crate::relay::wakeups`]), and `outboxd migrate` (sqlx's migrator
//!   holds a session lock) refuses or uses `listen_url`.
//!
//! Its statements take connections from a [`PacedPool`]: they share the
//! connections it has while it grows in the background, paced, and back
//! off when the server refuses another (`too many clients`); an idle
//! worker keeps one pooled connection beside its `LISTEN` connection
//! ([`crate::store::trim`]).
//!
//! After a switchover the pool closes the connections opened before the
//! database was seen read-only ([`crate::store::switchover`]): a read-only
//! answer to any statement run through the pool or one of its
//! transactions — the store's, or a producer's — marks the pool's own
//! marker, never another pool's.

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use sqlx::error::BoxDynError;
use sqlx::postgres::{
    PgArguments, PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgQueryResult, PgRow,
    PgStatement, PgTypeInfo,
};
use sqlx::{Either, Execute, Executor, Postgres, SqlStr};

use crate::stamp::Stamp;
use crate::store::bounds::Bounds;
use crate::store::error::StoreError;
use crate::store::paced::{self, Lent, PacedPool};
use crate::store::settings::{BackendKind, shown};
use crate::store::settings::{Pooler, StoreSettings};
use crate::store::switchover::Switchover;

/// A pool of database connections that knows what sits in front of the
/// database (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct DbPool {
    inner: PacedPool<Postgres>,
    pooler: Pooler,
    bounds: Bounds,
}

impl DbPool {
    /// The pooler the connections go through.
    pub fn pooler(&self) -> Pooler {
        self.pooler
    }

    /// Starts a transaction.
    pub async fn begin(&self) -> Result<Tx, sqlx::Error> {
        let (inner, lent) = self.inner.begin().await?;
        Ok(Tx {
            inner,
            unnamed: self.unnamed_statements(),
            bounds: self.bounds.clone(),
            _lent: lent,
        })
    }

    /// Counts a connection taken from [`DbPool::sqlx`] for good (the
    /// `LISTEN` connection) as lent while the mark lives.
    pub(crate) fn lend(&self) -> Lent {
        self.inner.lend()
    }

    /// What bounds this pool's statements.
    pub fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.inner.close().await
    }

    /// The sqlx pool underneath (for sqlx APIs that take one).
    pub fn sqlx(&self) -> &PgPool {
        self.inner.sqlx()
    }

    /// Behind a transaction pooler: unnamed statements, each statement
    /// with parameters in a transaction.
    fn unnamed_statements(&self) -> bool {
        self.pooler == Pooler::Transaction
    }
}

/// A transaction of a [`DbPool`]: an executor like `&mut PgConnection`
/// that, behind a transaction pooler, prepares no named statement (a named
/// statement outlives the transaction on a server session other clients
/// get next).
#[derive(Debug)]
pub struct Tx {
    inner: sqlx::Transaction<'static, Postgres>,
    unnamed: bool,
    bounds: Bounds,
    _lent: Lent,
}

impl Tx {
    /// What bounds this transaction's statements (its pool's).
    pub fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.inner.commit().await
    }

    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.inner.rollback().await
    }
}

/// Opens a pool for a worker or a command, on `db.url`.
pub async fn connect(db: &StoreSettings, application_name: &str) -> Result<DbPool, StoreError> {
    connect_to(db, &db.url, db.pooler, db.max_connections, application_name).await
}

/// Opens a pool on `url` (`db.url`, or the direct `db.listen_url`) with
/// `db`'s timeouts.
pub async fn connect_to(
    db: &StoreSettings,
    url: &str,
    pooler: Pooler,
    max_connections: u32,
    application_name: &str,
) -> Result<DbPool, StoreError> {
    let connect_err = |cause| StoreError::Connect {
        backend: BackendKind::Postgres,
        url: shown(url),
        cause,
    };
    let options: PgConnectOptions = url.parse().map_err(connect_err)?;
    let options = verify_with_named_root(options, url);
    // extra_float_digits is a startup parameter PgBouncer refuses unless
    // told to ignore it; PostgreSQL 12+ prints floats exactly without it.
    let mut options = options
        .application_name(application_name)
        .extra_float_digits(None);
    if pooler == Pooler::Transaction {
        options = options.statement_cache_capacity(0);
    }
    let (port, dead_after) = (options.get_port(), db.dead_peer_timeout);
    // One connection first, by hand, for the cause of a failure.
    paced::first_connection::<PgConnection>(
        &options,
        db.connect_timeout,
        BackendKind::Postgres,
        url,
    )
    .await?;
    let opened = Stamp::default();
    let opening = opened.clone();
    let bounds = Bounds::new(db.query_timeout, &super::ERRORS);
    let switchover = bounds.switchover();
    let inner = PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(db.connect_timeout)
        // A wait for a free connection is normal under load (more buckets
        // than connections); only failing to get one is worth a line.
        .acquire_slow_threshold(db.connect_timeout)
        .after_connect(move |_conn, _meta| {
            opening.mark();
            Box::pin(async move {
                crate::net::harden_connections_to(port, dead_after);
                Ok(())
            })
        });
    let inner = paced::checked(inner, switchover).connect_lazy_with(options);
    Ok(DbPool {
        inner: PacedPool::new(inner, opened),
        pooler,
        bounds,
    })
}

/// libpq's rule, which sqlx lacks: `sslmode=require` with `sslrootcert`
/// named verifies the server's certificate chain (as `verify-ca`) rather
/// than accepting any certificate.
fn verify_with_named_root(options: PgConnectOptions, url: &str) -> PgConnectOptions {
    let Ok(parsed) = url::Url::parse(url) else {
        return options;
    };
    let param = |name: &str| {
        parsed
            .query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    if param("sslmode").as_deref() == Some("require") && param("sslrootcert").is_some() {
        options.ssl_mode(sqlx::postgres::PgSslMode::VerifyCa)
    } else {
        options
    }
}

/// A query whose arguments were taken out to look at them, put back
/// together as an unnamed statement.
struct Taken {
    sql: SqlStr,
    arguments: Option<PgArguments>,
}

impl<'q> Execute<'q, Postgres> for Taken {
    fn sql(self) -> SqlStr {
        self.sql
    }

    fn statement(&self) -> Option<&PgStatement> {
        None
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, BoxDynError> {
        Ok(self.arguments.take())
    }

    fn persistent(&self) -> bool {
        false
    }
}

/// How a query runs behind a transaction pooler.
enum Route<E> {
    /// As it is: plain text (one exchange, no statement) or an already
    /// prepared statement.
    AsIs(E),
    /// Parameters, so an unnamed statement in two exchanges: outside an
    /// explicit transaction, in a transaction of its own.
    Unnamed(Taken),
}

fn route<'q, E: Execute<'q, Postgres>>(mut query: E) -> Result<Route<E>, sqlx::Error> {
    if query.statement().is_some() {
        return Ok(Route::AsIs(query));
    }
    match query.take_arguments().map_err(sqlx::Error::Encode)? {
        None => Ok(Route::AsIs(query)),
        Some(arguments) => Ok(Route::Unnamed(Taken {
            sql: query.sql(),
            arguments: Some(arguments),
        })),
    }
}

/// Notes a failed statement with the pool's switchover marker (a
/// read-only answer makes its older connections stale), whoever ran it:
/// the store's flows, or a producer in a transaction of this pool.
fn noted<T>(switchover: &Switchover, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
    if let Err(e) = &result {
        switchover.note_failure(e);
    }
    result
}

impl<'p> Executor<'p> for &'_ DbPool {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        E: 'q + Execute<'q, Postgres>,
    {
        let switchover = self.bounds.switchover();
        let unnamed = self.unnamed_statements();
        let pool = self.clone();
        let rows = async move {
            if !unnamed {
                let (mut conn, _lent) = pool.inner.acquire().await?;
                return collect(conn.fetch_many(query)).await;
            }
            let taken = match route(query)? {
                Route::AsIs(query) => {
                    let (mut conn, _lent) = pool.inner.acquire().await?;
                    return collect(conn.fetch_many(query)).await;
                }
                Route::Unnamed(taken) => taken,
            };
            let mut tx = pool.begin().await?;
            let rows = collect(tx.inner.fetch_many(taken)).await?;
            tx.commit().await?;
            Ok(rows)
        };
        futures_util::stream::once(rows)
            .map_ok(|rows| futures_util::stream::iter(rows.into_iter().map(Ok)))
            .try_flatten()
            .map(move |r| noted(&switchover, r))
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        E: 'q + Execute<'q, Postgres>,
    {
        let switchover = self.bounds.switchover();
        let unnamed = self.unnamed_statements();
        let pool = self.clone();
        Box::pin(async move {
            let row = async {
                let taken = match if unnamed {
                    route(query)?
                } else {
                    Route::AsIs(query)
                } {
                    Route::AsIs(query) => {
                        let (mut conn, _lent) = pool.inner.acquire().await?;
                        return conn.fetch_optional(query).await;
                    }
                    Route::Unnamed(taken) => taken,
                };
                let mut tx = pool.begin().await?;
                let row = tx.inner.fetch_optional(taken).await?;
                tx.commit().await?;
                Ok(row)
            };
            noted(&switchover, row.await)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.inner.clone();
        Box::pin(async move { (&pool).prepare_with(sql, parameters).await })
    }

    #[doc(hidden)]
    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>> {
        let pool = self.inner.clone();
        Box::pin(async move { (&pool).describe(sql).await })
    }
}

impl<'c> Executor<'c> for &'c mut Tx {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let switchover = self.bounds.switchover();
        let conn: &'c mut PgConnection = &mut self.inner;
        let rows = if !self.unnamed {
            conn.fetch_many(query)
        } else {
            match route(query) {
                Ok(Route::AsIs(query)) => conn.fetch_many(query),
                Ok(Route::Unnamed(taken)) => conn.fetch_many(taken),
                Err(e) => futures_util::stream::once(async move { Err(e) }).boxed(),
            }
        };
        rows.map(move |r| noted(&switchover, r)).boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let switchover = self.bounds.switchover();
        let conn: &'c mut PgConnection = &mut self.inner;
        let row = if !self.unnamed {
            conn.fetch_optional(query)
        } else {
            match route(query) {
                Ok(Route::AsIs(query)) => conn.fetch_optional(query),
                Ok(Route::Unnamed(taken)) => conn.fetch_optional(taken),
                Err(e) => Box::pin(async move { Err(e) }),
            }
        };
        Box::pin(async move { noted(&switchover, row.await) })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        let conn: &'c mut PgConnection = &mut self.inner;
        conn.prepare_with(sql, parameters)
    }

    #[doc(hidden)]
    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        let conn: &'c mut PgConnection = &mut self.inner;
        conn.describe(sql)
    }
}

async fn collect<'e>(
    s: BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>,
) -> Result<Vec<Either<PgQueryResult, PgRow>>, sqlx::Error> {
    s.try_collect().await
}
