//! The benchmark harness: real PostgreSQL, MariaDB, RabbitMQ and `outboxd` processes,
//! every figure next to a baseline measured in the same run (these machines
//! are shared and noisy, so only ratios are compared with targets).
//!
//! Run with `scripts/bench.sh` (starts the services). Sections:
//!
//! 1. throughput — N pending rows drained by 1, 2 and 4 workers on
//!    PostgreSQL and by 1 and 2 on MariaDB, against the ceiling: a bare
//!    lapin publisher sending the same messages with confirms and the same
//!    in-flight window (16 channels × one batch), no database
//!    (`OUTBOXD_BENCH_THROUGHPUT_ONLY=postgresql|mariadb|sqlite` for one
//!    backend's arms, `OUTBOXD_BENCH_THROUGHPUT_WORKERS=2` for one fleet
//!    size; with `OUTBOXD_BENCH_BASELINE_BIN`, every arm again on that build
//!    right after — or on each build of a comma-separated list, to bisect;
//!    `OUTBOXD_BENCH_THROUGHPUT_REPEAT=N` runs the arms N rounds, the
//!    builds' order reversed every other round, and adds each arm's
//!    median);
//! 2. latency — commit-to-queue latency of a trickle at 50 and 500 msg/s,
//!    on PostgreSQL (`NOTIFY`) and on MariaDB (adaptive polling); and of 200
//!    messages at 100 msg/s through PgBouncer (transaction mode) with
//!    `listen_url` and with polling (with `OUTBOXD_BENCH_BASELINE_BIN`,
//!    each worker's figures again right after on that build;
//!    `OUTBOXD_BENCH_LATENCY_ONLY=postgresql|mariadb|sqlite|pgbouncer` for
//!    one arm, or several comma-separated; `OUTBOXD_BENCH_LATENCY_REPEAT=N`
//!    runs the arms N rounds, the builds' order swapped every round, and
//!    adds each trickle's figures over the messages of all rounds;
//!    `OUTBOXD_BENCH_LATENCY_SIDE_BY_SIDE=1` runs the builds at once
//!    instead of in turn on PostgreSQL, MariaDB and SQLite, each on a
//!    database and a queue of its own, and divides the other builds' p50
//!    and p99 by this build's, with an interval over the rounds; there and
//!    in section 1, each build's databases are migrated by that build);
//! 3. backlog — one claim + record of a batch at 10k pending rows (baseline)
//!    vs 1M pending, and vs 10k pending beside 1M published rows: three
//!    tables, their rounds interleaved;
//! 4. rebalance — re-own time after a graceful leave and after a kill, with
//!    the throughput dip around it;
//! 5. memory — peak RSS of the worker during the 1-worker throughput run;
//! 6. churn — claim + record before and after 2M rows were published and
//!    purged;
//! 7. production — closer to how it runs in production, each relay figure
//!    beside a ceiling measured the same way: a consumer draining the queue
//!    (steady depth; a process of its own, this binary with `--drain QUEUE`,
//!    its CPU shown); the broker pinned to one core and everything else to
//!    the other (`taskset`, standing in for a broker on its own host); a hot
//!    key (every message one key) against one confirm channel with
//!    `window = batch_size`; and the relay-side CPU per message: CPU time of
//!    the worker process plus its PostgreSQL backends or MariaDB connection
//!    threads (and, apart, the whole database server, background work
//!    included), from `/proc`, over the drain, divided by the
//!    messages; RabbitMQ's CPU per message beside it, for the ceiling and
//!    the relay, and the bare publisher's own (this process's CPU while it
//!    publishes the ceiling: lapin's share of a message, the worker's
//!    floor). On PostgreSQL and on MariaDB (shared cores and the hot
//!    key; MariaDB is not pinned: it stalled so once;
//!    `OUTBOXD_BENCH_PRODUCTION_ONLY=postgresql|mariadb` for one backend's
//!    figures; with `OUTBOXD_BENCH_BASELINE_BIN`, each round's relay again
//!    on every build, each migrating its own database, the builds' order
//!    reversed every other round, and this build's throughput and CPU
//!    ÷ each other build's over the rounds). `--repeat N` measures
//!    each of its figures N times, ceiling and relay alternating, and shows
//!    the pair with the median ratio beside every run's ratio; unless
//!    `--quick`, each figure's first pair is a warm-up, printed and not
//!    counted.
//!
//! `--published-key-index` gives every PostgreSQL database the book's key
//! index over every row (*Searching published messages by key*, its own
//! statements) right after migrating: the schema before migration 0013.
//!
//! Prints a table and writes JSON (`--out FILE`, default
//! `target/outboxd-bench.json`). `--quick` shrinks the sizes for a smoke run;
//! `--only throughput|latency|backlog|rebalance|churn|production|tls|traces|sources|reload|scale|keep|shapes|streams`
//! runs one section (tls: `relay/tls.rs`, TLS on both links against
//! plaintext; traces: `relay/traces.rs`, span export on against off;
//! sources: `relay/sources.rs`, one worker with 50 idle sources against one;
//! reload: the same file, sources added to and removed from a busy worker;
//! scale: `relay/scale.rs`, fleets of 2, 16 and 64 worker processes over
//! 16, 256 and 1,024 buckets — settle times, idle cost, connections;
//! keep: `relay/keep.rs`, published rows deleted against kept; shapes:
//! `relay/shapes.rs`, the trickle in several shapes, stage by stage, beside
//! the bare path — the producer publishing itself; streams:
//! `relay/streams.rs`, the relay into a RabbitMQ stream beside a bare
//! stream publisher and beside the relay into a queue).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use outboxd::amqp::message_properties;
use outboxd::config::Config;
use outboxd::partitioner::Partitioner;
use outboxd::producer::{Message, Producer};
use outboxd::store::Store;
use outboxd::store::outbox::{Claim, ClaimToken, ClaimedMessage, Holder};
use outboxd::store::postgres::DbPool;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection as _, MySqlConnection, PgConnection};

#[path = "relay/keep.rs"]
mod keep;
#[path = "../tests/common/otlp.rs"]
#[allow(dead_code)]
mod otlp;
#[path = "../tests/common/readme.rs"]
mod readme;
#[path = "relay/scale.rs"]
mod scale;
#[path = "relay/shapes.rs"]
mod shapes;
#[path = "relay/sources.rs"]
mod sources;
#[path = "relay/streams.rs"]
mod streams;
#[path = "relay/tls.rs"]
mod tls;
#[path = "../tests/common/tls.rs"]
#[allow(dead_code)]
mod tls_pki;
#[path = "relay/traces.rs"]
mod traces;
#[path = "relay/trickle.rs"]
mod trickle;

use trickle::trickle;

const BIN: &str = env!("CARGO_BIN_EXE_outboxd");
const PAYLOAD: usize = 256;
const KEYS: usize = 5_000;
/// The bucket count of every database the harness migrates.
const BUCKETS: u32 = 16;
/// The draining consumer awaits the writes of this many acks at once.
const ACKS_AWAITED_TOGETHER: usize = 100;

struct Bench {
    admin_url: String,
    /// MariaDB's, for the sections that run on both backends.
    mysql_admin_url: String,
    amqp_url: String,
    dir: PathBuf,
    quick: bool,
    /// How many ceiling/relay pairs section 7 measures per figure.
    repeat: usize,
    /// `--published-key-index`: PostgreSQL databases get the book's key
    /// index over every row (*Searching published messages by key*).
    published_key_index: bool,
    results: serde_json::Map<String, Value>,
    table: Vec<(String, String, String)>,
    /// The queues declared since the last section ended
    /// ([`Bench::declare_purged`]), emptied when it ends.
    declared: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Section 2's round, as its rows name it (`""` with one round).
    round: String,
    /// Section 2's trickles by measure, over all its rounds.
    trickles: Vec<Pooled>,
}

