//! The one-statement operations, written once over the driver contract
//! ([`super::driver`]). On the `outbox` table ([`OutboxLookups`]): the
//! poller's probe (the newest id, the rows added after it), the views'
//! single message and a bucket's parked rows, a drainer's claim upkeep
//! (handing its claim back, dropping an earlier lease's), and the reads
//! across buckets (which are ready, their heads, what a purge would
//! delete). On the
//! partitions table ([`PartitionLookups`]): the leases and the lease
//! events. Each backend renders [`OutboxLookupsSql`] and
//! `PartitionLookupsSql` in its own SQL; nothing here knows which.
//!
//! Reads run on [`Driver::reads`] (a backend with one writer keeps its
//! readers apart), writes on [`Driver::pool`].

use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Arg, Driver, Statements};
use super::error::StoreError;
use super::outbox::{BucketHead, ClaimToken, Fence, MessageDetail, MessageSummary};
use super::partitions::{LeaseEvent, LeaseRow};
use super::sql::Sql;
use super::statements::{BucketReadsSql, OutboxLookupsSql};
use super::workers::LateWatch;

/// The `outbox` table's one-statement operations, as every backend has
/// them (through [`Driver`]).
#[async_trait]
pub trait OutboxLookups {
    /// The newest id in the table (0 when it is empty): where a poller's
    /// probe ([`OutboxLookups::added_after`]) starts.
    async fn newest_id(&self) -> Result<i64, StoreError>;

    /// Up to `limit` rows with an id above `after`, oldest first: their ids
    /// and buckets. One range read of the primary key, as cheap as a query
    /// gets when nothing was added: the probe a polling worker runs between
    /// its polls. A row whose id was taken before `after` but that commits
    /// after this read is not among them (ids commit out of order); polls
    /// find it.
    async fn added_after(&self, after: i64, limit: i64) -> Result<Vec<(i64, String)>, StoreError>;

    /// One message, everything included.
    async fn message_detail(&self, id: i64) -> Result<Option<MessageDetail>, StoreError>;

    /// Parked messages of one bucket, oldest first.
    async fn parked_in_bucket(
        &self,
        partition_key: &str,
        limit: i64,
    ) -> Result<Vec<MessageSummary>, StoreError>;

    /// Drops the bucket's claim if it is still `token`'s (a drainer that
    /// stops hands its bucket back at once instead of after claim_ttl).
    async fn release_claim(
        &self,
        partition_key: &str,
        token: ClaimToken,
    ) -> Result<u64, StoreError>;

    /// Drops the claim of an earlier drainer of a bucket just leased
    /// (fenced by that lease).
    async fn clear_claims(&self, partition_key: &str, fence: Fence) -> Result<u64, StoreError>;

    /// The oldest pending row of each given bucket (one index probe each).
    async fn bucket_heads(&self, partition_keys: &[String]) -> Result<Vec<BucketHead>, StoreError>;

    /// Which of `partition_keys` have a head that is ready to publish (the
    /// polling that replaces notifications where they cannot work).
    async fn ready_buckets(&self, partition_keys: &[String]) -> Result<Vec<String>, StoreError>;

    /// [`OutboxLookups::ready_buckets`], and in the same statement a
    /// fingerprint of the workers table: a text that changes whenever a
    /// worker joins or leaves (its row is added or removed), steps aside
    /// or back (`can_publish`), or becomes near or stops being so
    /// (`watch`: its heartbeat is late), and not with heartbeats otherwise.
    /// A poller where no announcements arrive reads it so that its
    /// coordinator need not read the membership every second to notice
    /// such a change, nor every `lease_renew` to notice a peer that died.
    async fn ready_buckets_and_fleet(
        &self,
        partition_keys: &[String],
        watch: LateWatch,
    ) -> Result<(Vec<String>, String), StoreError>;

    /// Whether any of `partition_keys` has a pending row, ready or not
    /// (one probe of the pending index: no bucket's head is read), and the
    /// workers table's fingerprint as
    /// [`OutboxLookups::ready_buckets_and_fleet`] reads it. An idle
    /// poller's look: cheaper than reading every bucket's head, which it
    /// does only when this found a pending row.
    async fn pending_and_fleet(
        &self,
        partition_keys: &[String],
        watch: LateWatch,
    ) -> Result<(bool, String), StoreError>;

    /// How many rows a purge with this cut-off would delete (a full count:
    /// for `--dry-run`, not for the relay).
    async fn count_purgeable(&self, older_than: Duration) -> Result<i64, StoreError>;
}

