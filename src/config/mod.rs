//! Configuration: the typed form of `config/outboxd.toml`.
//!
//! Precedence, lowest first: the defaults below (`DEFAULT_*`), the TOML file,
//! the environment ([`env`](mod@env): `OUTBOXD_<SECTION>__<KEY>` for every
//! key, then `DATABASE_URL` / `AMQP_URL`), command-line flags. Nothing is
//! used before [`Config::validate`] has accepted it, and every refusal is
//! one line naming the key or the variable, e.g. `worker.lease_renew (15s)
//! must be shorter than worker.lease_ttl (15s)`. [`env::Provenance`] says
//! where each value came from.
//!
//! Durations are written as strings with a unit: `"250ms"`, `"15s"`, `"2m"`,
//! `"1h"`, `"7d"`, or combined (`"1h 30m"`), read by `humantime`.

pub mod env;
pub mod sources;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::partitioner::{MAX_PARTITIONS, MIN_PARTITIONS};

pub const DEFAULT_DATABASE_URL: &str = "postgres://outboxd@127.0.0.1:5432/outboxd";
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(5);
pub const DEFAULT_AMQP_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(10);
pub const DEFAULT_PARTITION_COUNT: u32 = 16;
pub const DEFAULT_BATCH_SIZE: u32 = 100;
pub const DEFAULT_STREAM_BATCH_SIZE: u32 = 1000;
pub const DEFAULT_CLAIM_TTL: Duration = Duration::from_secs(15);
pub const DEFAULT_IDLE_BACKOFF_MS: u64 = 1000;
pub const DEFAULT_RETRY_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_ATTEMPTS: u32 = 0;
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 16 * 1024 * 1024;
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 86_400);
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);
pub const DEFAULT_LEASE_RENEW: Duration = Duration::from_secs(6);
pub const DEFAULT_HEARTBEAT_TTL: Duration = Duration::from_secs(20);
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_BROKER_GRACE: Duration = Duration::from_secs(10);
pub const DEFAULT_THREADS: usize = 1;
pub const DEFAULT_OUTBOX_TABLE: &str = "outbox";
pub const DEFAULT_PARTITIONS_TABLE: &str = "outbox_partitions";
pub const DEFAULT_WORKERS_TABLE: &str = "outbox_workers";
pub const DEFAULT_DASHBOARD_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_DASHBOARD_PATH: &str = "/outbox";
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Largest batch a worker may claim at once.
pub const MAX_BATCH_SIZE: u32 = 10_000;
/// The outbox table name is a prefix of derived names (`<outbox>_enqueue`,
/// `<outbox>_pending_idx`, …), which must stay within PostgreSQL's 63 bytes.
pub const MAX_OUTBOX_TABLE_LEN: usize = 40;

/// A configuration problem, reported as one line naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("{key} {problem}")]
    Invalid { key: &'static str, problem: String },
    #[error("{0}")]
    Env(String),
    #[error("source {name}: {error}")]
    Source {
        name: String,
        error: Box<ConfigError>,
    },
}

fn invalid(key: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        problem: problem.into(),
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub database: DatabaseConfig,
    pub amqp: AmqpConfig,
    pub outbox: OutboxConfig,
    pub worker: WorkerConfig,
    pub tables: TablesConfig,
    pub dashboard: DashboardConfig,
    pub log: LogConfig,
    /// `[[source]]`: several outboxes ([`sources`]); none: the top level is
    /// the one source.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source: Vec<sources::SourceConfig>,
}

/// `[log]`: how the process logs (to stderr). Which lines is `OUTBOXD_LOG`
/// (an `EnvFilter`), not configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` (lines for people) or `json` (one object per line).
    pub format: LogFormat,
}

/// `log.format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[dashboard]`: the web monitor (`outboxd ui`, `outboxd work --ui`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardConfig {
    /// Address to bind; loopback unless deliberately opened.
    #[serde(deserialize_with = "de_addr", serialize_with = "ser_addr")]
    pub listen: SocketAddr,
    /// URL path prefix of the pages and the API.
    pub path: String,
    /// When set, every request but /healthz needs it (Bearer header or the
    /// login form's session cookie).
    pub token: String,
    /// Host names (besides IP addresses and `localhost`) the dashboard
    /// answers to in the `Host` header: a request naming another host is
    /// refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// How long a login form's session lasts.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub session_ttl: Duration,
    /// HTTPS on the dashboard's own listener: its certificate (chain) and
    /// key, PEM, both or neither (read at start-up).
    pub tls_cert_file: String,
    pub tls_key_file: String,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_DASHBOARD_LISTEN.parse().expect("a valid default"),
            path: DEFAULT_DASHBOARD_PATH.into(),
            token: String::new(),
            allowed_hosts: Vec::new(),
            session_ttl: DEFAULT_SESSION_TTL,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
        }
    }
}

/// `[database]`: the database holding the outbox, PostgreSQL,
/// MySQL/MariaDB or SQLite (by the URL's scheme).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// Connection URL; `DATABASE_URL` overrides it.
    pub url: String,
    /// Pool size of one worker process.
    pub max_connections: u32,
    /// Bound on establishing a connection and on acquiring one from the pool.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub connect_timeout: Duration,
    /// Bound on each statement a worker runs (client-side): a call that
    /// takes longer fails and is retried like a lost connection.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub query_timeout: Duration,
    /// A database connection whose peer acknowledges nothing for this long
    /// is declared dead (TCP keepalive and `TCP_USER_TIMEOUT`).
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub dead_peer_timeout: Duration,
    /// What sits between outboxd and the database: `none` (a direct
    /// connection, or a pooler in session mode) or `transaction` (a pooler
    /// in transaction mode, e.g. PgBouncer): no named prepared statements,
    /// every statement in a transaction of its own, no session state.
    pub pooler: Pooler,
    /// A direct connection to the database (bypassing the pooler), used
    /// for `LISTEN` and, behind a transaction pooler, for `outboxd
    /// migrate`. Empty: `LISTEN` on `url` — or, behind a transaction
    /// pooler, no `LISTEN` at all (workers poll).
    pub listen_url: String,
    /// How often a worker without working `LISTEN` wake-ups looks for new
    /// rows in the buckets it drains (one query for all of them); on
    /// MySQL/MariaDB the shortest delay of the adaptive poll.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub poll_interval: Duration,
    /// Between its polls, how often a polling worker probes for rows added
    /// since it last looked (one read of the primary key's newest entries)
    /// and wakes their buckets at once — while rows keep coming; while none
    /// do, the probe backs off to `poll_interval`. `0ms` turns it off.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub probe_interval: Duration,
}

