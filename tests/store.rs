//! The store's conformance suite: what every backend promises at the level
//! of the `Store` interface — claims, fences, lease races, records,
//! parking, lease events, membership, repartitioning, how its errors read —
//! written once and run against each backend (`on_every_store!`). A new backend is done when this
//! suite passes on it, before any process-level test runs.
//!
//! The tests call the store directly (no worker process), on a fresh
//! database each, with a 16-bucket deployment.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use outboxd::partitioner::Partitioner;
use outboxd::producer::Message;
use outboxd::store::outbox::{
    Claim, ClaimToken, Failure, FailurePolicy, Fence, Holder, MessageState, MessageSummary,
    Published,
};
use outboxd::store::repartition::RepartitionError;
use outboxd::store::workers::{Joined, LateWatch, Registration, WorkerCounts, WorkerMode};
use uuid::Uuid;

const LEASE_TTL: Duration = Duration::from_secs(3);
/// What the workers table's fingerprint marks as near: later than any
/// heartbeat a test writes on time, ending sooner than one.
const WATCH: LateWatch = LateWatch {
    older_than: Duration::from_secs(60),
    expiring_within: Duration::from_secs(10),
};
/// A bound on heartbeat age no test's worker reaches: membership by
/// heartbeat alone.
const SUSPECT_NONE: Duration = Duration::from_secs(3600);

fn claim<'a>(holder: Holder<'a>, limit: u32, in_flight: &'a [i64]) -> Claim<'a> {
    Claim {
        holder,
        limit,
        claim_ttl: Duration::from_secs(15),
        min_left: Duration::from_secs(11),
        in_flight,
        held: false,
    }
}

fn holder(bucket: &str) -> Holder<'_> {
    Holder {
        partition_key: bucket,
        token: ClaimToken::new(),
        fence: None,
        published: Default::default(),
    }
}

fn policy(max_attempts: u32, backoff_ms: f64) -> FailurePolicy {
    FailurePolicy {
        max_attempts,
        may_park: true,
        backoff_initial_ms: backoff_ms,
        backoff_max_ms: backoff_ms,
    }
}

/// Enqueues `n` messages for one key of `bucket`; returns their ids.
async fn fill(env: &TestEnv, bucket: &str, n: usize, prefix: &str) -> Vec<i64> {
    let key = keys_in_bucket(env.partitioner(), bucket, 1, prefix)[0].clone();
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            env.db
                .enqueue(Message::new(key.clone(), "", "q", i.to_string()))
                .await,
        );
    }
    ids
}

fn ids_of(rows: &[outboxd::store::outbox::ClaimedMessage]) -> Vec<i64> {
    rows.iter().map(|r| r.id).collect()
}

/// A claim takes the first rows of one bucket in id order; while it is
/// live no other token claims the bucket (other buckets are free); the
/// holder reads ahead past the rows it has in flight; a released claim
/// lets the next token start again from the head.
async fn claims_take_the_head_in_id_order_one_claim_at_a_time(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let ids = fill(&env, "p03", 6, "claims").await;
    let other_bucket = fill(&env, "p05", 2, "other").await;

    let first = holder("p03");
    let batch = store.claim(claim(first, 4, &[])).await.unwrap();
    assert_eq!(ids_of(&batch), ids[..4]);
    assert!(batch.iter().all(|r| r.partition_key == "p03"));

    let second = holder("p03");
    assert!(
        store
            .claim(claim(second, 10, &[]))
            .await
            .unwrap()
            .is_empty(),
        "another token's live claim blocks the bucket"
    );
    let elsewhere = store.claim(claim(holder("p05"), 10, &[])).await.unwrap();
    assert_eq!(ids_of(&elsewhere), other_bucket, "other buckets are free");

    let ahead = store.claim(claim(first, 10, &ids[..4])).await.unwrap();
    assert_eq!(
        ids_of(&ahead),
        ids[4..],
        "read ahead skips what is in flight"
    );

    assert_eq!(store.release_claim("p03", first.token).await.unwrap(), 1);
    let again = store.claim(claim(second, 2, &[])).await.unwrap();
    assert_eq!(ids_of(&again), ids[..2], "nothing recorded: from the head");
}

/// A claim the caller says it holds, and its token does hold with at
/// least `min_left` to run, is used without a write (its expiry stays as
/// it was); with less left it is renewed to the full TTL, as it is by any
/// claim made without that belief; and a claim whose lease has lapsed is
/// not held, whatever its token.
async fn a_held_claim_is_read_without_a_write_until_it_runs_low(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let ids = fill(&env, "p03", 6, "held").await;
    let owner = Uuid::new_v4();
    let leased = store
        .acquire(owner, &["p03".to_string()], LEASE_TTL, "test")
        .await
        .unwrap();
    let h = Holder {
        fence: Some(Fence {
            owner,
            epoch: leased[0].lease_epoch,
        }),
        ..holder("p03")
    };
    assert_eq!(
        ids_of(&store.claim(claim(h, 2, &[])).await.unwrap()),
        ids[..2]
    );
    // 12 s left: more than min_left (11 s), less than the TTL (15 s).
    let twelve_left = format!(
        "UPDATE outbox_partitions SET claimed_until = {} WHERE partition_key = 'p03'",
        env.db.now_plus(12)
    );
    env.db.exec(&twelve_left).await;
    let until_below = |secs| {
        format!(
            "SELECT COUNT(*) FROM outbox_partitions WHERE partition_key = 'p03' AND claimed_until < {}",
            env.db.now_plus(secs)
        )
    };
    let held = |in_flight| Claim {
        held: true,
        ..claim(h, 2, in_flight)
    };
    let ahead = store.claim(held(&ids[..2])).await.unwrap();
    assert_eq!(ids_of(&ahead), ids[2..4], "the held claim's rows");
    assert_eq!(
        env.db.row::<(i64,)>(&until_below(13)).await.0,
        1,
        "a claim held with enough left is not written again"
    );
    let unbelieved = store.claim(claim(h, 2, &ids[..2])).await.unwrap();
    assert_eq!(ids_of(&unbelieved), ids[2..4]);
    assert_eq!(
        env.db.row::<(i64,)>(&until_below(14)).await.0,
        0,
        "a claim made without the belief that it is held takes it anew"
    );
    env.db.exec(&twelve_left).await;
    let renewing = Claim {
        min_left: Duration::from_secs(15),
        ..held(&ids[..2])
    };
    assert_eq!(ids_of(&store.claim(renewing).await.unwrap()), ids[2..4]);
    assert_eq!(
        env.db.row::<(i64,)>(&until_below(14)).await.0,
        0,
        "a claim with less than min_left left is renewed to the TTL"
    );
    env.db
        .exec(&format!(
            "UPDATE outbox_partitions SET lease_until = {} WHERE partition_key = 'p03'",
            env.db.now_plus(-1)
        ))
        .await;
    for claim in [claim(h, 2, &[]), held(&[])] {
        assert!(
            store.claim(claim).await.unwrap().is_empty(),
            "a claim under a lapsed lease is not held"
        );
    }
}

