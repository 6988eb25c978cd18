//! Section 12 (`--only scale`): how the fleet's own cost grows with it.
//! Real `outboxd work` processes, each with its own pools and
//! broker connection, default settings (`lease_ttl` 15 s, `lease_renew`
//! 6 s, `heartbeat_ttl` 20 s), no messages: 2 workers over 16 buckets, 16
//! over 256 and 64 over 1,024 (`--quick`: the first two), on PostgreSQL
//! (with `LISTEN`) and on MariaDB; and the largest fleet again with
//! `database.max_connections = 3` (the book's advice for large fleets, docs/fleet.md).
//! Per fleet:
//!
//! - time to settle after a cold start (every worker started at once),
//!   after SIGKILL of a quarter of the workers, and after a quarter joins:
//!   settled is every bucket leased by the live worker the modulo rule
//!   names (coordinator::assignment), read from the database;
//! - at idle, once the pools have shrunk back (`store::trim`): the
//!   database's CPU (every PostgreSQL process / the MariaDB server, as a
//!   share of one core), the workers' CPU together, coordination
//!   transactions per second (PostgreSQL's `xact_commit + xact_rollback`
//!   for the database; MariaDB's `Questions`, statements, server-wide),
//!   and the connections the workers hold;
//! - the busiest moment of the cold start: connections at once (sampled
//!   every 200 ms) and how many times workers were refused one (`too many
//!   clients` / `Too many connections` in their logs);
//! - that no bucket was ever owned twice, from the lease events: per
//!   bucket, every acquisition starts from the epoch the previous event
//!   left (no two workers took the same lease) and only the owner
//!   releases.
//!
//! With `OUTBOXD_BENCH_BASELINE_BIN=<path to another outboxd>`, each
//! backend's fleets run first with that binary (a baseline build, same
//! run), then with this one; `OUTBOXD_BENCH_SCALE_FLEETS=64x1024` (a
//! comma-separated list; `64x1024x3`: only its pools of 3) runs only those
//! fleets, `OUTBOXD_BENCH_SCALE_POSTGRES_ONLY=1` only PostgreSQL and
//! `OUTBOXD_BENCH_SCALE_MARIADB_ONLY=1` only MariaDB.
//!
//! Targets: an idle worker ≤ 2 connections; coordination at 64 × 1,024
//! idle ≤ 5 % of one core of the database; settle after a quarter is
//! killed ≤ `lease_ttl` + 2 s; no bucket owned twice.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use outboxd::config::{Assignment, Config};
use outboxd::coordinator::assignment::owner_index;
use outboxd::partitioner::Partitioner;
use outboxd::store::Store;
use serde_json::{Value, json};
use sqlx::{Connection as _, MySqlConnection, PgConnection};
use uuid::Uuid;

use super::{
    BIN, Backend, Bench, clock_ticks, cpu_ticks, live_as_workers_see_it, outboxd_on, pid_file,
    postgres_cpu_ticks, postmaster_children_ticks, signal, terminate, with_path,
};

/// How long after its start a fleet is measured idle: its pools grew at
/// start-up and shrink after `store::trim::QUIET` (30 s), one connection a
/// second.
const SETTLE: Duration = Duration::from_secs(50);
/// The longest a fleet may take to settle before the section gives up.
const SETTLE_LIMIT: Duration = Duration::from_secs(180);
/// The default `lease_ttl` the workers run with (the target's bound).
const LEASE_TTL: Duration = Duration::from_secs(15);

/// One fleet's figures; a settle time is `None` when the fleet had not
/// settled after [`SETTLE_LIMIT`].
struct Fleet {
    cold: Option<Duration>,
    after_kill: Option<Duration>,
    after_join: Option<Duration>,
    peak_connections: i64,
    refusals: usize,
    idle: Idle,
    events: usize,
    owned_twice: Vec<String>,
}

/// A fleet at idle, over the measured window.
struct Idle {
    database_cpu: f64,
    workers_cpu: f64,
    per_second: f64,
    connections: i64,
}

