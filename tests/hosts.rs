//! A fleet across real hosts: each `outboxd work` in its own network
//! namespace ([`common::hosts::Lab`]), its links to the database and the
//! broker cut for real — packets dropped (blackhole), refused (reset), lost
//! or delayed — and healed. Every scenario is judged by the consumer-side
//! checker (0 lost, 0 unexpected, 0 per-key order violations) and prints
//! its figures (messages, duplicates, time until the cut host's buckets were
//! re-owned, until it rejoined, until everything was drained).
//!
//! Timings are shortened ([`Tuning::hosts`]: lease_ttl 3 s, lease_renew
//! 1 s, broker_grace 3 s, dead peers noticed after 2 s) except in the slow
//! link scenario, which runs at the default settings. Set
//! `OUTBOXD_LONG_HOSTS=1` for the long versions (a minute of slow link).
//! The stream scenarios are written for every database and run on
//! PostgreSQL by default, on all three with `scripts/test.sh --profile full`
//! (`.config/nextest.toml`).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::hosts::{DelayProxy, Fault, Lab, Link};
use common::streams::{assert_each_row_once, judge_stream, new_stream, stream_paths, stream_vars};
use common::*;
use outboxd::demo::QueueReader;
use uuid::Uuid;

const LEASE_TTL: Duration = Duration::from_secs(3);
const LEASE_RENEW: Duration = Duration::from_secs(1);
const BROKER_GRACE: Duration = Duration::from_secs(3);
/// How long a silent peer takes to be declared dead ([`Tuning::hosts`]).
const DEAD_PEER: Duration = Duration::from_secs(2);
/// When a host's buckets must be re-owned after it lost its database:
/// its leases expire, and the others take them within a renew period.
const REOWN_AFTER_EXPIRY: Duration = LEASE_TTL
    .saturating_add(LEASE_RENEW)
    .saturating_add(Duration::from_secs(3));

fn long() -> bool {
    std::env::var("OUTBOXD_LONG_HOSTS").is_ok_and(|v| v == "1")
}

/// Reads deliveries for `d` (keeping the checker current while waiting).
async fn pump(reader: &mut QueueReader, d: Duration) {
    let _ = reader.read_until(d, |_| false).await;
}

/// Pairs (bucket, epoch) that more than one worker acquired: must be none.
async fn epochs_held_twice(env: &TestEnv) -> Vec<(String, i64)> {
    env.db
        .rows(
            "SELECT partition_key, new_epoch FROM outbox_lease_events WHERE action = 'acquire'
             GROUP BY partition_key, new_epoch HAVING count(DISTINCT worker_id) > 1",
        )
        .await
}

async fn lease_changes(env: &TestEnv) -> i64 {
    env.db
        .value("SELECT count(*) FROM outbox_lease_events WHERE action = 'acquire'")
        .await
}

/// Whether every bucket of `held` is validly leased by another worker under
/// a newer epoch.
async fn reowned(env: &TestEnv, held: &BTreeMap<String, i64>, from: Uuid) -> bool {
    let now: BTreeMap<String, _> = leases(env)
        .await
        .into_iter()
        .map(|l| (l.partition_key.clone(), l))
        .collect();
    held.iter().all(|(b, e)| {
        now[b].valid && now[b].lease_owner.is_some_and(|o| o != from) && now[b].lease_epoch > *e
    })
}