/// `worker.assignment`: how buckets are spread over workers (the rules
/// are `coordinator::assignment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Assignment {
    #[default]
    Modulo,
    Sticky,
}

/// `database.pooler`: what the workers' connections go through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooler {
    /// A direct connection, or a pooler in session mode: one server
    /// session per client connection (`session` is accepted too).
    #[default]
    #[serde(alias = "session")]
    None,
    /// A pooler in transaction mode: consecutive transactions of one client
    /// connection may run on different server sessions.
    Transaction,
}

impl Pooler {
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::Transaction => "transaction",
        }
    }
}

/// `[amqp]`: the RabbitMQ broker messages are published to.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AmqpConfig {
    /// Connection URL, or several separated by commas (the nodes of a
    /// cluster, tried in turn); `AMQP_URL` overrides it.
    pub url: String,
    /// Bound on connecting to one node.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub connect_timeout: Duration,
    /// A broker connection whose peer acknowledges nothing for this long
    /// is declared dead (TCP keepalive and `TCP_USER_TIMEOUT`).
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub dead_peer_timeout: Duration,
    /// How long a batch may wait for its publisher confirms before the
    /// channel is dropped and the batch replayed.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub confirm_timeout: Duration,
    /// Ceiling of the exponential reconnect backoff.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub reconnect_backoff_max: Duration,
    /// `[amqp.tls]`: certificates for `amqps://` nodes (and for
    /// `rabbitmq-stream+tls://`).
    pub tls: AmqpTlsConfig,
    /// The stream port (`rabbitmq-stream://`, 5552; over TLS
    /// `rabbitmq-stream+tls://`, 5551); empty: no streams.
    pub stream_url: String,
    /// Streams rows are published to through the stream protocol: a row
    /// whose `exchange` is empty and whose `routing_key` is one of these
    /// goes to that stream, effectively once.
    pub streams: Vec<String>,
}

/// `[amqp.tls]`: PEM files for `amqps://` nodes, read again at every new
/// connection (so a rotated file is used from the next reconnect).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AmqpTlsConfig {
    /// CA certificate(s) the server's certificate must chain to; empty:
    /// the system's trusted roots.
    pub ca_file: String,
    /// Client certificate (chain) for mutual TLS; empty: none.
    pub cert_file: String,
    /// The client certificate's private key.
    pub key_file: String,
}

impl AmqpTlsConfig {
    /// The typed form the broker connection uses.
    pub fn client_tls(&self) -> crate::tls::AmqpTls {
        let path = |s: &str| Some(s.trim()).filter(|s| !s.is_empty()).map(Into::into);
        crate::tls::AmqpTls {
            files: crate::tls::TlsFiles {
                ca_file: path(&self.ca_file),
                cert_file: path(&self.cert_file),
                key_file: path(&self.key_file),
            },
        }
    }
}

/// `[outbox]`: how rows are drained.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    /// Number of buckets; must equal the count the database was migrated with.
    pub partition_count: u32,
    /// Rows claimed, published and recorded per round trip of one bucket.
    pub batch_size: u32,
    /// Rows claimed per round trip of one bucket while its rows go to
    /// streams: after a batch whose every row went to a stream, the next
    /// claim asks for this many (a drain into a stream is bound by the
    /// database's cost per statement, not by the broker).
    pub stream_batch_size: u32,
    /// How long a drainer's claim holds its bucket against other claimers
    /// after it was last written: taken, or renewed once less than
    /// `amqp.confirm_timeout` + 1 s is left (`RelaySettings::claim_min_left`);
    /// the claims in between write nothing.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub claim_ttl: Duration,
    /// How often a worker looks, in one query for all its buckets, for rows
    /// no wake-up announced while it sees traffic (where `LISTEN` works it
    /// backs off to 30 s while it sees none); what polling backs off to on
    /// a database without notifications.
    pub idle_backoff_ms: u64,
    /// First retry delay of a failing row; doubles per attempt.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub retry_backoff_initial: Duration,
    /// Longest retry delay of a failing row.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub retry_backoff: Duration,
    /// Park a row (`failed_at`) after this many failed attempts at publishing
    /// it; 0 retries forever.
    pub max_attempts: u32,
    /// Rows with a larger payload fail without being sent.
    pub max_payload_bytes: u64,
    /// Published rows older than this are deleted by the workers; "0s"
    /// keeps them forever.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub retention: Duration,
    /// Keep a published row (its `published_at` set) until `retention`
    /// purges it; `false` deletes it when its publish is recorded, in the
    /// same fenced statement: no history in the Published view, nothing to
    /// purge, less work per message.
    pub keep_published: bool,
}

/// `[worker]`: membership and leases (fleet mode).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The name this worker is shown by in its log lines, `outboxd status`
    /// and the dashboard; empty: `host:pid`.
    pub name: String,
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub lease_ttl: Duration,
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub lease_renew: Duration,
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub heartbeat_ttl: Duration,
    /// How long SIGTERM waits for in-flight batches before abandoning them.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub shutdown_timeout: Duration,
    /// A worker that has not reached the broker for this long gives its
    /// leases up and stays out of the fleet's targets until it reaches it
    /// again.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub broker_grace: Duration,
    /// How buckets are spread over workers: `modulo` or `sticky`.
    pub assignment: Assignment,
    /// Async runtime threads of one process; 0 = one per core. One is
    /// fastest where the database and the broker share the machine: the
    /// relay's work is hand-offs between tasks, and a second thread mostly
    /// adds cross-core wake-ups (measured in BENCHMARKS.md).
    pub threads: usize,
    /// Where this worker serves its probes (`/livez`, `/readyz`) and its
    /// own `/metrics`, without a token; empty: not served.
    #[serde(deserialize_with = "de_opt_addr", serialize_with = "ser_opt_addr")]
    pub health_listen: Option<SocketAddr>,
    /// With `[[source]]` entries: read the configuration again whenever its
    /// file's content changes (checked every 2 s), as on SIGHUP — for
    /// containers, where a mounted ConfigMap changes without a signal.
    pub reload_on_change: bool,
}