impl Bench {
    pub(super) async fn scale(&mut self) {
        // (workers, buckets, database.max_connections; None: the default).
        let fleets: &[(usize, u32, Option<u32>)] = if self.quick {
            &[(2, 16, None), (16, 256, None)]
        } else {
            &[
                (2, 16, None),
                (16, 256, None),
                (64, 1024, None),
                (64, 1024, Some(3)),
            ]
        };
        // A subset, for a look at one fleet: `OUTBOXD_BENCH_SCALE_FLEETS=64x1024`
        // (both pool sizes), `64x1024x3` (pools of 3 only), `64x1024x0` (the
        // default pool only).
        let only: Option<Vec<Vec<u32>>> =
            std::env::var("OUTBOXD_BENCH_SCALE_FLEETS").ok().map(|v| {
                v.split(',')
                    .map(|f| f.split('x').map(|n| n.trim().parse().unwrap()).collect())
                    .collect()
            });
        let picked = |(w, b, pool): &(usize, u32, Option<u32>)| {
            only.as_ref().is_none_or(|o| {
                o.iter().any(|f| match f[..] {
                    [fw, fb] => (fw as usize, fb) == (*w, *b),
                    [fw, fb, fp] => {
                        (fw as usize, fb, Some(fp).filter(|&p| p > 0)) == (*w, *b, *pool)
                    }
                    _ => false,
                })
            })
        };
        let fleets: Vec<(usize, u32, Option<u32>)> =
            fleets.iter().copied().filter(|f| picked(f)).collect();
        let over = Duration::from_secs(if self.quick { 10 } else { 20 });
        println!(
            "scale: fleets of {fleets:?} (workers, buckets, max_connections), idle measured over {over:?}"
        );
        // (backend, the workers' binary, what the rows say of it)
        let only = |var: &str| std::env::var(var).is_ok();
        let backends = [
            (Backend::Postgres, !only("OUTBOXD_BENCH_SCALE_MARIADB_ONLY")),
            (Backend::MariaDb, !only("OUTBOXD_BENCH_SCALE_POSTGRES_ONLY")),
        ];
        let baseline = std::env::var("OUTBOXD_BENCH_BASELINE_BIN").ok();
        let mut runs = Vec::new();
        for (backend, _) in backends.into_iter().filter(|(_, run)| *run) {
            if let Some(before) = &baseline {
                runs.push((backend, PathBuf::from(before), " (baseline binary)"));
            }
            runs.push((backend, PathBuf::from(BIN), ""));
        }
        let mut out = serde_json::Map::new();
        for (on, bin, arm) in runs {
            for &(workers, buckets, max_connections) in &fleets {
                let f = self
                    .fleet(on, workers, buckets, max_connections, over, &bin)
                    .await;
                let pool = max_connections.map_or(String::new(), |m| format!(", pools of {m}"));
                let name = format!(
                    "{} {workers} workers x {buckets} buckets{pool}{arm}",
                    on.name()
                );
                self.fleet_rows(&name, workers, &f);
                let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
                out.insert(
                    format!(
                        "{}_{workers}x{buckets}{}{}",
                        on.name().to_lowercase(),
                        max_connections.map_or(String::new(), |m| format!("_pool{m}")),
                        if arm.is_empty() { "" } else { "_baseline" }
                    ),
                    json!({
                        "workers": workers, "buckets": buckets, "max_connections": max_connections,
                        "idle_seconds": over.as_secs(),
                        "settle_seconds": { "cold": secs(f.cold),
                            "after_sigkill_of_a_quarter": secs(f.after_kill),
                            "after_a_quarter_joined": secs(f.after_join) },
                        "idle": { "database_cpu_share": f.idle.database_cpu,
                            "workers_cpu_share": f.idle.workers_cpu,
                            "statements_per_second": f.idle.per_second,
                            "connections": f.idle.connections },
                        "cold_start": { "peak_connections": f.peak_connections, "refusals": f.refusals },
                        "lease_events": f.events, "owned_twice": f.owned_twice,
                    }),
                );
            }
        }
        self.results.insert("scale".into(), Value::Object(out));
    }

