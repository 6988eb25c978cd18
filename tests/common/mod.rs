//! Shared test harness: real PostgreSQL, MariaDB and RabbitMQ, started by
//! `scripts/services.sh` (the test command does that first).
//!
//! Every test gets its own database (created from `OUTBOXD_PG_ADMIN_URL`
//! or `OUTBOXD_MYSQL_ADMIN_URL`, migrated with the library's own migrator)
//! and its own queue names, so tests run in parallel without seeing each
//! other. Workers are real `outboxd` processes, stopped with real signals.
//!
//! A test that must hold on every backend is written once, as a function
//! of the [`Db`] it runs on, and run against each with [`on_every_db!`].
#![allow(dead_code)]

pub mod hosts;
pub mod load;
pub mod otlp;
pub mod pooler;
pub mod readme;
pub mod streams;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use outboxd::checker::Verdict;
use outboxd::config::Config;
use outboxd::coordinator::assignment::{Assignment, owner_index};
use outboxd::demo::QueueReader;
use outboxd::partitioner::Partitioner;
use outboxd::producer::Message;
use outboxd::store::Store;
use outboxd::store::partitions::LeaseRow;
use uuid::Uuid;

pub mod db;
pub mod tls;
#[allow(unused_imports)]
pub use db::{Db, Held, TestDb, list, plain_insert};
#[allow(unused_imports)]
pub use load::{Producers, epoch_regressions, epochs_acquired_twice, late_deliveries};

pub const BIN: &str = env!("CARGO_BIN_EXE_outboxd");

/// The log filter of every process a test starts: the binary's default
/// (`lapin` off, `sqlx` warnings) at `info` even with `--silent`, since
/// tests read what the processes say.
pub const WORKER_LOG: &str = "info,sqlx=warn,lapin=off";

fn env_or_explain(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with `scripts/test.sh`, which starts PostgreSQL and RabbitMQ")
    })
}

/// RabbitMQ's URL. In a build without the `services` feature (the
/// contributor's `cargo test`, where only tests that need no service run)
/// a placeholder nothing listens on, for the configuration of tests that
/// never connect to it.
pub fn amqp_url() -> String {
    if cfg!(not(feature = "services")) && std::env::var("AMQP_URL").is_err() {
        return "amqp://guest:guest@127.0.0.1:1/%2f".into();
    }
    env_or_explain("AMQP_URL")
}

pub fn admin_url() -> String {
    env_or_explain("OUTBOXD_PG_ADMIN_URL")
}

pub fn mysql_admin_url() -> String {
    env_or_explain("OUTBOXD_MYSQL_ADMIN_URL")
}

/// Where the tests' SQLite files go (the "server" of [`Db::Sqlite`]): a
/// directory of this machine's temporary files, one file per test.
pub fn sqlite_dir_url() -> String {
    let dir = std::env::temp_dir().join("outboxd-sqlite-tests");
    std::fs::create_dir_all(&dir).unwrap();
    format!("sqlite://{}", dir.display())
}

/// The shared PgBouncer (transaction mode) in front of the shared
/// PostgreSQL, as a URL without a database name.
pub fn pgbouncer_url() -> String {
    format!(
        "postgres://outboxd:outboxd@127.0.0.1:{}/",
        env_or_explain("OUTBOXD_PGBOUNCER_PORT")
    )
}

/// `url` with another database name.
pub fn with_database(url: &str, db: &str) -> String {
    if url.starts_with("sqlite://") {
        return format!("{}/{db}.db", url.trim_end_matches('/'));
    }
    let mut url = url::Url::parse(url).unwrap();
    url.set_path(db);
    url.to_string()
}

pub fn repo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A short random name fragment. Names with the prefix `q` are queues:
/// [`TestEnv`] deletes them when the test passes.
pub fn unique(prefix: &str) -> String {
    let name = format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    if prefix == "q" {
        QUEUES.lock().unwrap().push(name.clone());
    }
    name
}

/// Queues this test process named (nextest runs each test in a process of
/// its own; `cargo test` runs them one at a time, see scripts/test.sh).
static QUEUES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A fresh database, migrated, plus a config file pointing at it.
pub struct TestEnv {
    /// The backend it is on.
    pub kind: Db,
    /// The server's admin URL the database was created with.
    pub admin_url: String,
    pub db_name: String,
    /// A direct pool on the test database: what the test reads and writes.
    pub db: TestDb,
    /// A direct URL of the test database (the test's own inspections).
    pub db_url: String,
    /// The URL the workers use (through a pooler when the test says so).
    pub worker_db_url: String,
    pub config: Config,
    pub store: Store,
    pub dir: PathBuf,
    pub config_path: PathBuf,
    /// Whether published rows are deleted (`outbox.keep_published = false`):
    /// then the committed ids are read from `outbox_ledger`, which a
    /// trigger fills with every id inserted into the outbox (rolled back
    /// with its transaction).
    pub ledger: bool,
}

