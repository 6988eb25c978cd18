//! What the store is told: [`StoreSettings`], built once from the
//! configuration (the only place the store reads it), and the backend a
//! database URL names ([`BackendKind`]).

use std::time::Duration;

pub(crate) use crate::config::fmt_duration;
use crate::config::{Config, DatabaseConfig, Redacted, TablesConfig};

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Postgres,
    MySql,
    Sqlite,
}

impl BackendKind {
    /// The backend a database URL names, by its scheme.
    pub fn of_url(url: &str) -> Option<Self> {
        let scheme = url.split_once("://")?.0;
        match scheme {
            "postgres" | "postgresql" => Some(Self::Postgres),
            "mysql" | "mariadb" => Some(Self::MySql),
            "sqlite" => Some(Self::Sqlite),
            _ => None,
        }
    }

    /// How the database is called in messages.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Postgres => "PostgreSQL",
            BackendKind::MySql => "MySQL/MariaDB",
            BackendKind::Sqlite => "SQLite",
        }
    }

    /// The kind of TLS link its connections are (none for a file).
    pub fn tls_link(self) -> Option<crate::tls::Link> {
        match self {
            BackendKind::Postgres => Some(crate::tls::Link::Postgres),
            BackendKind::MySql => Some(crate::tls::Link::MySql),
            BackendKind::Sqlite => None,
        }
    }

    /// What a failed connection's message adds, for a database without a
    /// TLS link to explain.
    pub(crate) fn connect_advice(self) -> &'static str {
        match self {
            BackendKind::Sqlite => {
                " (its directory must exist and be writable: SQLite creates the file, and its -wal and -shm beside it)"
            }
            _ => "",
        }
    }
}

/// The configured table names the statements are rendered with (validated
/// identifiers: `config::validate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    pub outbox: String,
    pub partitions: String,
    pub workers: String,
}

impl Default for Tables {
    fn default() -> Self {
        Self::from(&TablesConfig::default())
    }
}

impl From<&TablesConfig> for Tables {
    fn from(t: &TablesConfig) -> Self {
        Self {
            outbox: t.outbox.clone(),
            partitions: t.partitions.clone(),
            workers: t.workers.clone(),
        }
    }
}

/// What sits between outboxd and the database (`database.pooler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// A direct connection, or a pooler in session mode.
    #[default]
    None,
    /// A pooler in transaction mode: no named prepared statements, every
    /// statement in a transaction of its own, no session state.
    Transaction,
}

/// Everything a store is told: the `database` section (see
/// `config::DatabaseConfig` for what each setting means) and the table
/// names.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub url: String,
    pub listen_url: String,
    pub pooler: Pooler,
    pub max_connections: u32,
    pub connect_timeout: Duration,
    pub query_timeout: Duration,
    pub dead_peer_timeout: Duration,
    pub poll_interval: Duration,
    pub probe_interval: Duration,
    pub tables: Tables,
}

impl StoreSettings {
    /// The store's settings of one configuration.
    pub fn from_config(config: &Config) -> Self {
        Self::of(&config.database, &config.tables)
    }

    /// The store's settings of a `database` section and table names.
    pub fn of(db: &DatabaseConfig, tables: &TablesConfig) -> Self {
        Self {
            url: db.url.clone(),
            listen_url: db.listen_url.clone(),
            pooler: match db.pooler {
                crate::config::Pooler::None => Pooler::None,
                crate::config::Pooler::Transaction => Pooler::Transaction,
            },
            max_connections: db.max_connections,
            connect_timeout: db.connect_timeout,
            query_timeout: db.query_timeout,
            dead_peer_timeout: db.dead_peer_timeout,
            poll_interval: db.poll_interval,
            probe_interval: db.probe_interval,
            tables: Tables::from(tables),
        }
    }

    /// The direct connection for `LISTEN`, when there is one.
    pub fn listen_url(&self) -> Option<&str> {
        Some(self.listen_url.trim()).filter(|u| !u.is_empty())
    }

    /// The default `database.query_timeout`.
    pub fn default_query_timeout() -> Duration {
        crate::config::DEFAULT_QUERY_TIMEOUT
    }
}

/// A URL as errors show it: redacted, and saying so when it is the built-in
/// default (nothing configured it).
pub(crate) fn shown(url: &str) -> String {
    if url == crate::config::DEFAULT_DATABASE_URL {
        format!(
            "{} (the built-in default: set DATABASE_URL, --database-url or database.url)",
            Redacted(url)
        )
    } else {
        Redacted(url).to_string()
    }
}

/// A URL as logs show it: its password redacted.
pub(crate) fn redacted(url: &str) -> Redacted<'_> {
    Redacted(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_scheme_chooses_the_backend() {
        for (url, kind) in [
            ("postgres://u@h/db", Some(BackendKind::Postgres)),
            ("postgresql://u@h/db", Some(BackendKind::Postgres)),
            ("mysql://u@h/db", Some(BackendKind::MySql)),
            ("mariadb://u@h/db", Some(BackendKind::MySql)),
            ("sqlite://x", Some(BackendKind::Sqlite)),
            ("not a url", None),
        ] {
            assert_eq!(BackendKind::of_url(url), kind, "{url}");
        }
    }
}
