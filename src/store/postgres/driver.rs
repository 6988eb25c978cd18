//! PostgreSQL's side of the driver contract (`store::driver`): neutral
//! arguments bound as PostgreSQL takes them (durations in milliseconds, as
//! `$n::float8 / 1000` seconds), statements run on the [`DbPool`] (so a
//! transaction pooler's rules hold) or in one of its transactions.

use super::ERRORS;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgQueryResult};
use sqlx::{Arguments, Executor, Postgres};

use super::{DbPool, PgBackend, Tx};
use crate::store::bounds::{Bounds, QueryContext};
use crate::store::driver::{Arg, Binding, Driver, Runs, Transaction, arguments};
use crate::store::error::StoreError;
use crate::store::statements::Rendered;

/// Milliseconds of a duration, as PostgreSQL's statements take them
/// (`make_interval(secs => $n::float8 / 1000)`).
pub(crate) fn millis(d: std::time::Duration) -> f64 {
    d.as_millis() as f64
}

impl Binding for Postgres {
    type Args = PgArguments;

    fn arguments(args: &[Arg<'_>]) -> Result<PgArguments, BoxDynError> {
        // Durations in milliseconds as a float (`$n::float8 / 1000`), ids
        // and labels as arrays (`= ANY($n)`).
        arguments(args, |bound: &mut PgArguments, arg| match arg {
            Arg::Duration(d) => bound.add(millis(d)).map(|()| true),
            Arg::Ids(v) => bound.add(v).map(|()| true),
            Arg::Labels(v) => bound.add(v).map(|()| true),
            _ => Ok(false),
        })
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    const INSERT_RETURNS_ID: bool = true;

    fn last_insert_id(_done: &PgQueryResult) -> i64 {
        unreachable!("PostgreSQL returns the id as a row")
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

impl Transaction for Tx {
    async fn commit(self) -> Result<(), sqlx::Error> {
        Tx::commit(self).await
    }

    async fn rollback(self) -> Result<(), sqlx::Error> {
        Tx::rollback(self).await
    }
}

impl Driver for PgBackend {
    type Pool<'a> = &'a DbPool;
    type Tx = Tx;

    fn pool(&self) -> &DbPool {
        &self.pool
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        self.pool
            .begin()
            .await
            .doing(&ERRORS, "starting a transaction")
    }

    fn sql(&self) -> &Rendered {
        &self.sql
    }

    async fn run_migrations(&self) -> Result<Vec<String>, StoreError> {
        self.run_migrations().await
    }

    fn bounds(&self) -> &Bounds {
        self.pool.bounds()
    }
}
