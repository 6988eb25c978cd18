//! The nemesis soak: a seeded random schedule of overlapping faults — a
//! worker SIGKILLed (restarted a moment later) or SIGSTOPped (resumed
//! later), a database server crashed and restarted, the broker's VM killed
//! with SIGKILL and restarted, a host's link to a database, to the broker
//! or to everything blackholed, reset or made lossy (nftables on the test
//! hosts), PgBouncer stopped and started, a database's disk filled and
//! freed — against two fleets at once, one on a PostgreSQL server (behind
//! a PgBouncer in transaction mode, `LISTEN` direct) and one on a MariaDB
//! server, each server on a small filesystem of its own, all on a lab of
//! three test hosts (one worker of each fleet per host) publishing to one
//! RabbitMQ node, with producers writing to both throughout.
//!
//! Per run: each fleet's checker verdict (nothing lost, nothing unexpected,
//! per-key order), duplicates, epochs acquired twice, first deliveries
//! under an older epoch and any delivery under a superseded epoch (fencing:
//! a build without the broker connection's send gate fails on the last),
//! the longest time any bucket went
//! without a valid lease, and each worker's RSS, open file descriptors and
//! database connections sampled every second, with their slopes.
//!
//! Ninety seconds in `scripts/test.sh`; thirty minutes with
//! `OUTBOXD_LONG_SOAK=1 scripts/test.sh --test soak`, any other length with
//! `OUTBOXD_SOAK_SECONDS=<seconds>`. The seed is printed; `OUTBOXD_SEED=<seed>`
//! replays the same schedule. A failure prints the seed and the schedule
//! as far as it ran.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::hosts::{Fault, Lab};
use common::pooler::PgBouncer;
use common::*;
use outboxd::demo::QueueReader;

/// What the nemesis does to whom; `fleet` 0 is PostgreSQL's, 1 MariaDB's;
/// worker `w` of each fleet runs on host `w + 1`.
#[derive(Debug, Clone, Copy)]
enum Action {
    Kill {
        fleet: usize,
        worker: usize,
    },
    Spawn {
        fleet: usize,
        worker: usize,
    },
    Stop {
        fleet: usize,
        worker: usize,
    },
    Cont {
        fleet: usize,
        worker: usize,
    },
    CrashDatabase {
        fleet: usize,
    },
    RestartDatabase {
        fleet: usize,
    },
    KillBroker,
    RestartBroker,
    /// A fault on a host's link (both its workers live with it).
    CutLink {
        host: usize,
        to: Dest,
        fault: Fault,
    },
    HealLink {
        host: usize,
    },
    StopPooler,
    StartPooler,
    FillDisk {
        fleet: usize,
    },
    FreeDisk {
        fleet: usize,
    },
}

/// Where a host's cut link leads.
#[derive(Debug, Clone, Copy)]
enum Dest {
    /// A fleet's database (PostgreSQL: PgBouncer and the direct port).
    Database(usize),
    Broker,
    /// Every packet of the host.
    All,
}

const WORKERS: usize = 3;

/// The worker of each fleet that is stopped, cut off and starved but
/// never killed (see [`JUDGED_AFTER`]).
const LONG_LIVED: usize = 0;

/// A worker process that lived this long is judged for leaks: in the
/// thirty-minute run, at least the long-lived worker of each fleet.
const JUDGED_AFTER: f64 = 600.0;

/// What a judged process grows by in its first minutes is its start-up
/// (pools and buffers reaching their working size), not a leak.
const WARM_UP: f64 = 120.0;