/// `outboxd status` (text and JSON) shows `worker` as unable to publish,
/// with the broker error; returns the worker's row of the JSON.
fn assert_reported_unable_to_publish(env: &TestEnv, worker: Uuid) -> serde_json::Value {
    let out = env.command(&["status", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == worker.to_string())
        .expect("the worker's row")
        .clone();
    assert_eq!(row["can_publish"], false, "{row}");
    assert!(
        row["broker_error"].as_str().is_some_and(|e| !e.is_empty()),
        "{row}"
    );
    let out = env.command(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("cannot reach RabbitMQ and holds no buckets"),
        "{text}"
    );
    row
}

/// Three workers on three hosts under a producer; host 2's `link` suffers
/// `fault` for 3 × lease_ttl, then heals.
async fn cut_host_2(link: Link, fault: Fault, reown_bound: Duration) {
    let lab = Lab::new(3);
    let env = TestEnv::with(lab.tuning(Tuning::hosts())).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&lab.broker().url(), &queue)
        .await
        .unwrap()
        .keep_log();
    let mut workers: Vec<WorkerProcess> = (1..=3)
        .map(|h| env.spawn_worker_on(Some(&lab.netns(h)), &env.config_path, &[]))
        .collect();
    wait_converged(&env, 3, Duration::from_secs(20)).await;
    let cut_id = worker_id_of(&env, &workers[1]).await;
    let total = 4_000;
    let producing = tokio::spawn(produce_evenly(
        env.db.clone(),
        queue.clone(),
        total,
        200,
        Duration::from_secs(16),
    ));
    env.wait_count("published_at IS NOT NULL", 300, Duration::from_secs(20))
        .await;

    let held = held_by(&env, cut_id).await;
    assert!(!held.is_empty());
    lab.fault(2, link, fault);
    let cut_at = Instant::now();
    // After host 2's trust deadline (at most lease_ttl - margin after the
    // cut), nothing may arrive under its leases.
    let mut after_deadline = None;
    let mut reowned_after = None;
    while cut_at.elapsed() < 3 * LEASE_TTL || reowned_after.is_none() {
        pump(&mut reader, Duration::from_millis(100)).await;
        if after_deadline.is_none() && cut_at.elapsed() >= LEASE_TTL {
            after_deadline = Some(reader.log.as_ref().unwrap().len());
        }
        if reowned_after.is_none() && reowned(&env, &held, cut_id).await {
            reowned_after = Some(cut_at.elapsed());
        }
        assert!(
            cut_at.elapsed() < reown_bound + Duration::from_secs(10),
            "host 2's buckets not re-owned: {:?}; its log:\n{}",
            leases(&env).await,
            workers[1].log_text()
        );
    }
    let reowned_after = reowned_after.unwrap();
    if matches!(link, Link::Broker) {
        assert_reported_unable_to_publish(&env, cut_id);
    }
    lab.heal(2);
    let healed_at = Instant::now();
    let rejoined_after = loop {
        pump(&mut reader, Duration::from_millis(100)).await;
        if converged(&env, 3).await && !held_by(&env, cut_id).await.is_empty() {
            break healed_at.elapsed();
        }
        assert!(
            healed_at.elapsed() < Duration::from_secs(30),
            "host 2 never rejoined; its log:\n{}",
            workers[1].log_text()
        );
    };
    producing.await.unwrap();
    let drain_from = Instant::now();
    let (all, v) = read_and_judge(&mut reader, &env, total, Duration::from_secs(60)).await;
    let drained_after = drain_from.elapsed();

    let log = reader.log.as_ref().unwrap();
    let stale: Vec<_> = log[after_deadline.unwrap()..]
        .iter()
        .filter(|d| held.get(&d.partition_key) == d.lease_epoch.as_ref())
        .collect();
    let twice = epochs_held_twice(&env).await;
    println!(
        "{link:?} {fault:?} on host 2: {} buckets re-owned after {reowned_after:.2?} (bound {reown_bound:?}); \
         deliveries under its old leases after its trust deadline: {}; rejoined {rejoined_after:.2?} after the heal; \
         last message read {drained_after:.2?} after production ended; epochs held twice: {}; {}",
        held.len(),
        stale.len(),
        twice.len(),
        v.summary()
    );
    assert!(
        reowned_after <= reown_bound,
        "re-owned after {reowned_after:?}; host 2's log:\n{}",
        workers[1].log_text()
    );
    assert!(stale.is_empty(), "published under a lost lease: {stale:?}");
    assert!(
        twice.is_empty(),
        "epochs acquired by two workers: {twice:?}"
    );
    assert!(all && v.is_clean(), "{v:?}");
    terminate_all(&mut workers);
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_whose_database_link_is_blackholed_loses_its_buckets_and_rejoins_after_the_heal() {
    cut_host_2(Link::Database, Fault::Blackhole, REOWN_AFTER_EXPIRY).await;
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_whose_database_link_is_reset_loses_its_buckets_and_rejoins_after_the_heal() {
    cut_host_2(Link::Database, Fault::Reset, REOWN_AFTER_EXPIRY).await;
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_that_loses_the_broker_hands_its_buckets_over_and_takes_its_share_back() {
    // Noticing the silent broker takes up to DEAD_PEER, then the grace.
    cut_host_2(
        Link::Broker,
        Fault::Blackhole,
        DEAD_PEER + BROKER_GRACE + LEASE_RENEW + Duration::from_secs(3),
    )
    .await;
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fully_isolated_host_loses_its_buckets_and_rejoins_after_the_heal() {
    cut_host_2(Link::All, Fault::Blackhole, REOWN_AFTER_EXPIRY).await;
}

/// 300 ms ± 100 ms and 5 % loss on host 2's database link, at the default
/// lease settings: the fleet keeps publishing, host 2 included, and leases
/// stay where they are.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_lossy_database_link_keeps_publishing_without_lease_flapping() {
    let lab = Lab::new(3);
    let env = TestEnv::with(lab.tuning(Tuning::default())).await;
    let target = format!("{}:{}", lab.gateway, lab.pg.port).parse().unwrap();
    let proxy = DelayProxy::start(
        &lab.gateway,
        target,
        Duration::from_millis(300),
        Duration::from_millis(100),
    )
    .await;
    let slow_config = env.config_variant("slow-link", |toml| {
        toml.replace(
            &format!("{}:{}/", lab.gateway, lab.pg.port),
            &format!("{}/", proxy.addr),
        )
    });
    let queue = unique("q");
    let mut reader = QueueReader::open(&lab.broker().url(), &queue)
        .await
        .unwrap();
    let mut workers: Vec<WorkerProcess> = (1..=3)
        .map(|h| {
            let config = if h == 2 {
                &slow_config
            } else {
                &env.config_path
            };
            env.spawn_worker_on(Some(&lab.netns(h)), config, &[])
        })
        .collect();
    // Host 2 starts through the slow link: some twenty statements before
    // it holds its buckets (migrations checked, registration, the first
    // lease change), each ~1.1 s there — 23–24 s in all.
    let starting = Instant::now();
    wait_converged(&env, 3, Duration::from_secs(60)).await;
    let converged_in = starting.elapsed();
    let slow_id = worker_id_of(&env, &workers[1]).await;
    // Host 2 reaches the database only through the proxy.
    lab.fault_ports(2, &proxy.addr.port().to_string(), Fault::Loss(5));
    let window = if long() {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(20)
    };
    let total = (window.as_secs() * 150) as usize;
    let events_before = lease_changes(&env).await;
    let held_before = held_by(&env, slow_id).await;
    let started = Instant::now();
    let producing = tokio::spawn(produce_evenly(
        env.db.clone(),
        queue.clone(),
        total,
        300,
        window,
    ));
    let published_by_slow = |env: &TestEnv| {
        let db = env.db.clone();
        async move {
            db.value::<i64>(&format!(
                "SELECT published_total FROM outbox_workers WHERE worker_id = '{slow_id}'"
            ))
            .await
        }
    };
    while started.elapsed() < window {
        pump(&mut reader, Duration::from_millis(200)).await;
    }
    producing.await.unwrap();
    let (all, v) = read_and_judge(&mut reader, &env, total, Duration::from_secs(90)).await;
    let changes = lease_changes(&env).await - events_before;
    let slow_published = published_by_slow(&env).await;
    let held_after = held_by(&env, slow_id).await;
    println!(
        "slow link (300 ms ± 100 ms, 5 % loss) on host 2 for {window:?}: \
         converged in {converged_in:.1?} before the loss; {total} messages; lease acquisitions during the window: {changes}; host 2 published {slow_published}, \
         held {} buckets before and {} after; {}",
        held_before.len(),
        held_after.len(),
        v.summary()
    );
    assert!(all && v.is_clean(), "{v:?}");
    assert!(slow_published > 0, "host 2 published nothing");
    assert!(
        changes <= 2,
        "{changes} lease acquisitions: the leases flapped"
    );
    assert_eq!(held_before, held_after, "host 2's leases moved");
    terminate_all(&mut workers);
}

/// A worker whose database is blackholed still stops on SIGTERM within
/// shutdown_timeout + 5 s; its rows are published by the next worker.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_stops_a_worker_whose_database_is_blackholed_in_time() {
    let lab = Lab::new(1);
    let env = TestEnv::with(lab.tuning(Tuning::hosts())).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&lab.broker().url(), &queue)
        .await
        .unwrap();
    let mut worker = env.spawn_worker_on(Some(&lab.netns(1)), &env.config_path, &[]);
    wait_converged(&env, 1, Duration::from_secs(20)).await;
    let total = 2_000;
    let producing = tokio::spawn(produce_evenly(
        env.db.clone(),
        queue.clone(),
        total,
        100,
        Duration::from_secs(4),
    ));
    env.wait_count("published_at IS NOT NULL", 200, Duration::from_secs(20))
        .await;
    lab.fault(1, Link::Database, Fault::Blackhole);
    pump(&mut reader, Duration::from_secs(1)).await;
    let term_at = Instant::now();
    let status = worker.terminate(Duration::from_secs(30));
    let took = term_at.elapsed();
    let shutdown_timeout = Duration::from_secs(10);
    lab.heal(1);
    producing.await.unwrap();
    // Nothing lost: the next worker publishes what the first one left.
    let mut next = env.spawn_worker_on(Some(&lab.netns(1)), &env.config_path, &[]);
    let (all, v) = read_and_judge(&mut reader, &env, total, Duration::from_secs(60)).await;
    println!(
        "SIGTERM with the database blackholed: exited {status} after {took:.2?} (bound shutdown_timeout {shutdown_timeout:?} + 5 s); then {}",
        v.summary()
    );
    assert!(status.success(), "{}", worker.log_text());
    assert!(
        took <= shutdown_timeout + Duration::from_secs(5),
        "{}",
        worker.log_text()
    );
    assert!(all && v.is_clean(), "{v:?}");
    assert!(next.terminate(EXIT_WITHIN).success());
}

/// When every worker loses the broker, every one steps aside once: no
/// bucket stays leased, no lease moves while the broker is away (no
/// release/re-acquire loop), and when it is back the fleet takes every
/// bucket again and delivers everything.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_every_worker_loses_the_broker_the_fleet_steps_aside_without_churn() {
    let lab = Lab::new(2);
    let env = TestEnv::with(lab.tuning(Tuning::hosts())).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&lab.broker().url(), &queue)
        .await
        .unwrap();
    let mut workers: Vec<WorkerProcess> = (1..=2)
        .map(|h| env.spawn_worker_on(Some(&lab.netns(h)), &env.config_path, &[]))
        .collect();
    wait_converged(&env, 2, Duration::from_secs(20)).await;
    let total = 2_000;
    let producing = tokio::spawn(produce_evenly(
        env.db.clone(),
        queue.clone(),
        total,
        200,
        Duration::from_secs(20),
    ));
    env.wait_count("published_at IS NOT NULL", 200, Duration::from_secs(20))
        .await;
    for h in 1..=2 {
        lab.fault(h, Link::Broker, Fault::Blackhole);
    }
    let cut_at = Instant::now();
    // Both step aside: no valid lease left.
    loop {
        if leases(&env).await.iter().all(|l| !l.valid) {
            break;
        }
        assert!(
            cut_at.elapsed() < DEAD_PEER + BROKER_GRACE + Duration::from_secs(10),
            "leases still held: {:?}",
            leases(&env).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stepped_aside = cut_at.elapsed();
    // And nothing moves while the broker stays away.
    let events = lease_changes(&env).await;
    tokio::time::sleep(4 * LEASE_TTL).await;
    let churn = lease_changes(&env).await - events;
    let pending = env.count("published_at IS NULL").await;
    for h in 1..=2 {
        lab.heal(h);
    }
    let healed_at = Instant::now();
    wait_converged(&env, 2, Duration::from_secs(30)).await;
    let back = healed_at.elapsed();
    producing.await.unwrap();
    let (all, v) = read_and_judge(&mut reader, &env, total, Duration::from_secs(60)).await;
    println!(
        "every worker lost the broker: no lease held {stepped_aside:.2?} after the cut; \
         {churn} lease acquisitions in the next {:?} ({pending} rows pending); \
         every bucket leased again {back:.2?} after the heal; {}",
        4 * LEASE_TTL,
        v.summary()
    );
    assert_eq!(churn, 0, "leases moved while no worker could publish");
    assert!(
        pending > 0,
        "the test needs rows waiting while the broker is away"
    );
    assert!(all && v.is_clean(), "{v:?}");
    terminate_all(&mut workers);
}

/// Three workers on three hosts publishing into a RabbitMQ stream while
/// producers write; host 2 is cut off from everything (the database
/// server, the broker, the stream port) for 3 × lease_ttl, then heals and
/// takes its share back. Its buckets change hands twice with rows in
/// flight; the stream holds each committed row once, in order per key.
/// With SQLite the database is a file every host shares, so host 2 loses
/// only the broker: it keeps its heartbeat, steps aside after
/// `broker_grace` and hands its buckets over itself, with batches whose
/// fate it never learnt.
async fn a_host_cut_off_and_healed_adds_each_row_to_a_stream_once(db: Db) {
    host_2_faulted_into_a_stream(db, Link::All, Fault::Blackhole, "cut off from everything").await;
}

/// Host 2 turns deaf to the broker and its stream port while it publishes:
/// what it sends arrives, no confirm comes back. The broker stores what
/// host 2's last batches carried; host 2 never learns it, times out, steps
/// aside after `broker_grace` (its heartbeat still reaches the database)
/// and hands its buckets over. The stream must still hold each committed
/// row once: the next owners must not take those rows for rows that
/// committed late and send them again.
async fn a_host_deaf_to_the_broker_adds_each_row_to_a_stream_once(db: Db) {
    host_2_faulted_into_a_stream(db, Link::Broker, Fault::Deaf, "deaf to the broker").await;
}

/// Host 2 loses the broker's stream port alone while it publishes into a
/// stream: its database and the broker's AMQP port stay reachable, so its
/// heartbeat and its leases go on. It cannot drain a bucket into the
/// stream, so it must step aside after `broker_grace`, say why in its
/// worker row, and take its share back once the port answers again (G5).
async fn a_host_that_loses_the_stream_port_hands_its_buckets_over_and_takes_its_share_back(db: Db) {
    host_2_faulted_into_a_stream(
        db,
        Link::StreamPort,
        Fault::Blackhole,
        "cut from the stream port",
    )
    .await;
}

/// A lab of three hosts with its broker's stream port, a test database on
/// `db` (a MariaDB server in the lab for MariaDB), and a new stream.
struct StreamLab {
    lab: Lab,
    _maria: Option<PrivateMariaDb>,
    env: TestEnv,
    url: String,
    stream: String,
}

impl StreamLab {
    async fn start(db: Db) -> Self {
        let lab = Lab::with_streams(3);
        let maria = (db == Db::MariaDb).then(|| PrivateMariaDb::start_on(&lab.gateway));
        let server_admin_url = match (db, &maria) {
            (Db::Postgres, _) => Some(lab.pg.admin_url()),
            (Db::MariaDb, Some(maria)) => Some(maria.admin_url()),
            _ => None,
        };
        let env = TestEnv::with(
            Tuning {
                server_admin_url,
                ..lab.tuning(Tuning::hosts())
            }
            .on(db),
        )
        .await;
        let url = lab.broker().stream_url();
        let stream = new_stream(&url).await;
        Self {
            lab,
            _maria: maria,
            env,
            url,
            stream,
        }
    }

    /// A worker on host `h` relaying into the stream, with `extra`
    /// settings in its environment.
    fn worker(&self, h: usize, extra: &[(&str, &str)]) -> WorkerProcess {
        let vars = stream_vars(&self.url, &self.stream);
        let mut vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        vars.extend_from_slice(extra);
        self.env
            .spawn_worker_with(Some(&self.lab.netns(h)), &self.env.config_path, &[], &vars)
    }
}

/// Three workers on three hosts publish into a stream on `db` while
/// producers write; host 2's `link` suffers `fault` until its buckets are
/// owned by the others (and at least 3 × lease_ttl), then heals; judged
/// from the stream's first offset.
async fn host_2_faulted_into_a_stream(db: Db, link: Link, fault: Fault, what: &str) {
    let StreamLab {
        lab,
        _maria,
        env,
        url,
        stream,
    } = StreamLab::start(db).await;
    let vars = stream_vars(&url, &stream);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut workers: Vec<WorkerProcess> = (1..=3)
        .map(|h| env.spawn_worker_with(Some(&lab.netns(h)), &env.config_path, &[], &vars))
        .collect();
    wait_converged(&env, 3, Duration::from_secs(20)).await;
    let faulted_id = worker_id_of(&env, &workers[1]).await;
    let producers = Producers::start(&env, "", &stream, 4, 300.0);
    env.wait_count("published_at IS NOT NULL", 300, Duration::from_secs(20))
        .await;
    let held = held_by(&env, faulted_id).await;
    assert!(!held.is_empty());
    lab.fault(2, link, fault);
    let cut_at = Instant::now();
    while !reowned(&env, &held, faulted_id).await {
        assert!(
            cut_at.elapsed() < REOWN_AFTER_EXPIRY + Duration::from_secs(20),
            "host 2's buckets not re-owned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reowned_after = cut_at.elapsed();
    if link == Link::StreamPort {
        // Only its own step aside moves host 2's buckets: it notices the
        // silent port, waits its grace, steps aside and says why; a lease
        // under which it sent rows it never recorded is left to expire.
        let bound = DEAD_PEER + BROKER_GRACE + LEASE_TTL + 2 * LEASE_RENEW + Duration::from_secs(3);
        assert!(
            reowned_after <= bound,
            "re-owned after {reowned_after:?}, bound {bound:?}; host 2's log:\n{}",
            workers[1].log_text()
        );
        let row = assert_reported_unable_to_publish(&env, faulted_id);
        assert!(
            row["broker_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("stream port:")),
            "{row}"
        );
    }
    tokio::time::sleep((3 * LEASE_TTL).saturating_sub(cut_at.elapsed())).await;
    lab.heal(2);
    let healed_at = Instant::now();
    while !converged(&env, 3).await || held_by(&env, faulted_id).await.is_empty() {
        assert!(
            healed_at.elapsed() < Duration::from_secs(40),
            "host 2 never rejoined; its log:\n{}",
            workers[1].log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rejoined_after = healed_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let acknowledged = producers.stop().await;
    let start = Instant::now();
    while env.count("published_at IS NULL").await > 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "not drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = judge_stream(&env, &url, &stream).await;
    let (stored, late) = stream_paths(&env);
    println!(
        "host 2 {what}, publishing into a stream: {} buckets re-owned after {reowned_after:.2?}, rejoined {rejoined_after:.2?} after the heal; {acknowledged} commits acknowledged; {stored} rows found in the stream and recorded without sending, {late} committed late; {}",
        held.len(),
        v.summary()
    );
    assert!(
        v.is_clean(),
        "{}\nhost 2's log:\n{}",
        v.summary(),
        workers[1].log_text()
    );
    assert_eq!(v.duplicates, 0, "{}", v.summary());
    terminate_all(&mut workers);
}

/// Host 1's worker is killed with rows in the stream it never recorded
/// (their records are undone, as if its last confirm had come just before
/// the kill). Host 2, cut from the broker a moment before, takes host 1's
/// expired leases but cannot send a row; it gives them up — some to host
/// 3, which joins, the rest when it steps aside after its `broker_grace`.
/// Host 2 never learnt what host 1 left unrecorded, so it must not
/// release those leases as settled: their next owner would take the rows
/// for rows that committed late and send them again.
async fn leases_taken_from_a_killed_owner_and_given_up_unsent_keep_a_stream_once(db: Db) {
    let lab = StreamLab::start(db).await;
    let env = &lab.env;
    let mut first = lab.worker(1, &[]);
    // Long enough to take host 1's leases over before stepping aside.
    let second = lab.worker(2, &[("OUTBOXD_WORKER__BROKER_GRACE", "10s")]);
    wait_converged(env, 2, Duration::from_secs(20)).await;
    let (first_id, second_id) = (
        worker_id_of(env, &first).await,
        worker_id_of(env, &second).await,
    );
    let producers = Producers::start(env, "", &lab.stream, 4, 300.0);
    env.wait_count("published_at IS NOT NULL", 600, Duration::from_secs(20))
        .await;
    let acknowledged = producers.stop().await;
    let start = Instant::now();
    while env.count("published_at IS NULL").await > 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "not drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = held_by(env, first_id).await;
    assert!(!held.is_empty());
    lab.lab.fault(2, Link::Broker, Fault::Blackhole);
    first.signal("KILL");
    first.wait(Duration::from_secs(5));
    let mut undone = 0;
    for bucket in held.keys() {
        undone += env
            .db
            .exec(&format!(
                "UPDATE outbox SET published_at = NULL WHERE id IN (SELECT id FROM \
                 (SELECT id FROM outbox WHERE partition_key = '{bucket}' ORDER BY id DESC LIMIT 2) t)"
            ))
            .await;
    }
    let killed_at = Instant::now();
    loop {
        let now = held_by(env, second_id).await;
        if held.keys().all(|b| now.contains_key(b)) {
            break;
        }
        assert!(
            killed_at.elapsed() < REOWN_AFTER_EXPIRY + Duration::from_secs(5),
            "host 2 did not take host 1's leases over; its log:\n{}",
            second.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let taken_after = killed_at.elapsed();
    assert_eq!(
        env.count("published_at IS NULL").await,
        undone as i64,
        "host 2 recorded rows without a broker"
    );
    let third = lab.worker(3, &[]);
    let third_id = worker_id_of(env, &third).await;
    let joined_at = Instant::now();
    let buckets = leases(env).await.len();
    while held_by(env, third_id).await.len() < buckets {
        assert!(
            joined_at.elapsed() < Duration::from_secs(40),
            "host 3 never took every bucket; host 2's log:\n{}",
            second.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let handed_after = joined_at.elapsed();
    lab.lab.heal(2);
    let start = Instant::now();
    while env.count("published_at IS NULL").await > 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "not drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let what = format!(
        "leases of a killed owner taken and given up unsent: {} buckets, {undone} rows in the stream left unrecorded; host 2 took them after {taken_after:.2?}, host 3 held them {handed_after:.2?} after joining; {acknowledged} commits acknowledged",
        held.len()
    );
    assert_each_row_once(env, &lab.url, &lab.stream, &what).await;
    terminate_all(&mut [second, third]);
}

on_every_db!(
    a_host_cut_off_and_healed_adds_each_row_to_a_stream_once,
    a_host_deaf_to_the_broker_adds_each_row_to_a_stream_once,
    leases_taken_from_a_killed_owner_and_given_up_unsent_keep_a_stream_once
);

/// The stream port's reach is the worker's, whatever its database: one
/// database is enough.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_that_loses_the_stream_port_hands_its_buckets_over_on_postgres() {
    a_host_that_loses_the_stream_port_hands_its_buckets_over_and_takes_its_share_back(Db::Postgres)
        .await;
}
