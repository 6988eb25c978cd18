//! The dashboard's multi-bucket views — a page of messages across buckets
//! and the bucket overview — written once for the backends that build them
//! from several plain statements (MySQL/MariaDB and SQLite; PostgreSQL has
//! one statement for each). A backend gives only its [`Dialect`]: how the
//! outbox is read through an index.
//!
//! Both views cost a bounded amount of work whatever the table size: one
//! range scan of an index per bucket, each with a `LIMIT`.

use super::driver::{Arg, Driver, Statements};
use super::outbox::{MessageState, MessageSummary};
use super::partitions::BucketView;
use super::{Sql, StoreError, label_literal, render};
use crate::config::TablesConfig;

/// The columns of a [`MessageSummary`], from the outbox aliased `o`.
pub(crate) const SUMMARY_COLUMNS: &str =
    "o.id, o.partition_key, o.message_key, o.exchange, o.routing_key, o.message_id,
    o.created_at, o.available_at, o.published_at, o.failed_at, o.attempts, o.last_error,
    LENGTH(o.payload) AS payload_bytes";

/// How a backend reads the outbox through an index: `FROM` texts naming
/// the table as `o`, as templates (`{outbox}`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialect {
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

/// A page of messages in `state` (see `OutboxStore::list_messages`).
pub(crate) async fn list_messages<D: Driver>(
    d: &D,
    t: &TablesConfig,
    dialect: Dialect,
    state: MessageState,
    message_key: Option<&str>,
    cursor: Option<i64>,
    limit: i64,
) -> Result<Vec<MessageSummary>, StoreError> {
    let key = if message_key.is_some() {
        "o.message_key = ? AND "
    } else {
        ""
    };
    let sql = match state {
        // Oldest first, across buckets: a merge of per-bucket range scans
        // of the pending index (bounded by buckets × limit rows).
        MessageState::Pending if message_key.is_none() => {
            let parts: Vec<String> = bucket_literals(d, t)
                .await?
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    format!(
                        "SELECT * FROM (SELECT {SUMMARY_COLUMNS} FROM {pending}
                          WHERE o.partition_key = {l} AND o.published_at IS NULL
                            AND o.failed_at IS NULL AND o.id > {cursor}
                          ORDER BY o.id LIMIT {limit}) AS b{i}",
                        pending = dialect.pending,
                        cursor = cursor.unwrap_or(0),
                    )
                })
                .collect();
            if parts.is_empty() {
                return Ok(Vec::new());
            }
            format!(
                "SELECT * FROM ({}) AS m ORDER BY m.id LIMIT {limit}",
                parts.join(" UNION ALL ")
            )
        }
        MessageState::Pending => format!(
            "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
             WHERE {key}o.published_at IS NULL AND o.failed_at IS NULL AND o.id > {}
             ORDER BY o.id LIMIT {limit}",
            cursor.unwrap_or(0)
        ),
        MessageState::Published | MessageState::Failed => {
            let predicate = if state == MessageState::Published {
                "o.published_at IS NOT NULL"
            } else {
                "o.failed_at IS NOT NULL"
            };
            format!(
                "SELECT {SUMMARY_COLUMNS} FROM {{outbox}} o
                 WHERE {key}{predicate} AND o.id < {}
                 ORDER BY o.id DESC LIMIT {limit}",
                cursor.unwrap_or(i64::MAX)
            )
        }
    };
    // Cursor and limit are numbers, spliced as literals.
    let args: Vec<Arg> = message_key
        .map(|k| Arg::Text(Some(k)))
        .into_iter()
        .collect();
    let sql = Sql::from_rendered(render(t, &sql));
    d.reads().fetch_all(&sql, &args, "listing messages").await
}

/// Every bucket's label as an SQL literal, in label order.
async fn bucket_literals<D: Driver>(d: &D, t: &TablesConfig) -> Result<Vec<String>, StoreError> {
    let sql = Sql::render(
        t,
        "SELECT partition_key FROM {partitions} ORDER BY partition_key",
    );
    let labels: Vec<(String,)> = d.reads().fetch_all(&sql, &[], "listing buckets").await?;
    Ok(labels.iter().filter_map(|(l,)| label_literal(l)).collect())
}

/// A bucket's lease and head, before the counts are added: what a
/// backend's `lines` statement of [`overview`] returns, one row per bucket.
#[derive(sqlx::FromRow)]
pub(crate) struct LeaseLine {
    partition_key: String,
    lease_owner: Option<uuid::Uuid>,
    lease_epoch: i64,
    lease_ttl_seconds: Option<f64>,
    head_id: Option<i64>,
    lag_seconds: f64,
    head_attempts: Option<i32>,
    head_error: Option<String>,
    head_retry_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The bucket overview: `lines` (the backend's statement for every
/// bucket's lease and head, as [`LeaseLine`]s), then one statement counting
/// each bucket's pending and parked rows, every count capped at `cap`
/// (a `LIMIT` inside), so the cost is buckets × cap whatever the table
/// size.
pub(crate) async fn overview<D: Driver>(
    d: &D,
    t: &TablesConfig,
    dialect: Dialect,
    lines: &Sql,
    cap: i64,
) -> Result<Vec<BucketView>, StoreError> {
    let doing = "reading the bucket overview";
    let rows: Vec<LeaseLine> = d.reads().fetch_all(lines, &[], doing).await?;
    let counts: Vec<String> = rows
        .iter()
        .filter_map(|r| label_literal(&r.partition_key))
        .enumerate()
        .map(|(i, l)| {
            format!(
                "SELECT {l} AS partition_key,
                    (SELECT COUNT(*) FROM (SELECT 1 FROM {pending}
                       WHERE o.partition_key = {l} AND o.published_at IS NULL
                         AND o.failed_at IS NULL LIMIT {cap}) AS x{i}) AS pending,
                    (SELECT COUNT(*) FROM (SELECT 1 FROM {parked}
                       WHERE o.partition_key = {l} AND o.published_at IS NULL
                         AND o.failed_at IS NOT NULL LIMIT {cap}) AS y{i}) AS parked",
                pending = dialect.pending,
                parked = dialect.parked,
            )
        })
        .collect();
    let counts: Vec<(String, i64, i64)> = if counts.is_empty() {
        Vec::new()
    } else {
        let sql = Sql::from_rendered(render(t, &counts.join(" UNION ALL ")));
        d.reads()
            .fetch_all(&sql, &[], "counting pending rows")
            .await?
    };
    Ok(rows
        .into_iter()
        .map(|r| {
            let (pending, parked) = counts
                .iter()
                .find(|c| c.0 == r.partition_key)
                .map_or((0, 0), |c| (c.1, c.2));
            BucketView {
                partition_key: r.partition_key,
                lease_owner: r.lease_owner,
                lease_epoch: r.lease_epoch,
                lease_ttl_seconds: r.lease_ttl_seconds,
                pending,
                pending_capped: pending >= cap,
                parked,
                head_id: r.head_id,
                lag_seconds: r.lag_seconds,
                head_attempts: r.head_attempts,
                head_error: r.head_error,
                head_retry_at: r.head_retry_at,
                rate: 0.0,
                state: String::new(),
            }
        })
        .collect())
}
