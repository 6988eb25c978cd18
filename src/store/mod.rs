//! All SQL lives here, one module per table.
//!
//! Table names are configurable, so statements are rendered once at start-up
//! from validated identifiers ([`Tables`]) and reused as prepared statements;
//! no SQL text is built on a hot path. Functions take an executor, so the
//! caller decides what runs in one transaction. Time is always the database's
//! `now()`.
//!
//! Every statement on a worker's path is *bounded* ([`Bounded`]): it fails
//! after `database.query_timeout` instead of waiting on a database that
//! stopped answering, and every pooled connection is hardened against a
//! silent peer ([`crate::net`]), so a blackholed link is noticed in seconds.
//! Only the operator's long statements (migrations, repartitioning, a
//! purge's count and VACUUM) run unbounded.
//!
//! - [`pool`]: the connection pool; transaction poolers and switchovers.
//! - [`schema`]: migrations, schema version check, deployment settings.
//! - [`outbox`]: enqueue, claim, record published / failed, bucket heads.
//! - [`partitions`]: one row per bucket (leases, in fleet mode).
//! - [`workers`]: membership rows and heartbeats.
//! - [`repartition`]: changing the bucket count; rows with unknown labels.
//! - [`stats`]: per-minute throughput for the dashboard.

pub mod outbox;
pub mod partitions;
pub mod pool;
pub mod repartition;
pub mod schema;
pub mod stats;
pub mod workers;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::config::{Config, TablesConfig, fmt_duration};
pub use pool::{DbPool, Tx, connect};

