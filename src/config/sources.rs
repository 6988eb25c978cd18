//! `[[source]]`: the outboxes one worker serves — each a database (its own
//! outbox, partitions and workers tables, so its own fleet and bucket
//! space), optionally its own broker and any `[database]`, `[amqp]`,
//! `[outbox]`, `[worker]` or `[tables]` key it sets differently.
//!
//! A source's configuration is the top level with the source's keys over
//! it, validated as a whole ([`Config::sources`]); a problem is one line
//! naming the source. Without `[[source]]` entries the top level is the one
//! source, named [`DEFAULT_SOURCE`]. What belongs to the process and not to
//! a source (`worker.name`, `worker.threads`, `worker.health_listen`,
//! `[dashboard]`, `[log]`) is refused inside a source.

use serde::{Deserialize, Serialize};

use super::{Config, ConfigError, Pooler};

/// The name of the one source of a configuration without `[[source]]`.
pub const DEFAULT_SOURCE: &str = "default";

/// Longest source name (it names log lines, metrics and URLs).
const MAX_NAME_LEN: usize = 40;

/// Keys of `[worker]` that are the process's, not a source's.
const PROCESS_WORKER_KEYS: [&str; 4] = ["name", "threads", "health_listen", "reload_on_change"];

/// One `[[source]]` entry as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Lower-case letters, digits, `-` and `_`; unique.
    pub name: String,
    /// Its database (`database.url`).
    pub url: String,
    /// `database.listen_url` (PostgreSQL behind a pooler).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub listen_url: String,
    /// `database.pooler`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooler: Option<Pooler>,
    /// `outbox.partition_count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_count: Option<u32>,
    /// Keys of these sections it sets differently from the top level.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub database: toml::Table,
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub amqp: toml::Table,
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub outbox: toml::Table,
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub worker: toml::Table,
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub tables: toml::Table,
}

/// A source, with its whole configuration.
#[derive(Debug, Clone)]
pub struct Source {
    pub name: String,
    pub config: Config,
}

impl Config {
    /// Every source, each with its configuration, checked; the top level
    /// as [`DEFAULT_SOURCE`] when there are no `[[source]]` entries.
    pub fn sources(&self) -> Result<Vec<Source>, ConfigError> {
        if self.source.is_empty() {
            return Ok(vec![Source {
                name: DEFAULT_SOURCE.into(),
                config: self.clone(),
            }]);
        }
        let mut out: Vec<Source> = Vec::new();
        for entry in &self.source {
            let config = self.source_config(entry).map_err(|e| ConfigError::Source {
                name: entry.name.clone(),
                error: Box::new(e),
            })?;
            if out.iter().any(|s| s.name == entry.name) {
                return Err(ConfigError::Env(format!(
                    "source {} is named twice: source names must be unique",
                    entry.name
                )));
            }
            out.push(Source {
                name: entry.name.clone(),
                config,
            });
        }
        Ok(out)
    }

    /// The configuration of the source named `name` (the only one when
    /// `None` and there is one). For the commands that act on one source.
    pub fn for_source(&self, name: Option<&str>) -> Result<Config, ConfigError> {
        let sources = self.sources()?;
        let names = || {
            sources
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match name {
            Some(name) => match sources.iter().find(|s| s.name == name) {
                Some(s) => Ok(s.config.clone()),
                None => Err(ConfigError::Env(format!(
                    "--source {name}: no such source (configured: {})",
                    names()
                ))),
            },
            None if sources.len() == 1 => Ok(sources[0].config.clone()),
            None => Err(ConfigError::Env(format!(
                "several sources are configured ({}): name one with --source NAME",
                names()
            ))),
        }
    }

    /// The top level with `entry`'s keys over it, validated.
    fn source_config(&self, entry: &SourceConfig) -> Result<Config, ConfigError> {
        check_name(&entry.name)?;
        if let Some(key) = PROCESS_WORKER_KEYS
            .iter()
            .find(|k| entry.worker.contains_key(**k))
        {
            return Err(ConfigError::Env(format!(
                "worker.{key} belongs to the process, not to a source: set it in the top-level [worker]"
            )));
        }
        if entry.database.contains_key("url") {
            return Err(ConfigError::Env(
                "[source.database] url: give the source's database as its `url`".into(),
            ));
        }
        let mut top = self.clone();
        top.source.clear();
        let mut table = toml::Table::try_from(&top).expect("a configuration serializes");
        let sections = [
            ("database", &entry.database),
            ("amqp", &entry.amqp),
            ("outbox", &entry.outbox),
            ("worker", &entry.worker),
            ("tables", &entry.tables),
        ];
        for (section, keys) in sections {
            overlay(section_of(&mut table, section), keys);
        }
        let database = section_of(&mut table, "database");
        database.insert("url".into(), entry.url.clone().into());
        if !entry.listen_url.is_empty() {
            database.insert("listen_url".into(), entry.listen_url.clone().into());
        }
        if let Some(pooler) = entry.pooler {
            let value = toml::Value::try_from(pooler).expect("a pooler serializes");
            database.insert("pooler".into(), value);
        }
        if let Some(count) = entry.partition_count {
            section_of(&mut table, "outbox")
                .insert("partition_count".into(), i64::from(count).into());
        }
        let config = Config::deserialize_table(table).map_err(ConfigError::Env)?;
        config.validate_one()?;
        Ok(config)
    }
}

fn check_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Env(format!(
            "name '{}' must be 1 to {MAX_NAME_LEN} lower-case letters, digits, '-' or '_'",
            name.escape_debug()
        )))
    }
}

