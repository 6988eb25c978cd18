//! The configuration's value types written as text: durations (read by
//! `humantime`, printed in the file's own notation), listen addresses, and
//! URLs with their passwords masked for logs, errors and pages.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

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

pub(super) fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&fmt_duration(*d))
}

pub(super) fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

/// Parses a listen address (`host:port`, an IP address).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("'{s}' must be an address like 127.0.0.1:8080"))
}

pub(super) fn ser_addr<S: Serializer>(a: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&a.to_string())
}

pub(super) fn de_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    parse_addr(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

/// An optional address is written as the empty string when unset.
pub(super) fn ser_opt_addr<S: Serializer>(a: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&a.map(|a| a.to_string()).unwrap_or_default())
}

pub(super) fn de_opt_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    match s.trim() {
        "" => Ok(None),
        s => parse_addr(s).map(Some).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // A value that cannot hold a password is shown as it is.
        assert_eq!(redact_url("not-a-url"), "not-a-url");
        assert_eq!(redact_url("not a url hunter2"), "***");
    }
}
