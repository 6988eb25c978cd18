//! The statement sets every backend renders, one struct per table, the
//! same fields on every backend with the same parameters in the same order
//! (each field's doc names them), so the flows over them (`store::driver`)
//! are written once.

use super::Sql;

/// The `outbox_workers` statements, rendered by each backend. Parameters in
/// order, as every backend binds them; durations as `Arg::Duration`.
#[derive(Debug)]
pub struct WorkersSql {
    /// Serialises registrations (and repartitioning) until the transaction
    /// ends. No parameters.
    pub lock_registrations: Sql,
    /// Every worker row, as `WorkerView`. No parameters.
    pub list: Sql,
    /// worker_id, hostname, pid, version, mode, heartbeat TTL, can_publish,
    /// name.
    pub register: Sql,
    /// heartbeat TTL, published_total, failed_total, published_rate,
    /// worker_id.
    pub heartbeat: Sql,
    /// worker_id.
    pub remove: Sql,
    /// Live workers other than worker_id, as `LiveWorker`: worker_id.
    pub live_others: Sql,
    /// The live fleet workers that can publish, less late ones without a
    /// valid lease, as (worker_id, seconds since its heartbeat, seconds
    /// until its heartbeat expires), sorted by id
    /// ([`WorkerStore::membership`](super::workers::WorkerStore::membership)):
    /// worker_id (never left out), suspect_after.
    pub live_leasing: Sql,
    /// Rows whose heartbeat ran out more than the grace ago: grace.
    pub remove_dead: Sql,
    /// can_publish, broker_error, worker_id.
    pub set_broker_state: Sql,
    /// broker_blocked, worker_id.
    pub set_broker_blocked: Sql,
}

/// The throughput statements, rendered by each backend.
#[derive(Debug)]
pub struct StatsSql {
    /// Add to the current second's and minute's counts, one statement or
    /// several: published, failed.
    pub record: Vec<Sql>,
    /// The database's clock, as one `DateTime<Utc>`. No parameters.
    pub now: Sql,
    /// (minute, published, failed) of a little over the last hour, oldest
    /// first. No parameters.
    pub minutes: Sql,
    /// (second, published, failed) of a little over the last five minutes,
    /// oldest first. No parameters.
    pub seconds: Sql,
    /// Delete seconds older than 10 minutes and minutes older than 7 days,
    /// one statement or several. No parameters.
    pub prune: Vec<Sql>,
}

/// The `outbox` table's one-statement operations (`store::lookups`),
/// rendered by each backend.
#[derive(Debug)]
pub struct OutboxLookupsSql {
    /// The highest id, 0 for an empty table. No parameters.
    pub newest_id: Sql,
    /// (id, partition_key) of the rows after an id, in id order: after,
    /// limit.
    pub added_after: Sql,
    /// One row as `MessageDetail`: id.
    pub detail: Sql,
    /// A bucket's parked rows, oldest first, as `MessageSummary`: bucket,
    /// limit.
    pub parked_in_bucket: Sql,
    /// Hands a claim back: bucket, token.
    pub release_claim: Sql,
    /// Drops an earlier lease's claim: bucket, owner, epoch.
    pub clear_claims: Sql,
    /// The reads across buckets, in each backend's own SQL.
    pub buckets: BucketReadsSql,
}

/// The outbox's reads across buckets, each backend's SQL (its index path,
/// its clock).
#[derive(Debug)]
pub struct BucketReadsSql {
    /// Which of the listed buckets have a head ready to publish: labels.
    pub ready_buckets: Sql,
    /// [`BucketReadsSql::ready_buckets`] and, in the same statement, the
    /// workers table's fingerprint ([`fleet_fingerprinted`]): labels.
    pub ready_and_fleet: Sql,
    /// One row: a label of the listed buckets that has a pending row
    /// (ready or not; NULL when none has), and the workers table's
    /// fingerprint ([`pending_fingerprinted`]): labels.
    pub pending_and_fleet: Sql,
    /// The head of each listed bucket, as `BucketHead` by label: labels.
    pub bucket_heads: Sql,
    /// How many rows were published longer ago than a duration: duration.
    pub count_purgeable: Sql,
}