/// Extra `[outbox]` settings tests commonly shorten.
#[derive(Clone)]
pub struct Tuning {
    pub partition_count: u32,
    pub idle_backoff_ms: u64,
    pub retry_backoff_initial: &'static str,
    pub retry_backoff: &'static str,
    pub max_attempts: u32,
    pub confirm_timeout: &'static str,
    pub amqp_url: Option<String>,
    /// The backend (PostgreSQL unless a test says otherwise).
    pub db: Db,
    /// Admin URL of another server of that backend (a [`PrivateDatabase`]).
    pub server_admin_url: Option<String>,
    pub migrate: bool,
    pub lease_ttl: &'static str,
    pub lease_renew: &'static str,
    pub heartbeat_ttl: &'static str,
    pub assignment: &'static str,
    pub broker_grace: &'static str,
    pub query_timeout: &'static str,
    pub dead_peer_timeout: &'static str,
    pub amqp_connect_timeout: &'static str,
    /// Workers reach the database through this PgBouncer (a URL without a
    /// database name) with `database.pooler = "transaction"`.
    pub pooler_url: Option<String>,
    /// With `pooler_url`: `database.listen_url` is the direct URL (else the
    /// workers poll).
    pub listen_direct: bool,
    /// TOML appended to the config file (e.g. an `[amqp.tls]` table).
    pub extra_toml: String,
    /// `outbox.keep_published`; false also keeps the test's ledger of
    /// committed ids ([`TestEnv::ledger`]).
    pub keep_published: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            partition_count: 16,
            idle_backoff_ms: 1000,
            retry_backoff_initial: "200ms",
            retry_backoff: "1s",
            max_attempts: 0,
            confirm_timeout: "5s",
            amqp_url: None,
            db: Db::Postgres,
            server_admin_url: None,
            migrate: true,
            lease_ttl: "15s",
            lease_renew: "6s",
            heartbeat_ttl: "20s",
            assignment: "modulo",
            broker_grace: "10s",
            query_timeout: "10s",
            dead_peer_timeout: "5s",
            amqp_connect_timeout: "5s",
            pooler_url: None,
            listen_direct: false,
            extra_toml: String::new(),
            keep_published: true,
        }
    }
}

impl Tuning {
    /// Short leases for fleet tests: lease_ttl 3 s, lease_renew 1 s,
    /// heartbeat_ttl 3 s.
    pub fn fleet() -> Self {
        Self {
            lease_ttl: "3s",
            lease_renew: "1s",
            heartbeat_ttl: "3s",
            ..Self::default()
        }
    }

    /// The same settings on another backend.
    pub fn on(self, db: Db) -> Self {
        Self { db, ..self }
    }

    /// Workers through the shared PgBouncer in transaction mode; with
    /// `listen_direct`, LISTEN on a direct connection, else polling.
    pub fn pgbouncer(self, listen_direct: bool) -> Self {
        Self {
            pooler_url: Some(pgbouncer_url()),
            listen_direct,
            ..self
        }
    }

    /// [`Tuning::fleet`] with the network bounds shortened in the same
    /// proportion: broker_grace 3 s, query_timeout 2 s, dead peers noticed
    /// after 2 s, a broker node given 2 s to answer.
    pub fn hosts() -> Self {
        Self {
            broker_grace: "3s",
            query_timeout: "2s",
            dead_peer_timeout: "2s",
            amqp_connect_timeout: "2s",
            ..Self::fleet()
        }
    }
}

impl TestEnv {
    pub async fn new() -> Self {
        Self::with(Tuning::default()).await
    }

    /// A fresh database on `db` with the default settings.
    pub async fn on(db: Db) -> Self {
        Self::with(Tuning::default().on(db)).await
    }

    pub async fn with(t: Tuning) -> Self {
        let db_name = unique("t");
        let admin = t
            .server_admin_url
            .clone()
            .unwrap_or_else(|| t.db.admin_url());
        t.db.create_database(&admin, &db_name).await;
        let db_url = with_database(&admin, &db_name);
        let (worker_db_url, pooler) = match &t.pooler_url {
            Some(bouncer) => {
                let listen = if t.listen_direct {
                    format!("listen_url = \"{db_url}\"\n")
                } else {
                    String::new()
                };
                (
                    with_database(bouncer, &db_name),
                    format!("pooler = \"transaction\"\n{listen}"),
                )
            }
            None => (db_url.clone(), String::new()),
        };

        let dir = std::env::temp_dir().join(unique("outboxd-test"));
        std::fs::create_dir_all(&dir).unwrap();
        let amqp = t.amqp_url.clone().unwrap_or_else(amqp_url);
        let toml = format!(
            "[database]\nurl = \"{worker_db_url}\"\nmax_connections = 6\n{pooler}\
             query_timeout = \"{qt}\"\ndead_peer_timeout = \"{dp}\"\n\
             [amqp]\nurl = \"{amqp}\"\nconfirm_timeout = \"{ct}\"\nreconnect_backoff_max = \"1s\"\n\
             connect_timeout = \"{act}\"\ndead_peer_timeout = \"{dp}\"\n\
             [outbox]\npartition_count = {pc}\nidle_backoff_ms = {ib}\nclaim_ttl = \"15s\"\n\
             retry_backoff_initial = \"{rbi}\"\nretry_backoff = \"{rb}\"\nmax_attempts = {ma}\n\
             keep_published = {kp}\n\
             [worker]\nshutdown_timeout = \"10s\"\nlease_ttl = \"{lt}\"\nlease_renew = \"{lr}\"\n\
             heartbeat_ttl = \"{ht}\"\nassignment = \"{asg}\"\nbroker_grace = \"{bg}\"\n{extra}",
            ct = t.confirm_timeout,
            pc = t.partition_count,
            ib = t.idle_backoff_ms,
            rbi = t.retry_backoff_initial,
            rb = t.retry_backoff,
            ma = t.max_attempts,
            lt = t.lease_ttl,
            lr = t.lease_renew,
            ht = t.heartbeat_ttl,
            asg = t.assignment,
            bg = t.broker_grace,
            qt = t.query_timeout,
            dp = t.dead_peer_timeout,
            act = t.amqp_connect_timeout,
            extra = t.extra_toml,
            kp = t.keep_published,
        );
        let config_path = dir.join("outboxd.toml");
        std::fs::write(&config_path, &toml).unwrap();
        let config = Config::from_toml(&toml).expect("test config parses");
        config.validate().expect("test config is valid");
        // The test's own connection is direct, whatever the workers use.
        let mut direct = config.clone();
        direct.database.url = db_url.clone();
        direct.database.pooler = Default::default();
        let store = Store::connect(
            &outboxd::store::StoreSettings::from_config(&direct),
            "outboxd test",
        )
        .await
        .expect("connect to test db");
        if t.migrate {
            store
                .migrate(Partitioner::new(t.partition_count))
                .await
                .expect("migrate");
        }
        let db = TestDb::connect(t.db, &db_url, 8).await;
        let ledger = !t.keep_published;
        if ledger {
            for statement in ledger_statements(t.db) {
                db.exec(statement).await;
            }
        }
        Self {
            kind: t.db,
            admin_url: admin,
            db_name,
            db,
            db_url,
            worker_db_url,
            config,
            store,
            dir,
            config_path,
            ledger,
        }
    }

