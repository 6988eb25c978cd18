//! All SQL lives here, behind one backend-neutral interface.
//!
//! [`Store`] is what every other part of outboxd holds: a cheap handle on
//! one database backend, chosen by the URL's scheme — PostgreSQL
//! (`postgres://`, `postgresql://`), MySQL/MariaDB (`mysql://`,
//! `mariadb://`) or SQLite (`sqlite://path`). It dereferences to [`Backend`], the interface both
//! implement, one trait per table so that each backend keeps one module
//! per table (the way apalis and fang keep a storage per database):
//!
//! | neutral module (types + trait) | what it owns |
//! |---|---|
//! | [`outbox`] ([`OutboxStore`]) | enqueue, claim, record published / failed, views, requeue, purge |
//! | [`lookups`] ([`OutboxLookups`], [`PartitionLookups`]) | one-statement reads and claim upkeep, written once |
//! | [`partitions`] ([`PartitionStore`]) | one row per bucket: leases and lease events |
//! | [`workers`] ([`WorkerStore`]) | membership rows and heartbeats |
//! | [`stats`] ([`StatsStore`]) | per-minute and per-second throughput |
//! | [`schema`] ([`SchemaStore`]) | migrations, the schema check, deployment settings |
//! | [`repartition`] ([`RepartitionStore`]) | changing the bucket count; rows with unknown labels |
//! | [`notify`] ([`NotifyStore`]) | wake-up notifications (`NOTIFY`/`LISTEN` where the database has them) |
//!
//! and the backends: [`postgres`], [`mysql`] and [`sqlite`], each with its
//! own SQL, migrations (`migrations/<backend>`) and pool (the two server
//! databases' pools share [`paced`]: statements wait for a connection of
//! the pool's while it grows in the background and backs off when refused;
//! `trim` shrinks them back when idle). Nothing above this module knows
//! which backend it talks to.
//!
//! What every backend promises, whatever its SQL:
//!
//! - every write to a bucket's rows carries the lease fence `(partition_key,
//!   lease_owner, lease_epoch)` and the bucket's claim token, checked in the
//!   same statement as the write;
//! - time is the database's clock (UTC), never the worker's;
//! - every statement on a worker's path is *bounded* ([`Bounded`]): it fails
//!   after `database.query_timeout` instead of waiting on a database that
//!   stopped answering, and every pooled connection is hardened against a
//!   silent peer ([`crate::net`]), so a blackholed link is noticed in
//!   seconds. Only the operator's long statements (migrations,
//!   repartitioning, a purge's count and VACUUM) run unbounded;
//! - errors say what was being done and the server's cause once
//!   ([`StoreError`]), and say whether retrying may help.

pub mod driver;
pub mod lookups;
pub mod mysql;
pub mod notify;
pub mod outbox;
pub mod paced;
pub mod partitions;
pub mod postgres;
pub mod repartition;
pub mod schema;
pub mod sqlite;
pub mod statements;
pub mod stats;
pub(crate) mod stepwise;
pub mod switchover;
pub(crate) mod trim;
pub(crate) mod views;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

pub use lookups::{OutboxLookups, PartitionLookups};
pub use notify::{Channel, Listener, Notification, NotifyStore};
pub use outbox::{HeadAction, OutboxStore, ParkedStore};
pub use partitions::PartitionStore;
pub use repartition::RepartitionStore;
pub use schema::SchemaStore;
pub use stats::StatsStore;
pub use switchover::Switchover;
pub use workers::WorkerStore;

use crate::config::{Config, DatabaseConfig, Redacted, TablesConfig, fmt_duration};

/// Which database a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Postgres,
    MySql,
    Sqlite,
}

impl BackendKind {
    /// The backend a database URL names, by its scheme.
    pub fn of_url(url: &str) -> Option<Self> {
        let scheme = url.split_once("://")?.0;
        match scheme {
            "postgres" | "postgresql" => Some(Self::Postgres),
            "mysql" | "mariadb" => Some(Self::MySql),
            "sqlite" => Some(Self::Sqlite),
            _ => None,
        }
    }

    /// How the database is called in messages.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Postgres => "PostgreSQL",
            BackendKind::MySql => "MySQL/MariaDB",
            BackendKind::Sqlite => "SQLite",
        }
    }
}