    /// The table's rows for one fleet.
    fn fleet_rows(&mut self, name: &str, workers: usize, f: &Fleet) {
        let quarter = (workers / 4).max(1);
        let unit = if name.starts_with(Backend::Postgres.name()) {
            "transactions"
        } else {
            "statements"
        };
        let secs = |d: Option<Duration>| {
            d.map_or(format!("> {}", SETTLE_LIMIT.as_secs()), |d| {
                format!("{:.1}", d.as_secs_f64())
            })
        };
        self.row(
            &format!("{name}: idle DB CPU / workers' CPU"),
            format!(
                "{:.2} / {:.2} %",
                f.idle.database_cpu * 100.0,
                f.idle.workers_cpu * 100.0
            ),
            "% of one core; 64 x 1024 target DB <= 5 %".into(),
        );
        self.row(
            &format!("{name}: idle {unit}/s, connections"),
            format!(
                "{:.0}/s, {} ({:.2} per worker)",
                f.idle.per_second,
                f.idle.connections,
                f.idle.connections as f64 / workers as f64
            ),
            "target <= 2 per worker".into(),
        );
        self.row(
            &format!("{name}: settle cold / -{quarter} SIGKILL / +{quarter}"),
            format!(
                "{} / {} / {} s",
                secs(f.cold),
                secs(f.after_kill),
                secs(f.after_join)
            ),
            format!("kill target <= {} s", LEASE_TTL.as_secs() + 2),
        );
        self.row(
            &format!("{name}: cold start peak connections, refusals"),
            format!("{}, {}", f.peak_connections, f.refusals),
            "refused workers back off".into(),
        );
        self.row(
            &format!("{name}: lease events, buckets owned twice"),
            format!("{}, {}", f.events, f.owned_twice.len()),
            "target 0 owned twice".into(),
        );
    }

    /// One fleet of `workers` over `buckets`, from a cold start to a
    /// quarter killed and a quarter joined (see the module docs).
    async fn fleet(
        &self,
        on: Backend,
        workers: usize,
        buckets: u32,
        max_connections: Option<u32>,
        over: Duration,
        bin: &Path,
    ) -> Fleet {
        let name = format!("outboxd_bench_scale_{workers}x{buckets}");
        let toml = format!("\n[outbox]\npartition_count = {buckets}\n");
        let (fresh, config, _) = self.fresh_buckets(on, &name, &toml, buckets).await;
        fresh.close().await;
        let store = self.admin_store(on, &name, buckets).await;
        let pool = max_connections.map(|m| m.to_string());
        let spawn = |log: &Path| spawn_logged(bin, &config, log, pool.as_deref());
        let mut admin = Admin::connect(self, on, &name).await;
        let logs: Vec<PathBuf> = (0..workers + workers.div_ceil(4))
            .map(|i| self.dir.join(format!("{name}-{}-{i}.log", on.name())))
            .collect();
        let started = Instant::now();
        let mut fleet = Processes((0..workers).map(|i| spawn(&logs[i])).collect());
        let mut peak_connections = 0;
        let cold = loop {
            peak_connections = peak_connections.max(admin.connections().await);
            if settled(&store, workers, buckets).await {
                break Some(started.elapsed());
            }
            if started.elapsed() > SETTLE_LIMIT {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        // Idle without the harness's own pool on the database.
        store.close().await;
        tokio::time::sleep(SETTLE.saturating_sub(started.elapsed())).await;
        let idle = self.fleet_idle(&mut admin, &fleet.0, over).await;
        let store = self.admin_store(on, &name, buckets).await;

        let quarter = (workers / 4).max(1);
        let killed = Instant::now();
        for mut w in fleet.0.drain(..quarter) {
            let _ = w.kill();
            let _ = w.wait();
        }
        let after_kill = wait_settled(&store, workers - quarter, buckets, killed).await;
        let joined = Instant::now();
        let joining = (0..quarter).map(|i| spawn(&logs[workers + i]));
        fleet.0.extend(joining);
        let after_join = wait_settled(&store, workers, buckets, joined).await;
        drop(fleet);

        let (events, owned_twice) = owned_twice(&store).await;
        // Refused outright, or no connection within `connect_timeout` (how
        // sqlx's pool reports a refusal it kept retrying).
        let refusals = logs
            .iter()
            .map(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| {
                        l.contains("too many clients")
                            || l.contains("Too many connections")
                            || l.contains("pool timed out")
                    })
                    .count()
            })
            .sum();
        store.close().await;
        drop(admin);
        self.drop_database_on(on, &name).await;
        Fleet {
            cold,
            after_kill,
            after_join,
            peak_connections,
            refusals,
            idle,
            events,
            owned_twice,
        }
    }