    pub fn partitioner(&self) -> Partitioner {
        Partitioner::new(self.config.outbox.partition_count)
    }

    /// An `outboxd` command with this environment's config and no inherited
    /// DATABASE_URL / AMQP_URL (the config file is the source of truth).
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_with(&self.config_path, args)
    }

    /// [`TestEnv::command`] with another config file.
    pub fn command_with(&self, config: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--config")
            .arg(config)
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .env("OUTBOXD_LOG", WORKER_LOG)
            .current_dir(&self.dir);
        cmd
    }

    /// Starts `outboxd work` with `args`; stderr goes to a log file.
    pub fn spawn_worker(&self, args: &[&str]) -> WorkerProcess {
        self.spawn_worker_on(None, &self.config_path, args)
    }

    /// Starts `outboxd work` with `args` and the config file `config`, on a
    /// test host (a network namespace, [`hosts::Lab`]) when `netns` is set.
    pub fn spawn_worker_on(
        &self,
        netns: Option<&str>,
        config: &Path,
        args: &[&str],
    ) -> WorkerProcess {
        self.spawn_worker_with(netns, config, args, &[])
    }

    /// [`TestEnv::spawn_worker_on`] with extra environment variables.
    pub fn spawn_worker_with(
        &self,
        netns: Option<&str>,
        config: &Path,
        args: &[&str],
        vars: &[(&str, &str)],
    ) -> WorkerProcess {
        self.spawn_program(Path::new(BIN), netns, config, args, vars, Stdout::File)
    }

    /// `outboxd work` of another build of outboxd (an earlier release's,
    /// tests/upgrade.rs), with this environment's config.
    pub fn spawn_worker_of(&self, bin: &Path, args: &[&str]) -> WorkerProcess {
        self.spawn_program(bin, None, &self.config_path, args, &[], Stdout::File)
    }

    /// `outboxd work` with `args` whose stdout is a pipe that the test
    /// keeps open and never reads (a stalled log shipper).
    pub fn spawn_worker_with_unread_stdout(&self, args: &[&str]) -> WorkerProcess {
        let bin = Path::new(BIN);
        self.spawn_program(bin, None, &self.config_path, args, &[], Stdout::Unread)
    }

    fn spawn_program(
        &self,
        bin: &Path,
        netns: Option<&str>,
        config: &Path,
        args: &[&str],
        vars: &[(&str, &str)],
        stdout: Stdout,
    ) -> WorkerProcess {
        let log = self.dir.join(format!("{}.log", unique("worker")));
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("--config")
            .arg(config)
            .arg("work")
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .env("OUTBOXD_LOG", WORKER_LOG)
            .envs(vars.iter().copied())
            .current_dir(&self.dir);
        cmd.stdout(match stdout {
            Stdout::File => std::fs::File::create(log.with_extension("out"))
                .unwrap()
                .into(),
            Stdout::Unread => Stdio::piped(),
        })
        .stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawn outboxd work");
        WorkerProcess {
            child: Some(child),
            log,
        }
    }

    /// A copy of the config file with `replace` applied to its text (e.g.
    /// another database URL for one worker).
    pub fn config_variant(&self, name: &str, replace: impl Fn(&str) -> String) -> PathBuf {
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, replace(&text)).unwrap();
        path
    }

    /// Ids of every committed row, ascending (published rows included when
    /// they are deleted: from the ledger).
    pub async fn all_ids(&self) -> Vec<i64> {
        let table = self.committed_table();
        self.db
            .column(&format!("SELECT id FROM {table} ORDER BY id"))
            .await
    }

    /// How many rows were committed (published rows included when they are
    /// deleted).
    pub async fn committed(&self) -> i64 {
        let table = self.committed_table();
        self.db
            .value(&format!("SELECT count(*) FROM {table}"))
            .await
    }

    /// Where every committed id is: the outbox, or the ledger when
    /// published rows are deleted.
    fn committed_table(&self) -> &'static str {
        if self.ledger {
            "outbox_ledger"
        } else {
            "outbox"
        }
    }

    /// How many rows were recorded as published: kept with
    /// `published_at`, or gone from the outbox (the ledger's count minus
    /// the rows left, in one statement).
    pub async fn published(&self) -> i64 {
        let sql = if self.ledger {
            "SELECT (SELECT count(*) FROM outbox_ledger) - (SELECT count(*) FROM outbox)"
        } else {
            "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL"
        };
        self.db.value(sql).await
    }

    pub async fn count(&self, where_clause: &str) -> i64 {
        self.db
            .value(&format!("SELECT count(*) FROM outbox WHERE {where_clause}"))
            .await
    }

    /// Waits until `SELECT count(*) … WHERE cond` reaches `n`.
    pub async fn wait_count(&self, where_clause: &str, n: i64, timeout: Duration) -> i64 {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.count(where_clause).await;
            if c >= n || Instant::now() > deadline {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The ledger of committed ids a test keeps when published rows are
/// deleted: a table and a trigger after every insert into the outbox.
fn ledger_statements(db: Db) -> &'static [&'static str] {
    match db {
        Db::Postgres => &[
            "CREATE TABLE outbox_ledger (id bigint PRIMARY KEY)",
            "CREATE FUNCTION outbox_ledger_add() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN INSERT INTO outbox_ledger VALUES (NEW.id); RETURN NULL; END $$",
            "CREATE TRIGGER outbox_ledger AFTER INSERT ON outbox
             FOR EACH ROW EXECUTE FUNCTION outbox_ledger_add()",
        ],
        Db::MariaDb => &[
            "CREATE TABLE outbox_ledger (id BIGINT PRIMARY KEY)",
            "CREATE TRIGGER outbox_ledger AFTER INSERT ON outbox
             FOR EACH ROW INSERT INTO outbox_ledger VALUES (NEW.id)",
        ],
        Db::Sqlite => &[
            "CREATE TABLE outbox_ledger (id INTEGER PRIMARY KEY)",
            "CREATE TRIGGER outbox_ledger AFTER INSERT ON outbox
             BEGIN INSERT INTO outbox_ledger VALUES (NEW.id); END",
        ],
    }
}

/// Where a spawned worker's stdout goes.
enum Stdout {
    /// A file beside its log: a pipe nobody reads fills after 64 KiB (a
    /// minute of `--json` ticks at 200 ms), and a stalled stdout is not
    /// what most tests are about.
    File,
    /// A pipe the test keeps open and never reads.
    Unread,
}

/// A running `outboxd work`.
pub struct WorkerProcess {
    child: Option<Child>,
    pub log: PathBuf,
}

impl WorkerProcess {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends a signal (`TERM`, `KILL`, `STOP`, `CONT`).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} {}", self.pid());
    }

    /// Waits (up to 5 s) until every thread of the process is stopped (a
    /// `SIGSTOP` is delivered asynchronously: `kill` returns while the
    /// process may still run for a moment).
    pub fn wait_stopped(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let tasks = format!("/proc/{}/task", self.pid());
        loop {
            let all_stopped = std::fs::read_dir(&tasks)
                .map(|dir| {
                    dir.flatten().all(|t| {
                        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                            // "pid (comm) S …": the state follows the last ')'.
                            stat.rsplit_once(')').is_some_and(|(_, rest)| {
                                matches!(rest.trim_start().chars().next(), Some('T' | 't'))
                            })
                        })
                    })
                })
                .unwrap_or(false);
            if all_stopped {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pid {} did not stop",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the process is still running (it has not exited).
    pub fn running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.signal("TERM");
        self.wait(timeout)
    }

    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "worker did not exit within {timeout:?}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestEnv {
    /// A test that passed leaves nothing behind: its database, its queues
    /// on the shared broker, its config and worker logs are removed. A
    /// failed test keeps them for a look (`scripts/test.sh` drops leftover
    /// databases at the start of the next run).
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let (kind, admin, db) = (self.kind, self.admin_url.clone(), self.db_name.clone());
        let queues = std::mem::take(&mut *QUEUES.lock().unwrap());
        // Drop runs inside the test's runtime: do the async work on a
        // thread of its own, bounded (a private server may be gone).
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let bounded = Duration::from_secs(5);
                let _ = tokio::time::timeout(bounded, kind.drop_database(&admin, &db)).await;
                let _ = tokio::time::timeout(bounded, delete_queues(&queues)).await;
            });
        });
        let _ = cleanup.join();
    }
}