/// Everything a backend does: one trait per table (see the module docs).
pub trait Backend:
    OutboxStore
    + ParkedStore
    + OutboxLookups
    + PartitionLookups
    + PartitionStore
    + WorkerStore
    + StatsStore
    + SchemaStore
    + RepartitionStore
    + NotifyStore
    + std::fmt::Debug
    + std::any::Any
    + Send
    + Sync
{
    fn kind(&self) -> BackendKind;

    /// The configured table names the statements were rendered with.
    fn tables(&self) -> &TablesConfig;

    /// One trivial statement: whether the database answers now (for the
    /// probes and `/healthz`).
    fn ping(&self) -> futures_util::future::BoxFuture<'_, Result<(), StoreError>>;

    /// Closes every connection.
    fn close(&self) -> futures_util::future::BoxFuture<'_, ()>;
}

/// A handle on the database: what every component that talks to it holds.
/// Cheap to clone; dereferences to the [`Backend`] interface.
#[derive(Debug, Clone)]
pub struct Store(Arc<dyn Backend>);

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl Store {
    /// Connects to the database `config.database.url` names, by its scheme.
    pub async fn connect(config: &Config, application_name: &str) -> Result<Self, StoreError> {
        Self::connect_with(&config.database, &config.tables, application_name).await
    }

    pub async fn connect_with(
        db: &DatabaseConfig,
        tables: &TablesConfig,
        application_name: &str,
    ) -> Result<Self, StoreError> {
        let link = match BackendKind::of_url(&db.url) {
            Some(BackendKind::MySql) => Some(crate::tls::Link::MySql),
            Some(BackendKind::Sqlite) => None,
            _ => Some(crate::tls::Link::Postgres),
        };
        for (key, url) in [
            ("database.url", &db.url),
            ("database.listen_url", &db.listen_url),
        ] {
            if let Some(link) = link
                && !url.is_empty()
            {
                crate::tls::TlsFiles::check_url(link, url)
                    .map_err(|e| StoreError::Config(format!("{key}: {e}")))?;
            }
        }
        let backend: Arc<dyn Backend> = match BackendKind::of_url(&db.url) {
            Some(BackendKind::MySql) => {
                Arc::new(mysql::MySqlBackend::connect(db, tables, application_name).await?)
            }
            Some(BackendKind::Sqlite) => {
                Arc::new(sqlite::SqliteBackend::connect(db, tables, application_name).await?)
            }
            _ => Arc::new(postgres::PgBackend::connect(db, tables, application_name).await?),
        };
        Ok(Self(backend))
    }

    /// A store for a command that needs a session of its own (`outboxd
    /// migrate`): behind a PostgreSQL transaction pooler, on the direct
    /// `database.listen_url` when there is one (else the command refuses).
    pub async fn connect_for_session(
        config: &Config,
        application_name: &str,
    ) -> Result<Self, StoreError> {
        let db = &config.database;
        match (db.pooler, db.listen_url()) {
            (crate::config::Pooler::Transaction, Some(direct)) => {
                tracing::info!(
                    url = %Redacted(direct),
                    "behind a transaction pooler: using the direct database.listen_url"
                );
                let direct = DatabaseConfig {
                    url: direct.to_string(),
                    pooler: crate::config::Pooler::None,
                    max_connections: 2,
                    ..db.clone()
                };
                Self::connect_with(&direct, &config.tables, application_name).await
            }
            _ => Self::connect(config, application_name).await,
        }
    }

    /// The PostgreSQL backend, when that is what this store talks to (for
    /// tests and tools that inspect PostgreSQL itself).
    pub fn postgres(&self) -> Option<&postgres::PgBackend> {
        let any: &dyn std::any::Any = &*self.0;
        any.downcast_ref()
    }

    /// The MySQL/MariaDB backend, when that is what this store talks to.
    pub fn mysql(&self) -> Option<&mysql::MySqlBackend> {
        let any: &dyn std::any::Any = &*self.0;
        any.downcast_ref()
    }

    /// The SQLite backend, when that is what this store talks to.
    pub fn sqlite(&self) -> Option<&sqlite::SqliteBackend> {
        let any: &dyn std::any::Any = &*self.0;
        any.downcast_ref()
    }
}

/// A database error, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The cause is said in the message (explained when it is about TLS),
    /// so it is not also the error's `source`.
    #[error("cannot connect to {} at {url}: {}", .backend.name(), ConnectCause(*.backend, url, cause))]
    Connect {
        backend: BackendKind,
        url: String,
        cause: sqlx::Error,
    },
    #[error("cannot connect to {} at {url}: no answer within {}", .backend.name(), fmt_duration(*.after))]
    ConnectTimeout {
        backend: BackendKind,
        url: String,
        after: Duration,
    },
    #[error("{0}")]
    Schema(String),
    /// The schema is newer than this binary knows: only another binary
    /// helps (exit code 3).
    #[error("{0}")]
    SchemaNewer(String),
    /// The configuration disagrees with the database (e.g. its bucket
    /// count): a configuration problem, exit code 2.
    #[error("{0}")]
    Config(String),
    #[error("database error while {doing}: {}", Cause(source))]
    Query {
        doing: &'static str,
        source: sqlx::Error,
    },
    #[error("database error while {doing}: no answer within {}", fmt_duration(*.after))]
    Timeout {
        doing: &'static str,
        after: Duration,
    },
}