/// The partitions table's reads (`store::lookups`), rendered by each
/// backend.
#[derive(Debug)]
pub struct PartitionLookupsSql {
    /// Every bucket's lease as `LeaseRow`, by label. No parameters.
    pub leases: Sql,
    /// Lease events after an id, oldest first, as `LeaseEvent`: after,
    /// limit.
    pub events_since: Sql,
    /// The latest lease events of a last stretch of time (the most recent
    /// `limit`), oldest first, as `LeaseEvent`: duration, limit.
    pub events_within: Sql,
}

/// The partitions table's changes as steps of one transaction
/// (`store::stepwise`), rendered by the backends without data-modifying
/// `WITH` (MySQL/MariaDB, SQLite; PostgreSQL makes each change one
/// statement). A read said to *lock* locks the rows it returns until the
/// transaction ends where the database locks rows (MySQL); on SQLite the
/// transaction already holds the file's only write lock. A list comes
/// first in each statement that takes one (MySQL's `JSON_TABLE` joins
/// stand before their `SET`).
#[derive(Debug)]
pub struct LeaseStepsSql {
    /// Inserts a row for every label that has none: labels.
    pub ensure_rows: Sql,
    /// Of the listed buckets, the free ones and those whose lease ran out,
    /// locked (a row another transaction is changing is skipped), as
    /// (partition_key, lease_owner, lease_epoch) by label: labels.
    pub acquirable: Sql,
    /// Takes the listed buckets, epoch + 1: labels, owner, TTL.
    pub acquire: Sql,
    /// Extends the owner's listed leases still at their epoch: held, TTL,
    /// owner.
    pub renew: Sql,
    /// [`LeaseStepsSql::renew`] that also pushes the owner's heartbeat
    /// (`heartbeat_at`, `heartbeat_until`; not the counts) in the same
    /// statement, counting the worker row among the rows it changed:
    /// held, owner (the worker row's), TTL, heartbeat TTL, owner. `None`
    /// where one statement cannot change two tables (SQLite).
    pub renew_and_beat: Option<Sql>,
    /// The owner's listed leases still at their epoch, locked, as
    /// (partition_key, lease_epoch) by label: held, owner.
    pub held: Sql,
    /// Every lease of the owner, locked, as (partition_key, lease_epoch)
    /// by label: owner.
    pub owned: Sql,
    /// Frees the owner's listed buckets: labels, owner.
    pub free: Sql,
    /// One lease event: partition_key, action, worker_id, old_owner,
    /// old_epoch, new_epoch, reason.
    pub log_event: Sql,
}

/// An operator's changes to parked rows as steps of one transaction
/// (`store::stepwise`), rendered as [`LeaseStepsSql`] is.
#[derive(Debug)]
pub struct OperatorStepsSql {
    /// The listed rows that may be dropped — parked rows and blocked heads
    /// (see `blocked_heads`) — locked, as `Dropped` by id: ids.
    pub droppable: Sql,
    /// Deletes the listed rows: ids.
    pub delete: Sql,
    /// The parked rows among the listed ids, in the listed buckets, or
    /// all of them, locked, as (id, message_key, whether its bucket
    /// exists) by id: ids, labels, all.
    pub requeueable: Sql,
    /// The table's `partition_count`. No parameters.
    pub partition_count: Sql,
    /// Makes the listed rows pending again from now, in the given bucket
    /// or (NULL) their own: ids, bucket.
    pub requeue: Sql,
    /// An operator action in `<outbox>_audit`: actor, action, detail (JSON
    /// text).
    pub audit: Sql,
    /// The listed rows that are blocked heads — pending, failed at least
    /// once and waiting for their retry (so in no batch) — locked, as
    /// `Dropped` by id: ids.
    pub blocked_heads: Sql,
    /// Parks the listed rows from now: ids.
    pub park: Sql,
    /// Makes the listed rows ready now (their attempts kept): ids.
    pub retry: Sql,
}

