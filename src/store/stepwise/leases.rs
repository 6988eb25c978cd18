//! Leases as steps of one transaction (see [`super`] for why each epoch
//! goes to one owner): read the rows to change (locked), change them, write
//! their lease events, commit — or, where the backend has them
//! ([`LeasesAtOnceSql`](crate::store::statements::LeasesAtOnceSql)), the
//! same as one statement.
//!
//! Every list is bound **in label order**: a database that joins the list
//! first locks the listed rows in the order of the list, so two transactions given
//! the same buckets in different orders could each hold one the other
//! waits for — a deadlock (seen in the lease race of the conformance suite
//! before the lists were sorted). In one order, they queue instead.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::Stepwise;
use crate::store::bounds::bounded_op;
use crate::store::driver::{Arg, Statements};
use crate::store::error::StoreError;
use crate::store::partitions::{Acquired, BucketView, PartitionStore, acquire_reason};
use crate::store::sql::Sql;
use crate::store::views;

/// A lease change to record in `<outbox>_lease_events`.
struct Event<'a> {
    partition_key: &'a str,
    action: &'static str,
    old_owner: Option<Uuid>,
    old_epoch: i64,
    new_epoch: i64,
    reason: &'a str,
}

/// Writes the lease events of one change, in the transaction of the
/// change, as one statement whatever their number: each is a round trip
/// less on a slow link, where a change of sixteen buckets would otherwise
/// wait on sixteen.
async fn log_events<D: Stepwise>(
    d: &D,
    tx: &mut D::Tx,
    worker: Uuid,
    events: &[Event<'_>],
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let worker = worker.simple().to_string();
    let list: serde_json::Value = events
        .iter()
        .map(|e| {
            serde_json::json!([
                e.partition_key,
                e.action,
                worker,
                e.old_owner.map(|o| o.simple().to_string()),
                e.old_epoch,
                e.new_epoch,
                e.reason,
            ])
        })
        .collect();
    let sql = &d.steps().leases.log_events;
    tx.execute(sql, &[Arg::Json(&list)], "recording lease events")
        .await?;
    Ok(())
}

/// `items` sorted: the order in which the rows they name are locked (see
/// the module docs).
fn in_order<T: Ord + Clone>(items: &[T]) -> Vec<T> {
    let mut sorted = items.to_vec();
    sorted.sort();
    sorted
}

/// Inserts a row for every label that has none.
pub async fn ensure_bucket_rows<D: Stepwise>(d: &D, labels: &[String]) -> Result<u64, StoreError> {
    if labels.is_empty() {
        return Ok(0);
    }
    let sql = &d.sql().schema.ensure_rows;
    d.pool()
        .execute(sql, &[Arg::Labels(labels)], "creating bucket rows")
        .await
}

/// Takes every bucket of `wanted` that is free or whose lease ran out.
pub async fn acquire<D: Stepwise>(
    d: &D,
    me: Uuid,
    wanted: &[String],
    ttl: Duration,
    reason: &str,
) -> Result<Vec<Acquired>, StoreError> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let wanted = in_order(wanted);
    let wanted = &wanted[..];
    let sql = &d.steps().leases;
    if let Some(at_once) = &sql.at_once {
        let args = [
            Arg::Labels(wanted),
            Arg::Uuid(me),
            Arg::Duration(ttl),
            Arg::Text(Some(reason)),
        ];
        let mut pool = d.pool();
        let taken = pool.fetch_all(&at_once.acquire, &args, "acquiring leases");
        let taken: Vec<(String, i64, bool)> =
            bounded_op(d.bounds(), "acquiring leases", taken).await?;
        return Ok(taken
            .into_iter()
            .map(|(partition_key, lease_epoch, was_free)| Acquired {
                partition_key,
                lease_epoch,
                was_free,
            })
            .collect());
    }
    bounded_op(d.bounds(), "acquiring leases", async {
        let mut tx = d.begin().await?;
        let candidates: Vec<(String, Option<Uuid>, i64)> = tx
            .fetch_all(&sql.acquirable, &[Arg::Labels(wanted)], "acquiring leases")
            .await?;
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let labels: Vec<String> = candidates.iter().map(|(k, _, _)| k.clone()).collect();
        let args = [Arg::Labels(&labels), Arg::Uuid(me), Arg::Duration(ttl)];
        tx.execute(&sql.acquire, &args, "acquiring leases").await?;
        let reasons: Vec<String> = candidates
            .iter()
            .map(|(_, old_owner, _)| acquire_reason(*old_owner, reason))
            .collect();
        let events: Vec<Event> = candidates
            .iter()
            .zip(&reasons)
            .map(|((k, old_owner, old_epoch), reason)| Event {
                partition_key: k,
                action: "acquire",
                old_owner: *old_owner,
                old_epoch: *old_epoch,
                new_epoch: old_epoch + 1,
                reason,
            })
            .collect();
        log_events(d, &mut tx, me, &events).await?;
        D::commit(tx).await?;
        Ok(candidates
            .into_iter()
            .map(|(partition_key, old_owner, old_epoch)| Acquired {
                partition_key,
                lease_epoch: old_epoch + 1,
                was_free: old_owner.is_none(),
            })
            .collect())
    })
    .await
}

