//! `/metrics` in the Prometheus text format.
//!
//! Fleet-wide gauges come from the database (so any process serving the
//! dashboard reports the whole fleet); counters and latency histograms are
//! those of the serving process when it is a worker (`outboxd work --ui`).
//! Label cardinality is bounded: one `bucket` label per bucket (at most
//! 1024), one `worker` label per live worker, and at most
//! [`MAX_DESTINATIONS`](crate::sink::destinations::MAX_DESTINATIONS) `destination` labels per worker.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::DashboardState;
use super::api::COUNT_CAP;
use super::states::{BUCKET_STATES, WORKER_STATES};
use crate::relay::RelayStats;
use crate::relay::stats::{COUNTERS, Histogram, LATENCY_BUCKETS};
use crate::store::partitions::BucketView;
use crate::store::workers::WorkerView;

/// The whole `/metrics`: fleet gauges from the database and, when the
/// serving process is a worker, its own counters. While the database does
/// not answer, the fleet gauges are left out (`outboxd_database_up 0`) and
/// the worker's counters are still served.
pub async fn metrics(State(st): State<Arc<DashboardState>>) -> Response {
    text(render(&st).await)
}

/// The exposition for one database (see [`metrics`]).
pub async fn render(st: &DashboardState) -> String {
    let mut out = String::with_capacity(8 * 1024);
    gauge(&mut out, "outboxd_up", UP_HELP, 1.0);
    let store = st.store.clone();
    let fleet = super::within(FLEET_WITHIN, async move {
        tokio::try_join!(store.list_workers(), store.overview(COUNT_CAP))
    })
    .await;
    let up = match fleet {
        Some(Ok((mut workers, mut buckets))) => {
            super::states::annotate(&mut workers, &mut buckets);
            fleet_gauges(&mut out, &workers, &buckets);
            true
        }
        Some(Err(e)) => {
            tracing::debug!(error = %e, "metrics: the fleet's figures are not available");
            false
        }
        None => false,
    };
    gauge(
        &mut out,
        "outboxd_database_up",
        DATABASE_UP_HELP,
        f64::from(u8::from(up)),
    );
    if let Some(stats) = &st.process {
        process(&mut out, stats);
    }
    out
}

const UP_HELP: &str = "1 while this process answers";
const DATABASE_UP_HELP: &str = "1 when the database answered this scrape";

/// The exposition for a database not reached yet (a source of `outboxd
/// ui` whose database did not answer at start-up).
pub fn unreached() -> String {
    let mut out = String::new();
    gauge(&mut out, "outboxd_up", UP_HELP, 1.0);
    gauge(&mut out, "outboxd_database_up", DATABASE_UP_HELP, 0.0);
    out
}

