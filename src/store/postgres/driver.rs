//! PostgreSQL's side of the driver contract (`store::driver`): neutral
//! arguments bound as PostgreSQL takes them (durations in milliseconds, as
//! `$n::float8 / 1000` seconds), statements run on the [`DbPool`] (so a
//! transaction pooler's rules hold) or in one of its transactions.

use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow};
use sqlx::{Arguments, Executor, Postgres};

use super::{DbPool, PgBackend, Tx};
use crate::store::driver::{Arg, Binding, Driver, Record, Runs, json_list};
use crate::store::statements::Rendered;
use crate::store::{Bounds, QueryContext, StoreError};

/// Milliseconds of a duration, as PostgreSQL's statements take them
/// (`make_interval(secs => $n::float8 / 1000)`).
pub(crate) fn millis(d: std::time::Duration) -> f64 {
    d.as_millis() as f64
}

impl Binding for Postgres {
    type Args = PgArguments;

    fn arguments(args: &[Arg<'_>]) -> Result<PgArguments, BoxDynError> {
        let mut bound = PgArguments::default();
        for arg in args {
            match *arg {
                Arg::Uuid(v) => bound.add(v)?,
                Arg::Int(v) => bound.add(v)?,
                Arg::Float(v) => bound.add(v)?,
                Arg::Bool(v) => bound.add(v)?,
                Arg::Text(v) => bound.add(v)?,
                Arg::Duration(d) => bound.add(millis(d))?,
                Arg::Ids(v) => bound.add(v)?,
                Arg::Labels(v) => bound.add(v)?,
                Arg::Pairs(v) => bound.add(json_list(v))?,
            }
        }
        Ok(bound)
    }

    fn decode<T: Record>(row: &PgRow) -> Result<T, sqlx::Error> {
        T::from_row(row)
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }
}

impl Runs for &DbPool {
    type Db = Postgres;

    fn on(&mut self) -> impl Executor<'_, Database = Postgres> {
        *self
    }

    fn bounds(&self) -> &Bounds {
        DbPool::bounds(self)
    }
}

impl Runs for Tx {
    type Db = Postgres;

    fn on(&mut self) -> impl Executor<'_, Database = Postgres> {
        self
    }

    fn bounds(&self) -> &Bounds {
        Tx::bounds(self)
    }
}

impl Driver for PgBackend {
    type Pool<'a> = &'a DbPool;
    type Tx = Tx;

    fn pool(&self) -> &DbPool {
        &self.pool
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        self.pool.begin().await.doing("starting a transaction")
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
        self.pool.bounds()
    }
}