/// The whole schedule: `(ms from the start, action)`, in time order. Faults
/// start every 2–6 s and overlap; a thing already down is not hit again
/// until it is back (a database is not crashed while its disk is full);
/// everything is back after the last fault's time.
fn schedule(seed: u64, length: Duration) -> Vec<(u64, Action)> {
    let mut rng = Seeded(seed);
    let end = length.as_millis() as u64;
    let mut actions = Vec::new();
    // When each target is back: [fleet][worker], databases (and their
    // disks), the broker, each host's links, PgBouncer.
    let mut worker_free = [[0u64; WORKERS]; 2];
    let mut db_free = [0u64; 2];
    let mut broker_free = 0u64;
    let mut host_free = [0u64; WORKERS];
    let mut pooler_free = 0u64;
    let mut t = 3_000;
    while t < end {
        let fleet = rng.within(0, 1) as usize;
        let worker = rng.within(0, WORKERS as u64 - 1) as usize;
        match rng.within(0, 13) {
            // Worker 0 of each fleet is never killed: it lives the whole
            // run, so its resources over thirty minutes tell a leak.
            0..=3 if worker_free[fleet][worker] <= t && worker != LONG_LIVED => {
                let back = t + rng.within(0, 2_000);
                actions.push((t, Action::Kill { fleet, worker }));
                actions.push((back, Action::Spawn { fleet, worker }));
                worker_free[fleet][worker] = back;
            }
            4..=6 if worker_free[fleet][worker] <= t => {
                let back = t + rng.within(1_000, 8_000);
                actions.push((t, Action::Stop { fleet, worker }));
                actions.push((back, Action::Cont { fleet, worker }));
                worker_free[fleet][worker] = back;
            }
            7 if db_free[fleet] <= t => {
                let back = t + rng.within(1_000, 5_000);
                actions.push((t, Action::CrashDatabase { fleet }));
                actions.push((back, Action::RestartDatabase { fleet }));
                db_free[fleet] = back + 3_000;
            }
            8 if broker_free <= t => {
                let back = t + rng.within(1_000, 4_000);
                actions.push((t, Action::KillBroker));
                actions.push((back, Action::RestartBroker));
                broker_free = back + 8_000;
            }
            9 | 10 if host_free[worker] <= t => {
                let host = worker + 1;
                let to = match rng.within(0, 3) {
                    0 => Dest::Database(0),
                    1 => Dest::Database(1),
                    2 => Dest::Broker,
                    _ => Dest::All,
                };
                let fault = match rng.within(0, 2) {
                    0 => Fault::Blackhole,
                    1 => Fault::Reset,
                    _ => Fault::Loss(rng.within(10, 40) as u8),
                };
                let back = t + rng.within(1_000, 6_000);
                actions.push((t, Action::CutLink { host, to, fault }));
                actions.push((back, Action::HealLink { host }));
                host_free[worker] = back + 1_000;
            }
            11 if pooler_free <= t => {
                let back = t + rng.within(500, 3_000);
                actions.push((t, Action::StopPooler));
                actions.push((back, Action::StartPooler));
                pooler_free = back + 5_000;
            }
            12 if db_free[fleet] <= t => {
                let back = t + rng.within(2_000, 8_000);
                actions.push((t, Action::FillDisk { fleet }));
                actions.push((back, Action::FreeDisk { fleet }));
                db_free[fleet] = back + 3_000;
            }
            _ => {}
        }
        t += rng.within(2_000, 6_000);
    }
    actions.sort_by_key(|(at, _)| *at);
    actions
}

/// How many faults of each kind a schedule holds.
fn kinds(plan: &[(u64, Action)]) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for (_, a) in plan {
        let kind = match a {
            Action::Kill { .. } => "SIGKILL",
            Action::Stop { .. } => "SIGSTOP",
            Action::CrashDatabase { .. } => "database crash",
            Action::KillBroker => "broker kill -9",
            Action::CutLink {
                fault: Fault::Blackhole,
                ..
            } => "link blackhole",
            Action::CutLink {
                fault: Fault::Reset,
                ..
            } => "link reset",
            Action::CutLink {
                fault: Fault::Loss(_),
                ..
            } => "link loss",
            Action::StopPooler => "PgBouncer stop",
            Action::FillDisk { .. } => "full disk",
            _ => continue,
        };
        *counts.entry(kind).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What ran so far; printed with the seed if the test fails.
struct Journal {
    seed: u64,
    lines: Vec<String>,
}

impl Drop for Journal {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "soak failed: seed {} (OUTBOXD_SEED={} replays it); the schedule as far as it ran:\n{}",
                self.seed,
                self.seed,
                self.lines.join("\n")
            );
        }
    }
}

