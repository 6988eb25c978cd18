//! `/metrics` in the Prometheus text format.
//!
//! Fleet-wide gauges come from the database (so any process serving the
//! dashboard reports the whole fleet); counters and latency histograms are
//! those of the serving process when it is a worker (`outboxd work --ui`).
//! Label cardinality is bounded: one `bucket` label per bucket (at most
//! 1024) and one `worker` label per live worker.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::DashboardState;
use super::api::COUNT_CAP;
use super::error::ApiError;
use crate::relay::stats::{Histogram, LATENCY_BUCKETS};

pub async fn metrics(State(st): State<Arc<DashboardState>>) -> Result<impl IntoResponse, ApiError> {
    let (workers, buckets) =
        tokio::try_join!(st.store.list_workers(), st.store.overview(COUNT_CAP),)?;
    let mut out = String::with_capacity(8 * 1024);
    gauge(
        &mut out,
        "outboxd_up",
        "1 while this process answers",
        &[("", 1.0)],
    );
    let live = workers.iter().filter(|w| w.live).count();
    gauge(
        &mut out,
        "outboxd_workers_live",
        "live workers in the fleet",
        &[("", live as f64)],
    );
    let held: Vec<(String, f64)> = workers
        .iter()
        .filter(|w| w.live)
        .map(|w| {
            (
                format!(
                    "worker=\"{}\",host=\"{}\"",
                    w.worker_id,
                    escape(&w.hostname)
                ),
                w.buckets as f64,
            )
        })
        .collect();
    gauge_labeled(
        &mut out,
        "outboxd_leases_held",
        "buckets leased by each live worker",
        &held,
    );
    let lag: Vec<(String, f64)> = buckets
        .iter()
        .map(|b| (format!("bucket=\"{}\"", b.partition_key), b.lag_seconds))
        .collect();
    gauge_labeled(
        &mut out,
        "outboxd_bucket_lag_seconds",
        "age of the oldest pending row per bucket",
        &lag,
    );
    let pending: Vec<(String, f64)> = buckets
        .iter()
        .map(|b| (format!("bucket=\"{}\"", b.partition_key), b.pending as f64))
        .collect();
    gauge_labeled(
        &mut out,
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
        &mut out,
        "outboxd_bucket_blocked",
        "1 while the bucket's head keeps failing",
        &blocked,
    );
    let parked: f64 = buckets.iter().map(|b| b.parked as f64).sum();
    gauge(
        &mut out,
        "outboxd_parked",
        "parked (failed) rows in the outbox",
        &[("", parked)],
    );

    if let Some(stats) = &st.process {
        let s = stats.snapshot();
        counter(
            &mut out,
            "outboxd_published_total",
            "rows published and recorded by this worker",
            s.published,
        );
        counter(
            &mut out,
            "outboxd_retried_total",
            "failed publish attempts (each is retried) by this worker",
            s.failed,
        );
        counter(
            &mut out,
            "outboxd_parked_total",
            "rows parked by this worker",
            s.parked,
        );
        counter(
            &mut out,
            "outboxd_fenced_writes_total",
            "writes refused by the lease fence",
            s.fenced,
        );
        histogram(
            &mut out,
            "outboxd_claim_seconds",
            "time of one claim statement",
            &stats.claim_latency,
        );
        histogram(
            &mut out,
            "outboxd_publish_seconds",
            "time from a batch's first send to its last confirm",
            &stats.publish_latency,
        );
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    ))
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn gauge(out: &mut String, name: &str, help: &str, values: &[(&str, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (_, v) in values {
        let _ = writeln!(out, "{name} {v}");
    }
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
