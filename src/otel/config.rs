//! Export settings from the standard `OTEL_*` environment variables (the
//! OpenTelemetry SDK specification's names and defaults), checked once at
//! start-up. Traces are exported when an OTLP endpoint is set; metrics only
//! when `OTEL_METRICS_EXPORTER=otlp` asks for them too (`/metrics` is the
//! relay's first metrics interface; OTLP is beside it).
//!
//! | variable | meaning |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | base URL; `/v1/traces` and `/v1/metrics` are appended |
//! | `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT` | one signal's full URL |
//! | `OTEL_EXPORTER_OTLP_[SIGNAL_]PROTOCOL` | `http/protobuf` (the only one) |
//! | `OTEL_EXPORTER_OTLP_[SIGNAL_]HEADERS` | `k=v,k2=v2`, values percent-decoded |
//! | `OTEL_EXPORTER_OTLP_[SIGNAL_]TIMEOUT` | per export, ms (10000) |
//! | `OTEL_EXPORTER_OTLP_[SIGNAL_]COMPRESSION` | `gzip` or `none` |
//! | `OTEL_EXPORTER_OTLP_[SIGNAL_]CERTIFICATE`, `…CLIENT_CERTIFICATE`, `…CLIENT_KEY` | PEM files for https |
//! | `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` | the resource (`service.name` defaults to `outboxd`) |
//! | `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` | span batching (5000 ms, 2048, 512) |
//! | `OTEL_METRICS_EXPORTER`, `OTEL_METRIC_EXPORT_INTERVAL` | `otlp` to export metrics; every 60000 ms |
//! | `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` | export off |
//!
//! The SDK reads the headers, timeout, compression and batching variables
//! itself; this module checks every value the SDK would silently ignore, so
//! that a value outboxd cannot honour (another protocol or exporter, a bad
//! URL or number) stops start-up with one line naming the variable.

use std::path::PathBuf;
use std::time::Duration;

use crate::tls::TlsFiles;

/// What is exported, and where.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// Spans, when exported.
    pub traces: Option<Signal>,
    /// The relay's metrics, when asked for.
    pub metrics: Option<Signal>,
    /// Resource attributes, `service.name` first.
    pub resource: Vec<(String, String)>,
    /// Spans queued for export beyond this are dropped (and counted).
    pub max_queue: usize,
}

/// One signal's endpoint and its TLS files.
#[derive(Debug, Clone)]
pub struct Signal {
    /// The URL requests are posted to (`…/v1/traces`, `…/v1/metrics`).
    pub endpoint: url::Url,
    /// CA and client certificate files, used for an https endpoint.
    pub tls: TlsFiles,
    /// The names of those settings, for error lines.
    pub tls_keys: [String; 3],
    /// Bound on one export request.
    pub timeout: Duration,
}

impl ExportConfig {
    /// From the process's environment; `Ok(None)` when nothing is exported.
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
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let traces_on = match var("OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => true,
            Some("none") => false,
            Some(other) => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={other}: outboxd exports traces over OTLP only (otlp, or none)"
                ));
            }
        };
        let metrics_on = match var("OTEL_METRICS_EXPORTER").as_deref() {
            None | Some("none") => false,
            Some("otlp") => true,
            Some(other) => {
                return Err(format!(
                    "OTEL_METRICS_EXPORTER={other}: outboxd exports metrics over OTLP when set to otlp (Prometheus reads /metrics without it)"
                ));
            }
        };
        let traces = if traces_on {
            signal(&var, "TRACES", "traces")?
        } else {
            None
        };
        let metrics = if metrics_on {
            let metrics = signal(&var, "METRICS", "metrics")?;
            if metrics.is_none() {
                return Err("OTEL_METRICS_EXPORTER=otlp: no endpoint (set OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)".into());
            }
            metrics
        } else {
            None
        };
        if traces.is_none() && metrics.is_none() {
            return Ok(None);
        }
        if let Some(ms) = var("OTEL_METRIC_EXPORT_INTERVAL") {
            millis("OTEL_METRIC_EXPORT_INTERVAL", &ms)?;
        }
        if let Some(ms) = var("OTEL_BSP_SCHEDULE_DELAY") {
            millis("OTEL_BSP_SCHEDULE_DELAY", &ms)?;
        }
        let count = |name: &str, default: usize| match var(name) {
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{name}={v}: not a positive whole number")),
            None => Ok(default),
        };
        let max_queue = count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?;
        count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?;

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
        Ok(Some(Self {
            traces,
            metrics,
            resource,
            max_queue,
        }))
    }
}

impl ExportConfig {
    /// Reads the CA and client certificate files of every https endpoint:
    /// a missing or unreadable one is one line naming its variable and path.
    pub fn check_files(&self) -> Result<(), String> {
        for signal in self.traces.iter().chain(&self.metrics) {
            if signal.endpoint.scheme() == "https" {
                signal
                    .tls
                    .client_config(signal.tls_keys.each_ref().map(String::as_str))?;
            }
        }
        Ok(())
    }
}

