//! The databases a test runs on, and a direct connection to a test
//! database for what the test inspects or writes itself.

use outboxd::producer::{Message, Producer};
use outboxd::store::StoreError;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions, SqliteRow};
use sqlx::{AssertSqlSafe, Connection, MySql, MySqlConnection, PgConnection, Postgres, Sqlite};

/// A database backend a test runs on (`MariaDb` is the product's name,
/// not a repeat of the enum's).
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Postgres,
    MariaDb,
    /// A database file in a directory of this machine's temporary files.
    Sqlite,
}

impl Db {
    /// The shared server's admin URL (`scripts/services.sh` starts both).
    pub fn admin_url(self) -> String {
        match self {
            Db::Postgres => super::admin_url(),
            Db::MariaDb => super::mysql_admin_url(),
            Db::Sqlite => super::sqlite_dir_url(),
        }
    }

    /// Creates database `name` on the server of `admin`.
    pub async fn create_database(self, admin: &str, name: &str) {
        let sql = AssertSqlSafe(format!("CREATE DATABASE {name}"));
        match self {
            Db::Postgres => {
                let mut c = PgConnection::connect(admin)
                    .await
                    .expect("connect as admin");
                sqlx::query(sql)
                    .execute(&mut c)
                    .await
                    .expect("create test database");
                c.close().await.ok();
            }
            Db::MariaDb => {
                let mut c = MySqlConnection::connect(admin)
                    .await
                    .expect("connect as admin");
                sqlx::query(sql)
                    .execute(&mut c)
                    .await
                    .expect("create test database");
                c.close().await.ok();
            }
            // The file is created by the first connection.
            Db::Sqlite => {}
        }
    }

    /// Drops database `name` (best effort).
    pub async fn drop_database(self, admin: &str, name: &str) {
        match self {
            Db::Postgres => {
                if let Ok(mut c) = PgConnection::connect(admin).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(AssertSqlSafe(sql)).execute(&mut c).await;
                    let _ = c.close().await;
                }
            }
            Db::MariaDb => {
                if let Ok(mut c) = MySqlConnection::connect(admin).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name}");
                    let _ = sqlx::query(AssertSqlSafe(sql)).execute(&mut c).await;
                    let _ = c.close().await;
                }
            }
            Db::Sqlite => {
                let file = super::with_database(admin, name);
                let file = file.trim_start_matches("sqlite://");
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{file}{suffix}"));
                }
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Db::Postgres => "postgres",
            Db::MariaDb => "mariadb",
            Db::Sqlite => "sqlite",
        }
    }
}

/// Runs a scenario `async fn name(db: Db)` once per backend, as the tests
/// `postgres::name`, `mariadb::name` and `sqlite::name`.
#[macro_export]
macro_rules! on_every_db {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        $crate::on_every_db!(@ "needs RabbitMQ: scripts/test.sh runs it"; $($(#[$attr])* $name),*);
    };
    (@ $sqlite_needs:literal; $($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod postgres {
            $(
                $(#[$attr])*
                #[cfg_attr(not(feature = "services"), ignore = "needs PostgreSQL and RabbitMQ: scripts/test.sh runs it")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::Db::Postgres).await
                }
            )*
        }
        mod mariadb {
            $(
                $(#[$attr])*
                #[cfg_attr(not(feature = "services"), ignore = "needs MariaDB and RabbitMQ: scripts/test.sh runs it")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::Db::MariaDb).await
                }
            )*
        }
        mod sqlite {
            $(
                $(#[$attr])*
                #[cfg_attr(not(feature = "services"), ignore = $sqlite_needs)]
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::Db::Sqlite).await
                }
            )*
        }
    };
}

/// [`on_every_db!`] for tests of the store alone: their SQLite variants
/// need no service and run in the contributor's `cargo test` (the store's
/// conformance suite on a temporary file); the server ones are ignored
/// there, with how to run them.
#[macro_export]
macro_rules! on_every_store {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod postgres {
            $(
                $(#[$attr])*
                #[cfg_attr(not(feature = "services"), ignore = "needs PostgreSQL: scripts/test.sh runs it")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::Db::Postgres).await
                }
            )*
        }
        mod mariadb {
            $(
                $(#[$attr])*
                #[cfg_attr(not(feature = "services"), ignore = "needs MariaDB: scripts/test.sh runs it")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::Db::MariaDb).await
                }
            )*
        }
        mod sqlite {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::Db::Sqlite).await
                }
            )*
        }
    };
}

