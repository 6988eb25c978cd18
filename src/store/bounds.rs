//! What bounds a store's statements: [`Bounds`] (its
//! `database.query_timeout`, its [`Switchover`] marker and how its
//! database's errors read), and the `Bounded` calls made under them.

use std::sync::Arc;
use std::time::Duration;

use super::error::{ErrorDialect, StoreError};
use super::switchover::Switchover;

/// What bounds one store's statements on a worker's path: its
/// `database.query_timeout`, its [`Switchover`] marker, and its database's
/// [`ErrorDialect`]. Every store (every source) has its own, so one
/// source's settings and one source's read-only answer never reach
/// another's. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Bounds {
    query_timeout: Duration,
    switchover: Arc<Switchover>,
    dialect: &'static ErrorDialect,
}

impl Bounds {
    /// Bounds of `query_timeout` on a database whose errors read as
    /// `dialect`, with a switchover marker of their own.
    pub fn new(query_timeout: Duration, dialect: &'static ErrorDialect) -> Self {
        Self {
            query_timeout,
            switchover: Arc::default(),
            dialect,
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
        StoreError::query(self.dialect, doing, source)
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

/// Adds what was being done to a sqlx error of a database `dialect` reads
/// (each backend passes its own).
pub(crate) trait QueryContext<T> {
    fn doing(self, dialect: &'static ErrorDialect, doing: &'static str) -> Result<T, StoreError>;
}

impl<T> QueryContext<T> for Result<T, sqlx::Error> {
    fn doing(self, dialect: &'static ErrorDialect, doing: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::query(dialect, doing, source))
    }
}
