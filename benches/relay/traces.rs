//! Section 9: span export on against off, in the same run. One worker
//! drains the same seeded backlog — every row carrying a sampled
//! `traceparent`, so every message gets a span when export is on — into a
//! filling queue, export off and on alternating, `max(repeat, 5)` rounds
//! each (single pairs of rounds vary 0.76–1.25 × on these machines, so
//! fewer say little); the figure is the ratio of the medians (target
//! ≥ 0.95), with the worker's CPU per message and the spans the receiver
//! decoded. The
//! receiver is the tests' (`tests/common/otlp.rs`), in this process, on
//! loopback; export runs with the SDK's default batching.

use std::time::Instant;

use serde_json::json;

use super::otlp::Receiver;
use super::{Bench, cpu_ticks, drained_rate, median_of, pg, terminate, us_per_message};

impl Bench {
    pub(super) async fn traces(&mut self) {
        let n = if self.quick { 20_000 } else { 50_000 };
        let rounds = self.repeat.max(5);
        println!(
            "traces: {n} traced messages, export off and on alternating, {rounds} rounds each"
        );
        let (store, config, _) = self.fresh("outboxd_bench_traces", "").await;
        let queue = "bench-traces";
        let names = ["export off", "export on"];
        let mut rates = [Vec::new(), Vec::new()];
        let mut cpu = [0u64; 2];
        let mut spans = 0;
        for round in 0..rounds {
            for (i, name) in names.iter().enumerate() {
                self.seed(&store, n, queue, false).await;
                // A sampled traceparent on every row: trace id and span id
                // from the row id (never all zero).
                for sql in [
                    "UPDATE outbox SET headers = jsonb_build_object('traceparent',
                         format('00-%s-%s-01', lpad(to_hex(id), 32, '0'), lpad(to_hex(id), 16, '0')))
                     WHERE published_at IS NULL",
                    "VACUUM ANALYZE outbox",
                ] {
                    sqlx::raw_sql(sql).execute(pg(&store)).await.unwrap();
                }
                self.declare_purged(queue).await;
                let receiver = Receiver::start().await;
                let mut vars = vec![];
                if i == 1 {
                    vars.push(("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()));
                }
                let start = Instant::now();
                let mut worker = self.spawn_with(&config, &["--silent"], &vars);
                let rate = drained_rate(&store, n, start).await;
                cpu[i] += cpu_ticks(worker.id()).unwrap_or(0);
                terminate(&mut worker);
                let received = receiver.spans().len();
                if i == 1 {
                    spans += received;
                }
                println!("  round {round}: {name} {rate:.0} msg/s, {received} spans received");
                rates[i].push(rate);
            }
        }
        let (off, on) = (median_of(&rates[0]), median_of(&rates[1]));
        let ratio = on / off;
        let [cpu_off, cpu_on] = cpu.map(|t| us_per_message(t, n * rounds));
        self.row(
            &format!("1 worker, traced rows, export off (median of {rounds})"),
            format!("{off:.0} msg/s"),
            "baseline".into(),
        );
        self.row(
            &format!("1 worker, traced rows, export on (median of {rounds})"),
            format!("{on:.0} msg/s"),
            format!("{ratio:.2} x off, target >= 0.95"),
        );
        self.row(
            "  worker CPU per message, export off / on",
            format!("{cpu_off:.1} / {cpu_on:.1} us"),
            format!("{} of {} spans received", spans, n * rounds),
        );
        store.close().await;
        self.results.insert(
            "traces".into(),
            json!({
                "messages": n, "rounds": rounds,
                "msgs_per_sec": { "off": rates[0], "on": rates[1] },
                "ratio_of_medians": ratio,
                "worker_cpu_us_per_message": { "off": cpu_off, "on": cpu_on },
                "spans_received": spans,
            }),
        );
    }
}
