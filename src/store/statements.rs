//! The statement sets every backend renders, one struct per table, the
//! same fields on every backend with the same parameters in the same order
//! (each field's doc names them), so the flows over them (`store::driver`)
//! are written once.

use std::time::Duration;

use super::settings::Tables;
use super::sql::Sql;

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
/// (`store::stepwise`). A read said to *lock* locks the rows it returns
/// until the transaction ends where the database locks rows; on SQLite
/// the transaction already holds the file's only write lock. A list
/// comes first in each statement that takes one (MySQL's `JSON_TABLE`
/// joins stand before their `SET`).
#[derive(Debug)]
pub struct LeaseStepsSql {
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
    /// The lease events of one change, written in the order listed: one
    /// JSON array of events, each an array of partition_key, action,
    /// worker_id, old_owner (UUIDs as 32 hex digits; old_owner may be
    /// null), old_epoch, new_epoch, reason.
    pub log_events: Sql,
    /// The changes that take several steps above as one statement each,
    /// where one statement can change two tables; `None` where it cannot
    /// (no data-modifying `WITH`: MySQL/MariaDB, SQLite).
    pub at_once: Option<LeasesAtOnceSql>,
}

/// Lease changes that write their events in the same statement: one round
/// trip for the five of the steps (begin, read, change, events, commit),
/// which a worker on a slow database link waits through at every start
/// and every rebalance. Each returns what its steps return.
#[derive(Debug)]
pub struct LeasesAtOnceSql {
    /// The listed buckets that are free or whose lease ran out (a row
    /// being changed is skipped), taken with their events, as
    /// (partition_key, new lease_epoch): labels, owner, TTL, reason.
    pub acquire: Sql,
    /// The owner's listed leases still at their epoch, freed with their
    /// events, as partition_key: held, owner, reason.
    pub release: Sql,
    /// Every lease of the owner, freed with its events, as
    /// partition_key: owner, reason.
    pub release_all: Sql,
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
    /// all of them, locked, as (id, message_key, partition_key, whether its
    /// bucket exists) by id: ids, labels, all.
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
    /// Wakes the workers of the listed buckets when the transaction
    /// commits, where the database notifies (PostgreSQL's `NOTIFY`; the
    /// others' workers find the rows at their next poll): labels.
    pub wake: Option<Sql>,
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
    /// Every bucket label, in order. No parameters.
    pub known: Sql,
    /// The pending rows whose label is none of the known ones, as (id,
    /// partition_key, message_key) by id, locked where the database locks
    /// rows: a template whose `{gaps}` becomes the ranges of the pending
    /// index between the known labels (literals). No parameters.
    pub strays: Sql,
    /// A bucket's pending rows up to an id, by id, as
    /// [`MessageSummary`](super::outbox::MessageSummary) rows: bucket, id.
    pub pending_up_to: Sql,
    /// Records the listed rows published, those still pending: ids.
    pub record_stored: Sql,
    /// Deletes the listed rows, those still pending, for
    /// `outbox.keep_published = false`: ids.
    pub delete_stored: Sql,
}

/// [`RepartitionSql::pending_up_to`] with `?` parameters, reading through
/// `pending` (a [`Dialect::pending`]).
pub(crate) fn pending_up_to(pending: &str) -> String {
    format!(
        "SELECT {SUMMARY_COLUMNS} FROM {pending}
         WHERE o.partition_key = ? AND o.published_at IS NULL AND o.failed_at IS NULL
           AND o.id <= ?
         ORDER BY o.id"
    )
}

