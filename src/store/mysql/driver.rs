//! MySQL/MariaDB's side of the driver contract (`store::driver`): neutral
//! arguments bound as MySQL takes them (durations in microseconds, for
//! `INTERVAL ? MICROSECOND`), statements run on the pool or in one of its
//! transactions.

use sqlx::error::BoxDynError;
use sqlx::mysql::{MySqlArguments, MySqlQueryResult, MySqlRow};
use sqlx::{Arguments, Executor, MySql, MySqlPool};

use super::{MySqlBackend, micros};

/// A transaction on MySQL/MariaDB.
pub type Tx = sqlx::Transaction<'static, MySql>;
use crate::store::driver::{Arg, Binding, Driver, Record, Runs, json_list};
use crate::store::statements::Rendered;
use crate::store::{QueryContext, StoreError};

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

impl Runs for &MySqlPool {
    type Db = MySql;

    fn on(&mut self) -> impl Executor<'_, Database = MySql> {
        *self
    }
}

impl Runs for sqlx::Transaction<'_, MySql> {
    type Db = MySql;

    fn on(&mut self) -> impl Executor<'_, Database = MySql> {
        &mut **self
    }
}

impl Driver for MySqlBackend {
    type Pool<'a> = &'a MySqlPool;
    type Tx = Tx;

    fn pool(&self) -> &MySqlPool {
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
}