fn section_of<'a>(table: &'a mut toml::Table, name: &str) -> &'a mut toml::Table {
    table
        .entry(name)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .expect("a section is a table")
}

/// `keys` over `into`, nested tables (`amqp.tls`) key by key.
fn overlay(into: &mut toml::Table, keys: &toml::Table) {
    for (key, value) in keys {
        match (into.get_mut(key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(over)) => overlay(inner, over),
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::DEFAULT_QUERY_TIMEOUT;
    use super::*;

    const TWO: &str = r#"
[outbox]
batch_size = 200

[[source]]
name = "billing"
url = "postgres://u:secret@db1/billing"
partition_count = 32
[source.amqp]
url = "amqp://u:pw@mq/billing"
[source.outbox]
max_attempts = 5
[source.database]
query_timeout = "3s"

[[source]]
name = "shop"
url = "mysql://u@db2/shop"
[source.tables]
outbox = "shop_outbox"
"#;

    #[test]
    fn each_source_is_the_top_level_with_its_own_keys_over_it() {
        let config = Config::from_toml(TWO).unwrap();
        config.validate().unwrap();
        let sources = config.sources().unwrap();
        assert_eq!(sources.len(), 2);
        let (billing, shop) = (&sources[0].config, &sources[1].config);
        assert_eq!(billing.database.url, "postgres://u:secret@db1/billing");
        assert_eq!(billing.outbox.partition_count, 32);
        assert_eq!(billing.outbox.max_attempts, 5);
        assert_eq!(billing.outbox.batch_size, 200);
        assert_eq!(billing.amqp.url, "amqp://u:pw@mq/billing");
        // Every source's statements are bounded by its own query_timeout.
        assert_eq!(billing.database.query_timeout, Duration::from_secs(3));
        assert_eq!(shop.database.query_timeout, DEFAULT_QUERY_TIMEOUT);
        assert_eq!(shop.database.url, "mysql://u@db2/shop");
        assert_eq!(shop.outbox.batch_size, 200);
        assert_eq!(shop.outbox.partition_count, 16);
        assert_eq!(shop.tables.outbox, "shop_outbox");
        assert_eq!(shop.amqp.url, super::super::DEFAULT_AMQP_URL);
        assert!(billing.source.is_empty() && shop.source.is_empty());
        assert_eq!(
            config.for_source(Some("shop")).unwrap().database.url,
            shop.database.url
        );
    }

    #[test]
    fn without_sources_the_top_level_is_the_default_source() {
        let config = Config::default();
        let sources = config.sources().unwrap();
        assert_eq!(sources.len(), 1);
        assert_eq!(sources[0].name, DEFAULT_SOURCE);
        assert!(config.for_source(None).is_ok());
        assert!(config.for_source(Some("default")).is_ok());
    }

    #[test]
    fn a_bad_source_is_one_line_naming_it() {
        let bad = |extra: &str| {
            let text = format!("{TWO}\n[[source]]\n{extra}");
            let config = Config::from_toml(&text).unwrap();
            config.validate().unwrap_err().to_string()
        };
        let e = bad("name = \"x\"\nurl = \"http://nope\"");
        assert!(e.starts_with("source x: database.url"), "{e}");
        let e = bad("name = \"Bad Name\"\nurl = \"postgres://h/d\"");
        assert!(
            e.starts_with("source Bad Name: name 'Bad Name' must be"),
            "{e}"
        );
        let e = bad("name = \"billing\"\nurl = \"postgres://h/d\"");
        assert!(e.contains("named twice"), "{e}");
        let e = bad("name = \"x\"\nurl = \"postgres://h/d\"\n[source.worker]\nthreads = 2");
        assert!(e.contains("worker.threads belongs to the process"), "{e}");
        let e = bad(
            "name = \"x\"\nurl = \"postgres://h/d\"\n[source.database]\nurl = \"postgres://h/e\"",
        );
        assert!(e.contains("give the source's database as its `url`"), "{e}");
        let e = bad("name = \"x\"\nurl = \"postgres://h/d\"\n[source.outbox]\nbatch_size = 0");
        assert!(e.starts_with("source x: outbox.batch_size"), "{e}");
        let config = Config::from_toml(TWO).unwrap();
        let e = config.for_source(None).unwrap_err().to_string();
        assert!(e.contains("billing, shop") && e.contains("--source"), "{e}");
        let e = config.for_source(Some("nope")).unwrap_err().to_string();
        assert!(e.contains("no such source"), "{e}");
    }
}