    /// A store on the fleet's database as its administrator, with a pool
    /// of two: a fleet that took every ordinary connection still leaves a
    /// superuser's (PostgreSQL) in; retried for a minute all the same.
    async fn admin_store(&self, on: Backend, name: &str, buckets: u32) -> Store {
        let url = match on {
            Backend::Postgres => with_path(&self.admin_url, name),
            _ => with_path(&self.mysql_admin_url, name),
        };
        let toml = format!(
            "[database]\nurl = \"{url}\"\nmax_connections = 2\n[amqp]\nurl = \"{}\"\n[outbox]\npartition_count = {buckets}\n",
            self.amqp_url
        );
        let config = Config::from_toml(&toml).unwrap();
        let since = Instant::now();
        loop {
            match Store::connect(
                &outboxd::store::StoreSettings::from_config(&config),
                "outboxd bench",
            )
            .await
            {
                Ok(store) => return store,
                Err(e) if since.elapsed() < Duration::from_secs(60) => {
                    println!("  (the harness could not connect yet: {e})");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => panic!("the harness could not connect to {name}: {e}"),
            }
        }
    }

    /// The fleet at idle over `over` (see [`Idle`]).
    async fn fleet_idle(&self, admin: &mut Admin, fleet: &[Child], over: Duration) -> Idle {
        let workers_ticks = || -> u64 { fleet.iter().filter_map(|w| cpu_ticks(w.id())).sum() };
        let (db0, w0, n0) = (
            admin.database_ticks(),
            workers_ticks(),
            admin.statements().await,
        );
        tokio::time::sleep(over).await;
        let (db1, w1, n1) = (
            admin.database_ticks(),
            workers_ticks(),
            admin.statements().await,
        );
        let secs = over.as_secs_f64();
        let share = |ticks: u64| ticks as f64 / clock_ticks() as f64 / secs;
        Idle {
            database_cpu: share(db1 - db0),
            workers_cpu: share(w1 - w0),
            per_second: (n1 - n0) as f64 / secs,
            connections: admin.connections().await,
        }
    }
}

/// The harness's own connection to the fleet's database server, as its
/// administrator (PostgreSQL keeps slots for superusers, MariaDB one for
/// `SUPER`: it still gets in when the workers took every other).
enum Admin {
    Pg(PgConnection, String),
    My(MySqlConnection, String),
}

impl Admin {
    async fn connect(bench: &Bench, on: Backend, database: &str) -> Self {
        match on {
            Backend::Postgres => Admin::Pg(
                PgConnection::connect(&with_path(&bench.admin_url, "postgres"))
                    .await
                    .unwrap(),
                database.into(),
            ),
            _ => Admin::My(
                MySqlConnection::connect(&bench.mysql_admin_url)
                    .await
                    .unwrap(),
                database.into(),
            ),
        }
    }

    /// Connections the fleet's database has open: the workers', and on
    /// MariaDB (no application name to tell them apart) the harness's own
    /// store pool's during a cold start (closed while idle is measured).
    async fn connections(&mut self) -> i64 {
        match self {
            Admin::Pg(c, db) => sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = $1 AND application_name <> 'outboxd bench'",
            )
            .bind(&*db)
            .fetch_one(c)
            .await
            .unwrap(),
            Admin::My(c, db) => sqlx::query_scalar(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = ?",
            )
            .bind(&*db)
            .fetch_one(c)
            .await
            .unwrap(),
        }
    }

    /// The server's statement counter: transactions in the fleet's
    /// database (PostgreSQL), statements server-wide (MariaDB).
    async fn statements(&mut self) -> i64 {
        match self {
            Admin::Pg(c, db) => sqlx::query_scalar(
                "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = $1",
            )
            .bind(&*db)
            .fetch_one(c)
            .await
            .unwrap(),
            Admin::My(c, _) => {
                let (_, n): (String, String) =
                    sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                        .fetch_one(c)
                        .await
                        .unwrap();
                n.parse().unwrap()
            }
        }
    }