/// Runs a scenario `async fn name(db: Db)` on the database servers only,
/// as `server::postgres::name` and `server::mariadb::name`: for what only a
/// server has (connections to kill, concurrent writers, a transaction held
/// open beside others' writes). Each use says why SQLite is left out.
#[macro_export]
macro_rules! on_server_dbs {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod server {
            mod postgres {
                $(
                    $(#[$attr])*
                    #[cfg_attr(not(feature = "services"), ignore = "needs PostgreSQL and RabbitMQ: scripts/test.sh runs it")]
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        super::super::$name($crate::common::Db::Postgres).await
                    }
                )*
            }
            mod mariadb {
                $(
                    $(#[$attr])*
                    #[cfg_attr(not(feature = "services"), ignore = "needs MariaDB and RabbitMQ: scripts/test.sh runs it")]
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        super::super::$name($crate::common::Db::MariaDb).await
                    }
                )*
            }
        }
    };
}

/// `ids` as an SQL list, for `id IN (…)`.
pub fn list(ids: &[i64]) -> String {
    if ids.is_empty() {
        return "NULL".into();
    }
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A direct connection pool to a test database: what a test reads and
/// writes itself. SQL given to it must mean the same on both backends
/// (plain `SELECT count(*) … WHERE …`, literals instead of parameters).
#[derive(Debug, Clone)]
pub enum TestDb {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

impl TestDb {
    pub async fn connect(db: Db, url: &str, max_connections: u32) -> Self {
        match db {
            Db::Postgres => TestDb::Pg(
                PgPoolOptions::new()
                    .max_connections(max_connections)
                    .connect(url)
                    .await
                    .expect("connect to the test database"),
            ),
            Db::MariaDb => TestDb::My(
                MySqlPoolOptions::new()
                    .max_connections(max_connections)
                    .connect(url)
                    .await
                    .expect("connect to the test database"),
            ),
            Db::Sqlite => TestDb::Lite(
                SqlitePoolOptions::new()
                    .max_connections(max_connections)
                    .connect_with(sqlite_options(url))
                    .await
                    .expect("connect to the test database"),
            ),
        }
    }

    /// A pool that connects when first used, and gives up acquiring a
    /// connection after `acquire_timeout` (producers that wait out a
    /// database restart).
    pub fn connect_lazy(
        db: Db,
        url: &str,
        max_connections: u32,
        acquire_timeout: std::time::Duration,
    ) -> Self {
        match db {
            Db::Postgres => TestDb::Pg(
                PgPoolOptions::new()
                    .max_connections(max_connections)
                    .acquire_timeout(acquire_timeout)
                    .connect_lazy(url)
                    .unwrap(),
            ),
            Db::MariaDb => TestDb::My(
                MySqlPoolOptions::new()
                    .max_connections(max_connections)
                    .acquire_timeout(acquire_timeout)
                    .connect_lazy(url)
                    .unwrap(),
            ),
            Db::Sqlite => TestDb::Lite(
                SqlitePoolOptions::new()
                    .max_connections(max_connections)
                    .acquire_timeout(acquire_timeout)
                    .connect_lazy_with(sqlite_options(url)),
            ),
        }
    }

    pub fn db(&self) -> Db {
        match self {
            TestDb::Pg(_) => Db::Postgres,
            TestDb::My(_) => Db::MariaDb,
            TestDb::Lite(_) => Db::Sqlite,
        }
    }

    /// The PostgreSQL pool (tests of PostgreSQL-only behaviour).
    pub fn pg(&self) -> &PgPool {
        match self {
            TestDb::Pg(p) => p,
            _ => panic!("a PostgreSQL-only check on {}", self.db().name()),
        }
    }

    /// The MySQL pool (tests of MySQL-only behaviour).
    pub fn my(&self) -> &MySqlPool {
        match self {
            TestDb::My(p) => p,
            _ => panic!("a MySQL-only check on {}", self.db().name()),
        }
    }

    /// An SQL expression for the database's time `secs` seconds from now
    /// (negative: ago).
    pub fn now_plus(&self, secs: i64) -> String {
        match self {
            TestDb::Pg(_) => format!("(now() + make_interval(secs => {secs}))"),
            TestDb::My(_) => format!("(UTC_TIMESTAMP(6) + INTERVAL {secs} SECOND)"),
            TestDb::Lite(_) => format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '{secs} seconds')"),
        }
    }

    /// An SQL expression for a random UUID (as the column types store it).
    pub fn random_uuid(&self) -> &'static str {
        match self {
            TestDb::Pg(_) => "gen_random_uuid()",
            TestDb::My(_) => "UNHEX(REPLACE(UUID(), '-', ''))",
            TestDb::Lite(_) => "randomblob(16)",
        }
    }

    /// An SQL expression for the database's time now.
    pub fn now(&self) -> &'static str {
        match self {
            TestDb::Pg(_) => "now()",
            TestDb::My(_) => "UTC_TIMESTAMP(6)",
            TestDb::Lite(_) => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        }
    }

    /// Runs a statement; returns the rows it affected.
    pub async fn exec(&self, sql: &str) -> u64 {
        let q = AssertSqlSafe(sql.to_string());
        match self {
            TestDb::Pg(p) => sqlx::raw_sql(q).execute(p).await.map(|r| r.rows_affected()),
            TestDb::My(p) => sqlx::raw_sql(q).execute(p).await.map(|r| r.rows_affected()),
            TestDb::Lite(p) => sqlx::raw_sql(q).execute(p).await.map(|r| r.rows_affected()),
        }
        .unwrap_or_else(|e| panic!("{e}: {}", short(sql)))
    }

    /// Every row of a query, as `T` (a tuple or a `FromRow` type).
    pub async fn rows<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, PgRow>
            + for<'r> sqlx::FromRow<'r, MySqlRow>
            + for<'r> sqlx::FromRow<'r, SqliteRow>
            + Send
            + Unpin,
    {
        self.try_rows(sql)
            .await
            .unwrap_or_else(|e| panic!("{e}: {}", short(sql)))
    }

    /// [`TestDb::rows`], or the error (a test that reads while its
    /// database may be down).
    pub async fn try_rows<T>(&self, sql: &str) -> Result<Vec<T>, sqlx::Error>
    where
        T: for<'r> sqlx::FromRow<'r, PgRow>
            + for<'r> sqlx::FromRow<'r, MySqlRow>
            + for<'r> sqlx::FromRow<'r, SqliteRow>
            + Send
            + Unpin,
    {
        let q = AssertSqlSafe(sql.to_string());
        match self {
            TestDb::Pg(p) => sqlx::query_as(q).fetch_all(p).await,
            TestDb::My(p) => sqlx::query_as(q).fetch_all(p).await,
            TestDb::Lite(p) => sqlx::query_as(q).fetch_all(p).await,
        }
    }

    /// The one row of a query.
    pub async fn row<T>(&self, sql: &str) -> T
    where
        T: for<'r> sqlx::FromRow<'r, PgRow>
            + for<'r> sqlx::FromRow<'r, MySqlRow>
            + for<'r> sqlx::FromRow<'r, SqliteRow>
            + Send
            + Unpin,
    {
        let mut rows = self.rows(sql).await;
        assert_eq!(rows.len(), 1, "{sql}: expected one row");
        rows.pop().unwrap()
    }

    /// The values of a one-column query.
    pub async fn column<T>(&self, sql: &str) -> Vec<T>
    where
        T: sqlx::Type<Postgres>
            + for<'r> sqlx::Decode<'r, Postgres>
            + sqlx::Type<MySql>
            + for<'r> sqlx::Decode<'r, MySql>
            + sqlx::Type<Sqlite>
            + for<'r> sqlx::Decode<'r, Sqlite>
            + Send
            + Unpin,
    {
        let q = AssertSqlSafe(sql.to_string());
        match self {
            TestDb::Pg(p) => sqlx::query_scalar(q).fetch_all(p).await,
            TestDb::My(p) => sqlx::query_scalar(q).fetch_all(p).await,
            TestDb::Lite(p) => sqlx::query_scalar(q).fetch_all(p).await,
        }
        .unwrap_or_else(|e| panic!("{e}: {}", short(sql)))
    }

    /// The one value of a one-row, one-column query.
    pub async fn value<T>(&self, sql: &str) -> T
    where
        T: sqlx::Type<Postgres>
            + for<'r> sqlx::Decode<'r, Postgres>
            + sqlx::Type<MySql>
            + for<'r> sqlx::Decode<'r, MySql>
            + sqlx::Type<Sqlite>
            + for<'r> sqlx::Decode<'r, Sqlite>
            + Send
            + Unpin,
    {
        let mut v = self.column(sql).await;
        assert_eq!(v.len(), 1, "{sql}: expected one row");
        v.pop().unwrap()
    }

    /// Enqueues one message on its own (autocommit); returns its id.
    pub async fn enqueue(&self, m: Message) -> i64 {
        self.try_enqueue(m).await.expect("enqueue")
    }

    pub async fn try_enqueue(&self, m: Message) -> Result<i64, StoreError> {
        self.enqueue_by(&Producer::default(), m).await
    }

    /// Enqueues one message through `producer` (autocommit).
    pub async fn enqueue_by(&self, producer: &Producer, m: Message) -> Result<i64, StoreError> {
        match self {
            TestDb::Pg(p) => producer.enqueue(p, m).await,
            TestDb::My(p) => producer.enqueue(p, m).await,
            TestDb::Lite(p) => producer.enqueue(p, m).await,
        }
    }

    /// Enqueues `messages` in one transaction, committed or (with `commit`
    /// false) rolled back; returns their ids.
    pub async fn enqueue_in_tx(
        &self,
        messages: Vec<Message>,
        commit: bool,
    ) -> Result<Vec<i64>, StoreError> {
        let producer = Producer::default();
        let mut ids = Vec::new();
        let commit_err = |source| {
            StoreError::query(&outboxd::store::ErrorDialect::GENERIC, "committing", source)
        };
        match self {
            TestDb::Pg(p) => {
                let mut tx = p.begin().await.map_err(commit_err)?;
                for m in messages {
                    ids.push(producer.enqueue(&mut *tx, m).await?);
                }
                if commit {
                    tx.commit().await.map_err(commit_err)?;
                } else {
                    tx.rollback().await.map_err(commit_err)?;
                }
            }
            TestDb::My(p) => {
                let mut tx = p.begin().await.map_err(commit_err)?;
                for m in messages {
                    ids.push(producer.enqueue(&mut *tx, m).await?);
                }
                if commit {
                    tx.commit().await.map_err(commit_err)?;
                } else {
                    tx.rollback().await.map_err(commit_err)?;
                }
            }
            TestDb::Lite(p) => {
                let mut tx = p.begin().await.map_err(commit_err)?;
                for m in messages {
                    ids.push(producer.enqueue(&mut *tx, m).await?);
                }
                if commit {
                    tx.commit().await.map_err(commit_err)?;
                } else {
                    tx.rollback().await.map_err(commit_err)?;
                }
            }
        }
        Ok(ids)
    }

    /// Enqueues `m` in a transaction that stays open until the returned
    /// [`Held`] is committed: a row whose id is taken now and which commits
    /// later.
    pub async fn enqueue_held(&self, m: Message) -> (i64, Held) {
        let producer = Producer::default();
        match self {
            TestDb::Pg(p) => {
                let mut tx = p.begin().await.unwrap();
                let id = producer.enqueue(&mut *tx, m).await.unwrap();
                (id, Held::Pg(tx))
            }
            TestDb::My(p) => {
                let mut tx = p.begin().await.unwrap();
                let id = producer.enqueue(&mut *tx, m).await.unwrap();
                (id, Held::My(tx))
            }
            TestDb::Lite(p) => {
                let mut tx = p.begin().await.unwrap();
                let id = producer.enqueue(&mut *tx, m).await.unwrap();
                (id, Held::Lite(tx))
            }
        }
    }

    /// SQLite: takes the file's write lock (`BEGIN IMMEDIATE`) until the
    /// returned transaction ends, the way any other writer does. `None` on
    /// the servers, which have no such lock.
    pub async fn hold_write_lock(&self) -> Option<Held> {
        match self {
            TestDb::Lite(p) => Some(Held::Lite(
                p.begin_with("BEGIN IMMEDIATE")
                    .await
                    .expect("take the write lock"),
            )),
            _ => None,
        }
    }

    /// Terminates every connection of the `outboxd work` processes `pids`
    /// to test database `name` (from the server's admin URL `admin`);
    /// returns how many. PostgreSQL knows them by application name; MariaDB
    /// by the client port, which is read from the processes' sockets.
    pub async fn kill_worker_connections(&self, admin: &str, name: &str, pids: &[u32]) -> i64 {
        match self {
            TestDb::Pg(_) => {
                let mut c = PgConnection::connect(admin).await.unwrap();
                let n = sqlx::query_scalar(
                    "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE datname = $1 AND application_name = 'outboxd work') t",
                )
                .bind(name)
                .fetch_one(&mut c)
                .await
                .unwrap();
                c.close().await.ok();
                n
            }
            TestDb::My(_) => {
                let server_port = url::Url::parse(admin).unwrap().port().unwrap_or(3306);
                let ports: Vec<u16> = pids
                    .iter()
                    .flat_map(|&pid| client_ports_of(pid, server_port))
                    .collect();
                let mut c = MySqlConnection::connect(admin).await.unwrap();
                let rows: Vec<(i64, String)> = sqlx::query_as(
                    "SELECT CAST(id AS SIGNED), host FROM information_schema.PROCESSLIST
                     WHERE db = ? AND id <> CONNECTION_ID() AND command <> 'Killed'",
                )
                .bind(name)
                .fetch_all(&mut c)
                .await
                .unwrap();
                let ids = rows.into_iter().filter(|(_, host)| {
                    host.rsplit_once(':')
                        .and_then(|(_, p)| p.parse::<u16>().ok())
                        .is_some_and(|p| ports.contains(&p))
                });
                let mut n = 0;
                for (id, _) in ids {
                    let kill = AssertSqlSafe(format!("KILL CONNECTION {id}"));
                    if sqlx::query(kill).execute(&mut c).await.is_ok() {
                        n += 1;
                    }
                }
                c.close().await.ok();
                n
            }
            TestDb::Lite(_) => panic!("SQLite has no connections to terminate: a file, no server"),
        }
    }

    pub async fn close(&self) {
        match self {
            TestDb::Pg(p) => p.close().await,
            TestDb::My(p) => p.close().await,
            TestDb::Lite(p) => p.close().await,
        }
    }
}

