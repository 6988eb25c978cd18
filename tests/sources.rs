//! Several outboxes (`[[source]]`) served by one fleet: real worker
//! processes, real databases (two PostgreSQL databases and a MariaDB one)
//! and RabbitMQ (one source on a vhost of its own).
//!
//! - every source's messages arrive complete and in order, each source's
//!   checker clean, none on another source's vhost, with coordination
//!   per source (each database has its own workers' rows and leases);
//! - a source that cannot be served (schema not migrated, wrong password)
//!   is reported in one line naming it while the others drain at once; once
//!   migrated, it is served without a restart;
//! - SIGHUP joins a source added to the file, leaves one removed from it
//!   (its buckets move to the other worker, nothing lost), and keeps
//!   running on a file that does not parse;
//! - across two test hosts, a source whose server one host cannot reach,
//!   then a source whose server is stopped, leaves the other sources
//!   publishing at ≥ 0.8 × their rate (measured, printed).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::hosts::{Fault, Lab};
use common::*;
use outboxd::demo::QueueReader;
use outboxd::producer::Message;

/// A `[[source]]` entry for `env`'s database, with `extra` lines.
fn source(name: &str, env: &TestEnv, extra: &str) -> String {
    format!(
        "\n[[source]]\nname = \"{name}\"\nurl = \"{}\"\n{extra}",
        env.worker_db_url
    )
}

/// A config file: `base`'s settings at the top level, `sources` after.
fn sources_config(base: &TestEnv, sources: &[String]) -> PathBuf {
    base.config_variant("sources", |text| format!("{text}{}", sources.concat()))
}

/// The log lines from the first SIGHUP on.
fn since_sighup(log: &str) -> &str {
    log.find("SIGHUP").map_or(log, |i| &log[i..])
}

/// A vhost of its own on the shared broker; removed on drop.
struct Vhost(String);

impl Vhost {
    fn new() -> Self {
        let name = unique("vh");
        ctl(&["add_vhost", &name]);
        ctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"]);
        Self(name)
    }

    fn url(&self) -> String {
        amqp_url().replace("/%2f", &format!("/{}", self.0))
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        ctl(&["delete_vhost", &self.0]);
    }
}

/// shop's queue name on the default vhost received nothing.
async fn assert_nothing_reached(stray: &mut QueueReader) {
    let _ = stray
        .read_until(Duration::from_millis(500), |_| false)
        .await;
    assert_eq!(
        stray.checker.deliveries(),
        0,
        "a message of shop's reached the default vhost"
    );
}

/// `rabbitmqctl ARGS` against the shared broker.
fn ctl(args: &[&str]) {
    let state = std::env::var("OUTBOXD_STATE_DIR").expect("scripts/services.sh env");
    let port = amqp_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .unwrap()
        .to_string();
    let status = std::process::Command::new("bash")
        .arg(repo_dir().join("scripts/services.sh"))
        .args(["rabbit", "ctl"])
        .arg(PathBuf::from(state).join("rabbit"))
        .arg(port)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "rabbitmqctl {args:?}");
}