/// `[tables]`: names of the three tables (plain lower-case SQL identifiers).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TablesConfig {
    pub outbox: String,
    pub partitions: String,
    pub workers: String,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_DATABASE_URL.into(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            query_timeout: DEFAULT_QUERY_TIMEOUT,
            dead_peer_timeout: DEFAULT_DEAD_PEER_TIMEOUT,
            pooler: Pooler::None,
            listen_url: String::new(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            probe_interval: DEFAULT_PROBE_INTERVAL,
        }
    }
}

impl DatabaseConfig {
    /// The direct connection for `LISTEN`, when there is one.
    pub fn listen_url(&self) -> Option<&str> {
        Some(self.listen_url.trim()).filter(|u| !u.is_empty())
    }
}

impl Default for AmqpConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_AMQP_URL.into(),
            connect_timeout: DEFAULT_AMQP_CONNECT_TIMEOUT,
            dead_peer_timeout: DEFAULT_DEAD_PEER_TIMEOUT,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            reconnect_backoff_max: DEFAULT_RECONNECT_BACKOFF_MAX,
            tls: AmqpTlsConfig::default(),
            stream_url: String::new(),
            streams: Vec::new(),
        }
    }
}

impl AmqpConfig {
    /// The node URLs, in the order they are tried (`url` split at commas).
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.url.split(',').map(str::trim).filter(|u| !u.is_empty())
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            partition_count: DEFAULT_PARTITION_COUNT,
            batch_size: DEFAULT_BATCH_SIZE,
            stream_batch_size: DEFAULT_STREAM_BATCH_SIZE,
            claim_ttl: DEFAULT_CLAIM_TTL,
            idle_backoff_ms: DEFAULT_IDLE_BACKOFF_MS,
            retry_backoff_initial: DEFAULT_RETRY_BACKOFF_INITIAL,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            retention: DEFAULT_RETENTION,
            keep_published: true,
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            lease_ttl: DEFAULT_LEASE_TTL,
            lease_renew: DEFAULT_LEASE_RENEW,
            heartbeat_ttl: DEFAULT_HEARTBEAT_TTL,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            broker_grace: DEFAULT_BROKER_GRACE,
            assignment: Assignment::Modulo,
            threads: DEFAULT_THREADS,
            health_listen: None,
            reload_on_change: false,
        }
    }
}

impl Default for TablesConfig {
    fn default() -> Self {
        Self {
            outbox: DEFAULT_OUTBOX_TABLE.into(),
            partitions: DEFAULT_PARTITIONS_TABLE.into(),
            workers: DEFAULT_WORKERS_TABLE.into(),
        }
    }
}

