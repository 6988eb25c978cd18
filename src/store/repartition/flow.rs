//! The repartition, written once over the driver contract (see [`super`]
//! for the argument): one transaction that takes the registration lock and
//! refuses while a worker is live, holds the producers, records the rows a
//! stream holds, records the new count, re-labels the unpublished rows,
//! replaces the bucket rows and writes the audit record. A backend gives
//! its statements ([`RepartitionSql`]): how producers are held (a locked
//! settings row its insert trigger reads, a table lock, or the file's one
//! write lock) and where labels are computed ([`Relabel`]).
//!
//! Also here: parking rows whose label is no bucket.

use async_trait::async_trait;
use serde_json::json;
use uuid::Uuid;

use super::{
    ParkedUnknown, RepartitionError, RepartitionReport, RepartitionStore, unknown_label_error,
};
use crate::partitioner::Partitioner;
use crate::store::driver::{Arg, Driver, Statements};
use crate::store::error::StoreError;
use crate::store::membership;
use crate::store::outbox::{MessageSummary, Published};
use crate::store::sql::{Sql, label_literal};
use crate::store::statements::{Relabel, RepartitionSql};

#[async_trait]
impl<D: Driver> RepartitionStore for D {
    async fn repartition(
        &self,
        to: u32,
        dry_run: bool,
        actor: &str,
        stored: &[i64],
        published: Published,
    ) -> Result<RepartitionReport, RepartitionError> {
        repartition(self, to, dry_run, actor, stored, published).await
    }

    async fn pending_up_to(
        &self,
        bucket: &str,
        up_to: i64,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let sql = &self.sql().repartition.pending_up_to;
        let args = [Arg::Text(Some(bucket)), Arg::Int(up_to)];
        let doing = "reading a bucket's pending rows";
        self.reads().fetch_all(sql, &args, doing).await
    }

    async fn park_unknown_labels(&self) -> Result<Vec<ParkedUnknown>, StoreError> {
        let sql = &self.sql().repartition;
        let doing = "looking for unknown bucket labels";
        let mut tx = self.begin().await?;
        let known: Vec<(String,)> = tx.fetch_all(&sql.known, &[], doing).await?;
        // The pending index between (and around) the known labels holds
        // only rows of unknown labels: a range scan of those gaps, however
        // many rows the known buckets hold.
        let literals: Vec<String> = known.iter().filter_map(|(l,)| label_literal(l)).collect();
        let gaps =
            match (literals.first(), literals.last()) {
                (Some(first), Some(last)) => {
                    let mut gaps = vec![format!("partition_key < {first}")];
                    gaps.extend(literals.windows(2).map(|w| {
                        format!("(partition_key > {} AND partition_key < {})", w[0], w[1])
                    }));
                    gaps.push(format!("partition_key > {last}"));
                    gaps.join(" OR ")
                }
                _ => "1 = 1".to_string(),
            };
        let strays = Sql::from_rendered(sql.strays.as_str().replace("{gaps}", &gaps));
        let strays: Vec<(i64, String, String)> = tx.fetch_all(&strays, &[], doing).await?;
        if strays.is_empty() {
            D::rollback(tx).await?;
            return Ok(Vec::new());
        }
        let parked = park(self, &mut tx, strays).await?;
        D::commit(tx).await?;
        Ok(parked)
    }
}

/// Changes the bucket count to `to` (see [`super::RepartitionStore`]).
pub(crate) async fn repartition<D: Driver>(
    d: &D,
    to: u32,
    dry_run: bool,
    actor: &str,
    stored: &[i64],
    published: Published,
) -> Result<RepartitionReport, RepartitionError> {
    let sql = &d.sql().repartition;
    let mut tx = d.begin().await?;
    let w = &d.sql().workers;
    tx.execute(&w.lock_registrations, &[], "taking the registration lock")
        .await?;
    let live = membership::live_others(w, &mut tx, Uuid::nil()).await?;
    if !live.is_empty() {
        return Err(RepartitionError::WorkersLive(live));
    }
    let from: Vec<(i32,)> = tx
        .fetch_all(&sql.settings, &[], "reading partition_count")
        .await?;
    let Some(&(from,)) = from.first() else {
        return Err(RepartitionError::NotMigrated);
    };
    if let (false, Some(hold)) = (dry_run, &sql.hold_producers) {
        let doing = "locking the outbox table against producers";
        tx.execute(hold, &[], doing).await?;
    }
    let record = match published {
        Published::Kept => &sql.record_stored,
        Published::Deleted => &sql.delete_stored,
    };
    let mut recorded_stored = 0;
    for chunk in stored.chunks(10_000) {
        recorded_stored += match dry_run {
            true => chunk.len() as u64,
            false => {
                let doing = "recording published the rows a stream holds";
                tx.execute(record, &[Arg::Ids(chunk)], doing).await?
            }
        };
    }
    let count = [Arg::Int(i64::from(to))];
    tx.execute(&sql.set_count, &count, "recording the new partition_count")
        .await?;
    let (unpublished, relabelled) = relabel::<D>(&mut tx, &sql.relabel, to, dry_run).await?;
    let report = RepartitionReport {
        from: from as u32,
        to,
        unpublished,
        relabelled,
        recorded_stored,
    };
    if dry_run {
        D::rollback(tx).await?;
        return Ok(report);
    }
    replace_bucket_rows::<D>(&mut tx, sql, to).await?;
    let detail = json!({
        "from": from, "to": to, "unpublished": unpublished, "relabelled": relabelled,
        "recorded_stored": recorded_stored,
    })
    .to_string();
    let args = [Arg::Text(Some(actor)), Arg::Text(Some(&detail))];
    tx.execute(&sql.audit, &args, "recording the audit entry")
        .await?;
    D::commit(tx).await?;
    Ok(report)
}

