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
//!
//! Here: the sections and their defaults, and reading a file and the
//! environment into them. Checking the values is [`validate`]; durations,
//! addresses and redacted URLs as text are [`values`]; `[[source]]`
//! entries are [`sources`].

pub mod env;
pub mod sources;
mod validate;
mod values;

pub use values::{Redacted, fmt_duration, parse_addr, parse_duration, redact_url};
use values::{de_addr, de_duration, de_opt_addr, ser_addr, ser_duration, ser_opt_addr};

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
}

fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn unknown_keys_and_bad_durations_are_refused_with_a_line_number() {
        let e = Config::from_toml("[outbox]\nbatch_sise = 5").unwrap_err();
        assert!(e.contains("line 2") && e.contains("batch_sise"), "{e}");
        let e = Config::from_toml("[worker]\n\nlease_ttl = \"15 parsecs\"").unwrap_err();
        assert!(e.contains("line 3") && e.contains("unknown unit"), "{e}");
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