/// Where a backend's new labels are computed.
#[derive(Debug)]
pub enum Relabel {
    /// In SQL, by the table's label function, which reads the count this
    /// transaction recorded. Statements without parameters: the number of
    /// unpublished rows; how many of them a new label would move; the
    /// re-labelling.
    InSql {
        unpublished: Sql,
        count_moved: Sql,
        relabel: Sql,
    },
    /// Here, by the Rust partitioner (a database whose SQL cannot call the
    /// label function: SQLite): the unpublished rows as (id, partition_key,
    /// message_key), no parameters; then the new labels written: (label,
    /// id) pairs.
    Here {
        unpublished_rows: Sql,
        set_labels: Sql,
    },
}

/// The repartition's statements, rendered by each backend.
#[derive(Debug)]
pub struct RepartitionSql {
    /// `partition_count`, read so that producers wait for the change where
    /// their trigger reads it under a shared lock (MySQL: `FOR UPDATE`).
    /// No parameters.
    pub settings: Sql,
    /// `partition_count`, a plain read. No parameters.
    pub count: Sql,
    /// Holds new inserts until the transaction ends, where the settings row
    /// does not (PostgreSQL's table lock). No parameters.
    pub hold_producers: Option<Sql>,
    /// Records the new count: count.
    pub set_count: Sql,
    pub relabel: Relabel,
    /// One above the highest epoch of any bucket. No parameters.
    pub next_epoch: Sql,
    /// Deletes the buckets not listed: labels.
    pub drop_buckets: Sql,
    /// Clears every lease and claim and bumps every epoch. No parameters.
    pub reset_buckets: Sql,
    /// Adds the listed buckets that have no row: epoch, labels.
    pub add_buckets: Sql,
    /// The audit record of a repartition: actor, detail (JSON text).
    pub audit: Sql,
    /// Parks one row: error, id.
    pub park: Sql,
}

/// Every statement set of the contract, as one backend renders them for
/// its table names.
#[derive(Debug)]
pub struct Rendered {
    pub workers: WorkersSql,
    pub stats: StatsSql,
    pub lookups: OutboxLookupsSql,
    pub partition_lookups: PartitionLookupsSql,
    pub repartition: RepartitionSql,
}

/// The statement sets of the stepwise flows (`store::stepwise`).
#[derive(Debug)]
pub struct StepsSql {
    pub leases: LeaseStepsSql,
    pub operator: OperatorStepsSql,
}

/// `ready` (one text column: ready labels) with the workers table's
/// fingerprint in the same statement: rows of (label, NULL), then one of
/// (NULL, fingerprint). `fingerprint` is a backend's query of one text
/// value that changes whenever a worker row is added or removed, its
/// `can_publish` changes, or it becomes near or stops being so (the
/// watch's two durations, its arguments after the labels:
/// [`LateWatch`](crate::store::workers::LateWatch)) — what a membership
/// read depends on. A poller without notifications reads it with its
/// poll, so a membership change, or a peer nearing being left out, is
/// noticed without a membership read of its own (`relay::wakeups`).
pub(crate) fn fleet_fingerprinted(ready: &Sql, fingerprint: &str) -> Sql {
    Sql::from_rendered(format!(
        "SELECT r.partition_key, NULL AS fleet FROM ({}) r UNION ALL SELECT NULL, ({fingerprint})",
        ready.as_str()
    ))
}

/// `pending` (a backend's query of one label: any listed bucket with a
/// pending row, one probe of the pending index, no head read) and the
/// workers table's fingerprint ([`fleet_fingerprinted`]) as one row of two
/// text columns: the cheap look of an idle poller, which reads the ready
/// heads only when it found a pending row.
pub(crate) fn pending_fingerprinted(pending: &str, fingerprint: &str) -> Sql {
    Sql::from_rendered(format!(
        "SELECT ({pending}) AS pending, ({fingerprint}) AS fleet"
    ))
}
