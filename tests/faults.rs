//! The fault-injection suite: faults applied for real to real `outboxd`
//! processes, PostgreSQL and RabbitMQ, with producers running several
//! transactions at once (some rolled back) and a consumer-side checker
//! judging every delivery against the committed rows. Every scenario
//! requires 0 lost, 0 unexpected, 0 order violations.
//!
//! The short versions run in CI (`scripts/test.sh`); the long ones with
//! `OUTBOXD_LONG_FAULTS=1 scripts/test.sh --test faults`. RabbitMQ killed
//! twice and the memory alarm, whose subject is the broker, run on
//! PostgreSQL by default and on every database with `--profile full`
//! (`.config/nextest.toml`). Scenario 2 (SIGSTOP) is in
//! `tests/fleet.rs`, the memory alarm (5) below, more bad input (8) in
//! `tests/relay.rs`, `tests/cli.rs` and `tests/ops.rs`.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use outboxd::checker::{OrderViolation, Verdict};
use outboxd::demo::QueueReader;
use outboxd::producer::Message;

/// RabbitMQ memory alarm: the broker blocks publishing connections. The
/// relay logs the blocked state, publishes nothing while it lasts, stays
/// responsive, and drains the backlog once the alarm clears, losing nothing.
async fn a_memory_alarm_blocks_publishing_and_the_backlog_drains_when_it_clears(db: Db) {
    let broker = PrivateBroker::start();
    let env = TestEnv::with(Tuning {
        amqp_url: Some(broker.url()),
        confirm_timeout: "3s",
        ..Tuning::default().on(db)
    })
    .await;
    let queue = unique("q");
    // Declared (and consumed from) only after the alarm: consumers are not
    // blocked, but keeping the test to one connection at a time is simpler.
    drop(QueueReader::open(&broker.url(), &queue).await.unwrap());
    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    publish_300(&env, &queue).await;

    broker.ctl(&["set_vm_memory_high_watermark", "0"]);
    let alarm_at = Instant::now();
    produce_1000_blocked(&env, &queue).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = env.count("published_at IS NOT NULL").await;
    let log = worker.log_text();
    assert!(
        log.contains("blocked publishing"),
        "the blocked state is not logged:\n{log}"
    );
    // Nothing (beyond what was in flight when the alarm began) goes out,
    // for the rest of the alarm (about 11 s in CI, 30 s in the long run).
    tokio::time::sleep(scenario_length(3, 21)).await;
    assert_eq!(
        env.count("published_at IS NOT NULL").await,
        during,
        "published while blocked"
    );

    broker.ctl(&["set_vm_memory_high_watermark", "0.4"]);
    let cleared = Instant::now();
    let published = env
        .wait_count("published_at IS NOT NULL", 1_300, Duration::from_secs(60))
        .await;
    let drained_after = cleared.elapsed();
    assert_eq!(
        published,
        1_300,
        "backlog not drained; log:\n{}",
        worker.log_text()
    );
    let mut reader = QueueReader::open(&broker.url(), &queue).await.unwrap();
    let (all, v) = read_and_judge(&mut reader, &env, 1_300, Duration::from_secs(30)).await;
    println!(
        "memory alarm: {during} published during {:?} of alarm (300 before it); backlog drained {drained_after:?} after it cleared; {}",
        cleared.duration_since(alarm_at),
        v.summary()
    );
    assert!(all && v.is_clean(), "{v:?}");
    // Memory stayed bounded while the backlog waited in the database.
    let status = std::fs::read_to_string(format!("/proc/{}/status", worker.pid())).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    println!("memory alarm: worker peak RSS {} MB", peak_kb / 1024);
    assert!(peak_kb < 100 * 1024, "peak RSS {peak_kb} kB");
    // Responsive throughout: a clean stop, in time.
    let stop = Instant::now();
    assert!(worker.terminate(EXIT_WITHIN).success());
    assert!(
        stop.elapsed() < Duration::from_secs(10),
        "stop took {:?}",
        stop.elapsed()
    );
}

/// RabbitMQ's disk alarm (`disk_free_limit` raised above what is free)
/// blocks publishing on every connection, as the memory alarm does — but a
/// fleet's workers share the broker, so one blocked worker is every worker
/// blocked. They wait, holding their leases: stepping aside after
/// `broker_grace` (meant for a worker that cannot *reach* a broker the
/// others can) would only move buckets between workers that are all
/// equally blocked. Two workers, an alarm longer than `broker_grace`: no
/// lease changes hands, nothing is published while it lasts, and the
/// backlog drains once it clears, nothing lost, order kept.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disk_alarm_blocks_every_worker_which_keep_their_leases_and_drain_after() {
    let broker = PrivateBroker::start();
    let env = TestEnv::with(Tuning {
        amqp_url: Some(broker.url()),
        confirm_timeout: "3s",
        broker_grace: "4s",
        ..Tuning::fleet()
    })
    .await;
    let queue = unique("q");
    drop(QueueReader::open(&broker.url(), &queue).await.unwrap());
    let mut fleet: Vec<WorkerProcess> = (0..2).map(|_| env.spawn_worker(&[])).collect();
    wait_converged(&env, 2, Duration::from_secs(30)).await;
    publish_300(&env, &queue).await;

    broker.ctl(&["set_disk_free_limit", "100000GB"]);
    let alarm_at = Instant::now();
    produce_1000_blocked(&env, &queue).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = env.count("published_at IS NOT NULL").await;
    let events = event_count(&env).await;
    for w in &fleet {
        let log = w.log_text();
        assert!(
            log.contains("blocked publishing"),
            "a worker did not say it is blocked:\n{log}"
        );
    }
    // Longer than broker_grace (4 s): nobody steps aside, nothing goes out.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        env.count("published_at IS NOT NULL").await,
        during,
        "published while blocked"
    );
    let moved = event_count(&env).await - events;
    assert_eq!(moved, 0, "leases changed hands during the alarm");

    broker.ctl(&["set_disk_free_limit", "50MB"]);
    let cleared = Instant::now();
    let published = env
        .wait_count("published_at IS NOT NULL", 1_300, Duration::from_secs(60))
        .await;
    let drained_after = cleared.elapsed();
    assert_eq!(published, 1_300, "backlog not drained");
    let mut reader = QueueReader::open(&broker.url(), &queue).await.unwrap();
    let (all, v) = read_and_judge(&mut reader, &env, 1_300, Duration::from_secs(30)).await;
    println!(
        "disk alarm: {} published during {:?} of alarm, {moved} lease changes; backlog drained {drained_after:?} after it cleared; {}",
        during - 300,
        cleared.duration_since(alarm_at),
        v.summary()
    );
    assert!(all && v.is_clean(), "{v:?}");
    terminate_all(&mut fleet);
}