/// A test's own connections to an SQLite file: WAL, a busy timeout long
/// enough to wait out the workers' writes, and commits that do not wait
/// for the disk (what a test writes need not survive a power cut; the
/// workers' connections are the product's own).
fn sqlite_options(url: &str) -> sqlx::sqlite::SqliteConnectOptions {
    use std::str::FromStr;
    sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .expect("an SQLite URL")
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
        .busy_timeout(std::time::Duration::from_secs(30))
}

/// A transaction held open (see [`TestDb::enqueue_held`]).
pub enum Held {
    Pg(sqlx::Transaction<'static, Postgres>),
    My(sqlx::Transaction<'static, MySql>),
    Lite(sqlx::Transaction<'static, Sqlite>),
}

impl Held {
    pub async fn commit(self) {
        match self {
            Held::Pg(tx) => tx.commit().await.unwrap(),
            Held::My(tx) => tx.commit().await.unwrap(),
            Held::Lite(tx) => tx.commit().await.unwrap(),
        }
    }
}

/// A plain multi-row `INSERT` of `n` messages to `queue` (payload: the
/// row's number), keys cycling through `keys`: producers' own SQL, the
/// database computes each row's bucket. Works on both backends.
pub fn plain_insert(keys: &[String], queue: &str, n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| format!("('{}', '', '{queue}', '{i}')", keys[i % keys.len()]))
        .collect();
    format!(
        "INSERT INTO outbox (message_key, exchange, routing_key, payload) VALUES {}",
        rows.join(", ")
    )
}

/// The start of a statement, for a failure message.
fn short(sql: &str) -> String {
    match sql.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &sql[..i]),
        None => sql.to_string(),
    }
}

/// The local ports of process `pid`'s TCP connections to `server_port`
/// (from its socket descriptors and the kernel's TCP table).
fn client_ports_of(pid: u32, server_port: u16) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    l.to_str()?
                        .strip_prefix("socket:[")?
                        .strip_suffix(']')
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9
                && port(f[2]) == Some(server_port)
                && inodes.iter().any(|i| i == f[9])
                && let Some(local) = port(f[1])
            {
                ports.push(local);
            }
        }
    }
    ports
}