/// A failed head waits for its backoff, and nothing behind it in its
/// bucket is claimed meanwhile; other buckets go on. Once its time comes it
/// is claimed first, with its attempt counted.
async fn a_failing_head_holds_back_only_its_own_bucket(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let ids = fill(&env, "p03", 3, "head").await;
    let other = fill(&env, "p05", 1, "other").await;

    let h = holder("p03");
    let batch = store.claim(claim(h, 3, &[])).await.unwrap();
    assert_eq!(ids_of(&batch), ids);
    let failure = Failure {
        id: ids[0],
        error: "boom",
        policy: policy(5, 60_000.0),
    };
    let recorded = store.record_failure(h, &[], Some(failure)).await.unwrap();
    assert_eq!((recorded.published, recorded.parked), (0, Some(false)));
    store.release_claim("p03", h.token).await.unwrap();

    assert!(
        store
            .claim(claim(holder("p03"), 10, &[]))
            .await
            .unwrap()
            .is_empty(),
        "rows behind a waiting head are not claimed"
    );
    let buckets = vec!["p03".to_string(), "p05".to_string()];
    assert_eq!(store.ready_buckets(&buckets).await.unwrap(), ["p05"]);
    let (ready, fleet) = store
        .ready_buckets_and_fleet(&buckets, WATCH)
        .await
        .unwrap();
    assert_eq!(ready, ["p05"], "the same poll with the fingerprint");
    // An idle poller's look: any pending row, ready or not.
    let waiting = ["p03".to_string()];
    assert!(store.ready_buckets(&waiting).await.unwrap().is_empty());
    assert_eq!(
        store.pending_and_fleet(&waiting, WATCH).await.unwrap(),
        (true, fleet),
        "a head waiting for its retry is pending; the same fingerprint"
    );
    let empty = ["p01".to_string(), "p02".to_string()];
    assert!(!store.pending_and_fleet(&empty, WATCH).await.unwrap().0);
    let heads = store.bucket_heads(&buckets).await.unwrap();
    let head = heads.iter().find(|h| h.partition_key == "p03").unwrap();
    assert_eq!((head.id, head.attempts), (Some(ids[0]), Some(1)));
    assert_eq!(head.last_error.as_deref(), Some("boom"));
    let elsewhere = store.claim(claim(holder("p05"), 10, &[])).await.unwrap();
    assert_eq!(ids_of(&elsewhere), other);

    // Its time comes.
    env.db
        .exec(&format!(
            "UPDATE outbox SET available_at = {} WHERE id = {}",
            env.db.now_plus(-1),
            ids[0]
        ))
        .await;
    let h = holder("p03");
    let retried = store.claim(claim(h, 10, &[])).await.unwrap();
    assert_eq!(ids_of(&retried), ids);
    assert_eq!(retried[0].attempts, 1);
    // Published and parked rows are not pending.
    assert_eq!(store.record_published(h, &ids[..2]).await.unwrap(), 2);
    let park = Failure {
        id: ids[2],
        error: "unroutable",
        policy: policy(1, 10.0),
    };
    store.record_failure(h, &[], Some(park)).await.unwrap();
    assert!(!store.pending_and_fleet(&waiting, WATCH).await.unwrap().0);
}

/// Records the first two of `ids` as published, then the third with the
/// fourth's failure, which parks it (its last allowed attempt), under `h`.
async fn publish_three_and_park_the_fourth(
    store: &outboxd::store::Store,
    h: Holder<'_>,
    ids: &[i64],
) {
    assert_eq!(store.record_published(h, &ids[..2]).await.unwrap(), 2);
    let failure = Failure {
        id: ids[3],
        error: "unroutable",
        policy: policy(1, 10.0),
    };
    let recorded = store
        .record_failure(h, &ids[2..3], Some(failure))
        .await
        .unwrap();
    assert_eq!((recorded.published, recorded.parked), (1, Some(true)));
}

