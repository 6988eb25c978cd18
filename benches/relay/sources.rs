//! Section 10: one worker serving many sources (`[[source]]`) —
//! 50 PostgreSQL databases on the one server (10 with `--quick`), each
//! migrated and idle — against the same worker serving one of them (the
//! baseline, same run), each measured after 45 s of settling. Per added idle source: memory (the worker's RSS),
//! CPU (share of one core), connections its database holds from the
//! worker, and transactions per second its database runs (PostgreSQL's
//! `xact_commit + xact_rollback`: one per statement outside a transaction);
//! then the commit-to-queue latency of a trickle (50 msg/s) into one of the
//! 50 while the others idle; then four sources with a backlog each,
//! drained by one process serving all four against four processes serving
//! one each (same run). Targets: ≤ 5 MB, ≤ 3 connections and ≤ 0.2 % of a
//! core per idle source; trickle p99 ≤ 5 ms; one process ≥ 0.9 × four.
//! Section 11 (`reload`): a source added to and removed from a busy worker
//! by SIGHUP, joined and left within 2 s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use std::process::Child;
use std::time::Instant;

use super::{
    Bench, any_pending, clock_ticks, cpu_ticks, ms, pct, pg, signal, status_kb, terminate, trickle,
    with_path,
};

/// How many times [`Bench::reload`] adds and removes a source.
const RELOADS: usize = 5;

/// How long a worker runs before it is measured idle (see [`Bench::idle`]).
const SETTLE: Duration = Duration::from_secs(45);

/// What a worker costs while its sources idle.
#[derive(Debug, Clone, Copy)]
struct Idle {
    rss_kb: f64,
    cpu_share: f64,
    connections: f64,
    transactions_per_s: f64,
}

impl Bench {
    pub(super) async fn sources(&mut self) {
        let n = if self.quick { 10 } else { 50 };
        let over = Duration::from_secs(if self.quick { 10 } else { 30 });
        println!("sources: one worker with 1 and with {n} idle PostgreSQL sources, {over:?} each");
        let names: Vec<String> = (0..n).map(|i| format!("outboxd_bench_src{i:02}")).collect();
        let mut urls = Vec::new();
        for name in &names {
            let (store, _, url) = self.fresh(name, "").await;
            store.close().await;
            urls.push(url);
        }
        let one = self
            .idle(&self.sources_config(&urls[..1]), &names[..1], over)
            .await;
        let many_config = self.sources_config(&urls);
        let many = self.idle(&many_config, &names, over).await;
        let per = |f: fn(&Idle) -> f64| (f(&many) - f(&one)) / (n - 1) as f64;
        let mb = per(|i| i.rss_kb) / 1024.0;
        let cpu = per(|i| i.cpu_share) * 100.0;
        // Connections and transactions belong to each source's database:
        // the average over the n (the one-source run's own figure beside).
        let connections = many.connections / n as f64;
        let transactions = many.transactions_per_s / n as f64;
        self.row(
            &format!("memory per added idle source ({n} vs 1)"),
            format!("{mb:.2} MB"),
            format!("1 source {:.1} MB; target <= 5 MB", one.rss_kb / 1024.0),
        );
        self.row(
            "CPU per added idle source",
            format!("{cpu:.3} % of a core"),
            format!("1 source {:.2} %; target <= 0.2 %", one.cpu_share * 100.0),
        );
        self.row(
            "connections per idle source",
            format!("{connections:.1}"),
            format!("1 source {:.0}; target <= 3", one.connections),
        );
        self.row(
            "transactions per second per idle source",
            format!("{transactions:.1}/s"),
            format!("1 source {:.1}/s", one.transactions_per_s),
        );

        // A trickle into one source while the others idle.
        let queue = "bench-sources";
        self.declare_purged(queue).await;
        // Once settled: the start-up burst of n pools can take every
        // connection the server allows (BENCHMARKS.md, section 10).
        let mut worker = self.spawn(&many_config, &["--silent"]);
        tokio::time::sleep(SETTLE).await;
        let target = &urls[n / 3];
        let lat = trickle(target, &self.amqp_url, queue, 50, Duration::from_secs(10)).await;
        terminate(&mut worker);
        let (p50, p99, max) = (pct(&lat, 0.5), pct(&lat, 0.99), *lat.last().unwrap());
        self.row(
            &format!("trickle into 1 of {n} sources, 50 msg/s (p50 / p99 / max)"),
            format!("{:.1} / {:.1} / {:.1} ms", ms(p50), ms(p99), ms(max)),
            "target p99 <= 5 ms".into(),
        );
        for name in &names {
            self.drop_database(name).await;
        }
        let (one_process, four_processes) = self.busy_sources().await;
        let busy_ratio = one_process / four_processes;
        self.row(
            "4 busy sources: one process vs four (one source each), ABBA",
            format!("{one_process:.0} vs {four_processes:.0} msg/s"),
            format!("{busy_ratio:.2} x; target >= 0.9"),
        );
        let figures = |i: &Idle| {
            json!({ "rss_kb": i.rss_kb, "cpu_share": i.cpu_share, "connections": i.connections,
                    "transactions_per_s": i.transactions_per_s })
        };
        self.results.insert(
            "sources".into(),
            json!({
                "sources": n, "idle_seconds": over.as_secs(),
                "one": figures(&one), "many": figures(&many),
                "per_added_source": { "rss_mb": mb, "cpu_percent": cpu },
                "per_source": { "connections": connections, "transactions_per_s": transactions },
                "trickle_50_per_s": { "messages": lat.len(), "p50_ms": ms(p50), "p99_ms": ms(p99), "max_ms": ms(max) },
                "busy_4": { "one_process_msgs_per_sec": one_process, "four_processes_msgs_per_sec": four_processes,
                            "ratio": busy_ratio },
            }),
        );
    }

