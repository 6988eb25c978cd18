//! Flows that change several rows as steps of one transaction, written once
//! over the driver contract ([`super::driver`]) for every backend.
//!
//! - [`leases`]: acquiring, renewing and releasing bucket leases, with
//!   their lease events. Why no epoch goes to two owners: the rows a change
//!   reads are the rows it writes, with nobody writing between: the
//!   backend's read locks them (`FOR UPDATE`), or its transaction holds
//!   the database's only write lock.
//! - [`operator`]: dropping and requeueing parked messages, each with its
//!   audit record.
//!
//! A backend renders [`StepsSql`] and
//! implements [`Stepwise`]; it then has `PartitionStore` and `ParkedStore`
//! from here, whole.

pub mod leases;
pub mod operator;

use super::driver::Driver;
use super::statements::Dialect;
use super::statements::StepsSql;
use crate::store::settings::Tables;
use crate::store::sql::Sql;

/// What the multi-bucket views ([`super::views`]) need of a backend.
pub(crate) struct Views<'a> {
    pub tables: &'a Tables,
    /// How it reads the outbox through an index.
    pub(crate) dialect: Dialect,
    /// Every bucket's lease and head, as `views::LeaseLine`.
    pub overview_lines: &'a Sql,
}

/// A backend whose multi-row changes run as the steps of this module.
pub(crate) trait Stepwise: Driver {
    /// The statements of the lease and operator steps.
    fn steps(&self) -> &StepsSql;

    /// How the views read it.
    fn views(&self) -> Views<'_>;
}
