//! Section 14 (`--only shapes`): the trickle in several shapes, stage by
//! stage. PostgreSQL with `LISTEN`, one idle worker, 50
//! and 500 msg/s; every message timed from just before its producer's
//! `INSERT` to its delivery at the consumer (`relay/trickle.rs`).
//!
//! The shapes: the section 2 trickle (200 keys, a pooled producer, a
//! consumer that acks, the worker in fleet mode), then each one way away
//! from it — one key (one bucket: every message waits for the one before
//! it), 10,000 keys, a connection opened per message, a consumer with
//! `no_ack`, the worker with `--no-leasing` — and the **bare path**, the
//! baseline: the producer itself publishing each message with a confirm
//! right after its commit, to the same consumer (a dual write, no relay;
//! its rows go to a database no worker drains), once with the pooled
//! producer and once with a connection per message, and once with the
//! consumer without acks: each shape is compared with the bare path of its
//! own producer and consumer. `OUTBOXD_BENCH_SHAPES=<part of a name>[,…]`
//! runs only those shapes (and their bare paths). Targets: p50 ≤ 2 ms and p99 ≤
//! 5 ms in every shape, and p99 ≤ 3 × the same run's bare path. Each shape
//! also shows commit → delivery, the part the relay adds to the
//! producer's own transaction.
//!
//! Stages per shape: the producer's transaction (begin → commit
//! returned), commit → notification at a listener of the bench's own (on
//! the same server, the way the worker's arrives), and the worker's own
//! means over the trickle from its `/metrics` (`--ui` on a free port): one
//! claim statement, first send → last confirm of a batch, one record; with
//! claims per message. With `OUTBOXD_BENCH_BASELINE_BIN=<another outboxd>`
//! the base shape also runs on that build (fleet mode), in the same rounds
//! — every fleet-mode shape chosen with `OUTBOXD_BENCH_SHAPES`, when given.
//! Rounds (`--repeat N`, at least 3) run every shape;
//! each figure is the median over rounds; shapes are printed worst p99
//! first.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::trickle::{Shape, Trickled, trickle_shaped};
use super::{BIN, Bench, median_of, ms, pct, spawn_bin, terminate};

/// One shape of the trickle, and how the worker runs.
struct Arm {
    name: &'static str,
    shape: Shape,
    worker: Worker,
}

#[derive(Clone, Copy, PartialEq)]
enum Worker {
    Fleet,
    NoLeasing,
    /// Fleet mode, another build (`OUTBOXD_BENCH_BASELINE_BIN`).
    Baseline,
    /// No worker: the producer publishes (the bare path).
    None,
}

fn arms(baseline_build: bool) -> Vec<Arm> {
    let base = Shape::default();
    let arm = |name, shape, worker| Arm {
        name,
        shape,
        worker,
    };
    let mut arms = vec![
        arm("base: 200 keys, pooled, acks, fleet", base, Worker::Fleet),
        arm("1 key", Shape { keys: 1, ..base }, Worker::Fleet),
        arm(
            "10,000 keys",
            Shape {
                keys: 10_000,
                ..base
            },
            Worker::Fleet,
        ),
        arm(
            "a connection per message",
            Shape {
                fresh_connection: true,
                ..base
            },
            Worker::Fleet,
        ),
        arm(
            "consumer without acks",
            Shape {
                acks: false,
                ..base
            },
            Worker::Fleet,
        ),
        arm("--no-leasing", base, Worker::NoLeasing),
        arm(
            "bare path (producer publishes, confirm)",
            Shape { bare: true, ..base },
            Worker::None,
        ),
        arm(
            "bare path, a connection per message",
            Shape {
                bare: true,
                fresh_connection: true,
                ..base
            },
            Worker::None,
        ),
        arm(
            "bare path, consumer without acks",
            Shape {
                bare: true,
                acks: false,
                ..base
            },
            Worker::None,
        ),
    ];
    // OUTBOXD_BENCH_SHAPES=<part of a name>[,…]: those shapes only, with
    // the bare paths they are compared with.
    let only = std::env::var("OUTBOXD_BENCH_SHAPES").ok();
    if let Some(only) = &only {
        let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
        let named = |a: &Arm| wanted.iter().any(|w| a.name.contains(w));
        let kept: Vec<&str> = arms
            .iter()
            .filter(|a| named(a))
            .flat_map(|a| [a.name, bare_of(&arms, a)])
            .collect();
        arms.retain(|a| kept.contains(&a.name));
    }
    // The other build runs the base shape, or every fleet-mode shape
    // chosen by name.
    if baseline_build {
        let copies: Vec<Arm> = arms
            .iter()
            .filter(|a| a.worker == Worker::Fleet && (only.is_some() || a.shape == base))
            .map(|a| Arm {
                // Leaked: a handful of names, needed for the whole run.
                name: if a.shape == base {
                    "base, baseline build"
                } else {
                    format!("{}, baseline build", a.name).leak()
                },
                shape: a.shape,
                worker: Worker::Baseline,
            })
            .collect();
        arms.extend(copies);
    }
    arms
}

