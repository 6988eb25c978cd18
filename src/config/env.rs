//! The environment layer of the configuration, and where each value came
//! from.
//!
//! Every key can be set as `OUTBOXD_<SECTION>__<KEY>` (nested tables
//! joined by `__` as well: `OUTBOXD_AMQP__TLS__CA_FILE`), or as
//! `OUTBOXD_<SECTION>__<KEY>_FILE`, a file holding the value (the container
//! convention; a trailing newline is ignored). `DATABASE_URL` and
//! `AMQP_URL` (and their `_FILE` forms) stay as aliases of `database.url`
//! and `amqp.url` and are applied after the `OUTBOXD_` variables.
//!
//! A variable of that double-underscore shape that names no key stops
//! start-up with one line naming it, with the nearest key's variable when
//! one is close (typo protection); `OUTBOXD_` variables without `__` are not
//! keys (`OUTBOXD_CONFIG`, `OUTBOXD_LOG`, the scripts' state directory and
//! ports) and are left alone. A value is read as the key's type: text,
//! whole numbers, `true`/`false`, and lists as comma-separated text.
//!
//! [`Provenance`] records, per key, whether its value is the default or
//! came from the file, a variable or a flag: `outboxd config` prints it.

use std::collections::BTreeMap;

use toml::Value;

use super::{Config, ConfigError};

/// The prefix of every configuration variable.
pub const PREFIX: &str = "OUTBOXD_";

/// Where a key's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File,
    /// The variable that set it.
    Env(String),
    /// The command-line flag that set it.
    Flag(&'static str),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File => f.write_str("file"),
            Source::Env(var) => write!(f, "environment ({var})"),
            Source::Flag(flag) => write!(f, "flag ({flag})"),
        }
    }
}

/// Where every key's value came from, and which file was read.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    /// The configuration file read, if any.
    pub file: Option<String>,
    by_key: BTreeMap<String, Source>,
}

impl Provenance {
    /// Where the value of `key` (dotted, e.g. `outbox.batch_size`) came from.
    pub fn source(&self, key: &str) -> Source {
        self.by_key.get(key).cloned().unwrap_or(Source::Default)
    }

    pub fn set(&mut self, key: &str, source: Source) {
        self.by_key.insert(key.to_string(), source);
    }

    /// The variables that set a value.
    pub fn variables(&self) -> Vec<String> {
        self.by_key
            .values()
            .filter_map(|s| match s {
                Source::Env(var) => Some(var.clone()),
                _ => None,
            })
            .collect()
    }
}

/// The dotted key every leaf of `table` is at, with `prefix`.
fn leaves(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(t) => leaves(t, &key, out),
            _ => out.push(key),
        }
    }
}

/// Every configuration key, dotted.
pub fn keys() -> Vec<String> {
    let mut out = Vec::new();
    leaves(&defaults(), "", &mut out);
    out
}

fn defaults() -> toml::Table {
    toml::Table::try_from(Config::default()).expect("the defaults serialize")
}

/// The variable that sets `key`.
pub fn variable_for(key: &str) -> String {
    format!("{PREFIX}{}", key.replace('.', "__").to_uppercase())
}

/// The leaf at dotted `key` in `table`.
fn leaf<'a>(table: &'a toml::Table, key: &str) -> Option<&'a Value> {
    let mut parts = key.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    (!value.is_table()).then_some(value)
}

fn set_leaf(table: &mut toml::Table, key: &str, value: Value) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().expect("a key has a name");
    let mut table = table;
    for part in parts {
        table = table
            .entry(part)
            .or_insert_with(|| Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("keys name tables on their way");
    }
    table.insert(last.to_string(), value);
}

/// The text of `var`, or of the file `var_FILE` names; `None` when neither
/// is set (or both empty).
pub fn value_or_file(
    var: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    let file_var = format!("{var}_FILE");
    let direct = get(var).filter(|v| !v.is_empty());
    let file = get(&file_var).filter(|v| !v.is_empty());
    match (direct, file) {
        (Some(_), Some(_)) => Err(ConfigError::Env(format!(
            "both {var} and {file_var} are set: set one of them"
        ))),
        (Some(value), None) => Ok(Some(value)),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ConfigError::Env(format!("{file_var}: cannot read {path}: {e}")))?;
            let value = text.trim_end_matches(['\n', '\r']).to_string();
            if value.is_empty() {
                return Err(ConfigError::Env(format!("{file_var}: {path} is empty")));
            }
            Ok(Some(value))
        }
        (None, None) => Ok(None),
    }
}

/// `text` as a value of the type `like` has.
fn typed(var: &str, text: &str, like: &Value) -> Result<Value, ConfigError> {
    let bad = |what: &str| ConfigError::Env(format!("{var}: '{text}' is not {what}"));
    Ok(match like {
        Value::Integer(_) => {
            Value::Integer(text.trim().parse().map_err(|_| bad("a whole number"))?)
        }
        Value::Boolean(_) => Value::Boolean(text.trim().parse().map_err(|_| bad("true or false"))?),
        Value::Float(_) => Value::Float(text.trim().parse().map_err(|_| bad("a number"))?),
        Value::Array(_) => Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_string()))
                .collect(),
        ),
        _ => Value::String(text.to_string()),
    })
}

/// The key a variable names: `OUTBOXD_OUTBOX__BATCH_SIZE` is
/// `outbox.batch_size`.
fn key_of(var: &str) -> String {
    var[PREFIX.len()..].to_lowercase().replace("__", ".")
}