impl StoreError {
    /// True when retrying later may succeed (connection lost, server
    /// restarting, pool exhausted, lock wait or deadlock), as opposed to a
    /// bug or a schema problem.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Connect { .. } | StoreError::ConnectTimeout { .. } => true,
            StoreError::Schema(_) | StoreError::SchemaNewer(_) | StoreError::Config(_) => false,
            StoreError::Query { source, .. } => is_transient(source),
            StoreError::Timeout { .. } => true,
        }
    }

    /// True when starting again cannot succeed until an operator acts: the
    /// database refused the login (a wrong user or password, SQLSTATE 28000
    /// or 28P01; on PostgreSQL no such database, 3D000), or its schema is
    /// newer than this binary knows.
    pub fn is_permanent(&self) -> bool {
        match self {
            StoreError::SchemaNewer(_) => true,
            StoreError::Connect { cause, .. } => cause
                .as_database_error()
                .and_then(|db| db.code())
                .is_some_and(|code| matches!(code.as_ref(), "28000" | "28P01" | "3D000")),
            _ => false,
        }
    }
}

/// Why a connection failed: a TLS problem explained in one line
/// ([`crate::tls::explain`]), anything else as [`Cause`].
struct ConnectCause<'a>(BackendKind, &'a str, &'a sqlx::Error);

impl std::fmt::Display for ConnectCause<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ConnectCause(backend, url, error) = *self;
        let link = match backend {
            BackendKind::Postgres => crate::tls::Link::Postgres,
            BackendKind::MySql => crate::tls::Link::MySql,
            BackendKind::Sqlite => {
                Cause(error).fmt(f)?;
                return f.write_str(
                    " (its directory must exist and be writable: SQLite creates the file, and its -wal and -shm beside it)",
                );
            }
        };
        let files = crate::tls::TlsFiles::from_url(link, url);
        match crate::tls::explain(link, url, &files, error) {
            Some(line) => f.write_str(&line),
            None => Cause(error).fmt(f),
        }
    }
}

/// A sqlx error as an operator reads it: for an error the server returned,
/// its message alone (sqlx appends the line of PostgreSQL's C source that
/// raised it, which no user can act on).
struct Cause<'a>(&'a sqlx::Error);

impl std::fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            sqlx::Error::Database(db) => {
                f.write_str(db.message())?;
                if let Some(hint) = postgres::hint(&**db).or_else(|| mysql::hint(&**db)) {
                    f.write_str(hint)?;
                }
                Ok(())
            }
            other => other.fmt(f),
        }
    }
}

fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => {
            postgres::is_transient_error(&**db)
                || mysql::is_transient_error(&**db)
                || sqlite::is_transient_error(&**db)
        }
        _ => false,
    }
}

/// Adds what was being done to a sqlx error.
pub(crate) trait QueryContext<T> {
    fn doing(self, doing: &'static str) -> Result<T, StoreError>;
}

impl<T> QueryContext<T> for Result<T, sqlx::Error> {
    fn doing(self, doing: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| query_error(doing, source))
    }
}

pub(crate) fn query_error(doing: &'static str, source: sqlx::Error) -> StoreError {
    StoreError::Query { doing, source }
}

/// What bounds one store's statements on a worker's path: its
/// `database.query_timeout` and its [`Switchover`] marker. Every store
/// (every source) has its own, so one source's settings and one source's
/// read-only answer never reach another's. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Bounds {
    query_timeout: Duration,
    switchover: Arc<Switchover>,
}

impl Default for Bounds {
    /// The default `database.query_timeout`, and a marker of its own.
    fn default() -> Self {
        Self {
            query_timeout: crate::config::DEFAULT_QUERY_TIMEOUT,
            switchover: Arc::default(),
        }
    }
}

impl Bounds {
    pub(crate) fn new(db: &DatabaseConfig) -> Self {
        Self {
            query_timeout: db.query_timeout,
            switchover: Arc::default(),
        }
    }

    /// The bound on one statement (`database.query_timeout`).
    pub fn query_timeout(&self) -> Duration {
        self.query_timeout
    }

    /// The store's switchover marker (its pool's `before_acquire` asks it).
    pub(crate) fn switchover(&self) -> Arc<Switchover> {
        self.switchover.clone()
    }