/// Records: published rows are never claimed again; a row failing its last
/// allowed attempt is parked, listed as failed, can be requeued (and is
/// claimed again) or dropped, each under the audit actor.
async fn records_publish_park_requeue_and_drop(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let ids = fill(&env, "p07", 5, "records").await;

    let h = holder("p07");
    let batch = store.claim(claim(h, 5, &[])).await.unwrap();
    assert_eq!(ids_of(&batch), ids);
    publish_three_and_park_the_fourth(store, h, &ids).await;
    store.release_claim("p07", h.token).await.unwrap();
    assert_eq!(env.count("published_at IS NOT NULL").await, 3);

    let failed = store
        .list_messages(MessageState::Failed, None, None, 10)
        .await
        .unwrap();
    assert_eq!(failed.iter().map(|m| m.id).collect::<Vec<_>>(), [ids[3]]);
    assert_eq!(failed[0].last_error.as_deref(), Some("unroutable"));
    assert!(failed[0].failed_at.is_some());
    let parked = store.parked_in_bucket("p07", 10).await.unwrap();
    assert_eq!(parked.len(), 1);

    // A parked row is out of the way: the rest of its bucket goes on.
    let h2 = holder("p07");
    let next = store.claim(claim(h2, 10, &[])).await.unwrap();
    assert_eq!(ids_of(&next), [ids[4]]);
    assert_eq!(store.release_claim("p07", h2.token).await.unwrap(), 1);

    let requeued = store.requeue(&[ids[3]], &[], false, "test").await.unwrap();
    assert_eq!(requeued, [ids[3]]);
    assert!(
        store
            .list_messages(MessageState::Failed, None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let pending = store
        .list_messages(MessageState::Pending, None, None, 10)
        .await
        .unwrap();
    assert!(pending.iter().any(|m| m.id == ids[3]));

    // Park it again and drop it.
    env.db
        .exec(&format!(
            "UPDATE outbox SET failed_at = {}, last_error = 'x' WHERE id = {}",
            env.db.now(),
            ids[3]
        ))
        .await;
    let dropped = store
        .drop_parked(&[ids[3]], "test", "no longer wanted")
        .await
        .unwrap();
    assert_eq!(dropped, [ids[3]]);
    assert!(store.message_detail(ids[3]).await.unwrap().is_none());
    let detail = store.message_detail(ids[0]).await.unwrap().unwrap();
    assert!(detail.summary.published_at.is_some());
}

/// Records that delete (`outbox.keep_published = false`): a published row
/// is gone, under the same checks as a kept one — a stranger's token or a
/// superseded lease deletes nothing, a row recorded twice counts once, a
/// parked row stays — and the rest of the bucket is claimed in order.
async fn deleting_records_take_published_rows_away_under_the_same_fence(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let ids = fill(&env, "p07", 6, "deleting").await;
    let owner = Uuid::new_v4();
    let bucket = vec!["p07".to_string()];
    let lease = store
        .acquire(owner, &bucket, LEASE_TTL, "test")
        .await
        .unwrap();
    let h = Holder {
        partition_key: "p07",
        token: ClaimToken::new(),
        fence: Some(Fence {
            owner,
            epoch: lease[0].lease_epoch,
        }),
        published: Published::Deleted,
    };
    assert_eq!(
        ids_of(&store.claim(claim(h, 5, &[])).await.unwrap()),
        ids[..5]
    );

    let stranger = Holder {
        token: ClaimToken::new(),
        ..h
    };
    assert_eq!(store.record_published(stranger, &ids).await.unwrap(), 0);
    publish_three_and_park_the_fourth(store, h, &ids).await;
    assert_eq!(store.record_published(h, &ids[..2]).await.unwrap(), 0);
    assert_eq!(env.all_ids().await, ids[3..]);
    assert_eq!(env.count("published_at IS NOT NULL").await, 0);
    assert!(store.message_detail(ids[0]).await.unwrap().is_none());
    assert!(
        store
            .list_messages(MessageState::Published, None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // The lease moves on: the old holder's records delete nothing more.
    env.db
        .exec(&format!(
            "UPDATE outbox_partitions SET lease_until = {} WHERE partition_key = 'p07'",
            env.db.now_plus(-1)
        ))
        .await;
    let next_owner = Uuid::new_v4();
    let taken = store
        .acquire(next_owner, &bucket, LEASE_TTL, "test")
        .await
        .unwrap();
    assert_eq!(store.record_published(h, &ids[4..]).await.unwrap(), 0);
    let next = Holder {
        partition_key: "p07",
        token: ClaimToken::new(),
        fence: Some(Fence {
            owner: next_owner,
            epoch: taken[0].lease_epoch,
        }),
        published: Published::Deleted,
    };
    store
        .clear_claims("p07", next.fence.unwrap())
        .await
        .unwrap();
    let rest = store.claim(claim(next, 10, &[])).await.unwrap();
    assert_eq!(ids_of(&rest), ids[4..]);
    assert_eq!(store.record_published(next, &ids[4..]).await.unwrap(), 2);
    assert_eq!(env.all_ids().await, [ids[3]], "only the parked row is left");
}

/// Leases: acquire takes only free or expired buckets and bumps the
/// epoch; renew and release match owner and epoch; every change of owner
/// is a lease event, readable by id and by age.
async fn leases_change_hands_only_under_their_conditions_and_on_record(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let (me, other) = (Uuid::new_v4(), Uuid::new_v4());
    let both = vec!["p01".to_string(), "p02".to_string()];
    let mine = store.acquire(me, &both, LEASE_TTL, "test").await.unwrap();
    let epochs: BTreeMap<String, i64> = mine
        .iter()
        .map(|a| (a.partition_key.clone(), a.lease_epoch))
        .collect();
    assert_eq!(epochs.len(), 2);
    assert!(mine.iter().all(|a| a.was_free), "{mine:?}");
    // One event per bucket taken, in label order, saying who took it from
    // whom and at which epochs.
    let taken = store.events_since(0, 10).await.unwrap();
    let seen: Vec<_> = taken
        .iter()
        .map(|e| {
            let epochs = (e.old_epoch, e.new_epoch);
            (
                e.partition_key.as_str(),
                e.action.as_str(),
                e.worker_id,
                e.old_owner,
                epochs,
            )
        })
        .collect();
    let took = |bucket: &'static str| {
        let epochs = (epochs[bucket] - 1, epochs[bucket]);
        (bucket, "acquire", me, None, epochs)
    };
    assert_eq!(seen, [took("p01"), took("p02")]);
    assert_eq!(taken[0].reason, "free: test");
    assert!(
        store
            .acquire(other, &both, LEASE_TTL, "test")
            .await
            .unwrap()
            .is_empty(),
        "held leases are not taken"
    );
    let p01 = ("p01".to_string(), epochs["p01"]);
    let p02 = ("p02".to_string(), epochs["p02"]);
    assert_eq!(
        store
            .renew(me, std::slice::from_ref(&p01), LEASE_TTL)
            .await
            .unwrap(),
        ["p01"]
    );
    assert!(
        store
            .renew(me, &[("p01".into(), p01.1 + 1)], LEASE_TTL)
            .await
            .unwrap()
            .is_empty(),
        "a renewal under another epoch matches nothing"
    );
    assert!(
        store
            .renew(other, std::slice::from_ref(&p01), LEASE_TTL)
            .await
            .unwrap()
            .is_empty()
    );
    // A renewal that beats too: on PostgreSQL and MariaDB it pushes the
    // worker row's heartbeat in the same statement; on SQLite, and for a
    // worker without a row, it renews alone and says so.
    let beat_ttl = Duration::from_secs(40);
    // A lease's time left, to see a renewal extend it (not only list it).
    let lease_left = |bucket: &'static str| async move {
        let buckets = store.overview(10).await.unwrap();
        let view = buckets.iter().find(|b| b.partition_key == bucket).unwrap();
        view.lease_ttl_seconds.unwrap()
    };
    assert_eq!(
        store
            .renew_and_beat(
                me,
                std::slice::from_ref(&p01),
                Duration::from_secs(60),
                beat_ttl
            )
            .await
            .unwrap(),
        (vec!["p01".to_string()], false),
        "no worker row, no beat"
    );
    assert!(
        lease_left("p01").await > 50.0,
        "renewed without a worker row"
    );
    let registration = Registration {
        worker_id: me,
        hostname: "host-1",
        name: "host-1:1",
        mode: WorkerMode::Leasing,
        heartbeat_ttl: Duration::from_secs(5),
        can_publish: true,
    };
    store.register(registration, &|_| true).await.unwrap();
    let (renewed, beat) = store
        .renew_and_beat(me, std::slice::from_ref(&p01), LEASE_TTL, beat_ttl)
        .await
        .unwrap();
    assert_eq!((renewed, beat), (vec!["p01".to_string()], db != Db::Sqlite));
    let row = store.list_workers().await.unwrap();
    let ttl_left = row
        .iter()
        .find(|w| w.worker_id == me)
        .unwrap()
        .heartbeat_ttl_seconds;
    if beat {
        assert!(ttl_left > 30.0, "the beat left {ttl_left} s, not ~40");
    } else {
        // SQLite's seconds between two times go through `julianday`, a
        // double of days: tens of microseconds off (CI saw 5.000013).
        assert!(ttl_left < 5.001, "{ttl_left} s left of a 5 s heartbeat");
    }
    // Fewer leases renewed than listed: what was renewed and whether the
    // row was beaten are told apart (MariaDB reads back the leases).
    let sorted = |(mut renewed, beat): (Vec<String>, bool)| {
        renewed.sort();
        (renewed, beat)
    };
    let beats = db != Db::Sqlite;
    let stale = ("p02".to_string(), p02.1 + 1);
    for (held, renewed, ttl) in [
        (vec![p01.clone(), p02.clone()], vec!["p01", "p02"], 120),
        (vec![p01.clone(), stale], vec!["p01"], 180),
    ] {
        let got = store
            .renew_and_beat(me, &held, Duration::from_secs(ttl), beat_ttl)
            .await
            .unwrap();
        assert_eq!(
            sorted(got),
            (renewed.iter().map(|b| b.to_string()).collect(), beats)
        );
        assert!(lease_left("p01").await > ttl as f64 - 10.0);
    }
    assert_eq!(
        store
            .renew_and_beat(other, &[p01.clone(), p02.clone()], LEASE_TTL, beat_ttl)
            .await
            .unwrap(),
        (Vec::new(), false),
        "a stranger without a row renews nothing and beats nothing"
    );
    assert_eq!(
        store
            .release_leases(me, std::slice::from_ref(&p02), "test")
            .await
            .unwrap(),
        ["p02"]
    );
    let taken = store
        .acquire(other, &both, LEASE_TTL, "test")
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(
        (taken[0].partition_key.as_str(), taken[0].lease_epoch),
        ("p02", p02.1 + 1)
    );
    let leases = store.leases().await.unwrap();
    let owner = |b: &str| {
        leases
            .iter()
            .find(|l| l.partition_key == b)
            .unwrap()
            .lease_owner
    };
    assert_eq!((owner("p01"), owner("p02")), (Some(me), Some(other)));
    assert_eq!(store.release_all_leases(me, "bye").await.unwrap(), ["p01"]);

    let events = store.events_since(0, 100).await.unwrap();
    let summary: Vec<(String, String, Uuid, i64)> = events
        .iter()
        .map(|e| {
            (
                e.action.clone(),
                e.partition_key.clone(),
                e.worker_id,
                e.new_epoch,
            )
        })
        .collect();
    assert_eq!(summary.len(), 5, "{summary:?}");
    assert_eq!(summary.iter().filter(|e| e.0 == "acquire").count(), 3);
    assert_eq!(summary.iter().filter(|e| e.0 == "release").count(), 2);
    assert!(events.windows(2).all(|w| w[0].id < w[1].id));
    let later = store.events_since(events[2].id, 100).await.unwrap();
    assert_eq!(later.len(), 2);
    let recent = store.events_within(60.0, 100).await.unwrap();
    assert_eq!(recent.len(), 5);
}

/// Membership: a registered worker is live while it heartbeats, listed with
/// its broker state; admission sees the live others and may refuse; a
/// removed or expired row is gone.
async fn workers_join_heartbeat_and_leave(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let registration = |worker_id| Registration {
        worker_id,
        hostname: "host-1",
        name: if worker_id == a {
            "billing-1"
        } else {
            "host-1:7"
        },
        mode: WorkerMode::Leasing,
        heartbeat_ttl: Duration::from_secs(30),
        can_publish: true,
    };
    // The workers table's fingerprint, read with a poll: it changes with
    // the rows (a join, a leave, a step aside or back, a heartbeat late or
    // near its end — WATCH), not with heartbeats on time, and the same rows
    // give the same text.
    let polled = || async {
        let (ready, fleet) = store
            .ready_buckets_and_fleet(&["p01".to_string()], WATCH)
            .await
            .unwrap();
        assert!(ready.is_empty(), "no row in p01");
        assert!(!fleet.is_empty(), "a fingerprint is always read");
        let looked = store.pending_and_fleet(&["p01".to_string()], WATCH).await;
        assert_eq!(
            looked.unwrap(),
            (false, fleet.clone()),
            "the idle look reads the same"
        );
        fleet
    };
    let empty = polled().await;
    let joined = store.register(registration(a), &|_| true).await.unwrap();
    assert!(matches!(joined, Joined::Registered));
    let just_a = polled().await;
    assert_ne!(just_a, empty, "a join changes the fingerprint");
    let refused = store
        .register(registration(b), &|live| live.is_empty())
        .await
        .unwrap();
    match refused {
        Joined::Refused(live) => {
            assert_eq!(live.len(), 1);
            assert_eq!(live[0].worker_id, a);
            assert_eq!(live[0].hostname, "host-1");
            assert_eq!(live[0].name, "billing-1");
        }
        Joined::Registered => panic!("admission saw no live worker"),
    }
    assert!(matches!(
        store.register(registration(b), &|_| true).await.unwrap(),
        Joined::Registered
    ));
    let counts = WorkerCounts {
        published_total: 42,
        failed_total: 1,
        published_rate: 2.5,
        bucket_activity: "p01=2.50".into(),
        destinations: r#"[{"kind":"stream","name":"orders","delivered":42,"rate":2.5}]"#.into(),
    };
    // A heartbeat on time (30 s), as the worker's task writes it.
    let beat = |worker| {
        let counts = counts.clone();
        async move {
            store
                .heartbeat(worker, Duration::from_secs(30), counts)
                .await
                .unwrap()
        }
    };
    let a_and_b = polled().await;
    assert!(![&empty, &just_a].contains(&&a_and_b), "a second join too");
    assert!(beat(a).await);
    assert_eq!(polled().await, a_and_b, "a heartbeat changes nothing");
    assert!(
        store
            .set_broker_state(a, false, Some("broker away"))
            .await
            .unwrap()
    );
    let a_aside = polled().await;
    assert_ne!(a_aside, a_and_b, "stepping aside changes the fingerprint");
    store
        .set_broker_blocked(a, Some("disk alarm"))
        .await
        .unwrap();
    // A worker that cannot publish takes no part in the targets.
    assert_eq!(
        store.live_leasing(Uuid::nil(), SUSPECT_NONE).await.unwrap(),
        [b]
    );
    assert!(store.set_broker_state(a, true, None).await.unwrap());
    assert_eq!(polled().await, a_and_b, "back in: the same rows again");
    let mut live = store.live_leasing(Uuid::nil(), SUSPECT_NONE).await.unwrap();
    live.sort();
    let mut both = vec![a, b];
    both.sort();
    assert_eq!(live, both);
    let others = store.live_others(a).await.unwrap();
    assert_eq!(others.iter().map(|w| w.worker_id).collect::<Vec<_>>(), [b]);

    // A worker whose heartbeat is late (older than SUSPECT; its row not
    // expired yet) and that holds no valid lease — a dead one — takes no
    // part in the targets, and stays out once others took its buckets; a
    // valid lease, or a heartbeat on time, and it does.
    const SUSPECT: Duration = Duration::from_secs(60);
    let live_sorted = || async {
        let mut live = store.live_leasing(Uuid::nil(), SUSPECT).await.unwrap();
        live.sort();
        live
    };
    let buckets = vec!["p01".to_string(), "p02".to_string()];
    store.acquire(a, &buckets, LEASE_TTL, "test").await.unwrap();
    let late = format!(
        "UPDATE outbox_workers SET heartbeat_at = {} WHERE name = 'billing-1'",
        env.db.now_plus(-3600)
    );
    assert_eq!(env.db.exec(&late).await, 1);
    let a_late = polled().await;
    assert_ne!(a_late, a_and_b, "a late heartbeat marks its row");
    let lapse = |bucket: &'static str| {
        let env = &env;
        async move {
            env.db
                .exec(&format!(
                    "UPDATE outbox_partitions SET lease_until = {} WHERE partition_key = '{bucket}'",
                    env.db.now_plus(-1)
                ))
                .await;
        }
    };
    assert_eq!(live_sorted().await, both, "late, but its leases are valid");
    // How long the list stands: zero while a member is late but counted;
    // else until the first other could be left out — here b's heartbeat,
    // 30 s from its registration, runs out before it is 60 s late.
    let stands = |me| async move {
        let m = store.membership(me, SUSPECT).await.unwrap();
        m.stable_for.expect("another member")
    };
    assert_eq!(stands(b).await, Duration::ZERO, "a is late: read again");
    let for_a = stands(a).await;
    assert!(
        for_a > Duration::from_secs(20) && for_a <= Duration::from_secs(30),
        "b's heartbeat expires first: {for_a:?}"
    );
    lapse("p01").await;
    assert_eq!(
        live_sorted().await,
        both,
        "one of its leases is still valid"
    );
    lapse("p02").await;
    assert_eq!(live_sorted().await, [b], "late, every lease lapsed");
    let mut asked_by_a = store.live_leasing(a, SUSPECT).await.unwrap();
    asked_by_a.sort();
    assert_eq!(asked_by_a, both, "a worker never leaves itself out");
    assert_eq!(
        store
            .live_leasing(Uuid::nil(), Duration::from_secs(7200))
            .await
            .unwrap()
            .len(),
        2,
        "a heartbeat younger than the bound is on time"
    );
    let taken = store.acquire(b, &buckets, LEASE_TTL, "test").await.unwrap();
    assert_eq!(taken.len(), 2);
    assert_eq!(
        live_sorted().await,
        [b],
        "out while others hold its buckets"
    );
    assert!(beat(a).await);
    assert_eq!(live_sorted().await, both, "its heartbeat on time again");
    assert_eq!(polled().await, a_and_b, "and its mark is gone");
    let ending = format!(
        "UPDATE outbox_workers SET heartbeat_until = {} WHERE name = 'host-1:7'",
        env.db.now_plus(5)
    );
    assert_eq!(env.db.exec(&ending).await, 1);
    let b_ending = polled().await;
    assert!(
        ![&a_and_b, &a_late].contains(&&b_ending),
        "a heartbeat near its end marks its row"
    );
    assert!(beat(b).await);
    assert_eq!(polled().await, a_and_b, "beating again: unmarked");
    let held: Vec<(String, i64)> = taken
        .iter()
        .map(|l| (l.partition_key.clone(), l.lease_epoch))
        .collect();
    assert_eq!(
        store.release_leases(b, &held, "test").await.unwrap().len(),
        2
    );

    let view = store.list_workers().await.unwrap();
    let va = view.iter().find(|w| w.worker_id == a).unwrap();
    assert_eq!(va.mode, "leasing");
    assert_eq!(va.name, "billing-1");
    assert!(
        va.heartbeat_ttl_seconds > 20.0,
        "{}",
        va.heartbeat_ttl_seconds
    );
    assert_eq!(va.broker_blocked.as_deref(), Some("disk alarm"));
    // The heartbeat's bucket activity is read back as written.
    assert_eq!(va.bucket_activity.as_deref(), Some("p01=2.50"));
    // And what it delivered where.
    let delivered = outboxd::sink::destinations::parse(va.destinations.as_deref());
    assert_eq!(
        (
            delivered[0].name.as_str(),
            delivered[0].delivered,
            delivered[0].rate
        ),
        ("orders", 42, 2.5)
    );

    store.remove_worker(a).await.unwrap();
    let just_b = polled().await;
    assert!(
        ![&a_and_b, &just_a, &empty].contains(&&just_b),
        "a leave changes the fingerprint"
    );
    assert!(!beat(a).await);
    // b's heartbeat runs out: it is no longer live, and the sweep removes it.
    assert!(
        store
            .heartbeat(b, Duration::from_millis(200), counts.clone())
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let nobody = store.membership(Uuid::nil(), SUSPECT_NONE).await.unwrap();
    assert!(nobody.live.is_empty());
    assert_eq!(nobody.stable_for, None, "no member to wait for");
    assert_eq!(store.remove_dead(Duration::ZERO).await.unwrap(), 1);
    assert!(store.list_workers().await.unwrap().is_empty());
}

/// Repartitioning re-labels every unpublished row by its key's bucket under
/// the new count (ids, and so each key's order, unchanged), refuses while a
/// worker is live, and a dry run changes nothing; rows a stream holds are
/// recorded published first and keep their label; a row with a label that
/// is not a bucket is parked with an error naming the right one.
async fn repartitioning_relabels_by_key_and_unknown_labels_are_parked(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let keys: Vec<String> = (0..40).map(|i| format!("rk-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        env.db
            .enqueue(Message::new(k.clone(), "", "q", i.to_string()))
            .await;
    }
    let before: Vec<(i64, String)> = env
        .db
        .rows("SELECT id, message_key FROM outbox ORDER BY id")
        .await;

    let w = Uuid::new_v4();
    let registration = Registration {
        worker_id: w,
        hostname: "h",
        name: "h:1",
        mode: WorkerMode::Leasing,
        heartbeat_ttl: Duration::from_secs(30),
        can_publish: true,
    };
    store.register(registration, &|_| true).await.unwrap();
    match store
        .repartition(32, false, "test", &[], Published::Kept)
        .await
    {
        Err(RepartitionError::WorkersLive(live)) => assert_eq!(live[0].worker_id, w),
        other => panic!("a repartition with a live worker: {other:?}"),
    }
    store.remove_worker(w).await.unwrap();

    // A bucket's pending rows up to an id, by id.
    let labels_16 = Partitioner::new(16);
    let bucket = labels_16.label_for(&before[0].1);
    let of_bucket: Vec<i64> = before
        .iter()
        .filter(|(_, key)| labels_16.label_for(key) == bucket)
        .map(|(id, _)| *id)
        .collect();
    let ids = |rows: Vec<MessageSummary>| rows.iter().map(|m| m.id).collect::<Vec<_>>();
    let all = store.pending_up_to(&bucket, i64::MAX).await.unwrap();
    assert_eq!(ids(all), of_bucket);
    let first = store.pending_up_to(&bucket, of_bucket[0]).await.unwrap();
    assert_eq!(ids(first), of_bucket[..1]);

    // Two rows a stream holds (found by the caller), one moved by the new
    // count and one not (rk-0's row stays pending for the end).
    let labels_32 = Partitioner::new(32);
    let moves = |key: &str| labels_16.label_for(key) != labels_32.label_for(key);
    let stored = [
        before[1..].iter().find(|(_, key)| moves(key)).unwrap().0,
        before[1..].iter().find(|(_, key)| !moves(key)).unwrap().0,
    ];
    let dry = store
        .repartition(32, true, "test", &stored, Published::Kept)
        .await
        .unwrap();
    assert_eq!((dry.from, dry.to, dry.unpublished), (16, 32, 40));
    assert_eq!(dry.recorded_stored, 2);
    assert!(dry.relabelled > 0);
    assert_eq!(env.count("published_at IS NULL").await, 40);
    let unchanged: Vec<(i64, String)> = env
        .db
        .rows("SELECT id, partition_key FROM outbox ORDER BY id")
        .await;
    for ((_, key), (_, label)) in before.iter().zip(&unchanged) {
        assert_eq!(
            *label,
            labels_16.label_for(key),
            "a dry run changes nothing"
        );
    }

    let done = store
        .repartition(32, false, "test", &stored, Published::Kept)
        .await
        .unwrap();
    assert_eq!((done.unpublished, done.recorded_stored), (38, 2));
    assert_eq!(
        done.relabelled,
        dry.relabelled - 1,
        "the stored row keeps its label"
    );
    let after: Vec<(i64, String, String)> = env
        .db
        .rows("SELECT id, message_key, partition_key FROM outbox ORDER BY id")
        .await;
    assert_eq!(
        after.iter().map(|r| r.0).collect::<Vec<_>>(),
        before.iter().map(|r| r.0).collect::<Vec<_>>(),
        "ids, and so each key's order, are unchanged"
    );
    for (id, key, label) in &after {
        match stored.contains(id) {
            true => assert_eq!(*label, labels_16.label_for(key), "{key}"),
            false => assert_eq!(*label, labels_32.label_for(key), "{key}"),
        }
    }
    let published: Vec<(i64,)> = env
        .db
        .rows("SELECT id FROM outbox WHERE published_at IS NOT NULL ORDER BY id")
        .await;
    let mut expected = stored.to_vec();
    expected.sort();
    assert_eq!(published.iter().map(|r| r.0).collect::<Vec<_>>(), expected);
    // A bucket row per label of the new count.
    assert_eq!(store.leases().await.unwrap().len(), 32);

    // A label that is not one of the 32 buckets.
    env.db
        .exec("UPDATE outbox SET partition_key = 'p77' WHERE message_key = 'rk-0'")
        .await;
    let parked = store.park_unknown_labels().await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].partition_key, "p77");
    let detail = store.message_detail(parked[0].id).await.unwrap().unwrap();
    let error = detail.summary.last_error.unwrap();
    assert!(error.contains("unknown bucket label p77"), "{error}");
    assert!(error.contains(&labels_32.label_for("rk-0")), "{error}");

    // With `outbox.keep_published = false` a row a stream holds is
    // deleted, as a drainer deletes what it publishes.
    let pending: Vec<(i64,)> = env
        .db
        .rows("SELECT id FROM outbox WHERE published_at IS NULL AND failed_at IS NULL ORDER BY id")
        .await;
    let held = [pending[0].0];
    let done = store
        .repartition(16, false, "test", &held, Published::Deleted)
        .await
        .unwrap();
    assert_eq!(done.recorded_stored, 1);
    assert_eq!(env.count(&format!("id = {}", held[0])).await, 0);
    assert_eq!(env.count("true").await, 39);
}

async fn writes_under_a_superseded_lease_match_zero_rows(db: Db) {
    let env = TestEnv::on(db).await;
    let store = &env.store;
    let key = keys_in_bucket(env.partitioner(), "p04", 1, "fence")[0].clone();
    for i in 0..5 {
        env.db
            .enqueue(Message::new(key.clone(), "", "q", i.to_string()))
            .await;
    }
    let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
    let bucket = vec!["p04".to_string()];
    let a = store
        .acquire(old, &bucket, LEASE_TTL, "test")
        .await
        .unwrap();
    let old_fence = Fence {
        owner: old,
        epoch: a[0].lease_epoch,
    };
    let old_holder = Holder {
        partition_key: "p04",
        token: ClaimToken::new(),
        fence: Some(old_fence),
        published: Default::default(),
    };
    let claim = |holder, limit| Claim {
        holder,
        limit,
        claim_ttl: Duration::from_secs(15),
        min_left: Duration::from_secs(11),
        in_flight: &[],
        held: false,
    };
    let claimed = store.claim(claim(old_holder, 2)).await.unwrap();
    assert_eq!(claimed.len(), 2);

    // The old owner stalls past its lease; another worker takes over.
    env.db
        .exec(&format!(
            "UPDATE outbox_partitions SET lease_until = {} WHERE partition_key = 'p04'",
            env.db.now_plus(-1)
        ))
        .await;
    let b = store
        .acquire(new, &bucket, LEASE_TTL, "test")
        .await
        .unwrap();
    assert_eq!(b[0].lease_epoch, old_fence.epoch + 1);
    assert!(a[0].was_free && !b[0].was_free, "free, then taken over");
    let new_fence = Fence {
        owner: new,
        epoch: b[0].lease_epoch,
    };
    assert_eq!(
        store.clear_claims("p04", new_fence).await.unwrap(),
        1,
        "the old owner's claim on the bucket is dropped"
    );

    // Every write of the old owner now matches 0 rows.
    let ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
    assert_eq!(store.record_published(old_holder, &ids).await.unwrap(), 0);
    let failure = Failure {
        id: ids[0],
        error: "x",
        policy: FailurePolicy {
            max_attempts: 0,
            may_park: false,
            backoff_initial_ms: 1000.0,
            backoff_max_ms: 1000.0,
        },
    };
    let recorded = store
        .record_failure(old_holder, &ids[1..], Some(failure))
        .await
        .unwrap();
    assert_eq!((recorded.published, recorded.parked), (0, None));
    let fresh_old = Holder {
        token: ClaimToken::new(),
        ..old_holder
    };
    assert!(store.claim(claim(fresh_old, 10)).await.unwrap().is_empty());
    assert!(
        store
            .renew(old, &[("p04".into(), old_fence.epoch)], LEASE_TTL)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .release_leases(old, &[("p04".into(), old_fence.epoch)], "x")
            .await
            .unwrap()
            .is_empty()
    );
    // The new owner claims the whole bucket from its head, in order.
    let new_holder = Holder {
        partition_key: "p04",
        token: ClaimToken::new(),
        fence: Some(new_fence),
        published: Default::default(),
    };
    let fresh = store.claim(claim(new_holder, 10)).await.unwrap();
    assert_eq!(fresh.len(), 5);
    assert_eq!(fresh[0].id, ids[0]);
    assert_eq!(env.count("published_at IS NOT NULL").await, 0);
    assert_eq!(env.count("attempts > 0").await, 0);
    // Both changes of owner are on record.
    let events = store.events_since(0, 10).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].old_owner, Some(old));
    assert!(
        events[1].reason.contains("expired lease of"),
        "{}",
        events[1].reason
    );
}