/// Applies every `OUTBOXD_<SECTION>__<KEY>` variable of `vars` over
/// `config` (the file's values), recording each in `provenance`. An
/// unknown key, an unreadable file or a value of the wrong type is one
/// line naming the variable.
pub fn apply(
    config: &Config,
    vars: &[(String, String)],
    get: &impl Fn(&str) -> Option<String>,
    provenance: &mut Provenance,
) -> Result<Config, ConfigError> {
    let defaults = defaults();
    let mut merged = toml::Table::try_from(config).expect("a configuration serializes");
    let mut seen = Vec::new();
    for (var, _) in vars {
        if !var.starts_with(PREFIX) || !var.contains("__") {
            continue;
        }
        let direct = key_of(var);
        let (key, name) = if leaf(&defaults, &direct).is_some() {
            (direct, var.clone())
        } else if let Some(stem) = var.strip_suffix("_FILE")
            && leaf(&defaults, &key_of(stem)).is_some()
        {
            (key_of(stem), stem.to_string())
        } else {
            return Err(ConfigError::Env(unknown(var)));
        };
        if seen.contains(&key) {
            continue;
        }
        seen.push(key.clone());
        let Some(text) = value_or_file(&name, get)? else {
            continue;
        };
        let like = leaf(&defaults, &key).expect("checked");
        set_leaf(&mut merged, &key, typed(&name, &text, like)?);
        // Each value is checked on its own, so an error names its variable.
        Config::deserialize_table(merged.clone())
            .map_err(|e| ConfigError::Env(format!("{name}: {e}")))?;
        provenance.set(&key, Source::Env(name));
    }
    Config::deserialize_table(merged).map_err(ConfigError::Env)
}

/// "names no configuration key", with the nearest key's variable if close.
fn unknown(var: &str) -> String {
    let nearest = keys()
        .into_iter()
        .map(|k| variable_for(&k))
        .map(|v| (edit_distance(var, &v), v))
        .min();
    match nearest {
        Some((d, v)) if d <= 3 => {
            format!("{var} names no configuration key (did you mean {v}?)")
        }
        _ => format!(
            "{var} names no configuration key (variables look like OUTBOXD_<SECTION>__<KEY>, e.g. OUTBOXD_OUTBOX__BATCH_SIZE)"
        ),
    }
}

/// Levenshtein distance.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(prev + usize::from(ca != *cb));
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Records the keys a configuration file sets.
pub fn record_file(text: &str, provenance: &mut Provenance) {
    if let Ok(table) = text.parse::<toml::Table>() {
        let mut keys = Vec::new();
        leaves(&table, "", &mut keys);
        for key in keys {
            provenance.set(&key, Source::File);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply_vars(vars: &[(&str, &str)]) -> Result<(Config, Provenance), String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let mut p = Provenance::default();
        apply(&Config::default(), &vars, &get, &mut p)
            .map(|c| (c, p))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_key_has_a_variable_of_its_type() {
        let (c, p) = apply_vars(&[
            ("OUTBOXD_OUTBOX__BATCH_SIZE", "500"),
            ("OUTBOXD_DATABASE__POOLER", "transaction"),
            ("OUTBOXD_WORKER__LEASE_TTL", "30s"),
            ("OUTBOXD_AMQP__TLS__CA_FILE", "/etc/ca.pem"),
            ("OUTBOXD_DASHBOARD__ALLOWED_HOSTS", "a.example, b.example"),
            ("OUTBOXD_CONFIG", "/ignored/not/a/key"),
            ("OUTBOXD_STATE_DIR", "/ignored"),
        ])
        .unwrap();
        assert_eq!(c.outbox.batch_size, 500);
        assert_eq!(c.database.pooler, super::super::Pooler::Transaction);
        assert_eq!(c.worker.lease_ttl, std::time::Duration::from_secs(30));
        assert_eq!(c.amqp.tls.ca_file, "/etc/ca.pem");
        assert_eq!(c.dashboard.allowed_hosts, ["a.example", "b.example"]);
        assert_eq!(
            p.source("outbox.batch_size"),
            Source::Env("OUTBOXD_OUTBOX__BATCH_SIZE".into())
        );
        assert_eq!(p.source("outbox.claim_ttl"), Source::Default);
        // Every key of the configuration has one.
        assert!(keys().len() > 40, "{:?}", keys());
        for key in keys() {
            assert!(variable_for(&key).starts_with("OUTBOXD_"));
        }
    }

    #[test]
    fn typos_and_bad_values_name_the_variable() {
        let e = apply_vars(&[("OUTBOXD_OUTBOX__BATCH_SIZ", "5")]).unwrap_err();
        assert_eq!(
            e,
            "OUTBOXD_OUTBOX__BATCH_SIZ names no configuration key (did you mean OUTBOXD_OUTBOX__BATCH_SIZE?)"
        );
        let e = apply_vars(&[("OUTBOXD_OUTBOX__BATCH_SIZE", "lots")]).unwrap_err();
        assert_eq!(
            e,
            "OUTBOXD_OUTBOX__BATCH_SIZE: 'lots' is not a whole number"
        );
        let e = apply_vars(&[("OUTBOXD_WORKER__LEASE_TTL", "15 parsecs")]).unwrap_err();
        assert!(
            e.starts_with("OUTBOXD_WORKER__LEASE_TTL: ") && e.contains("unknown unit"),
            "{e}"
        );
    }
}