    /// A failed statement of this store, said with what was being done; a
    /// read-only answer marks the store's connections stale.
    pub(crate) fn error(&self, doing: &'static str, source: sqlx::Error) -> StoreError {
        self.switchover.note_failure(&source);
        StoreError::Query { doing, source }
    }

    /// An error of a whole operation: a read-only answer inside it marks
    /// the store's connections stale too.
    fn noted(&self, error: StoreError) -> StoreError {
        if let StoreError::Query { source, .. } = &error {
            self.switchover.note_failure(source);
        }
        error
    }
}

/// A database call that fails after its store's `query_timeout` instead of
/// waiting on a database that stopped answering.
pub(crate) trait Bounded<T>: Future<Output = Result<T, sqlx::Error>> + Sized {
    /// Bounds the call and says what it was doing when it failed.
    fn bounded(
        self,
        bounds: &Bounds,
        doing: &'static str,
    ) -> impl Future<Output = Result<T, StoreError>> {
        async move {
            match tokio::time::timeout(bounds.query_timeout, self).await {
                Ok(result) => result.map_err(|source| bounds.error(doing, source)),
                Err(_) => Err(StoreError::Timeout {
                    doing,
                    after: bounds.query_timeout,
                }),
            }
        }
    }
}

impl<T, F: Future<Output = Result<T, sqlx::Error>>> Bounded<T> for F {}

/// Bounds a whole multi-statement operation (a transaction of several
/// statements) by its store's `query_timeout`.
pub(crate) async fn bounded_op<T>(
    bounds: &Bounds,
    doing: &'static str,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let after = bounds.query_timeout;
    match tokio::time::timeout(after, op).await {
        Ok(result) => result.map_err(|e| bounds.noted(e)),
        Err(_) => Err(StoreError::Timeout { doing, after }),
    }
}

/// Renders a statement template: `{outbox}`, `{partitions}` and
/// `{workers}` become the configured table names (validated identifiers,
/// see `config::validate`).
pub(crate) fn render(tables: &TablesConfig, template: &str) -> String {
    template
        .replace("{outbox}", &tables.outbox)
        .replace("{partitions}", &tables.partitions)
        .replace("{workers}", &tables.workers)
}

/// A rendered SQL statement, cheap to clone into a query (opaque outside
/// the store).
#[derive(Debug, Clone)]
pub struct Sql(Arc<str>);

impl Sql {
    /// Renders a statement template (see [`render`]).
    pub(crate) fn render(tables: &TablesConfig, template: &str) -> Self {
        Sql(render(tables, template).into())
    }

    /// A statement already rendered (a backend's own [`render`]).
    pub(crate) fn from_rendered(sql: String) -> Self {
        Sql(sql.into())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn q(&self) -> sqlx::SqlStr {
        use sqlx::SqlSafeStr;
        // Only validated identifiers are spliced in (see config::validate).
        sqlx::AssertSqlSafe(self.0.clone()).into_sql_str()
    }
}

/// A bucket label as an SQL literal. Labels are `p` and digits (checked by
/// the partitioner and the schema), so quoting is all it needs; anything
/// else is refused rather than spliced.
pub(crate) fn label_literal(label: &str) -> Option<String> {
    let ok = label.len() <= 8
        && label.starts_with('p')
        && label[1..].bytes().all(|b| b.is_ascii_digit());
    ok.then(|| format!("'{label}'"))
}

/// A URL as errors show it: redacted, and saying so when it is the built-in
/// default (nothing configured it).
pub(crate) fn shown(url: &str) -> String {
    if url == crate::config::DEFAULT_DATABASE_URL {
        format!(
            "{} (the built-in default: set DATABASE_URL, --database-url or database.url)",
            Redacted(url)
        )
    } else {
        Redacted(url).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_scheme_chooses_the_backend() {
        for (url, kind) in [
            ("postgres://u@h/db", Some(BackendKind::Postgres)),
            ("postgresql://u@h/db", Some(BackendKind::Postgres)),
            ("mysql://u@h/db", Some(BackendKind::MySql)),
            ("mariadb://u@h/db", Some(BackendKind::MySql)),
            ("sqlite://x", Some(BackendKind::Sqlite)),
            ("not a url", None),
        ] {
            assert_eq!(BackendKind::of_url(url), kind, "{url}");
        }
    }

    #[test]
    fn only_bucket_labels_become_literals() {
        assert_eq!(label_literal("p07").as_deref(), Some("'p07'"));
        assert_eq!(label_literal("p07'; DROP TABLE x; --"), None);
        assert_eq!(label_literal("x07"), None);
    }
}
