//! The one vocabulary of states: what a worker and a bucket are doing, in
//! the words the page, the API (`state` on each worker and bucket), `outboxd
//! status` and the metrics (`outboxd_workers{state}`,
//! `outboxd_buckets{state}`) all use.
//!
//! A bucket's state comes from what it did in the last ten seconds (the
//! rates its owner writes with each heartbeat, `bucket_activity`), not from
//! one instant's pending count: a bucket that publishes 20 rows a second
//! has nothing pending most of the time, and is still publishing.

use crate::store::partitions::BucketView;
use crate::store::workers::{WorkerView, bucket_rates};

/// Every state a bucket can be in, in the order they are checked.
pub const BUCKET_STATES: [&str; 5] = ["blocked", "publishing", "unowned", "waiting", "idle"];

/// Every state a worker can be in, in the order they are checked.
pub const WORKER_STATES: [&str; 9] = [
    "gone",
    "broker unreachable",
    "broker alarm",
    "starting",
    "publishing",
    "blocked head",
    "waiting",
    "idle",
    "no buckets",
];

/// Sets each bucket's recent rate and state, then each worker's state.
pub fn annotate(workers: &mut [WorkerView], buckets: &mut [BucketView]) {
    for b in buckets.iter_mut() {
        b.rate = workers
            .iter()
            .filter(|w| w.live)
            .filter_map(|w| w.bucket_activity.as_deref())
            .flat_map(bucket_rates)
            .filter(|(label, _)| *label == b.partition_key)
            .map(|(_, rate)| rate)
            .sum();
        b.state = bucket_state(b).to_string();
    }
    for w in workers.iter_mut() {
        w.state = worker_state(w, buckets).to_string();
    }
}

/// blocked (its head keeps failing: waiting for its retry, or being
/// retried) · publishing (it published in the last ten seconds) ·
/// unowned (rows pending, no lease) · waiting (rows pending, nothing
/// published lately) · idle.
fn bucket_state(b: &BucketView) -> &'static str {
    let owned = b.lease_owner.is_some() && b.lease_ttl_seconds.is_some_and(|t| t > 0.0);
    if b.head_error.is_some() {
        "blocked"
    } else if b.rate > 0.0 {
        "publishing"
    } else if b.pending > 0 && !owned {
        "unowned"
    } else if b.pending > 0 {
        "waiting"
    } else {
        "idle"
    }
}

/// gone · broker unreachable · broker alarm · starting · publishing (it or
/// one of its buckets published lately) · blocked head (every bucket of
/// its with rows is blocked) · waiting (rows pending, nothing published
/// lately) · idle (buckets, nothing pending) · no buckets.
fn worker_state(w: &WorkerView, buckets: &[BucketView]) -> &'static str {
    if !w.live {
        return "gone";
    }
    if !w.can_publish && w.broker_error.is_some() {
        return "broker unreachable";
    }
    if w.broker_blocked.is_some() {
        return "broker alarm";
    }
    if !w.can_publish {
        return "starting";
    }
    let mine: Vec<&BucketView> = buckets
        .iter()
        .filter(|b| {
            w.mode == "no-leasing"
                || (b.lease_owner == Some(w.worker_id)
                    && b.lease_ttl_seconds.is_some_and(|t| t > 0.0))
        })
        .collect();
    if w.published_rate > 0.0 || mine.iter().any(|b| b.state == "publishing") {
        return "publishing";
    }
    let busy: Vec<&&BucketView> = mine.iter().filter(|b| b.pending > 0).collect();
    if !busy.is_empty() && busy.iter().all(|b| b.head_error.is_some()) {
        "blocked head"
    } else if !busy.is_empty() {
        "waiting"
    } else if !mine.is_empty() {
        "idle"
    } else {
        "no buckets"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    fn bucket(key: &str, owner: Option<Uuid>, pending: i64) -> BucketView {
        BucketView {
            partition_key: key.into(),
            lease_owner: owner,
            lease_epoch: 1,
            lease_ttl_seconds: owner.map(|_| 5.0),
            pending,
            pending_capped: false,
            parked: 0,
            head_id: None,
            lag_seconds: 0.0,
            head_attempts: None,
            head_error: None,
            head_retry_at: None,
            rate: 0.0,
            state: String::new(),
        }
    }

    fn worker(id: Uuid, activity: Option<&str>) -> WorkerView {
        WorkerView {
            worker_id: id,
            name: "w".into(),
            hostname: "h".into(),
            pid: 1,
            version: "0".into(),
            mode: "leasing".into(),
            started_at: Utc::now(),
            heartbeat_at: Utc::now(),
            heartbeat_ttl_seconds: 5.0,
            live: true,
            buckets: 2,
            published_total: 0,
            failed_total: 0,
            published_rate: 0.0,
            can_publish: true,
            broker_error: None,
            broker_blocked: None,
            bucket_activity: activity.map(str::to_string),
            destinations: None,
            state: String::new(),
        }
    }

    #[test]
    fn a_bucket_that_published_lately_is_publishing_whatever_is_pending_now() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut workers = [worker(a, Some("p01=19.50 p02=0.10")), worker(b, None)];
        let mut buckets = [
            bucket("p01", Some(a), 0),
            bucket("p02", Some(a), 0),
            bucket("p03", Some(b), 0),
            bucket("p04", Some(b), 3),
            bucket("p05", None, 2),
        ];
        buckets[3].head_error = Some("unroutable".into());
        annotate(&mut workers, &mut buckets);
        let states: Vec<&str> = buckets.iter().map(|b| b.state.as_str()).collect();
        assert_eq!(
            states,
            ["publishing", "publishing", "idle", "blocked", "unowned"]
        );
        assert_eq!(buckets[0].rate, 19.5);
        assert_eq!(workers[0].state, "publishing");
        assert_eq!(workers[1].state, "blocked head");
        for s in states {
            assert!(BUCKET_STATES.contains(&s));
        }
    }
}