/// Every worker's log, one after the other.
fn all_logs(workers: &[WorkerProcess]) -> String {
    let logs: Vec<String> = workers.iter().map(|w| w.log_text()).collect();
    logs.join("\n----\n")
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sources_two_workers_each_source_in_order_and_on_its_own_broker() {
    let vhost = Vhost::new();
    let billing = TestEnv::with(Tuning::fleet()).await;
    let shop = TestEnv::with(Tuning::fleet()).await;
    let stock = TestEnv::with(Tuning::fleet().on(Db::MariaDb)).await;
    let config = sources_config(
        &billing,
        &[
            source("billing", &billing, ""),
            source(
                "shop",
                &shop,
                &format!("[source.amqp]\nurl = \"{}\"\n", vhost.url()),
            ),
            source("stock", &stock, "[source.outbox]\nbatch_size = 50\n"),
        ],
    );
    let names = ["billing", "shop", "stock"];
    let envs = [&billing, &shop, &stock];
    let queues = [unique("q"), unique("q"), unique("q")];
    let mut readers = vec![
        QueueReader::open(&amqp_url(), &queues[0]).await.unwrap(),
        QueueReader::open(&vhost.url(), &queues[1]).await.unwrap(),
        QueueReader::open(&amqp_url(), &queues[2]).await.unwrap(),
    ];
    // shop's queue name on the default vhost: must stay empty.
    let mut stray = QueueReader::open(&amqp_url(), &queues[1]).await.unwrap();
    let mut workers: Vec<WorkerProcess> = (0..2)
        .map(|_| billing.spawn_worker_on(None, &config, &["--silent"]))
        .collect();
    let per_source = 1_500;
    let producing: Vec<_> = envs
        .iter()
        .zip(&queues)
        .map(|(env, queue)| {
            tokio::spawn(produce_evenly(
                env.db.clone(),
                queue.clone(),
                per_source,
                40,
                Duration::from_secs(6),
            ))
        })
        .collect();
    for p in producing {
        p.await.unwrap();
    }
    for ((name, env), reader) in names.iter().zip(envs).zip(&mut readers) {
        let (all, verdict) = read_and_judge(reader, env, per_source, Duration::from_secs(60)).await;
        println!("{name}: {}", verdict.summary());
        assert!(all && verdict.is_clean(), "{name}: {}", verdict.summary());
        assert_eq!(verdict.unique, per_source, "{name}");
    }
    assert_nothing_reached(&mut stray).await;

    // Each source coordinates in its own database: both workers have a
    // row there, and every bucket is leased — within a few lease periods
    // (beside the suite on a slow 2-core machine, a heartbeat may be late
    // once and the fleet rebalance; a source whose pool is stuck never
    // gets there).
    for (name, env) in names.iter().zip(envs) {
        let from = Instant::now();
        loop {
            let live = live(env).await;
            let held = leases(env).await.iter().filter(|l| l.valid).count();
            if live.len() == 2 && held == 16 {
                break;
            }
            assert!(
                from.elapsed() < Duration::from_secs(20),
                "{name}: live workers {live:?}, {held} buckets leased; logs:\n{}",
                all_logs(&workers)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!(
            "{name}: both workers live, every bucket leased (after {:.1?})",
            from.elapsed()
        );
    }
    terminate_all(&mut workers);
    for w in &workers {
        let log = w.log_text();
        for name in names {
            assert!(
                log.contains(&format!("source{{source={name}}}")),
                "no line names {name}:\n{log}"
            );
        }
    }
}

/// Beside two good sources, one whose schema is not migrated and one with
/// a wrong password: the good ones drain at once; each bad one is one line
/// naming it (again after a growing pause); the unmigrated one, once
/// migrated with `outboxd migrate --source`, is served without a restart.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_cannot_be_served_leaves_the_others_running() {
    let good = TestEnv::with(Tuning::fleet()).await;
    let other = TestEnv::with(Tuning::fleet().on(Db::MariaDb)).await;
    let bare = TestEnv::with(Tuning {
        migrate: false,
        ..Tuning::fleet()
    })
    .await;
    let wrong_password =
        good.worker_db_url
            .replacen("outboxd:outboxd@", "outboxd:not-the-password@", 1);
    assert_ne!(
        wrong_password, good.worker_db_url,
        "the test URL has a password"
    );
    let config = sources_config(
        &good,
        &[
            source("good", &good, ""),
            source("other", &other, ""),
            source("bare", &bare, ""),
            format!("\n[[source]]\nname = \"locked-out\"\nurl = \"{wrong_password}\"\n"),
        ],
    );
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let draining = tokio::spawn(async move {
        let _ = reader.read_until(Duration::from_secs(120), |_| false).await;
    });
    for env in [&good, &other] {
        for i in 0..300 {
            env.db
                .enqueue(Message::new(
                    format!("k{}", i % 20),
                    "",
                    queue.as_str(),
                    "x",
                ))
                .await;
        }
    }
    let started = Instant::now();
    let mut worker = good.spawn_worker_on(None, &config, &["--silent"]);
    for env in [&good, &other] {
        let published = env
            .wait_count("published_at IS NOT NULL", 300, Duration::from_secs(30))
            .await;
        assert_eq!(published, 300, "{}", worker.log_text());
    }
    println!("the good sources drained in {:?}", started.elapsed());
    let log = worker.log_text();
    for (name, why) in [("bare", "outboxd migrate"), ("locked-out", "password")] {
        let said: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("source {name} is not served:")))
            .collect();
        assert!(
            !said.is_empty(),
            "no line says {name} is not served:\n{log}"
        );
        assert!(said[0].contains(why), "{}", said[0]);
        assert!(!said[0].contains("not-the-password"), "{}", said[0]);
    }

    // `status --all-sources`: every source, the unreadable ones said so in
    // their place, exit 1.
    let out = good
        .command_with(&config, &["status", "--all-sources"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for name in ["good", "other", "bare", "locked-out"] {
        assert!(text.contains(&format!("== source {name} ==")), "{text}");
    }
    assert!(
        text.contains("cannot read it: ") && !text.contains("not-the-password"),
        "{text}"
    );
    // A command acting on one source must be told which.
    let out = good.command_with(&config, &["status"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("name one with --source NAME"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Migrated while the worker runs: served at its next try.
    let out = good
        .command_with(&config, &["--source", "bare", "migrate"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bare.db
        .enqueue(Message::new("late", "", queue.as_str(), "x"))
        .await;
    let published = bare
        .wait_count("published_at IS NOT NULL", 1, Duration::from_secs(70))
        .await;
    assert_eq!(published, 1, "{}", worker.log_text());
    assert!(
        worker.terminate(EXIT_WITHIN).success(),
        "{}",
        worker.log_text()
    );
    draining.abort();
}

/// SIGHUP: a source added to the file is joined and drains (200 rows
/// waiting for it) and appears on the worker's own dashboard (`--ui`), a
/// source removed from one worker's file is left — its leases released and
/// taken by the other worker, nothing lost — and a file that does not parse
/// is one line while every source runs on.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_joins_added_sources_leaves_removed_ones_and_keeps_running_on_a_bad_file() {
    let a = TestEnv::with(Tuning::fleet()).await;
    let b = TestEnv::with(Tuning::fleet()).await;
    let c = TestEnv::with(Tuning::fleet()).await;
    let base = std::fs::read_to_string(&a.config_path).unwrap();
    let (sa, sb, sc) = (
        source("a", &a, ""),
        source("b", &b, ""),
        source("c", &c, ""),
    );
    let write = |path: &PathBuf, sources: &[&String]| {
        let text = sources.iter().map(|s| s.as_str()).collect::<String>();
        std::fs::write(path, format!("{base}{text}")).unwrap();
    };
    let files = [a.dir.join("w1.toml"), a.dir.join("w2.toml")];
    for f in &files {
        write(f, &[&sa, &sb]);
    }
    let queues = [unique("q"), unique("q"), unique("q")];
    let mut reader_a = QueueReader::open(&amqp_url(), &queues[0]).await.unwrap();
    let mut others = Vec::new();
    for q in &queues[1..] {
        let mut r = QueueReader::open(&amqp_url(), q).await.unwrap();
        others.push(tokio::spawn(async move {
            let _ = r.read_until(Duration::from_secs(120), |_| false).await;
        }));
    }
    // The first worker also serves the dashboard of every source, which
    // follows the reloads.
    let mut workers: Vec<WorkerProcess> = files
        .iter()
        .zip([&["--silent", "--ui", "127.0.0.1:0"][..], &["--silent"]])
        .map(|(f, args)| a.spawn_worker_on(None, f, args))
        .collect();
    let second = worker_id_of(&a, &workers[1]).await;
    let dashboard = wait_for_dashboard_url(&workers[0]);
    let overview = format!("{dashboard}/outbox/api/sources");
    let names = || async {
        let rows = http("GET", &overview, &[], None).await.json();
        rows.as_array()
            .map(|rows| {
                rows.iter()
                    .filter_map(|r| r["name"].as_str().map(str::to_string))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    assert_eq!(names().await, ["a", "b"], "{}", workers[0].log_text());
    let producing: Vec<_> = [(&a, &queues[0]), (&b, &queues[1])]
        .into_iter()
        .map(|(env, q)| {
            tokio::spawn(produce_evenly(
                env.db.clone(),
                q.clone(),
                1_200,
                30,
                Duration::from_secs(12),
            ))
        })
        .collect();
    let settled = Instant::now() + Duration::from_secs(30);
    while live(&a).await.len() < 2 || leases(&a).await.iter().any(|l| !l.valid) {
        assert!(
            Instant::now() < settled,
            "source a never settled on 2 workers"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Added: c, with rows waiting.
    for i in 0..200 {
        c.db.enqueue(Message::new(
            format!("k{}", i % 10),
            "",
            queues[2].as_str(),
            "x",
        ))
        .await;
    }
    for f in &files {
        write(f, &[&sa, &sb, &sc]);
    }
    let hup = Instant::now();
    for w in &workers {
        w.signal("HUP");
    }
    c.wait_count("published_at IS NOT NULL", 1, Duration::from_secs(20))
        .await;
    let joined = hup.elapsed();
    let all = c
        .wait_count("published_at IS NOT NULL", 200, Duration::from_secs(20))
        .await;
    println!("added source c: first row published {joined:?} after SIGHUP");
    assert_eq!(all, 200, "{}", since_sighup(&workers[0].log_text()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while names().await != ["a", "b", "c"] {
        assert!(
            Instant::now() < deadline,
            "the worker's dashboard did not follow the reload: {:?}\n{}",
            names().await,
            since_sighup(&workers[0].log_text())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Not timed here (a loaded CI machine took 10 s in a debug build;
    // unloaded 0.2–0.6 s): only printed.
    // Removed from the first worker: its buckets of a go to the second.
    write(&files[0], &[&sb, &sc]);
    let hup = Instant::now();
    workers[0].signal("HUP");
    let deadline = hup + Duration::from_secs(20);
    loop {
        let held = leases(&a).await;
        if held
            .iter()
            .all(|l| l.valid && l.lease_owner == Some(second))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a's buckets did not move: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let moved = hup.elapsed();
    println!(
        "removed source a from worker 1: every bucket held by worker 2 {moved:?} after SIGHUP"
    );
    // The removed source's worker row goes once its leases are given
    // back (a moment after them, on a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(25);
    while live(&a).await != [second] {
        assert!(
            Instant::now() < deadline,
            "worker 1 still live in a: {:?}",
            live(&a).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A file that does not parse: one line, everything runs on.
    std::fs::write(&files[1], "[outbox\nbatch_size = ").unwrap();
    workers[1].signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !workers[1]
        .log_text()
        .contains("configuration not reloaded, the running one is kept")
    {
        assert!(Instant::now() < deadline, "{}", workers[1].log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for p in producing {
        p.await.unwrap();
    }
    let (complete, verdict) =
        read_and_judge(&mut reader_a, &a, 1_200, Duration::from_secs(60)).await;
    println!("a: {}", verdict.summary());
    assert!(complete && verdict.is_clean(), "a: {}", verdict.summary());
    let published_b = b
        .wait_count("published_at IS NOT NULL", 1_200, Duration::from_secs(30))
        .await;
    assert_eq!(published_b, 1_200);
    terminate_all(&mut workers);
    for o in others {
        o.abort();
    }
}

/// Counts a queue's distinct deliveries while the test runs (reading in
/// short rounds so it notices `stop`); gives the reader back for judging.
fn count_arrivals(
    mut reader: QueueReader,
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<QueueReader>) {
    let count = Arc::new(AtomicUsize::new(0));
    let counting = count.clone();
    let task = tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let _ = reader
                .read_until(Duration::from_millis(200), |c| {
                    counting.store(c.unique(), Ordering::Relaxed);
                    stop.load(Ordering::Relaxed)
                })
                .await;
            counting.store(reader.checker.unique(), Ordering::Relaxed);
        }
        reader
    });
    (count, task)
}

/// What one source's relay delivered over a window beside what its
/// producer committed, both per second.
struct Served {
    delivered: f64,
    offered: f64,
}

impl Served {
    /// The share of the offered load delivered: the relay's rate with the
    /// producer's own pace (a test process starved of CPU) taken out.
    fn share(&self) -> f64 {
        self.delivered / self.offered
    }
}

/// Distinct deliveries per second of each source over `window`, beside its
/// producer's commits over the same window taken `lag` earlier (a message
/// committed just before the window closes arrives just after).
async fn served(
    delivered: &[Arc<AtomicUsize>],
    produced: &[Arc<AtomicUsize>],
    window: Duration,
) -> Vec<Served> {
    let lag = Duration::from_millis(500);
    let load = |counts: &[Arc<AtomicUsize>]| -> Vec<usize> {
        counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    };
    let produced_from = load(produced);
    tokio::time::sleep(lag).await;
    let delivered_from = load(delivered);
    tokio::time::sleep(window - lag).await;
    let produced_to = load(produced);
    tokio::time::sleep(lag).await;
    let delivered_to = load(delivered);
    let per_second = |to: usize, from: usize| (to - from) as f64 / window.as_secs_f64();
    (0..delivered.len())
        .map(|i| Served {
            delivered: per_second(delivered_to[i], delivered_from[i]),
            offered: per_second(produced_to[i], produced_from[i]),
        })
        .collect()
}

/// Three sources across two hosts, and their isolation: two databases on the
/// lab's PostgreSQL (one of them, shop, publishing to a vhost of its own),
/// the third (stock) on a MariaDB server of its own — served by two workers
/// on two test hosts, a producer writing to each at 100 msg/s. First host
/// 1's link to the MariaDB server is blackholed: stock's buckets move to
/// host 2 while the other two keep publishing at ≥ 0.8 × their rate before
/// the fault; then the server is stopped entirely: the other two, again ≥
/// 0.8 ×. A rate is the share of what the source's producer committed that
/// arrived, so that the test's own producers falling behind on a busy
/// machine (CI saw 111 msg/s arrive before the fault from a producer
/// catching up) is not taken for the relay's. After the server's restart and the heal, stock is served again
/// and every source's checker is clean (nothing lost, per-key order kept),
/// and nothing of shop's reached the broker's default vhost.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_sources_on_two_hosts_one_cut_off_then_stopped_leaves_the_others_at_their_rate() {
    let lab = Lab::new(2);
    let own_server = PrivateMariaDb::start_on(&lab.gateway);
    let vhost = unique("vh");
    lab.broker().ctl(&["add_vhost", &vhost]);
    lab.broker()
        .ctl(&["set_permissions", "-p", &vhost, "guest", ".*", ".*", ".*"]);
    let vhost_url = lab.broker().url().replace("/%2f", &format!("/{vhost}"));
    let billing = TestEnv::with(lab.tuning(Tuning::hosts())).await;
    let shop = TestEnv::with(lab.tuning(Tuning::hosts())).await;
    let stock = TestEnv::with(
        Tuning {
            server_admin_url: Some(own_server.admin_url()),
            ..lab.tuning(Tuning::hosts())
        }
        .on(Db::MariaDb),
    )
    .await;
    let shop_broker = format!("[source.amqp]\nurl = \"{vhost_url}\"\n");
    let config = sources_config(
        &billing,
        &[
            source("billing", &billing, ""),
            source("shop", &shop, &shop_broker),
            source("stock", &stock, ""),
        ],
    );
    let envs = [&billing, &shop, &stock];
    let queues = [unique("q"), unique("q"), unique("q")];
    let stop = Arc::new(AtomicBool::new(false));
    let mut counters = Vec::new();
    let mut readers = Vec::new();
    let brokers = [lab.broker().url(), vhost_url.clone(), lab.broker().url()];
    for (queue, broker) in queues.iter().zip(&brokers) {
        let reader = QueueReader::open(broker, queue).await.unwrap();
        let (count, task) = count_arrivals(reader, stop.clone());
        counters.push(count);
        readers.push(task);
    }
    // shop's queue name on the default vhost: must stay empty.
    let mut stray = QueueReader::open(&lab.broker().url(), &queues[1])
        .await
        .unwrap();
    let mut workers: Vec<WorkerProcess> = (1..=2)
        .map(|h| billing.spawn_worker_on(Some(&lab.netns(h)), &config, &["--silent"]))
        .collect();
    // Both workers in every source's fleet, every bucket leased.
    let deadline = Instant::now() + Duration::from_secs(60);
    for env in envs {
        while live(env).await.len() < 2 || leases(env).await.iter().filter(|l| l.valid).count() < 16
        {
            assert!(Instant::now() < deadline, "the fleets never settled");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let host1 = worker_id_of(&stock, &workers[0]).await;

    // 100 msg/s into each source, in phases (nothing into the stopped one).
    let phase = Duration::from_secs(12);
    let per_phase = 1_200;
    let committed: [Arc<AtomicUsize>; 3] = Default::default();
    let produce = |sources: &[usize]| -> Vec<tokio::task::JoinHandle<()>> {
        sources
            .iter()
            .map(|&s| {
                let (db, queue) = (envs[s].db.clone(), queues[s].clone());
                let counted = committed[s].clone();
                tokio::spawn(produce_evenly_counted(
                    db, queue, per_phase, 40, phase, counted,
                ))
            })
            .collect()
    };
    let measured = Duration::from_secs(8);
    let settle = phase - measured;
    let mut produced = [0usize; 3];

    // Before the fault.
    let producing = produce(&[0, 1, 2]);
    tokio::time::sleep(settle / 2).await;
    let before = served(&counters[..2], &committed[..2], measured).await;
    for p in producing {
        p.await.unwrap();
    }
    produced.iter_mut().for_each(|n| *n += per_phase);

    // Host 1 cut off from the third source's server.
    lab.fault_ports(1, &own_server.port.to_string(), Fault::Blackhole);
    let producing = produce(&[0, 1, 2]);
    tokio::time::sleep(settle / 2).await;
    let cut = served(&counters[..2], &committed[..2], measured).await;
    for p in producing {
        p.await.unwrap();
    }
    produced.iter_mut().for_each(|n| *n += per_phase);
    // The cut source's buckets moved to host 2.
    let moved = Instant::now() + Duration::from_secs(30);
    loop {
        let held = leases(&stock).await;
        if held.iter().all(|l| l.valid && l.lease_owner != Some(host1)) {
            break;
        }
        assert!(
            Instant::now() < moved,
            "stock's buckets stayed with the cut host: {held:?}\nhost 1's log:\n{}",
            workers[0].log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The third source's server stopped entirely.
    own_server.run("stop");
    let producing = produce(&[0, 1]);
    tokio::time::sleep(settle / 2).await;
    let stopped = served(&counters[..2], &committed[..2], measured).await;
    for p in producing {
        p.await.unwrap();
    }
    produced[0] += per_phase;
    produced[1] += per_phase;

    // Restarted and healed: the cut source is served again, nothing lost.
    own_server.run("start");
    lab.heal(1);
    stop.store(true, Ordering::Relaxed);
    let names = ["billing", "shop", "stock"];
    let mut verdicts = Vec::new();
    for (((name, env), reader), expected) in names.iter().zip(envs).zip(readers).zip(produced) {
        let mut reader = reader.await.unwrap();
        let (all, verdict) =
            read_and_judge(&mut reader, env, expected, Duration::from_secs(90)).await;
        verdicts.push(format!("{name}: {}", verdict.summary()));
        assert!(all && verdict.is_clean(), "{name}: {}", verdict.summary());
    }
    assert_nothing_reached(&mut stray).await;
    // Each source's delivered share of its offered load, during a fault
    // beside before it: a relay slowed by another source's fault shows; a
    // producer slowed by a busy machine does not.
    let ratio = |during: &[Served]| -> Vec<f64> {
        during
            .iter()
            .zip(&before)
            .map(|(d, b)| d.share() / b.share())
            .collect()
    };
    let shown = |phase: &[Served]| -> String {
        let each: Vec<String> = phase
            .iter()
            .map(|s| format!("{:.1} of {:.1}", s.delivered, s.offered))
            .collect();
        each.join(", ")
    };
    println!(
        "delivered of offered msg/s (billing, shop): before the fault [{}]; host 1 cut off from \
         stock's MariaDB: [{}] ({:.2?} x); stock's server stopped: [{}] ({:.2?} x); {}",
        shown(&before),
        shown(&cut),
        ratio(&cut),
        shown(&stopped),
        ratio(&stopped),
        verdicts.join("; ")
    );
    for (what, during) in [("cut off", &cut), ("stopped", &stopped)] {
        for (name, r) in names.iter().zip(ratio(during)) {
            assert!(
                r >= 0.8,
                "{name} fell to {r:.2} x its rate while stock's server was {what}"
            );
        }
    }
    terminate_all(&mut workers);
    let log = workers[0].log_text();
    assert!(
        log.contains("source{source=stock}"),
        "host 1 never said which source it lost:\n{log}"
    );
}

/// `worker.reload_on_change`: no signal — the file's new content is
/// applied (a source added is joined and drained, a source removed is
/// left), a file that does not parse is one line and everything runs on.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reload_on_change_an_edited_file_is_applied_without_a_signal() {
    let a = TestEnv::with(Tuning::fleet()).await;
    let b = TestEnv::with(Tuning::fleet()).await;
    let base = std::fs::read_to_string(&a.config_path).unwrap();
    let base = base.replacen("[worker]\n", "[worker]\nreload_on_change = true\n", 1);
    assert!(base.contains("reload_on_change = true"), "{base}");
    let (sa, sb) = (source("a", &a, ""), source("b", &b, ""));
    let file = a.dir.join("watched.toml");
    std::fs::write(&file, format!("{base}{sa}")).unwrap();
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let mut worker = a.spawn_worker_on(None, &file, &["--silent"]);
    let me = worker_id_of(&a, &worker).await;

    // Added: b, with rows waiting.
    for i in 0..100 {
        b.db.enqueue(Message::new(
            format!("k{}", i % 10),
            "",
            queue.as_str(),
            "x",
        ))
        .await;
    }
    std::fs::write(&file, format!("{base}{sa}{sb}")).unwrap();
    let edited = Instant::now();
    let (all, verdict) = read_and_judge(&mut reader, &b, 100, Duration::from_secs(30)).await;
    println!(
        "added source b: its 100 rows read {:?} after the edit",
        edited.elapsed()
    );
    assert!(all && verdict.is_clean(), "{}", verdict.summary());
    assert!(
        worker
            .log_text()
            .contains("the configuration file changed: reading the configuration again"),
        "{}",
        worker.log_text()
    );
    // Removed: a — its row goes.
    std::fs::write(&file, format!("{base}{sb}")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while live(&a).await.contains(&me) {
        assert!(Instant::now() < deadline, "{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A file that does not parse: one line, b is still served.
    std::fs::write(&file, "[outbox\nbatch_size = ").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !worker
        .log_text()
        .contains("configuration not reloaded, the running one is kept")
    {
        assert!(Instant::now() < deadline, "{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.db.enqueue(Message::new("after", "", queue.as_str(), "x"))
        .await;
    let (all, verdict) = read_and_judge(&mut reader, &b, 101, Duration::from_secs(30)).await;
    assert!(all && verdict.is_clean(), "{}", verdict.summary());
    worker.terminate(Duration::from_secs(10));
}
