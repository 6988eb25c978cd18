//! A drainer's flows on the `outbox` table, written once over the driver
//! contract (`super::driver`) for every backend: enqueue, claim, the
//! records of a publish (kept or deleted rows, a failed attempt), and the
//! purge of published rows. What they promise is [`super::outbox`]'s; the
//! statements are each backend's [`DrainSql`].
//!
//! Two places where databases genuinely differ are named in the contract,
//! not decided here by backend:
//!
//! - a claim reads the bucket's ready prefix with whether the caller holds
//!   the claim, and takes (or renews) it only when not; the take returns
//!   the rows itself where the database can read and write in one
//!   statement ([`TakeSql::Returning`]), else the prefix is read again
//!   after it, so the batch is exactly what the claim covers
//!   ([`TakeSql::ThenRead`]); where the take returns the rows, a caller
//!   that does not believe it holds the claim skips the first read;
//! - an `UPDATE` that cannot return its row reads it after
//!   ([`DrainSql::parked`]), and an `INSERT` that cannot return its id
//!   leaves it to the driver ([`super::driver::Binding::INSERT_RETURNS_ID`]).

use std::time::Duration;

use async_trait::async_trait;

use super::bounds::{Bounds, bounded_op};
use super::driver::{Arg, Binding, Driver, Statements, insert};
use super::error::StoreError;
use super::outbox::{
    Claim, ClaimCandidate, ClaimedMessage, Failure, FailureRecord, Holder, Message, OutboxStore,
    Published,
};
use super::sql::Sql;
use super::statements::{ClaimSql, DrainSql, TakeSql};

/// The fence's arguments, as every drainer's write ends with them: bucket,
/// token, owner, owner, epoch.
fn held<'a>(h: &Holder<'a>) -> [Arg<'a>; 5] {
    let owner = h.fence.map(|f| f.owner);
    [
        Arg::Text(Some(h.partition_key)),
        Arg::Uuid(h.token.0),
        Arg::OptUuid(owner),
        Arg::OptUuid(owner),
        Arg::OptInt(h.fence.map(|f| f.epoch)),
    ]
}

/// The arguments of an enqueue, in [`DrainSql::enqueue`]'s order.
fn enqueue_args(m: &Message) -> [Arg<'_>; 6] {
    [
        Arg::Text(Some(&m.message_key)),
        Arg::Text(Some(&m.exchange)),
        Arg::Text(Some(&m.routing_key)),
        Arg::Bytes(&m.payload),
        Arg::Json(&m.headers),
        Arg::Text(m.content_type.as_deref()),
    ]
}

const ENQUEUEING: &str = "enqueueing a message";

/// Enqueues `m` with `sql` (a backend's [`DrainSql::enqueue`]) on `exec`,
/// any executor of the database — a transaction of the caller's, for the
/// producer; returns its id.
pub(crate) async fn enqueue<'e, DB: Binding, E: sqlx::Executor<'e, Database = DB>>(
    sql: &Sql,
    exec: E,
    bounds: &Bounds,
    m: &Message,
) -> Result<i64, StoreError> {
    insert(exec, bounds, sql, &enqueue_args(m), ENQUEUEING).await
}

const CLAIMING: &str = "claiming a batch";

/// The ready prefix of the rows [`ClaimSql::read`] returned (a head
/// waiting for its retry stops it), and whether the reader held the
/// claim.
fn ready_prefix(rows: Vec<ClaimCandidate>) -> (Vec<ClaimedMessage>, bool) {
    let held = rows.first().is_some_and(|r| r.held == Some(true));
    let ready = rows
        .into_iter()
        .take_while(|r| !r.not_ready)
        .map(|r| r.row)
        .collect();
    (ready, held)
}

async fn claim<D: Driver>(d: &D, c: Claim<'_>) -> Result<Vec<ClaimedMessage>, StoreError> {
    let h = &c.holder;
    let (owner, epoch) = (h.fence.map(|f| f.owner), h.fence.map(|f| f.epoch));
    let key = Arg::Text(Some(h.partition_key));
    let token = Arg::Uuid(h.token.0);
    let in_flight = Arg::Ids(c.in_flight);
    let highest = Arg::Int(c.in_flight.iter().copied().max().unwrap_or(i64::MIN));
    let ttl = Arg::Duration(c.claim_ttl);
    let limit = Arg::Int(i64::from(c.limit));
    let read_args = [
        token,
        Arg::Duration(c.min_left),
        Arg::OptUuid(owner),
        Arg::OptUuid(owner),
        Arg::OptInt(epoch),
        key,
        key,
        highest,
        in_flight,
        limit,
    ];
    let ClaimSql { read, take } = &d.sql().drain.claim;
    bounded_op(d.bounds(), CLAIMING, async {
        // A read first (no lock, no write): a bucket with nothing ready
        // costs the database no write, and a claim still held is not taken
        // again. Where the take returns the rows, a claim the caller does
        // not believe it holds goes straight to it.
        if c.held || matches!(take, TakeSql::ThenRead(_)) {
            let rows = d.reads().fetch_all(read, &read_args, CLAIMING).await?;
            let (ready, held) = ready_prefix(rows);
            if ready.is_empty() || (held && c.held) {
                return Ok(ready);
            }
        }
        match take {
            TakeSql::Returning(sql) => {
                let args = [
                    key,
                    limit,
                    token,
                    ttl,
                    Arg::OptUuid(owner),
                    Arg::OptInt(epoch),
                    in_flight,
                    highest,
                ];
                d.pool().fetch_all(sql, &args, CLAIMING).await
            }
            TakeSql::ThenRead(sql) => {
                let args = [
                    token,
                    ttl,
                    key,
                    token,
                    ttl,
                    Arg::OptUuid(owner),
                    Arg::OptUuid(owner),
                    Arg::OptInt(epoch),
                ];
                if d.pool().execute(sql, &args, CLAIMING).await? != 1 {
                    return Ok(Vec::new());
                }
                // Read again once the claim is the caller's: no other
                // drainer records in the bucket now, so these rows are its
                // unpublished prefix, whichever connection read the first
                // time.
                let rows = d.reads().fetch_all(read, &read_args, CLAIMING).await?;
                Ok(ready_prefix(rows).0)
            }
        }
    })
    .await
}