/// The name of the bare path a shape is compared with: the one of the same
/// producer (pooled, or a connection per message) and the same consumer
/// (with acks or without).
fn bare_of(arms: &[Arm], a: &Arm) -> &'static str {
    arms.iter()
        .find(|b| {
            b.worker == Worker::None
                && b.shape.fresh_connection == a.shape.fresh_connection
                && b.shape.acks == a.shape.acks
        })
        .map(|b| b.name)
        .expect("a bare path per producer and consumer")
}

const RATES: [u64; 2] = [50, 500];

/// One trickle's figures (milliseconds; stage means from the worker).
#[derive(Clone, Default)]
struct Figures {
    p50: f64,
    p99: f64,
    max: f64,
    /// Commit returned → delivery: what the relay (or the bare publish)
    /// adds to the producer's own transaction.
    after_commit_p50: f64,
    after_commit_p99: f64,
    commit_p50: f64,
    notified_p50: Option<f64>,
    notified_p99: Option<f64>,
    claim_mean: Option<f64>,
    publish_mean: Option<f64>,
    record_mean: Option<f64>,
    claims_per_message: Option<f64>,
}

impl Bench {
    pub(crate) async fn shapes(&mut self) {
        let over = Duration::from_secs(if self.quick { 3 } else { 10 });
        let rounds = self.repeat.max(3);
        println!(
            "shapes: trickles of {}s at {RATES:?} msg/s, {rounds} rounds, PostgreSQL with LISTEN",
            over.as_secs()
        );
        let (store, config, db_url) = self.fresh("outboxd_bench_shapes", "").await;
        let (bare_store, _, bare_url) = self.fresh("outboxd_bench_bare", "").await;
        let queue = "bench-shapes";
        self.declare_purged(queue).await;
        let baseline_bin = std::env::var("OUTBOXD_BENCH_BASELINE_BIN").ok();
        let arms = arms(baseline_bin.is_some());
        // figures[arm][rate] over rounds
        let mut figures = vec![vec![Vec::<Figures>::new(); RATES.len()]; arms.len()];
        for round in 0..rounds {
            let mut modes = vec![Worker::Fleet, Worker::NoLeasing, Worker::None];
            if baseline_bin.is_some() {
                modes.insert(1, Worker::Baseline);
            }
            if round % 2 == 1 {
                modes.reverse();
            }
            for mode in modes {
                if !arms.iter().any(|a| a.worker == mode) {
                    continue;
                }
                let port = free_port();
                let mut worker = match mode {
                    Worker::None => None,
                    Worker::Fleet | Worker::NoLeasing | Worker::Baseline => {
                        let ui = format!("127.0.0.1:{port}");
                        let mut args = vec!["--silent", "--ui", ui.as_str()];
                        if mode == Worker::NoLeasing {
                            args.push("--no-leasing");
                        }
                        let bin = match (mode, &baseline_bin) {
                            (Worker::Baseline, Some(b)) => Path::new(b),
                            _ => Path::new(BIN),
                        };
                        let w = spawn_bin(bin, &config, &args, &[]);
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        Some(w)
                    }
                };
                for (a, arm) in arms.iter().enumerate().filter(|(_, a)| a.worker == mode) {
                    let url = if mode == Worker::None {
                        &bare_url
                    } else {
                        &db_url
                    };
                    for (r, &rate) in RATES.iter().enumerate() {
                        let before = stages(worker.as_ref().map(|_| port)).await;
                        let t = trickle_shaped(url, &self.amqp_url, queue, (rate, over), arm.shape)
                            .await;
                        let after = stages(worker.as_ref().map(|_| port)).await;
                        let f = Figures::of(&t, before.zip(after));
                        println!(
                            "  round {round}, {} at {rate} msg/s: {:.1} / {:.1} / {:.1} ms (commit {:.2} ms, after it {:.1} / {:.1} ms, notified {}, claim {}, publish {}, record {}, claims/msg {})",
                            arm.name,
                            f.p50,
                            f.p99,
                            f.max,
                            f.commit_p50,
                            f.after_commit_p50,
                            f.after_commit_p99,
                            opt(f.notified_p50),
                            opt(f.claim_mean),
                            opt(f.publish_mean),
                            opt(f.record_mean),
                            opt(f.claims_per_message),
                        );
                        figures[a][r].push(f);
                    }
                }
                if let Some(w) = worker.as_mut() {
                    terminate(w);
                }
            }
        }
        store.close().await;
        bare_store.close().await;
        self.drop_database("outboxd_bench_shapes").await;
        self.drop_database("outboxd_bench_bare").await;
        let out = self.shapes_report(&arms, &figures);
        self.results.insert("shapes".into(), out);
    }

