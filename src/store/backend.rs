//! [`Backend`]: everything a backend does, one trait per table — what a
//! [`super::Store`] holds and dereferences to.

use super::error::StoreError;
use super::lookups::{OutboxLookups, PartitionLookups};
use super::notify::NotifyStore;
use super::outbox::{MessageViews, OutboxStore, ParkedStore};
use super::partitions::PartitionStore;
use super::repartition::RepartitionStore;
use super::schema::SchemaStore;
use super::settings::BackendKind;
use super::stats::StatsStore;
use super::workers::WorkerStore;

/// Everything a backend does: one trait per table (see the store's module
/// docs).
pub trait Backend:
    OutboxStore
    + MessageViews
    + ParkedStore
    + OutboxLookups
    + PartitionLookups
    + PartitionStore
    + WorkerStore
    + StatsStore
    + SchemaStore
    + RepartitionStore
    + NotifyStore
    + std::fmt::Debug
    + std::any::Any
    + Send
    + Sync
{
    fn kind(&self) -> BackendKind;

    /// One trivial statement: whether the database answers now (for the
    /// probes and `/healthz`).
    fn ping(&self) -> futures_util::future::BoxFuture<'_, Result<(), StoreError>>;

    /// Closes every connection.
    fn close(&self) -> futures_util::future::BoxFuture<'_, ()>;
}