/// A drainer's statements on the `outbox` table and its bucket's row
/// (`store::drain`), rendered by each backend. The fence every write
/// carries — the bucket's claim is the caller's token and, in fleet mode,
/// its lease — is written out in each as *held*: bucket, token, owner,
/// owner, epoch (owner and epoch NULL without leasing).
#[derive(Debug)]
pub struct DrainSql {
    /// Enqueues one message: message_key, exchange, routing_key, payload,
    /// headers (JSON), content_type. Returns the new id as one row, unless
    /// the driver reads it from the insert (`Binding::INSERT_RETURNS_ID`).
    pub enqueue: Sql,
    pub claim: ClaimSql,
    /// Records a batch as published, the rows kept (`published_at` set):
    /// ids, bucket, then held.
    pub record_published: Sql,
    /// The same, the rows deleted: ids, bucket, then held.
    pub delete_published: Sql,
    /// A failed attempt at one row: `attempts + 1`, `last_error`,
    /// `available_at` pushed back by the backoff (the initial delay doubled
    /// per earlier attempt, capped), parked when `may_park` and the
    /// attempts reach `max_attempts` (0: never): backoff max (ms), backoff
    /// initial (ms), may_park, max_attempts, max_attempts, error, id,
    /// bucket, then held. Returns whether the row is parked now, as one
    /// row, unless `parked` is there to read it.
    pub record_failure: Sql,
    /// Where an `UPDATE` cannot return its row (MySQL/MariaDB): whether the
    /// row is parked, read after `record_failure` in its transaction: id.
    pub parked: Option<Sql>,
    /// Takes the purge lock for the transaction, where the delete does not
    /// take it itself: one row when this worker may purge, none when
    /// another is purging. No parameters.
    pub purge_lock: Option<Sql>,
    /// Deletes the oldest published rows: older than, limit.
    pub purge: Sql,
    /// What the database does after a purge (statistics, space), run
    /// unprepared, perhaps several statements. No parameters.
    pub tidy: Sql,
}

/// The plain `INSERT` every producer may use where the table's trigger
/// computes the bucket label (MySQL/MariaDB, SQLite): the message id and
/// the timestamps are the columns' defaults (`DrainSql::enqueue`).
pub(crate) fn plain_enqueue(t: &Tables) -> Sql {
    Sql::render(
        t,
        "INSERT INTO {outbox} (message_key, exchange, routing_key, payload, headers, content_type)
         VALUES (?, ?, ?, ?, ?, ?)",
    )
}

/// How a claim is made: a read of the bucket's first rows that also says
/// whether the caller holds the claim (all a held claim costs), and a
/// write that takes (or renews) it.
#[derive(Debug)]
pub struct ClaimSql {
    /// The bucket's first unpublished, unparked rows in id order, skipping
    /// the in-flight ones, as `ClaimedMessage`'s columns followed by
    /// `not_ready` and `held` (the caller's token holds the claim with at
    /// least min_left left, and in fleet mode under its valid lease), in
    /// that order: they are decoded by position (`store::rows`). The
    /// parameters: token, min_left, owner, owner, epoch, bucket, bucket,
    /// the highest in-flight id (`i64::MIN` when none: a row above it
    /// needs no look at the list), in-flight ids, limit.
    pub read: Sql,
    pub take: TakeSql,
}

/// The write that takes (or renews) the bucket's claim, only if no other
/// live claim holds it and (fleet mode) the lease is the caller's and
/// valid; a claim lasting longer than the TTL was made by no worker and is
/// ignored.
#[derive(Debug)]
pub enum TakeSql {
    /// Where the database can read and write in one statement
    /// (PostgreSQL's data-modifying `WITH`): the claim taken only if the
    /// bucket has ready rows, and those rows returned under it as
    /// `ClaimedMessage`'s columns, in that order, by id: bucket, limit,
    /// token, claim TTL, owner, epoch, in-flight ids, the highest
    /// in-flight id (`i64::MIN` when none).
    Returning(Sql),
    /// The write alone, the rows read again after it: token, TTL, bucket,
    /// token, TTL, owner, owner, epoch.
    ThenRead(Sql),
}

/// The columns of a [`MessageSummary`](super::outbox::MessageSummary), from the outbox aliased `o`.
pub(crate) const SUMMARY_COLUMNS: &str =
    "o.id, o.partition_key, o.message_key, o.exchange, o.routing_key, o.message_id,
    o.created_at, o.available_at, o.published_at, o.failed_at, o.attempts, o.last_error,
    LENGTH(o.payload) AS payload_bytes";

/// How a backend reads the outbox through an index: `FROM` texts naming
/// the table as `o`, as templates (`{outbox}`).
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    /// Through the index of unpublished, unparked rows by bucket and id.
    pub pending: &'static str,
    /// Through an index holding the parked rows by bucket.
    pub parked: &'static str,
}

impl Dialect {
    /// `column` of the head of bucket `p.partition_key` (its oldest
    /// unpublished, unparked row): one probe of the pending index, as a
    /// template (`{outbox}`).
    pub(crate) fn head(&self, column: &str) -> String {
        format!(
            "(SELECT o.{column} FROM {} WHERE o.partition_key = p.partition_key
                AND o.published_at IS NULL AND o.failed_at IS NULL ORDER BY o.id LIMIT 1)",
            self.pending
        )
    }
}