/// Lease takes and renewals racing on every bucket: six "workers" (each its
/// own pool) acquire, renew and release all 16 buckets in a loop with
/// 150 ms leases, so leases expire and change hands all the time. No
/// (bucket, epoch) is ever acquired by two owners — neither in what
/// `acquire` returned nor in the lease events — and each bucket's epochs
/// only go up.
async fn concurrent_lease_takes_and_renewals_never_give_one_epoch_to_two_owners(db: Db) {
    let env = TestEnv::on(db).await;
    let labels = env.partitioner().labels();
    let mut direct = env.config.clone();
    direct.database.url = env.db_url.clone();
    direct.database.pooler = Default::default();
    let ttl = Duration::from_millis(150);
    let until = Instant::now() + Duration::from_secs(6);
    let mut tasks = Vec::new();
    for w in 0..6u64 {
        let store = outboxd::store::Store::connect(
            &outboxd::store::StoreSettings::from_config(&direct),
            "outboxd test",
        )
        .await
        .unwrap();
        let labels = labels.clone();
        tasks.push(tokio::spawn(async move {
            let me = Uuid::new_v4();
            let mut taken: Vec<(String, i64)> = Vec::new();
            let mut held: Vec<(String, i64)> = Vec::new();
            let mut renewed = 0usize;
            let mut round = 0u64;
            while Instant::now() < until {
                round += 1;
                for a in store.acquire(me, &labels, ttl, "race").await.unwrap() {
                    taken.push((a.partition_key.clone(), a.lease_epoch));
                    held.push((a.partition_key, a.lease_epoch));
                }
                let kept = store.renew(me, &held, ttl).await.unwrap();
                renewed += kept.len();
                held.retain(|(b, _)| kept.contains(b));
                // Now and then let some go on purpose, or stall past the TTL.
                if (round + w).is_multiple_of(7) {
                    let half: Vec<_> = held.iter().take(held.len() / 2).cloned().collect();
                    store.release_leases(me, &half, "race").await.unwrap();
                    held.retain(|h| !half.contains(h));
                } else if (round + w).is_multiple_of(11) {
                    tokio::time::sleep(ttl * 2).await;
                }
            }
            store.release_all_leases(me, "race over").await.unwrap();
            store.close().await;
            (me, taken, renewed)
        }));
    }
    let mut owners: BTreeMap<(String, i64), Uuid> = BTreeMap::new();
    let (mut acquisitions, mut renewals) = (0, 0);
    for t in tasks {
        let (me, taken, renewed) = t.await.unwrap();
        renewals += renewed;
        for key in taken {
            acquisitions += 1;
            if let Some(other) = owners.insert(key.clone(), me) {
                panic!("{key:?} acquired by {other} and by {me}");
            }
        }
    }
    let twice: Vec<(String, i64)> = env
        .db
        .rows(
            "SELECT partition_key, new_epoch FROM outbox_lease_events WHERE action = 'acquire'
             GROUP BY partition_key, new_epoch HAVING count(*) > 1",
        )
        .await;
    let events: Vec<(String, i64)> = env
        .db
        .rows(
            "SELECT partition_key, new_epoch FROM outbox_lease_events
             WHERE action = 'acquire' ORDER BY id",
        )
        .await;
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for (bucket, epoch) in &events {
        let before = last.insert(bucket.clone(), *epoch).unwrap_or(0);
        assert!(*epoch > before, "{bucket}: epoch {epoch} after {before}");
    }
    println!(
        "lease race on {}: {acquisitions} acquisitions, {renewals} renewals by 6 workers; \
         0 epochs held twice",
        db.name()
    );
    assert!(twice.is_empty(), "epochs acquired twice: {twice:?}");
    assert_eq!(events.len(), acquisitions);
    assert!(acquisitions > 100, "too few hand-overs to prove anything");
}