/// Extends the leases of `held` still ours at their epoch; returns the
/// buckets renewed (any other was lost). One `UPDATE` ([`renewal`]).
pub async fn renew<D: Stepwise>(
    d: &D,
    me: Uuid,
    held: &[(String, i64)],
    ttl: Duration,
) -> Result<Vec<String>, StoreError> {
    let held = in_order(held);
    let args = [Arg::Pairs(&held), Arg::Duration(ttl), Arg::Uuid(me)];
    let (renewed, _) = renewal(d, me, &held, &d.steps().leases.renew, &args, 0).await?;
    Ok(renewed)
}

/// [`renew`], and where the backend has the statement
/// ([`LeaseStepsSql::renew_and_beat`](crate::store::statements::LeaseStepsSql::renew_and_beat))
/// `me`'s heartbeat in the same `UPDATE`; returns the buckets renewed and
/// whether the worker row was beaten (the statement counts that row among
/// the rows it changed).
pub async fn renew_and_beat<D: Stepwise>(
    d: &D,
    me: Uuid,
    held: &[(String, i64)],
    ttl: Duration,
    heartbeat_ttl: Duration,
) -> Result<(Vec<String>, bool), StoreError> {
    let Some(statement) = d.steps().leases.renew_and_beat.as_ref() else {
        return Ok((renew(d, me, held, ttl).await?, false));
    };
    let held = in_order(held);
    let args = [
        Arg::Pairs(&held),
        Arg::Uuid(me),
        Arg::Duration(ttl),
        Arg::Duration(heartbeat_ttl),
        Arg::Uuid(me),
    ];
    let (renewed, beaten) = renewal(d, me, &held, statement, &args, 1).await?;
    Ok((renewed, beaten > 0))
}

/// Runs a renewal `statement` (with `args`) over `held`, in label order,
/// which changes each lease still ours and up to `others` rows besides;
/// returns the buckets renewed and how many other rows it changed. Only
/// when it changed fewer than every lease and every other row is it read
/// back which leases are still ours — the ones it renewed (nobody else can
/// hold our owner id at our epoch) — the rest of the count being the
/// others.
async fn renewal<D: Stepwise>(
    d: &D,
    me: Uuid,
    held: &[(String, i64)],
    statement: &Sql,
    args: &[Arg<'_>],
    others: usize,
) -> Result<(Vec<String>, usize), StoreError> {
    if held.is_empty() {
        return Ok((Vec::new(), 0));
    }
    bounded_op(d.bounds(), "renewing leases", async {
        let changed = d.pool().execute(statement, args, "renewing leases").await? as usize;
        if changed == held.len() + others {
            return Ok((held.iter().map(|(k, _)| k.clone()).collect(), others));
        }
        let args = [Arg::Pairs(held), Arg::Uuid(me)];
        let still: Vec<(String, i64)> = d
            .pool()
            .fetch_all(&d.steps().leases.held, &args, "renewing leases")
            .await?;
        let others = changed.saturating_sub(still.len());
        Ok((still.into_iter().map(|(k, _)| k).collect(), others))
    })
    .await
}

/// Frees the leases of `held` still ours at their epoch.
pub async fn release_leases<D: Stepwise>(
    d: &D,
    me: Uuid,
    held: &[(String, i64)],
    reason: &str,
) -> Result<Vec<String>, StoreError> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let held = in_order(held);
    let leases = &d.steps().leases;
    if let Some(at_once) = &leases.at_once {
        let args = [Arg::Pairs(&held), Arg::Uuid(me), Arg::Text(Some(reason))];
        return release_at_once(d, &at_once.release, &args).await;
    }
    release(
        d,
        me,
        reason,
        &leases.held,
        &[Arg::Pairs(&held), Arg::Uuid(me)],
    )
    .await
}

