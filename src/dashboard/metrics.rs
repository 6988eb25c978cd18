//! `/metrics` in the Prometheus text format.
//!
//! Fleet-wide gauges come from the database (so any process serving the
//! dashboard reports the whole fleet); counters and latency histograms are
//! those of the serving process when it is a worker (`outboxd work --ui`).
//! Label cardinality is bounded: one `bucket` label per bucket (at most
//! 1024) and one `worker` label per live worker.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::DashboardState;
use super::api::COUNT_CAP;
use crate::relay::RelayStats;
use crate::relay::stats::{Histogram, LATENCY_BUCKETS};
use crate::store::partitions::BucketView;
use crate::store::workers::WorkerView;
use std::sync::atomic::Ordering;

/// The whole `/metrics`: fleet gauges from the database and, when the
/// serving process is a worker, its own counters. While the database does
/// not answer, the fleet gauges are left out (`outboxd_database_up 0`) and
/// the worker's counters are still served.
pub async fn metrics(State(st): State<Arc<DashboardState>>) -> Response {
    let mut out = String::with_capacity(8 * 1024);
    gauge(&mut out, "outboxd_up", "1 while this process answers", 1.0);
    let fleet = tokio::time::timeout(FLEET_WITHIN, async {
        tokio::try_join!(st.store.list_workers(), st.store.overview(COUNT_CAP))
    })
    .await;
    let up = match fleet {
        Ok(Ok((workers, buckets))) => {
            fleet_gauges(&mut out, &workers, &buckets);
            true
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "metrics: the fleet's figures are not available");
            false
        }
        Err(_) => false,
    };
    gauge(
        &mut out,
        "outboxd_database_up",
        "1 when the database answered this scrape",
        f64::from(u8::from(up)),
    );
    if let Some(stats) = &st.process {
        process(&mut out, stats);
    }
    text(out)
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
    let s = stats.snapshot();
    counter(
        out,
        "outboxd_published_total",
        "rows published and recorded by this worker",
        s.published,
    );
    counter(
        out,
        "outboxd_retried_total",
        "failed publish attempts (each is retried) by this worker",
        s.failed,
    );
    counter(
        out,
        "outboxd_parked_total",
        "rows parked by this worker",
        s.parked,
    );
    counter(
        out,
        "outboxd_fenced_writes_total",
        "writes refused by the lease fence",
        s.fenced,
    );
    let traces = &stats.traces;
    counter(
        out,
        "outboxd_trace_spans_exported_total",
        "spans accepted by the OTLP collector (0 while export is off)",
        traces.exported.load(Ordering::Relaxed),
    );
    counter(
        out,
        "outboxd_trace_spans_dropped_total",
        "spans dropped: the export queue was full or the export failed",
        traces.dropped.load(Ordering::Relaxed),
    );
    counter(
        out,
        "outboxd_trace_exports_failed_total",
        "span export requests that failed",
        traces.failed_exports.load(Ordering::Relaxed),
    );
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
