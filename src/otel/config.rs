//! Trace export settings from the standard `OTEL_*` environment variables
//! (the OpenTelemetry SDK specification's names and defaults), read once at
//! start-up. Export is on only when an OTLP endpoint is set.
//!
//! | variable | meaning |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | the full URL spans are posted to |
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | base URL; `/v1/traces` is appended |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` | `http/protobuf` (the only one) |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` | `k=v,k2=v2`, values percent-decoded |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` | per export, ms (10000) |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`, `…CLIENT_CERTIFICATE`, `…CLIENT_KEY` | PEM files for https |
//! | `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` | the resource (`service.name` defaults to `outboxd`) |
//! | `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` | batching (5000 ms, 2048, 512) |
//! | `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` | export off |
//!
//! A value outboxd cannot honour (another protocol or exporter, a bad URL
//! or number) stops start-up with one line naming the variable; gzip
//! compression is not built in, so a request for it is said once and the
//! spans go uncompressed.

use std::path::PathBuf;
use std::time::Duration;

use crate::tls::TlsFiles;

/// Where and how spans are exported.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The URL spans are posted to (`…/v1/traces`).
    pub endpoint: url::Url,
    /// Extra request headers (authentication, tenant).
    pub headers: Vec<(String, String)>,
    /// Bound on one export request.
    pub timeout: Duration,
    /// CA and client certificate files for an https endpoint.
    pub tls: TlsFiles,
    /// Resource attributes, `service.name` first.
    pub resource: Vec<(String, String)>,
    /// How often the queued spans are sent at the latest.
    pub schedule_delay: Duration,
    /// Spans queued beyond this are dropped (and counted).
    pub max_queue: usize,
    /// Spans per export request.
    pub max_batch: usize,
    /// A compression asked for that is not built in (said once at start).
    pub ignored_compression: Option<String>,
}

impl ExportConfig {
    /// From the process's environment; `Ok(None)` when export is off.
    pub fn from_env() -> Result<Option<Self>, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From `var` (the environment in [`ExportConfig::from_env`]).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let var = |name: &str| {
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        // The signal-specific variable wins over the general one.
        let either = |suffix: &str| {
            let traces = format!("OTEL_EXPORTER_OTLP_TRACES_{suffix}");
            match var(&traces) {
                Some(v) => Some((traces, v)),
                None => {
                    let general = format!("OTEL_EXPORTER_OTLP_{suffix}");
                    var(&general).map(|v| (general, v))
                }
            }
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={other}: outboxd exports traces over OTLP only (otlp, or none)"
                ));
            }
        }
        let endpoint = match var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            Some(url) => parse_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url)?,
            None => match var("OTEL_EXPORTER_OTLP_ENDPOINT") {
                Some(base) => {
                    let mut url = parse_url("OTEL_EXPORTER_OTLP_ENDPOINT", &base)?;
                    let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
                    url.set_path(&path);
                    url
                }
                None => return Ok(None),
            },
        };
        if let Some((name, protocol)) = either("PROTOCOL")
            && protocol != "http/protobuf"
        {
            return Err(format!(
                "{name}={protocol}: outboxd exports over http/protobuf only (set it to http/protobuf, and the endpoint to the collector's HTTP port, 4318 by default)"
            ));
        }
        let headers = match either("HEADERS") {
            Some((name, list)) => pairs(&name, &list)?,
            None => Vec::new(),
        };
        let timeout = match either("TIMEOUT") {
            Some((name, ms)) => millis(&name, &ms)?,
            None => Duration::from_secs(10),
        };
        let file = |suffix: &str| either(suffix).map(|(_, path)| PathBuf::from(path));
        let tls = TlsFiles {
            ca_file: file("CERTIFICATE"),
            cert_file: file("CLIENT_CERTIFICATE"),
            key_file: file("CLIENT_KEY"),
        };
        let ignored_compression = either("COMPRESSION")
            .filter(|(_, c)| c != "none")
            .map(|(name, c)| format!("{name}={c}"));

        let mut resource = vec![("service.name".to_string(), "outboxd".to_string())];
        if let Some(list) = var("OTEL_RESOURCE_ATTRIBUTES") {
            for (k, v) in pairs("OTEL_RESOURCE_ATTRIBUTES", &list)? {
                match resource.iter_mut().find(|(key, _)| *key == k) {
                    Some(slot) => slot.1 = v,
                    None => resource.push((k, v)),
                }
            }
        }
        if let Some(name) = var("OTEL_SERVICE_NAME") {
            resource[0].1 = name;
        }
        let count = |name: &str, default: usize| match var(name) {
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{name}={v}: not a positive whole number")),
            None => Ok(default),
        };
        let schedule_delay = match var("OTEL_BSP_SCHEDULE_DELAY") {
            Some(ms) => millis("OTEL_BSP_SCHEDULE_DELAY", &ms)?,
            None => Duration::from_secs(5),
        };
        let max_queue = count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?;
        let max_batch = count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.min(max_queue);
        Ok(Some(Self {
            endpoint,
            headers,
            timeout,
            tls,
            resource,
            schedule_delay,
            max_queue,
            max_batch,
            ignored_compression,
        }))
    }

    /// The names of the TLS settings, for error lines.
    pub fn tls_keys() -> [&'static str; 3] {
        [
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ]
    }
}