/// Frees every lease `me` holds, whatever its epoch.
pub async fn release_all_leases<D: Stepwise>(
    d: &D,
    me: Uuid,
    reason: &str,
) -> Result<Vec<String>, StoreError> {
    let leases = &d.steps().leases;
    if let Some(at_once) = &leases.at_once {
        let args = [Arg::Uuid(me), Arg::Text(Some(reason))];
        return release_at_once(d, &at_once.release_all, &args).await;
    }
    release(d, me, reason, &leases.owned, &[Arg::Uuid(me)]).await
}

/// Frees leases and logs them with one statement (`LeasesAtOnceSql`).
async fn release_at_once<D: Stepwise>(
    d: &D,
    statement: &Sql,
    args: &[Arg<'_>],
) -> Result<Vec<String>, StoreError> {
    let mut pool = d.pool();
    let freed = pool.fetch_all(statement, args, "releasing leases");
    let freed: Vec<(String,)> = bounded_op(d.bounds(), "releasing leases", freed).await?;
    Ok(freed.into_iter().map(|(k,)| k).collect())
}

/// Frees the leases `find` (with `args`) reads, logging each.
async fn release<D: Stepwise>(
    d: &D,
    me: Uuid,
    reason: &str,
    find: &crate::store::sql::Sql,
    args: &[Arg<'_>],
) -> Result<Vec<String>, StoreError> {
    bounded_op(d.bounds(), "releasing leases", async {
        let mut tx = d.begin().await?;
        let rows: Vec<(String, i64)> = tx.fetch_all(find, args, "releasing leases").await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let labels = in_order(&rows.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>());
        let free = &d.steps().leases.free;
        let args = [Arg::Labels(&labels), Arg::Uuid(me)];
        tx.execute(free, &args, "releasing leases").await?;
        let events: Vec<Event> = rows
            .iter()
            .map(|(k, epoch)| Event {
                partition_key: k,
                action: "release",
                old_owner: Some(me),
                old_epoch: *epoch,
                new_epoch: *epoch,
                reason,
            })
            .collect();
        log_events(d, &mut tx, me, &events).await?;
        D::commit(tx).await?;
        Ok(labels)
    })
    .await
}

#[async_trait]
impl<D: Stepwise> PartitionStore for D {
    async fn ensure_bucket_rows(&self, labels: &[String]) -> Result<u64, StoreError> {
        ensure_bucket_rows(self, labels).await
    }

    async fn acquire(
        &self,
        me: Uuid,
        wanted: &[String],
        ttl: Duration,
        reason: &str,
    ) -> Result<Vec<Acquired>, StoreError> {
        acquire(self, me, wanted, ttl, reason).await
    }

    async fn renew(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        ttl: Duration,
    ) -> Result<Vec<String>, StoreError> {
        renew(self, me, held, ttl).await
    }

    async fn renew_and_beat(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        ttl: Duration,
        heartbeat_ttl: Duration,
    ) -> Result<(Vec<String>, bool), StoreError> {
        renew_and_beat(self, me, held, ttl, heartbeat_ttl).await
    }

    async fn release_leases(
        &self,
        me: Uuid,
        held: &[(String, i64)],
        reason: &str,
    ) -> Result<Vec<String>, StoreError> {
        release_leases(self, me, held, reason).await
    }

    async fn release_all_leases(&self, me: Uuid, reason: &str) -> Result<Vec<String>, StoreError> {
        release_all_leases(self, me, reason).await
    }

    async fn overview(&self, cap: i64) -> Result<Vec<BucketView>, StoreError> {
        let v = self.views();
        let overview = views::overview(self, v.tables, v.dialect, v.overview_lines, cap);
        bounded_op(self.bounds(), "reading the bucket overview", overview).await
    }
}
