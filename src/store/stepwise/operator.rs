//! An operator's changes to parked rows and blocked heads as steps of one
//! transaction: read the rows (locked), change them, write the audit
//! record, commit — so a drop, a requeue or a park is never silent and
//! never half done.

use std::collections::BTreeMap;

use async_trait::async_trait;

use serde_json::{Value as Json, json};

use super::Stepwise;
use crate::partitioner::Partitioner;
use crate::store::bounds::bounded_op;
use crate::store::driver::{Arg, Statements};
use crate::store::error::StoreError;
use crate::store::outbox::{Dropped, HeadAction, ParkedStore};
use crate::store::repartition::flow::partition_count;
use crate::store::sql::Sql;

/// Writes an operator action to `<outbox>_audit` (in its transaction).
async fn audit<D: Stepwise>(
    d: &D,
    tx: &mut D::Tx,
    actor: &str,
    action: &str,
    detail: &Json,
) -> Result<(), StoreError> {
    let detail = detail.to_string();
    let args = [
        Arg::Text(Some(actor)),
        Arg::Text(Some(action)),
        Arg::Text(Some(&detail)),
    ];
    let sql = &d.steps().operator.audit;
    tx.execute(sql, &args, "writing the audit record").await?;
    Ok(())
}

/// Wakes the workers of `buckets` at commit, where the backend notifies
/// (`OperatorStepsSql::wake`): the rows changed there are ready now.
async fn wake<D: Stepwise>(
    d: &D,
    tx: &mut D::Tx,
    mut buckets: Vec<String>,
) -> Result<(), StoreError> {
    let Some(sql) = &d.steps().operator.wake else {
        return Ok(());
    };
    buckets.sort_unstable();
    buckets.dedup();
    tx.execute(sql, &[Arg::Labels(&buckets)], "waking the buckets' workers")
        .await?;
    Ok(())
}

/// Deletes the parked messages and blocked heads among `ids`, recording
/// what was dropped, by whom and why; returns the ids dropped.
pub async fn drop_parked<D: Stepwise>(
    d: &D,
    ids: &[i64],
    actor: &str,
    reason: &str,
) -> Result<Vec<i64>, StoreError> {
    let sql = &d.steps().operator;
    let audit = Audit {
        actor,
        action: "drop",
        reason,
    };
    change_listed(
        d,
        ids,
        &sql.droppable,
        &sql.delete,
        audit,
        "dropping parked messages",
    )
    .await
}

/// Makes the parked messages among `ids`, in `buckets`, or all of them
/// pending again; returns their ids. A requeued row keeps its id, so it is
/// again ahead of every later pending row of its bucket; one parked under a
/// label that is no bucket any more (an earlier partition count) gets its
/// key's label.
pub async fn requeue<D: Stepwise>(
    d: &D,
    ids: &[i64],
    buckets: &[String],
    all: bool,
    actor: &str,
) -> Result<Vec<i64>, StoreError> {
    let sql = &d.steps().operator;
    bounded_op(d.bounds(), "requeueing messages", async {
        let mut tx = d.begin().await?;
        let args = [Arg::Ids(ids), Arg::Labels(buckets), Arg::Bool(all)];
        let rows: Vec<(i64, String, String, bool)> = tx
            .fetch_all(&sql.requeueable, &args, "requeueing messages")
            .await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let count = partition_count(&mut tx, &sql.partition_count).await?;
        let partitioner = Partitioner::new(count);
        // Rows by their new bucket (None: their own), one statement each.
        let mut moves: BTreeMap<Option<String>, Vec<i64>> = BTreeMap::new();
        let mut woken = Vec::new();
        for (id, key, bucket, known) in &rows {
            let to = (!known).then(|| partitioner.label_for(key));
            woken.push(to.clone().unwrap_or_else(|| bucket.clone()));
            moves.entry(to).or_default().push(*id);
        }
        for (to, ids) in &moves {
            let args = [Arg::Ids(ids), Arg::Text(to.as_deref())];
            tx.execute(&sql.requeue, &args, "requeueing messages")
                .await?;
        }
        let requeued: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let detail = json!({ "ids": requeued, "buckets": buckets, "all": all });
        audit(d, &mut tx, actor, "requeue", &detail).await?;
        wake(d, &mut tx, woken).await?;
        D::commit(tx).await?;
        Ok(requeued)
    })
    .await
}

/// Parks or retries the blocked heads among `ids` (see
/// [`ParkedStore::act_on_heads`]), recording what was done, by whom and
/// why; returns the ids acted on.
pub async fn act_on_heads<D: Stepwise>(
    d: &D,
    ids: &[i64],
    action: HeadAction,
    actor: &str,
    reason: &str,
) -> Result<Vec<i64>, StoreError> {
    let sql = &d.steps().operator;
    let change = match action {
        HeadAction::Park => &sql.park,
        HeadAction::Retry => &sql.retry,
    };
    let audit = Audit {
        actor,
        action: action.name(),
        reason,
    };
    change_listed(
        d,
        ids,
        &sql.blocked_heads,
        change,
        audit,
        "acting on blocked heads",
    )
    .await
}

/// Who did what to the rows, and why, for the audit record.
struct Audit<'a> {
    actor: &'a str,
    action: &'a str,
    reason: &'a str,
}

/// One transaction: the listed rows that `select` takes (locked, as
/// `Dropped`), `change` applied to them, the audit record of them;
/// returns their ids. In id order: the listed rows are locked in the
/// list's order.
async fn change_listed<D: Stepwise>(
    d: &D,
    ids: &[i64],
    select: &Sql,
    change: &Sql,
    who: Audit<'_>,
    doing: &'static str,
) -> Result<Vec<i64>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    let ids = &ids[..];
    bounded_op(d.bounds(), doing, async {
        let mut tx = d.begin().await?;
        let rows: Vec<Dropped> = tx.fetch_all(select, &[Arg::Ids(ids)], doing).await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let changed: Vec<i64> = rows.iter().map(|m| m.id).collect();
        tx.execute(change, &[Arg::Ids(&changed)], doing).await?;
        let detail = json!({
            "reason": who.reason,
            "messages": rows.iter().map(Dropped::to_json).collect::<Vec<_>>(),
        });
        audit(d, &mut tx, who.actor, who.action, &detail).await?;
        wake(
            d,
            &mut tx,
            rows.iter().map(|m| m.partition_key.clone()).collect(),
        )
        .await?;
        D::commit(tx).await?;
        Ok(changed)
    })
    .await
}

#[async_trait]
impl<D: Stepwise> ParkedStore for D {
    async fn drop_parked(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<Vec<i64>, StoreError> {
        drop_parked(self, ids, actor, reason).await
    }

    async fn requeue(
        &self,
        ids: &[i64],
        buckets: &[String],
        all: bool,
        actor: &str,
    ) -> Result<Vec<i64>, StoreError> {
        requeue(self, ids, buckets, all, actor).await
    }

    async fn act_on_heads(
        &self,
        ids: &[i64],
        action: HeadAction,
        actor: &str,
        reason: &str,
    ) -> Result<Vec<i64>, StoreError> {
        act_on_heads(self, ids, action, actor, reason).await
    }
}