async fn delete_queues(queues: &[String]) {
    if queues.is_empty() {
        return;
    }
    let Ok(url) = std::env::var("AMQP_URL") else {
        return;
    };
    let props = lapin::ConnectionProperties::default();
    let Ok(conn) = lapin::Connection::connect(&url, props).await else {
        return;
    };
    for q in queues {
        // A channel per queue: deleting one that is not there may close it.
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
        }
    }
    let _ = conn.close(200, "bye".into()).await;
}

/// The longest a worker of [`TestEnv`]'s config may take to exit after
/// SIGTERM when its database is slow: the coordinator's cycle in progress
/// (1 s), the in-flight batches (`worker.shutdown_timeout`, 10 s),
/// releasing the leases (2 s) and the farewell (2 s), plus 5 s for a
/// loaded machine. (15 s, the sum without that margin, once ran out in CI
/// while PostgreSQL took over 5 s to take each connection.)
pub const EXIT_WITHIN: Duration = Duration::from_secs(20);

/// SIGTERMs every worker and asserts each exits 0 within [`EXIT_WITHIN`].
pub fn terminate_all(workers: &mut [WorkerProcess]) {
    for w in workers {
        assert!(w.terminate(EXIT_WITHIN).success());
    }
}

/// A private RabbitMQ node for a test that stops and starts its broker.
pub struct PrivateBroker {
    pub dir: PathBuf,
    pub port: u16,
    /// The address it listens on.
    pub host: String,
    /// Extra environment for `services.sh` (TLS: [`tls::TlsServer`]).
    pub env: Vec<(String, String)>,
}

impl PrivateBroker {
    pub fn start() -> Self {
        Self::start_on("127.0.0.1")
    }

    /// A broker with `services.sh`'s extra environment `env` (e.g. TLS).
    pub fn start_with(env: Vec<(String, String)>) -> Self {
        let mut b = Self::unstarted("127.0.0.1");
        b.env = env;
        b.run("start");
        b
    }

    /// A broker listening on `host` (a test network's gateway).
    pub fn start_on(host: &str) -> Self {
        let b = Self::unstarted(host);
        b.run("start");
        b
    }

    /// A broker listening on `host` whose stream port (the
    /// `rabbitmq_stream` plugin) is [`PrivateBroker::stream_url`].
    pub fn start_with_streams_on(host: &str) -> Self {
        let mut b = Self::unstarted(host);
        // The stream port below the broker's range, so it is never an
        // AMQP port of another test's broker.
        let port = free_port_pair(|| 20000 + 2 * (rand_u16() % 2000));
        b.env = vec![("OUTBOXD_STREAM_PORT".into(), port.to_string())];
        b.run("start");
        b
    }

