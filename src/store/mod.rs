//! All SQL lives here, behind one backend-neutral interface.
//!
//! [`Store`] is what every other part of outboxd holds: a cheap handle on
//! one database backend, chosen by the URL's scheme — PostgreSQL
//! (`postgres://`, `postgresql://`), MySQL/MariaDB (`mysql://`,
//! `mariadb://`) or SQLite (`sqlite://path`). It dereferences to
//! [`Backend`], one trait per table. This module only assembles; the
//! store is three layers, each importing only from the ones below:
//!
//! | layer | modules | what they own |
//! |---|---|---|
//! | vocabulary | [`error`], [`bounds`], [`sql`], [`settings`], [`outbox`], [`partitions`], [`workers`], [`stats`], [`schema`], [`repartition`], [`notify`], [`rows`], [`switchover`], [`paced`] | errors, bounds, SQL text, typed settings; each table's types and the trait every backend has ([`OutboxStore`], [`PartitionStore`], [`WorkerStore`], …); the rows the flows read |
//! | contract | [`driver`], [`statements`] | what a backend gives: how its database binds arguments and runs statements, and its statement sets |
//! | flows | [`drain`], [`migrate`], [`membership`], [`throughput`], [`lookups`], `views`, `repartition::flow`, `stepwise` | every operation, written once over the contract for every backend |
//! | backends | [`postgres`], [`mysql`], [`sqlite`] | each its SQL, migrations (`migrations/<backend>`), pool and wake-ups |
//!
//! The book's *Adding a database* (`docs/adding-a-database.md`) walks
//! through what a backend provides. Nothing above this module knows which
//! backend it talks to.
//!
//! What every backend promises, whatever its SQL:
//!
//! - every write to a bucket's rows carries the lease fence `(partition_key,
//!   lease_owner, lease_epoch)` and the bucket's claim token, checked in the
//!   same statement as the write;
//! - time is the database's clock (UTC), never the worker's;
//! - every statement on a worker's path is *bounded* ([`bounds`]): it fails
//!   after `database.query_timeout` instead of waiting on a database that
//!   stopped answering, and every pooled connection is hardened against a
//!   silent peer ([`crate::net`]), so a blackholed link is noticed in
//!   seconds. Only the operator's long statements (migrations,
//!   repartitioning, a purge's count and VACUUM) run unbounded;
//! - errors say what was being done and the server's cause once
//!   ([`StoreError`]), and say whether retrying may help.

pub mod backend;
pub mod bounds;
pub mod drain;
pub mod driver;
pub mod error;
pub mod lookups;
pub mod membership;
pub mod migrate;
pub mod mysql;
pub mod notify;
pub mod outbox;
pub mod paced;
pub mod partitions;
pub mod postgres;
pub mod repartition;
pub mod rows;
pub mod schema;
pub mod settings;
pub mod sql;
pub mod sqlite;
pub mod statements;
pub mod stats;
pub(crate) mod stepwise;
pub mod switchover;
pub mod throughput;
pub(crate) mod trim;
pub(crate) mod views;
pub mod workers;

use std::sync::Arc;

pub use backend::Backend;
pub use bounds::Bounds;
pub use error::{ErrorDialect, StoreError};
pub use lookups::{OutboxLookups, PartitionLookups};
pub use notify::{Channel, Listener, Notification, NotifyStore};
pub use outbox::{HeadAction, MessageViews, OutboxStore, ParkedStore};
pub use partitions::PartitionStore;
pub use repartition::RepartitionStore;
pub use schema::SchemaStore;
pub use settings::{BackendKind, Pooler, StoreSettings, Tables};
pub use sql::Sql;
pub use stats::StatsStore;
pub use switchover::Switchover;
pub use workers::WorkerStore;

/// A handle on the database: what every component that talks to it holds.
/// Cheap to clone; dereferences to the [`Backend`] interface.
#[derive(Debug, Clone)]
pub struct Store(Arc<dyn Backend>);

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl Store {
    /// Connects to the database `settings.url` names, by its scheme.
    pub async fn connect(
        settings: &StoreSettings,
        application_name: &str,
    ) -> Result<Self, StoreError> {
        let kind = BackendKind::of_url(&settings.url).unwrap_or(BackendKind::Postgres);
        for (key, url) in [
            ("database.url", &settings.url),
            ("database.listen_url", &settings.listen_url),
        ] {
            if let Some(link) = kind.tls_link()
                && !url.is_empty()
            {
                crate::tls::TlsFiles::check_url(link, url)
                    .map_err(|e| StoreError::Config(format!("{key}: {e}")))?;
            }
        }
        let backend: Arc<dyn Backend> = match kind {
            BackendKind::MySql => {
                Arc::new(mysql::MySqlBackend::connect(settings, application_name).await?)
            }
            BackendKind::Sqlite => {
                Arc::new(sqlite::SqliteBackend::connect(settings, application_name).await?)
            }
            BackendKind::Postgres => {
                Arc::new(postgres::PgBackend::connect(settings, application_name).await?)
            }
        };
        Ok(Self(backend))
    }

    /// A store for a command that needs a session of its own (`outboxd
    /// migrate`): behind a PostgreSQL transaction pooler, on the direct
    /// `database.listen_url` when there is one (else the command refuses).
    pub async fn connect_for_session(
        settings: &StoreSettings,
        application_name: &str,
    ) -> Result<Self, StoreError> {
        match (settings.pooler, settings.listen_url()) {
            (Pooler::Transaction, Some(direct)) => {
                tracing::info!(
                    url = %settings::redacted(direct),
                    "behind a transaction pooler: using the direct database.listen_url"
                );
                let direct = StoreSettings {
                    url: direct.to_string(),
                    pooler: Pooler::None,
                    max_connections: 2,
                    ..settings.clone()
                };
                Self::connect(&direct, application_name).await
            }
            _ => Self::connect(settings, application_name).await,
        }
    }

    /// The PostgreSQL backend, when that is what this store talks to (for
    /// tests and tools that inspect PostgreSQL itself).
    pub fn postgres(&self) -> Option<&postgres::PgBackend> {
        let any: &dyn std::any::Any = &*self.0;
        any.downcast_ref()
    }

    /// The MySQL/MariaDB backend, when that is what this store talks to.
    pub fn mysql(&self) -> Option<&mysql::MySqlBackend> {
        let any: &dyn std::any::Any = &*self.0;
        any.downcast_ref()
    }

    /// The SQLite backend, when that is what this store talks to.
    pub fn sqlite(&self) -> Option<&sqlite::SqliteBackend> {
        let any: &dyn std::any::Any = &*self.0;
        any.downcast_ref()
    }
}
