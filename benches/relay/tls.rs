//! Section 8: TLS on both links (the database and the broker) against
//! plaintext, on the same private servers in the same run — a PostgreSQL
//! that serves both, a RabbitMQ with a TLS listener beside its plain one,
//! certificates from a private CA made here (`tests/common/tls.rs`).
//!
//! Throughput: one worker drains the same seeded backlog into a filling
//! queue, plaintext, TLS on both links, and TLS on each link alone, in
//! turn, `max(repeat, 5)` times each — every other round in the reverse
//! order, so no arm always follows the same one (on these shared cores the
//! arm after a heavy phase runs slower). Each drain gives two rates: the
//! **whole** drain (from starting the worker to the last row recorded, its
//! start-up — connections, TLS handshakes, joining the fleet — included)
//! and the **steady** rate (the rows over the database's own time from the
//! first recorded publish to the last: what the links carry once open).
//! The figures are the medians' ratios (target ≥ 0.9 for both links), with
//! the CPU per message of the worker, PostgreSQL and RabbitMQ. Latency: a
//! trickle of 50 msg/s into an idle worker, plaintext then TLS (p50 /
//! p99).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::tls_pki::{Pki, TlsServer};
use super::{
    Bench, PAYLOAD, cpu_ticks, drained_rate, median_of, ms, pct, postgres_cpu_ticks, terminate,
    trickle, us_per_message,
};

/// A private server started through `scripts/services.sh`, stopped on drop.
struct Private {
    args: Vec<String>,
    env: Vec<(String, String)>,
    stop: Vec<String>,
}

impl Private {
    fn start(args: &[&str], stop: &[&str], env: Vec<(String, String)>) -> Self {
        let p = Self {
            args: args.iter().map(|s| s.to_string()).collect(),
            env,
            stop: stop.iter().map(|s| s.to_string()).collect(),
        };
        p.run(&p.args);
        p
    }