/// Several expositions as one, each sample of `parts` labelled
/// `label="<its name>"`: a family's `# HELP` and `# TYPE` once, then its
/// samples from every part (the text format wants a family's samples
/// together), families in the order they first appear.
pub fn labelled(parts: &[(String, String)], label: &str) -> String {
    // family -> (its HELP/TYPE lines, its samples)
    let mut families: Vec<(String, Vec<&str>, Vec<String>)> = Vec::new();
    for (name, exposition) in parts {
        let value = name.replace('\\', "\\\\").replace('"', "\\\"");
        let mut current: Option<usize> = None;
        for line in exposition.lines() {
            if let Some(comment) = line.strip_prefix("# ") {
                let family = comment.split_whitespace().nth(1).unwrap_or_default();
                let i = match families.iter().position(|(f, _, _)| f == family) {
                    Some(i) => i,
                    None => {
                        families.push((family.to_string(), Vec::new(), Vec::new()));
                        families.len() - 1
                    }
                };
                if !families[i].1.contains(&line) {
                    families[i].1.push(line);
                }
                current = Some(i);
            } else if !line.is_empty() {
                let sample = match line.split_once('{') {
                    Some((metric, rest)) if rest.starts_with('}') => {
                        format!("{metric}{{{label}=\"{value}\"{rest}")
                    }
                    Some((metric, rest)) => format!("{metric}{{{label}=\"{value}\",{rest}"),
                    None => match line.split_once(' ') {
                        Some((metric, rest)) => format!("{metric}{{{label}=\"{value}\"}} {rest}"),
                        None => continue,
                    },
                };
                match current {
                    Some(i) => families[i].2.push(sample),
                    None => {
                        families.push((String::new(), Vec::new(), vec![sample]));
                    }
                }
            }
        }
    }
    let mut out = String::new();
    for (_, comments, samples) in families {
        for line in comments.iter().map(|l| l.to_string()).chain(samples) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// How long a scrape waits for the fleet's figures.
const FLEET_WITHIN: Duration = Duration::from_secs(3);

/// The Prometheus text response.
pub fn text(out: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

fn fleet_gauges(out: &mut String, workers: &[WorkerView], buckets: &[BucketView]) {
    let live = workers.iter().filter(|w| w.live).count();
    gauge(
        out,
        "outboxd_workers_live",
        "live workers in the fleet",
        live as f64,
    );
    let by_state = |states: &[&str], of: &dyn Fn(&str) -> usize| -> Vec<(String, f64)> {
        states
            .iter()
            .map(|s| (format!("state=\"{s}\""), of(s) as f64))
            .collect()
    };
    gauge_labeled(
        out,
        "outboxd_workers",
        "workers by state (the words of the page and `outboxd status`)",
        &by_state(&WORKER_STATES, &|s| {
            workers.iter().filter(|w| w.state == s).count()
        }),
    );
    gauge_labeled(
        out,
        "outboxd_buckets",
        "buckets by state (publishing: published in the last ten seconds)",
        &by_state(&BUCKET_STATES, &|s| {
            buckets.iter().filter(|b| b.state == s).count()
        }),
    );
    let held: Vec<(String, f64)> = workers
        .iter()
        .filter(|w| w.live)
        .map(|w| {
            (
                format!(
                    "worker=\"{}\",name=\"{}\",host=\"{}\"",
                    w.worker_id,
                    escape(&w.name),
                    escape(&w.hostname)
                ),
                w.buckets as f64,
            )
        })
        .collect();
    gauge_labeled(
        out,
        "outboxd_leases_held",
        "buckets leased by each live worker",
        &held,
    );
    let lag: Vec<(String, f64)> = buckets
        .iter()
        .map(|b| (format!("bucket=\"{}\"", b.partition_key), b.lag_seconds))
        .collect();
    gauge_labeled(
        out,
        "outboxd_bucket_lag_seconds",
        "age of the oldest pending row per bucket",
        &lag,
    );
    let pending: Vec<(String, f64)> = buckets
        .iter()
        .map(|b| (format!("bucket=\"{}\"", b.partition_key), b.pending as f64))
        .collect();
    gauge_labeled(
        out,
        "outboxd_bucket_pending",
        &format!("pending rows per bucket (counted up to {COUNT_CAP})"),
        &pending,
    );
    let blocked: Vec<(String, f64)> = buckets
        .iter()
        .map(|b| {
            (
                format!("bucket=\"{}\"", b.partition_key),
                f64::from(u8::from(b.head_error.is_some())),
            )
        })
        .collect();
    gauge_labeled(
        out,
        "outboxd_bucket_blocked",
        "1 while the bucket's head keeps failing",
        &blocked,
    );
    let rates: Vec<(String, f64)> = super::destinations::fleet(workers)
        .iter()
        .map(|d| (destination_labels(d.sink, d.kind.as_str(), &d.name), d.rate))
        .collect();
    gauge_labeled(
        out,
        "outboxd_destination_rate",
        "rows a second the live workers delivered to each queue, exchange and stream (over their last heartbeat periods)",
        &rates,
    );
    let parked: f64 = buckets.iter().map(|b| b.parked as f64).sum();
    gauge(
        out,
        "outboxd_parked",
        "parked (failed) rows in the outbox",
        parked,
    );
}

/// The serving worker's own counters and latency histograms.
pub fn process(out: &mut String, stats: &RelayStats) {
    for c in &COUNTERS {
        counter(out, c.series, c.help, (c.read)(stats));
    }
    let name = "outboxd_destination_delivered_total";
    let _ = writeln!(
        out,
        "# HELP {name} rows this worker delivered to each queue, exchange and stream (confirmed by the broker, or found already in a stream)\n# TYPE {name} counter"
    );
    for d in stats.delivered.snapshot() {
        let labels = destination_labels(d.kind.sink(), d.kind.as_str(), &d.name);
        let _ = writeln!(out, "{name}{{{labels}}} {}", d.totals.delivered);
    }
    histogram(
        out,
        "outboxd_claim_seconds",
        "time of one claim statement",
        &stats.claim_latency,
    );
    histogram(
        out,
        "outboxd_publish_seconds",
        "time from a batch's first send to its last confirm",
        &stats.publish_latency,
    );
    histogram(
        out,
        "outboxd_record_seconds",
        "time of one record of published rows",
        &stats.record_latency,
    );
}

fn destination_labels(sink: &str, kind: &str, name: &str) -> String {
    format!(
        "sink=\"{sink}\",kind=\"{kind}\",destination=\"{}\"",
        escape(name)
    )
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A gauge without labels.
pub fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn gauge_labeled(out: &mut String, name: &str, help: &str, values: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (labels, v) in values {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let (cumulative, count, sum) = h.cumulative();
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (le, c) in LATENCY_BUCKETS.iter().zip(cumulative) {
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {c}");
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_keeps_one_family_header_and_labels_every_sample() {
        let a = "# HELP x_up up\n# TYPE x_up gauge\nx_up 1\n# HELP x_held held\n# TYPE x_held gauge\nx_held{worker=\"w\"} 2\n";
        let b = "# HELP x_up up\n# TYPE x_up gauge\nx_up 0\n";
        let out = labelled(
            &[("a".into(), a.into()), ("b\"q".into(), b.into())],
            "source",
        );
        assert_eq!(
            out,
            "# HELP x_up up\n# TYPE x_up gauge\nx_up{source=\"a\"} 1\nx_up{source=\"b\\\"q\"} 0\n\
             # HELP x_held held\n# TYPE x_held gauge\nx_held{source=\"a\",worker=\"w\"} 2\n"
        );
    }
}