/// One signal's settings (`SIGNAL` in the variables' names, `path` the
/// last part of its URL); `None` without an endpoint.
fn signal(
    var: &impl Fn(&str) -> Option<String>,
    upper: &str,
    path: &str,
) -> Result<Option<Signal>, String> {
    // The signal-specific variable wins over the general one.
    let either = |suffix: &str| {
        let specific = format!("OTEL_EXPORTER_OTLP_{upper}_{suffix}");
        match var(&specific) {
            Some(v) => Some((specific, v)),
            None => {
                let general = format!("OTEL_EXPORTER_OTLP_{suffix}");
                var(&general).map(|v| (general, v))
            }
        }
    };
    let exact = format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT");
    let endpoint = match var(&exact) {
        Some(url) => parse_url(&exact, &url)?,
        None => match var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            Some(base) => {
                let mut url = parse_url("OTEL_EXPORTER_OTLP_ENDPOINT", &base)?;
                let full = format!("{}/v1/{path}", url.path().trim_end_matches('/'));
                url.set_path(&full);
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
    if let Some((name, list)) = either("HEADERS") {
        pairs(&name, &list)?;
    }
    let timeout = match either("TIMEOUT") {
        Some((name, ms)) => millis(&name, &ms)?,
        None => Duration::from_secs(10),
    };
    if let Some((name, c)) = either("COMPRESSION")
        && c != "gzip"
        && c != "none"
    {
        return Err(format!(
            "{name}={c}: outboxd compresses with gzip or not at all (gzip, or none)"
        ));
    }
    let named = |suffix: &str| {
        either(suffix).map_or_else(|| format!("OTEL_EXPORTER_OTLP_{suffix}"), |(name, _)| name)
    };
    let file = |suffix: &str| either(suffix).map(|(_, path)| PathBuf::from(path));
    Ok(Some(Signal {
        endpoint,
        tls: TlsFiles {
            ca_file: file("CERTIFICATE"),
            cert_file: file("CLIENT_CERTIFICATE"),
            key_file: file("CLIENT_KEY"),
        },
        tls_keys: [
            named("CERTIFICATE"),
            named("CLIENT_CERTIFICATE"),
            named("CLIENT_KEY"),
        ],
        timeout,
    }))
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
        let c = from(&on).unwrap().unwrap();
        assert!(c.traces.is_some() && c.metrics.is_none());
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
        let metrics_only = from(&[
            on[0],
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRICS_EXPORTER", "otlp"),
        ])
        .unwrap()
        .unwrap();
        assert!(metrics_only.traces.is_none());
        assert_eq!(
            metrics_only.metrics.unwrap().endpoint.as_str(),
            "http://collector:4318/v1/metrics"
        );
    }

    #[test]
    fn the_base_endpoint_gets_the_signal_path_and_the_signal_variables_win() {
        let c = from(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/otlp/"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/general.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces.pem"),
            ("OTEL_METRICS_EXPORTER", "otlp"),
            ("OTEL_SERVICE_NAME", "relay-eu"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ignored,deployment.environment=prod%20eu",
            ),
        ])
        .unwrap()
        .unwrap();
        let traces = c.traces.unwrap();
        assert_eq!(
            traces.endpoint.as_str(),
            "http://collector:4318/otlp/v1/traces"
        );
        assert_eq!(traces.tls.ca_file, Some(PathBuf::from("/traces.pem")));
        assert_eq!(traces.tls_keys[0], "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE");
        let metrics = c.metrics.unwrap();
        assert_eq!(metrics.tls.ca_file, Some(PathBuf::from("/general.pem")));
        assert_eq!(c.resource[0], ("service.name".into(), "relay-eu".into()));
        assert_eq!(
            c.resource[1],
            ("deployment.environment".into(), "prod eu".into())
        );
        let exact = from(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://x:4318/custom",
        )])
        .unwrap()
        .unwrap();
        assert_eq!(
            exact.traces.unwrap().endpoint.as_str(),
            "https://x:4318/custom"
        );
        assert_eq!(exact.max_queue, 2048);
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
            (
                vec![base, ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd")],
                "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION=zstd",
            ),
            (
                vec![("OTEL_METRICS_EXPORTER", "otlp")],
                "OTEL_METRICS_EXPORTER=otlp: no endpoint",
            ),
            (
                vec![base, ("OTEL_METRICS_EXPORTER", "prometheus")],
                "OTEL_METRICS_EXPORTER=prometheus",
            ),
        ] {
            let e = from(&vars).unwrap_err();
            assert!(e.starts_with(expect), "{e}");
            assert!(!e.contains('\n'));
        }
    }
}