impl Config {
    /// Reads a TOML file (all keys optional). Unknown keys are refused, so a
    /// typo never silently falls back to a default.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_file_text(path, &read_file(path)?)
    }

    /// [`Config::from_toml`] of a file's text, errors naming the file.
    fn from_file_text(path: &Path, text: &str) -> Result<Self, ConfigError> {
        Self::from_toml(text).map_err(|message| ConfigError::Parse {
            path: path.display().to_string(),
            message,
        })
    }

    /// Parses TOML text; the error is a single line.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| {
            // toml's messages span several lines with a source excerpt; keep
            // the line/column and the message.
            // Name the key of the offending line, never echo its value (it
            // may hold a password).
            let msg = e.message().trim().to_string();
            let Some(span) = e.span() else { return msg };
            let line_no = text[..span.start].matches('\n').count() + 1;
            let key = text
                .lines()
                .nth(line_no - 1)
                .and_then(|l| l.split_once('='))
                .map(|(k, _)| k.trim())
                .filter(|k| !k.is_empty() && !k.starts_with('['));
            match key {
                Some(key) => format!("line {line_no}, key {key}: {msg}"),
                None => format!("line {line_no}: {msg}"),
            }
        })
    }

    /// Defaults < the file (when given) < the environment; flags are the
    /// caller's to apply, and [`Config::validate`] after them.
    pub fn load(file: Option<&Path>) -> Result<(Self, env::Provenance), ConfigError> {
        // Variables that are not text cannot be configuration; skip them.
        let vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        Self::load_from(file, &vars)
    }

    fn load_from(
        file: Option<&Path>,
        vars: &[(String, String)],
    ) -> Result<(Self, env::Provenance), ConfigError> {
        let mut provenance = env::Provenance::default();
        let config = match file {
            Some(path) => {
                let text = read_file(path)?;
                let config = Self::from_file_text(path, &text)?;
                provenance.file = Some(path.display().to_string());
                env::record_file(&text, &mut provenance);
                config
            }
            None => Self::default(),
        };
        let config = config.with_env(vars, &mut provenance)?;
        Ok((config, provenance))
    }

    /// This configuration with the environment's values over it: every
    /// `OUTBOXD_<SECTION>__<KEY>` ([`env`](mod@env)), then `DATABASE_URL` and
    /// `AMQP_URL`, each also as `<NAME>_FILE`.
    pub fn with_env(
        &self,
        vars: &[(String, String)],
        provenance: &mut env::Provenance,
    ) -> Result<Self, ConfigError> {
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let mut config = env::apply(self, vars, &get, provenance)?;
        let aliases: [(&str, &str, &mut String); 2] = [
            ("DATABASE_URL", "database.url", &mut config.database.url),
            ("AMQP_URL", "amqp.url", &mut config.amqp.url),
        ];
        for (var, key, target) in aliases {
            if let Some(value) = env::value_or_file(var, &get)? {
                *target = value;
                let name = if get(var).is_some_and(|v| !v.is_empty()) {
                    var.to_string()
                } else {
                    format!("{var}_FILE")
                };
                provenance.set(key, env::Source::Env(name));
            }
        }
        Ok(config)
    }

    /// A configuration from a TOML table (the environment layer's merge);
    /// the error is one line.
    fn deserialize_table(table: toml::Table) -> Result<Self, String> {
        table
            .try_into()
            .map_err(|e: toml::de::Error| e.message().trim().replace('\n', " "))
    }

    /// Checks every value, every source's too; the first problem found is
    /// returned. What only a command that connects to the broker needs is
    /// checked apart, by [`Config::validate_broker`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_one()?;
        self.sources().map(drop)
    }

    /// What only a command that connects to the broker needs, for every
    /// source: the `[amqp.tls]` files readable now, and the stream port
    /// set when `amqp.streams` names streams. The dashboard, `migrate` and
    /// the other commands that only read or change the database run
    /// without them, so a deployment need not hand them the broker's
    /// secrets.
    pub fn validate_broker(&self) -> Result<(), ConfigError> {
        if self.source.is_empty() {
            return self.validate_broker_one();
        }
        for source in self.sources()? {
            source
                .config
                .validate_broker_one()
                .map_err(|e| ConfigError::Source {
                    name: source.name.clone(),
                    error: Box::new(e),
                })?;
        }
        Ok(())
    }

    fn validate_broker_one(&self) -> Result<(), ConfigError> {
        let files = self.amqp.tls.client_tls().files;
        let named = [
            ("amqp.tls.ca_file", &files.ca_file),
            ("amqp.tls.cert_file", &files.cert_file),
            ("amqp.tls.key_file", &files.key_file),
        ];
        for (key, path) in named {
            if let Some(path) = path {
                readable(key, &path.display().to_string())?;
            }
        }
        if !self.amqp.streams.is_empty() && self.amqp.stream_url.trim().is_empty() {
            return Err(invalid(
                "amqp.streams",
                format!(
                    "names {:?}, but amqp.stream_url is empty: set it to the broker's stream port, e.g. rabbitmq-stream://user:password@host:5552/",
                    self.amqp.streams
                ),
            ));
        }
        Ok(())
    }

    /// Values that are valid but cost what nobody would choose knowingly,
    /// a sentence each: `outboxd config` prints them and `outboxd work`
    /// logs them as warnings when it starts.
    pub fn cautions(&self) -> Vec<String> {
        let mut cautions = Vec::new();
        // A drainer holds its claim without writing it for `claim_ttl`
        // minus this (`RelaySettings::claim_min_left`).
        let renewed_within = self.amqp.confirm_timeout + Duration::from_secs(1);
        if self.outbox.claim_ttl <= renewed_within {
            cautions.push(format!(
                "outbox.claim_ttl ({}) is at most amqp.confirm_timeout + 1 s ({}): every claim writes its bucket's row; with a few seconds more a drainer claims without writing",
                fmt_duration(self.outbox.claim_ttl),
                fmt_duration(renewed_within)
            ));
        }
        cautions
    }

    /// Checks the values of this configuration, its sources aside.
    fn validate_one(&self) -> Result<(), ConfigError> {
        self.validate_connections()?;
        self.validate_outbox()?;
        self.validate_worker()?;
        self.validate_dashboard()?;
        self.validate_tables()
    }

    /// `[database]` and `[amqp]`: URLs, TLS files, pool size, timeouts.
    fn validate_connections(&self) -> Result<(), ConfigError> {
        let scheme = self.database.url.split_once("://").map(|(s, _)| s);
        if scheme == Some("sqlite") {
            validate_sqlite_url(&self.database.url)?;
        } else {
            validate_url(
                "database.url",
                &self.database.url,
                &["postgres", "postgresql", "mysql", "mariadb", "sqlite"],
            )?;
        }
        let postgres = !matches!(scheme, Some("mysql" | "mariadb" | "sqlite"));
        if let Some(url) = self.database.listen_url() {
            if !postgres {
                return Err(invalid(
                    "database.listen_url",
                    "is for PostgreSQL (LISTEN); MySQL/MariaDB and SQLite have no notifications and workers poll: leave it empty",
                ));
            }
            validate_url("database.listen_url", url, &["postgres", "postgresql"])?;
        }
        if !postgres && self.database.pooler == Pooler::Transaction {
            return Err(invalid(
                "database.pooler",
                "= \"transaction\" is for PostgreSQL behind a pooler such as PgBouncer; with MySQL/MariaDB or SQLite leave it \"none\"",
            ));
        }
        positive("database.poll_interval", self.database.poll_interval)?;
        if self.amqp.urls().next().is_none() {
            return Err(invalid("amqp.url", "is empty"));
        }
        for url in self.amqp.urls() {
            validate_url("amqp.url", url, &["amqp", "amqps"])?;
        }
        validate_amqp_tls(&self.amqp.tls)?;
        validate_streams(&self.amqp)?;
        if self.database.max_connections < 2 {
            return Err(invalid(
                "database.max_connections",
                format!("({}) must be at least 2", self.database.max_connections),
            ));
        }
        positive("database.connect_timeout", self.database.connect_timeout)?;
        positive("database.query_timeout", self.database.query_timeout)?;
        positive(
            "database.dead_peer_timeout",
            self.database.dead_peer_timeout,
        )?;
        positive("amqp.connect_timeout", self.amqp.connect_timeout)?;
        positive("amqp.dead_peer_timeout", self.amqp.dead_peer_timeout)?;
        positive("amqp.confirm_timeout", self.amqp.confirm_timeout)?;
        positive(
            "amqp.reconnect_backoff_max",
            self.amqp.reconnect_backoff_max,
        )?;
        Ok(())
    }

    /// `[outbox]`.
    fn validate_outbox(&self) -> Result<(), ConfigError> {
        let o = &self.outbox;
        if !(MIN_PARTITIONS..=MAX_PARTITIONS).contains(&o.partition_count) {
            return Err(invalid(
                "outbox.partition_count",
                format!(
                    "({}) must be between {MIN_PARTITIONS} and {MAX_PARTITIONS}",
                    o.partition_count
                ),
            ));
        }
        for (key, size) in [
            ("outbox.batch_size", o.batch_size),
            ("outbox.stream_batch_size", o.stream_batch_size),
        ] {
            if !(1..=MAX_BATCH_SIZE).contains(&size) {
                return Err(invalid(
                    key,
                    format!("({size}) must be between 1 and {MAX_BATCH_SIZE}"),
                ));
            }
        }
        positive("outbox.claim_ttl", o.claim_ttl)?;
        if o.claim_ttl <= self.amqp.confirm_timeout {
            return Err(invalid(
                "outbox.claim_ttl",
                format!(
                    "({}) must be longer than amqp.confirm_timeout ({}), or a claim could lapse while its batch is still awaiting confirms",
                    fmt_duration(o.claim_ttl),
                    fmt_duration(self.amqp.confirm_timeout)
                ),
            ));
        }
        if o.idle_backoff_ms == 0 {
            return Err(invalid("outbox.idle_backoff_ms", "must be at least 1"));
        }
        positive("outbox.retry_backoff_initial", o.retry_backoff_initial)?;
        if o.retry_backoff < o.retry_backoff_initial {
            return Err(invalid(
                "outbox.retry_backoff",
                format!(
                    "({}) must not be shorter than outbox.retry_backoff_initial ({})",
                    fmt_duration(o.retry_backoff),
                    fmt_duration(o.retry_backoff_initial)
                ),
            ));
        }
        if o.max_payload_bytes == 0 {
            return Err(invalid("outbox.max_payload_bytes", "must be at least 1"));
        }
        Ok(())
    }

    /// `[worker]`.
    fn validate_worker(&self) -> Result<(), ConfigError> {
        let w = &self.worker;
        if w.name.chars().count() > 100 || w.name.chars().any(char::is_control) {
            return Err(invalid(
                "worker.name",
                "must be at most 100 characters, none of them a control character",
            ));
        }
        positive("worker.lease_ttl", w.lease_ttl)?;
        positive("worker.lease_renew", w.lease_renew)?;
        if w.lease_renew >= w.lease_ttl {
            return Err(invalid(
                "worker.lease_renew",
                format!(
                    "({}) must be shorter than worker.lease_ttl ({})",
                    fmt_duration(w.lease_renew),
                    fmt_duration(w.lease_ttl)
                ),
            ));
        }
        positive("worker.heartbeat_ttl", w.heartbeat_ttl)?;
        positive("worker.shutdown_timeout", w.shutdown_timeout)?;
        positive("worker.broker_grace", w.broker_grace)?;
        if w.threads > 256 {
            return Err(invalid(
                "worker.threads",
                format!("({}) must be at most 256 (0 = one per core)", w.threads),
            ));
        }
        Ok(())
    }

    /// `[dashboard]`.
    fn validate_dashboard(&self) -> Result<(), ConfigError> {
        let d = &self.dashboard;
        let path_ok = d.path.starts_with('/')
            && d.path.len() > 1
            && !d.path.ends_with('/')
            && d.path[1..].split('/').all(|seg| {
                !seg.is_empty()
                    && seg
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            });
        if !path_ok {
            return Err(invalid(
                "dashboard.path",
                format!(
                    "('{}') must look like /outbox: a leading slash, no trailing slash, letters, digits, - and _",
                    d.path
                ),
            ));
        }
        if !d.token.is_empty() && d.token.len() < 16 {
            return Err(invalid(
                "dashboard.token",
                "must be at least 16 characters (or empty to disable)",
            ));
        }
        positive("dashboard.session_ttl", d.session_ttl)?;
        if let Some(bad) = d.allowed_hosts.iter().find(|h| {
            h.is_empty()
                || !h
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c))
        }) {
            return Err(invalid(
                "dashboard.allowed_hosts",
                format!(
                    "('{bad}') must hold host names like outboxd.example.com (no port, no scheme)"
                ),
            ));
        }
        match (
            d.tls_cert_file.trim().is_empty(),
            d.tls_key_file.trim().is_empty(),
        ) {
            (false, true) => {
                return Err(invalid(
                    "dashboard.tls_key_file",
                    "is empty, but dashboard.tls_cert_file is set: HTTPS needs both",
                ));
            }
            (true, false) => {
                return Err(invalid(
                    "dashboard.tls_cert_file",
                    "is empty, but dashboard.tls_key_file is set: HTTPS needs both",
                ));
            }
            _ => {}
        }
        for (key, path) in [
            ("dashboard.tls_cert_file", d.tls_cert_file.trim()),
            ("dashboard.tls_key_file", d.tls_key_file.trim()),
        ] {
            readable(key, path)?;
        }
        Ok(())
    }

    /// `[tables]`: three different valid identifiers.
    fn validate_tables(&self) -> Result<(), ConfigError> {
        validate_identifier("tables.outbox", &self.tables.outbox, MAX_OUTBOX_TABLE_LEN)?;
        validate_identifier("tables.partitions", &self.tables.partitions, 63)?;
        validate_identifier("tables.workers", &self.tables.workers, 63)?;
        let t = &self.tables;
        if t.outbox == t.partitions || t.outbox == t.workers || t.partitions == t.workers {
            return Err(invalid(
                "tables",
                "outbox, partitions and workers must be three different names",
            ));
        }
        Ok(())
    }
}