// ------------------------------------------------------------------ shared

/// The alarm scenarios' first 300 messages, published before the alarm.
async fn publish_300(env: &TestEnv, queue: &str) {
    produce_evenly(
        env.db.clone(),
        queue.to_string(),
        300,
        30,
        Duration::from_secs(1),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.published().await < 300 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.published().await, 300);
}

/// The 1,000 messages the alarm scenarios write while publishing is blocked.
async fn produce_1000_blocked(env: &TestEnv, queue: &str) {
    produce_evenly(
        env.db.clone(),
        queue.to_string(),
        1_000,
        50,
        Duration::from_secs(2),
    )
    .await;
}

/// Long scenarios (minutes) run with `OUTBOXD_LONG_FAULTS=1`; CI runs the
/// short versions of the same code.
fn scenario_length(short: u64, long: u64) -> Duration {
    match std::env::var("OUTBOXD_LONG_FAULTS").as_deref() {
        Ok("1") => Duration::from_secs(long),
        _ => Duration::from_secs(short),
    }
}

/// A backlog of `n` rows over 300 keys, written with plain `INSERT`s.
async fn seed(env: &TestEnv, queue: &str, n: usize) {
    let keys: Vec<String> = (0..300).map(|k| format!("seed-{k}")).collect();
    for chunk in 0..n.div_ceil(5_000) {
        let rows = (n - chunk * 5_000).min(5_000);
        env.db.exec(&plain_insert(&keys, queue, rows)).await;
    }
}