    fn run(&self, args: &[String]) {
        let status = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services.sh"))
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "services.sh {args:?} failed");
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.run(&self.stop);
        if let Some(dir) = self.dir() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Private {
    /// The server's state folder: `OUTBOXD_STATE_DIR` or the rabbit DIR.
    fn dir(&self) -> Option<PathBuf> {
        match self.args.first().map(String::as_str) {
            Some("rabbit") => self.args.get(2).map(PathBuf::from),
            _ => self
                .env
                .iter()
                .find(|(k, _)| k == "OUTBOXD_STATE_DIR")
                .map(|(_, v)| PathBuf::from(v)),
        }
    }
}

fn free_port(from: u16) -> u16 {
    (from..from + 2000)
        .step_by(2)
        .find(|p| {
            let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
            free(*p) && free(p + 1)
        })
        .expect("a free port pair")
}

impl Bench {
    pub(super) async fn tls(&mut self) {
        let n = if self.quick { 20_000 } else { 100_000 };
        let rounds = self.repeat.max(5);
        println!(
            "tls: {n} messages, plaintext and TLS alternating (every other round reversed), {rounds} rounds each"
        );
        let pki = Pki::in_dir(&self.dir);
        let mut server = TlsServer::new(&pki, false);
        server.plain_too = true;
        // Under the services' state folder, which the service user may write.
        let state =
            PathBuf::from(std::env::var("OUTBOXD_STATE_DIR").unwrap_or_else(|_| "/tmp".into()));
        let pg_port = free_port(33000);
        let pg_dir = state.join(format!("bench-tls-pg-{pg_port}"));
        let mut pg_env = server.env();
        pg_env.push(("OUTBOXD_STATE_DIR".into(), pg_dir.display().to_string()));
        pg_env.push(("OUTBOXD_PG_PORT".into(), pg_port.to_string()));
        let _pg = Private::start(&["pg", "start"], &["pg", "stop", "immediate"], pg_env);
        let (amqp_port, amqps_port) = (free_port(35000), free_port(37000));
        server.amqps_port = Some(amqps_port);
        let rabbit_dir = state.join(format!("bench-tls-rabbit-{amqp_port}"));
        let (dir, port) = (rabbit_dir.display().to_string(), amqp_port.to_string());
        let _rabbit = Private::start(
            &["rabbit", "start", &dir, &port],
            &["rabbit", "stop", &dir, &port],
            server.env(),
        );

        // The section's own broker for every helper that talks to one.
        let plain_amqp = format!("amqp://guest:guest@127.0.0.1:{amqp_port}/%2f");
        let shared_amqp = std::mem::replace(&mut self.amqp_url, plain_amqp.clone());
        let shared_admin = std::mem::replace(
            &mut self.admin_url,
            format!("postgres://outboxd:outboxd@127.0.0.1:{pg_port}/postgres?sslmode=disable"),
        );
        let (store, plain_config, db_url) = self.fresh("outboxd_bench_tls", "").await;
        let tls_db = {
            let mut u = url::Url::parse(&db_url).unwrap();
            u.set_query(None);
            u.query_pairs_mut()
                .append_pair("sslmode", "verify-full")
                .append_pair("sslrootcert", &pki.ca.display().to_string());
            u.to_string()
        };
        // Plaintext, TLS on both links (the target), and each link alone
        // (where the cost goes).
        let tls_amqp = format!(
            "amqps://guest:guest@127.0.0.1:{amqps_port}/%2f\"\n[amqp.tls]\nca_file = \"{}",
            pki.ca.display()
        );
        let mut variants: Vec<(&str, PathBuf)> = vec![("plaintext", plain_config.clone())];
        for (name, db, amqp) in [
            ("TLS", &tls_db, &tls_amqp),
            ("TLS to the database only", &tls_db, &plain_amqp),
            ("TLS to the broker only", &db_url, &tls_amqp),
        ] {
            let path = self.dir.join(format!("{}.toml", name.replace(' ', "-")));
            std::fs::write(
                &path,
                format!("[database]\nurl = \"{db}\"\n[amqp]\nurl = \"{amqp}\"\n"),
            )
            .unwrap();
            variants.push((name, path));
        }
        let broker_ticks = || {
            std::fs::read_to_string(rabbit_dir.join("rabbit.pid"))
                .ok()
                .and_then(|p| p.trim().parse().ok())
                .and_then(cpu_ticks)
                .unwrap_or(0)
        };

        let queue = "bench-tls";
        // Whole-drain and steady rates of every round, per variant.
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        let mut steady: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        // Worker, PostgreSQL and RabbitMQ CPU per message, summed over rounds.
        let mut cpu = vec![[0u64; 3]; variants.len()];
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..variants.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let (name, config) = &variants[i];
                let before: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM outbox")
                    .fetch_one(super::pg(&store))
                    .await
                    .unwrap();
                self.seed(&store, n, queue, false).await;
                self.declare_purged(queue).await;
                let (pg0, mq0) = (postgres_cpu_ticks(), broker_ticks());
                let start = Instant::now();
                let mut worker = self.spawn(config, &["--silent"]);
                let rate = drained_rate(&store, n, start).await;
                let ticks = [
                    cpu_ticks(worker.id()).unwrap_or(0),
                    postgres_cpu_ticks() - pg0,
                    broker_ticks() - mq0,
                ];
                terminate(&mut worker);
                let steady_rate = steady_rate(&store, before, n).await;
                println!(
                    "  round {round}: {name} {rate:.0} msg/s whole, {steady_rate:.0} msg/s steady"
                );
                rates[i].push(rate);
                steady[i].push(steady_rate);
                for (sum, t) in cpu[i].iter_mut().zip(ticks) {
                    *sum += t;
                }
            }
        }
        let plain_rate = median_of(&rates[0]);
        let ratio = median_of(&rates[1]) / plain_rate;
        let plain_steady = median_of(&steady[0]);
        let steady_ratio = median_of(&steady[1]) / plain_steady;
        let mut throughput = serde_json::Map::new();
        for (i, (name, _)) in variants.iter().enumerate() {
            let rate = median_of(&rates[i]);
            let steady_rate = median_of(&steady[i]);
            let [w, p, b] = cpu[i].map(|t| us_per_message(t, n * rounds));
            let (target, steady_target) = match i {
                0 => ("baseline".to_string(), "baseline".to_string()),
                1 => (
                    format!("{ratio:.2} x plaintext, target >= 0.9"),
                    format!("{steady_ratio:.2} x plaintext, target >= 0.9"),
                ),
                _ => (
                    format!("{:.2} x plaintext", rate / plain_rate),
                    format!("{:.2} x plaintext", steady_rate / plain_steady),
                ),
            };
            self.row(
                &format!("1 worker, {name}, whole drain (median of {rounds})"),
                format!("{rate:.0} msg/s"),
                target,
            );
            self.row(
                &format!("1 worker, {name}, steady (median of {rounds})"),
                format!("{steady_rate:.0} msg/s"),
                steady_target,
            );
            self.row(
                &format!("  CPU per message, {name}: worker / PostgreSQL / RabbitMQ"),
                format!("{w:.0} / {p:.0} / {b:.0} us"),
                String::new(),
            );
            throughput.insert(
                name.to_string(),
                json!({
                    "msgs_per_sec": rates[i], "median": rate,
                    "steady_msgs_per_sec": steady[i], "steady_median": steady_rate,
                    "cpu_us_per_message": { "worker": w, "postgres": p, "rabbitmq": b },
                }),
            );
        }
        let variants = &variants[..2];

        let mut latency = serde_json::Map::new();
        let over = Duration::from_secs(if self.quick { 3 } else { 10 });
        for (name, config) in variants {
            self.declare_purged(queue).await;
            let mut worker = self.spawn(config, &["--silent"]);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let lat = trickle(&db_url, &plain_amqp, queue, 50, over).await;
            terminate(&mut worker);
            let (p50, p99) = (pct(&lat, 0.5), pct(&lat, 0.99));
            self.row(
                &format!("commit-to-queue latency at 50 msg/s, {name} (p50 / p99)"),
                format!("{:.1} / {:.1} ms", ms(p50), ms(p99)),
                if *name == "TLS" {
                    "vs plaintext"
                } else {
                    "baseline"
                }
                .into(),
            );
            latency.insert(
                name.to_string(),
                json!({ "p50_ms": ms(p50), "p99_ms": ms(p99) }),
            );
        }
        store.close().await;
        self.results.insert(
            "tls".into(),
            json!({
                "messages": n, "payload_bytes": PAYLOAD, "rounds": rounds,
                "throughput": throughput, "ratio_of_medians": ratio,
                "steady_ratio_of_medians": steady_ratio,
                "latency_50_per_sec": latency,
            }),
        );
        self.amqp_url = shared_amqp;
        self.admin_url = shared_admin;
    }
}

/// The steady rate of the drain of the `n` rows after id `after`: the rows
/// over the database's own time from the first recorded publish to the
/// last (the worker's start-up left out).
async fn steady_rate(store: &outboxd::store::Store, after: i64, n: usize) -> f64 {
    let span: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(published_at) - min(published_at))::float8
         FROM outbox WHERE id > $1",
    )
    .bind(after)
    .fetch_one(super::pg(store))
    .await
    .unwrap();
    n as f64 / span.max(1e-3)
}
