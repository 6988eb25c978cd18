//! Fleet mode with real `outboxd work` processes: targets, leases, fencing,
//! handoffs on join, leave, SIGKILL and SIGSTOP.
//!
//! Timings are shortened (lease_ttl 3s, lease_renew 1s, heartbeat_ttl 3s) so
//! expiry-based scenarios run in seconds; the ratios are the defaults'.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::*;
use outboxd::coordinator::assignment::{Assignment, owner_index};
use outboxd::demo::QueueReader;
use outboxd::producer::{Message, Producer};
use outboxd::store::outbox::{ClaimToken, Fence};
use outboxd::store::partitions::LeaseRow;
use uuid::Uuid;

const LEASE_TTL: Duration = Duration::from_secs(3);
const LEASE_RENEW: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_split_16_buckets_by_the_modulo_rule_and_stay_quiet() {
    let env = TestEnv::with(Tuning::fleet()).await;
    let mut workers: Vec<WorkerProcess> = (0..3).map(|_| env.spawn_worker(&["--silent"])).collect();
    let took = wait_converged(&env, 3, Duration::from_secs(15)).await;
    let before = event_count(&env).await;
    let epochs: Vec<i64> = leases(&env).await.iter().map(|l| l.lease_epoch).collect();
    // Three renew periods at steady state: renewals only.
    tokio::time::sleep(3 * LEASE_RENEW + Duration::from_millis(500)).await;
    assert!(converged(&env, 3).await);
    assert_eq!(
        event_count(&env).await,
        before,
        "lease changes at steady state"
    );
    let epochs_after: Vec<i64> = leases(&env).await.iter().map(|l| l.lease_epoch).collect();
    assert_eq!(epochs, epochs_after);
    println!("3 workers: converged in {took:?}; {before} lease events, none at steady state");
    for w in &mut workers {
        assert!(
            w.terminate(Duration::from_secs(15)).success(),
            "{}",
            w.log_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scaling_1_to_4_to_2_under_load_loses_nothing_and_keeps_key_order() {
    let env = TestEnv::with(Tuning::fleet()).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let producing = tokio::spawn(produce_evenly(
        env.db_url.clone(),
        queue.clone(),
        6_000,
        200,
        Duration::from_secs(15),
    ));

    let mut workers = vec![env.spawn_worker(&["--silent"])];
    let t1 = wait_converged(&env, 1, Duration::from_secs(15)).await;
    workers.extend((0..3).map(|_| env.spawn_worker(&["--silent"])));
    let t4 = wait_converged(&env, 4, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut leaving: Vec<WorkerProcess> = workers.drain(..2).collect();
    let stop = Instant::now();
    for w in &leaving {
        w.signal("TERM");
    }
    let t2 = wait_converged(&env, 2, Duration::from_secs(15)).await;
    for w in &mut leaving {
        assert!(
            w.wait(Duration::from_secs(15)).success(),
            "{}",
            w.log_text()
        );
    }
    let stop_took = stop.elapsed();
    producing.await.unwrap();

    let (all, v) = read_and_judge(&mut reader, &env, 6_000, Duration::from_secs(60)).await;
    println!(
        "scale 1->4->2: converged 1 in {t1:?}, 4 in {t4:?}, 2 in {t2:?} (both leavers exited in {stop_took:?}); \
         {}; lease events {}",
        v.summary(),
        event_count(&env).await
    );
    assert!(all && v.is_clean(), "{v:?}");
    terminate_all(&mut workers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_workers_buckets_are_reowned_with_a_bumped_epoch_and_nothing_is_lost() {
    let env = TestEnv::with(Tuning::fleet()).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let mut workers: Vec<WorkerProcess> = (0..3).map(|_| env.spawn_worker(&["--silent"])).collect();
    wait_converged(&env, 3, Duration::from_secs(15)).await;
    let producing = tokio::spawn(produce_evenly(
        env.db_url.clone(),
        queue.clone(),
        4_000,
        200,
        Duration::from_secs(8),
    ));
    env.wait_count("published_at IS NOT NULL", 500, Duration::from_secs(20))
        .await;

    let victim = workers.remove(0);
    let victim_id = worker_id_of(&env, &victim).await;
    let before = held_by(&env, victim_id).await;
    assert!(!before.is_empty());
    victim.signal("KILL");
    let killed = Instant::now();
    // Re-owned: every bucket it held is validly leased by another worker
    // under a higher epoch.
    loop {
        let now: BTreeMap<String, LeaseRow> = leases(&env)
            .await
            .into_iter()
            .map(|l| (l.partition_key.clone(), l))
            .collect();
        let done = before.iter().all(|(b, e)| {
            let l = &now[b];
            l.valid
                && l.lease_owner.is_some()
                && l.lease_owner != Some(victim_id)
                && l.lease_epoch > *e
        });
        if done {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "not re-owned: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reowned = killed.elapsed();
    drop(victim);
    producing.await.unwrap();
    let (all, v) = read_and_judge(&mut reader, &env, 4_000, Duration::from_secs(60)).await;
    println!(
        "SIGKILL: {} buckets re-owned after {reowned:?} (bound lease_ttl + lease_renew = {:?}); \
         distinct {} duplicates {} lost {} unexpected {} order violations {}",
        before.len(),
        LEASE_TTL + LEASE_RENEW,
        v.unique,
        v.duplicates,
        v.lost.len(),
        v.unexpected.len(),
        v.order_violations.len()
    );
    assert!(all && v.is_clean(), "{v:?}");
    // Duplicates are bounded by the victim's in-flight batches (one batch of
    // at most batch_size per bucket it held).
    assert!(
        v.duplicates <= before.len() as u64 * 100,
        "{} duplicates",
        v.duplicates
    );
    assert!(
        reowned <= LEASE_TTL + LEASE_RENEW + Duration::from_millis(500),
        "re-owned after {reowned:?}"
    );
    terminate_all(&mut workers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_worker_loses_its_buckets_and_after_resuming_publishes_nothing_under_them() {
    let env = TestEnv::with(Tuning::fleet()).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue)
        .await
        .unwrap()
        .keep_log();
    let mut workers: Vec<WorkerProcess> = (0..3)
        .map(|_| env.spawn_worker(&["--json", "--interval-ms", "200"]))
        .collect();
    wait_converged(&env, 3, Duration::from_secs(15)).await;
    let producing = tokio::spawn(produce_evenly(
        env.db_url.clone(),
        queue.clone(),
        4_000,
        200,
        Duration::from_secs(10),
    ));
    env.wait_count("published_at IS NOT NULL", 300, Duration::from_secs(20))
        .await;

    let stopped = workers.remove(0);
    let stopped_id = worker_id_of(&env, &stopped).await;
    let held = held_by(&env, stopped_id).await;
    stopped.signal("STOP");
    let stop_at = Instant::now();
    // Taken over by the others, with bumped epochs.
    loop {
        let now: BTreeMap<String, LeaseRow> = leases(&env)
            .await
            .into_iter()
            .map(|l| (l.partition_key.clone(), l))
            .collect();
        if held.iter().all(|(b, e)| {
            now[b].valid && now[b].lease_owner != Some(stopped_id) && now[b].lease_epoch > *e
        }) {
            break;
        }
        assert!(
            stop_at.elapsed() < Duration::from_secs(20),
            "not taken over: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let taken_over = stop_at.elapsed();
    // Stay stopped for 3 x lease_ttl in all, reading what arrives meanwhile.
    let _ = reader
        .read_until((3 * LEASE_TTL).saturating_sub(stop_at.elapsed()), |_| false)
        .await;
    let seen_before_resume = reader.log.as_ref().unwrap().len();
    stopped.signal("CONT");
    // Let it run on while production continues.
    producing.await.unwrap();
    let all = reader
        .read_until(Duration::from_secs(60), |c| c.unique() >= 4_000)
        .await
        .unwrap();
    let _ = reader.read_until(Duration::from_secs(1), |_| false).await;

    // After the resume, nothing goes out under the leases it lost: it starts
    // nothing after its trust deadline, and frames it had handed to the AMQP
    // client before the stop are held back by the send gate
    // (src/amqp/gate.rs): the connection drops instead of writing them.
    let log = reader.log.as_ref().unwrap();
    let stale: Vec<_> = log[seen_before_resume..]
        .iter()
        .filter(|d| {
            held.get(&d.partition_key)
                .is_some_and(|e| d.lease_epoch == Some(*e))
        })
        .collect();
    let v = reader.checker.verdict(env.all_ids().await);
    println!(
        "SIGSTOP: {} buckets taken over after {taken_over:?}; stopped for {:?}; \
         deliveries under the lost leases after resume: {}; {}",
        held.len(),
        3 * LEASE_TTL,
        stale.len(),
        v.summary()
    );
    assert!(
        stale.is_empty(),
        "published under a lost lease after resuming: {stale:?}; held {held:?}; the stopped worker's log:\n{}",
        stopped.log_text()
    );
    assert!(all && v.is_clean(), "{v:?}");
    let mut stopped = stopped;
    for w in workers.iter_mut().chain(std::iter::once(&mut stopped)) {
        assert!(
            w.terminate(Duration::from_secs(15)).success(),
            "{}",
            w.log_text()
        );
    }
}

#[tokio::test]
async fn writes_under_a_superseded_lease_match_zero_rows() {
    let env = TestEnv::with(Tuning::fleet()).await;
    let (store, t) = (&env.store, &env.store.tables);
    let producer = Producer::default();
    let key = keys_in_bucket(env.partitioner(), "p04", 1, "fence")[0].clone();
    for i in 0..5 {
        producer
            .enqueue(
                &store.pool,
                Message::new(key.clone(), "", "q", i.to_string()),
            )
            .await
            .unwrap();
    }
    let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
    let bucket = vec!["p04".to_string()];
    let a = t
        .partitions
        .acquire(&store.pool, old, &bucket, LEASE_TTL, "test")
        .await
        .unwrap();
    let old_fence = Fence {
        owner: old,
        epoch: a[0].lease_epoch,
    };
    let token = ClaimToken::new();
    let claimed = t
        .outbox
        .claim(&store.pool, "p04", 2, token, 15_000, Some(old_fence), &[])
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);

    // The old owner stalls past its lease; another worker takes over.
    sqlx::query("UPDATE outbox_partitions SET lease_until = now() - interval '1 second' WHERE partition_key = 'p04'")
        .execute(&store.pool)
        .await
        .unwrap();
    let b = t
        .partitions
        .acquire(&store.pool, new, &bucket, LEASE_TTL, "test")
        .await
        .unwrap();
    assert_eq!(b[0].lease_epoch, old_fence.epoch + 1);
    let new_fence = Fence {
        owner: new,
        epoch: b[0].lease_epoch,
    };
    assert_eq!(
        t.outbox
            .clear_claims(&store.pool, "p04", new_fence)
            .await
            .unwrap(),
        1,
        "the old owner's claim on the bucket is dropped"
    );

    // Every write of the old owner now matches 0 rows.
    let ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
    assert_eq!(
        t.outbox
            .record_published(&store.pool, &ids, token, "p04", Some(old_fence))
            .await
            .unwrap(),
        0
    );
    let policy = outboxd::store::outbox::FailurePolicy {
        max_attempts: 0,
        may_park: false,
        backoff_initial_ms: 1000.0,
        backoff_max_ms: 1000.0,
    };
    assert_eq!(
        t.outbox
            .record_failure(
                &store.pool,
                ids[0],
                token,
                "x",
                policy,
                "p04",
                Some(old_fence)
            )
            .await
            .unwrap(),
        None
    );
    assert!(
        t.outbox
            .claim(
                &store.pool,
                "p04",
                10,
                ClaimToken::new(),
                15_000,
                Some(old_fence),
                &[]
            )
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        t.partitions
            .renew(
                &store.pool,
                old,
                &[("p04".into(), old_fence.epoch)],
                LEASE_TTL
            )
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        t.partitions
            .release(&store.pool, old, &[("p04".into(), old_fence.epoch)], "x")
            .await
            .unwrap()
            .is_empty()
    );
    // The new owner claims the whole bucket from its head, in order.
    let fresh = t
        .outbox
        .claim(
            &store.pool,
            "p04",
            10,
            ClaimToken::new(),
            15_000,
            Some(new_fence),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(fresh.len(), 5);
    assert_eq!(fresh[0].id, ids[0]);
    assert_eq!(env.count("published_at IS NOT NULL").await, 0);
    // Both changes of owner are on record.
    let events = t.partitions.events_since(&store.pool, 0, 10).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].old_owner, Some(old));
    assert!(
        events[1].reason.contains("expired lease of"),
        "{}",
        events[1].reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_hands_its_buckets_to_the_survivors_within_two_seconds() {
    let env = TestEnv::new().await; // default lease timings: the handoff must not wait for expiry
    let mut workers: Vec<WorkerProcess> = (0..3).map(|_| env.spawn_worker(&["--silent"])).collect();
    wait_converged(&env, 3, Duration::from_secs(20)).await;
    let mut leaver = workers.remove(1);
    let leaver_id = worker_id_of(&env, &leaver).await;
    let start = Instant::now();
    leaver.signal("TERM");
    let took = wait_converged(&env, 2, Duration::from_secs(10)).await;
    assert!(leaver.wait(Duration::from_secs(15)).success());
    assert!(
        leases(&env)
            .await
            .iter()
            .all(|l| l.lease_owner != Some(leaver_id))
    );
    println!(
        "graceful stop: buckets re-owned by the 2 survivors {took:?} after SIGTERM (lease_ttl 15s)"
    );
    assert!(start.elapsed() >= took);
    assert!(took < Duration::from_secs(2), "handoff took {took:?}");
    terminate_all(&mut workers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leasing_and_fleet_workers_refuse_each_other() {
    let env = TestEnv::with(Tuning::fleet()).await;
    let mut fleet = env.spawn_worker(&["--silent"]);
    worker_id_of(&env, &fleet).await;
    let out = env
        .command(&["work", "--no-leasing", "--once"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("refusing to start in --no-leasing mode: 1 other outboxd worker(s) are live"),
        "{err}"
    );
    assert!(err.contains("leasing"), "{err}");
    assert!(fleet.terminate(Duration::from_secs(15)).success());

    let mut single = env.spawn_worker(&["--no-leasing", "--silent"]);
    worker_id_of(&env, &single).await;
    let out = env.command(&["work", "--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("a --no-leasing worker is live"), "{err}");
    assert!(single.terminate(Duration::from_secs(15)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_assignment_moves_few_buckets_when_a_worker_joins() {
    let env = TestEnv::with(Tuning {
        assignment: "sticky",
        ..Tuning::fleet()
    })
    .await;
    let owners = |ls: Vec<LeaseRow>| -> Vec<Option<Uuid>> {
        ls.into_iter().map(|l| l.lease_owner).collect()
    };
    let mut workers: Vec<WorkerProcess> = (0..3).map(|_| env.spawn_worker(&["--silent"])).collect();
    let settled = |n: usize| {
        let env = &env;
        async move {
            let w = live(env).await;
            w.len() == n
                && leases(env).await.iter().enumerate().all(|(b, l)| {
                    l.valid
                        && l.lease_owner == Some(w[owner_index(Assignment::Sticky, &w, b as u32)])
                })
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !settled(3).await {
        assert!(Instant::now() < deadline, "sticky 3 never settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = owners(leases(&env).await);
    workers.push(env.spawn_worker(&["--silent"]));
    while !settled(4).await {
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "sticky 4 never settled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = owners(leases(&env).await);
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    let newcomer: HashSet<Option<Uuid>> = after
        .iter()
        .copied()
        .collect::<HashSet<_>>()
        .difference(&before.iter().copied().collect::<HashSet<_>>())
        .copied()
        .collect();
    println!("sticky 3->4 with real workers: {moved} of 16 buckets moved");
    // Only buckets won by the newcomer move.
    assert!(
        after
            .iter()
            .zip(&before)
            .all(|(a, b)| a == b || newcomer.contains(a))
    );
    assert!(moved <= 8, "{moved} buckets moved");
    terminate_all(&mut workers);
}
