//! RabbitMQ cluster failover: two workers publish to a quorum queue on a
//! real 3-node cluster (private nodes from Debian's package, each on its own
//! test host); the node a worker is connected to is killed with SIGKILL
//! mid-drain, twice, and then one node is partitioned away from the other
//! two. Each worker lists every node (`amqp.url` with commas) and moves to
//! a live one, replaying from the first unconfirmed row. Judged by the
//! checker: 0 lost, 0 unexpected, 0 per-key order violations.

mod common;

use std::time::{Duration, Instant};

use common::hosts::{Fault, Lab, RabbitCluster};
use common::*;
use outboxd::demo::QueueReader;

/// The checker's consumer and the node it reads from.
struct Reader {
    queue: QueueReader,
    node: usize,
    /// Times it had to move to another node.
    moves: usize,
}

impl Reader {
    /// Reads for `d`; if its node went away, reads on through another
    /// (what it had not acknowledged comes again: duplicates on the
    /// consumer's side, not the relay's).
    async fn pump(&mut self, cluster: &RabbitCluster, d: Duration) {
        let _ = self.queue.read_until(d, |_| false).await;
        if !self.queue.is_connected() {
            self.move_off(cluster, self.node).await;
        }
    }

    /// Reads from a node other than `avoid`.
    async fn move_off(&mut self, cluster: &RabbitCluster, avoid: usize) {
        for i in (0..cluster.len()).filter(|&i| i != avoid) {
            if self.queue.reconnect(&cluster.url(i)).await.is_ok() {
                (self.node, self.moves) = (i, self.moves + 1);
                return;
            }
        }
    }
}

/// How many times a worker's log says it connected to RabbitMQ.
fn connects(w: &WorkerProcess) -> usize {
    w.log_text().matches("connected to RabbitMQ").count()
}

/// Waits, reading, until `worker` has connected to a node other than
/// `lost` and the fleet has published 300 rows beyond `published` (or all
/// there were);
/// returns (time to the new connection, time until publishing resumed).
async fn wait_failover(
    env: &TestEnv,
    reader: &mut Reader,
    cluster: &RabbitCluster,
    worker: &WorkerProcess,
    lost: usize,
    connects_before: usize,
    published: i64,
) -> (Duration, Duration) {
    let at = Instant::now();
    let more = env.count("published_at IS NULL").await.min(300);
    let mut moved = None;
    loop {
        reader.pump(cluster, Duration::from_millis(100)).await;
        if moved.is_none()
            && connects(worker) > connects_before
            && cluster
                .node_in_log(&worker.log_text())
                .is_some_and(|n| n != lost)
        {
            moved = Some(at.elapsed());
        }
        if let Some(moved) = moved
            && env.count("published_at IS NOT NULL").await >= published + more
        {
            return (moved, at.elapsed());
        }
        assert!(
            at.elapsed() < Duration::from_secs(60),
            "no failover from node {lost}; the worker's log:\n{}",
            worker.log_text()
        );
    }
}