/// A database error, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot connect to PostgreSQL at {url}: {}", Cause(source))]
    Connect { url: String, source: sqlx::Error },
    #[error("cannot connect to PostgreSQL at {url}: no answer within {}", fmt_duration(*.after))]
    ConnectTimeout { url: String, after: Duration },
    #[error("{0}")]
    Schema(String),
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
    /// restarting, pool exhausted), as opposed to a bug or a schema problem.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Connect { .. } | StoreError::ConnectTimeout { .. } => true,
            StoreError::Schema(_) => false,
            StoreError::Query { source, .. } => is_transient(source),
            StoreError::Timeout { .. } => true,
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
                // 42P05 duplicate / 26000 unknown prepared statement: named
                // statements meeting a transaction pooler.
                if matches!(db.code().as_deref(), Some("42P05" | "26000")) {
                    f.write_str(
                        " (is the database reached through a pooler in transaction mode? \
                         set database.pooler = \"transaction\")",
                    )?;
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
            // 08: connection exception, 57P: operator intervention (admin
            // shutdown, crash shutdown, cannot connect now), 40: serialization
            // failure / deadlock, 53: insufficient resources, 25006: a
            // read-only server (a standby, a switchover in progress).
            db.code().is_some_and(|c| {
                c == "25006"
                    || c.starts_with("08")
                    || c.starts_with("57P")
                    || c.starts_with("40")
                    || c.starts_with("53")
            })
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

fn query_error(doing: &'static str, source: sqlx::Error) -> StoreError {
    pool::note_failure(&source);
    StoreError::Query { doing, source }
}

/// Bound on each worker statement, in milliseconds (`database.query_timeout`;
/// set once by [`connect`], process-wide like the pool it applies to).
static QUERY_TIMEOUT_MS: AtomicU64 =
    AtomicU64::new(crate::config::DEFAULT_QUERY_TIMEOUT.as_millis() as u64);

/// The current bound on one worker statement.
pub fn query_timeout() -> Duration {
    Duration::from_millis(QUERY_TIMEOUT_MS.load(Ordering::Relaxed))
}

/// A database call that fails after [`query_timeout`] instead of waiting
/// on a database that stopped answering.
pub(crate) trait Bounded<T>: Future<Output = Result<T, sqlx::Error>> + Sized {
    /// Bounds the call and says what it was doing when it failed.
    fn bounded(self, doing: &'static str) -> impl Future<Output = Result<T, StoreError>> {
        let after = query_timeout();
        async move {
            match tokio::time::timeout(after, self).await {
                Ok(result) => result.map_err(|source| query_error(doing, source)),
                Err(_) => Err(StoreError::Timeout { doing, after }),
            }
        }
    }
}

impl<T, F: Future<Output = Result<T, sqlx::Error>>> Bounded<T> for F {}

/// A rendered SQL statement, cheap to clone into a query.
#[derive(Debug, Clone)]
pub(crate) struct Sql(Arc<str>);

impl Sql {
    /// Renders a statement template: `{outbox}`, `{partitions}` and
    /// `{workers}` become the configured table names.
    pub(crate) fn render(tables: &TablesConfig, template: &str) -> Self {
        Sql(render(tables, template).into())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn q(&self) -> SqlStr {
        // Only validated identifiers are spliced in (see config::validate).
        AssertSqlSafe(self.0.clone()).into_sql_str()
    }
}

pub(crate) fn render(tables: &TablesConfig, template: &str) -> String {
    template
        .replace("{outbox}", &tables.outbox)
        .replace("{partitions}", &tables.partitions)
        .replace("{workers}", &tables.workers)
}

/// Every rendered statement, built once from the table names.
#[derive(Debug, Clone)]
pub struct Tables {
    pub names: TablesConfig,
    pub outbox: Arc<outbox::OutboxSql>,
    pub partitions: Arc<partitions::PartitionsSql>,
    pub workers: Arc<workers::WorkersSql>,
    pub stats: Arc<stats::StatsSql>,
}

impl Tables {
    pub fn new(names: &TablesConfig) -> Self {
        Self {
            names: names.clone(),
            outbox: Arc::new(outbox::OutboxSql::new(names)),
            partitions: Arc::new(partitions::PartitionsSql::new(names)),
            workers: Arc::new(workers::WorkersSql::new(names)),
            stats: Arc::new(stats::StatsSql::new(names)),
        }
    }

    /// The NOTIFY channel `<outbox>_enqueue()` signals on.
    pub fn notify_channel(&self) -> String {
        format!("{}_enqueued", self.names.outbox)
    }

    /// The NOTIFY channel workers announce joins, leaves and releases on.
    pub fn fleet_channel(&self) -> String {
        format!("{}_fleet", self.names.outbox)
    }
}

/// The pool and the statements: what every component that talks to the
/// database holds.
#[derive(Debug, Clone)]
pub struct Store {
    pub pool: DbPool,
    pub tables: Tables,
}

impl Store {
    /// Sends a NOTIFY (delivered when `exec`'s transaction commits).
    pub async fn notify<'e, E: sqlx::PgExecutor<'e>>(
        exec: E,
        channel: &str,
        payload: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(payload)
            .execute(exec)
            .bounded("sending a notification")
            .await?;
        Ok(())
    }

    /// Starts a transaction.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        self.pool.begin().bounded("starting a transaction").await
    }

    pub async fn connect(config: &Config, application_name: &str) -> Result<Self, StoreError> {
        Ok(Self {
            pool: connect(&config.database, application_name).await?,
            tables: Tables::new(&config.tables),
        })
    }

    /// A store for a command that needs a session of its own (`outboxd
    /// migrate`): behind a transaction pooler, on the direct
    /// `database.listen_url` when there is one (else the command refuses).
    pub async fn connect_for_session(
        config: &Config,
        application_name: &str,
    ) -> Result<Self, StoreError> {
        let db = &config.database;
        let pool = match (db.pooler, db.listen_url()) {
            (crate::config::Pooler::Transaction, Some(direct)) => {
                tracing::info!(
                    url = %crate::config::Redacted(direct),
                    "behind a transaction pooler: using the direct database.listen_url"
                );
                pool::connect_to(db, direct, crate::config::Pooler::None, 2, application_name)
                    .await?
            }
            _ => connect(db, application_name).await?,
        };
        Ok(Self {
            pool,
            tables: Tables::new(&config.tables),
        })
    }
}