    /// The stream port's URL, for a broker started with one.
    pub fn stream_url(&self) -> String {
        let port = self
            .stream_port()
            .expect("a broker started with a stream port");
        format!("rabbitmq-stream://guest:guest@{}:{port}/%2f", self.host)
    }

    /// Its plain stream port, if it was started with one.
    pub fn stream_port(&self) -> Option<u16> {
        self.env
            .iter()
            .find(|(k, _)| k == "OUTBOXD_STREAM_PORT")
            .and_then(|(_, v)| v.parse().ok())
    }

    fn unstarted(host: &str) -> Self {
        // Ports 24000-27998, even, so port+1 (distribution) is free too.
        // Below the kernel's ephemeral range (32768-60999 by default): with
        // the broker down, a client reconnecting to a port in that range can
        // be handed the same port as its source and connect to itself (TCP
        // self-connect), and the restarted broker then finds its port taken
        // (seen: eaddrinuse after kill -9).
        let port = free_port_pair(|| 24000 + 2 * (rand_u16() % 2000));
        let dir =
            PathBuf::from(std::env::var("OUTBOXD_STATE_DIR").unwrap_or_else(|_| "/tmp".into()))
                .join(format!("rabbit-{port}"));
        Self {
            dir,
            port,
            host: host.to_string(),
            env: Vec::new(),
        }
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}:{}/%2f", self.host, self.port)
    }

    pub fn run(&self, action: &str) {
        let status = Command::new("bash")
            .arg(repo_dir().join("scripts/services.sh"))
            .args(["rabbit", action])
            .arg(&self.dir)
            .arg(self.port.to_string())
            .env("OUTBOXD_LISTEN", &self.host)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .status()
            .expect("run services.sh");
        assert!(status.success(), "services.sh rabbit {action} failed");
    }

    /// Runs `rabbitmqctl ARGS` against this node.
    pub fn ctl(&self, args: &[&str]) {
        let status = Command::new("bash")
            .arg(repo_dir().join("scripts/services.sh"))
            .args(["rabbit", "ctl"])
            .arg(&self.dir)
            .arg(self.port.to_string())
            .args(args)
            .status()
            .expect("run services.sh");
        assert!(status.success(), "rabbitmqctl {args:?} failed");
    }

    /// Kills the node's Erlang VM with SIGKILL (a crash, not a shutdown).
    pub fn kill9(&self) {
        let pid = std::fs::read_to_string(self.dir.join("rabbit.pid")).expect("rabbit pid file");
        let _ = Command::new("kill").arg("-KILL").arg(pid.trim()).status();
    }
}