/// A trickle's latencies over section 2's rounds.
struct Pooled {
    measure: String,
    /// Every message's, in no order.
    all: Vec<Duration>,
    /// Each round's p99.
    p99s: Vec<Duration>,
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(queue) = args
        .iter()
        .position(|a| a == "--drain")
        .map(|i| &args[i + 1])
    {
        Drain::run(&std::env::var("AMQP_URL").unwrap(), queue).await;
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let published_key_index = args.iter().any(|a| a == "--published-key-index");
    let repeat = args
        .iter()
        .position(|a| a == "--repeat")
        .and_then(|i| args.get(i + 1))
        .map_or(1, |n| n.parse().expect("--repeat takes a count"))
        .max(1);
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let run = |section: &str| only.as_deref().is_none_or(|o| o == section);
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| "target/outboxd-bench.json".into());
    let env = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run scripts/bench.sh"))
    };
    let dir = std::env::temp_dir().join(format!("outboxd-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut b = Bench {
        admin_url: env("OUTBOXD_PG_ADMIN_URL"),
        mysql_admin_url: env("OUTBOXD_MYSQL_ADMIN_URL"),
        amqp_url: env("AMQP_URL"),
        dir,
        quick,
        repeat,
        published_key_index,
        results: serde_json::Map::new(),
        table: Vec::new(),
        declared: Default::default(),
        round: String::new(),
        trickles: Vec::new(),
    };
    b.results.insert("machine".into(), machine());
    let key_index = if published_key_index {
        "every row (docs/operations.md, Searching published messages by key)"
    } else {
        "unpublished rows only (the schema's own)"
    };
    println!("PostgreSQL's message-key index: {key_index}");
    b.results
        .insert("postgres_key_index".into(), json!(key_index));
    // Each section, then its queues emptied: what a section left in
    // RabbitMQ weighed on the sections after it.
    macro_rules! sections {
        ($($name:literal => $method:ident),* $(,)?) => {$(
            if run($name) {
                b.$method().await;
                b.purge_declared().await;
            }
        )*};
    }
    sections! {
        "throughput" => throughput,
        "latency" => latency,
        "backlog" => backlog,
        "rebalance" => rebalance,
        "churn" => churn,
        "production" => production,
        "tls" => tls,
        "traces" => traces,
        "sources" => sources,
        "reload" => reloads,
        "scale" => scale,
        "keep" => keep,
        "shapes" => shapes,
        "streams" => streams,
    }

    // As wide as the longest measure's name, so that every value lines up.
    let w = b
        .table
        .iter()
        .map(|(m, _, _)| m.chars().count())
        .max()
        .unwrap_or(0)
        .max(58);
    println!(
        "\n{:<w$} {:>16} {:>22}",
        "measure", "value", "baseline / target"
    );
    println!("{}", "-".repeat(w + 40));
    for (m, v, t) in &b.table {
        println!("{m:<w$} {v:>16} {t:>22}");
    }
    if let Some(parent) = Path::new(&out).parent() {
        std::fs::create_dir_all(parent).ok();
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&Value::Object(b.results)).unwrap(),
    )
    .unwrap();
    // The run's configuration files (and SQLite's databases, each dropped
    // already); a run that panicked leaves them for a look.
    std::fs::remove_dir_all(&b.dir).ok();
    println!("\nresults written to {out}");
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    json!({ "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "cpu": cpu, "memory": mem })
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Bench {
    fn row(&mut self, measure: &str, value: String, target: String) {
        println!("  {measure}: {value} ({target})");
        self.table.push((measure.into(), value, target));
    }

    async fn drop_database(&self, name: &str) {
        self.drop_database_on(Backend::Postgres, name).await;
    }

    async fn drop_database_on(&self, on: Backend, name: &str) {
        match on {
            Backend::Postgres => {
                let mut admin = PgConnection::connect(&self.admin_url).await.unwrap();
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                sqlx::query(AssertSqlSafe(sql))
                    .execute(&mut admin)
                    .await
                    .unwrap();
            }
            Backend::MariaDb => {
                let mut admin = MySqlConnection::connect(&self.mysql_admin_url)
                    .await
                    .unwrap();
                let sql = format!("DROP DATABASE IF EXISTS {name}");
                sqlx::raw_sql(AssertSqlSafe(sql))
                    .execute(&mut admin)
                    .await
                    .unwrap();
            }
            Backend::Sqlite => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(self.dir.join(format!("{name}.db{suffix}")));
                }
            }
        }
    }

    /// A fresh, migrated database and a config file for it.
    async fn fresh(&self, name: &str, worker_toml: &str) -> (Store, PathBuf, String) {
        self.fresh_on(Backend::Postgres, name, worker_toml).await
    }

    /// [`Bench::fresh`] on either backend.
    async fn fresh_on(
        &self,
        on: Backend,
        name: &str,
        worker_toml: &str,
    ) -> (Store, PathBuf, String) {
        self.fresh_buckets(on, name, worker_toml, BUCKETS).await
    }

    /// [`Bench::fresh_on`] migrated with `buckets` buckets (the config's
    /// `outbox.partition_count` is the caller's, in `worker_toml`).
    async fn fresh_buckets(
        &self,
        on: Backend,
        name: &str,
        worker_toml: &str,
        buckets: u32,
    ) -> (Store, PathBuf, String) {
        let (store, path, url) = self.created(on, name, worker_toml).await;
        store.migrate(Partitioner::new(buckets)).await.unwrap();
        self.key_index(on, &store).await;
        (store, path, url)
    }

    /// [`Bench::fresh_on`] migrated by `build`'s own `outboxd migrate`, so
    /// that builds of different schema versions can be measured in one
    /// run (a build refuses a database at any other version than its own).
    /// This build's arms migrate as [`Bench::fresh_on`] does.
    async fn fresh_for(
        &self,
        on: Backend,
        name: &str,
        worker_toml: &str,
        build: &Build,
    ) -> (Store, PathBuf, String) {
        if build.key.is_empty() {
            return self.fresh_on(on, name, worker_toml).await;
        }
        let (store, path, url) = self.created(on, name, worker_toml).await;
        let migrated = outboxd_on(&build.bin, &path)
            .arg("migrate")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(migrated.success(), "{} migrate failed", build.bin.display());
        self.key_index(on, &store).await;
        (store, path, url)
    }

    /// An empty database named `name` on `on` (none of the schema yet), a
    /// config file for it, and a store connected to it.
    async fn created(
        &self,
        on: Backend,
        name: &str,
        worker_toml: &str,
    ) -> (Store, PathBuf, String) {
        self.drop_database_on(on, name).await;
        let admin_url = match on {
            Backend::Postgres => &self.admin_url,
            Backend::MariaDb | Backend::Sqlite => &self.mysql_admin_url,
        };
        let create = AssertSqlSafe(format!("CREATE DATABASE {name}"));
        let url = match on {
            Backend::Postgres => {
                let mut admin = PgConnection::connect(admin_url).await.unwrap();
                sqlx::query(create).execute(&mut admin).await.unwrap();
                with_path(admin_url, name)
            }
            Backend::MariaDb => {
                let mut admin = MySqlConnection::connect(admin_url).await.unwrap();
                sqlx::raw_sql(create).execute(&mut admin).await.unwrap();
                with_path(admin_url, name)
            }
            // A file in the bench's directory, created by migrate.
            Backend::Sqlite => format!("sqlite://{}/{name}.db", self.dir.display()),
        };
        let toml = format!(
            "[database]\nurl = \"{url}\"\n[amqp]\nurl = \"{}\"\n[worker]\n{worker_toml}\n",
            self.amqp_url
        );
        let path = self.dir.join(format!("{name}-{}.toml", on.name()));
        std::fs::write(&path, &toml).unwrap();
        let config = Config::from_toml(&toml).unwrap();
        let store = Store::connect(
            &outboxd::store::StoreSettings::from_config(&config),
            "outboxd bench",
        )
        .await
        .unwrap();
        (store, path, url.to_string())
    }

    /// With `--published-key-index`, the book's key index over every row
    /// on a migrated PostgreSQL database.
    async fn key_index(&self, on: Backend, store: &Store) {
        if on == Backend::Postgres && self.published_key_index {
            for statement in readme::published_key_index() {
                sqlx::raw_sql(AssertSqlSafe(statement))
                    .execute(pg(store))
                    .await
                    .unwrap();
            }
        }
    }

    /// Inserts `n` pending rows (256-byte payloads over KEYS keys) routed to
    /// `queue`, bucket labels computed by the Rust partitioner; then
    /// `VACUUM ANALYZE`.
    async fn seed(&self, store: &Store, n: usize, queue: &str, published: bool) {
        self.seed_keys(store, n, queue, published, KEYS).await;
    }

    /// [`Bench::seed`] over `keys` keys.
    async fn seed_keys(&self, store: &Store, n: usize, queue: &str, published: bool, keys: usize) {
        self.insert_rows_keys(store, n, queue, published, keys)
            .await;
        match (store.mysql(), store.sqlite()) {
            (Some(my), _) => sqlx::raw_sql("ANALYZE TABLE outbox")
                .execute(my.pool())
                .await
                .map(drop),
            (_, Some(lite)) => sqlx::raw_sql("ANALYZE")
                .execute(lite.pool())
                .await
                .map(drop),
            _ => sqlx::raw_sql("VACUUM ANALYZE outbox")
                .execute(pg(store))
                .await
                .map(drop),
        }
        .unwrap();
    }

    /// [`Bench::seed`] without the vacuum.
    async fn insert_rows(&self, store: &Store, n: usize, queue: &str, published: bool) {
        self.insert_rows_keys(store, n, queue, published, KEYS)
            .await;
    }

    async fn insert_rows_keys(
        &self,
        store: &Store,
        n: usize,
        queue: &str,
        published: bool,
        keys: usize,
    ) {
        if let Some(my) = store.mysql() {
            // MariaDB's sequence tables; labels by the database's CRC32.
            let chunk = 100_000;
            let mut start = 0;
            while start < n {
                let end = (start + chunk).min(n);
                let sql = format!(
                    "INSERT INTO outbox (partition_key, message_key, routing_key, payload, published_at)
                     SELECT CONCAT('p', LPAD(CRC32(CONCAT('key-', seq % {keys})) % {BUCKETS}, 2, '0')),
                            CONCAT('key-', seq % {keys}), '{queue}', REPEAT('x', {PAYLOAD}),
                            {published}
                     FROM seq_{start}_to_{last}",
                    last = end - 1,
                    published = if published { "UTC_TIMESTAMP(6)" } else { "NULL" },
                );
                sqlx::raw_sql(AssertSqlSafe(sql))
                    .execute(my.pool())
                    .await
                    .unwrap();
                start = end;
            }
            return;
        }
        let p = Partitioner::new(BUCKETS);
        let labels: Vec<String> = (0..keys)
            .map(|k| p.label_for(&format!("key-{k}")))
            .collect();
        if let Some(lite) = store.sqlite() {
            // Labels named (the Rust partitioner's), so the trigger's SQL
            // CRC does not run: a recursive CTE of row numbers.
            sqlx::query(
                "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < ?1)
                 INSERT INTO outbox (partition_key, message_key, routing_key, payload, published_at)
                 SELECT json_extract(?2, '$[' || (i % ?3) || ']'), 'key-' || (i % ?3), ?4,
                        CAST(replace(hex(zeroblob(?5)), '00', 'x') AS BLOB),
                        CASE WHEN ?6 THEN strftime('%Y-%m-%d %H:%M:%f', 'now') END
                 FROM g",
            )
            .bind(n as i64)
            .bind(serde_json::to_string(&labels).unwrap())
            .bind(keys as i64)
            .bind(queue)
            .bind(PAYLOAD as i64)
            .bind(published)
            .execute(lite.pool())
            .await
            .unwrap();
            return;
        }
        let chunk = 250_000;
        let mut start = 0;
        while start < n {
            let end = (start + chunk).min(n);
            sqlx::query(
                "INSERT INTO outbox (partition_key, message_key, routing_key, payload, published_at)
                 SELECT ($1::text[])[g % $2 + 1], 'key-' || (g % $2), $3,
                        convert_to(repeat('x', $4), 'UTF8'), CASE WHEN $7 THEN now() END
                 FROM generate_series($5::bigint, $6::bigint) g",
            )
            .bind(&labels)
            .bind(keys as i64)
            .bind(queue)
            .bind(PAYLOAD as i32)
            .bind(start as i64)
            .bind(end as i64 - 1)
            .bind(published)
            .execute(pg(store))
            .await
            .unwrap();
            start = end;
        }
    }

    async fn declare_purged(&self, queue: &str) {
        self.declared.lock().unwrap().insert(queue.to_string());
        let conn = Connection::connect(&self.amqp_url, ConnectionProperties::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_purge(queue.into(), QueuePurgeOptions::default())
            .await
            .unwrap();
        conn.close(200, "bye".into()).await.ok();
    }

    /// Empties the queues declared since the last call: a section's
    /// messages left in RabbitMQ (half a million after a full run) weighed
    /// on the sections after it.
    async fn purge_declared(&self) {
        let queues = std::mem::take(&mut *self.declared.lock().unwrap());
        if queues.is_empty() {
            return;
        }
        let conn = Connection::connect(&self.amqp_url, ConnectionProperties::default())
            .await
            .unwrap();
        for queue in queues {
            let ch = conn.create_channel().await.unwrap();
            if let Err(e) = ch
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await
            {
                println!("  (could not empty {queue} after its section: {e})");
            }
        }
        conn.close(200, "bye".into()).await.ok();
    }

    fn spawn(&self, config: &Path, args: &[&str]) -> Child {
        self.spawn_with(config, args, &[])
    }

    /// [`Bench::spawn`] with extra environment variables.
    fn spawn_with(&self, config: &Path, args: &[&str], vars: &[(&str, String)]) -> Child {
        spawn_bin(Path::new(BIN), config, args, vars)
    }

    // ---------------------------------------------------------------- 1 + 5
    async fn throughput(&mut self) {
        let n = if self.quick { 20_000 } else { 200_000 };
        println!("throughput: {n} messages of {PAYLOAD} bytes over {KEYS} keys");
        let queue = "bench-throughput";
        // The ceiling is measured before the first arm and after every arm;
        // each arm is compared with the mean of the ceilings on either side
        // of it, so a machine that slows down (or speeds up) during the
        // section moves an arm and its baseline together.
        let mut quieting = quiet_machine().await;
        let mut ceiling = self.ceiling(queue, n).await;
        let mut ceilings = vec![ceiling];
        self.row(
            "ceiling: bare lapin publisher, 16 channels x 100 in flight",
            format!("{ceiling:.0} msg/s"),
            "baseline, again after each arm".into(),
        );
        let mut per_workers = serde_json::Map::new();
        // `OUTBOXD_BENCH_THROUGHPUT_ONLY=mariadb` (a backend's name) runs
        // that backend's arms only, `OUTBOXD_BENCH_THROUGHPUT_WORKERS=2`
        // those of one fleet size; with `OUTBOXD_BENCH_BASELINE_BIN`, each
        // arm runs again right after on that build (on each of a
        // comma-separated list), the builds' order reversed every other
        // round.
        let only = std::env::var("OUTBOXD_BENCH_THROUGHPUT_ONLY").ok();
        if let Some(o) = &only {
            let names = [Backend::Postgres, Backend::MariaDb, Backend::Sqlite].map(Backend::name);
            assert!(
                names.iter().any(|n| n.eq_ignore_ascii_case(o)),
                "OUTBOXD_BENCH_THROUGHPUT_ONLY={o} names no backend (one of {names:?}, any case)"
            );
        }
        let only_workers: Option<usize> = std::env::var("OUTBOXD_BENCH_THROUGHPUT_WORKERS")
            .ok()
            .and_then(|w| w.parse().ok());
        // `OUTBOXD_BENCH_THROUGHPUT_REPEAT=3` runs the whole list of arms
        // three times, round after round (so arms alternate), and adds each
        // arm's median ratio at the end.
        let rounds: usize = std::env::var("OUTBOXD_BENCH_THROUGHPUT_REPEAT")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(1)
            .max(1);
        let builds = builds();
        let mut runs = Vec::new();
        for (on, workers) in [
            (Backend::Postgres, 1usize),
            (Backend::Postgres, 2),
            (Backend::Postgres, 4),
            (Backend::MariaDb, 1),
            (Backend::MariaDb, 2),
            (Backend::Sqlite, 1),
        ] {
            if only
                .as_deref()
                .is_some_and(|o| !o.eq_ignore_ascii_case(on.name()))
                || only_workers.is_some_and(|w| w != workers)
            {
                continue;
            }
            runs.push((on, workers));
        }
        // Each arm on every build in turn, the builds' order reversed in
        // every other round, so that each runs first as often.
        let runs: Vec<_> = (0..rounds)
            .flat_map(|r| {
                let order = round_order(&builds, r);
                runs.iter().flat_map(move |&(on, workers)| {
                    order.clone().into_iter().map(move |b| (on, workers, b))
                })
            })
            .collect();
        let mut ratios: Vec<(String, Vec<f64>)> = Vec::new();
        for (on, workers, arm) in runs {
            let Build {
                bin,
                label: build,
                key: build_key,
            } = arm;
            let (store, config, _) = self.fresh_for(on, "outboxd_bench_tp", "", arm).await;
            self.seed(&store, n, queue, false).await;
            self.declare_purged(queue).await;
            quieting += quiet_machine().await;
            let start = Instant::now();
            let mut children: Vec<Child> = (0..workers)
                .map(|_| spawn_bin(bin, &config, &["--silent"], &[]))
                .collect();
            let mut peak_rss_kb = 0u64;
            loop {
                let pending = any_pending(&store).await;
                for c in &children {
                    peak_rss_kb = peak_rss_kb.max(vm_hwm_kb(c.id()));
                }
                if !pending {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(600),
                    "drain did not finish"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let took = start.elapsed();
            let mut cpu = 0u64;
            for c in &mut children {
                peak_rss_kb = peak_rss_kb.max(vm_hwm_kb(c.id()));
                cpu += cpu_ticks(c.id()).unwrap_or(0);
                terminate(c);
            }
            let cpu_us = cpu as f64 / clock_ticks() as f64 * 1e6 / n as f64;
            let rate = n as f64 / took.as_secs_f64();
            store.close().await;
            self.drop_database_on(on, "outboxd_bench_tp").await;
            quieting += quiet_machine().await;
            let after = self.ceiling(queue, n).await;
            ceilings.push(after);
            let baseline = (ceiling + after) / 2.0;
            ceiling = after;
            let ratio = rate / baseline;
            let target = match (on, workers) {
                (Backend::Sqlite, 1) => "target >= 0.75",
                (_, 1) => "target >= 0.85",
                _ => "",
            };
            let label = format!(
                "relay on {}, {workers} worker(s), default settings{build}",
                on.name()
            );
            match ratios.iter_mut().find(|(l, _)| *l == label) {
                Some((_, r)) => r.push(ratio),
                None => ratios.push((label.clone(), vec![ratio])),
            }
            self.row(
                &label,
                format!("{rate:.0} msg/s"),
                format!(
                    "{ratio:.2} x ceiling ({baseline:.0} msg/s on either side) {target}; worker CPU {cpu_us:.1} us/msg"
                ),
            );
            if workers == 1 && on == Backend::Postgres && build.is_empty() {
                let mb = peak_rss_kb as f64 / 1024.0;
                self.row(
                    "peak RSS of the worker (1-worker run)",
                    format!("{mb:.1} MB"),
                    "target <= 50 MB".into(),
                );
                self.results
                    .insert("memory".into(), json!({ "peak_rss_mb": mb }));
            }
            let key = match on {
                Backend::Postgres => workers.to_string(),
                Backend::MariaDb => format!("mariadb_{workers}"),
                Backend::Sqlite => format!("sqlite_{workers}"),
            } + build_key;
            per_workers.insert(
                key,
                json!({ "msgs_per_sec": rate, "ratio_to_ceiling": ratio, "ceiling_msgs_per_sec": baseline, "seconds": took.as_secs_f64(), "worker_cpu_us_per_msg": cpu_us }),
            );
        }
        self.row(
            "waited for a quiet machine before the arms and ceilings",
            format!("{:.1} s", quieting.as_secs_f64()),
            "CPUs 85 % idle over 0.5 s, at most 30 s each".into(),
        );
        if rounds > 1 {
            for (label, r) in ratios {
                let each = r.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>();
                let median = median_of(&r);
                self.row(
                    &format!("{label}, median of {rounds}"),
                    format!("{median:.2} x"),
                    format!("each run: {}", each.join(" / ")),
                );
                per_workers.insert(format!("median: {label}"), json!(median));
            }
        }
        let first = ceilings[0];
        self.results.insert(
            "throughput".into(),
            json!({ "messages": n, "payload_bytes": PAYLOAD, "ceiling_msgs_per_sec": first, "ceilings_msgs_per_sec": ceilings, "relay": per_workers }),
        );
    }

    /// The same messages, the same window (16 channels, 100 in flight each,
    /// confirms awaited per batch), no database.
    async fn ceiling(&self, queue: &str, n: usize) -> f64 {
        self.ceiling_with(queue, n, KEYS, 16, 100).await.rate
    }

    /// A bare publisher: `channels` confirm channels, `window` messages in
    /// flight on each (confirms awaited per window), no database. It sends
    /// the messages the relay would send for the seeded rows (`keys` keys):
    /// the same properties and headers, built by the relay's own
    /// [`message_properties`] before the clock starts.
    async fn ceiling_with(
        &self,
        queue: &str,
        n: usize,
        keys: usize,
        channels: usize,
        window: usize,
    ) -> Ceiling {
        self.declare_purged(queue).await;
        let conn = Arc::new(
            Connection::connect(&self.amqp_url, ConnectionProperties::default())
                .await
                .unwrap(),
        );
        let partitioner = Partitioner::new(BUCKETS);
        let mut messages: Vec<Vec<BasicProperties>> = vec![Vec::new(); channels];
        for i in 0..n {
            let row = claimed_row(&partitioner, i, keys, queue, Vec::new());
            // A fresh database's leases are all at epoch 1.
            messages[i % channels].push(message_properties(&row, Some(1)).unwrap());
        }
        let start = Instant::now();
        let cpu_before = cpu_ticks(std::process::id()).unwrap_or(0);
        let mut tasks = Vec::new();
        for mine in messages {
            let (conn, queue) = (conn.clone(), queue.to_string());
            tasks.push(tokio::spawn(async move {
                let ch = conn.create_channel().await.unwrap();
                ch.confirm_select(ConfirmSelectOptions::default())
                    .await
                    .unwrap();
                let payload = vec![b'x'; PAYLOAD];
                let mut mine = mine.into_iter().peekable();
                while mine.peek().is_some() {
                    let mut confirms = Vec::with_capacity(window);
                    for props in mine.by_ref().take(window) {
                        let options = BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        };
                        confirms.push(
                            ch.basic_publish(
                                "".into(),
                                queue.as_str().into(),
                                options,
                                &payload,
                                props,
                            )
                            .await
                            .unwrap(),
                        );
                    }
                    for c in confirms {
                        assert!(c.await.unwrap().is_ack());
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        let publisher_us = us_per_message(
            cpu_ticks(std::process::id())
                .unwrap_or(0)
                .saturating_sub(cpu_before),
            n,
        );
        self.declare_purged(queue).await;
        Ceiling { rate, publisher_us }
    }

    // ---------------------------------------------------------------- 2
    /// One trickle (`rate` msg/s for `over`) through `db_url`'s worker, as
    /// a row of the table (`measure` names it; p50 / p99 / max) and its
    /// figures for the JSON.
    async fn trickle_row(
        &mut self,
        db_url: &str,
        queue: &str,
        (rate, over): (u64, Duration),
        measure: &str,
        note: &str,
    ) -> Value {
        let lat = trickle(db_url, &self.amqp_url, queue, rate, over).await;
        self.trickle_figures(measure, note, lat)
    }

    /// A trickle's row and JSON figures from its sorted latencies `lat`,
    /// which join `measure`'s pool across rounds.
    fn trickle_figures(&mut self, measure: &str, note: &str, lat: Vec<Duration>) -> Value {
        let (p50, p99, max) = (pct(&lat, 0.5), pct(&lat, 0.99), *lat.last().unwrap());
        match self.trickles.iter_mut().find(|t| t.measure == measure) {
            Some(t) => {
                t.all.extend_from_slice(&lat);
                t.p99s.push(p99);
            }
            None => self.trickles.push(Pooled {
                measure: measure.to_owned(),
                all: lat.clone(),
                p99s: vec![p99],
            }),
        }
        self.row(
            &format!("{measure}{}", self.round),
            format!("{:.1} / {:.1} / {:.1} ms", ms(p50), ms(p99), ms(max)),
            note.into(),
        );
        json!({ "messages": lat.len(), "p50_ms": ms(p50), "p99_ms": ms(p99), "max_ms": ms(max) })
    }

    /// [`Bench::trickle_row`] at 50 and then 500 msg/s through `db_url`'s
    /// worker: rows named `commit-to-queue latency{what} at {rate} msg/s`,
    /// JSON entries `key(rate)`.
    async fn trickle_rates(
        &mut self,
        (db_url, queue, over): (&str, &str, Duration),
        what: &str,
        note: &str,
        key: impl Fn(u64) -> String,
        out: &mut serde_json::Map<String, Value>,
    ) {
        for rate in [50u64, 500] {
            let measure =
                format!("commit-to-queue latency{what} at {rate} msg/s (p50 / p99 / max)");
            let figures = self
                .trickle_row(db_url, queue, (rate, over), &measure, note)
                .await;
            out.insert(format!("{}{}", key(rate), round_key(&self.round)), figures);
        }
    }

    /// Section 2. With `OUTBOXD_BENCH_BASELINE_BIN`, each worker's figures
    /// are measured again right after on that build (its rows and JSON keys
    /// say so): a trickle's tail has no target the relay meets, so only a
    /// baseline shows it getting worse.
    ///
    /// `OUTBOXD_BENCH_LATENCY_ONLY=postgresql` (`mariadb`, `sqlite`,
    /// `pgbouncer`, or several, comma-separated) runs those arms only.
    /// `OUTBOXD_BENCH_LATENCY_REPEAT=N` runs the arms N rounds, the builds'
    /// order swapped from one round to the next (whichever runs second has,
    /// at times, the slower start), and ends with each trickle's figures
    /// over all its rounds' messages and the median of its rounds' p99s: a
    /// p99 of one run's 500 messages moves by half a millisecond from one
    /// run to the next. Run a build against a copy of itself to see how far
    /// apart two arms of one build land.
    /// `OUTBOXD_BENCH_LATENCY_SIDE_BY_SIDE=1` runs the builds at once
    /// rather than in turn on each database ([`Bench::latency_side_by_side`]);
    /// PgBouncer's arms still run in turn.
    async fn latency(&mut self) {
        let arms = ["postgresql", "mariadb", "sqlite", "pgbouncer"];
        // A comma-separated list of arms.
        let only: Option<Vec<String>> = std::env::var("OUTBOXD_BENCH_LATENCY_ONLY")
            .ok()
            .map(|o| o.split(',').map(str::to_ascii_lowercase).collect());
        for o in only.iter().flatten() {
            assert!(
                arms.contains(&o.as_str()),
                "OUTBOXD_BENCH_LATENCY_ONLY names {o}, no arm (one of {arms:?}, any case)"
            );
        }
        let runs = |arm: &str| only.as_ref().is_none_or(|o| o.iter().any(|o| o == arm));
        let rounds: usize = std::env::var("OUTBOXD_BENCH_LATENCY_REPEAT")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(1)
            .max(1);
        let builds = builds();
        let order = |r: usize| round_order(&builds, r);
        let round = |r: usize| round_label(r, rounds);
        let side_by_side =
            std::env::var("OUTBOXD_BENCH_LATENCY_SIDE_BY_SIDE").is_ok_and(|v| v == "1");
        self.trickles.clear();
        let (store, config, db_url) = self.fresh("outboxd_bench_lat", "").await;
        let queue = "bench-latency";
        self.declare_purged(queue).await;
        let mut out = serde_json::Map::new();
        let over = Duration::from_secs(if self.quick { 3 } else { 10 });
        if side_by_side {
            for (arm, on) in [
                ("postgresql", Backend::Postgres),
                ("mariadb", Backend::MariaDb),
                ("sqlite", Backend::Sqlite),
            ] {
                if runs(arm) {
                    self.latency_side_by_side(on, &builds, rounds, over, &mut out)
                        .await;
                }
            }
        }
        for r in (0..rounds).filter(|_| runs("postgresql") && !side_by_side) {
            self.round = round(r);
            for build in order(r) {
                let mut worker = spawn_bin(&build.bin, &config, &["--silent"], &[]);
                tokio::time::sleep(Duration::from_secs(2)).await;
                self.trickle_rates(
                    (&db_url, queue, over),
                    &build.label,
                    "target p99 <= 5 ms",
                    |rate| format!("{rate}{}", build.key),
                    &mut out,
                )
                .await;
                terminate(&mut worker);
            }
        }

        // MariaDB: no notifications; adaptive polling (poll_interval 100 ms
        // while polls find rows, backing off to idle_backoff_ms 1 s), with
        // the probe for added rows between polls (probe_interval, 5 ms by
        // default) and without it (0ms: the baseline). What the probe costs
        // is measured idle, where it is all the work there is.
        if runs("mariadb") && !side_by_side {
            let (my_store, my_config, my_url) = self
                .fresh_on(Backend::MariaDb, "outboxd_bench_lat", "")
                .await;
            for (r, probe, build) in (0..rounds).flat_map(|r| {
                ["5ms", "0ms"]
                    .into_iter()
                    .flat_map(move |p| order(r).into_iter().map(move |b| (r, p, b)))
            }) {
                self.round = round(r);
                let toml = std::fs::read_to_string(&my_config).unwrap().replacen(
                    &format!("url = \"{my_url}\"\n"),
                    &format!("url = \"{my_url}\"\nprobe_interval = \"{probe}\"\n"),
                    1,
                );
                let probed = self.dir.join(format!("latency-mariadb-probe-{probe}.toml"));
                std::fs::write(&probed, toml).unwrap();
                let mut my_worker = spawn_bin(&build.bin, &probed, &["--silent"], &[]);
                tokio::time::sleep(Duration::from_secs(2)).await;
                let idle = Duration::from_secs(if self.quick { 2 } else { 5 });
                let ticks =
                    || cpu_ticks(my_worker.id()).unwrap_or(0) + database_cpu_ticks(&my_store);
                let before = ticks();
                tokio::time::sleep(idle).await;
                let idle_cpu =
                    (ticks() - before) as f64 / clock_ticks() as f64 / idle.as_secs_f64();
                let baseline = probe == "0ms";
                self.row(
                    &format!(
                        "MariaDB, probe_interval {probe}{}: idle worker + MariaDB CPU{}",
                        build.label, self.round
                    ),
                    format!("{:.1} % of a core", idle_cpu * 100.0),
                    if baseline {
                        "baseline"
                    } else {
                        "the probe's cost"
                    }
                    .into(),
                );
                out.insert(
                    format!(
                        "mariadb_idle_cpu_probe_{probe}{}{}",
                        build.key,
                        round_key(&self.round)
                    ),
                    json!({ "share_of_a_core": idle_cpu }),
                );
                let (note, off) = if baseline {
                    ("baseline: polls only", "_probe_off")
                } else {
                    ("target p99 <= 5 ms", "")
                };
                self.trickle_rates(
                    (&my_url, queue, over),
                    &format!(
                        " on MariaDB (polling, probe_interval {probe}){}",
                        build.label
                    ),
                    note,
                    |rate| format!("mariadb_{rate}{off}{}", build.key),
                    &mut out,
                )
                .await;
                terminate(&mut my_worker);
            }
            my_store.close().await;
            self.drop_database_on(Backend::MariaDb, "outboxd_bench_lat")
                .await;
        }

        // SQLite: no notifications either; polls and the probe, defaults.
        if runs("sqlite") && !side_by_side {
            let (lite_store, lite_config, lite_url) = self
                .fresh_on(Backend::Sqlite, "outboxd_bench_lat", "")
                .await;
            for (r, build) in (0..rounds).flat_map(|r| order(r).into_iter().map(move |b| (r, b))) {
                self.round = round(r);
                let mut lite_worker = spawn_bin(&build.bin, &lite_config, &["--silent"], &[]);
                tokio::time::sleep(Duration::from_secs(2)).await;
                self.trickle_rates(
                    (&lite_url, queue, over),
                    &format!(" on SQLite (polling and probe){}", build.label),
                    "target p99 <= 10 ms",
                    |rate| format!("sqlite_{rate}{}", build.key),
                    &mut out,
                )
                .await;
                terminate(&mut lite_worker);
            }
            lite_store.close().await;
            self.drop_database_on(Backend::Sqlite, "outboxd_bench_lat")
                .await;
        }

        // Through PgBouncer in transaction mode (the services' own, in
        // front of the same PostgreSQL): wake-ups by LISTEN on the direct
        // listen_url, and by polling (database.poll_interval) with and
        // without the probe.
        let bouncer_port = std::env::var("OUTBOXD_PGBOUNCER_PORT").unwrap_or("56432".into());
        let mut via = url::Url::parse(&db_url).unwrap();
        via.set_port(Some(bouncer_port.parse().unwrap())).unwrap();
        let pooled_arms = [
            ("listen_url", format!("listen_url = \"{db_url}\"\n")),
            ("polling", String::new()),
            (
                "polling, probe off",
                "probe_interval = \"0ms\"\n".to_string(),
            ),
        ];
        for (r, (name, listen_line), build) in
            (0..rounds).filter(|_| runs("pgbouncer")).flat_map(|r| {
                let order = order(r);
                pooled_arms.clone().into_iter().flat_map(move |arm| {
                    order.clone().into_iter().map(move |b| (r, arm.clone(), b))
                })
            })
        {
            self.round = round(r);
            let toml = std::fs::read_to_string(&config).unwrap().replacen(
                &format!("url = \"{db_url}\"\n"),
                &format!("url = \"{via}\"\npooler = \"transaction\"\n{listen_line}"),
                1,
            );
            let slug = name.replace(", ", "_").replace(' ', "_");
            let pooled = self.dir.join(format!("latency-pgbouncer-{slug}.toml"));
            std::fs::write(&pooled, toml).unwrap();
            let mut worker = spawn_bin(&build.bin, &pooled, &["--silent"], &[]);
            tokio::time::sleep(Duration::from_secs(7)).await;
            // 200 messages at 100 msg/s.
            let measure = format!(
                "commit-to-queue latency through PgBouncer, {name}{} (p50 / p99 / max, 200 at 100 msg/s)",
                build.label
            );
            let figures = self
                .trickle_row(&db_url, queue, (100, Duration::from_secs(2)), &measure, "")
                .await;
            out.insert(
                format!("pgbouncer_{slug}{}{}", build.key, round_key(&self.round)),
                figures,
            );
            terminate(&mut worker);
        }
        store.close().await;
        self.round.clear();
        if rounds > 1 {
            let mut pooled = serde_json::Map::new();
            for Pooled {
                measure,
                all: mut lat,
                p99s,
            } in std::mem::take(&mut self.trickles)
            {
                lat.sort();
                let (p50, p99, max) = (pct(&lat, 0.5), pct(&lat, 0.99), *lat.last().unwrap());
                // The rounds' p99s in order: an even count's median is the
                // mean of the middle two.
                let mut p99s: Vec<f64> = p99s.iter().map(|d| ms(*d)).collect();
                p99s.sort_by(f64::total_cmp);
                let n = p99s.len();
                let rounds_p99 = (p99s[(n - 1) / 2] + p99s[n / 2]) / 2.0;
                self.row(
                    &format!("{measure}, {rounds} rounds pooled"),
                    format!("{:.1} / {:.1} / {:.1} ms", ms(p50), ms(p99), ms(max)),
                    format!(
                        "{} messages; the rounds' p99 median {:.2} ms",
                        lat.len(),
                        rounds_p99
                    ),
                );
                pooled.insert(
                    measure,
                    json!({
                        "messages": lat.len(), "p50_ms": ms(p50), "p99_ms": ms(p99), "max_ms": ms(max),
                        "rounds_p99_median_ms": rounds_p99,
                    }),
                );
            }
            out.insert("pooled".into(), Value::Object(pooled));
        }
        self.results.insert("latency".into(), Value::Object(out));
    }

    /// Section 2's arm on `on` with `OUTBOXD_BENCH_LATENCY_SIDE_BY_SIDE=1`:
    /// every build at once, each a worker on a database and a queue of its
    /// own (one database server, one RabbitMQ), their trickles started
    /// together, so that a slow minute of the machine falls on every build
    /// alike. Taken in turn, a build's trickles and the next build's are
    /// 20 s apart, and on these machines the same work costs every process
    /// (the database, RabbitMQ, the worker, this harness) up to 1.7 × as
    /// much CPU in one minute as in the next, which moves a p99 more than
    /// the builds differ. The builds together carry at most the load of
    /// the busiest trickle taken in turn: each trickles at 50 msg/s, and
    /// shares the 500 (two builds at 500 msg/s each saturate the two
    /// cores: p99 4–56 ms). MariaDB and SQLite run with their defaults
    /// (polling and the probe). With more than one round, each other
    /// build's p50 and p99 over all rounds' messages are divided by this
    /// build's, with an interval ([`paired_ratio`]).
    async fn latency_side_by_side(
        &mut self,
        on: Backend,
        builds: &[Build],
        rounds: usize,
        over: Duration,
        out: &mut serde_json::Map<String, Value>,
    ) {
        let (what, prefix) = match on {
            Backend::Postgres => ("", ""),
            Backend::MariaDb => (" on MariaDB (polling and probe)", "mariadb_"),
            Backend::Sqlite => (" on SQLite (polling and probe)", "sqlite_"),
        };
        // A place per build, each with its queue and a database for every
        // build, so that each build drains only databases migrated by
        // itself (builds of different schema versions can be compared).
        let mut arms = Vec::new();
        for i in 0..builds.len() {
            let queue = format!("bench-latency-side-{i}");
            self.declare_purged(&queue).await;
            let mut databases = Vec::new();
            for (b, build) in builds.iter().enumerate() {
                let name = format!("outboxd_bench_lat_side_{i}_{b}");
                let (store, config, url) = self.fresh_for(on, &name, "", build).await;
                databases.push((name, store, config, url));
            }
            arms.push((queue, databases));
        }
        let amqp_url = self.amqp_url.clone();
        // Each rate's latencies by build (as `builds` lists them), a
        // vector per round.
        let mut by_round: HashMap<(u64, usize), Vec<Vec<Duration>>> = HashMap::new();
        for r in 0..rounds {
            self.round = round_label(r, rounds);
            // The builds swap places (queues, and which trickle starts
            // first) from one round to the next.
            let order = round_indices(builds.len(), r);
            let mut workers: Vec<Child> = order
                .iter()
                .zip(&arms)
                .map(|(&index, (_, databases))| {
                    spawn_bin(&builds[index].bin, &databases[index].2, &["--silent"], &[])
                })
                .collect();
            tokio::time::sleep(Duration::from_secs(2)).await;
            for rate in [50u64, 500] {
                let each = rate.min(500 / builds.len() as u64);
                let trickles = order.iter().zip(&arms).map(|(&index, (queue, databases))| {
                    trickle(&databases[index].3, &amqp_url, queue, each, over)
                });
                let lats = futures_util::future::join_all(trickles).await;
                for (&index, lat) in order.iter().zip(lats) {
                    let build = &builds[index];
                    let measure = format!(
                        "commit-to-queue latency{what}{}, side by side, at {each} msg/s ({} together) (p50 / p99 / max)",
                        build.label,
                        each * order.len() as u64
                    );
                    by_round.entry((rate, index)).or_default().push(lat.clone());
                    let figures = self.trickle_figures(&measure, "builds at once", lat);
                    out.insert(
                        format!(
                            "{prefix}{rate}_side_by_side{}{}",
                            build.key,
                            round_key(&self.round)
                        ),
                        figures,
                    );
                }
            }
            workers.iter_mut().for_each(terminate);
        }
        self.round.clear();
        let compared = builds.iter().enumerate().skip(1).filter(|_| rounds > 1);
        for (rate, (index, build)) in [50u64, 500]
            .into_iter()
            .flat_map(|rate| compared.clone().map(move |b| (rate, b)))
        {
            let each = rate.min(500 / builds.len() as u64);
            let (this, other) = (&by_round[&(rate, 0)], &by_round[&(rate, index)]);
            let mut figures = serde_json::Map::new();
            for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
                let (ratio, low, high) = paired_ratio(this, other, q);
                self.row(
                    &format!(
                        "{name}{what}{} ÷ this build's, side by side, at {each} msg/s, {rounds} rounds",
                        build.label
                    ),
                    format!("{ratio:.2} ×"),
                    format!("90 % of the rounds resampled: {low:.2}–{high:.2} ×"),
                );
                figures.insert(
                    name.into(),
                    json!({ "ratio": ratio, "interval_90": [low, high] }),
                );
            }
            out.insert(
                format!("{prefix}{rate}_side_by_side{}_ratio", build.key),
                Value::Object(figures),
            );
        }
        for (name, store, ..) in arms.into_iter().flat_map(|(_, databases)| databases) {
            store.close().await;
            self.drop_database_on(on, &name).await;
        }
    }

    // ---------------------------------------------------------------- 3
    async fn backlog(&mut self) {
        let big = if self.quick { 100_000 } else { 1_000_000 };
        let mut out = serde_json::Map::new();
        let (small, _, _) = self.fresh("outboxd_bench_bl_small", "").await;
        self.seed(&small, 10_000, "q", false).await;
        let (pending, _, _) = self.fresh("outboxd_bench_bl", "").await;
        self.seed(&pending, big, "q", false).await;
        // The same 10k pending rows, beside `big` published rows.
        let (beside, _, _) = self.fresh("outboxd_bench_bl2", "").await;
        self.seed(&beside, big, "q", true).await;
        self.seed(&beside, 10_000, "q", false).await;
        // Rounds alternate between the three tables, so that a noisy spell
        // of the machine weighs on the baseline and the others alike.
        let [base, at_big, at_beside] = claim_record_costs([&small, &pending, &beside]).await;
        self.row(
            "claim + record of 100 rows at 10k pending",
            format!("{:.2} ms", ms(base)),
            "baseline".into(),
        );
        out.insert("pending_10k_ms".into(), json!(ms(base)));
        let r = at_big.as_secs_f64() / base.as_secs_f64();
        self.row(
            &format!("claim + record of 100 rows at {big} pending"),
            format!("{:.2} ms", ms(at_big)),
            format!("{r:.2} x baseline, target <= 1.3"),
        );
        out.insert("pending_big_ms".into(), json!(ms(at_big)));
        let r2 = at_beside.as_secs_f64() / base.as_secs_f64();
        self.row(
            &format!("claim + record at 10k pending beside {big} published"),
            format!("{:.2} ms", ms(at_beside)),
            format!("{r2:.2} x baseline, target <= 1.3"),
        );
        out.insert("published_big_ms".into(), json!(ms(at_beside)));
        out.insert("rows".into(), json!(big));
        for store in [small, pending, beside] {
            store.close().await;
        }
        // Gigabytes of rows would keep autovacuum busy under later sections.
        for name in [
            "outboxd_bench_bl_small",
            "outboxd_bench_bl",
            "outboxd_bench_bl2",
        ] {
            self.drop_database(name).await;
        }
        self.results.insert("backlog".into(), Value::Object(out));
    }

    // ---------------------------------------------------------------- 6
    /// The relay's per-batch cost before and after `n` rows went through
    /// the table: enqueued, published (the relay's UPDATE, in chunks) and
    /// purged (`outboxd purge`: its batches, then its VACUUM).
    async fn churn(&mut self) {
        let n: i64 = if self.quick { 200_000 } else { 2_000_000 };
        let mut out = serde_json::Map::new();
        let (store, _, _) = self.fresh("outboxd_bench_churn", "").await;
        self.seed(&store, 10_000, "q", false).await;
        let base = claim_record_cost(&store).await;
        self.row(
            "claim + record of 100 rows, fresh table, 10k pending",
            format!("{:.2} ms", ms(base)),
            "baseline".into(),
        );
        out.insert("fresh_ms".into(), json!(ms(base)));

        let started = Instant::now();
        let first: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) + 1 FROM outbox")
            .fetch_one(pg(&store))
            .await
            .unwrap();
        self.insert_rows(&store, n as usize, "q", false).await;
        let chunk = 50_000;
        let mut at = first;
        while at < first + n {
            sqlx::query(
                "UPDATE outbox SET published_at = now()
                 WHERE id >= $1 AND id < $2 AND published_at IS NULL",
            )
            .bind(at)
            .bind(at + chunk)
            .execute(pg(&store))
            .await
            .unwrap();
            at += chunk;
        }
        let churned = started.elapsed();
        let purge_started = Instant::now();
        let purged = outboxd::ops::purge_published(&store, Duration::ZERO)
            .await
            .unwrap();
        let purge_took = purge_started.elapsed();
        assert!(purged >= n as u64, "purged {purged} of {n}");
        self.row(
            &format!("purge of {purged} published rows (5,000 per statement, then VACUUM)"),
            format!("{:.1} s", purge_took.as_secs_f64()),
            format!("{:.0} rows/s", purged as f64 / purge_took.as_secs_f64()),
        );
        out.insert("rows".into(), json!(n));
        out.insert("enqueue_publish_s".into(), json!(churned.as_secs_f64()));
        out.insert("purge_s".into(), json!(purge_took.as_secs_f64()));

        self.insert_rows(&store, 10_000, "q", false).await;
        let after = claim_record_cost(&store).await;
        let r = after.as_secs_f64() / base.as_secs_f64();
        self.row(
            &format!("… after {n} rows published and purged"),
            format!("{:.2} ms", ms(after)),
            format!("{r:.2} x baseline"),
        );
        out.insert("after_purge_ms".into(), json!(ms(after)));
        store.close().await;
        self.drop_database("outboxd_bench_churn").await;
        self.results.insert("churn".into(), Value::Object(out));
    }

    // ---------------------------------------------------------------- 4
    async fn rebalance(&mut self) {
        let mut out = serde_json::Map::new();
        for (how, signal) in [
            ("graceful leave (SIGTERM)", "TERM"),
            ("kill (SIGKILL)", "KILL"),
        ] {
            let (store, config, db_url) = self.fresh("outboxd_bench_rb", "").await;
            let queue = "bench-rebalance";
            self.declare_purged(queue).await;
            let mut workers: Vec<Child> =
                (0..3).map(|_| self.spawn(&config, &["--silent"])).collect();
            wait_all_owned(&store, 3, Duration::from_secs(30)).await;
            let rate = 2000.0;
            let producing = tokio::spawn(produce_at(
                db_url.clone(),
                queue.to_string(),
                rate,
                Duration::from_secs(40),
            ));
            tokio::time::sleep(Duration::from_secs(3)).await;
            let mut victim = workers.remove(0);
            let sampler = tokio::spawn(sample_published(
                store.clone(),
                Duration::from_millis(250),
                Duration::from_secs(30),
            ));
            tokio::time::sleep(Duration::from_secs(2)).await;
            let at = Instant::now();
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(victim.id().to_string())
                .status();
            wait_all_owned(&store, 2, Duration::from_secs(60)).await;
            let reowned = at.elapsed();
            let _ = victim.wait();
            let samples = sampler.await.unwrap();
            producing.abort();
            // Throughput per 250 ms window: the steady rate before the event
            // and the lowest window after it.
            let event = Duration::from_secs(2);
            let before: Vec<f64> = samples
                .iter()
                .filter(|(t, _)| *t < event)
                .map(|s| s.1)
                .collect();
            let after: Vec<f64> = samples
                .iter()
                .filter(|(t, _)| *t >= event && *t < event + reowned + Duration::from_secs(2))
                .map(|s| s.1)
                .collect();
            let steady = before.iter().sum::<f64>() / before.len().max(1) as f64;
            let dip = after.iter().copied().fold(f64::INFINITY, f64::min);
            let target = if signal == "TERM" {
                "target <= 2 s"
            } else {
                "bound lease_ttl + lease_renew = 21 s"
            };
            self.row(
                &format!("buckets re-owned after {how}"),
                format!("{:.2} s", reowned.as_secs_f64()),
                target.into(),
            );
            self.row(
                &format!("throughput around the {how}: steady / lowest 250 ms"),
                format!("{steady:.0} / {dip:.0} msg/s"),
                format!("producer at {rate:.0} msg/s"),
            );
            out.insert(
                signal.to_lowercase(),
                json!({ "reowned_seconds": reowned.as_secs_f64(), "steady_msgs_per_sec": steady, "lowest_window_msgs_per_sec": dip }),
            );
            for w in &mut workers {
                terminate(w);
            }
            store.close().await;
        }
        self.results.insert("rebalance".into(), Value::Object(out));
    }
}

/// The PostgreSQL pool of a bench store (the bench's own SQL).
fn pg(store: &Store) -> &DbPool {
    store.postgres().expect("a PostgreSQL store").pool()
}

/// How the production section runs one measurement.
#[derive(Clone, Copy, PartialEq)]
enum Setting {
    /// Everything shares both cores; a consumer drains the queue.
    Shared,
    /// RabbitMQ on core 1, everything else on core 0; a consumer drains.
    Pinned,
}

impl Bench {
    // ---------------------------------------------------------------- 7
    async fn production(&mut self) {
        let n = if self.quick { 20_000 } else { 100_000 };
        println!(
            "production: {n} messages of {PAYLOAD} bytes, a consumer draining the queue, {} run(s) per figure",
            self.repeat
        );
        let mut out = serde_json::Map::new();
        // `OUTBOXD_BENCH_PRODUCTION_ONLY=mariadb` (a backend's name) runs
        // that backend's figures only.
        let only = std::env::var("OUTBOXD_BENCH_PRODUCTION_ONLY").ok();
        for on in [Backend::Postgres, Backend::MariaDb] {
            if only
                .as_deref()
                .is_some_and(|o| !o.eq_ignore_ascii_case(on.name()))
            {
                continue;
            }
            self.production_on(on, n, &mut out).await;
        }
        self.results.insert("production".into(), Value::Object(out));
    }

    /// Section 7 on one backend: shared and pinned cores, then a hot key.
    async fn production_on(
        &mut self,
        on: Backend,
        n: usize,
        out: &mut serde_json::Map<String, Value>,
    ) {
        let db = on.name();
        let builds = builds();
        // PostgreSQL's figures keep their earlier JSON keys.
        let key = |k: &str| match on {
            Backend::Postgres => k.to_string(),
            Backend::MariaDb => format!("mariadb_{k}"),
            Backend::Sqlite => format!("sqlite_{k}"),
        };
        for setting in [Setting::Shared, Setting::Pinned] {
            let name = match setting {
                Setting::Shared => format!("{db}, shared cores"),
                Setting::Pinned => format!("{db}, broker pinned to its own core"),
            };
            let pinned = setting == Setting::Pinned;
            if pinned && on == Backend::MariaDb {
                // Seen once (2026-11-22): MariaDB pinned to the relay's core
                // stopped completing its page writes, its redo log filled,
                // and after 10 minutes InnoDB aborted the server.
                self.row(
                    &format!("{name}: skipped"),
                    "MariaDB stalled pinned to one core".into(),
                    "see BENCHMARKS.md".into(),
                );
                continue;
            }
            if pinned && !pin_services(true) {
                self.row(
                    &format!("{name}: skipped"),
                    "no taskset / rabbit pid".into(),
                    String::new(),
                );
                continue;
            }
            let by_build = self.pairs(on, n, KEYS, 16, pinned, &builds).await;
            for (build, pairs) in builds.iter().zip(&by_build) {
                let figures =
                    self.production_rows(on, &format!("{name}{}", build.label), pinned, pairs);
                out.insert(
                    key(if pinned { "pinned" } else { "shared" }) + &build.key,
                    figures,
                );
            }
            self.compare_builds(&name, &builds, &by_build);
            if pinned {
                pin_services(false);
            }
        }

        // A hot key: every message one key, so one bucket, one drainer, one
        // confirm channel; the ceiling is one channel with the same window.
        let hot = n / 4;
        let by_build = self.pairs(on, hot, 1, 1, false, &builds).await;
        for (build, pairs) in builds.iter().zip(&by_build) {
            let median = median(pairs);
            let Pair {
                ceiling, ref run, ..
            } = *median;
            let ratio = median.ratio();
            let each = ratios(pairs);
            let label = &build.label;
            self.row(
                &format!("{db}, hot key{label}: ceiling, 1 channel x 100 (= batch_size)"),
                format!("{ceiling:.0} msg/s"),
                "baseline".into(),
            );
            self.row(
                &format!("{db}, hot key{label}: relay, {hot} messages of one key"),
                format!("{:.0} msg/s", run.rate),
                format!("{ratio:.2} x ceiling, target >= 0.8{each}"),
            );
            out.insert(
                key("hot_key") + &build.key,
                json!({ "messages": hot, "ceiling_msgs_per_sec": ceiling, "relay_msgs_per_sec": run.rate, "ratio": ratio,
                        "ratio_of_each_run": each_ratio(pairs) }),
            );
        }
        self.compare_builds(&format!("{db}, hot key"), &builds, &by_build);
    }

    /// Section 7's rows for one setting's `pairs` of one build (`name`
    /// says which), and the same figures for the JSON.
    fn production_rows(&mut self, on: Backend, name: &str, pinned: bool, pairs: &[Pair]) -> Value {
        let median = median(pairs);
        let Pair {
            ceiling,
            ceiling_publisher_us,
            ceiling_broker_us,
            ceiling_consumer_us,
            ref run,
            consumer_us,
        } = *median;
        let ratio = median.ratio();
        let each = ratios(pairs);
        let target = if pinned {
            "target >= 0.85"
        } else {
            "target >= 0.75"
        };
        self.row(
            &format!("{name}: ceiling, 16 channels x 100, consumer draining"),
            format!("{ceiling:.0} msg/s"),
            "baseline".into(),
        );
        self.row(
            &format!("{name}: relay, 1 worker, default settings"),
            format!("{:.0} msg/s", run.rate),
            format!("{ratio:.2} x ceiling, {target}{each}"),
        );
        let (backends, everything) = match on {
            Backend::Postgres => (
                "its backends",
                "all of PostgreSQL (WAL writer, checkpointer, autovacuum)",
            ),
            _ => (
                "its connection threads",
                "all of MariaDB (purge, page cleaner, log writer)",
            ),
        };
        let cpu_target = on.cpu_target();
        if let Some(backends_us) = run.backends_us {
            let relay_us = run.worker_us + backends_us;
            self.row(
                &format!("{name}: relay-side CPU per message (worker + {backends})"),
                format!("{relay_us:.0} µs"),
                format!(
                    "{:.0} + {backends_us:.0} µs; {:.2} x RabbitMQ's {:.0} µs, target <= {cpu_target}",
                    run.worker_us,
                    relay_us / run.broker_us,
                    run.broker_us
                ),
            );
        }
        self.row(
            &format!("{name}: … with {everything}"),
            format!("{:.0} µs", run.worker_us + run.database_us),
            format!(
                "{:.0} + {:.0} µs; {:.2} x RabbitMQ's",
                run.worker_us,
                run.database_us,
                (run.worker_us + run.database_us) / run.broker_us
            ),
        );
        self.row(
            &format!("{name}: RabbitMQ's CPU per message, ceiling / relay"),
            format!("{ceiling_broker_us:.0} / {:.0} µs", run.broker_us),
            String::new(),
        );
        self.row(
            &format!("{name}: the bare publisher's CPU per message (the ceiling's)"),
            format!("{ceiling_publisher_us:.0} µs"),
            format!("against the worker's {:.0} µs", run.worker_us),
        );
        self.row(
            &format!("{name}: the consumer's CPU per message, ceiling / relay"),
            format!("{ceiling_consumer_us:.0} / {consumer_us:.0} µs"),
            String::new(),
        );
        json!({ "ceiling_msgs_per_sec": ceiling, "relay_msgs_per_sec": run.rate, "ratio": ratio,
                "cpu_us_per_msg_broker_ceiling": ceiling_broker_us, "cpu_us_per_msg_broker_relay": run.broker_us,
                "cpu_us_per_msg_worker": run.worker_us, "cpu_us_per_msg_backends": run.backends_us,
                "cpu_us_per_msg_database": run.database_us,
                "cpu_us_per_msg_consumer_ceiling": ceiling_consumer_us, "cpu_us_per_msg_publisher_ceiling": ceiling_publisher_us, "cpu_us_per_msg_consumer_relay": consumer_us,
                "ratio_of_each_run": each_ratio(pairs) })
    }

    /// `--repeat` times: a ceiling of `channels` channels × 100 in flight,
    /// then each build's relay draining `n` rows over `keys` keys on a
    /// fresh database (migrated by that build), a consumer draining the
    /// queue throughout; the pairs of each build, in `builds`' order, a
    /// round's builds sharing its ceiling. Ceiling and relays alternate, so
    /// a slow spell of the machine falls on all, and the builds' order is
    /// reversed every other round. Unless `--quick`, a first round warms up
    /// and is printed, not counted: the first ceiling of a setting ran
    /// 6–10 % faster than the later ones in every run measured (a queue and
    /// broker not yet through a relay's drain), while the relay did not
    /// move.
    async fn pairs(
        &self,
        on: Backend,
        n: usize,
        keys: usize,
        channels: usize,
        pinned: bool,
        builds: &[Build],
    ) -> Vec<Vec<Pair>> {
        let queue = "bench-production";
        let warm_up = !self.quick;
        let mut pairs: Vec<Vec<Pair>> = builds.iter().map(|_| Vec::new()).collect();
        for round in 0..self.repeat + usize::from(warm_up) {
            let consumer = Drain::start(queue);
            let broker_before = broker_cpu_ticks();
            let consumer_before = consumer.cpu_ticks();
            let Ceiling {
                rate: ceiling,
                publisher_us: ceiling_publisher_us,
            } = self.ceiling_with(queue, n, keys, channels, 100).await;
            let ceiling_broker_us =
                us_per_message(broker_cpu_ticks().saturating_sub(broker_before), n);
            let ceiling_consumer_us =
                us_per_message(consumer.cpu_ticks().saturating_sub(consumer_before), n);
            for i in round_indices(builds.len(), round) {
                let build = &builds[i];
                let consumer_before_relay = consumer.cpu_ticks();
                let (store, config, _) = self.fresh_for(on, "outboxd_bench_prod", "", build).await;
                self.seed_keys(&store, n, queue, false, keys).await;
                let run = self
                    .drain_measured_with(&build.bin, &store, &config, n, pinned)
                    .await;
                let consumer_us = us_per_message(
                    consumer.cpu_ticks().saturating_sub(consumer_before_relay),
                    n,
                );
                store.close().await;
                let pair = Pair {
                    ceiling,
                    ceiling_publisher_us,
                    ceiling_broker_us,
                    ceiling_consumer_us,
                    run,
                    consumer_us,
                };
                if warm_up && round == 0 {
                    println!(
                        "  warm-up pair{}, not counted: ceiling {ceiling:.0} msg/s, relay {:.0} msg/s, {:.2} x",
                        build.label,
                        pair.run.rate,
                        pair.ratio()
                    );
                    continue;
                }
                pairs[i].push(pair);
            }
            consumer.stop();
        }
        pairs
    }

    /// With other builds: this build's figures ÷ each other build's, as
    /// the geometric mean over the rounds (each round's builds share its
    /// ceiling): throughput, the worker's CPU a message, and the worker's
    /// with its database work.
    fn compare_builds(&mut self, name: &str, builds: &[Build], by_build: &[Vec<Pair>]) {
        let Some((this, others)) = by_build.split_first() else {
            return;
        };
        let mean = |f: &dyn Fn(&Pair, &Pair) -> f64, other: &[Pair]| {
            let logs: Vec<f64> = this.iter().zip(other).map(|(t, o)| f(t, o).ln()).collect();
            (logs.iter().sum::<f64>() / logs.len() as f64).exp()
        };
        let relay_side = |m: &Measured| m.worker_us + m.backends_us.unwrap_or(0.0);
        for (build, other) in builds[1..].iter().zip(others) {
            if other.is_empty() {
                continue;
            }
            let rate = mean(&|t, o| t.run.rate / o.run.rate, other);
            let worker = mean(&|t, o| t.run.worker_us / o.run.worker_us, other);
            let side = mean(&|t, o| relay_side(&t.run) / relay_side(&o.run), other);
            self.row(
                &format!("{name}: this build ÷ the{}", build.label.trim_start_matches(',')),
                format!("{rate:.2} x throughput"),
                format!(
                    "worker CPU a message {worker:.2} x, relay-side {side:.2} x; geometric mean over {} round(s)",
                    other.len()
                ),
            );
        }
    }

    /// [`Bench::drain_measured_with`] by `bin`, not pinned.
    async fn drain_measured_by(
        &self,
        bin: &Path,
        store: &Store,
        config: &Path,
        n: usize,
    ) -> Measured {
        self.drain_measured_with(bin, store, config, n, false).await
    }

    /// Starts one worker of `bin` on `config` (on core 0 when `pinned`),
    /// waits until the `n` seeded rows are published, and measures the
    /// rate and the CPU the worker, the database and the broker spent on
    /// them.
    async fn drain_measured_with(
        &self,
        bin: &Path,
        store: &Store,
        config: &Path,
        n: usize,
        pinned: bool,
    ) -> Measured {
        // Let the seed's writes settle (a checkpoint) before measuring.
        let threads_before = match store.mysql() {
            Some(my) => {
                flush_mariadb(my.pool()).await;
                Some(MariaDbThreads::before(my.pool()).await)
            }
            None => {
                sqlx::query("CHECKPOINT").execute(pg(store)).await.unwrap();
                None
            }
        };
        let db_before = database_cpu_ticks(store);
        let broker_before = broker_cpu_ticks();
        let start = Instant::now();
        let mut child = if pinned {
            Command::new("taskset")
                .args(["-c", "0"])
                .arg(bin)
                .arg("--config")
                .arg(config)
                .args(["work", "--silent"])
                .env_remove("DATABASE_URL")
                .env_remove("AMQP_URL")
                .env("OUTBOXD_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        } else {
            spawn_bin(bin, config, &["--silent"], &[])
        };
        let mut worker_ticks = 0;
        loop {
            let pending = any_pending(store).await;
            worker_ticks = cpu_ticks(child.id()).unwrap_or(worker_ticks);
            if !pending {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(600),
                "drain did not finish"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let took = start.elapsed();
        let db_ticks = database_cpu_ticks(store).saturating_sub(db_before);
        let broker_ticks = broker_cpu_ticks().saturating_sub(broker_before);
        let backend_ticks = match (store.mysql(), threads_before) {
            // The worker's connection threads (its statements), read while
            // it still runs.
            (Some(my), Some(before)) => Some(before.worker_ticks(my.pool()).await),
            // The worker's own backends, opened after it started: their
            // whole CPU time is the run's.
            _ => {
                let backends: Vec<i32> = sqlx::query_scalar(
                    "SELECT pid FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'outboxd work'",
                )
                .fetch_all(pg(store))
                .await
                .unwrap();
                Some(
                    backends
                        .iter()
                        .filter_map(|&pid| cpu_ticks(pid as u32))
                        .sum::<u64>(),
                )
            }
        };
        terminate(&mut child);
        let per_msg = |ticks: u64| us_per_message(ticks, n);
        Measured {
            rate: n as f64 / took.as_secs_f64(),
            worker_us: per_msg(worker_ticks),
            backends_us: backend_ticks.map(per_msg),
            database_us: per_msg(db_ticks),
            broker_us: per_msg(broker_ticks),
        }
    }
}

/// Whether any row is still pending: one probe of the pending index, so
/// the harness's polling adds next to nothing to PostgreSQL's CPU (a count
/// of the table every 25 ms cost more than the relay's own statements).
/// Waits until no row is pending (at most 10 minutes); the drain rate of
/// `n` rows since `start`.
async fn drained_rate(store: &Store, n: usize, start: Instant) -> f64 {
    while any_pending(store).await {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "drain did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// The `i`-th of the harness's messages (id `i + 1`, one of `keys` keys,
/// to `routing_key` on the default exchange) as the relay claims it.
fn claimed_row(
    partitioner: &Partitioner,
    i: usize,
    keys: usize,
    routing_key: &str,
    payload: Vec<u8>,
) -> ClaimedMessage {
    let message_key = format!("key-{}", i % keys);
    ClaimedMessage {
        id: i as i64 + 1,
        message_id: uuid::Uuid::new_v4(),
        partition_key: partitioner.label_for(&message_key),
        message_key,
        exchange: String::new(),
        routing_key: routing_key.to_string(),
        headers: json!({}),
        content_type: None,
        payload,
        attempts: 0,
        created_at: chrono::Utc::now(),
    }
}

/// The median of `v` (the upper one of an even count).
fn median_of(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Whether any row is still unpublished and unparked: the harness asks
/// every 50 ms while a drain runs, so the probe must cost nothing beside it.
/// It asks the store for each bucket's head, one probe of the pending index
/// per bucket, as `outboxd status` does. A bare `EXISTS` over the table
/// walked every published row before the first pending one: MariaDB's
/// pending index leads with the bucket (17 ms a probe at 24,000 published
/// rows), and PostgreSQL's planner, left to the seed's statistics (every
/// row pending), chose a sequential scan (2–3 ms).
async fn any_pending(store: &Store) -> bool {
    let buckets = store
        .partition_count()
        .await
        .unwrap()
        .expect("a migrated database");
    let labels = Partitioner::new(buckets).labels();
    store
        .bucket_heads(&labels)
        .await
        .unwrap()
        .iter()
        .any(|head| head.id.is_some())
}

/// The database a section runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Postgres,
    MariaDb,
    Sqlite,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "PostgreSQL",
            Backend::MariaDb => "MariaDB",
            Backend::Sqlite => "SQLite",
        }
    }

    /// The bound on the relay-side CPU per message (the worker and
    /// its database connections) as a share of RabbitMQ's.
    fn cpu_target(self) -> f64 {
        match self {
            Backend::Postgres => 0.35,
            _ => 0.5,
        }
    }
}

struct Measured {
    rate: f64,
    worker_us: f64,
    /// The worker's own PostgreSQL backends or MariaDB connection threads
    /// (its statements; none on SQLite, which runs inside the worker).
    backends_us: Option<f64>,
    /// The whole database: every PostgreSQL process (backends and
    /// background work), or the MariaDB server.
    database_us: f64,
    /// The broker's VM.
    broker_us: f64,
}

/// A bare publisher's run: its rate, and the harness's own CPU per
/// message while it published (what lapin spends on a message with
/// nothing else to do).
struct Ceiling {
    rate: f64,
    publisher_us: f64,
}

/// One ceiling and the relay drain measured right after it.
struct Pair {
    ceiling: f64,
    ceiling_publisher_us: f64,
    ceiling_broker_us: f64,
    ceiling_consumer_us: f64,
    run: Measured,
    consumer_us: f64,
}

impl Pair {
    fn ratio(&self) -> f64 {
        self.run.rate / self.ceiling
    }
}

/// The pair with the median ratio (the lower middle one of an even count).
fn median(pairs: &[Pair]) -> &Pair {
    let mut sorted: Vec<&Pair> = pairs.iter().collect();
    sorted.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
    sorted[(sorted.len() - 1) / 2]
}

/// Every run's relay ÷ ceiling, in the order measured.
fn each_ratio(pairs: &[Pair]) -> Vec<f64> {
    pairs.iter().map(Pair::ratio).collect()
}

/// " (median; runs 0.61 / 0.67 / 0.57)" when there was more than one run.
fn ratios(pairs: &[Pair]) -> String {
    if pairs.len() < 2 {
        return String::new();
    }
    let each: Vec<String> = each_ratio(pairs)
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect();
    format!(" (median; runs {})", each.join(" / "))
}

/// A consumer that acknowledges every message (one ack per delivery, as
/// most consumers do) on a queue until stopped, so the queue stays short, as
/// in production. It runs as a process of its own (this binary with
/// `--drain QUEUE`, on the harness's cores), so its CPU is told apart.
struct Drain {
    child: Child,
}

impl Drain {
    /// Starts the consumer and returns once it is consuming.
    fn start(queue: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--drain", queue])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(
            ready.trim(),
            "consuming",
            "the draining consumer did not start"
        );
        Self { child }
    }

    fn cpu_ticks(&self) -> u64 {
        cpu_ticks(self.child.id()).unwrap_or(0)
    }

    /// Stops the consumer (as dropping it does).
    fn stop(self) {
        drop(self);
    }

    /// The consumer process: consumes `queue` until killed, or until its
    /// stdin closes (the harness exited, even by a panic).
    async fn run(amqp_url: &str, queue: &str) {
        let conn = Connection::connect(amqp_url, ConnectionProperties::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.basic_qos(2000, BasicQosOptions::default())
            .await
            .unwrap();
        let mut consumer = ch
            .basic_consume(
                queue.into(),
                "bench-drain".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        tokio::task::spawn_blocking(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            std::process::exit(0);
        });
        println!("consuming");
        // Each ack is queued on its first poll and its write awaited with
        // a hundred others (as the relay does with its publishes): one ack
        // frame per delivery, without a wake-up of lapin's I/O thread each.
        let mut acks = Vec::with_capacity(ACKS_AWAITED_TOGETHER);
        while let Some(Ok(d)) = consumer.next().await {
            let mut ack = Box::pin(async move { d.ack(BasicAckOptions::default()).await });
            if futures_util::poll!(ack.as_mut()).is_pending() {
                acks.push(ack);
            }
            if acks.len() == ACKS_AWAITED_TOGETHER {
                for ack in acks.drain(..) {
                    let _ = ack.await;
                }
            }
        }
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// Waits, up to 30 s, until the machine's CPUs are 85 % idle over half a
/// second, so that what one step leaves running (a database writing back
/// the pages of a seeded or dropped table, PostgreSQL's autovacuum) does
/// not run during the next measurement and not during its baseline.
/// Section 1 waits so before each arm and each ceiling.
async fn quiet_machine() -> Duration {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let Some(before) = machine_ticks() else {
            break;
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(after) = machine_ticks() else {
            break;
        };
        if busy_between(before, after) <= 0.15 {
            break;
        }
    }
    start.elapsed()
}

/// The machine's busy and total CPU time since boot, in clock ticks, all
/// cores together (`/proc/stat`; idle and I/O wait are not busy).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let idle = ticks.get(3)? + ticks.get(4)?;
    let total: u64 = ticks.iter().take(8).sum();
    Some((total - idle, total))
}

/// The busy share of the machine's CPU time between two
/// [`machine_ticks`] samples (1.0: every core busy throughout).
fn busy_between((busy0, total0): (u64, u64), (busy1, total1): (u64, u64)) -> f64 {
    (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64
}

/// User + system CPU of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    stat_ticks(&format!("/proc/{pid}/stat"))
}

/// User + system CPU in a `/proc` `stat` file, in clock ticks.
fn stat_ticks(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Writes every dirty page of MariaDB's buffer pool (the seed's) to disk,
/// as PostgreSQL's `CHECKPOINT` does, so that the page cleaner's work on
/// them does not fall in the drain measured next: the dirty-page bound at 0
/// until none is left (at most 60 s), then back to what it was.
async fn flush_mariadb(pool: &sqlx::MySqlPool) {
    let bound: f64 = sqlx::query_scalar("SELECT @@GLOBAL.innodb_max_dirty_pages_pct")
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::query("SET GLOBAL innodb_max_dirty_pages_pct = 0")
        .execute(pool)
        .await
        .unwrap();
    let start = Instant::now();
    loop {
        let dirty: String = sqlx::query_scalar(
            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
             WHERE VARIABLE_NAME = 'INNODB_BUFFER_POOL_PAGES_DIRTY'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if dirty.trim() == "0" {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            eprintln!("MariaDB still had {dirty} dirty pages after 60 s; measuring anyway");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sqlx::query(AssertSqlSafe(format!(
        "SET GLOBAL innodb_max_dirty_pages_pct = {bound}"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// The services' MariaDB server's threads before a drain: their CPU and the
/// connections already open (the harness's own), so that the threads of the
/// connections opened after (the worker's) can be told apart. MariaDB runs
/// one thread per connection (`thread_handling` is the default), and
/// `information_schema.PROCESSLIST.TID` names it. (A connection the
/// harness's own pool opened during the drain would count as the worker's:
/// its polls are one probe of the pending index every 50 ms.)
struct MariaDbThreads {
    ticks: HashMap<u32, u64>,
    connections: HashSet<i64>,
}

impl MariaDbThreads {
    async fn before(pool: &sqlx::MySqlPool) -> Self {
        let ticks = pid_file("mariadb.pid")
            .map(thread_ticks)
            .unwrap_or_default();
        let connections =
            sqlx::query_scalar::<_, i64>("SELECT ID FROM information_schema.PROCESSLIST")
                .fetch_all(pool)
                .await
                .unwrap()
                .into_iter()
                .collect();
        Self { ticks, connections }
    }

    /// The CPU spent since [`MariaDbThreads::before`] by the threads of
    /// the connections opened since then on the same database (the
    /// worker's, still open), in clock ticks.
    async fn worker_ticks(&self, pool: &sqlx::MySqlPool) -> u64 {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT ID, TID FROM information_schema.PROCESSLIST WHERE DB = DATABASE()",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let now = pid_file("mariadb.pid")
            .map(thread_ticks)
            .unwrap_or_default();
        rows.into_iter()
            .filter(|(id, _)| !self.connections.contains(id))
            .filter_map(|(_, tid)| {
                let tid = u32::try_from(tid).ok()?;
                let was = self.ticks.get(&tid).copied().unwrap_or(0);
                Some(now.get(&tid)?.saturating_sub(was))
            })
            .sum()
    }
}

/// User + system CPU of each thread of a process, in clock ticks.
fn thread_ticks(pid: u32) -> HashMap<u32, u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    tasks
        .filter_map(|t| {
            let tid: u32 = t.ok()?.file_name().to_str()?.parse().ok()?;
            Some((tid, stat_ticks(&format!("/proc/{pid}/task/{tid}/stat"))?))
        })
        .collect()
}

/// CPU of every PostgreSQL process on the machine (backends and background
/// processes of the bench's server, the only one running), in clock ticks.
fn postgres_cpu_ticks() -> u64 {
    postgres_pids().into_iter().filter_map(cpu_ticks).sum()
}

/// CPU of the database server behind `store`: every PostgreSQL process,
/// or the services' MariaDB server (every thread), in clock ticks.
fn database_cpu_ticks(store: &Store) -> u64 {
    match (store.mysql(), store.sqlite()) {
        (Some(_), _) => pid_file("mariadb.pid").and_then(cpu_ticks).unwrap_or(0),
        // SQLite runs inside the worker (counted there).
        (_, Some(_)) => 0,
        // The exited backends too (autovacuum workers come and go).
        _ => postgres_cpu_ticks() + postmaster_children_ticks().unwrap_or(0),
    }
}

/// The CPU of the services' PostgreSQL postmaster's exited children
/// (`cutime + cstime`), in clock ticks.
fn postmaster_children_ticks() -> Option<u64> {
    let state = std::env::var("OUTBOXD_STATE_DIR").ok()?;
    let pids = std::fs::read_to_string(format!("{state}/pg/postmaster.pid")).ok()?;
    let pid: u32 = pids.lines().next()?.trim().parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some(fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?)
}

/// CPU of the services' RabbitMQ VM (every thread), in clock ticks; 0
/// when its pid file is missing.
fn broker_cpu_ticks() -> u64 {
    pid_file("rabbit/rabbit.pid")
        .and_then(cpu_ticks)
        .unwrap_or(0)
}

/// The pid in a pid file of the services' state directory.
fn pid_file(name: &str) -> Option<u32> {
    let state = std::env::var("OUTBOXD_STATE_DIR").unwrap_or_default();
    std::fs::read_to_string(format!("{state}/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn postgres_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .collect()
}

/// CPU clock ticks spent on `n` messages, in µs per message.
fn us_per_message(ticks: u64, n: usize) -> f64 {
    ticks as f64 * 1e6 / clock_ticks() as f64 / n as f64
}

fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// Pins RabbitMQ (every thread of the services' broker) to core 1 and
/// PostgreSQL and this process to core 0 (`on`), or lets
/// everything run anywhere again. False when it cannot (no taskset, fewer
/// than 2 cores, no broker pid file).
fn pin_services(on: bool) -> bool {
    let Some(rabbit) = pid_file("rabbit/rabbit.pid") else {
        return false;
    };
    // (Asked only before pinning: a pinned process sees one core.)
    if on && std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return false;
    }
    let (broker, rest) = if on { ("1", "0") } else { ("0-1", "0-1") };
    let pin = |cpus: &str, pid: &str| {
        Command::new("taskset")
            .args(["-a", "-p", "-c", cpus, pid])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    // A PostgreSQL process may exit meanwhile; the postmaster's affinity is
    // what new backends inherit.
    for pid in postgres_pids() {
        let _ = pin(rest, &pid.to_string());
    }
    pin(broker, &rabbit.to_string()) && pin(rest, &std::process::id().to_string())
}

fn vm_hwm_kb(pid: u32) -> u64 {
    status_kb(pid, "VmHWM:")
}

/// A kB figure of `/proc/<pid>/status` (`VmHWM:`, `VmRSS:`…); 0 if absent.
fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Sends `signal` (`"TERM"`, `"HUP"`) to a worker.
fn signal(c: &Child, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(c.id().to_string())
        .status();
}

fn terminate(c: &mut Child) {
    signal(c, "TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// One build of outboxd an arm of sections 1 and 2 runs on.
struct Build {
    bin: PathBuf,
    /// Added to the arm's printed name ("" for this build).
    label: String,
    /// Added to the arm's JSON key ("" for this build).
    key: String,
}

/// Round `r`'s builds, in order: as given in even rounds, reversed in odd
/// ones.
fn round_order(builds: &[Build], r: usize) -> Vec<&Build> {
    round_indices(builds.len(), r)
        .into_iter()
        .map(|i| &builds[i])
        .collect()
}

/// [`round_order`] as indices into the `n` builds.
fn round_indices(n: usize, r: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if r % 2 == 1 {
        order.reverse();
    }
    order
}

/// `other`'s `q` quantile over all its rounds' latencies divided by
/// `this`'s (rounds run side by side, `this[i]` beside `other[i]`), and the
/// 5th and 95th percentiles of that ratio over 2,000 resamples of the
/// rounds, pairs kept together: how far the ratio would move had other
/// rounds of the same machine been drawn.
fn paired_ratio(this: &[Vec<Duration>], other: &[Vec<Duration>], q: f64) -> (f64, f64, f64) {
    let quantile = |rounds: &[&Vec<Duration>]| {
        let mut all: Vec<Duration> = rounds.iter().flat_map(|r| r.iter().copied()).collect();
        all.sort_unstable();
        pct(&all, q).as_secs_f64()
    };
    let ratio = |pick: &[usize]| {
        let side =
            |of: &[Vec<Duration>]| quantile(&pick.iter().map(|&i| &of[i]).collect::<Vec<_>>());
        side(other) / side(this)
    };
    let n = this.len();
    let mut rng = fastrand::Rng::with_seed(1);
    let mut resampled: Vec<f64> = (0..2000)
        .map(|_| ratio(&(0..n).map(|_| rng.usize(..n)).collect::<Vec<_>>()))
        .collect();
    resampled.sort_by(f64::total_cmp);
    (
        ratio(&(0..n).collect::<Vec<_>>()),
        resampled[100],
        resampled[1899],
    )
}

/// Round `r`'s label in a run of `rounds` (none when there is one).
fn round_label(r: usize, rounds: usize) -> String {
    match rounds {
        1 => String::new(),
        _ => format!(", round {}", r + 1),
    }
}

/// A JSON key's suffix for section 2's round `label` (`", round 2"` →
/// `"_round2"`; none with one round).
fn round_key(label: &str) -> String {
    label
        .strip_prefix(", round ")
        .map_or_else(String::new, |r| format!("_round{r}"))
}

/// This build, then each of `OUTBOXD_BENCH_BASELINE_BIN` (a comma-separated
/// list of other builds' binaries, to bisect; usually one).
fn builds() -> Vec<Build> {
    let baselines: Vec<String> = std::env::var("OUTBOXD_BENCH_BASELINE_BIN")
        .map(|b| {
            b.split(',')
                .filter(|b| !b.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    std::iter::once(Build {
        bin: PathBuf::from(BIN),
        label: String::new(),
        key: String::new(),
    })
    .chain(baselines.iter().map(|b| {
        let (label, key) = match baselines.len() {
            1 => (", baseline build".to_owned(), "_baseline".to_owned()),
            _ => (format!(", build {b}"), format!("_baseline_{b}")),
        };
        Build {
            bin: PathBuf::from(b),
            label,
            key,
        }
    }))
    .collect()
}

/// `bin` (another build of outboxd, or this one) on `config` alone: the
/// harness's own `DATABASE_URL` and `AMQP_URL` are not passed on.
fn outboxd_on(bin: &Path, config: &Path) -> Command {
    let mut command = Command::new(bin);
    command
        .arg("--config")
        .arg(config)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL");
    command
}

/// `bin work` on `config` ([`outboxd_on`]).
fn spawn_bin(bin: &Path, config: &Path, args: &[&str], vars: &[(&str, String)]) -> Child {
    outboxd_on(bin, config)
        .arg("work")
        .args(args)
        .env("OUTBOXD_LOG", "warn")
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Median time of one claim (100 rows) + record of that batch, over 64
/// rounds across the buckets (the relay's per-batch database cost). 80
/// rounds consume 8,000 rows, so even the 10k backlog never runs dry.
async fn claim_record_cost(store: &Store) -> Duration {
    let [cost] = claim_record_costs([store]).await;
    cost
}

/// [`claim_record_cost`] of several tables at once, their rounds
/// interleaved (each round visits every table, starting with a different
/// one each time), so that all are measured under the same conditions.
async fn claim_record_costs<const N: usize>(stores: [&Store; N]) -> [Duration; N] {
    let labels = Partitioner::new(BUCKETS).labels();
    let mut times: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::new());
    // One drainer's token: a bucket's claim stays with its drainer.
    let token = ClaimToken::new();
    for i in 0..80 {
        let holder = Holder {
            partition_key: &labels[i % labels.len()],
            token,
            fence: None,
            published: Default::default(),
        };
        for j in 0..N {
            let which = (i + j) % N;
            let start = Instant::now();
            let rows = stores[which]
                .claim(Claim {
                    holder,
                    limit: 100,
                    claim_ttl: Duration::from_secs(15),
                    min_left: Duration::from_secs(11),
                    in_flight: &[],
                    // Taken in a bucket's first round, held after, as a
                    // drainer holds it.
                    held: i >= labels.len(),
                })
                .await
                .unwrap();
            assert_eq!(
                rows.len(),
                100,
                "the backlog ran dry: the measure would be of empty claims"
            );
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            stores[which].record_published(holder, &ids).await.unwrap();
            if i >= labels.len() {
                // the first round of each bucket warms caches and plans
                times[which].push(start.elapsed());
            }
        }
    }
    times.map(|mut t| {
        t.sort();
        t[t.len() / 2]
    })
}

/// Enqueues at `rate` msg/s for `over`, one transaction each, measuring
/// commit-to-delivery latency at a consumer in this process.
async fn produce_at(db_url: String, queue: String, rate: f64, over: Duration) {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&db_url)
        .await
        .unwrap();
    let producer = Arc::new(Producer::default());
    let period = Duration::from_secs_f64(10.0 / rate);
    let mut next = tokio::time::Instant::now();
    let end = Instant::now() + over;
    let mut i = 0u64;
    while Instant::now() < end {
        // Ten messages per transaction keep the producer itself cheap.
        let mut tx = pool.begin().await.unwrap();
        for _ in 0..10 {
            producer
                .enqueue(
                    &mut *tx,
                    Message::new(
                        format!("key-{}", i % 500),
                        "",
                        queue.as_str(),
                        vec![b'x'; PAYLOAD],
                    ),
                )
                .await
                .unwrap();
            i += 1;
        }
        tx.commit().await.unwrap();
        next += period;
        tokio::time::sleep_until(next).await;
    }
}

/// (time since start, published per second) every `every`, for `over`.
async fn sample_published(store: Store, every: Duration, over: Duration) -> Vec<(Duration, f64)> {
    let start = Instant::now();
    let count = |s: Store| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .fetch_one(pg(&s))
            .await
            .unwrap()
    };
    let mut last = count(store.clone()).await;
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    while start.elapsed() < over {
        tick.tick().await;
        let now = count(store.clone()).await;
        out.push((start.elapsed(), (now - last) as f64 / every.as_secs_f64()));
        last = now;
    }
    out
}

/// The live fleet workers as workers with the default settings (every
/// section's) see them: the same bound on a late heartbeat.
async fn live_as_workers_see_it(
    store: &Store,
) -> Result<Vec<uuid::Uuid>, outboxd::store::StoreError> {
    let w = outboxd::config::WorkerConfig::default();
    let suspect = outboxd::store::workers::suspect_after(w.lease_ttl, w.heartbeat_ttl);
    store.live_leasing(uuid::Uuid::nil(), suspect).await
}

async fn wait_all_owned(store: &Store, workers: usize, timeout: Duration) {
    let start = Instant::now();
    loop {
        let live = live_as_workers_see_it(store).await.unwrap();
        let leases = store.leases().await.unwrap();
        if live.len() == workers
            && leases
                .iter()
                .all(|l| l.valid && l.lease_owner.is_some_and(|o| live.contains(&o)))
        {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "buckets not owned by {workers} workers within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `url` with the path (database name) `name`.
fn with_path(url: &str, name: &str) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.set_path(name);
    url.to_string()
}
