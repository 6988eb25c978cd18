//! SQLite: the connection pool on the database file.
//!
//! Every connection uses WAL mode (readers and the writer do not block
//! each other; the whole fleet of one host shares the file), waits for the
//! write lock up to `database.query_timeout` (SQLite's busy timeout) and
//! writes with `synchronous = NORMAL` (see [`super`]). The file is created
//! when missing, so `outboxd migrate` can start a deployment from nothing.

use std::str::FromStr;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};

use crate::config::DatabaseConfig;
use crate::store::{BackendKind, StoreError, shown};

/// Opens a pool on the file `db.url` names (`sqlite://path`).
pub async fn connect(db: &DatabaseConfig) -> Result<SqlitePool, StoreError> {
    let url = db.url.as_str();
    let connect_err = |cause| StoreError::Connect {
        backend: BackendKind::Sqlite,
        url: shown(url),
        cause,
    };
    let options = SqliteConnectOptions::from_str(url)
        .map_err(connect_err)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(db.query_timeout);
    // One connection first, by hand: a pool reports every failure to open
    // as "pool timed out", and the cause is what the operator needs.
    let first = tokio::time::timeout(db.connect_timeout, options.connect())
        .await
        .map_err(|_| StoreError::ConnectTimeout {
            backend: BackendKind::Sqlite,
            url: shown(url),
            after: db.connect_timeout,
        })?
        .map_err(connect_err)?;
    let _ = first.close().await;
    Ok(SqlitePoolOptions::new()
        .max_connections(db.max_connections)
        .min_connections(0)
        .acquire_timeout(db.connect_timeout)
        .connect_lazy_with(options))
}
