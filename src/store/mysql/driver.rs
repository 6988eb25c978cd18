//! MySQL/MariaDB's side of the driver contract (`store::driver`): neutral
//! arguments bound as MySQL takes them (durations in microseconds, for
//! `INTERVAL ? MICROSECOND`), statements run on the pool or in one of its
//! transactions.

use sqlx::error::BoxDynError;
use sqlx::mysql::{MySqlArguments, MySqlQueryResult, MySqlRow};
use sqlx::{Arguments, Executor, MySql};

use super::pool::MyPool;
use super::{MySqlBackend, micros};

use crate::store::driver::{Arg, Binding, BoundTx, Driver, OnPool, Record, Runs, json_list};
use crate::store::statements::Rendered;
use crate::store::{Bounds, QueryContext, StoreError};

/// A transaction on MySQL/MariaDB.
pub type Tx = BoundTx<MySql>;

impl Binding for MySql {
    type Args = MySqlArguments;

    fn arguments(args: &[Arg<'_>]) -> Result<MySqlArguments, BoxDynError> {
        let mut bound = MySqlArguments::default();
        for arg in args {
            match *arg {
                Arg::Uuid(v) => bound.add(v)?,
                Arg::Int(v) => bound.add(v)?,
                Arg::Float(v) => bound.add(v)?,
                Arg::Bool(v) => bound.add(v)?,
                Arg::Text(v) => bound.add(v)?,
                Arg::Duration(d) => bound.add(micros(d))?,
                Arg::Ids(v) => bound.add(json_list(v))?,
                Arg::Labels(v) => bound.add(json_list(v))?,
                Arg::Pairs(v) => bound.add(json_list(v))?,
            }
        }
        Ok(bound)
    }

    fn decode<T: Record>(row: &MySqlRow) -> Result<T, sqlx::Error> {
        T::from_row(row)
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }
}

impl Runs for OnPool<'_, MyPool> {
    type Db = MySql;

    fn on(&mut self) -> impl Executor<'_, Database = MySql> {
        self.pool
    }

    fn bounds(&self) -> &Bounds {
        self.bounds
    }
}

impl Runs for Tx {
    type Db = MySql;

    fn on(&mut self) -> impl Executor<'_, Database = MySql> {
        &mut **self
    }

    fn bounds(&self) -> &Bounds {
        BoundTx::bounds(self)
    }
}

impl Driver for MySqlBackend {
    type Pool<'a> = OnPool<'a, MyPool>;
    type Tx = Tx;

    fn pool(&self) -> OnPool<'_, MyPool> {
        OnPool {
            pool: &self.pool,
            bounds: &self.bounds,
        }
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        let tx = self.pool.begin().await.doing("starting a transaction")?;
        Ok(BoundTx::lent(tx, &self.bounds))
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
