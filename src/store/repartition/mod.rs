//! Changing the bucket count of a deployment (`outboxd repartition`), and
//! parking rows whose bucket label this deployment does not have — the
//! types and the interface every backend implements ([`RepartitionStore`]).
//!
//! Per-key order survives a change of bucket count because all pending
//! rows of one key carry one label before the change and one label after
//! it, and a bucket is drained in `id` order whatever rows it holds. What
//! must not happen is a row labelled under the old count after the change
//! (a producer transaction that computed its label before the change and
//! commits after it) or a worker draining under the old count. So a
//! repartition runs in one transaction that
//!
//! 1. takes the registration lock and refuses while any worker is live, so
//!    no worker drains during the change and none can join in the middle;
//! 2. waits for the producer transactions in flight to commit, and holds
//!    new inserts (reads go on) until the change commits — producers wait,
//!    they do not fail (PostgreSQL: a `SHARE ROW EXCLUSIVE` lock on the
//!    outbox; MySQL: the settings row, which every insert's trigger reads
//!    with a shared lock, locked for update);
//! 3. records published the pending rows the caller found in a stream, as
//!    a drainer would (`published_at` set, or the rows deleted with
//!    `outbox.keep_published = false`); their worker was killed before it
//!    recorded them, and under the new count's producer names the broker
//!    would store them again;
//! 4. records the new count (which the database's label function, and so
//!    every enqueue and plain `INSERT`, reads), re-labels every unpublished
//!    row, pending and parked, from its message key, and drops every claim;
//! 5. replaces the bucket rows: removed buckets go, new ones come, every
//!    lease is cleared and every epoch bumped, so a write of any earlier
//!    lease holder matches no row;
//! 6. writes an audit record.
//!
//! Workers started afterwards with the old count refuse to start, and a
//! worker that somehow outlived the change (a stopped process that
//! resumes) stops when its maintenance task sees the new count.

pub(crate) mod flow;

use async_trait::async_trait;

use super::outbox::{MessageSummary, Published};
use super::workers::LiveWorker;
use crate::store::error::StoreError;

/// What a repartition did, or (dry run) would do.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RepartitionReport {
    pub from: u32,
    pub to: u32,
    /// Unpublished rows (pending and parked).
    pub unpublished: i64,
    /// Unpublished rows whose label changes.
    pub relabelled: i64,
    /// Pending rows a stream already holds, recorded published before the
    /// change (a dry run: found).
    pub recorded_stored: u64,
}

/// Why a repartition did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RepartitionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "{} worker(s) are live: {}. Stop every `outboxd work` first (their rows disappear on a clean exit, or when the heartbeat expires)",
        .0.len(), describe(.0)
    )]
    WorkersLive(Vec<LiveWorker>),
    #[error("the database has no recorded partition_count: run `outboxd migrate` first")]
    NotMigrated,
}

fn describe(live: &[LiveWorker]) -> String {
    live.iter()
        .map(|w| {
            format!(
                "{} pid {} on {} ({}, heartbeat expires in {:.0}s)",
                w.worker_id, w.pid, w.hostname, w.mode, w.expires_in
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A row parked because its bucket does not exist in this deployment.
#[derive(Debug, Clone)]
pub struct ParkedUnknown {
    pub id: i64,
    pub partition_key: String,
}

/// The error text of a row parked for an unknown label.
pub(crate) fn unknown_label_error(
    label: &str,
    partition_count: u32,
    message_key: &str,
    belongs_to: &str,
) -> String {
    format!(
        "unknown bucket label {label}: this deployment has {partition_count} buckets, \
         and key '{}' belongs to bucket {belongs_to}; requeue it to re-label it",
        message_key.replace('\'', "''")
    )
}

/// Repartitioning, as every backend implements it.
#[async_trait]
pub trait RepartitionStore {
    /// Changes the bucket count to `to` (see the module docs). `dry_run`
    /// counts what would change and changes nothing. `actor` goes to the
    /// audit record. `stored` are pending rows a stream already holds
    /// (`crate::stream::repartition`): they are recorded published as a
    /// drainer records them (`published`: kept, or deleted) in the same
    /// transaction, before the re-labelling, so that no worker sends them
    /// again under the new bucket count's producer names.
    async fn repartition(
        &self,
        to: u32,
        dry_run: bool,
        actor: &str,
        stored: &[i64],
        published: Published,
    ) -> Result<RepartitionReport, RepartitionError>;

    /// The pending rows of `bucket` with an id up to `up_to`, by id.
    async fn pending_up_to(
        &self,
        bucket: &str,
        up_to: i64,
    ) -> Result<Vec<MessageSummary>, StoreError>;

    /// Parks every pending row whose label is not one of this deployment's
    /// buckets (a producer that computed labels with another bucket count,
    /// or wrote one by hand): no worker would ever drain it, so it is made
    /// visible instead, with an error that says what is wrong and what the
    /// label should be. `outboxd failed requeue` re-labels such a row.
    /// Finding them costs a range scan of the pending index between the
    /// known labels, which holds only such rows, whatever the number of
    /// rows in the buckets.
    async fn park_unknown_labels(&self) -> Result<Vec<ParkedUnknown>, StoreError>;
}
