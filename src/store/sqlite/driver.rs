//! SQLite's side of the driver contract (`store::driver`): neutral
//! arguments bound as SQLite takes them (durations in milliseconds, for
//! `{now+?}`), statements run on the pool or in a write transaction
//! (`BEGIN IMMEDIATE`, see [`super`]).

use sqlx::Sqlite;
use sqlx::error::BoxDynError;
use sqlx::sqlite::{SqliteArguments, SqlitePool, SqliteQueryResult};

use super::SqliteBackend;
use crate::store::bounds::Bounds;
use crate::store::driver::{Arg, Binding, BoundTx, Driver, OnPool, arguments};
use crate::store::error::StoreError;
use crate::store::statements::Rendered;

/// A transaction on SQLite.
pub type Tx = BoundTx<Sqlite>;

impl Binding for Sqlite {
    type Args = SqliteArguments;

    fn arguments(args: &[Arg<'_>]) -> Result<SqliteArguments, BoxDynError> {
        // Durations in milliseconds, lists as JSON: the common binding.
        arguments(args, |_: &mut SqliteArguments, _| Ok(false))
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    const INSERT_RETURNS_ID: bool = false;

    fn last_insert_id(done: &SqliteQueryResult) -> i64 {
        done.last_insert_rowid()
    }
}

impl Driver for SqliteBackend {
    type Pool<'a> = OnPool<'a, SqlitePool>;
    type Tx = Tx;

    /// The writer: the one writer keeps the worker's writes in one queue.
    fn pool(&self) -> OnPool<'_, SqlitePool> {
        OnPool {
            pool: &self.writer,
            bounds: &self.bounds,
        }
    }

    /// The readers: a read never waits behind the writer's queue.
    fn reads(&self) -> OnPool<'_, SqlitePool> {
        OnPool {
            pool: &self.pool,
            bounds: &self.bounds,
        }
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        self.write().await
    }

    fn sql(&self) -> &Rendered {
        &self.sql
    }

    async fn run_migrations(&self) -> Result<Vec<String>, StoreError> {
        self.run_migrations().await
    }

    fn bounds(&self) -> &Bounds {
        &self.bounds
    }
}
