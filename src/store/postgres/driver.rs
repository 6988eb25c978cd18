//! PostgreSQL's side of the driver contract (`store::driver`): neutral
//! arguments bound as PostgreSQL takes them (durations in milliseconds, as
//! `$n::float8 / 1000` seconds), statements run on the [`DbPool`] (so a
//! transaction pooler's rules hold) or in one of its transactions.

use super::ERRORS;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgQueryResult, PgTypeInfo};
use sqlx::{Arguments, Encode, Executor, Postgres, Type};

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

/// What PostgreSQL binds its own way: durations in milliseconds as a
/// float (`$n::float8 / 1000`), ids and labels as arrays (`= ANY($n)`).
fn own<A: Arguments<Database = Postgres>>(
    bound: &mut A,
    arg: Arg<'_>,
) -> Result<bool, BoxDynError> {
    match arg {
        Arg::Duration(d) => bound.add(millis(d)).map(|()| true),
        Arg::Ids(v) => bound.add(v).map(|()| true),
        Arg::Labels(v) => bound.add(v).map(|()| true),
        _ => Ok(false),
    }
}

/// The types `args` are bound as, as [`Binding::arguments`] binds them:
/// the types to prepare a statement with before its first run, so that
/// PostgreSQL reads the values that run sends as what they are.
pub(crate) fn parameter_types(args: &[Arg<'_>]) -> Vec<PgTypeInfo> {
    let types: Types = arguments(args, own).expect("keeping a type never fails");
    types.0
}

/// Arguments that keep only each value's type.
#[derive(Default)]
struct Types(Vec<PgTypeInfo>);

impl Arguments for Types {
    type Database = Postgres;

    fn reserve(&mut self, additional: usize, _size: usize) {
        self.0.reserve(additional);
    }

    fn add<'t, T>(&mut self, value: T) -> Result<(), BoxDynError>
    where
        T: Encode<'t, Postgres> + Type<Postgres>,
    {
        // What `PgArguments` records for the value.
        self.0.push(value.produces().unwrap_or_else(T::type_info));
        Ok(())
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

impl Binding for Postgres {
    type Args = PgArguments;

    fn arguments(args: &[Arg<'_>]) -> Result<PgArguments, BoxDynError> {
        arguments(args, own)
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