/// One fleet: its test environment, its workers.
struct Fleet {
    env: TestEnv,
    queue: String,
    workers: Vec<WorkerProcess>,
    producers: Option<Producers>,
}

/// A worker's resources at one sample: RSS (kB), open descriptors, and
/// established connections to its database server.
#[derive(Clone, Copy)]
struct Sample {
    at: f64,
    rss_kb: f64,
    fds: f64,
    db_conns: f64,
}

fn sample(pid: u32, db_ports: &[u16], at: f64) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let mut inodes = std::collections::HashSet::new();
    let mut fds = 0.0;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        fds += 1.0;
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let t = target.to_string_lossy().to_string();
            if let Some(inode) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(inode.to_string());
            }
        }
    }
    // /proc/net/tcp: remote address in field 2 (hex ip:port), state in 3
    // (01 = established), inode in 9.
    let tcp = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let db_conns = tcp
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 9
                && f[3] == "01"
                && f[2]
                    .rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                    .is_some_and(|p| db_ports.contains(&p))
                && inodes.contains(f[9])
        })
        .count() as f64;
    Some(Sample {
        at,
        rss_kb,
        fds,
        db_conns,
    })
}

/// Least-squares slope of `value` over time, per minute.
fn slope(samples: &[Sample], value: impl Fn(&Sample) -> f64) -> f64 {
    let n = samples.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = samples.iter().map(|s| s.at).sum::<f64>() / n;
    let my = samples.iter().map(&value).sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for s in samples {
        num += (s.at - mx) * (value(s) - my);
        den += (s.at - mx).powi(2);
    }
    if den == 0.0 { 0.0 } else { num / den * 60.0 }
}

/// What one fleet's run came to.
struct Outcome {
    fleet: usize,
    acknowledged: u64,
    total: i64,
    published: i64,
    /// Every committed row was read from the queue.
    all: bool,
    verdict: outboxd::checker::Verdict,
    twice: Vec<(String, i64, i64)>,
    regressions: usize,
    late: Vec<(String, i64, i64)>,
}

/// The servers the nemesis hits: the lab (its PostgreSQL and RabbitMQ on
/// the gateway), the PgBouncer before that PostgreSQL, the MariaDB server,
/// and the two small disks their data lives on.
struct Servers {
    lab: Lab,
    bouncer: PgBouncer,
    maria: PrivateMariaDb,
    /// PostgreSQL's, MariaDB's.
    disks: [SmallDisk; 2],
}

impl Servers {
    fn crash(&self, fleet: usize) {
        match fleet {
            0 => self.lab.pg.run(&["stop", "immediate"]),
            _ => self.maria.run("kill"),
        }
    }

    fn restart(&self, fleet: usize) {
        match fleet {
            0 => self.lab.pg.run(&["start"]),
            _ => self.maria.run("start"),
        }
    }

    /// Whether fleet `fleet`'s server answers a connection now.
    async fn answers(&self, fleet: usize) -> bool {
        let within = Duration::from_secs(3);
        match fleet {
            0 => {
                let url = self.lab.pg.admin_url();
                let connect = <sqlx::PgConnection as sqlx::Connection>::connect(&url);
                matches!(tokio::time::timeout(within, connect).await, Ok(Ok(_)))
            }
            _ => {
                let url = self.maria.admin_url();
                let connect = <sqlx::MySqlConnection as sqlx::Connection>::connect(&url);
                matches!(tokio::time::timeout(within, connect).await, Ok(Ok(_)))
            }
        }
    }