    /// Every shape per rate, worst median p99 first, beside the bare path.
    fn shapes_report(&mut self, arms: &[Arm], figures: &[Vec<Vec<Figures>>]) -> Value {
        let mut out = serde_json::Map::new();
        // Each shape beside the bare path of the same producer and consumer.
        let bare_index = |a: &Arm| {
            let name = bare_of(arms, a);
            arms.iter()
                .position(|b| b.name == name)
                .expect("kept with its shapes")
        };
        for (r, rate) in RATES.iter().enumerate() {
            let medians: Vec<Figures> = figures.iter().map(|f| median_figures(&f[r])).collect();
            let mut order: Vec<usize> = (0..arms.len()).collect();
            order.sort_by(|a, b| medians[*b].p99.total_cmp(&medians[*a].p99));
            let mut rows = Vec::new();
            for a in order {
                let m = &medians[a];
                let bare_p99 = medians[bare_index(&arms[a])].p99;
                let target = if arms[a].worker == Worker::None {
                    "baseline".to_string()
                } else {
                    let ratio = m.p99 / bare_p99;
                    let met = m.p50 <= 2.0 && m.p99 <= 5.0 && ratio <= 3.0;
                    format!("{ratio:.1} x bare; {}", if met { "met" } else { "NOT met" })
                };
                self.row(
                    &format!("{rate} msg/s, {}: p50 / p99 / max", arms[a].name),
                    format!("{:.1} / {:.1} / {:.1} ms", m.p50, m.p99, m.max),
                    target,
                );
                rows.push(json!({
                    "shape": arms[a].name,
                    "p50_ms": m.p50,
                    "p99_ms": m.p99,
                    "max_ms": m.max,
                    "after_commit_p50_ms": m.after_commit_p50,
                    "after_commit_p99_ms": m.after_commit_p99,
                    "p99_over_bare": m.p99 / bare_p99,
                    "commit_p50_ms": m.commit_p50,
                    "notified_p50_ms": m.notified_p50,
                    "notified_p99_ms": m.notified_p99,
                    "claim_mean_ms": m.claim_mean,
                    "publish_mean_ms": m.publish_mean,
                    "record_mean_ms": m.record_mean,
                    "claims_per_message": m.claims_per_message,
                    "rounds_p99_ms": figures[a][r].iter().map(|f| f.p99).collect::<Vec<_>>(),
                }));
            }
            out.insert(rate.to_string(), Value::Array(rows));
        }
        Value::Object(out)
    }
}