/// Each backend reads its own errors (its `ErrorDialect`), shown here on
/// real errors of the real database: a statement on a table that is gone
/// is refused for good and says what was being done; an answer retrying
/// may get past — a read-only transaction (a standby, a switchover) on
/// PostgreSQL, a lock wait that ran out on MariaDB, a busy file on SQLite
/// — is transient; PostgreSQL's own statement time limit is a
/// cancellation, not a transient error.
async fn errors_read_as_their_database_says(db: Db) {
    use outboxd::store::{ErrorDialect, StoreError};
    let env = TestEnv::on(db).await;
    env.db.exec("DROP TABLE outbox_settings").await;
    let e = env
        .store
        .partition_count()
        .await
        .expect_err("no settings table");
    assert!(!e.is_transient() && !e.is_permanent(), "{e}");
    assert!(e.to_string().contains("reading partition_count"), "{e}");

    let refused = |dialect: &'static ErrorDialect, source: sqlx::Error| {
        StoreError::query(dialect, "testing", source)
    };
    let update =
        "UPDATE outbox_partitions SET lease_epoch = lease_epoch WHERE partition_key = 'p00'";
    let transient = match &env.db {
        TestDb::Pg(pool) => {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SET TRANSACTION READ ONLY")
                .execute(&mut *tx)
                .await
                .unwrap();
            let source = sqlx::query(update)
                .execute(&mut *tx)
                .await
                .expect_err("read only");
            tx.rollback().await.unwrap();
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SET LOCAL statement_timeout = 50")
                .execute(&mut *tx)
                .await
                .unwrap();
            let slow = sqlx::query("SELECT pg_sleep(2)").execute(&mut *tx).await;
            let cancelled = refused(&outboxd::store::postgres::ERRORS, slow.expect_err("limit"));
            assert!(
                cancelled.is_cancelled() && !cancelled.is_transient(),
                "{cancelled}"
            );
            refused(&outboxd::store::postgres::ERRORS, source)
        }
        TestDb::My(pool) => {
            let mut holder = pool.begin().await.unwrap();
            sqlx::query(update).execute(&mut *holder).await.unwrap();
            let mut waiter = pool.acquire().await.unwrap();
            sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
                .execute(&mut *waiter)
                .await
                .unwrap();
            let source = sqlx::query(update)
                .execute(&mut *waiter)
                .await
                .expect_err("lock wait");
            holder.rollback().await.unwrap();
            refused(&outboxd::store::mysql::ERRORS, source)
        }
        TestDb::Lite(pool) => {
            let mut holder = pool.acquire().await.unwrap();
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut *holder)
                .await
                .unwrap();
            let impatient = {
                use std::str::FromStr;
                sqlx::sqlite::SqliteConnectOptions::from_str(&env.db_url)
                    .unwrap()
                    .busy_timeout(Duration::ZERO)
            };
            let mut other = sqlx::ConnectOptions::connect(&impatient).await.unwrap();
            let source = sqlx::query(update)
                .execute(&mut other)
                .await
                .expect_err("busy");
            sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
            refused(&outboxd::store::sqlite::ERRORS, source)
        }
    };
    assert!(
        transient.is_transient() && !transient.is_cancelled(),
        "{transient}"
    );
}

on_every_store!(
    claims_take_the_head_in_id_order_one_claim_at_a_time,
    a_held_claim_is_read_without_a_write_until_it_runs_low,
    a_failing_head_holds_back_only_its_own_bucket,
    records_publish_park_requeue_and_drop,
    deleting_records_take_published_rows_away_under_the_same_fence,
    leases_change_hands_only_under_their_conditions_and_on_record,
    workers_join_heartbeat_and_leave,
    repartitioning_relabels_by_key_and_unknown_labels_are_parked,
    writes_under_a_superseded_lease_match_zero_rows,
    concurrent_lease_takes_and_renewals_never_give_one_epoch_to_two_owners,
    errors_read_as_their_database_says,
);
