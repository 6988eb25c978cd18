//! Operator commands for terminals and scripts: `outboxd status` (the
//! dashboard's summary as text or JSON), `outboxd failed` (list, requeue
//! and drop parked messages; every change is audited), retention
//! (`outboxd purge`, and the workers' periodic maintenance) and
//! `outboxd repartition`.

use std::time::Duration;

use clap::{Args, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::coordinator::housekeeping::Housekeeping;
use crate::dashboard::api::{Summary, load_summary};
use crate::logs::Visible;
use crate::partitioner::Partitioner;
use crate::store::outbox::Published;
use crate::store::repartition::RepartitionError;
use crate::store::workers::WorkerView;
use crate::store::{HeadAction, Store, schema};

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Print the summary as JSON (the dashboard's api/summary)
    #[arg(long)]
    pub json: bool,
    /// Every configured source, one after the other
    #[arg(long)]
    pub all_sources: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub enum FailedCommand {
    /// List parked messages, newest first (or a bucket's, oldest first)
    List {
        #[arg(long, value_name = "BUCKET")]
        bucket: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Requeue parked messages: they become the head of their bucket again
    #[command(group = clap::ArgGroup::new("which").required(true).multiple(true).args(["ids", "bucket", "all"]))]
    Requeue {
        /// Message ids
        ids: Vec<i64>,
        /// Every parked message of this bucket
        #[arg(long, value_name = "BUCKET", conflicts_with = "all")]
        bucket: Option<String>,
        /// Every parked message
        #[arg(long)]
        all: bool,
    },
    /// Park blocked heads: the rest of their buckets goes on without them
    /// (recorded in the audit table); then requeue or drop them
    Park {
        /// Message ids (a blocked bucket's head: `outboxd failed list`)
        #[arg(required = true)]
        ids: Vec<i64>,
        /// Why, for the audit record
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Retry blocked heads now instead of at their retry time (recorded in
    /// the audit table)
    Retry {
        /// Message ids (a blocked bucket's head: `outboxd failed list`)
        #[arg(required = true)]
        ids: Vec<i64>,
    },
    /// Delete parked messages or blocked heads for good (recorded in the
    /// audit table)
    Drop {
        /// Message ids
        #[arg(required = true)]
        ids: Vec<i64>,
        /// Confirm: dropped messages are never published
        #[arg(long)]
        yes: bool,
        /// Why, for the audit record
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Debug, Clone, Args)]
pub struct PurgeArgs {
    /// Delete published rows older than this, e.g. 7d, 12h
    #[arg(long, value_name = "DURATION", value_parser = crate::config::parse_duration)]
    pub older_than: Duration,
    /// Only count what would be deleted
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RepartitionArgs {
    /// The new bucket count (1–1024)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub to: u32,
    /// Only count the rows that would be re-labelled; change nothing
    #[arg(long)]
    pub dry_run: bool,
}

/// Rows per purge statement: small enough that no transaction is long and
/// no producer or relay waits behind it.
pub const PURGE_BATCH: i64 = 5_000;
/// How often a worker purges.
pub const PURGE_EVERY: Duration = Duration::from_secs(300);

/// Deletes published rows older than `older_than`, batch after batch, until
/// none is left or another process holds the purge lock; then, when it
/// deleted at least [`VACUUM_AFTER`] rows, vacuums the outbox table. Returns
/// how many rows it deleted.
pub async fn purge_published(
    store: &Store,
    older_than: Duration,
) -> Result<u64, crate::store::StoreError> {
    let mut total = 0;
    loop {
        let n = store.purge_batch(older_than, PURGE_BATCH).await?;
        total += n;
        if n < PURGE_BATCH as u64 {
            break;
        }
    }
    if total >= VACUUM_AFTER {
        vacuum(store).await;
    }
    Ok(total)
}

/// Rows deleted by one purge after which it vacuums the table itself.
pub const VACUUM_AFTER: u64 = 50_000;

/// Tidies the outbox table after a large purge (PostgreSQL: `VACUUM
/// (ANALYZE)`, see [`crate::store::OutboxStore::tidy_after_purge`]).
/// Autovacuum gets there on its own schedule; this does it when the purge
/// made the mess. Failure (e.g. the role does not own the table) is logged,
/// not fatal.
async fn vacuum(store: &Store) {
    let started = std::time::Instant::now();
    match store.tidy_after_purge().await {
        Ok(()) => {
            tracing::info!(took = ?started.elapsed(), "tidied the outbox table after purging")
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not tidy the outbox table after purging; the database will do it later")
        }
    }
}

/// How often a worker checks for rows in unknown buckets and for a changed
/// bucket count.
pub const MAINTENANCE_EVERY: Duration = Duration::from_secs(30);

/// A worker's housekeeping task, until `cancel` fires:
///
/// - at start and every [`MAINTENANCE_EVERY`], checks that the database's
///   bucket count is still `partition_count` and, while this worker keeps
///   the fleet's house ([`Housekeeping`]), parks pending rows whose bucket
///   label does not exist here (see
///   [`park_unknown_labels`](crate::store::RepartitionStore::park_unknown_labels));
/// - with a `retention`, purges published rows older than it every
///   [`PURGE_EVERY`].
///
/// Returns an error, after cancelling `stop_worker`, when the database was
/// repartitioned under the running worker: draining on with the old count
/// would break per-key order.
pub async fn maintenance_loop(
    store: Store,
    partition_count: u32,
    retention: Option<Duration>,
    housekeeping: Housekeeping,
    cancel: CancellationToken,
    stop_worker: CancellationToken,
) -> Result<(), crate::store::StoreError> {
    let mut ticks = tokio::time::interval(MAINTENANCE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut purged_at = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = ticks.tick() => {}
        }
        match store.partition_count().await {
            Ok(Some(n)) if n != partition_count => {
                let e = schema::partition_count_mismatch(n, partition_count);
                tracing::error!(error = %e, "the database was repartitioned; stopping this worker");
                stop_worker.cancel();
                return Err(e);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "reading partition_count failed"),
        }
        if housekeeping.is_mine() {
            park_unknown(&store).await;
        }
        if let Some(retention) = retention
            && purged_at.elapsed() >= PURGE_EVERY
        {
            purged_at = tokio::time::Instant::now();
            match purge_published(&store, retention).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, "purged published rows past retention"),
                Err(e) => {
                    tracing::warn!(error = %e, "purging published rows failed; retrying next round")
                }
            }
        }
    }
}

/// Parks pending rows in buckets that do not exist here, and says so.
async fn park_unknown(store: &Store) {
    match store.park_unknown_labels().await {
        Ok(parked) if !parked.is_empty() => {
            let mut labels: Vec<&str> = parked.iter().map(|r| r.partition_key.as_str()).collect();
            labels.sort_unstable();
            labels.dedup();
            tracing::warn!(
                rows = parked.len(),
                ?labels,
                "parked rows whose bucket label does not exist in this deployment (see `outboxd failed list`)"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "looking for rows in unknown buckets failed"),
    }
}

pub async fn purge(config: &Config, args: &PurgeArgs) -> anyhow::Result<()> {
    let (store, _) = open(config, "outboxd purge").await?;
    if args.dry_run {
        let n = store.count_purgeable(args.older_than).await?;
        say!(
            "would delete {n} published row(s) older than {}",
            crate::config::fmt_duration(args.older_than)
        );
    } else {
        let n = purge_published(&store, args.older_than).await?;
        say!(
            "deleted {n} published row(s) older than {}",
            crate::config::fmt_duration(args.older_than)
        );
    }
    Ok(())
}

/// `outboxd repartition --to N`: see [`crate::store::repartition`]. The
/// configured count does not matter here (it is usually already the new
/// one); the schema version does. With `amqp.streams`, the pending rows
/// the streams already hold under the recorded count's producer names are
/// found first ([`crate::stream::repartition`]) and recorded published by
/// the change. `config` is scoped to one source, kept as its entry when
/// it has one: the producers are named after the source.
pub async fn repartition(config: &Config, args: &RepartitionArgs) -> anyhow::Result<()> {
    let source = config.sources()?.into_iter().next();
    let (source, config) = match &source {
        Some(s) => (s.name.as_str(), &s.config),
        None => (crate::config::sources::DEFAULT_SOURCE, config),
    };
    let store = Store::connect(
        &crate::store::StoreSettings::from_config(config),
        "outboxd repartition",
    )
    .await?;
    schema::check_version(&*store).await?;
    let stored = match store.partition_count().await? {
        Some(from) if !config.amqp.streams.is_empty() => {
            // Refused before the streams are read (the repartition's
            // transaction checks again): a live fleet is the usual reason
            // to be turned away, and needs no stream port to be told.
            let live = store.live_others(uuid::Uuid::nil()).await?;
            if !live.is_empty() {
                return Err(RepartitionError::WorkersLive(live).into());
            }
            crate::stream::repartition::stored_pending(config, source, &store, from).await?
        }
        _ => Vec::new(),
    };
    let r = store
        .repartition(
            args.to,
            args.dry_run,
            &actor(),
            &stored,
            Published::from_keep(config.outbox.keep_published),
        )
        .await?;
    let in_streams = match config.amqp.streams.is_empty() {
        true => String::new(),
        false if args.dry_run => format!(
            "; {} pending row(s) the streams already hold would be recorded published",
            r.recorded_stored
        ),
        false => format!(
            "; {} pending row(s) the streams already hold recorded published",
            r.recorded_stored
        ),
    };
    if args.dry_run {
        say!(
            "dry run: {} → {} buckets would re-label {} of {} unpublished row(s){in_streams}; nothing changed",
            r.from,
            r.to,
            r.relabelled,
            r.unpublished
        );
        return Ok(());
    }
    say!(
        "repartitioned {} → {} buckets: {} of {} unpublished row(s) re-labelled, every lease cleared{in_streams}",
        r.from,
        r.to,
        r.relabelled,
        r.unpublished
    );
    if config.outbox.partition_count != r.to {
        say!(
            "now set outbox.partition_count = {} in every worker's configuration before starting them",
            r.to
        );
    }
    Ok(())
}

async fn open(config: &Config, name: &str) -> anyhow::Result<(Store, Partitioner)> {
    let partitioner = Partitioner::new(config.outbox.partition_count);
    let store = Store::connect(&crate::store::StoreSettings::from_config(config), name).await?;
    schema::check(&*store, partitioner).await?;
    Ok((store, partitioner))
}

/// Who runs the command, for audit records.
fn actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("cli {user}@{}", host.trim())
}

pub async fn status(config: &Config, args: &StatusArgs) -> anyhow::Result<()> {
    let s = summary(config).await?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print_status(&s);
    }
    Ok(())
}

/// What `outboxd status` shows of one source.
pub async fn summary(config: &Config) -> anyhow::Result<Summary> {
    let (store, p) = open(config, "outboxd status").await?;
    Ok(load_summary(&store, p.count()).await?)
}

fn short(id: Option<uuid::Uuid>) -> String {
    id.map_or("-".into(), |u| u.to_string()[..8].to_string())
}

/// A bucket owner by its name, or its id's prefix if its row is gone.
fn owner_name(workers: &[WorkerView], owner: Option<uuid::Uuid>) -> String {
    match workers.iter().find(|w| Some(w.worker_id) == owner) {
        Some(w) => w.name.clone(),
        None => short(owner),
    }
}

fn print_status(s: &Summary) {
    let t = &s.totals;
    say!(
        "workers {} live | buckets {}/{} owned | pending {}{} | parked {} | blocked {} | oldest pending {:.1}s | published last hour {}",
        t.workers_live,
        t.buckets_owned,
        t.buckets,
        t.pending,
        if t.pending_capped { "+" } else { "" },
        t.parked,
        t.blocked_buckets,
        t.max_lag_seconds,
        s.throughput.published_last_hour
    );
    if s.workers.is_empty() {
        say!("\nno workers: none has registered (start one with `outboxd work`)");
    } else {
        say!(
            "\n{:<24} {:<10} {:<10} {:<18} {:>9} {:>8} {:>9} {:>11}",
            "WORKER",
            "ID",
            "MODE",
            "STATE",
            "HB TTL",
            "BUCKETS",
            "RATE/S",
            "PUBLISHED"
        );
        for w in &s.workers {
            say!(
                "{:<24} {:<10} {:<10} {:<18} {:>9} {:>8} {:>9.1} {:>11}",
                w.name,
                short(Some(w.worker_id)),
                w.mode,
                w.state,
                if w.live {
                    format!("{:.1}s", w.heartbeat_ttl_seconds)
                } else {
                    "gone".into()
                },
                w.buckets,
                w.published_rate,
                w.published_total
            );
        }
    }
    for w in s.workers.iter().filter(|w| w.live) {
        match (w.can_publish, &w.broker_error, &w.broker_blocked) {
            (false, Some(error), _) => say!(
                "worker {} cannot reach RabbitMQ and holds no buckets: {error}",
                w.name,
            ),
            (true, _, Some(reason)) => say!(
                "worker {}: RabbitMQ blocks its connection (a resource alarm), nothing is claimed until it lifts: {reason}",
                w.name,
            ),
            _ => {}
        }
    }
    if !s.destinations.is_empty() {
        say!(
            "\n{:<32} {:<6} {:<8} {:>9} {:>11} {:>9} {:>7}",
            "DESTINATION",
            "SINK",
            "KIND",
            "RATE/S",
            "DELIVERED",
            "IN STREAM",
            "LATE"
        );
        for d in &s.destinations {
            let stream_only = |n: u64| {
                if d.sink == "stream" {
                    n.to_string()
                } else {
                    "-".into()
                }
            };
            say!(
                "{:<32} {:<6} {:<8} {:>9.1} {:>11} {:>9} {:>7}",
                d.name,
                d.sink,
                d.kind.as_str(),
                d.rate,
                d.delivered,
                stream_only(d.already_stored),
                stream_only(d.late)
            );
        }
    }
    say!(
        "\n{:<7} {:<24} {:>6} {:>9} {:>9} {:>9} {:>7}  STATUS",
        "BUCKET",
        "OWNER",
        "EPOCH",
        "LEASE",
        "PENDING",
        "LAG",
        "PARKED"
    );
    for b in &s.partitions {
        let owned = b.lease_owner.is_some() && b.lease_ttl_seconds.is_some_and(|t| t > 0.0);
        // The shared words (dashboard::states); a blocked head named.
        let status = match (&b.head_error, b.head_id) {
            (Some(e), Some(id)) => format!("{} at #{id}: {e}", b.state.to_uppercase()),
            (Some(e), None) => format!("{}: {e}", b.state.to_uppercase()),
            (None, _) if b.state == "publishing" => format!("publishing {:.1}/s", b.rate),
            (None, _) => b.state.clone(),
        };
        say!(
            "{:<7} {:<24} {:>6} {:>9} {:>9} {:>9} {:>7}  {}",
            b.partition_key,
            owner_name(&s.workers, b.lease_owner),
            b.lease_epoch,
            if owned {
                format!("{:.1}s", b.lease_ttl_seconds.unwrap_or(0.0))
            } else {
                "-".into()
            },
            format!("{}{}", b.pending, if b.pending_capped { "+" } else { "" }),
            if b.head_id.is_some() {
                format!("{:.1}s", b.lag_seconds)
            } else {
                "-".into()
            },
            b.parked,
            status
        );
    }
}

pub async fn failed(config: &Config, cmd: &FailedCommand) -> anyhow::Result<()> {
    let (store, p) = open(config, "outboxd failed").await?;
    match cmd {
        FailedCommand::List {
            bucket,
            limit,
            json,
        } => {
            let rows = match bucket {
                Some(b) => {
                    anyhow::ensure!(
                        p.parse_label(b).is_some(),
                        "'{b}' is not a bucket of this deployment (p00…)"
                    );
                    store.parked_in_bucket(b, *limit).await?
                }
                None => {
                    store
                        .list_messages(
                            crate::store::outbox::MessageState::Failed,
                            None,
                            None,
                            *limit,
                        )
                        .await?
                }
            };
            if *json {
                say!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                say!(
                    "{:>10} {:<7} {:<24} {:>8}  LAST ERROR",
                    "ID",
                    "BUCKET",
                    "KEY",
                    "ATTEMPTS"
                );
                for m in &rows {
                    say!(
                        "{:>10} {:<7} {:<24} {:>8}  {}",
                        m.id,
                        m.partition_key,
                        // A key or an error is user data: nothing in it may
                        // move the terminal's cursor or hide text.
                        Visible(&m.message_key).to_string(),
                        m.attempts,
                        Visible(m.last_error.as_deref().unwrap_or(""))
                    );
                }
                say!("{} parked message(s)", rows.len());
                let summary = load_summary(&store, p.count()).await?;
                let blocked: Vec<_> = summary
                    .partitions
                    .iter()
                    .filter(|b| {
                        b.head_error.is_some()
                            && bucket.as_ref().is_none_or(|x| *x == b.partition_key)
                    })
                    .collect();
                if !blocked.is_empty() {
                    say!(
                        "\n{:>10} {:<7} {:>8}  BLOCKED HEAD: ITS ERROR (outboxd failed park|retry|drop ID)",
                        "ID",
                        "BUCKET",
                        "ATTEMPTS"
                    );
                    for b in blocked {
                        say!(
                            "{:>10} {:<7} {:>8}  {}",
                            b.head_id.map_or("-".into(), |id| id.to_string()),
                            b.partition_key,
                            b.head_attempts.unwrap_or(0),
                            b.head_error.as_deref().unwrap_or("")
                        );
                    }
                }
            }
        }
        FailedCommand::Requeue { ids, bucket, all } => {
            let buckets: Vec<String> = match bucket {
                Some(b) => {
                    anyhow::ensure!(
                        p.parse_label(b).is_some(),
                        "'{b}' is not a bucket of this deployment (p00…)"
                    );
                    vec![b.clone()]
                }
                None => Vec::new(),
            };
            anyhow::ensure!(
                !ids.is_empty() || !buckets.is_empty() || *all,
                "give message ids, --bucket B or --all"
            );
            let done = store.requeue(ids, &buckets, *all, &actor()).await?;
            say!("requeued {} message(s): {:?}", done.len(), done);
            not_all_done(ids, &done, "requeued (not parked, or no such id)")?;
        }
        FailedCommand::Park { ids, reason } => {
            let done = store
                .act_on_heads(ids, HeadAction::Park, &actor(), reason)
                .await?;
            say!("parked {} message(s): {:?}", done.len(), done);
            not_all_done(ids, &done, NOT_A_BLOCKED_HEAD)?;
        }
        FailedCommand::Retry { ids } => {
            let done = store
                .act_on_heads(ids, HeadAction::Retry, &actor(), "")
                .await?;
            say!("retrying {} message(s) now: {:?}", done.len(), done);
            not_all_done(ids, &done, NOT_A_BLOCKED_HEAD)?;
        }
        FailedCommand::Drop { ids, yes, reason } => {
            if !yes {
                complain!(
                    "outboxd: dropping deletes messages that will never be published; add --yes to confirm"
                );
                std::process::exit(2);
            }
            let done = store.drop_parked(ids, &actor(), reason).await?;
            say!("dropped {} message(s): {:?}", done.len(), done);
            not_all_done(
                ids,
                &done,
                "dropped (neither parked nor a blocked head waiting for its retry, or no such id)",
            )?;
        }
    }
    Ok(())
}

/// Why `failed park` or `failed retry` left a row alone.
const NOT_A_BLOCKED_HEAD: &str = "changed (not a blocked head waiting for its retry: \
     a pending row that never failed, one being retried right now, a parked or published \
     row, or no such id)";

/// An error naming the listed ids an action left alone, if any: an
/// operator's command that did not do all it was asked fails.
fn not_all_done(asked: &[i64], done: &[i64], not: &str) -> anyhow::Result<()> {
    let left: Vec<i64> = asked
        .iter()
        .filter(|i| !done.contains(i))
        .copied()
        .collect();
    anyhow::ensure!(left.is_empty(), "not {not}: {left:?}");
    Ok(())
}