fn parse_url(name: &str, value: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(value).map_err(|e| format!("{name}={value}: not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "{name}={value}: expected an http:// or https:// URL (OTLP over HTTP)"
        ));
    }
    Ok(url)
}

fn millis(name: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("{name}={value}: not a number of milliseconds"))
}

/// `k=v,k2=v2` with percent-encoded values (the W3C baggage format the
/// specification uses for headers and resource attributes).
fn pairs(name: &str, list: &str) -> Result<Vec<(String, String)>, String> {
    list.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("{name}: '{}' is not key=value", item.trim()))?;
            let v = percent_encoding::percent_decode_str(v.trim())
                .decode_utf8()
                .map_err(|_| format!("{name}: the value of '{}' is not UTF-8", k.trim()))?;
            Ok((k.trim().to_string(), v.into_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Option<ExportConfig>, String> {
        ExportConfig::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn off_without_an_endpoint_or_when_disabled() {
        assert!(from(&[]).unwrap().is_none());
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")];
        assert!(from(&on).unwrap().is_some());
        assert!(
            from(&[on[0], ("OTEL_SDK_DISABLED", "true")])
                .unwrap()
                .is_none()
        );
        assert!(
            from(&[on[0], ("OTEL_TRACES_EXPORTER", "none")])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_base_endpoint_gets_the_traces_path_and_the_signal_variables_win() {
        let c = from(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/otlp/"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "authorization=Bearer%20xyz, tenant = t1",
            ),
            ("OTEL_SERVICE_NAME", "relay-eu"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ignored,deployment.environment=prod",
            ),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint.as_str(), "http://collector:4318/otlp/v1/traces");
        assert_eq!(
            c.headers,
            [
                ("authorization".to_string(), "Bearer xyz".to_string()),
                ("tenant".to_string(), "t1".to_string())
            ]
        );
        assert_eq!(c.resource[0], ("service.name".into(), "relay-eu".into()));
        assert_eq!(c.resource[1].0, "deployment.environment");
        let exact = from(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://x:4318/custom",
        )])
        .unwrap()
        .unwrap();
        assert_eq!(exact.endpoint.as_str(), "https://x:4318/custom");
        assert_eq!(exact.max_batch, 512);
        assert_eq!(exact.schedule_delay, Duration::from_secs(5));
    }

    #[test]
    fn what_cannot_be_honoured_is_one_line_naming_the_variable() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        for (vars, expect) in [
            (
                vec![base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: outboxd exports over http/protobuf only",
            ),
            (
                vec![base, ("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER=zipkin",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT=collector:4318: expected an http:// or https:// URL",
            ),
            (
                vec![base, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
                "OTEL_EXPORTER_OTLP_TIMEOUT=10s: not a number of milliseconds",
            ),
            (
                vec![base, ("OTEL_BSP_MAX_QUEUE_SIZE", "0")],
                "OTEL_BSP_MAX_QUEUE_SIZE=0",
            ),
        ] {
            let e = from(&vars).unwrap_err();
            assert!(e.starts_with(expect), "{e}");
            assert!(!e.contains('\n'));
        }
    }
}