/// Records `ids` as published under the holder's fence, on `on`.
async fn record_published<S: Statements>(
    sql: &DrainSql,
    on: &mut S,
    h: Holder<'_>,
    ids: &[i64],
) -> Result<u64, StoreError> {
    let statement = match h.published {
        Published::Kept => &sql.record_published,
        Published::Deleted => &sql.delete_published,
    };
    let [a, b, c, e, f] = held(&h);
    let args = [
        Arg::Ids(ids),
        Arg::Text(Some(h.partition_key)),
        a,
        b,
        c,
        e,
        f,
    ];
    on.execute(statement, &args, "recording published rows")
        .await
}

/// Records a failed attempt at one row in `tx`: whether it is parked now,
/// `None` when the row no longer matched (claim or lease lost).
async fn record_one_failure<S: Statements>(
    sql: &DrainSql,
    tx: &mut S,
    h: Holder<'_>,
    f: Failure<'_>,
) -> Result<Option<bool>, StoreError> {
    const DOING: &str = "recording a failed publish";
    let max_attempts = Arg::Int(i64::from(f.policy.max_attempts));
    let [a, b, c, e, g] = held(&h);
    let args = [
        Arg::Float(f.policy.backoff_max_ms),
        Arg::Float(f.policy.backoff_initial_ms),
        Arg::Bool(f.policy.may_park),
        max_attempts,
        max_attempts,
        Arg::Text(Some(f.error)),
        Arg::Int(f.id),
        Arg::Text(Some(h.partition_key)),
        a,
        b,
        c,
        e,
        g,
    ];
    let parked: Vec<(bool,)> = match &sql.parked {
        None => tx.fetch_all(&sql.record_failure, &args, DOING).await?,
        Some(read) => {
            if tx.execute(&sql.record_failure, &args, DOING).await? == 0 {
                return Ok(None);
            }
            tx.fetch_all(read, &[Arg::Int(f.id)], DOING).await?
        }
    };
    Ok(parked.first().map(|(parked,)| *parked))
}

#[async_trait]
impl<D: Driver> OutboxStore for D {
    async fn enqueue(&self, message: &Message) -> Result<i64, StoreError> {
        let args = enqueue_args(message);
        self.pool()
            .insert(&self.sql().drain.enqueue, &args, ENQUEUEING)
            .await
    }

    async fn claim(&self, claim: Claim<'_>) -> Result<Vec<ClaimedMessage>, StoreError> {
        self::claim(self, claim).await
    }

    async fn record_published(&self, holder: Holder<'_>, ids: &[i64]) -> Result<u64, StoreError> {
        record_published(&self.sql().drain, &mut self.pool(), holder, ids).await
    }

    async fn record_failure(
        &self,
        holder: Holder<'_>,
        confirmed: &[i64],
        failure: Option<Failure<'_>>,
    ) -> Result<FailureRecord, StoreError> {
        let sql = &self.sql().drain;
        bounded_op(self.bounds(), "recording a failed publish", async {
            let mut tx = self.begin().await?;
            let published = if confirmed.is_empty() {
                0
            } else {
                record_published(sql, &mut tx, holder, confirmed).await?
            };
            let parked = match failure {
                Some(f) => record_one_failure(sql, &mut tx, holder, f).await?,
                None => None,
            };
            D::commit(tx).await?;
            Ok(FailureRecord { published, parked })
        })
        .await
    }

    async fn purge_batch(&self, older_than: Duration, limit: i64) -> Result<u64, StoreError> {
        let sql = &self.sql().drain;
        bounded_op(self.bounds(), "purging published rows", async {
            let mut tx = self.begin().await?;
            // Only whoever holds the purge lock purges; the others skip.
            if let Some(lock) = &sql.purge_lock {
                let locked: Vec<(String,)> =
                    tx.fetch_all(lock, &[], "taking the purge lock").await?;
                if locked.is_empty() {
                    D::rollback(tx).await?;
                    return Ok(0);
                }
            }
            let args = [Arg::Duration(older_than), Arg::Int(limit)];
            let n = tx
                .execute(&sql.purge, &args, "purging published rows")
                .await?;
            D::commit(tx).await?;
            Ok(n)
        })
        .await
    }

    async fn tidy_after_purge(&self) -> Result<(), StoreError> {
        self.pool()
            .execute_script(&self.sql().drain.tidy, "tidying the outbox table")
            .await
    }
}