/// The statements of `MessageViews::list_messages` (`store::views`). Parameters: the
/// key (in the `_key` statements), the cursor (the last id of the previous
/// page: pending pages go up, the others down), the limit.
#[derive(Debug)]
pub struct MessagesSql {
    pub pending: PendingPage,
    pub pending_key: Sql,
    pub published: Sql,
    pub published_key: Sql,
    pub failed: Sql,
    pub failed_key: Sql,
    /// A time limit the database itself enforces on the one page that may
    /// read the whole table (published rows of one key, without the index
    /// of the book's *Searching published messages by key*): a statement
    /// run first in the page's transaction, and the limit it sets. `None`:
    /// only `database.query_timeout` bounds it.
    pub published_key_limit: Option<(Sql, Duration)>,
}

/// How the pending rows of every bucket are paged, oldest first: a merge
/// of per-bucket range scans of the pending index (bounded by buckets ×
/// limit rows whatever the table size).
#[derive(Debug)]
pub enum PendingPage {
    /// One statement that joins every bucket's scan (`LATERAL`): cursor,
    /// limit.
    OneStatement(Sql),
    /// Where the database has no `LATERAL`: a `UNION ALL` of one scan per
    /// bucket, written per page with the buckets' labels, cursor and
    /// limit as literals, through the dialect's pending index.
    PerBucket(Dialect),
}

impl MessagesSql {
    /// The statements in SQL that MySQL/MariaDB and SQLite both take, the
    /// outbox read through `dialect`'s indexes.
    pub(crate) fn common(t: &Tables, dialect: Dialect) -> Self {
        let newest_first = |state: &str, key: &str| {
            Sql::render(
                t,
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
                     WHERE {key}{state} AND o.id < ? ORDER BY o.id DESC LIMIT ?"
                ),
            )
        };
        let by_key = "o.message_key = ? AND ";
        Self {
            pending: PendingPage::PerBucket(dialect),
            pending_key: Sql::render(
                t,
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
                     WHERE {by_key}o.published_at IS NULL AND o.failed_at IS NULL AND o.id > ?
                     ORDER BY o.id LIMIT ?"
                ),
            ),
            published: newest_first("o.published_at IS NOT NULL", ""),
            published_key: newest_first("o.published_at IS NOT NULL", by_key),
            failed: newest_first("o.failed_at IS NOT NULL", ""),
            failed_key: newest_first("o.failed_at IS NOT NULL", by_key),
            published_key_limit: None,
        }
    }
}

/// The schema's statements (`store::migrate`), rendered by each backend.
#[derive(Debug)]
pub struct SchemaSql {
    /// Whether the migrations table exists, as one count: its name.
    pub has_migrations: Sql,
    /// The versions of the migrations applied, ascending. No parameters.
    pub applied: Sql,
    /// Records the bucket count, unless one is recorded: count.
    pub record_count: Sql,
    /// The recorded bucket count, one row or none. No parameters.
    pub count: Sql,
    /// Inserts a row for every listed bucket that has none: labels.
    pub ensure_rows: Sql,
}

impl SchemaSql {
    /// The statements every backend writes alike, around its own
    /// `has_migrations`, `record_count` and `ensure_rows`.
    pub(crate) fn new(
        t: &Tables,
        has_migrations: Sql,
        record_count: &str,
        ensure_rows: Sql,
    ) -> Self {
        Self {
            has_migrations,
            applied: Sql::render(
                t,
                "SELECT version FROM {outbox}_schema_migrations WHERE success ORDER BY version",
            ),
            record_count: Sql::render(t, record_count),
            count: Sql::render(t, "SELECT partition_count FROM {outbox}_settings"),
            ensure_rows,
        }
    }
}

/// Every statement set of the contract, as one backend renders them for
/// its table names.
#[derive(Debug)]
pub struct Rendered {
    /// The table names they were rendered with.
    pub tables: Tables,
    /// The backend's migrations, embedded at build time (rendered when
    /// they run).
    pub migrations: &'static sqlx::migrate::Migrator,
    pub schema: SchemaSql,
    pub drain: DrainSql,
    pub messages: MessagesSql,
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