fn positive(key: &'static str, d: Duration) -> Result<(), ConfigError> {
    if d.is_zero() {
        return Err(invalid(key, "must be longer than 0"));
    }
    Ok(())
}

/// `sqlite://path`: a file (relative to the working directory, or
/// absolute as `sqlite:///abs/path`), with sqlx's options after `?`.
fn validate_sqlite_url(raw: &str) -> Result<(), ConfigError> {
    let path = raw.trim_start_matches("sqlite://");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if path.is_empty() || path == ":memory:" {
        return Err(invalid(
            "database.url",
            format!(
                "({}) must name a database file, e.g. sqlite://outbox.db or sqlite:///var/lib/app/outbox.db (the fleet's workers share it)",
                redact_url(raw)
            ),
        ));
    }
    Ok(())
}

fn validate_url(key: &'static str, raw: &str, schemes: &[&str]) -> Result<(), ConfigError> {
    let url = url::Url::parse(raw).map_err(|e| {
        invalid(
            key,
            format!("is not a valid URL ({e}): {}", redact_url(raw)),
        )
    })?;
    if !schemes.contains(&url.scheme()) {
        return Err(invalid(
            key,
            format!(
                "has scheme '{}', expected {}",
                url.scheme(),
                schemes.join(" or ")
            ),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(key, format!("has no host: {}", redact_url(raw))));
    }
    Ok(())
}

/// `amqp.stream_url` and `amqp.streams`: a stream name is named once and
/// is a valid name (that streams need the stream port is
/// [`Config::validate_broker`]'s).
fn validate_streams(amqp: &AmqpConfig) -> Result<(), ConfigError> {
    let url = amqp.stream_url.trim();
    if !url.is_empty() {
        validate_url(
            "amqp.stream_url",
            url,
            &["rabbitmq-stream", "rabbitmq-stream+tls"],
        )?;
    }
    for (i, name) in amqp.streams.iter().enumerate() {
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(invalid(
                "amqp.streams",
                format!("has an invalid stream name {name:?}"),
            ));
        }
        if amqp.streams[..i].contains(name) {
            return Err(invalid("amqp.streams", format!("names {name:?} twice")));
        }
    }
    Ok(())
}