impl Figures {
    fn of(t: &Trickled, stages: Option<(Stages, Stages)>) -> Self {
        let lat = &t.from_insert;
        let (claim, publish, record, claims) = match stages {
            Some((b, a)) => {
                let mean = |i: usize| {
                    let n = a.counts[i] - b.counts[i];
                    (n > 0).then(|| (a.sums[i] - b.sums[i]) / n as f64 * 1000.0)
                };
                let messages = lat.len().max(1) as f64;
                (
                    mean(0),
                    mean(1),
                    mean(2),
                    Some((a.counts[0] - b.counts[0]) as f64 / messages),
                )
            }
            None => (None, None, None, None),
        };
        let notified = |p| (!t.notified.is_empty()).then(|| ms(pct(&t.notified, p)));
        Self {
            p50: ms(pct(lat, 0.5)),
            p99: ms(pct(lat, 0.99)),
            max: ms(*lat.last().expect("messages were delivered")),
            after_commit_p50: ms(pct(&t.from_commit, 0.5)),
            after_commit_p99: ms(pct(&t.from_commit, 0.99)),
            commit_p50: ms(pct(&t.commit, 0.5)),
            notified_p50: notified(0.5),
            notified_p99: notified(0.99),
            claim_mean: claim,
            publish_mean: publish,
            record_mean: record,
            claims_per_message: claims,
        }
    }
}

/// Per field, the median over rounds.
fn median_figures(rounds: &[Figures]) -> Figures {
    let med = |f: &dyn Fn(&Figures) -> Option<f64>| {
        let v: Vec<f64> = rounds.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median_of(&v))
    };
    let must = |f: &dyn Fn(&Figures) -> f64| med(&|x| Some(f(x))).unwrap_or(f64::NAN);
    Figures {
        p50: must(&|f| f.p50),
        p99: must(&|f| f.p99),
        max: must(&|f| f.max),
        after_commit_p50: must(&|f| f.after_commit_p50),
        after_commit_p99: must(&|f| f.after_commit_p99),
        commit_p50: must(&|f| f.commit_p50),
        notified_p50: med(&|f| f.notified_p50),
        notified_p99: med(&|f| f.notified_p99),
        claim_mean: med(&|f| f.claim_mean),
        publish_mean: med(&|f| f.publish_mean),
        record_mean: med(&|f| f.record_mean),
        claims_per_message: med(&|f| f.claims_per_message),
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The worker's claim, publish and record histograms: sums (s) and counts.
#[derive(Clone, Copy)]
struct Stages {
    sums: [f64; 3],
    counts: [u64; 3],
}

const STAGE_METRICS: [&str; 3] = [
    "outboxd_claim_seconds",
    "outboxd_publish_seconds",
    "outboxd_record_seconds",
];

/// The worker's stage histograms from its `/metrics` (none without a
/// worker, or when it does not answer).
async fn stages(port: Option<u16>) -> Option<Stages> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port?))
        .await
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let value = |name: String| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let mut s = Stages {
        sums: [0.0; 3],
        counts: [0; 3],
    };
    for (i, m) in STAGE_METRICS.iter().enumerate() {
        s.sums[i] = value(format!("{m}_sum"))?;
        s.counts[i] = value(format!("{m}_count"))? as u64;
    }
    Some(s)
}

/// A port free on loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