/// The arguments of a statement with the workers table's fingerprint
/// (`statements::fleet_fingerprinted`): the labels, then the watch.
fn fingerprint_args(partition_keys: &[String], watch: LateWatch) -> [Arg<'_>; 3] {
    [
        Arg::Labels(partition_keys),
        Arg::Duration(watch.older_than),
        Arg::Duration(watch.expiring_within),
    ]
}

#[async_trait]
impl<D: Driver> OutboxLookups for D {
    async fn newest_id(&self) -> Result<i64, StoreError> {
        let sql = &self.sql().lookups.newest_id;
        let rows: Vec<(i64,)> = self
            .reads()
            .fetch_all(sql, &[], "reading the newest id")
            .await?;
        Ok(rows.first().map_or(0, |r| r.0))
    }

    async fn added_after(&self, after: i64, limit: i64) -> Result<Vec<(i64, String)>, StoreError> {
        let sql = &self.sql().lookups.added_after;
        let args = [Arg::Int(after), Arg::Int(limit)];
        self.reads()
            .fetch_all(sql, &args, "probing for new rows")
            .await
    }

    async fn message_detail(&self, id: i64) -> Result<Option<MessageDetail>, StoreError> {
        let sql = &self.sql().lookups.detail;
        let rows = self
            .reads()
            .fetch_all(sql, &[Arg::Int(id)], "reading a message")
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn parked_in_bucket(
        &self,
        partition_key: &str,
        limit: i64,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let sql = &self.sql().lookups.parked_in_bucket;
        let args = [Arg::Text(Some(partition_key)), Arg::Int(limit)];
        self.reads()
            .fetch_all(sql, &args, "listing parked messages")
            .await
    }

    async fn release_claim(
        &self,
        partition_key: &str,
        token: ClaimToken,
    ) -> Result<u64, StoreError> {
        let sql = &self.sql().lookups.release_claim;
        let args = [Arg::Text(Some(partition_key)), Arg::Uuid(token.0)];
        self.pool().execute(sql, &args, "releasing a claim").await
    }

    async fn clear_claims(&self, partition_key: &str, fence: Fence) -> Result<u64, StoreError> {
        let sql = &self.sql().lookups.clear_claims;
        let args = [
            Arg::Text(Some(partition_key)),
            Arg::Uuid(fence.owner),
            Arg::Int(fence.epoch),
        ];
        self.pool()
            .execute(sql, &args, "clearing earlier claims")
            .await
    }

    async fn bucket_heads(&self, partition_keys: &[String]) -> Result<Vec<BucketHead>, StoreError> {
        let sql = &self.sql().lookups.buckets.bucket_heads;
        let args = [Arg::Labels(partition_keys)];
        self.reads()
            .fetch_all(sql, &args, "reading bucket heads")
            .await
    }

    async fn ready_buckets(&self, partition_keys: &[String]) -> Result<Vec<String>, StoreError> {
        let sql = &self.sql().lookups.buckets.ready_buckets;
        let args = [Arg::Labels(partition_keys)];
        let rows: Vec<(String,)> = self
            .reads()
            .fetch_all(sql, &args, "polling for new rows")
            .await?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    async fn ready_buckets_and_fleet(
        &self,
        partition_keys: &[String],
        watch: LateWatch,
    ) -> Result<(Vec<String>, String), StoreError> {
        let sql = &self.sql().lookups.buckets.ready_and_fleet;
        let args = fingerprint_args(partition_keys, watch);
        let rows: Vec<(Option<String>, Option<String>)> = self
            .reads()
            .fetch_all(sql, &args, "polling for new rows")
            .await?;
        let mut fleet = String::new();
        let mut ready = Vec::with_capacity(rows.len());
        for row in rows {
            match row {
                (Some(label), _) => ready.push(label),
                (None, Some(fingerprint)) => fleet = fingerprint,
                (None, None) => {}
            }
        }
        Ok((ready, fleet))
    }

    async fn pending_and_fleet(
        &self,
        partition_keys: &[String],
        watch: LateWatch,
    ) -> Result<(bool, String), StoreError> {
        let sql = &self.sql().lookups.buckets.pending_and_fleet;
        let args = fingerprint_args(partition_keys, watch);
        let rows: Vec<(Option<String>, Option<String>)> = self
            .reads()
            .fetch_all(sql, &args, "polling for new rows")
            .await?;
        let (pending, fleet) = rows.into_iter().next().unwrap_or_default();
        Ok((pending.is_some(), fleet.unwrap_or_default()))
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<i64, StoreError> {
        let sql = &self.sql().lookups.buckets.count_purgeable;
        let args = [Arg::Duration(older_than)];
        let rows: Vec<(i64,)> = self
            .reads()
            .fetch_all(sql, &args, "counting purgeable rows")
            .await?;
        Ok(rows.first().map_or(0, |r| r.0))
    }
}

/// The partitions table's reads, as every backend has them (through
/// [`Driver`]).
#[async_trait]
pub trait PartitionLookups {
    /// Every bucket's lease, by label.
    async fn leases(&self) -> Result<Vec<LeaseRow>, StoreError>;

    /// Lease events after `after_id`, oldest first.
    async fn events_since(&self, after_id: i64, limit: i64) -> Result<Vec<LeaseEvent>, StoreError>;

    /// The latest lease changes of the last `seconds` (at most `limit`, the
    /// most recent), oldest first.
    async fn events_within(&self, seconds: f64, limit: i64) -> Result<Vec<LeaseEvent>, StoreError>;
}

#[async_trait]
impl<D: Driver> PartitionLookups for D {
    async fn leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let sql = &self.sql().partition_lookups.leases;
        self.reads().fetch_all(sql, &[], "reading leases").await
    }

    async fn events_since(&self, after_id: i64, limit: i64) -> Result<Vec<LeaseEvent>, StoreError> {
        let sql = &self.sql().partition_lookups.events_since;
        let args = [Arg::Int(after_id), Arg::Int(limit)];
        self.reads()
            .fetch_all(sql, &args, "reading lease events")
            .await
    }

    async fn events_within(&self, seconds: f64, limit: i64) -> Result<Vec<LeaseEvent>, StoreError> {
        let sql = &self.sql().partition_lookups.events_within;
        let within = Duration::from_secs_f64(seconds.clamp(0.0, 1e9));
        let args = [Arg::Duration(within), Arg::Int(limit)];
        self.reads()
            .fetch_all(sql, &args, "reading lease events")
            .await
    }
}

/// Renders [`OutboxLookupsSql`] (but for `buckets`, which each backend
/// writes in its own SQL) for a backend whose statements differ from
/// the common text only in their placeholders: `?`, or, through `number`,
/// `$1, $2, …`. `render` is the
/// backend's template renderer (table names, its time functions).
pub(crate) fn statements(
    render: impl Fn(&str) -> Sql,
    number: bool,
    buckets: BucketReadsSql,
) -> OutboxLookupsSql {
    let sql = |template: &str| {
        render(&if number {
            numbered(template)
        } else {
            template.to_string()
        })
    };
    let summary = super::statements::SUMMARY_COLUMNS;
    OutboxLookupsSql {
        newest_id: sql("SELECT COALESCE(MAX(id), 0) FROM {outbox}"),
        added_after: sql("SELECT id, partition_key FROM {outbox} WHERE id > ? ORDER BY id LIMIT ?"),
        detail: sql(&format!(
            "SELECT {summary}, o.headers, o.content_type, o.payload
             FROM {{outbox}} o WHERE o.id = ?"
        )),
        // Oldest first: (partition_key, id) is id order within the one
        // bucket, and lets an index on (partition_key, id) serve it.
        parked_in_bucket: sql(&format!(
            "SELECT {summary} FROM {{outbox}} o
             WHERE o.partition_key = ? AND o.failed_at IS NOT NULL
             ORDER BY o.partition_key, o.id LIMIT ?"
        )),
        release_claim: sql(
            "UPDATE {partitions} SET claim_token = NULL, claimed_until = NULL
             WHERE partition_key = ? AND claim_token = ?",
        ),
        // A new lease owner drops the claim of an earlier owner: its writes
        // are fenced out anyway, and its claim would only hold the bucket
        // up until claim_ttl.
        clear_claims: sql(
            "UPDATE {partitions} SET claim_token = NULL, claimed_until = NULL
             WHERE partition_key = ? AND lease_owner = ? AND lease_epoch = ?
               AND claim_token IS NOT NULL",
        ),
        buckets,
    }
}

/// `?` placeholders as `$1, $2, …`, in order (no statement here has a `?`
/// anywhere else).
fn numbered(template: &str) -> String {
    let mut out = String::with_capacity(template.len() + 8);
    let mut n = 0;
    for c in template.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn placeholders_are_numbered_in_order() {
        assert_eq!(
            super::numbered("WHERE a = ? AND b = ? LIMIT ?"),
            "WHERE a = $1 AND b = $2 LIMIT $3"
        );
    }
}