    /// The gateway ports a host's link to `to` goes through.
    fn ports(&self, to: Dest) -> String {
        match to {
            Dest::Database(0) => format!("{},{}", self.bouncer.port, self.lab.pg.port),
            Dest::Database(_) => self.maria.port.to_string(),
            Dest::Broker => self.lab.broker().port.to_string(),
            Dest::All => "all".into(),
        }
    }

    /// Each fleet's database ports, for counting a worker's connections.
    fn db_ports(&self) -> [Vec<u16>; 2] {
        [
            vec![self.bouncer.port, self.lab.pg.port],
            vec![self.maria.port],
        ]
    }
}

/// How long the nemesis acts: `OUTBOXD_SOAK_SECONDS`, else thirty minutes
/// with `OUTBOXD_LONG_SOAK=1`, else ninety seconds.
fn soak_length() -> Duration {
    if let Some(seconds) = std::env::var("OUTBOXD_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return Duration::from_secs(seconds);
    }
    let long = std::env::var("OUTBOXD_LONG_SOAK").as_deref() == Ok("1");
    Duration::from_secs(if long { 30 * 60 } else { 90 })
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seeded_schedule_of_overlapping_faults_loses_nothing_and_leaks_nothing() {
    let seed = Seeded::seed();
    let length = soak_length();
    // Long enough to judge its workers for leaks (they must live
    // `JUDGED_AFTER`).
    let long = length >= Duration::from_secs(20 * 60);
    let plan = schedule(seed, length);
    println!(
        "soak: seed {seed} (OUTBOXD_SEED={seed} replays it), {length:?}, {} actions: {}",
        plan.len(),
        kinds(&plan)
    );
    let mut journal = Journal {
        seed,
        lines: Vec::new(),
    };

    // The disks first: they are unmounted last, after every server
    // stopped. PostgreSQL's WAL and both databases grow with 30 minutes of
    // producers: the disks are sized for that, and filled by the nemesis.
    let disks = if length > Duration::from_secs(5 * 60) {
        [1536, 2048]
    } else {
        [768, 1024]
    }
    .map(SmallDisk::mount);
    let lab = Lab::with_pg_in(WORKERS, &disks[0].dir);
    let bouncer = PgBouncer::start_on(&lab.gateway, &lab.gateway, lab.pg.port);
    let maria = PrivateMariaDb::start_under(&disks[1].dir, &lab.gateway);
    let servers = Servers {
        lab,
        bouncer,
        maria,
        disks,
    };
    let broker_url = servers.lab.broker().url();
    let mut fleets = Vec::new();
    for db in [Db::Postgres, Db::MariaDb] {
        let tuning = match db {
            Db::Postgres => Tuning {
                server_admin_url: Some(servers.lab.pg.admin_url()),
                pooler_url: Some(servers.bouncer.base_url()),
                listen_direct: true,
                ..Tuning::hosts()
            },
            _ => Tuning {
                server_admin_url: Some(servers.maria.admin_url()),
                ..Tuning::hosts().on(db)
            },
        };
        let env = TestEnv::with(Tuning {
            amqp_url: Some(broker_url.clone()),
            ..tuning
        })
        .await;
        let queue = unique("q");
        drop(QueueReader::open(&broker_url, &queue).await.unwrap());
        let workers = (0..WORKERS)
            .map(|w| spawn_on_host(&servers, &env, w))
            .collect();
        let producers = Some(Producers::start(&env, "", &queue, 4, 150.0));
        fleets.push(Fleet {
            env,
            queue,
            workers,
            producers,
        });
    }
    let ports = servers.db_ports();
    let pids: Arc<Mutex<Vec<Vec<u32>>>> = Arc::new(Mutex::new(
        fleets
            .iter()
            .map(|f| f.workers.iter().map(WorkerProcess::pid).collect())
            .collect(),
    ));

    // Every second: each worker's resources, and how long each bucket has
    // been without a valid lease (skipped while its database is down).
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let sampler = {
        let (pids, stop, ports) = (pids.clone(), stop.clone(), ports.clone());
        let dbs: Vec<(TestDb, String)> = fleets
            .iter()
            .map(|f| {
                let q = format!(
                    "SELECT partition_key, lease_owner IS NOT NULL AND lease_until > {} FROM outbox_partitions",
                    f.env.db.now()
                );
                (f.env.db.clone(), q)
            })
            .collect();
        tokio::spawn(async move {
            let mut series: HashMap<(usize, u32), Vec<Sample>> = HashMap::new();
            let mut unowned_since: HashMap<(usize, String), Instant> = HashMap::new();
            let mut worst = [Duration::ZERO; 2];
            while !stop.load(Ordering::Relaxed) {
                let at = started.elapsed().as_secs_f64();
                let now: Vec<Vec<u32>> = pids.lock().unwrap().clone();
                for (fleet, fleet_pids) in now.iter().enumerate() {
                    for pid in fleet_pids {
                        if let Some(s) = sample(*pid, &ports[fleet], at) {
                            series.entry((fleet, *pid)).or_default().push(s);
                        }
                    }
                }
                for (fleet, (db, q)) in dbs.iter().enumerate() {
                    let read = tokio::time::timeout(
                        Duration::from_millis(800),
                        db.try_rows::<(String, bool)>(q),
                    )
                    .await;
                    let Ok(Ok(rows)) = read else { continue };
                    for (bucket, owned) in rows {
                        let key = (fleet, bucket);
                        if owned {
                            if let Some(since) = unowned_since.remove(&key) {
                                worst[fleet] = worst[fleet].max(since.elapsed());
                            }
                        } else {
                            unowned_since.entry(key).or_insert_with(Instant::now);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            for ((fleet, _), since) in &unowned_since {
                worst[*fleet] = worst[*fleet].max(since.elapsed());
            }
            (series, worst)
        })
    };

    // Workers SIGKILLed and not yet spawned again.
    let mut down: HashSet<(usize, usize)> = HashSet::new();
    for (at, action) in &plan {
        let due = started + Duration::from_millis(*at);
        tokio::time::sleep_until(due.into()).await;
        restart_failed_starts(&mut fleets, &down, &servers, &pids, &mut journal, started);
        journal.lines.push(format!(
            "{:>8.1}s {action:?}",
            started.elapsed().as_secs_f64()
        ));
        match *action {
            Action::Kill { fleet, worker } => {
                let w = &mut fleets[fleet].workers[worker];
                w.signal("KILL");
                w.wait(Duration::from_secs(10));
                down.insert((fleet, worker));
            }
            Action::Spawn { fleet, worker } => {
                down.remove(&(fleet, worker));
                let f = &mut fleets[fleet];
                f.workers[worker] = spawn_on_host(&servers, &f.env, worker);
                pids.lock().unwrap()[fleet][worker] = f.workers[worker].pid();
            }
            Action::Stop { fleet, worker } => fleets[fleet].workers[worker].signal("STOP"),
            Action::Cont { fleet, worker } => fleets[fleet].workers[worker].signal("CONT"),
            Action::CrashDatabase { fleet } => servers.crash(fleet),
            Action::RestartDatabase { fleet } => servers.restart(fleet),
            Action::KillBroker => servers.lab.broker().kill9(),
            Action::RestartBroker => servers.lab.broker().run("start"),
            Action::CutLink { host, to, fault } => {
                servers.lab.fault_ports(host, &servers.ports(to), fault)
            }
            Action::HealLink { host } => servers.lab.heal(host),
            Action::StopPooler => servers.bouncer.stop(),
            Action::StartPooler => servers
                .bouncer
                .restart(&servers.lab.gateway, servers.lab.pg.port),
            Action::FillDisk { fleet } => servers.disks[fleet].fill(64 * 1024),
            Action::FreeDisk { fleet } => {
                servers.disks[fleet].free();
                // A server that stopped itself on the full disk (PostgreSQL
                // PANICs when it cannot write its log) is started again,
                // as its supervisor would.
                if !servers.answers(fleet).await {
                    servers.restart(fleet);
                    journal.lines.push(format!(
                        "{:>8.1}s the server had stopped on the full disk: started again",
                        started.elapsed().as_secs_f64()
                    ));
                }
            }
        }
    }
    journal.lines.push(format!(
        "{:>8.1}s schedule done; producers stop",
        started.elapsed().as_secs_f64()
    ));
    // The last restart may have met a database still coming back: look
    // until three looks a second apart find none to start again.
    let mut none_in_a_row = 0;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        match restart_failed_starts(&mut fleets, &down, &servers, &pids, &mut journal, started) {
            0 => none_in_a_row += 1,
            _ => none_in_a_row = 0,
        }
        if none_in_a_row == 3 {
            break;
        }
    }

    let mut report = Vec::new();
    for (i, f) in fleets.iter_mut().enumerate() {
        let acknowledged = f.producers.take().unwrap().stop().await;
        let published = f
            .env
            .wait_count(
                "published_at IS NOT NULL",
                f.env.count("true").await,
                Duration::from_secs(120),
            )
            .await;
        let total = f.env.count("true").await;
        let mut reader = QueueReader::open(&broker_url, &f.queue)
            .await
            .unwrap()
            .keep_log();
        let (all, v) = read_and_judge(
            &mut reader,
            &f.env,
            total as usize,
            Duration::from_secs(120),
        )
        .await;
        let twice = epochs_acquired_twice(&f.env).await;
        report.push(Outcome {
            fleet: i,
            acknowledged,
            total,
            published,
            all,
            regressions: epoch_regressions(&reader),
            late: late_deliveries(&reader),
            verdict: v,
            twice,
        });
    }
    stop.store(true, Ordering::Relaxed);
    let (series, worst) = sampler.await.unwrap();

    let names = ["PostgreSQL", "MariaDB"];
    for o in &report {
        println!(
            "soak {}: {} commits acknowledged, {} rows, {} published; {}; {} epochs acquired twice, {} epoch regressions, {} deliveries under a superseded epoch; longest a bucket went unowned {:?}",
            names[o.fleet],
            o.acknowledged,
            o.total,
            o.published,
            o.verdict.summary(),
            o.twice.len(),
            o.regressions,
            o.late.len(),
            worst[o.fleet]
        );
    }
    // Slopes per worker process that lived at least a minute, from its
    // 30th second on; a process that lived JUDGED_AFTER is judged, from
    // the end of its WARM_UP on (start-up growth is not a leak).
    let mut worst_slopes = (0.0f64, 0.0f64, 0.0f64);
    let mut judged = 0;
    for ((fleet, pid), samples) in &series {
        let life = samples.last().unwrap().at - samples[0].at;
        if life < 60.0 {
            continue;
        }
        let long_lived = life >= JUDGED_AFTER;
        let from = if long_lived { WARM_UP } else { 30.0 };
        let settled: Vec<Sample> = samples
            .iter()
            .copied()
            .filter(|s| s.at - samples[0].at >= from)
            .collect();
        let (rss, fds, conns) = (
            slope(&settled, |s| s.rss_kb / 1024.0),
            slope(&settled, |s| s.fds),
            slope(&settled, |s| s.db_conns),
        );
        println!(
            "soak {} worker {pid}{}: {} samples, RSS {:.1}→{:.1} MB ({rss:+.3} MB/min), fds {}→{} ({fds:+.3}/min), database connections {}→{} ({conns:+.3}/min)",
            names[*fleet],
            if long_lived { " (judged)" } else { "" },
            samples.len(),
            samples[0].rss_kb / 1024.0,
            samples.last().unwrap().rss_kb / 1024.0,
            samples[0].fds,
            samples.last().unwrap().fds,
            samples[0].db_conns,
            samples.last().unwrap().db_conns,
        );
        if long_lived {
            judged += 1;
            worst_slopes.0 = worst_slopes.0.max(rss);
            worst_slopes.1 = worst_slopes.1.max(fds);
            worst_slopes.2 = worst_slopes.2.max(conns);
        }
    }
    println!(
        "soak: {judged} worker(s) lived {JUDGED_AFTER} s or more; their steepest slopes after {WARM_UP} s (MB/min, fds/min, connections/min): {:.3}, {:.3}, {:.3}",
        worst_slopes.0, worst_slopes.1, worst_slopes.2
    );

    for o in &report {
        let (name, v) = (names[o.fleet], &o.verdict);
        assert_eq!(o.published, o.total, "{name}: rows left unpublished");
        assert!(o.all, "{name}: {}", v.summary());
        assert!(v.is_clean(), "{name}: {}", v.summary());
        assert!(
            o.twice.is_empty(),
            "{name}: epochs acquired twice: {:?}",
            o.twice
        );
        assert_eq!(
            o.regressions, 0,
            "{name}: first deliveries under an older epoch"
        );
        assert!(
            o.late.is_empty(),
            "{name}: sent after its bucket was taken over (bucket, epoch, newer epoch seen): {:?}",
            o.late
        );
    }
    if long {
        // Thirty minutes: whatever a worker still grows by is a leak. The
        // lapin failed-connect leak (~1.7 MB per broker restart) showed as
        // +0.40 MB/min here; fixed, +0.02 to +0.07.
        assert!(judged >= 2, "no long-lived worker to judge");
        assert!(
            worst_slopes.0 < 0.2,
            "RSS grows {:.3} MB/min",
            worst_slopes.0
        );
        assert!(
            worst_slopes.1 < 0.5,
            "descriptors grow {:.3}/min",
            worst_slopes.1
        );
        assert!(
            worst_slopes.2 < 0.2,
            "connections grow {:.3}/min",
            worst_slopes.2
        );
    }
    for f in &mut fleets {
        terminate_all(&mut f.workers);
    }
    drop(journal);
}

/// Starts again every worker that exited at start-up — it could not
/// connect (spawned while its database was down: a crash, a cut link), or
/// exited before it registered (its registration failed: a full disk
/// outlasting the start-up's retries) — as its supervisor would (the
/// packaged unit restarts it on failure); any exit after registering is
/// left for the end to fail on. `down`: workers SIGKILLed and not yet
/// spawned again. Returns how many it started.
fn restart_failed_starts(
    fleets: &mut [Fleet],
    down: &HashSet<(usize, usize)>,
    servers: &Servers,
    pids: &Mutex<Vec<Vec<u32>>>,
    journal: &mut Journal,
    started: Instant,
) -> usize {
    let mut restarted = 0;
    for (fleet, f) in fleets.iter_mut().enumerate() {
        for worker in 0..f.workers.len() {
            let w = &mut f.workers[worker];
            let log = w.log_text();
            let at_start_up =
                log.contains("outboxd: cannot connect to") || !log.contains("worker registered");
            if down.contains(&(fleet, worker)) || w.running() || !at_start_up {
                continue;
            }
            f.workers[worker] = spawn_on_host(servers, &f.env, worker);
            pids.lock().unwrap()[fleet][worker] = f.workers[worker].pid();
            let line = format!(
                "{:>8.1}s worker {worker} of fleet {fleet} had exited at start-up (its database \
                 was down or failing): started again",
                started.elapsed().as_secs_f64()
            );
            println!("soak: {}", line.trim_start());
            journal.lines.push(line);
            restarted += 1;
        }
    }
    restarted
}

/// Worker `w` of a fleet, on host `w + 1`.
fn spawn_on_host(servers: &Servers, env: &TestEnv, w: usize) -> WorkerProcess {
    env.spawn_worker_on(
        Some(&servers.lab.netns(w + 1)),
        &env.config_path,
        &["--silent"],
    )
}
