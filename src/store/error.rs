//! What a store's failure says: [`StoreError`], with what was being done
//! and the server's cause once, and whether retrying may help.
//!
//! How a database's own errors are read (which ones retrying may get past,
//! what to add to a message) is the backend's: each gives an
//! [`ErrorDialect`], and its store's [`super::bounds::Bounds`] attaches it
//! to every error of its statements. Nothing here names a backend.

use std::time::Duration;

use sqlx::error::DatabaseError;

use super::settings::{BackendKind, fmt_duration};

/// How one database's errors are read: the backend's knowledge, attached
/// to each of its errors.
#[derive(Debug)]
pub struct ErrorDialect {
    /// True for an error the database may not give again later (a lock
    /// wait, a deadlock, a server shutting down, a read-only standby).
    pub transient: fn(&dyn DatabaseError) -> bool,
    /// What to add to the error's message, if anything.
    pub hint: fn(&dyn DatabaseError) -> Option<&'static str>,
    /// True when the database cancelled the statement at a time limit of
    /// its own (set for one statement: [`crate::store::statements::MessagesSql`]).
    pub cancelled: fn(&dyn DatabaseError) -> bool,
}

impl ErrorDialect {
    /// For errors of no particular database: only a lost connection or an
    /// exhausted pool is transient.
    pub const GENERIC: ErrorDialect = ErrorDialect {
        transient: |_| false,
        hint: |_| None,
        cancelled: |_| false,
    };
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
    #[error("database error while {doing}: {}", Cause(source, dialect))]
    Query {
        doing: &'static str,
        source: sqlx::Error,
        /// How the database that answered reads its errors.
        dialect: &'static ErrorDialect,
    },
    #[error("database error while {doing}: no answer within {}", fmt_duration(*.after))]
    Timeout {
        doing: &'static str,
        after: Duration,
    },
}

impl StoreError {
    /// An error of a statement on a database `dialect` reads.
    pub fn query(dialect: &'static ErrorDialect, doing: &'static str, source: sqlx::Error) -> Self {
        StoreError::Query {
            doing,
            source,
            dialect,
        }
    }

    /// True when retrying later may succeed (connection lost, server
    /// restarting, pool exhausted, lock wait or deadlock), as opposed to a
    /// bug or a schema problem.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Connect { .. } | StoreError::ConnectTimeout { .. } => true,
            StoreError::Schema(_) | StoreError::SchemaNewer(_) | StoreError::Config(_) => false,
            StoreError::Query {
                source, dialect, ..
            } => match source {
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
                sqlx::Error::Database(db) => (dialect.transient)(&**db),
                _ => false,
            },
            StoreError::Timeout { .. } => true,
        }
    }

    /// True when the database cancelled the statement at a time limit of
    /// its own.
    pub fn is_cancelled(&self) -> bool {
        match self {
            StoreError::Query {
                source: sqlx::Error::Database(db),
                dialect,
                ..
            } => (dialect.cancelled)(&**db),
            _ => false,
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
        let cause = Cause(error, &ErrorDialect::GENERIC);
        let Some(link) = backend.tls_link() else {
            cause.fmt(f)?;
            return f.write_str(backend.connect_advice());
        };
        let files = crate::tls::TlsFiles::from_url(link, url);
        match crate::tls::explain(link, url, &files, error) {
            Some(line) => f.write_str(&line),
            None => cause.fmt(f),
        }
    }
}

/// A sqlx error as an operator reads it: for an error the server returned,
/// its message alone (sqlx appends the line of PostgreSQL's C source that
/// raised it, which no user can act on), and the dialect's hint.
struct Cause<'a>(&'a sqlx::Error, &'a ErrorDialect);

impl std::fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            sqlx::Error::Database(db) => {
                f.write_str(db.message())?;
                if let Some(hint) = (self.1.hint)(&**db) {
                    f.write_str(hint)?;
                }
                Ok(())
            }
            other => other.fmt(f),
        }
    }
}