    /// CPU of the whole database server, in clock ticks — on PostgreSQL
    /// the backends that exited meanwhile included (what its postmaster's
    /// reaped children used): connections that come and go would
    /// otherwise take their CPU with them.
    fn database_ticks(&self) -> u64 {
        match self {
            Admin::Pg(..) => postgres_cpu_ticks() + postmaster_children_ticks().unwrap_or(0),
            Admin::My(..) => pid_file("mariadb.pid").and_then(cpu_ticks).unwrap_or(0),
        }
    }
}

/// An `outboxd work` process (`bin`) on `config`, warnings and errors to `log`;
/// with `max_connections`, its pool's size.
fn spawn_logged(bin: &Path, config: &Path, log: &Path, max_connections: Option<&str>) -> Child {
    let mut command = outboxd_on(bin, config);
    if let Some(m) = max_connections {
        command.env("OUTBOXD_DATABASE__MAX_CONNECTIONS", m);
    }
    command
        .arg("work")
        .arg("--silent")
        .env("OUTBOXD_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// How long after `since` the fleet of `workers` settles; `None` when it
/// had not after [`SETTLE_LIMIT`].
async fn wait_settled(
    store: &Store,
    workers: usize,
    buckets: u32,
    since: Instant,
) -> Option<Duration> {
    loop {
        if settled(store, workers, buckets).await {
            return Some(since.elapsed());
        }
        if since.elapsed() > SETTLE_LIMIT {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Worker processes, stopped (SIGTERM, then SIGKILL) when dropped — also
/// when the section panics.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for w in &self.0 {
            signal(w, "TERM");
        }
        for w in &mut self.0 {
            terminate(w);
        }
    }
}

/// Whether `workers` are live and every bucket is leased by the one the
/// modulo rule names among them.
async fn settled(store: &Store, workers: usize, buckets: u32) -> bool {
    let (Ok(mut live), Ok(leases)) = (live_as_workers_see_it(store).await, store.leases().await)
    else {
        return false;
    };
    if live.len() != workers {
        return false;
    }
    live.sort();
    let labels = Partitioner::new(buckets).labels();
    let owners: HashMap<&str, Option<Uuid>> = leases
        .iter()
        .filter(|l| l.valid)
        .map(|l| (l.partition_key.as_str(), l.lease_owner))
        .collect();
    labels.iter().enumerate().all(|(b, label)| {
        let due = live[owner_index(Assignment::Modulo, &live, b as u32)];
        owners.get(label.as_str()) == Some(&Some(due))
    })
}

/// Every lease event of the fleet, checked per bucket: each acquisition
/// starts from the epoch and owner the previous event left, and only the
/// owner releases. The events read, and what broke the chain.
async fn owned_twice(store: &Store) -> (usize, Vec<String>) {
    let mut state: HashMap<String, (Option<Uuid>, i64)> = HashMap::new();
    let (mut after, mut read, mut broken) = (0, 0, Vec::new());
    loop {
        let events = store.events_since(after, 10_000).await.unwrap();
        let Some(last) = events.last() else {
            return (read, broken);
        };
        after = last.id;
        read += events.len();
        for e in events {
            let (owner, epoch) = state
                .get(&e.partition_key)
                .copied()
                .unwrap_or((None, e.old_epoch));
            let next = match e.action.as_str() {
                "acquire" => {
                    if e.old_epoch != epoch || e.old_owner != owner || e.new_epoch != epoch + 1 {
                        broken.push(format!(
                            "{}: {} took epoch {} from {:?} while it was {epoch} of {owner:?}",
                            e.partition_key, e.worker_id, e.old_epoch, e.old_owner
                        ));
                    }
                    (Some(e.worker_id), e.new_epoch)
                }
                _ => {
                    if owner != Some(e.worker_id) || e.old_epoch != epoch {
                        broken.push(format!(
                            "{}: {} released epoch {} held by {owner:?} at {epoch}",
                            e.partition_key, e.worker_id, e.old_epoch
                        ));
                    }
                    (None, e.new_epoch)
                }
            };
            state.insert(e.partition_key, next);
        }
    }
}