/// The `[amqp.tls]` files: a certificate needs its key (that every file
/// named is readable now is [`Config::validate_broker`]'s; each is read
/// again at every connect).
fn validate_amqp_tls(tls: &AmqpTlsConfig) -> Result<(), ConfigError> {
    let files = tls.client_tls().files;
    match (&files.cert_file, &files.key_file) {
        (Some(_), None) => {
            return Err(invalid(
                "amqp.tls.key_file",
                "is empty, but amqp.tls.cert_file is set: a client certificate needs its key",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "amqp.tls.cert_file",
                "is empty, but amqp.tls.key_file is set: a key needs its client certificate",
            ));
        }
        _ => {}
    }
    Ok(())
}

fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// A file named by `key` (empty: none) can be opened now.
fn readable(key: &'static str, path: &str) -> Result<(), ConfigError> {
    if path.is_empty() {
        return Ok(());
    }
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| invalid(key, format!("({path}): cannot read: {e}")))
}

/// Plain, unquoted, lower-case SQL identifiers only: they are spliced into
/// SQL text (table names cannot be bind parameters), so anything else is
/// refused rather than quoted.
fn validate_identifier(key: &'static str, name: &str, max_len: usize) -> Result<(), ConfigError> {
    let ok_first = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let ok_rest = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok_first || !ok_rest || name.len() > max_len {
        return Err(invalid(
            key,
            format!(
                "('{name}') must be a lower-case SQL identifier: a-z, 0-9 and _, not starting with a digit, at most {max_len} characters"
            ),
        ));
    }
    Ok(())
}

/// A URL (or a comma-separated list of them) with every password replaced
/// by `***`, for logs, errors and pages.
pub fn redact_url(raw: &str) -> String {
    if raw.contains(',') && raw.matches("://").count() > 1 {
        return raw
            .split(',')
            .map(|u| redact_one(u.trim()))
            .collect::<Vec<_>>()
            .join(",");
    }
    redact_one(raw)
}

fn redact_one(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some("***"));
            }
            url.to_string()
        }
        // Unparsable: echo it only when it cannot hold a secret (a single
        // word, no user-info separators); else only its scheme.
        Err(_) if !raw.contains(['@', ':']) && !raw.contains(char::is_whitespace) => {
            raw.to_string()
        }
        // A URL that does not parse (a bad port, say) is shown with only its
        // password masked, so the user can see what is wrong with the rest.
        Err(_) => match raw.find("://") {
            Some(i) => format!("{}://{}", &raw[..i], mask_password(&raw[i + 3..])),
            None => "***".into(),
        },
    }
}

/// `user:password@host…` (the part of a URL after `scheme://`) with the
/// password replaced by `***`; what cannot hold a password is kept.
fn mask_password(rest: &str) -> String {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = authority.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _password)) => format!("{user}:***{host}{tail}"),
                None => rest.to_string(),
            }
        }
        None if authority.contains(char::is_whitespace) => "***".into(),
        None => rest.to_string(),
    }
}

/// A URL that prints redacted.
pub struct Redacted<'a>(pub &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(self.0))
    }
}

/// Parses a duration with its unit — `"250ms"`, `"15s"`, `"2m"`, `"1h"`,
/// `"7d"`, or combined, `"1h 30m"` — as `humantime` reads it, with the
/// refusal worded for the configuration's reader.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    use humantime::DurationError;
    let s = s.trim();
    humantime::parse_duration(s).map_err(|e| match e {
        DurationError::Empty => "no duration given (use ms, s, m, h or d, as in 15s)".to_string(),
        DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
            format!("'{s}' has no unit (use ms, s, m, h or d)")
        }
        DurationError::UnknownUnit { unit, .. } => {
            format!("'{s}' has unknown unit '{unit}' (use ms, s, m, h or d)")
        }
        DurationError::NumberOverflow => format!("'{s}' is too long"),
        _ => format!("'{s}' is not a duration like 500ms, 15s, 2m, 1h, 7d"),
    })
}

