//! Counters and latency histograms of one worker process, read by the tick
//! reporter, the heartbeat and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::otel::export::TraceCounts;

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// A fixed-bucket latency histogram, lock-free.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; LATENCY_BUCKETS.len()],
    overflow: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        match LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            Some(i) => self.counts[i].fetch_add(1, Ordering::Relaxed),
            None => self.overflow.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Cumulative counts per bucket (Prometheus `le` semantics), the total
    /// count and the sum in seconds.
    pub fn cumulative(&self) -> (Vec<u64>, u64, f64) {
        let mut acc = 0;
        let buckets = self
            .counts
            .iter()
            .map(|c| {
                acc += c.load(Ordering::Relaxed);
                acc
            })
            .collect();
        let total = acc + self.overflow.load(Ordering::Relaxed);
        (
            buckets,
            total,
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

/// One of a worker's counters, as `/metrics` and OTLP name it: one table,
/// so that the two exports cannot drift apart.
pub struct Counter {
    /// The Prometheus series (`outboxd_…_total`).
    pub series: &'static str,
    /// The OTLP metric (`outboxd.…`), a cumulative sum.
    pub otlp: &'static str,
    /// The OTLP unit (UCUM annotation).
    pub unit: &'static str,
    pub help: &'static str,
    pub read: fn(&RelayStats) -> u64,
}

/// Every counter of a worker, in the order `/metrics` lists them.
pub const COUNTERS: [Counter; 9] = [
    Counter {
        series: "outboxd_published_total",
        otlp: "outboxd.published",
        unit: "{message}",
        help: "rows published and recorded by this worker",
        read: |s| s.published.load(Ordering::Relaxed),
    },
    Counter {
        series: "outboxd_retried_total",
        otlp: "outboxd.retried",
        unit: "{attempt}",
        help: "failed publish attempts (each is retried) by this worker",
        read: |s| s.failed.load(Ordering::Relaxed),
    },
    Counter {
        series: "outboxd_parked_total",
        otlp: "outboxd.parked",
        unit: "{message}",
        help: "rows parked by this worker",
        read: |s| s.parked.load(Ordering::Relaxed),
    },
    Counter {
        series: "outboxd_fenced_writes_total",
        otlp: "outboxd.fenced_writes",
        unit: "{write}",
        help: "writes refused by the lease fence",
        read: |s| s.fenced.load(Ordering::Relaxed),
    },
    Counter {
        series: "outboxd_membership_reads_total",
        otlp: "outboxd.membership_reads",
        unit: "{read}",
        help: "reads of the fleet's membership by this worker's coordinator",
        read: |s| s.membership_reads.load(Ordering::Relaxed),
    },
    Counter {
        series: "outboxd_late_writes_total",
        otlp: "outboxd.late_writes",
        unit: "{write}",
        help: "broker socket writes that went out after a held lease's trust deadline (the process paused between the send gate's check and the write)",
        read: |s| s.late_writes.load(Ordering::Relaxed),
    },
    Counter {
        series: "outboxd_trace_spans_exported_total",
        otlp: "outboxd.trace.spans_exported",
        unit: "{span}",
        help: "spans accepted by the OTLP collector (0 while export is off)",
        read: |s| s.traces.exported.load(Ordering::Relaxed),
    },
    Counter {
        series: "outboxd_trace_spans_dropped_total",
        otlp: "outboxd.trace.spans_dropped",
        unit: "{span}",
        help: "spans dropped: the export queue was full or the export failed",
        read: |s| s.traces.dropped.load(Ordering::Relaxed),
    },
    Counter {
        series: "outboxd_trace_exports_failed_total",
        otlp: "outboxd.trace.exports_failed",
        unit: "{request}",
        help: "span export requests that failed",
        read: |s| s.traces.failed_exports.load(Ordering::Relaxed),
    },
];

/// Totals since the worker started.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Time of one claim statement.
    pub claim_latency: Histogram,
    /// Time from the first send of a batch to its last confirm.
    pub publish_latency: Histogram,
    /// Time of one record of published rows.
    pub record_latency: Histogram,
    /// The span exporter's counters (zero while export is off).
    pub traces: Arc<TraceCounts>,
    /// Reads of the fleet's membership by this worker's coordinator (the
    /// part of an idle fleet's cost that announcements save).
    pub membership_reads: AtomicU64,
    /// Socket writes that went out after a held lease's trust lapsed: a
    /// pause between the send gate's check and the write
    /// ([`crate::amqp::gate`]). Shared with the broker's gate.
    pub late_writes: Arc<AtomicU64>,
    published: AtomicU64,
    failed: AtomicU64,
    parked: AtomicU64,
    claimed: AtomicU64,
    batches: AtomicU64,
    fenced: AtomicU64,
}

/// A copy of the counters at one instant.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Rows confirmed by the broker and recorded as published.
    pub published: u64,
    /// Failed publish attempts (each bumps a row's `attempts`).
    pub failed: u64,
    /// Rows parked (`failed_at` set) after their last allowed attempt.
    pub parked: u64,
    /// Rows claimed.
    pub claimed: u64,
    /// Batches claimed.
    pub batches: u64,
    /// Writes that matched no row because the claim or the lease had moved
    /// on (fleet mode: a lease lost while a batch was in flight).
    pub fenced: u64,
}

impl RelayStats {
    /// Totals whose [`RelayStats::late_writes`] is the broker gate's own
    /// count.
    pub fn counting_late_writes_in(late_writes: Arc<AtomicU64>) -> Self {
        Self {
            late_writes,
            ..Self::default()
        }
    }

    pub fn add_published(&self, n: usize) {
        self.published.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_failed(&self, n: usize) {
        self.failed.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_parked(&self, n: usize) {
        self.parked.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_fenced(&self, n: usize) {
        self.fenced.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_claimed(&self, n: usize) {
        self.claimed.fetch_add(n as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            published: self.published.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            claimed: self.claimed.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
        }
    }
}

impl StatsSnapshot {
    /// The counts between `earlier` and `self`.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            published: self.published - earlier.published,
            failed: self.failed - earlier.failed,
            parked: self.parked - earlier.parked,
            claimed: self.claimed - earlier.claimed,
            batches: self.batches - earlier.batches,
            fenced: self.fenced - earlier.fenced,
        }
    }
}
