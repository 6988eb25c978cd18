//! PgBouncer and streaming replicas for the pooler and switchover tests,
//! started by `scripts/services.sh` like the other private services.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use outboxd::config::{DatabaseConfig, Pooler};
use outboxd::store::StoreSettings;
use outboxd::store::postgres::DbPool;

use super::{PrivatePostgres, repo_dir, unique};

/// A private PgBouncer in transaction mode (Debian's package), in front of
/// one PostgreSQL server; removed on drop.
pub struct PgBouncer {
    pub dir: PathBuf,
    pub port: u16,
    /// The address it listens on.
    pub listen: String,
}

impl PgBouncer {
    /// A PgBouncer on loopback in front of `host:port`.
    pub fn start(host: &str, port: u16) -> Self {
        Self::start_on("127.0.0.1", host, port)
    }

    /// A PgBouncer listening on `listen` (a test network's gateway) in
    /// front of `host:port`.
    pub fn start_on(listen: &str, host: &str, port: u16) -> Self {
        let bouncer_port = super::free_port_pair(|| 30000 + 2 * (super::rand_u16() % 1000));
        let dir =
            PathBuf::from(std::env::var("OUTBOXD_STATE_DIR").unwrap_or_else(|_| "/tmp".into()))
                .join(unique("pgbouncer"));
        let b = Self {
            dir,
            port: bouncer_port,
            listen: listen.to_string(),
        };
        b.run("start", host, port);
        b
    }

    /// Stops it (clients' connections drop; nothing answers on its port).
    pub fn stop(&self) {
        self.services("stop", &[]);
    }

    /// Starts it again in front of `host:port`.
    pub fn restart(&self, host: &str, port: u16) {
        self.run("start", host, port);
    }

    /// The URL of database `db` through this PgBouncer.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://outboxd:outboxd@{}:{}/{db}",
            self.listen, self.port
        )
    }

    /// A URL without a database name (for [`super::Tuning::pooler_url`]).
    pub fn base_url(&self) -> String {
        self.url("")
    }

    /// Points it at another server and `RELOAD`s (what an operator or a
    /// failover tool does after promoting a replica).
    pub fn repoint(&self, host: &str, port: u16) {
        self.run("repoint", host, port);
    }

    fn run(&self, action: &str, host: &str, port: u16) {
        let rest = [self.port.to_string(), host.to_string(), port.to_string()];
        assert!(
            self.services(action, &rest),
            "services.sh pgbouncer {action} failed"
        );
    }

    /// `services.sh pgbouncer ACTION DIR REST…`, listening on `listen`.
    fn services(&self, action: &str, rest: &[String]) -> bool {
        Command::new("bash")
            .arg(repo_dir().join("scripts/services.sh"))
            .args(["pgbouncer", action])
            .arg(&self.dir)
            .args(rest)
            .env("OUTBOXD_LISTEN", &self.listen)
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivatePostgres {
    /// A streaming replica of `primary` (pg_basebackup), running.
    pub fn standby_of(primary: &PrivatePostgres) -> Self {
        let pg = Self::unstarted(&primary.host);
        pg.run(&["standby", &primary.host, &primary.port.to_string()]);
        pg
    }

    /// Promotes this replica to primary.
    pub fn promote(&self) {
        self.run(&["promote"]);
    }

    /// The URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://outboxd:outboxd@{}:{}/{db}",
            self.host, self.port
        )
    }
}

/// A pool for a producer behind a transaction pooler: outboxd's own
/// [`DbPool`], whose transactions prepare no named statement.
pub async fn pooled(url: &str) -> DbPool {
    let db = DatabaseConfig {
        url: url.to_string(),
        pooler: Pooler::Transaction,
        max_connections: 10,
        ..DatabaseConfig::default()
    };
    let settings = StoreSettings::of(&db, &Default::default());
    outboxd::store::postgres::pool::connect(&settings, "outboxd test producer")
        .await
        .expect("connect through the pooler")
}
