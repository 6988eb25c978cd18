//! SQLite's side of the driver contract (`store::driver`): neutral
//! arguments bound as SQLite takes them (durations in milliseconds, for
//! `{now+?}`), statements run on the pool or in a write transaction
//! (`BEGIN IMMEDIATE`, see [`super`]).

use sqlx::error::BoxDynError;
use sqlx::sqlite::{SqliteArguments, SqlitePool, SqliteQueryResult, SqliteRow};
use sqlx::{Arguments, Executor, Sqlite};

use super::SqliteBackend;
use crate::store::driver::{Arg, Binding, BoundTx, Driver, OnPool, Record, Runs, json_list};
use crate::store::statements::Rendered;
use crate::store::{Bounds, QueryContext, StoreError};

/// A transaction on SQLite.
pub type Tx = BoundTx<Sqlite>;

/// Milliseconds of a duration, for `{now+?}`.
pub(crate) fn millis(d: std::time::Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

impl Binding for Sqlite {
    type Args = SqliteArguments;

    fn arguments(args: &[Arg<'_>]) -> Result<SqliteArguments, BoxDynError> {
        let mut bound = SqliteArguments::default();
        for arg in args {
            match *arg {
                Arg::Uuid(v) => bound.add(v)?,
                Arg::Int(v) => bound.add(v)?,
                Arg::Float(v) => bound.add(v)?,
                Arg::Bool(v) => bound.add(v)?,
                Arg::Text(v) => bound.add(v.map(str::to_string))?,
                Arg::Duration(d) => bound.add(millis(d))?,
                Arg::Ids(v) => bound.add(json_list(v))?,
                Arg::Labels(v) => bound.add(json_list(v))?,
                Arg::Pairs(v) => bound.add(json_list(v))?,
            }
        }
        Ok(bound)
    }

    fn decode<T: Record>(row: &SqliteRow) -> Result<T, sqlx::Error> {
        T::from_row(row)
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}

impl Runs for OnPool<'_, SqlitePool> {
    type Db = Sqlite;

    fn on(&mut self) -> impl Executor<'_, Database = Sqlite> {
        self.pool
    }

    fn bounds(&self) -> &Bounds {
        self.bounds
    }
}

impl Runs for Tx {
    type Db = Sqlite;

    fn on(&mut self) -> impl Executor<'_, Database = Sqlite> {
        &mut **self
    }

    fn bounds(&self) -> &Bounds {
        BoundTx::bounds(self)
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

    async fn commit(tx: Tx) -> Result<(), StoreError> {
        tx.commit().await.doing("committing")
    }

    async fn rollback(tx: Tx) -> Result<(), StoreError> {
        tx.rollback().await.doing("rolling back")
    }

    fn sql(&self) -> &Rendered {
        &self.sql
    }

    fn bounds(&self) -> &Bounds {
        &self.bounds
    }
}
