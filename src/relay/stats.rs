//! Counters and latency histograms of one worker process, read by the tick
//! reporter, the heartbeat and `/metrics`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::otel::export::TraceCounts;
use crate::sink::Destinations;
use crate::sink::destinations::Kind;

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

/// Every counter of `stats`, as OTLP exports them.
pub fn observed(stats: &Arc<RelayStats>) -> Vec<crate::otel::export::Observed> {
    COUNTERS
        .iter()
        .map(|c| {
            let (stats, read) = (stats.clone(), c.read);
            crate::otel::export::Observed {
                name: c.otlp,
                unit: c.unit,
                help: c.help,
                read: Box::new(move || read(&stats)),
            }
        })
        .collect()
}

/// Every counter of a worker, in the order `/metrics` lists them.
pub const COUNTERS: [Counter; 12] = [
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
        series: "outboxd_stream_sent_total",
        otlp: "outboxd.stream.sent",
        unit: "{message}",
        help: "rows sent to a stream through their bucket's named producer and confirmed (repeats the broker dropped included)",
        read: |s| {
            s.delivered
                .sum(Kind::Stream, |t| t.delivered - t.already_stored - t.late)
        },
    },
    Counter {
        series: "outboxd_stream_already_stored_total",
        otlp: "outboxd.stream.already_stored",
        unit: "{message}",
        help: "rows for a stream found at or below their producer's last stored id after taking over an expired lease: recorded without being sent again",
        read: |s| s.delivered.sum(Kind::Stream, |t| t.already_stored),
    },
    Counter {
        series: "outboxd_stream_late_total",
        otlp: "outboxd.stream.late",
        unit: "{message}",
        help: "rows for a stream that committed after later rows of their bucket were stored: sent through an unnamed producer",
        read: |s| s.delivered.sum(Kind::Stream, |t| t.late),
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
    /// What the sinks delivered, per destination
    /// ([`crate::sink::destinations`]).
    pub delivered: Arc<Destinations>,
    published: AtomicU64,
    /// Rows published by bucket (one lock per recorded batch).
    by_bucket: Mutex<HashMap<String, u64>>,
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

    /// Counts `n` rows of `bucket` published and recorded.
    pub fn add_published(&self, bucket: &str, n: usize) {
        self.published.fetch_add(n as u64, Ordering::Relaxed);
        let mut by_bucket = self.by_bucket.lock().unwrap_or_else(|e| e.into_inner());
        match by_bucket.get_mut(bucket) {
            Some(total) => *total += n as u64,
            None => {
                by_bucket.insert(bucket.to_string(), n as u64);
            }
        }
    }

    /// Rows published so far, by bucket (for the heartbeat's activity).
    pub fn published_by_bucket(&self) -> HashMap<String, u64> {
        self.by_bucket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

/// What each bucket published over the last [`BucketActivity::WINDOW`],
/// from snapshots of [`RelayStats::published_by_bucket`] taken at each
/// heartbeat: the worker row's `bucket_activity`.
#[derive(Debug)]
pub struct BucketActivity {
    snapshots: VecDeque<(Instant, HashMap<String, u64>)>,
}

impl BucketActivity {
    /// How far back a bucket's rate looks.
    pub const WINDOW: Duration = Duration::from_secs(10);

    /// Starting now, from `totals`.
    pub fn new(now: Instant, totals: HashMap<String, u64>) -> Self {
        Self {
            snapshots: VecDeque::from([(now, totals)]),
        }
    }

    /// Takes `totals` at `now` and says each bucket that published since
    /// the oldest snapshot still within the window (at least
    /// [`BucketActivity::WINDOW`] ago when there is one): `p03=12.5
    /// p07=0.4`, in rows a second, sorted; empty when none did.
    pub fn sample(&mut self, now: Instant, totals: HashMap<String, u64>) -> String {
        self.snapshots.push_back((now, totals));
        while self.snapshots.len() > 2 && now.duration_since(self.snapshots[1].0) >= Self::WINDOW {
            self.snapshots.pop_front();
        }
        let (since, base) = &self.snapshots[0];
        let (_, last) = &self.snapshots[self.snapshots.len() - 1];
        let seconds = now.duration_since(*since).as_secs_f64();
        if seconds <= 0.0 {
            return String::new();
        }
        let mut rates: Vec<(&String, f64)> = last
            .iter()
            .filter_map(|(bucket, total)| {
                let delta = total - base.get(bucket).copied().unwrap_or(0);
                (delta > 0).then(|| (bucket, (delta as f64 / seconds).max(0.01)))
            })
            .collect();
        rates.sort_by(|a, b| a.0.cmp(b.0));
        rates
            .iter()
            .map(|(bucket, rate)| format!("{bucket}={rate:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod activity_tests {
    use super::*;

    #[test]
    fn a_bucket_is_active_for_the_window_after_it_published() {
        let t0 = Instant::now();
        let totals = |pairs: &[(&str, u64)]| {
            pairs
                .iter()
                .map(|(b, n)| (b.to_string(), *n))
                .collect::<HashMap<_, _>>()
        };
        let mut a = BucketActivity::new(t0, HashMap::new());
        let s = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(a.sample(s(3), totals(&[("p01", 30)])), "p01=10.00");
        assert_eq!(
            a.sample(s(6), totals(&[("p01", 30), ("p02", 6)])),
            "p01=5.00 p02=1.00"
        );
        // p01 published last between 0 and 3 s: gone from the window once
        // the snapshot at 3 s is ten seconds old.
        assert_eq!(
            a.sample(s(12), totals(&[("p01", 30), ("p02", 6)])),
            "p01=2.50 p02=0.50"
        );
        assert_eq!(
            a.sample(s(14), totals(&[("p01", 30), ("p02", 6)])),
            "p02=0.55"
        );
        // p02's rows came by 6 s: out of the window ten seconds later.
        assert_eq!(a.sample(s(16), totals(&[("p01", 30), ("p02", 6)])), "");
        assert_eq!(a.sample(s(30), totals(&[("p01", 30), ("p02", 6)])), "");
    }
}