/// Formats a duration the way the config file writes it: one whole unit
/// (`"7d"`, `"90m"`, `"250ms"`), or `humantime`'s form below a millisecond.
pub fn fmt_duration(d: Duration) -> String {
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return humantime::format_duration(d).to_string();
    }
    let ms = d.as_millis();
    if ms > 0 && ms.is_multiple_of(86_400_000) {
        format!("{}d", ms / 86_400_000)
    } else if ms > 0 && ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms > 0 && ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&fmt_duration(*d))
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

/// Parses a listen address (`host:port`, an IP address).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("'{s}' must be an address like 127.0.0.1:8080"))
}

fn ser_addr<S: Serializer>(a: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&a.to_string())
}

fn de_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    parse_addr(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

/// An optional address is written as the empty string when unset.
fn ser_opt_addr<S: Serializer>(a: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&a.map(|a| a.to_string()).unwrap_or_default())
}

fn de_opt_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    match s.trim() {
        "" => Ok(None),
        s => parse_addr(s).map(Some).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(toml: &str) -> String {
        let cfg = Config::from_toml(toml).expect("parses");
        cfg.validate()
            .and_then(|()| cfg.validate_broker())
            .expect_err("must be refused")
            .to_string()
    }

    #[test]
    fn defaults_are_valid_and_match_the_spec() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.outbox.partition_count, 16);
        assert_eq!(c.worker.lease_ttl, Duration::from_secs(15));
        assert_eq!(c.worker.lease_renew, Duration::from_secs(6));
        assert_eq!(c.worker.heartbeat_ttl, Duration::from_secs(20));
        assert_eq!(c.outbox.batch_size, 100);
        assert_eq!(c.outbox.idle_backoff_ms, 1000);
        assert_eq!(c.outbox.claim_ttl, Duration::from_secs(15));
        assert_eq!(c.outbox.retry_backoff, Duration::from_secs(60));
    }

    #[test]
    fn a_claim_ttl_that_leaves_no_claim_unwritten_is_a_caution() {
        assert_eq!(Config::default().cautions(), Vec::<String>::new());
        let cfg = Config::from_toml("[outbox]\nclaim_ttl = \"11s\"").unwrap();
        cfg.validate().unwrap();
        let cautions = cfg.cautions();
        assert_eq!(cautions.len(), 1, "{cautions:?}");
        assert!(
            cautions[0]
                .starts_with("outbox.claim_ttl (11s) is at most amqp.confirm_timeout + 1 s (11s)"),
            "{cautions:?}"
        );
        let cfg = Config::from_toml("[outbox]\nclaim_ttl = \"12s\"").unwrap();
        assert_eq!(cfg.cautions(), Vec::<String>::new());
    }

    #[test]
    fn shipped_config_file_parses_to_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/outboxd.toml");
        let file = Config::from_file(&path).unwrap();
        let def = Config::default();
        file.validate().unwrap();
        // Debug output covers every field; the file documents the defaults.
        let strip_urls = |c: &Config| {
            let mut c = c.clone();
            c.database.url.clear();
            c.amqp.url.clear();
            format!("{c:?}")
        };
        assert_eq!(strip_urls(&file), strip_urls(&def));
    }

    #[test]
    fn each_invalid_value_names_its_key() {
        assert!(
            problem("[worker]\nlease_renew = \"15s\"").starts_with(
                "worker.lease_renew (15s) must be shorter than worker.lease_ttl (15s)"
            )
        );
        assert!(problem("[outbox]\nbatch_size = 0").starts_with("outbox.batch_size"));
        assert!(
            problem("[outbox]\nstream_batch_size = 10001").starts_with("outbox.stream_batch_size")
        );
        assert!(problem("[worker]\nname = \"a\\nb\"").starts_with("worker.name"));
        assert!(problem("[outbox]\npartition_count = 0").starts_with("outbox.partition_count"));
        assert!(problem("[tables]\noutbox = \"drop table x;\"").starts_with("tables.outbox"));
        assert!(problem("[tables]\nworkers = \"Outbox\"").starts_with("tables.workers"));
        assert!(problem("[database]\nurl = \"not a url\"").starts_with("database.url"));
        assert!(problem("[amqp]\nurl = \"http://x\"").starts_with("amqp.url has scheme 'http'"));
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_refused_with_a_line_number() {
        let e = Config::from_toml("[outbox]\nbatch_sise = 5").unwrap_err();
        assert!(e.contains("line 2") && e.contains("batch_sise"), "{e}");
        let e = Config::from_toml("[worker]\n\nlease_ttl = \"15 parsecs\"").unwrap_err();
        assert!(e.contains("line 3") && e.contains("unknown unit"), "{e}");
    }

    #[test]
    fn mysql_urls_are_accepted_and_postgresql_only_keys_refused_with_them() {
        for url in ["mysql://u:pw@h:3306/app", "mariadb://u@h/app"] {
            let c = Config::from_toml(&format!("[database]\nurl = \"{url}\"")).unwrap();
            c.validate().unwrap();
        }
        let e = problem("[database]\nurl = \"mysql://u@h/app\"\npooler = \"transaction\"");
        assert!(e.starts_with("database.pooler"), "{e}");
        let e = problem("[database]\nurl = \"mysql://u@h/app\"\nlisten_url = \"postgres://h/app\"");
        assert!(e.starts_with("database.listen_url"), "{e}");
        let e = problem("[database]\nurl = \"oracle://h/app\"");
        assert!(
            e.contains("expected postgres or postgresql or mysql or mariadb or sqlite"),
            "{e}"
        );
    }

    #[test]
    fn sqlite_urls_name_a_file_and_postgresql_only_keys_are_refused_with_them() {
        for url in [
            "sqlite://outbox.db",
            "sqlite:///var/lib/app/app.db",
            "sqlite://app.db?mode=rw",
        ] {
            let c = Config::from_toml(&format!("[database]\nurl = \"{url}\"")).unwrap();
            c.validate().unwrap();
        }
        for url in ["sqlite://", "sqlite://:memory:", "sqlite://?mode=rw"] {
            let e = problem(&format!("[database]\nurl = \"{url}\""));
            assert!(e.contains("must name a database file"), "{url}: {e}");
        }
        let e = problem("[database]\nurl = \"sqlite://app.db\"\npooler = \"transaction\"");
        assert!(e.starts_with("database.pooler"), "{e}");
        let e = problem("[database]\nurl = \"sqlite://app.db\"\nlisten_url = \"postgres://h/app\"");
        assert!(e.starts_with("database.listen_url"), "{e}");
    }

    /// `with_env` over `config` with `vars`.
    fn with_vars(config: &Config, vars: &[(&str, String)]) -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        config.with_env(&vars, &mut env::Provenance::default())
    }

    #[test]
    fn env_overrides_file() {
        let c = Config::from_toml("[database]\nurl = \"postgres://file/x\"").unwrap();
        let c = with_vars(&c, &[("DATABASE_URL", "postgres://env/y".into())]).unwrap();
        assert_eq!(c.database.url, "postgres://env/y");
        assert_eq!(c.amqp.url, DEFAULT_AMQP_URL);
    }

    #[test]
    fn secrets_come_from_files_without_their_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("outboxd-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url_file = dir.join("amqp_url");
        std::fs::write(&url_file, "amqps://u:pw@broker:5671/%2f\n").unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "0123456789abcdef0123\r\n").unwrap();
        let c = with_vars(
            &Config::default(),
            &[
                ("AMQP_URL_FILE", url_file.display().to_string()),
                (
                    "OUTBOXD_DASHBOARD__TOKEN_FILE",
                    token_file.display().to_string(),
                ),
            ],
        )
        .unwrap();
        assert_eq!(c.amqp.url, "amqps://u:pw@broker:5671/%2f");
        assert_eq!(c.dashboard.token, "0123456789abcdef0123");
        c.validate().unwrap();

        let e = with_vars(
            &Config::default(),
            &[("DATABASE_URL_FILE", "/nonexistent/db-url".into())],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("DATABASE_URL_FILE: cannot read /nonexistent/db-url"),
            "{e}"
        );
        let e = with_vars(
            &Config::default(),
            &[
                ("DATABASE_URL", "x".into()),
                ("DATABASE_URL_FILE", "x".into()),
            ],
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "both DATABASE_URL and DATABASE_URL_FILE are set: set one of them"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn amqps_urls_are_accepted_and_tls_files_checked() {
        let c =
            Config::from_toml("[amqp]\nurl = \"amqps://u:pw@h1/%2f,amqps://u:pw@h2/%2f\"").unwrap();
        c.validate().unwrap();
        let e = problem("[amqp.tls]\ncert_file = \"/etc/hostname\"");
        assert!(e.starts_with("amqp.tls.key_file is empty"), "{e}");
        let e = problem("[amqp.tls]\nca_file = \"/nonexistent/ca.pem\"");
        assert!(
            e.starts_with("amqp.tls.ca_file (/nonexistent/ca.pem): cannot read"),
            "{e}"
        );
    }

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(
            parse_duration(" 1h 30m ").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            parse_duration("15").unwrap_err(),
            "'15' has no unit (use ms, s, m, h or d)"
        );
        assert_eq!(
            parse_duration("15 parsecs").unwrap_err(),
            "'15 parsecs' has unknown unit 'parsecs' (use ms, s, m, h or d)"
        );
        assert!(
            parse_duration("-1s")
                .unwrap_err()
                .contains("is not a duration")
        );
        assert!(parse_duration("").is_err());
        assert_eq!(fmt_duration(Duration::from_secs(90)), "90s");
        assert_eq!(fmt_duration(Duration::from_secs(120)), "2m");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(fmt_duration(Duration::from_micros(500)), "500us");
        for text in ["250ms", "15s", "2m", "1h", "7d", "1500ms", "500us"] {
            assert_eq!(fmt_duration(parse_duration(text).unwrap()), text);
        }
    }

    #[test]
    fn several_amqp_urls_are_nodes_of_one_cluster() {
        let c =
            Config::from_toml("[amqp]\nurl = \"amqp://u:pw@h1:5672/%2f, amqp://u:pw@h2:5672/%2f\"")
                .unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.amqp.urls().collect::<Vec<_>>(),
            ["amqp://u:pw@h1:5672/%2f", "amqp://u:pw@h2:5672/%2f"]
        );
        assert_eq!(
            redact_url(&c.amqp.url),
            "amqp://u:***@h1:5672/%2f,amqp://u:***@h2:5672/%2f"
        );
        assert!(
            problem("[amqp]\nurl = \"amqp://h1/%2f,http://h2\"")
                .starts_with("amqp.url has scheme 'http'")
        );
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("amqp://guest@h/%2f"), "amqp://guest@h/%2f");
        assert!(!redact_url("postgres://u:sec ret@h:bad port").contains("sec"));
        // Unparsable, yet everything but the password is shown.
        assert_eq!(
            redact_url("postgres://u:hunter2@db.example:99999/app"),
            "postgres://u:***@db.example:99999/app"
        );
        let e = problem("[database]\nurl = \"postgres://u:hunter2@h:notaport/db\"");
        assert!(!e.contains("hunter2"), "{e}");
        // A value that cannot hold a password is shown as it is.
        assert_eq!(redact_url("not-a-url"), "not-a-url");
        assert_eq!(redact_url("not a url hunter2"), "***");
    }

    #[test]
    fn the_configuration_prints_as_toml_that_reads_back_the_same() {
        let text = "[database]\nurl = \"postgres://u@db:6432/app\"\npooler = \"transaction\"\n\
                    query_timeout = \"2500ms\"\n[outbox]\nretention = \"7d\"\n\
                    [worker]\nassignment = \"sticky\"\nlease_ttl = \"1m\"\n";
        let config = Config::from_toml(text).unwrap();
        let printed = toml::to_string(&config).unwrap();
        let again = Config::from_toml(&printed).unwrap();
        assert_eq!(format!("{config:?}"), format!("{again:?}"), "{printed}");
        assert!(printed.contains("query_timeout = \"2500ms\""), "{printed}");
        assert!(printed.contains("retention = \"7d\""), "{printed}");
    }
}