/// A database, a quorum queue the checker reads from node 2, and two
/// converged workers on lab hosts 1 and 2 listing the nodes by `urls`
/// (worker 2 in another order), with `extra_toml` in their configuration.
/// Node 2 is last in both lists: no fault ever touches it (a consumer whose
/// node dies gets its unacknowledged messages again, later — duplicates
/// and reordering on the consumer's side, not the relay's).
async fn two_workers(
    lab: &Lab,
    cluster: &RabbitCluster,
    urls: impl Fn([usize; 3]) -> String,
    extra_toml: &str,
) -> (TestEnv, String, Reader, Vec<WorkerProcess>) {
    let env = TestEnv::with(Tuning {
        amqp_url: Some(urls([0, 1, 2])),
        extra_toml: extra_toml.to_string(),
        ..lab.tuning(Tuning::hosts())
    })
    .await;
    let config2 = env.config_variant("worker2", |t| t.replace(&urls([0, 1, 2]), &urls([1, 0, 2])));
    let queue = unique("q");
    let reader = Reader {
        queue: QueueReader::open_quorum(&cluster.url(2), &queue)
            .await
            .unwrap(),
        node: 2,
        moves: 0,
    };
    let workers = vec![
        env.spawn_worker_on(Some(&lab.netns(1)), &env.config_path, &[]),
        env.spawn_worker_on(Some(&lab.netns(2)), &config2, &[]),
    ];
    wait_converged(&env, 2, Duration::from_secs(30)).await;
    (env, queue, reader, workers)
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_move_to_a_live_node_when_theirs_is_killed_or_partitioned_away() {
    let lab = Lab::database_only(5);
    let cluster = RabbitCluster::start(&lab, &[3, 4, 5]);
    let urls = |order: [usize; 3]| order.map(|i| cluster.url(i)).join(",");
    let (env, queue, mut reader, mut workers) = two_workers(&lab, &cluster, urls, "").await;
    // Production outlasts the three faults.
    let total = 16_000;
    let producing = tokio::spawn(produce_evenly(
        env.db.clone(),
        queue.clone(),
        total,
        300,
        Duration::from_secs(80),
    ));
    env.wait_count("published_at IS NOT NULL", 500, Duration::from_secs(30))
        .await;

    let mut figures = Vec::new();
    for round in 1..=2 {
        let node = cluster
            .node_in_log(&workers[0].log_text())
            .expect("worker 1 is connected");
        let (before, published) = (
            connects(&workers[0]),
            env.count("published_at IS NOT NULL").await,
        );
        let dups = reader.queue.checker.duplicates();
        cluster.kill9(node);
        let (moved, resumed) = wait_failover(
            &env,
            &mut reader,
            &cluster,
            &workers[0],
            node,
            before,
            published,
        )
        .await;
        figures.push(format!(
            "kill -9 #{round} of node {node}: worker 1 on another node after {moved:.2?}, the fleet published 300 more after {resumed:.2?}, {} duplicates",
            reader.queue.checker.duplicates() - dups
        ));
        cluster.start_node(node);
        reader.pump(&cluster, Duration::from_secs(2)).await;
    }

    // After the kills of nodes 0 and 1, worker 2 is on node 0: cut that
    // node off from the other two.
    let node = cluster
        .node_in_log(&workers[1].log_text())
        .expect("worker 2 is connected");
    assert_ne!(node, reader.node, "the checker's node is never cut off");
    let others: Vec<String> = (0..cluster.len())
        .filter(|&i| i != node)
        .map(|i| cluster.host(i).to_string())
        .collect();
    let (before, published) = (
        connects(&workers[1]),
        env.count("published_at IS NOT NULL").await,
    );
    let dups = reader.queue.checker.duplicates();
    lab.fault_ports(
        cluster.host(node),
        &format!("hosts:{}", others.join(",")),
        Fault::Blackhole,
    );
    let (moved, resumed) = wait_failover(
        &env,
        &mut reader,
        &cluster,
        &workers[1],
        node,
        before,
        published,
    )
    .await;
    figures.push(format!(
        "node {node} partitioned from the other two: worker 2 on another node after {moved:.2?}, the fleet published 300 more after {resumed:.2?}"
    ));
    reader.pump(&cluster, Duration::from_secs(5)).await;
    figures.push(format!(
        "{} duplicates",
        reader.queue.checker.duplicates() - dups
    ));
    lab.heal(cluster.host(node));
    let dups = reader.queue.checker.duplicates();
    reader.pump(&cluster, Duration::from_secs(3)).await;
    figures.push(format!(
        "healed: {} duplicates in the next 3 s",
        reader.queue.checker.duplicates() - dups
    ));

    producing.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while reader.queue.checker.unique() < total && Instant::now() < deadline {
        reader.pump(&cluster, Duration::from_millis(500)).await;
    }
    reader.pump(&cluster, Duration::from_millis(500)).await;
    let v = reader.queue.checker.verdict(env.all_ids().await);
    println!(
        "cluster: {}; {} (the checker moved to another node {} times)",
        figures.join("; "),
        v.summary(),
        reader.moves
    );
    assert!(v.is_clean(), "{v:?}");
    terminate_all(&mut workers);
}

/// The first scenario over TLS: every node also listens for AMQPS (one
/// certificate naming each node's address, from a private CA), the workers
/// list the nodes as `amqps://` URLs; the node worker 1 is on is killed
/// with SIGKILL mid-drain and it moves to a live node over TLS.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_amqps_workers_move_to_a_live_node_when_theirs_is_killed() {
    let lab = Lab::database_only(5);
    let pki = common::tls::Pki::new();
    let cluster = RabbitCluster::start_tls(&lab, &[3, 4, 5], &pki);
    let urls = |order: [usize; 3]| order.map(|i| cluster.tls_url(i)).join(",");
    let tls = format!("[amqp.tls]\nca_file = \"{}\"\n", pki.ca.display());
    let (env, queue, mut reader, mut workers) = two_workers(&lab, &cluster, urls, &tls).await;
    let total = 6_000;
    let producing = tokio::spawn(produce_evenly(
        env.db.clone(),
        queue.clone(),
        total,
        300,
        Duration::from_secs(30),
    ));
    env.wait_count("published_at IS NOT NULL", 500, Duration::from_secs(30))
        .await;
    let log = workers[0].log_text();
    assert!(log.contains("url=amqps://"), "connected over TLS: {log}");
    let node = cluster.node_in_log(&log).expect("worker 1 is connected");
    let (before, published) = (
        connects(&workers[0]),
        env.count("published_at IS NOT NULL").await,
    );
    cluster.kill9(node);
    let (moved, resumed) = wait_failover(
        &env,
        &mut reader,
        &cluster,
        &workers[0],
        node,
        before,
        published,
    )
    .await;
    let last = workers[0]
        .log_text()
        .lines()
        .rev()
        .find(|l| l.contains("connected to RabbitMQ"))
        .unwrap_or_default()
        .to_string();
    assert!(
        last.contains("amqps://"),
        "still TLS after the failover: {last}"
    );
    producing.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while reader.queue.checker.unique() < total && Instant::now() < deadline {
        reader.pump(&cluster, Duration::from_millis(500)).await;
    }
    reader.pump(&cluster, Duration::from_millis(500)).await;
    let v = reader.queue.checker.verdict(env.all_ids().await);
    println!(
        "cluster over amqps: kill -9 of node {node}: worker 1 on another node after {moved:.2?}, the fleet published 300 more after {resumed:.2?}; {}",
        v.summary()
    );
    assert!(v.is_clean(), "{v:?}");
    terminate_all(&mut workers);
}