    /// Four sources with a backlog each (fresh databases each time),
    /// drained by one process serving all four and by four processes
    /// serving one each, in the order one, four, four, one (whichever ran
    /// last had drained faster: the order's drift cancels out): the mean
    /// messages per second of each.
    async fn busy_sources(&mut self) -> (f64, f64) {
        let n = if self.quick { 10_000 } else { 50_000 };
        let names: Vec<String> = (0..4).map(|i| format!("outboxd_bench_busy{i}")).collect();
        let queue = "bench-busy";
        let mut rates = Vec::new();
        for separate in [false, true, true, false] {
            let (mut stores, mut configs, mut urls) = (Vec::new(), Vec::new(), Vec::new());
            for name in &names {
                let (store, config, url) = self.fresh(name, "").await;
                self.seed(&store, n, queue, false).await;
                stores.push(store);
                configs.push(config);
                urls.push(url);
            }
            self.declare_purged(queue).await;
            let start = Instant::now();
            let mut children: Vec<Child> = if separate {
                configs
                    .iter()
                    .map(|c| self.spawn(c, &["--silent"]))
                    .collect()
            } else {
                vec![self.spawn(&self.sources_config(&urls), &["--silent"])]
            };
            loop {
                let mut pending = false;
                for store in &stores {
                    pending |= any_pending(store).await;
                }
                if !pending {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(600),
                    "drain did not finish"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let took = start.elapsed();
            for c in &mut children {
                terminate(c);
            }
            for store in stores {
                store.close().await;
            }
            rates.push((4 * n) as f64 / took.as_secs_f64());
        }
        for name in &names {
            self.drop_database(name).await;
        }
        ((rates[0] + rates[3]) / 2.0, (rates[1] + rates[2]) / 2.0)
    }

    /// Section 11 (`--only reload`): [`Bench::reload`]'s figures.
    pub(super) async fn reloads(&mut self) {
        println!(
            "reload: a source added to and removed from a busy worker by SIGHUP, {RELOADS} times"
        );
        let (joins, leaves) = self.reload().await;
        let spread = |d: &[Duration]| {
            let mut v = d.to_vec();
            v.sort();
            (v[v.len() / 2], v[v.len() - 1])
        };
        let ((join_median, join_max), (leave_median, leave_max)) =
            (spread(&joins), spread(&leaves));
        self.row(
            "SIGHUP adds a source to a busy worker: first row published",
            format!("{:.0} / {:.0} ms", ms(join_median), ms(join_max)),
            format!("median / max of {RELOADS}; target <= 2 s"),
        );
        self.row(
            "SIGHUP removes it again: every lease released",
            format!("{:.0} / {:.0} ms", ms(leave_median), ms(leave_max)),
            format!("median / max of {RELOADS}; target <= 2 s"),
        );
        self.results.insert(
            "reload".into(),
            json!({ "join_ms": joins.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
                    "leave_ms": leaves.iter().map(|d| ms(*d)).collect::<Vec<_>>() }),
        );
    }

    /// Reconfiguration under load (the target: an added source joined and
    /// draining, a removed one's leases released, each within 2 s): one
    /// worker drains a backlog on two sources; a third, with 200 rows
    /// waiting, is added to its file and SIGHUP sent, then removed and
    /// SIGHUP sent, [`RELOADS`] times. Per round: from the signal to the
    /// third source's first row published, and to none of its buckets
    /// leased any more.
    async fn reload(&mut self) -> (Vec<Duration>, Vec<Duration>) {
        let n = if self.quick { 50_000 } else { 200_000 };
        let queue = "bench-reload";
        self.declare_purged(queue).await;
        let names = [
            "outboxd_bench_reload_a",
            "outboxd_bench_reload_b",
            "outboxd_bench_reload_c",
        ];
        let (mut stores, mut urls) = (Vec::new(), Vec::new());
        for (i, name) in names.iter().enumerate() {
            let (store, _, url) = self.fresh(name, "").await;
            if i < 2 {
                self.seed(&store, n, queue, false).await;
            }
            stores.push(store);
            urls.push(url);
        }
        let two = std::fs::read_to_string(self.sources_config(&urls[..2])).unwrap();
        let three = std::fs::read_to_string(self.sources_config(&urls)).unwrap();
        let path = self.dir.join("reload.toml");
        std::fs::write(&path, &two).unwrap();
        let mut worker = self.spawn(&path, &["--silent"]);
        let c = &stores[2];
        let published = async || -> i64 {
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
                .fetch_one(pg(c))
                .await
                .unwrap()
        };
        let leased = async || -> i64 {
            sqlx::query_scalar(
                "SELECT count(*) FROM outbox_partitions WHERE lease_owner IS NOT NULL AND lease_until > now()",
            )
            .fetch_one(pg(c))
            .await
            .unwrap()
        };
        // Busy first: both sources publishing.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (mut joins, mut leaves) = (Vec::new(), Vec::new());
        for _ in 0..RELOADS {
            let before = published().await;
            self.seed(c, 200, queue, false).await;
            std::fs::write(&path, &three).unwrap();
            let sent = Instant::now();
            signal(&worker, "HUP");
            while published().await == before {
                assert!(
                    sent.elapsed() < Duration::from_secs(60),
                    "the added source never published"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            joins.push(sent.elapsed());
            while any_pending(c).await {
                assert!(
                    sent.elapsed() < Duration::from_secs(60),
                    "the added source never drained"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            std::fs::write(&path, &two).unwrap();
            let sent = Instant::now();
            signal(&worker, "HUP");
            while leased().await > 0 {
                assert!(
                    sent.elapsed() < Duration::from_secs(60),
                    "the removed source kept its leases"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            leaves.push(sent.elapsed());
        }
        let mut busy = false;
        for store in &stores[..2] {
            busy |= any_pending(store).await;
        }
        assert!(busy, "the backlog ran out before the last reload: raise n");
        terminate(&mut worker);
        for (store, name) in stores.into_iter().zip(names) {
            store.close().await;
            self.drop_database(name).await;
        }
        (joins, leaves)
    }

    /// A config file serving the databases `urls` as sources.
    fn sources_config(&self, urls: &[String]) -> PathBuf {
        let mut toml = format!("[amqp]\nurl = \"{}\"\n", self.amqp_url);
        for (i, url) in urls.iter().enumerate() {
            toml.push_str(&format!(
                "\n[[source]]\nname = \"s{i:02}\"\nurl = \"{url}\"\n"
            ));
        }
        let path = self.dir.join(format!("sources-{}.toml", urls.len()));
        std::fs::write(&path, toml).unwrap();
        path
    }

    /// A worker serving `config` (the databases `names`), measured over
    /// `over` once it has settled: its pools grew at start-up (every bucket
    /// claims at once) and shrink only after `store::trim::QUIET` (30 s),
    /// one connection a second.
    async fn idle(&self, config: &Path, names: &[String], over: Duration) -> Idle {
        let mut worker = self.spawn(config, &["--silent"]);
        tokio::time::sleep(SETTLE).await;
        let admin = with_path(&self.admin_url, "postgres");
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
            .await
            .unwrap();
        let transactions = async |conn: &mut sqlx::PgConnection| -> i64 {
            sqlx::query_scalar(
                "SELECT coalesce(sum(xact_commit + xact_rollback), 0)::int8
                 FROM pg_stat_database WHERE datname = ANY($1)",
            )
            .bind(names)
            .fetch_one(conn)
            .await
            .unwrap()
        };
        let (ticks0, tx0) = (
            cpu_ticks(worker.id()).unwrap_or(0),
            transactions(&mut conn).await,
        );
        tokio::time::sleep(over).await;
        let (ticks1, tx1) = (
            cpu_ticks(worker.id()).unwrap_or(0),
            transactions(&mut conn).await,
        );
        let connections: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = ANY($1)")
                .bind(names)
                .fetch_one(&mut conn)
                .await
                .unwrap();
        let rss_kb = status_kb(worker.id(), "VmRSS:");
        terminate(&mut worker);
        let secs = over.as_secs_f64();
        Idle {
            rss_kb: rss_kb as f64,
            cpu_share: (ticks1 - ticks0) as f64 / clock_ticks() as f64 / secs,
            connections: connections as f64,
            transactions_per_s: (tx1 - tx0) as f64 / secs,
        }
    }
}
