//! The dashboard's views of messages — a page of messages in one state
//! ([`MessageViews`], written once over the driver for every backend) and
//! the bucket overview (every bucket's lease and head, then its capped
//! counts), written once over the driver for every backend. A backend
//! gives its [`MessagesSql`](super::statements::MessagesSql) and its [`Dialect`]: how the outbox is read
//! through an index.
//!
//! Both views cost a bounded amount of work whatever the table size: one
//! range scan of an index per bucket, each with a `LIMIT`.

use std::time::Duration;

use async_trait::async_trait;

use super::bounds::bounded_op;
use super::driver::{Arg, Driver, Statements};
use super::error::StoreError;
use super::outbox::{MessageState, MessageSummary, MessageViews};
use super::partitions::{BucketView, LeaseLine};
use super::sql::{Sql, label_literal, render};
use super::statements::{Dialect, PendingPage, SUMMARY_COLUMNS};
use crate::store::settings::Tables;

const LISTING: &str = "listing messages";

#[async_trait]
impl<D: Driver> MessageViews for D {
    async fn list_messages(
        &self,
        state: MessageState,
        message_key: Option<&str>,
        cursor: Option<i64>,
        limit: i64,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let sql = &self.sql().messages;
        let (statement, default_cursor) = match (state, message_key.is_some()) {
            (MessageState::Pending, false) => match &sql.pending {
                PendingPage::OneStatement(statement) => (statement, 0),
                PendingPage::PerBucket(dialect) => {
                    let cursor = cursor.unwrap_or(0);
                    return pending_per_bucket(self, *dialect, cursor, limit).await;
                }
            },
            (MessageState::Pending, true) => (&sql.pending_key, 0),
            (MessageState::Published, false) => (&sql.published, i64::MAX),
            (MessageState::Published, true) => (&sql.published_key, i64::MAX),
            (MessageState::Failed, false) => (&sql.failed, i64::MAX),
            (MessageState::Failed, true) => (&sql.failed_key, i64::MAX),
        };
        let args: Vec<Arg> = message_key
            .map(|k| Arg::Text(Some(k)))
            .into_iter()
            .chain([Arg::Int(cursor.unwrap_or(default_cursor)), Arg::Int(limit)])
            .collect();
        match (&sql.published_key_limit, state, message_key) {
            (Some((limit, after)), MessageState::Published, Some(_)) => {
                published_of_key(self, statement, &args, limit, *after).await
            }
            _ => self.reads().fetch_all(statement, &args, LISTING).await,
        }
    }
}

/// What the Published view's search by key says when it fails.
const SEARCHING_PUBLISHED: &str = "searching published messages by key \
     (a scan of the table without the index of docs/operations.md, \"Searching published messages by key\")";

/// The Published view's search by key under the database's own time limit
/// (set by `limit` for its transaction only, so it holds behind a
/// transaction pooler too): the database stops it at `after` rather than
/// let it load the primary for as long as the table is large.
async fn published_of_key<D: Driver>(
    d: &D,
    statement: &Sql,
    args: &[Arg<'_>],
    limit: &Sql,
    after: Duration,
) -> Result<Vec<MessageSummary>, StoreError> {
    bounded_op(d.bounds(), SEARCHING_PUBLISHED, async {
        let mut tx = d.begin().await?;
        tx.execute(limit, &[], SEARCHING_PUBLISHED).await?;
        let rows = match tx.fetch_all(statement, args, SEARCHING_PUBLISHED).await {
            Ok(rows) => rows,
            Err(e) if e.is_cancelled() => {
                return Err(StoreError::Timeout {
                    doing: SEARCHING_PUBLISHED,
                    after,
                });
            }
            Err(e) => return Err(e),
        };
        D::commit(tx).await?;
        Ok(rows)
    })
    .await
}

/// The pending rows of every bucket after `cursor`, oldest first
/// ([`PendingPage::PerBucket`]).
async fn pending_per_bucket<D: Driver>(
    d: &D,
    dialect: Dialect,
    cursor: i64,
    limit: i64,
) -> Result<Vec<MessageSummary>, StoreError> {
    let t = d.tables();
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
            )
        })
        .collect();
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    // Cursor and limit are numbers, spliced as literals.
    let sql = format!(
        "SELECT * FROM ({}) AS m ORDER BY m.id LIMIT {limit}",
        parts.join(" UNION ALL ")
    );
    let sql = Sql::from_rendered(render(t, &sql));
    d.reads().fetch_all(&sql, &[], LISTING).await
}

/// Every bucket's label as an SQL literal, in label order.
async fn bucket_literals<D: Driver>(d: &D, t: &Tables) -> Result<Vec<String>, StoreError> {
    let sql = Sql::render(
        t,
        "SELECT partition_key FROM {partitions} ORDER BY partition_key",
    );
    let labels: Vec<(String,)> = d.reads().fetch_all(&sql, &[], "listing buckets").await?;
    Ok(labels.iter().filter_map(|(l,)| label_literal(l)).collect())
}

/// The bucket overview: `lines` (the backend's statement for every
/// bucket's lease and head, as [`LeaseLine`]s), then one statement counting
/// each bucket's pending and parked rows, every count capped at `cap`
/// (a `LIMIT` inside), so the cost is buckets × cap whatever the table
/// size.
pub(crate) async fn overview<D: Driver>(
    d: &D,
    t: &Tables,
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