/// Waits until no committed row is unpublished; returns how long it took.
async fn wait_drained(env: &TestEnv, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let pending = env.count("published_at IS NULL").await;
        if pending == 0 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "{pending} rows still unpublished after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads every committed row from `queue` and judges it. The read ends as
/// soon as every row has arrived; its bound is for a loaded machine, where
/// reading back 30,000 messages once took over 60 s (a failed read says
/// whether the queue still held messages).
async fn judge_queue(env: &TestEnv, url: &str, queue: &str) -> Verdict {
    let committed = env.committed().await as usize;
    let mut reader = QueueReader::open(url, queue).await.unwrap();
    let (all, v) = read_and_judge(&mut reader, env, committed, Duration::from_secs(180)).await;
    drop(reader);
    assert!(
        all,
        "not everything arrived: {}; {}",
        v.summary(),
        queue_depth(url, queue).await
    );
    v
}

/// What the queue still holds, said for a failed read: messages left mean
/// the read was slow, an empty queue that they were lost.
async fn queue_depth(url: &str, queue: &str) -> String {
    use lapin::options::QueueDeclareOptions;
    let conn = match lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await {
        Ok(c) => c,
        Err(e) => return format!("the queue's depth could not be read: {e}"),
    };
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let depth = match conn.create_channel().await {
        Ok(ch) => ch
            .queue_declare(queue.into(), passive, lapin::types::FieldTable::default())
            .await
            .map(|q| q.message_count()),
        Err(e) => Err(e),
    };
    let _ = conn.close(200, "bye".into()).await;
    match depth {
        Ok(n) => format!("the queue still holds {n} message(s) after the read"),
        Err(e) => format!("the queue's depth could not be read: {e}"),
    }
}

/// Waits until the published count moves past `from`; returns how long.
async fn wait_publishing(env: &TestEnv, from: i64, timeout: Duration) -> Duration {
    let start = Instant::now();
    while env.published().await <= from {
        assert!(start.elapsed() < timeout, "publishing did not resume");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

// ------------------------------------------------------- the checker itself

/// The checker must catch a relay that misbehaves. A deliberately broken
/// relay (this test, publishing with outboxd's headers) delivers one key
/// out of order, skips a message, sends one twice, and sends the row of a
/// rolled-back transaction; the verdict names exactly those.
async fn the_checker_catches_a_relay_that_reorders_skips_repeats_or_invents(db: Db) {
    let env = TestEnv::on(db).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for i in 0..4 {
        let m = |key| Message::new(key, "", queue.clone(), i.to_string());
        a.push(env.db.enqueue(m("a")).await);
        b.push(env.db.enqueue(m("b")).await);
    }
    let ghost = env
        .db
        .enqueue_in_tx(vec![Message::new("a", "", queue.clone(), "ghost")], false)
        .await
        .unwrap()[0];

    let broken = [
        ("a", a[0]),
        ("a", a[1]),
        ("a", a[0]), // a duplicate
        ("b", b[1]), // b[1] before b[0]: reordered
        ("b", b[0]),
        ("a", a[3]),  // a[2] skipped: lost
        ("a", ghost), // never committed
        ("b", b[2]),
        ("b", b[3]),
    ];
    let conn = lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    for (key, id) in broken {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            outboxd::amqp::HEADER_ID.into(),
            lapin::types::AMQPValue::LongLongInt(id),
        );
        headers.insert(
            outboxd::amqp::HEADER_MESSAGE_KEY.into(),
            lapin::types::AMQPValue::LongString(key.into()),
        );
        ch.basic_publish(
            "".into(),
            queue.as_str().into(),
            lapin::options::BasicPublishOptions::default(),
            b"x",
            lapin::BasicProperties::default().with_headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    conn.close(200, "bye".into()).await.ok();

    let (_, v) = read_and_judge(&mut reader, &env, 8, Duration::from_secs(10)).await;
    assert_eq!(v.lost, vec![a[2]], "{v:?}");
    assert_eq!(v.unexpected, vec![ghost], "{v:?}");
    assert_eq!(v.duplicates, 1, "{v:?}");
    assert_eq!(
        v.order_violations,
        vec![OrderViolation {
            message_key: "b".into(),
            id: b[0],
            after: b[1],
        }],
        "{v:?}"
    );
    assert!(!v.is_clean());

    // The real relay on the same rows: clean.
    let queue2 = unique("q");
    env.db
        .exec(&format!("UPDATE outbox SET routing_key = '{queue2}'"))
        .await;
    let mut reader = QueueReader::open(&amqp_url(), &queue2).await.unwrap();
    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    let (all, v) = read_and_judge(&mut reader, &env, 8, Duration::from_secs(20)).await;
    assert!(all && v.is_clean() && v.duplicates == 0, "{v:?}");
    assert!(worker.terminate(EXIT_WITHIN).success());
}

// ------------------------------------------------------------- scenario 1

/// SIGKILL a random worker of three every 3 s, restarting it at once, while
/// producers write: 0 lost, 0 unexpected, 0 order violations; duplicates
/// within the killed workers' in-flight batches; the backlog gone within
/// lease_ttl + a few seconds of the last kill.
async fn sigkill_a_random_worker_every_few_seconds_loses_nothing(db: Db) {
    sigkill_loop(Tuning::fleet().on(db)).await;
}

/// The same with published rows deleted (`outbox.keep_published =
/// false`): nothing lost, nothing left behind.
async fn sigkill_a_random_worker_with_rows_deleted_on_publish_loses_nothing(db: Db) {
    let env = sigkill_loop(Tuning {
        keep_published: false,
        ..Tuning::fleet().on(db)
    })
    .await;
    assert_eq!(env.count("true").await, 0, "published rows left behind");
}

async fn sigkill_loop(tuning: Tuning) -> TestEnv {
    let env = TestEnv::with(tuning).await;
    let queue = unique("q");
    drop(QueueReader::open(&amqp_url(), &queue).await.unwrap());
    let mut fleet: Vec<WorkerProcess> = (0..3).map(|_| env.spawn_worker(&["--silent"])).collect();
    let producers = Producers::start(&env, "", &queue, 4, 400.0);
    let length = scenario_length(20, 60);
    let start = Instant::now();
    let mut kills = 0;
    let mut in_flight_bound = 0;
    let mut round = 0u32;
    while start.elapsed() < length {
        tokio::time::sleep(Duration::from_secs(3)).await;
        round += 1;
        let victim = (uuid::Uuid::new_v4().as_u128() % 3) as usize;
        let pid = fleet[victim].pid();
        let held: i64 = env
            .db
            .value(&format!(
                "SELECT count(*) FROM outbox_partitions p JOIN outbox_workers w
                 ON w.worker_id = p.lease_owner WHERE w.pid = {pid}"
            ))
            .await;
        fleet[victim].signal("KILL");
        fleet[victim].wait(Duration::from_secs(5));
        kills += 1;
        in_flight_bound += held.max(1) as u64 * 100;
        fleet[victim] = env.spawn_worker(&["--silent"]);
        let _ = round;
    }
    let last_kill = Instant::now();
    let acknowledged = producers.stop().await;
    let drained = wait_drained(&env, Duration::from_secs(60)).await;
    let v = judge_queue(&env, &amqp_url(), &queue).await;
    println!(
        "SIGKILL loop: {kills} kills over {:?}, {acknowledged} commits acknowledged; drained {drained:?} after the last kill; {}; duplicate bound {in_flight_bound}",
        last_kill.duration_since(start),
        v.summary()
    );
    assert!(v.is_clean(), "{}", v.summary());
    assert!(v.duplicates <= in_flight_bound, "{}", v.summary());
    assert!(
        drained <= Duration::from_secs(3 + 5),
        "drained {drained:?} after the last kill"
    );
    terminate_all(&mut fleet);
    env
}

// ------------------------------------------------------------- scenario 3

/// kill -9 of RabbitMQ during a drain, restarted, twice.
async fn rabbitmq_killed_with_sigkill_twice_during_a_drain_loses_nothing(db: Db) {
    broker_kill9_twice(Tuning::fleet().on(db)).await;
}

/// The same with published rows deleted (`outbox.keep_published =
/// false`): nothing lost, nothing left behind.
async fn rabbitmq_killed_twice_with_rows_deleted_on_publish_loses_nothing(db: Db) {
    let env = broker_kill9_twice(Tuning {
        keep_published: false,
        ..Tuning::fleet().on(db)
    })
    .await;
    assert_eq!(env.count("true").await, 0, "published rows left behind");
}

async fn broker_kill9_twice(tuning: Tuning) -> TestEnv {
    let broker = PrivateBroker::start();
    let env = TestEnv::with(Tuning {
        amqp_url: Some(broker.url()),
        confirm_timeout: "3s",
        ..tuning
    })
    .await;
    let queue = unique("q");
    drop(QueueReader::open(&broker.url(), &queue).await.unwrap());
    // The queue's declaration must reach the broker's disk before the
    // first kill -9: a clean-clone CI run killed it about 2 s after the
    // declaration and RabbitMQ came back without the queue (every publish
    // then returned NO_ROUTE). The broker's loss, not the relay's.
    let declared = Instant::now();
    // A backlog that outlasts both kills even on a fast machine (the
    // producers keep the drain going too); reading it back is most of this
    // scenario's time, so CI's is smaller.
    let backlog = scenario_length(8, 20).as_secs() as usize * 1_000;
    seed(&env, &queue, backlog).await;
    let mut fleet = [
        env.spawn_worker(&["--silent"]),
        env.spawn_worker(&["--silent"]),
    ];
    let producers = Producers::start(&env, "", &queue, 3, 300.0);
    let mut recoveries = Vec::new();
    for _ in 0..2 {
        let before = env.published().await;
        wait_publishing(&env, before, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        tokio::time::sleep_until((declared + Duration::from_secs(5)).into()).await;
        broker.kill9();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let down = env.published().await;
        broker.run("start");
        let resumed = wait_publishing(&env, down, Duration::from_secs(60)).await;
        recoveries.push(resumed);
    }
    producers.stop().await;
    let drained = wait_drained(&env, Duration::from_secs(120)).await;
    let v = judge_queue(&env, &broker.url(), &queue).await;
    println!(
        "RabbitMQ kill -9 twice: publishing resumed {recoveries:?} after each restart; drained {drained:?} later; {}",
        v.summary()
    );
    assert!(v.is_clean(), "{}", v.summary());
    terminate_all(&mut fleet);
    env
}

// ------------------------------------------------------------- scenario 4

/// The database crashed during a drain (PostgreSQL stopped with `-m
/// immediate`, MariaDB's server killed with SIGKILL) and started again;
/// then the relay's connections terminated repeatedly.
async fn the_database_crashed_and_restarted_during_a_drain_loses_nothing(db: Db) {
    let server = PrivateDatabase::start(db);
    let env = TestEnv::with(Tuning {
        server_admin_url: Some(server.admin_url()),
        ..Tuning::fleet().on(db)
    })
    .await;
    let queue = unique("q");
    drop(QueueReader::open(&amqp_url(), &queue).await.unwrap());
    seed(&env, &queue, 20_000).await;
    let mut fleet = [
        env.spawn_worker(&["--silent"]),
        env.spawn_worker(&["--silent"]),
    ];
    let producers = Producers::start(&env, "", &queue, 3, 300.0);
    wait_publishing(&env, 500, Duration::from_secs(30)).await;
    server.crash();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.restart();
    let down = env.count("published_at IS NOT NULL").await;
    let resumed = wait_publishing(&env, down, Duration::from_secs(60)).await;

    // Then the relay's connections, killed five times over two seconds.
    let mut terminated = 0;
    for _ in 0..5 {
        terminated += env
            .db
            .kill_worker_connections(
                &server.admin_url(),
                &env.db_name,
                &fleet.iter().map(WorkerProcess::pid).collect::<Vec<_>>(),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    producers.stop().await;
    let drained = wait_drained(&env, Duration::from_secs(120)).await;
    let v = judge_queue(&env, &amqp_url(), &queue).await;
    println!(
        "database crashed for 3 s: publishing resumed {resumed:?} after the restart; {terminated} relay backends terminated after; drained {drained:?} later; {}",
        v.summary()
    );
    assert!(terminated > 0);
    assert!(v.is_clean(), "{}", v.summary());
    terminate_all(&mut fleet);
}

// ------------------------------------------------------------- full disk

/// The database's disk fills (its data on a small filesystem of its own,
/// a balloon file taking the rest) while producers write and the fleet
/// publishes. The producers' writes fail — theirs to handle; the relay
/// loses nothing, publishes nothing out of order, says what happened in
/// one line naming the cause, and resumes by itself once the space is
/// freed. A server that stopped itself on the full disk (PostgreSQL
/// PANICs when it cannot write its log) is started again after the space
/// is freed, as its supervisor would; the relay is not touched.
async fn a_full_disk_under_the_database_loses_nothing_and_resumes_by_itself(db: Db) {
    let disk = SmallDisk::mount(match db {
        Db::MariaDb => 640,
        _ => 384,
    });
    let server = PrivateDatabase::start_in(db, &disk.dir);
    let env = TestEnv::with(Tuning {
        server_admin_url: Some(server.admin_url()),
        ..Tuning::fleet().on(db)
    })
    .await;
    let queue = unique("q");
    drop(QueueReader::open(&amqp_url(), &queue).await.unwrap());
    let mut fleet = [
        env.spawn_worker(&["--silent"]),
        env.spawn_worker(&["--silent"]),
    ];
    let producers = Producers::start(&env, "", &queue, 3, 300.0);
    wait_publishing(&env, 300, Duration::from_secs(30)).await;

    // A backlog the fleet works through while the disk is full: its
    // records need new pages (and the log new segments) soon. The fleet
    // is stopped while the backlog is written and the disk filled: left
    // running, it once drained all 20,000 rows before `dd` had filled the
    // disk, and had nothing to say.
    for w in &fleet {
        w.signal("STOP");
    }
    seed(&env, &queue, 20_000).await;
    disk.fill(64 * 1024);
    for w in &fleet {
        w.signal("CONT");
    }
    let full_at = Instant::now();
    let full_for = scenario_length(10, 60);
    tokio::time::sleep(full_for).await;
    disk.free();
    let crashed = !server.answers().await;
    if crashed {
        server.restart();
    }
    let freed = Instant::now();
    let published = loop {
        if let Ok(n) = tokio::time::timeout(
            Duration::from_secs(5),
            env.count("published_at IS NOT NULL"),
        )
        .await
        {
            break n;
        }
    };
    let resumed = wait_publishing(&env, published, Duration::from_secs(60)).await;
    let produced = producers.stop().await;
    let drained = wait_drained(&env, Duration::from_secs(120)).await;
    let v = judge_queue(&env, &amqp_url(), &queue).await;
    // What the workers said about it: the database's own words for a full
    // disk, in a line of their own.
    let said: Vec<String> = fleet
        .iter()
        .flat_map(|w| w.log_text().lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            l.contains("No space left on device")
                || l.contains("is full")
                || l.contains("Disk full")
        })
        .collect();
    println!(
        "disk full for {:?} ({}): publishing resumed {resumed:?} after the space was freed; {produced} commits acknowledged; drained {drained:?} later; {}; the workers said it in {} line(s), e.g. {:?}",
        freed.duration_since(full_at),
        if crashed {
            "the server stopped itself and was started again"
        } else {
            "the server stayed up"
        },
        v.summary(),
        said.len(),
        said.first()
    );
    assert!(
        !said.is_empty(),
        "no worker said the disk is full:\n{}",
        fleet[0].log_text()
    );
    assert!(v.is_clean(), "{}", v.summary());
    // A record that fails on the full disk is retried, not its rows sent
    // again: at most what a bucket has confirmed but not recorded repeats
    // when its lease changes hands — the batch being recorded and the one
    // confirmed behind it (read ahead), 2 × 100 rows per bucket — never
    // the backlog over and over (a CI run saw 3,000 on MariaDB, with
    // leases lapsing while the disk was full).
    let bound = 16 * 2 * 100;
    assert!(
        v.duplicates <= bound,
        "{} duplicates (more than {bound}): rows were sent again while their records failed",
        v.duplicates
    );
    assert!(
        fleet.iter_mut().all(|w| w.running()),
        "a worker exited on the full disk"
    );
    terminate_all(&mut fleet);
}

// ------------------------------------------------------------- scenario 6

/// The binding a bucket's messages route through is removed mid-run: the
/// heads fail as unroutable with a visible error and nothing behind them is
/// published; once the binding is back, everything goes out in order.
async fn a_binding_removed_mid_run_halts_at_the_head_and_resumes_in_order(db: Db) {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
    let env = TestEnv::on(db).await;
    let queue = unique("q");
    let exchange = unique("ex");
    drop(QueueReader::open(&amqp_url(), &queue).await.unwrap());
    let conn = lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        exchange.as_str().into(),
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        lapin::types::FieldTable::default(),
    )
    .await
    .unwrap();
    let bind = || {
        ch.queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "orders".into(),
            QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
    };
    bind().await.unwrap();
    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    let producers = Producers::start(&env, &exchange, "orders", 3, 300.0);
    wait_publishing(&env, 300, Duration::from_secs(30)).await;

    ch.queue_unbind(
        queue.as_str().into(),
        exchange.as_str().into(),
        "orders".into(),
        lapin::types::FieldTable::default(),
    )
    .await
    .unwrap();
    let unbound = Instant::now();
    while env.count("last_error LIKE 'unroutable%'").await == 0 {
        assert!(
            unbound.elapsed() < Duration::from_secs(10),
            "no unroutable error"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let detected = unbound.elapsed();
    // Batches confirmed before the unbind may still be recorded a moment
    // later (longer on a loaded machine): wait until the count holds still
    // for a second (a bucket that went on publishing past its failed head
    // would never hold still), then watch it for 3 s more.
    let mut halted = env.count("published_at IS NOT NULL").await;
    let settle = Instant::now();
    let mut still_since = Instant::now();
    while still_since.elapsed() < Duration::from_secs(1) {
        assert!(
            settle.elapsed() < Duration::from_secs(15),
            "publishing never stopped after the unbind"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = env.count("published_at IS NOT NULL").await;
        if now != halted {
            (halted, still_since) = (now, Instant::now());
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // What must never happen: a message published behind an earlier one of
    // its key that failed (G2). (The count itself may still move: a batch
    // sent before the unbind is recorded when its confirms come, which on a
    // loaded CI machine took longer than the second of stillness above — 11
    // rows once.) Per key, not per bucket: three producers share the
    // buckets, so a lower id of another key can commit after a higher one
    // was published — the relay publishes in id order among the rows it
    // sees — and that late row may be the one the unbind fails (seen once
    // in CI: 1 row "behind", 0 recorded after the stillness). Each key's
    // rows are committed one after another, so behind a failed row of its
    // key nothing may be published; a bucket that went on past its head
    // would publish its keys' later rows and fail this.
    let behind = env
        .count(
            "published_at IS NOT NULL AND EXISTS (SELECT 1 FROM outbox h
               WHERE h.partition_key = outbox.partition_key
                 AND h.message_key = outbox.message_key AND h.id < outbox.id
                 AND h.published_at IS NULL AND h.last_error LIKE 'unroutable%')",
        )
        .await;
    let late = env.count("published_at IS NOT NULL").await - halted;
    assert_eq!(
        behind, 0,
        "published behind a failed message of its key while the binding was gone ({late} recorded after the stillness)"
    );
    halted += late;
    let status = env.command(&["status", "--json"]).output().unwrap();
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let blocked = s["totals"]["blocked_buckets"].as_i64().unwrap();
    assert!(blocked > 0, "{s}");
    let shown = s["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["head_error"].as_str())
        .filter(|e| e.starts_with("unroutable"))
        .count();
    assert!(shown > 0, "no head error in status: {s}");

    bind().await.unwrap();
    let rebound = Instant::now();
    let resumed = wait_publishing(&env, halted, Duration::from_secs(30)).await;
    producers.stop().await;
    let drained = wait_drained(&env, Duration::from_secs(60)).await;
    conn.close(200, "bye".into()).await.ok();
    let v = judge_queue(&env, &amqp_url(), &queue).await;
    println!(
        "binding removed: first unroutable error after {detected:?}, {blocked} buckets blocked, {halted} published before; resumed {resumed:?} after re-binding, drained {:?} after it; {}",
        rebound.elapsed().saturating_sub(resumed).max(drained),
        v.summary()
    );
    assert!(v.is_clean(), "{}", v.summary());
    assert!(worker.terminate(EXIT_WITHIN).success());
}

// ------------------------------------------------------------- scenario 7

/// Scale 2 → 6 → 2 workers every 4 s, under load: one owner per bucket per
/// epoch, first deliveries of a bucket never go back to an older epoch, no
/// bucket unowned longer than lease_ttl + lease_renew, nothing lost.
async fn scaling_2_6_2_every_few_seconds_keeps_one_owner_per_bucket(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue)
        .await
        .unwrap()
        .keep_log();
    let mut fleet: Vec<WorkerProcess> = (0..2).map(|_| env.spawn_worker(&["--silent"])).collect();
    let producers = Producers::start(&env, "", &queue, 4, 400.0);

    // Samples every 100 ms how long each bucket has been without a valid lease.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (db, stop) = (env.db.clone(), stop.clone());
        let query = format!(
            "SELECT partition_key, lease_owner IS NOT NULL AND lease_until > {}
             FROM outbox_partitions",
            env.db.now()
        );
        tokio::spawn(async move {
            let mut unowned_since: HashMap<String, Instant> = HashMap::new();
            let mut worst = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let rows: Vec<(String, bool)> = db.rows(&query).await;
                for (bucket, owned) in rows {
                    if owned {
                        if let Some(since) = unowned_since.remove(&bucket) {
                            worst = worst.max(since.elapsed());
                        }
                    } else {
                        unowned_since.entry(bucket).or_insert_with(Instant::now);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for since in unowned_since.values() {
                worst = worst.max(since.elapsed());
            }
            worst
        })
    };

    let length = scenario_length(24, 60);
    let start = Instant::now();
    let mut changes = 0;
    while start.elapsed() < length {
        tokio::time::sleep(Duration::from_secs(4)).await;
        if fleet.len() == 2 {
            while fleet.len() < 6 {
                fleet.push(env.spawn_worker(&["--silent"]));
            }
        } else {
            while fleet.len() > 2 {
                let mut w = fleet.pop().unwrap();
                assert!(w.terminate(EXIT_WITHIN).success());
            }
        }
        changes += 1;
    }
    // Settle, then measure the last state too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let worst_unowned = sampler.await.unwrap();
    producers.stop().await;
    wait_drained(&env, Duration::from_secs(60)).await;

    let shared = epochs_acquired_twice(&env).await;
    let acquisitions: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_lease_events WHERE action = 'acquire'")
        .await;
    // Every hand-over was a release and an acquisition: no bucket waited
    // for a lease to expire.
    let after_expiry: i64 = env
        .db
        .value(
            "SELECT count(*) FROM outbox_lease_events WHERE action = 'acquire' AND reason LIKE 'expired%'",
        )
        .await;
    let committed = env.count("true").await as usize;
    let (all, v) = read_and_judge(&mut reader, &env, committed, Duration::from_secs(60)).await;
    assert!(all, "{}", v.summary());
    let epoch_regressions = epoch_regressions(&reader);
    println!(
        "scale 2↔6: {changes} changes over {length:?}, {acquisitions} lease acquisitions ({after_expiry} of an expired lease); longest a bucket went unowned {worst_unowned:?}; {}",
        v.summary()
    );
    assert!(
        shared.is_empty(),
        "epochs acquired by two workers: {shared:?}"
    );
    assert_eq!(epoch_regressions, 0);
    // Unowned between a release and the new owner's acquisition: a joining
    // worker's first cycles and the cascade of re-targets while 4 workers
    // join one after another take 1-3 s here; when the 2-core machine is
    // busy with other tests a starved worker can also miss its renewals
    // and a lease expires (seen once: 1 of 177 acquisitions, 3.5 s). The
    // bound is lease_ttl + lease_renew with room for that.
    assert!(
        worst_unowned <= Duration::from_secs(8),
        "a bucket went unowned for {worst_unowned:?} ({after_expiry} acquisitions of an expired lease)"
    );
    assert!(v.is_clean(), "{}", v.summary());
    terminate_all(&mut fleet);
}

// ------------------------------------------------------------- scenario 8

/// Corrupted claims: a bucket whose claim no worker holds. One that claims
/// to last a year (longer than any claim_ttl) is ignored at once; one within
/// the TTL holds its bucket until it lapses, and no longer. The other
/// buckets never wait, nothing is lost, order holds.
async fn corrupted_claim_tokens_hold_their_bucket_no_longer_than_the_claim_ttl(db: Db) {
    let env = TestEnv::on(db).await;
    let p = env.partitioner();
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    for bucket in ["p01", "p02", "p03"] {
        let keys = keys_in_bucket(p, bucket, 3, "c");
        for round in 0..3 {
            for k in &keys {
                env.db
                    .enqueue(Message::new(
                        k.clone(),
                        "",
                        queue.clone(),
                        round.to_string(),
                    ))
                    .await;
            }
        }
    }
    // p01: a year-long claim nobody holds; p02: one that lapses in 4 s.
    let corrupt = |bucket: &str, secs: i64| {
        format!(
            "UPDATE outbox_partitions SET claim_token = {}, claimed_until = {}
             WHERE partition_key = '{bucket}'",
            env.db.random_uuid(),
            env.db.now_plus(secs)
        )
    };
    env.db.exec(&corrupt("p01", 365 * 86_400)).await;
    env.db.exec(&corrupt("p02", 4)).await;
    let start = Instant::now();
    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    let bucket_done = |bucket: &'static str| {
        let env = &env;
        async move {
            while env
                .count(&format!(
                    "partition_key = '{bucket}' AND published_at IS NULL"
                ))
                .await
                > 0
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), bucket_done("p03"))
        .await
        .expect("an untouched bucket waited");
    tokio::time::timeout(Duration::from_secs(10), bucket_done("p01"))
        .await
        .expect("a year-long claim held its bucket");
    let year_claim = start.elapsed();
    tokio::time::timeout(Duration::from_secs(20), bucket_done("p02"))
        .await
        .expect("a lapsing claim held its bucket past its end");
    let short_claim = start.elapsed();
    let (all, v) = read_and_judge(&mut reader, &env, 27, Duration::from_secs(10)).await;
    println!(
        "corrupted claims: year-long claim's bucket drained {year_claim:?} after start, 4 s claim's bucket {short_claim:?}; {}",
        v.summary()
    );
    assert!(year_claim < Duration::from_secs(4), "{year_claim:?}");
    assert!(short_claim >= Duration::from_secs(3), "{short_claim:?}");
    assert!(all && v.is_clean(), "{}", v.summary());
    assert!(worker.terminate(EXIT_WITHIN).success());
}

/// A message beyond the broker's own size limit (RabbitMQ's
/// `max_message_size`, lowered to 1 MiB here; outboxd's own limit is
/// higher) and a row whose headers nest too deep: each fails with a clear
/// error, is parked after max_attempts, and blocks no other bucket.
async fn a_message_beyond_the_brokers_limit_and_bad_headers_are_parked_with_clear_errors(db: Db) {
    let broker = PrivateBroker::start();
    broker.ctl(&[
        "eval",
        "application:set_env(rabbit, max_message_size, 1048576).",
    ]);
    let env = TestEnv::with(Tuning {
        amqp_url: Some(broker.url()),
        max_attempts: 2,
        ..Tuning::default().on(db)
    })
    .await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&broker.url(), &queue).await.unwrap();
    let big = env
        .db
        .enqueue(Message::new(
            "big",
            "",
            queue.clone(),
            vec![7u8; 2 * 1024 * 1024],
        ))
        .await;
    let mut deep = serde_json::json!(1);
    for _ in 0..20 {
        deep = serde_json::json!({ "n": deep });
    }
    let nested = env
        .db
        .enqueue(Message::new("nested", "", queue.clone(), "x").header("deep", deep))
        .await;
    let mut good = Vec::new();
    for i in 0..30 {
        good.push(
            env.db
                .enqueue(Message::new(format!("g{i}"), "", queue.clone(), "x"))
                .await,
        );
    }
    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    env.wait_count("failed_at IS NOT NULL", 2, Duration::from_secs(30))
        .await;
    let errors: HashMap<i64, String> = env
        .db
        .rows::<(i64, String)>("SELECT id, last_error FROM outbox WHERE failed_at IS NOT NULL")
        .await
        .into_iter()
        .collect();
    println!("parked: {errors:?}");
    assert!(errors[&big].contains("larger than"), "{errors:?}");
    assert!(errors[&nested].contains("nested deeper"), "{errors:?}");
    assert!(
        reader
            .read_until(Duration::from_secs(20), |c| good
                .iter()
                .all(|id| c.has(*id)))
            .await
            .unwrap(),
        "{}",
        reader.summary()
    );
    assert!(!reader.checker.has(big) && !reader.checker.has(nested));
    assert!(worker.terminate(EXIT_WITHIN).success());
}

// ----------------------------------------------------------- clock skew

/// libfaketime (Debian's `faketime` package), preloaded into a worker: its
/// wall clock (and its monotonic one, by the same constant) is off by
/// `FAKETIME`.
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Skewed clocks: a fleet of three whose wall clocks are off by +30 s,
/// −30 s and +5 min, under load; every 3 s one of them is SIGKILLed (and
/// restarted with its skew) or SIGSTOPped for longer than its lease (and
/// resumed, believing for a moment that it still holds it). No epoch is
/// acquired by two workers, no delivery under a superseded epoch (nothing
/// published under a lease its worker no longer held) that its worker did
/// not report, nothing is lost, order is kept. (libfaketime makes every
/// clock read a system call, where a SIGSTOP takes effect, so a stop often
/// lands between the send gate's check and its write: those frames go out
/// late, and the worker reports them — `src/amqp/gate.rs`.) Every lease
/// decision is made on
/// the database's clock and every local timeout on the monotonic clock
/// (DESIGN.md, *Clocks*), so the skew must not matter. (Not on SQLite: its
/// "database clock" is each process's own — processes that share a file
/// share a host, and so a clock.)
async fn workers_with_skewed_clocks_keep_fencing_and_lose_nothing(db: Db) {
    assert!(
        std::path::Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} is missing: apt-get install faketime (scripts/test.sh does)"
    );
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue)
        .await
        .unwrap()
        .keep_log();
    let skews = [("+30s", 30), ("-30s", -30), ("+5m", 300)];
    let spawn = |skew: &str| {
        env.spawn_worker_with(
            None,
            &env.config_path,
            &["--ui", "127.0.0.1:0"],
            &[("LD_PRELOAD", FAKETIME_LIB), ("FAKETIME", skew)],
        )
    };
    let mut fleet: Vec<WorkerProcess> = skews.iter().map(|(s, _)| spawn(s)).collect();
    // The skew took: each worker's log is stamped by its own clock.
    for (w, (skew, secs)) in fleet.iter().zip(skews) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let stamp = loop {
            let log = w.log_text();
            if let Some(t) = log
                .lines()
                .find_map(|l| l.split_whitespace().next())
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            {
                break t;
            }
            assert!(
                Instant::now() < deadline,
                "no log line from the {skew} worker"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let off = (stamp.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
        assert!(
            (off - secs).abs() <= 5,
            "the {skew} worker's clock is off by {off} s, not {secs} s"
        );
    }
    let producers = Producers::start(&env, "", &queue, 4, 400.0);
    let length = scenario_length(18, 120);
    let start = Instant::now();
    let (mut kills, mut stops) = (0, 0);
    for round in 0usize.. {
        if start.elapsed() >= length {
            break;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let victim = round % 3;
        if round % 2 == 0 {
            fleet[victim].signal("KILL");
            fleet[victim].wait(Duration::from_secs(5));
            fleet[victim] = spawn(skews[victim].0);
            kills += 1;
        } else {
            fleet[victim].signal("STOP");
            fleet[victim].wait_stopped();
            // Longer than the fleet's 3 s lease: its buckets move on.
            tokio::time::sleep(Duration::from_secs(4)).await;
            fleet[victim].signal("CONT");
            stops += 1;
        }
    }
    producers.stop().await;
    wait_drained(&env, Duration::from_secs(60)).await;
    let shared = epochs_acquired_twice(&env).await;
    let acquisitions: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_lease_events WHERE action = 'acquire'")
        .await;
    let committed = env.count("true").await as usize;
    let (all, v) = read_and_judge(&mut reader, &env, committed, Duration::from_secs(60)).await;
    let regressions = epoch_regressions(&reader);
    let late = late_deliveries(&reader);
    let reported = late_writes_reported(&env);
    let unreported: Vec<_> = late
        .iter()
        .filter(|(key, epoch, _)| !reported.contains(&format!("\"{key} epoch {epoch}\"")))
        .collect();
    println!(
        "clock skew (+30 s, -30 s, +5 min): {kills} kills, {stops} stops over {length:?}; {acquisitions} lease acquisitions, {} acquired twice; {regressions} epoch regressions, {} deliveries under a superseded epoch, {} of them not reported by their worker; {}",
        shared.len(),
        late.len(),
        unreported.len(),
        v.summary()
    );
    assert!(all, "{}", v.summary());
    assert!(
        shared.is_empty(),
        "epochs acquired by two workers: {shared:?}"
    );
    assert_eq!(regressions, 0, "first deliveries under an older epoch");
    assert!(
        unreported.is_empty(),
        "sent after the bucket was taken over, and not reported: {unreported:?}"
    );
    assert!(v.is_clean(), "{}", v.summary());
    // Each live worker's own count of late writes is what it reported.
    for w in &fleet {
        let counted = metric(&wait_for_dashboard_url(w), "outboxd_late_writes_total").await;
        let logged = w.log_text().matches(LATE_WRITE).count();
        assert_eq!(counted as usize, logged, "outboxd_late_writes_total");
    }
    terminate_all(&mut fleet);
}

/// What a worker's log says of frames written after their lease's trust
/// lapsed (`src/amqp/gate.rs`).
const LATE_WRITE: &str = "written after their lease's trust deadline";

/// Every line of the test's worker logs (killed workers' too) reporting
/// frames written after their lease's trust lapsed (`src/amqp/gate.rs`).
fn late_writes_reported(env: &TestEnv) -> String {
    let logs = std::fs::read_dir(&env.dir).expect("the test's directory");
    let mut reported = String::new();
    for path in logs.filter_map(|e| Some(e.ok()?.path())) {
        if path.extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains(LATE_WRITE)) {
                reported.push_str(line);
                reported.push('\n');
            }
        }
    }
    reported
}

on_every_db!(
    a_memory_alarm_blocks_publishing_and_the_backlog_drains_when_it_clears,
    the_checker_catches_a_relay_that_reorders_skips_repeats_or_invents,
    sigkill_a_random_worker_every_few_seconds_loses_nothing,
    rabbitmq_killed_with_sigkill_twice_during_a_drain_loses_nothing,
    a_binding_removed_mid_run_halts_at_the_head_and_resumes_in_order,
    scaling_2_6_2_every_few_seconds_keeps_one_owner_per_bucket,
    corrupted_claim_tokens_hold_their_bucket_no_longer_than_the_claim_ttl,
    a_message_beyond_the_brokers_limit_and_bad_headers_are_parked_with_clear_errors,
);

// A crash of the database server: SQLite has no server (a file; a worker
// that loses its host loses the file with it).
on_server_dbs!(
    the_database_crashed_and_restarted_during_a_drain_loses_nothing,
    a_full_disk_under_the_database_loses_nothing_and_resumes_by_itself,
    workers_with_skewed_clocks_keep_fencing_and_lose_nothing,
    sigkill_a_random_worker_with_rows_deleted_on_publish_loses_nothing,
    rabbitmq_killed_twice_with_rows_deleted_on_publish_loses_nothing,
);
