//! Whether a configuration may be used: [`Config::validate`] checks every
//! value of every source, [`Config::validate_broker`] what only a command
//! that connects to the broker needs (files readable now, the stream port),
//! and [`Config::cautions`] names values that are allowed but unwise. Every
//! refusal is one line that starts with the key.

use std::time::Duration;

use super::{
    AmqpConfig, AmqpTlsConfig, Config, ConfigError, MAX_BATCH_SIZE, MAX_OUTBOX_TABLE_LEN, Pooler,
    fmt_duration, invalid, redact_url,
};
use crate::partitioner::{MAX_PARTITIONS, MIN_PARTITIONS};

impl Config {
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
    pub(super) fn validate_one(&self) -> Result<(), ConfigError> {
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
    fn a_refused_url_never_shows_its_password() {
        let e = problem("[database]\nurl = \"postgres://u:hunter2@h:notaport/db\"");
        assert!(!e.contains("hunter2"), "{e}");
    }
}