impl Drop for PrivateBroker {
    /// The node is thrown away with its directory, so it is killed rather
    /// than stopped: a clean stop boots `rabbitmqctl`'s VM and waits for the
    /// shutdown, about 3 s of every test that starts a broker.
    fn drop(&mut self) {
        if let Some(pid) = self.running_pid() {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.running_pid().is_some() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateBroker {
    /// The node's VM, if it runs: its pid file names a live process whose
    /// command line is this node's (not a pid reused after a kill).
    fn running_pid(&self) -> Option<String> {
        let pid = std::fs::read_to_string(self.dir.join("rabbit.pid")).ok()?;
        let pid = pid.trim().to_string();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let home = self.dir.to_string_lossy();
        String::from_utf8_lossy(&cmdline)
            .contains(home.as_ref())
            .then_some(pid)
    }
}

/// A private PostgreSQL server for a test that stops and starts its
/// database (its own data directory and port, via `scripts/services.sh`).
pub struct PrivatePostgres {
    pub dir: PathBuf,
    pub port: u16,
    /// The address it listens on.
    pub host: String,
    /// Extra environment for `services.sh` (TLS: [`tls::TlsServer`]).
    pub env: Vec<(String, String)>,
}

impl PrivatePostgres {
    pub fn start() -> Self {
        Self::start_on("127.0.0.1")
    }

    /// A server listening on `host` (a test network's gateway).
    pub fn start_on(host: &str) -> Self {
        let pg = Self::unstarted(host);
        pg.run(&["start"]);
        pg
    }

    /// A server with `services.sh`'s extra environment `env` (e.g. TLS).
    pub fn start_with(env: Vec<(String, String)>) -> Self {
        let mut pg = Self::unstarted("127.0.0.1");
        pg.env = env;
        pg.run(&["start"]);
        pg
    }

    /// A server on `host` whose data directory is under `parent` (e.g. a
    /// [`SmallDisk`]).
    pub fn start_under(parent: &Path, host: &str) -> Self {
        let mut pg = Self::unstarted(host);
        pg.dir = parent.join(pg.dir.file_name().expect("a named directory"));
        pg.run(&["start"]);
        pg
    }

    /// A port and a data directory for a server on `host`.
    fn unstarted(host: &str) -> Self {
        // Below the ephemeral range, as for PrivateBroker.
        let port = free_port_pair(|| 28000 + 2 * (rand_u16() % 2000));
        let dir = state_dir().join(format!("pg-{port}"));
        Self {
            dir,
            port,
            host: host.to_string(),
            env: Vec::new(),
        }
    }

    pub fn admin_url(&self) -> String {
        format!(
            "postgres://outboxd:outboxd@{}:{}/postgres",
            self.host, self.port
        )
    }

    /// `services.sh pg ARGS` for this server: `start`, `stop immediate`, …
    pub fn run(&self, args: &[&str]) {
        let status = Command::new("bash")
            .arg(repo_dir().join("scripts/services.sh"))
            .arg("pg")
            .args(args)
            .env("OUTBOXD_STATE_DIR", &self.dir)
            .env("OUTBOXD_PG_PORT", self.port.to_string())
            .env("OUTBOXD_LISTEN", &self.host)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .status()
            .expect("run services.sh");
        assert!(status.success(), "services.sh pg {args:?} failed");
    }
}

impl PrivatePostgres {
    /// Stops (`STOP`) or resumes (`CONT`) the server and every one of its
    /// processes: connections stay open and nothing answers — a database
    /// that hangs rather than refuses.
    pub fn signal_all(&self, sig: &str) {
        if let Err(e) = self.try_signal_all(sig) {
            panic!("kill -{sig} the server's processes: {e}");
        }
    }

    /// Pauses the postmaster alone (`STOP`) until the guard is dropped
    /// (`CONT`): the connections it has keep answering, while a new one is
    /// accepted by the kernel and never answered — a server slow to take
    /// connections, as a loaded machine's sometimes is.
    pub fn pause_postmaster(&self) -> PausedPostmaster {
        let pid = self.postmaster_pid().expect("postmaster.pid");
        let status = Command::new("kill").args(["-STOP", &pid]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -STOP {pid}");
        PausedPostmaster(pid)
    }

    /// The postmaster's process id, from its pid file.
    fn postmaster_pid(&self) -> Result<String, String> {
        let pidfile = self.dir.join("pg/postmaster.pid");
        let text = std::fs::read_to_string(&pidfile).map_err(|e| e.to_string())?;
        Ok(text.lines().next().unwrap_or_default().trim().to_string())
    }

    fn try_signal_all(&self, sig: &str) -> Result<(), String> {
        let postmaster = self.postmaster_pid()?;
        let children = Command::new("pgrep")
            .args(["-P", &postmaster])
            .output()
            .map_err(|e| e.to_string())?;
        let mut pids = vec![postmaster];
        pids.extend(
            String::from_utf8_lossy(&children.stdout)
                .split_whitespace()
                .map(str::to_string),
        );
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .args(&pids)
            .status()
            .map_err(|e| e.to_string())?;
        if status.success() {
            return Ok(());
        }
        // A backend that ended between the listing and the signal (a
        // connection closing) is no failure: only a process still there
        // that does not take the signal is.
        let missed: Vec<&String> = pids
            .iter()
            .filter(|p| Path::new("/proc").join(p).exists())
            .filter(|p| {
                !Command::new("kill")
                    .arg(format!("-{sig}"))
                    .arg(p)
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .collect();
        missed
            .is_empty()
            .then_some(())
            .ok_or_else(|| format!("kill failed for {missed:?} of {pids:?}"))
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // A test that failed while the server was stopped: resume it, or
        // the stop below would wait for it.
        let _ = self.try_signal_all("CONT");
        self.run(&["stop", "immediate"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private MariaDB server for a test that crashes and restarts its
/// database (its own data directory and port, via `scripts/services.sh`).
pub struct PrivateMariaDb {
    pub dir: PathBuf,
    pub port: u16,
    /// The address it listens on.
    pub host: String,
    /// Extra environment for `services.sh` (TLS: [`tls::TlsServer`]).
    pub env: Vec<(String, String)>,
}

impl PrivateMariaDb {
    pub fn start() -> Self {
        Self::start_with(Vec::new())
    }

    /// A server with `services.sh`'s extra environment `env` (e.g. TLS).
    pub fn start_with(env: Vec<(String, String)>) -> Self {
        Self::start_at("127.0.0.1", env)
    }

    /// A server listening on `host` (a test network's gateway).
    pub fn start_on(host: &str) -> Self {
        Self::start_at(host, Vec::new())
    }

    /// A server on `host` whose data directory is under `parent` (e.g. a
    /// [`SmallDisk`]).
    pub fn start_under(parent: &Path, host: &str) -> Self {
        Self::start_with_env(parent, host, Vec::new())
    }

    fn start_at(host: &str, env: Vec<(String, String)>) -> Self {
        Self::start_with_env(&state_dir(), host, env)
    }

    fn start_with_env(parent: &Path, host: &str, env: Vec<(String, String)>) -> Self {
        // Below the ephemeral range, as for PrivateBroker.
        let port = free_port_pair(|| 29000 + 2 * (rand_u16() % 1000));
        let dir = parent.join(format!("mariadb-{port}"));
        let m = Self {
            dir,
            port,
            host: host.to_string(),
            env,
        };
        m.run("start");
        m
    }

    pub fn admin_url(&self) -> String {
        format!("mysql://outboxd:outboxd@{}:{}/", self.host, self.port)
    }

    /// `services.sh mariadb ACTION` for this server: `start`, `stop`, `kill`.
    pub fn run(&self, action: &str) {
        let status = Command::new("bash")
            .arg(repo_dir().join("scripts/services.sh"))
            .args(["mariadb", action])
            .env("OUTBOXD_STATE_DIR", &self.dir)
            .env("OUTBOXD_MYSQL_PORT", self.port.to_string())
            .env("OUTBOXD_LISTEN", &self.host)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .status()
            .expect("run services.sh");
        assert!(status.success(), "services.sh mariadb {action} failed");
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        self.run("kill");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A paused postmaster ([`PrivatePostgres::pause_postmaster`]), resumed
/// when dropped — also when the test fails.
pub struct PausedPostmaster(String);

impl Drop for PausedPostmaster {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

/// A private database server of either backend.
pub enum PrivateDatabase {
    Pg(PrivatePostgres),
    My(PrivateMariaDb),
}

impl PrivateDatabase {
    pub fn start(db: Db) -> Self {
        match db {
            Db::Postgres => Self::Pg(PrivatePostgres::start()),
            Db::MariaDb => Self::My(PrivateMariaDb::start()),
            Db::Sqlite => panic!("SQLite has no server to start: a database server test"),
        }
    }

    /// A server on loopback whose data directory is under `parent` (a
    /// [`SmallDisk`]).
    pub fn start_in(db: Db, parent: &Path) -> Self {
        Self::start_under(db, parent, "127.0.0.1")
    }

    /// A server on `host` whose data directory is under `parent`.
    pub fn start_under(db: Db, parent: &Path, host: &str) -> Self {
        match db {
            Db::Postgres => Self::Pg(PrivatePostgres::start_under(parent, host)),
            Db::MariaDb => Self::My(PrivateMariaDb::start_under(parent, host)),
            Db::Sqlite => panic!("SQLite has no server to start: a database server test"),
        }
    }

    /// Whether the server answers a connection now.
    pub async fn answers(&self) -> bool {
        let url = self.admin_url();
        tokio::time::timeout(Duration::from_secs(3), async {
            match self {
                Self::Pg(_) => <sqlx::PgConnection as sqlx::Connection>::connect(&url)
                    .await
                    .is_ok(),
                Self::My(_) => <sqlx::MySqlConnection as sqlx::Connection>::connect(&url)
                    .await
                    .is_ok(),
            }
        })
        .await
        .unwrap_or(false)
    }

    pub fn admin_url(&self) -> String {
        match self {
            Self::Pg(pg) => pg.admin_url(),
            Self::My(my) => my.admin_url(),
        }
    }

    /// Stops the server the way a crash does (PostgreSQL: `-m immediate`;
    /// MariaDB: SIGKILL).
    pub fn crash(&self) {
        match self {
            Self::Pg(pg) => pg.run(&["stop", "immediate"]),
            Self::My(my) => my.run("kill"),
        }
    }

    /// Starts it again (with crash recovery).
    pub fn restart(&self) {
        match self {
            Self::Pg(pg) => pg.run(&["start"]),
            Self::My(my) => my.run("start"),
        }
    }
}

/// Where the private services keep their state (`OUTBOXD_STATE_DIR`).
pub fn state_dir() -> PathBuf {
    PathBuf::from(std::env::var("OUTBOXD_STATE_DIR").unwrap_or_else(|_| "/tmp".into()))
}

/// A small filesystem of its own (a tmpfs of a fixed size) for a database
/// server's data, to fill up: [`SmallDisk::fill`] leaves it almost no free
/// space, [`SmallDisk::free`] gives it back. Unmounted on drop (declare it
/// before the server, so the server is dropped — stopped — first).
pub struct SmallDisk {
    pub dir: PathBuf,
}

impl SmallDisk {
    /// A tmpfs of `mib` MiB under the state folder (root: tests run as root).
    pub fn mount(mib: u64) -> Self {
        let dir = state_dir().join(format!("disk-{}", unique("d")));
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0777"),
                "tmpfs",
            ])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a {mib} MiB tmpfs at {dir:?}");
        Self { dir }
    }

    fn balloon(&self) -> PathBuf {
        self.dir.join("balloon")
    }

    /// Bytes free on the filesystem now.
    pub fn free_bytes(&self) -> u64 {
        let out = Command::new("stat")
            .args(["-f", "-c", "%a %S"])
            .arg(&self.dir)
            .output()
            .expect("run stat");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
        it.next().unwrap() * it.next().unwrap()
    }

    /// Takes all but `leave` bytes of the free space (a balloon file):
    /// written until the filesystem refuses more, then shortened. A server
    /// on the filesystem may free space of its own meanwhile (MariaDB once
    /// gave back 13 MB as `dd` ended): the balloon is filled again until
    /// the space stays taken.
    pub fn fill(&self, leave: u64) {
        for _ in 0..10 {
            let _ = Command::new("dd")
                .args(["if=/dev/zero", "bs=1M", "status=none"])
                .arg(format!("of={}", self.balloon().display()))
                .stderr(Stdio::null())
                .status()
                .expect("run dd");
            let status = Command::new("truncate")
                .args(["-s", &format!("-{leave}")])
                .arg(self.balloon())
                .status()
                .expect("run truncate");
            assert!(status.success(), "truncate the balloon");
            let free = self.free_bytes();
            if free <= leave + (1 << 20) {
                return;
            }
            eprintln!("the disk: {free} bytes free after filling it, filled again");
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("the disk was not filled: {} bytes free", self.free_bytes());
    }

    /// Frees the balloon's space.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.balloon());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A port from `pick` such that it and the next one are free right now.
pub fn free_port_pair(pick: impl Fn() -> u16) -> u16 {
    loop {
        let port = pick();
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 1) {
            return port;
        }
    }
}

pub fn rand_u16() -> u16 {
    let b = uuid::Uuid::new_v4();
    u16::from_le_bytes([b.as_bytes()[0], b.as_bytes()[1]])
}

// Fleet state as the database records it.

pub async fn leases(env: &TestEnv) -> Vec<LeaseRow> {
    env.store.leases().await.unwrap()
}

/// The live workers as the fleet's own workers see them (the same bound
/// on a late heartbeat).
pub async fn live(env: &TestEnv) -> Vec<Uuid> {
    let w = &env.config.worker;
    let suspect = outboxd::store::workers::suspect_after(w.lease_ttl, w.heartbeat_ttl);
    env.store.live_leasing(Uuid::nil(), suspect).await.unwrap()
}

/// The buckets `worker` holds, with their lease epochs.
pub async fn held_by(env: &TestEnv, worker: Uuid) -> BTreeMap<String, i64> {
    leases(env)
        .await
        .into_iter()
        .filter(|l| l.lease_owner == Some(worker))
        .map(|l| (l.partition_key, l.lease_epoch))
        .collect()
}

pub async fn event_count(env: &TestEnv) -> i64 {
    env.db
        .value("SELECT count(*) FROM outbox_lease_events")
        .await
}

/// True when `n` workers are live and every bucket has a valid lease held
/// by the worker the modulo rule names.
pub async fn converged(env: &TestEnv, n: usize) -> bool {
    let workers = live(env).await;
    if workers.len() != n {
        return false;
    }
    leases(env).await.iter().enumerate().all(|(b, l)| {
        l.valid
            && l.lease_owner == Some(workers[owner_index(Assignment::Modulo, &workers, b as u32)])
    })
}

/// Checks `holds` every 50 ms until it does (true) or `timeout` has passed
/// (false) — for what a worker's log or output will show, such as a line
/// it writes once the commit it reports has already been seen by others.
pub async fn eventually(timeout: Duration, mut holds: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if holds() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `converged(n)`; returns how long it took.
pub async fn wait_converged(env: &TestEnv, n: usize, timeout: Duration) -> Duration {
    let start = Instant::now();
    while !converged(env, n).await {
        assert!(
            start.elapsed() < timeout,
            "no convergence to {n} workers within {timeout:?}: live {:?}, leases {:?}",
            live(env).await,
            leases(env)
                .await
                .iter()
                .map(|l| (
                    l.partition_key.clone(),
                    l.lease_owner,
                    l.lease_epoch,
                    l.valid
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// The worker id of a process (from its row, by pid).
pub async fn worker_id_of(env: &TestEnv, w: &WorkerProcess) -> Uuid {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ids: Vec<Uuid> = env
            .db
            .column(&format!(
                "SELECT worker_id FROM outbox_workers WHERE pid = {}",
                w.pid()
            ))
            .await;
        if let Some(&id) = ids.first() {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "worker {} never registered",
            w.pid()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Keys whose bucket is `bucket` (for tests that need several keys in one
/// bucket, or keys in different buckets).
pub fn keys_in_bucket(p: Partitioner, bucket: &str, n: usize, prefix: &str) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|k| p.label_for(k) == bucket)
        .take(n)
        .collect()
}

/// Reads a file of the repo.
pub fn read_repo_file(rel: &str) -> String {
    std::fs::read_to_string(repo_dir().join(rel)).unwrap()
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A response of [`http`].
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// A minimal HTTP/1.1 client for the dashboard tests (one request per
/// connection, `Connection: close`).
pub async fn http(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> HttpResponse {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let u = url::Url::parse(url).unwrap();
    let host = format!("{}:{}", u.host_str().unwrap(), u.port().unwrap());
    let path = match u.query() {
        Some(q) => format!("{}?{q}", u.path()),
        None => u.path().to_string(),
    };
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {host}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.unwrap_or("");
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let mut stream = tokio::net::TcpStream::connect(&host).await.unwrap();
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect::<Vec<_>>();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Starts `outboxd ui` on a free port; returns the process and its base URL
/// (e.g. `http://127.0.0.1:41234`), read from its log.
pub fn spawn_ui(env: &TestEnv, config: &Path) -> (WorkerProcess, String) {
    let log = env.dir.join(format!("{}.log", unique("ui")));
    let child = Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(["ui", "--listen", "127.0.0.1:0"])
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env("OUTBOXD_LOG", WORKER_LOG)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let p = WorkerProcess {
        child: Some(child),
        log,
    };
    let url = wait_for_dashboard_url(&p);
    (p, url)
}

/// The `http://host:port` (or `https://`) a process's dashboard listens
/// on, from its log.
pub fn wait_for_dashboard_url(p: &WorkerProcess) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = p.log_text();
        if let Some(i) = text
            .find("url=http://")
            .or_else(|| text.find("url=https://"))
        {
            let rest = &text[i + 4..];
            let after_scheme = rest.find("://").unwrap() + 3;
            let end = rest[after_scheme..].find('/').unwrap() + after_scheme;
            return rest[..end].to_string();
        }
        assert!(
            Instant::now() < deadline,
            "dashboard never listened; log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A counter's value in a worker's `/metrics` page (an unlabelled line).
pub async fn metric(base: &str, name: &str) -> f64 {
    let page = http("GET", &format!("{base}/metrics"), &[], None)
        .await
        .body;
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{page}"))
}

/// Reads until `expected` distinct messages arrived (false if `timeout`
/// passed first), then half a second more so late extras would show, and
/// judges everything against the committed rows.
pub async fn read_and_judge(
    reader: &mut QueueReader,
    env: &TestEnv,
    expected: usize,
    timeout: Duration,
) -> (bool, Verdict) {
    let all = reader
        .read_until(timeout, |c| c.unique() >= expected)
        .await
        .unwrap();
    let _ = reader
        .read_until(Duration::from_millis(500), |_| false)
        .await;
    (all, reader.checker.verdict(env.all_ids().await))
}

/// Enqueues `total` messages over `keys` keys spread evenly over `over`, one
/// transaction each.
pub async fn produce_evenly(db: TestDb, queue: String, total: usize, keys: usize, over: Duration) {
    produce_evenly_counted(db, queue, total, keys, over, Arc::default()).await
}

/// [`produce_evenly`], adding each committed message to `produced`, so that
/// a test can tell a relay that fell behind from a producer that did.
pub async fn produce_evenly_counted(
    db: TestDb,
    queue: String,
    total: usize,
    keys: usize,
    over: Duration,
    produced: Arc<AtomicUsize>,
) {
    let period = over / total as u32;
    let mut next = tokio::time::Instant::now();
    for i in 0..total {
        db.enqueue(Message::new(
            format!("key-{}", i % keys),
            "",
            queue.as_str(),
            i.to_string(),
        ))
        .await;
        produced.fetch_add(1, Ordering::Relaxed);
        next += period;
        tokio::time::sleep_until(next).await;
    }
}

/// A small seeded generator (splitmix64) for tests that print their seed:
/// `OUTBOXD_SEED=<seed>` replays the run.
pub struct Seeded(pub u64);

impl Seeded {
    /// `OUTBOXD_SEED`, or a random seed.
    pub fn seed() -> u64 {
        std::env::var("OUTBOXD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| Uuid::new_v4().as_u64_pair().0)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A number in `lo..=hi`.
    pub fn within(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
