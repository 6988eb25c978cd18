//! MySQL/MariaDB's side of the driver contract (`store::driver`): neutral
//! arguments bound as MySQL takes them (durations in microseconds, for
//! `INTERVAL ? MICROSECOND`), statements run on the pool or in one of its
//! transactions.

use super::ERRORS;
use sqlx::error::BoxDynError;
use sqlx::mysql::{MySqlArguments, MySqlQueryResult};
use sqlx::{Arguments, MySql};

use super::pool::MyPool;
use super::{MySqlBackend, micros};

use crate::store::bounds::{Bounds, QueryContext};
use crate::store::driver::{Arg, Binding, BoundTx, Driver, OnPool, arguments};
use crate::store::error::StoreError;
use crate::store::statements::Rendered;

/// A transaction on MySQL/MariaDB.
pub type Tx = BoundTx<MySql>;

impl Binding for MySql {
    type Args = MySqlArguments;

    fn arguments(args: &[Arg<'_>]) -> Result<MySqlArguments, BoxDynError> {
        // Durations in microseconds, for `INTERVAL ? MICROSECOND`.
        arguments(args, |bound: &mut MySqlArguments, arg| match arg {
            Arg::Duration(d) => bound.add(micros(d)).map(|()| true),
            _ => Ok(false),
        })
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    const INSERT_RETURNS_ID: bool = false;

    fn last_insert_id(done: &MySqlQueryResult) -> i64 {
        done.last_insert_id() as i64
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
        let tx = self
            .pool
            .begin()
            .await
            .doing(&ERRORS, "starting a transaction")?;
        Ok(BoundTx::lent(tx, &self.bounds))
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
