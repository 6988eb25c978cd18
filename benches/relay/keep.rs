//! Section 13 (`--only keep`): published rows deleted by their record
//! (`outbox.keep_published = false`) against kept with `published_at` (the
//! default). Per backend (PostgreSQL, MariaDB) and per
//! round: the ceiling (section 7's, 16 channels × 100 in flight, a
//! consumer process draining the queue throughout), then one worker
//! draining the same seeded backlog (100,000 rows of 256 B over 5,000
//! keys; `--quick` 20,000) once with each setting, the arms' order
//! alternating from round to round (`--repeat N` rounds, at least 3).
//!
//! Per arm: the rate against the round's ceiling; CPU per message of the
//! worker, of its own PostgreSQL backends or MariaDB connection threads,
//! of the whole database (every PostgreSQL process, the exited ones
//! included — autovacuum workers come and go —, or every thread of the
//! MariaDB server), and of RabbitMQ; and the relay-side CPU (the worker and
//! its backends or connection threads) as a share of RabbitMQ's CPU in the
//! same drain — the targets: ≤ 0.35 × on PostgreSQL, ≤ 0.5 × on
//! MariaDB.

use serde_json::{Value, json};

use std::path::PathBuf;

use super::{BIN, Backend, Bench, Drain, KEYS, Measured, median_of};

/// The arms, in the order of even rounds (odd rounds reverse it): name,
/// worker configuration, binary. With `OUTBOXD_BENCH_BASELINE_BIN=<another
/// outboxd>`, a third arm keeps the rows with that build.
fn arms() -> Vec<(String, &'static str, PathBuf)> {
    let mut arms = vec![
        ("kept".to_string(), "", PathBuf::from(BIN)),
        (
            "deleted".to_string(),
            "\n[outbox]\nkeep_published = false\n",
            PathBuf::from(BIN),
        ),
    ];
    if let Ok(bin) = std::env::var("OUTBOXD_BENCH_BASELINE_BIN") {
        arms.push(("kept, baseline build".into(), "", PathBuf::from(bin)));
    }
    arms
}

impl Bench {
    pub(crate) async fn keep(&mut self) {
        let n = if self.quick { 20_000 } else { 100_000 };
        let rounds = self.repeat.max(3);
        println!(
            "keep: {n} messages of 256 bytes over {KEYS} keys, published rows kept against deleted, {rounds} rounds"
        );
        let mut out = serde_json::Map::new();
        for on in [Backend::Postgres, Backend::MariaDb] {
            let runs = self.keep_rounds(on, n, rounds).await;
            out.insert(on.name().into(), self.keep_report(on, &runs));
        }
        self.results.insert("keep".into(), Value::Object(out));
    }

    /// Every round's ceiling and both arms' drains on `on`.
    async fn keep_rounds(&mut self, on: Backend, n: usize, rounds: usize) -> Vec<Round> {
        let queue = "bench-keep";
        let mut runs = Vec::new();
        for round in 0..rounds {
            let consumer = Drain::start(queue);
            let ceiling = self.ceiling_with(queue, n, KEYS, 16, 100).await.rate;
            let arms = arms();
            let mut measured: Vec<Option<Measured>> = arms.iter().map(|_| None).collect();
            for i in 0..arms.len() {
                let arm = if round % 2 == 0 {
                    i
                } else {
                    arms.len() - 1 - i
                };
                let (name, toml, bin) = &arms[arm];
                let (store, config, _) = self.fresh_on(on, "outboxd_bench_keep", toml).await;
                self.seed_keys(&store, n, queue, false, KEYS).await;
                let m = self.drain_measured_by(bin, &store, &config, n).await;
                store.close().await;
                println!(
                    "  {} round {round}, {name}: {:.0} msg/s ({:.2} x ceiling {ceiling:.0}), relay-side {:.1} µs, RabbitMQ {:.1} µs",
                    on.name(),
                    m.rate,
                    m.rate / ceiling,
                    relay_side(&m),
                    m.broker_us,
                );
                measured[arm] = Some(m);
            }
            consumer.stop();
            runs.push(Round {
                ceiling,
                arms: measured
                    .into_iter()
                    .map(|m| m.expect("every arm ran"))
                    .collect(),
            });
        }
        runs
    }

    /// The medians of every figure per arm, printed and as JSON.
    fn keep_report(&mut self, on: Backend, runs: &[Round]) -> Value {
        let db = on.name();
        let target = on.cpu_target();
        let mut json = serde_json::Map::new();
        for (i, (name, _, _)) in arms().iter().enumerate() {
            let med =
                |f: &dyn Fn(&Round) -> f64| median_of(&runs.iter().map(f).collect::<Vec<_>>());
            let ratio = med(&|r| r.arms[i].rate / r.ceiling);
            let worker = med(&|r| r.arms[i].worker_us);
            let backends = med(&|r| r.arms[i].backends_us.unwrap_or(f64::NAN));
            let database = med(&|r| r.arms[i].database_us);
            let broker = med(&|r| r.arms[i].broker_us);
            let relay = med(&|r| relay_side(&r.arms[i]));
            let share = med(&|r| relay_side(&r.arms[i]) / r.arms[i].broker_us);
            let each: Vec<String> = runs
                .iter()
                .map(|r| format!("{:.2}", relay_side(&r.arms[i]) / r.arms[i].broker_us))
                .collect();
            self.row(
                &format!("{db}, published rows {name}: relay ÷ ceiling"),
                format!("{ratio:.2} x"),
                format!(
                    "rounds {}",
                    runs.iter()
                        .map(|r| format!("{:.2}", r.arms[i].rate / r.ceiling))
                        .collect::<Vec<_>>()
                        .join(" / ")
                ),
            );
            let parts = match on {
                Backend::Postgres => format!("worker {worker:.1} + its backends {backends:.1} µs"),
                _ => format!("worker {worker:.1} + its connection threads {backends:.1} µs"),
            };
            self.row(
                &format!("{db}, published rows {name}: relay-side CPU per message"),
                format!("{relay:.1} µs ({parts})"),
                format!(
                    "{share:.2} x RabbitMQ's {broker:.1} µs (rounds {}), target <= {target}",
                    each.join(" / ")
                ),
            );
            let (everything, background) = match on {
                Backend::Postgres => ("PostgreSQL", "WAL writer, checkpointer, autovacuum"),
                _ => ("MariaDB", "purge, page cleaner, log writer"),
            };
            self.row(
                &format!("{db}, published rows {name}: all of {everything} per message"),
                format!("{database:.1} µs"),
                format!("{background} included"),
            );
            json.insert(
                name.clone(),
                json!({
                    "ratio": ratio, "worker_us": worker, "backends_us": backends,
                    "database_us": database, "broker_us": broker,
                    "relay_side_us": relay, "relay_side_share_of_broker": share,
                    "target_share": target,
                }),
            );
        }
        Value::Object(json)
    }
}

/// One round: its ceiling and every arm (in the order of [`arms`]).
struct Round {
    ceiling: f64,
    arms: Vec<Measured>,
}

/// The relay's side of a drain, per message: the worker and its
/// PostgreSQL backends or MariaDB connection threads.
fn relay_side(m: &Measured) -> f64 {
    m.worker_us + m.backends_us.unwrap_or(m.database_us)
}