/// Counts the unpublished rows and those a label under `to` moves, and
/// (unless a dry run) moves them.
async fn relabel<D: Driver>(
    tx: &mut D::Tx,
    how: &Relabel,
    to: u32,
    dry_run: bool,
) -> Result<(i64, i64), StoreError> {
    match how {
        Relabel::InSql {
            unpublished,
            count_moved,
            relabel,
        } => {
            let doing = "counting unpublished rows";
            let rows: Vec<(i64,)> = tx.fetch_all(unpublished, &[], doing).await?;
            let unpublished = rows.first().map_or(0, |r| r.0);
            let moved = if dry_run {
                let doing = "counting the rows to re-label";
                let rows: Vec<(i64,)> = tx.fetch_all(count_moved, &[], doing).await?;
                rows.first().map_or(0, |r| r.0)
            } else {
                let doing = "re-labelling unpublished rows";
                tx.execute(relabel, &[], doing).await? as i64
            };
            Ok((unpublished, moved))
        }
        Relabel::Here {
            unpublished_rows,
            set_labels,
        } => {
            let doing = "reading unpublished rows";
            let rows: Vec<(i64, String, String)> =
                tx.fetch_all(unpublished_rows, &[], doing).await?;
            let partitioner = Partitioner::new(to);
            let moved: Vec<(String, i64)> = rows
                .iter()
                .map(|(id, old, key)| (partitioner.label_for(key), *id, old))
                .filter(|(new, _, old)| new != *old)
                .map(|(new, id, _)| (new, id))
                .collect();
            if !dry_run {
                for chunk in moved.chunks(10_000) {
                    let doing = "re-labelling unpublished rows";
                    tx.execute(set_labels, &[Arg::Pairs(chunk)], doing).await?;
                }
            }
            Ok((rows.len() as i64, moved.len() as i64))
        }
    }
}

/// The bucket rows for `to` buckets: removed ones go, kept ones lose lease
/// and claim and get a new epoch, new ones start above every epoch so far —
/// so a write under any earlier lease matches no row.
async fn replace_bucket_rows<D: Driver>(
    tx: &mut D::Tx,
    sql: &RepartitionSql,
    to: u32,
) -> Result<(), StoreError> {
    let doing = "replacing the bucket rows";
    let labels = Partitioner::new(to).labels();
    let top: Vec<(i64,)> = tx.fetch_all(&sql.next_epoch, &[], doing).await?;
    let top = top.first().map_or(1, |t| t.0);
    tx.execute(&sql.drop_buckets, &[Arg::Labels(&labels)], doing)
        .await?;
    tx.execute(&sql.reset_buckets, &[], doing).await?;
    let args = [Arg::Int(top), Arg::Labels(&labels)];
    tx.execute(&sql.add_buckets, &args, doing).await?;
    Ok(())
}

/// Parks `strays` — (id, label, message key) of pending rows whose label is
/// no bucket — in `tx`, each with an error naming the bucket its key
/// belongs to.
pub(crate) async fn park<D: Driver>(
    d: &D,
    tx: &mut D::Tx,
    strays: Vec<(i64, String, String)>,
) -> Result<Vec<ParkedUnknown>, StoreError> {
    let sql = &d.sql().repartition;
    let count = partition_count(tx, &sql.count).await?;
    let partitioner = Partitioner::new(count);
    for (id, label, key) in &strays {
        let error = unknown_label_error(label, count, key, &partitioner.label_for(key));
        let args = [Arg::Text(Some(&error)), Arg::Int(*id)];
        let doing = "parking rows with unknown bucket labels";
        tx.execute(&sql.park, &args, doing).await?;
    }
    Ok(strays
        .into_iter()
        .map(|(id, partition_key, _)| ParkedUnknown { id, partition_key })
        .collect())
}

/// The recorded `partition_count`, read with `sql`.
pub(crate) async fn partition_count(
    on: &mut impl Statements,
    sql: &Sql,
) -> Result<u32, StoreError> {
    let count: Vec<(i32,)> = on.fetch_all(sql, &[], "reading partition_count").await?;
    match count.first() {
        Some(&(count,)) => Ok(count as u32),
        None => Err(StoreError::Schema(
            "the database has no recorded partition_count: run `outboxd migrate` first".into(),
        )),
    }
}
