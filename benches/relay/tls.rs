//! Section 8: TLS on both links (the database and the broker) against
//! plaintext, on the same private servers in the same run — a PostgreSQL
//! that serves both, a RabbitMQ with a TLS listener beside its plain one,
//! certificates from a private CA made here (`tests/common/tls.rs`).
//!
//! Throughput: one worker drains the same seeded backlog into a filling
//! queue, plaintext and TLS alternating, `max(repeat, 3)` times each; the
//! figure is the ratio of the medians (target ≥ 0.9). Latency: a trickle of
//! 50 msg/s into an idle worker, plaintext then TLS (p50 / p99).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::tls_pki::{Pki, TlsServer};
use super::{Bench, PAYLOAD, any_pending, ms, pct, terminate, trickle};

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
        let n = if self.quick { 20_000 } else { 50_000 };
        let rounds = self.repeat.max(3);
        println!("tls: {n} messages, plaintext and TLS alternating, {rounds} rounds each");
        let pki = Pki::in_dir(&self.dir);
        let mut server = TlsServer::new(&pki, false);
        server.plain_too = true;
        let pg_port = free_port(33000);
        let pg_dir = self.dir.join("tls-pg");
        let mut pg_env = server.env();
        pg_env.push(("OUTBOXD_STATE_DIR".into(), pg_dir.display().to_string()));
        pg_env.push(("OUTBOXD_PG_PORT".into(), pg_port.to_string()));
        let _pg = Private::start(&["pg", "start"], &["pg", "stop", "immediate"], pg_env);
        let (amqp_port, amqps_port) = (free_port(35000), free_port(37000));
        server.amqps_port = Some(amqps_port);
        let rabbit_dir = self.dir.join("tls-rabbit");
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
        let tls_config = self.dir.join("tls.toml");
        std::fs::write(
            &tls_config,
            format!(
                "[database]\nurl = \"{tls_db}\"\n[amqp]\nurl = \"amqps://guest:guest@127.0.0.1:{amqps_port}/%2f\"\n[amqp.tls]\nca_file = \"{}\"\n",
                pki.ca.display()
            ),
        )
        .unwrap();
        let variants: [(&str, &PathBuf); 2] = [("plaintext", &plain_config), ("TLS", &tls_config)];

        let queue = "bench-tls";
        let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            for (i, (name, config)) in variants.iter().enumerate() {
                self.seed(&store, n, queue, false).await;
                self.declare_purged(queue).await;
                let start = Instant::now();
                let mut worker = self.spawn(config, &["--silent"]);
                while any_pending(&store).await {
                    assert!(
                        start.elapsed() < Duration::from_secs(600),
                        "drain did not finish"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let rate = n as f64 / start.elapsed().as_secs_f64();
                terminate(&mut worker);
                println!("  round {round}: {name} {rate:.0} msg/s");
                rates[i].push(rate);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (plain_rate, tls_rate) = (median(&mut rates[0].clone()), median(&mut rates[1].clone()));
        let ratio = tls_rate / plain_rate;
        self.row(
            "1 worker, plaintext on both links (median)",
            format!("{plain_rate:.0} msg/s"),
            "baseline".into(),
        );
        self.row(
            "1 worker, TLS on both links (median)",
            format!("{tls_rate:.0} msg/s"),
            format!("{ratio:.2} x plaintext, target >= 0.9"),
        );

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
                if name == "TLS" {
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
                "plaintext_msgs_per_sec": rates[0], "tls_msgs_per_sec": rates[1],
                "ratio_of_medians": ratio, "latency_50_per_sec": latency,
            }),
        );
        self.amqp_url = shared_amqp;
        self.admin_url = shared_admin;
    }
}
