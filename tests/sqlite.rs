//! What only SQLite has: producers in other processes and languages writing
//! the same file with a plain `INSERT` (Python's `sqlite3`, no extension),
//! and one writer at a time — a writer holding the file's write lock delays
//! the fleet and never breaks it. The process-level suites run on SQLite
//! too (`sqlite::` beside `postgres::` and `mariadb::`).

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use common::*;
use outboxd::demo::QueueReader;

/// A Python producer: `n` rows over `keys` keys to `queue`, one
/// transaction each, spread over `secs` seconds; plain `INSERT`s naming
/// only the key, exchange, routing key and payload (the row's number).
fn python_producer(
    file: &str,
    queue: &str,
    n: usize,
    keys: usize,
    secs: f64,
) -> std::process::Child {
    const SCRIPT: &str = r#"
import sqlite3, sys, time
path, queue, n, keys, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
db = sqlite3.connect(path, timeout=60, isolation_level=None)
start = time.monotonic()
for i in range(n):
    db.execute("BEGIN")
    db.execute("INSERT INTO outbox (message_key, exchange, routing_key, payload) VALUES (?, '', ?, ?)",
               ("key-%d" % (i % keys), queue, str(i).encode()))
    db.execute("COMMIT")
    delay = start + secs * (i + 1) / n - time.monotonic()
    if delay > 0:
        time.sleep(delay)
"#;
    Command::new("python3")
        .args(["-c", SCRIPT, file, queue])
        .args([n.to_string(), keys.to_string(), secs.to_string()])
        .spawn()
        .expect("python3 runs (scripts/test.sh installs it)")
}

fn file_of(env: &TestEnv) -> String {
    env.db_url.trim_start_matches("sqlite://").to_string()
}

/// Python writes while 3 workers drain; the fleet is stopped, the bucket
/// count changed from 16 to 7 while Python goes on writing (its inserts
/// wait for the change, then get labels of the new count from the
/// trigger), and 3 workers with the new count deliver everything, in key
/// order.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_python_producer_writes_with_plain_inserts_while_three_workers_drain_and_across_a_repartition()
 {
    let env = TestEnv::with(Tuning::fleet().on(Db::Sqlite)).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let mut fleet: Vec<WorkerProcess> = (0..3).map(|_| env.spawn_worker(&["--silent"])).collect();
    let mut first = python_producer(&file_of(&env), &queue, 3_000, 100, 6.0);
    assert!(
        first.wait().unwrap().success(),
        "the Python producer failed"
    );
    let (all, v) = read_and_judge(&mut reader, &env, 3_000, Duration::from_secs(60)).await;
    assert!(all && v.is_clean(), "{}", v.summary());
    terminate_all(&mut fleet);

    let mut second = python_producer(&file_of(&env), &queue, 2_000, 100, 4.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = env.command(&["repartition", "--to", "7"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        second.wait().unwrap().success(),
        "the Python producer failed"
    );
    let seven = outboxd::partitioner::Partitioner::new(7);
    let rows: Vec<(String, String)> = env
        .db
        .rows("SELECT message_key, partition_key FROM outbox WHERE published_at IS NULL")
        .await;
    assert!(
        !rows.is_empty(),
        "nothing was left to drain under the new count"
    );
    for (key, label) in &rows {
        assert_eq!(*label, seven.label_for(key), "{key}");
    }
    let toml = std::fs::read_to_string(&env.config_path).unwrap();
    std::fs::write(
        &env.config_path,
        toml.replace("partition_count = 16", "partition_count = 7"),
    )
    .unwrap();
    let mut fleet: Vec<WorkerProcess> = (0..3).map(|_| env.spawn_worker(&["--silent"])).collect();
    let (all, v) = read_and_judge(&mut reader, &env, 5_000, Duration::from_secs(60)).await;
    eprintln!(
        "Python producer, 3 workers, repartition 16 → 7: {}",
        v.summary()
    );
    assert!(all && v.is_clean(), "{}", v.summary());
    terminate_all(&mut fleet);
}

/// Another process takes the file's write lock for 3 s, three times, while
/// 3 workers drain a steady stream: they wait (writes fail as busy and are
/// retried), and afterwards no epoch went to two owners, every delivery
/// was made under an epoch acquired exactly once, and nothing was lost,
/// repeated out of order or invented.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_holding_the_write_lock_for_3_s_delays_the_fleet_and_never_breaks_it() {
    let env = TestEnv::with(Tuning::fleet().on(Db::Sqlite)).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue)
        .await
        .unwrap()
        .keep_log();
    let mut fleet: Vec<WorkerProcess> = (0..3).map(|_| env.spawn_worker(&["--silent"])).collect();
    wait_converged(&env, 3, Duration::from_secs(15)).await;
    let mut producer = python_producer(&file_of(&env), &queue, 3_000, 100, 15.0);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let lock = env.db.hold_write_lock().await.expect("an SQLite file");
        let before = env.count("published_at IS NOT NULL").await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let during = env.count("published_at IS NOT NULL").await;
        assert_eq!(
            before, during,
            "a row was recorded while the test held the write lock"
        );
        lock.commit().await;
    }
    assert!(
        producer.wait().unwrap().success(),
        "the Python producer failed"
    );
    let (all, v) = read_and_judge(&mut reader, &env, 3_000, Duration::from_secs(60)).await;

    let acquired: Vec<(String, i64)> = env
        .db
        .rows("SELECT partition_key, new_epoch FROM outbox_lease_events WHERE action = 'acquire'")
        .await;
    let mut times: BTreeMap<(String, i64), usize> = BTreeMap::new();
    for a in acquired {
        *times.entry(a).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "epochs acquired twice: {twice:?}");
    let log = reader.log.as_ref().unwrap();
    let unowned: Vec<_> = log
        .iter()
        .filter(|d| {
            let epoch = d.lease_epoch.expect("fleet deliveries carry their epoch");
            !times.contains_key(&(d.partition_key.clone(), epoch))
        })
        .collect();
    eprintln!(
        "3 s write locks x 3: {} deliveries, {} acquisitions; {}",
        log.len(),
        times.len(),
        v.summary()
    );
    assert!(
        unowned.is_empty(),
        "published under an epoch nobody acquired: {unowned:?}"
    );
    assert!(all && v.is_clean(), "{}", v.summary());
    terminate_all(&mut fleet);
}

/// A worker draining a backlog keeps the WAL file near its limit: SQLite
/// starts the WAL over only when a write finds it wholly copied back, which
/// a steady stream of records never allows, so without the worker's
/// truncating checkpoint the file grew by about a page per message and
/// stayed that large (840 MB after 200,000 rows).
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_a_backlog_keeps_the_wal_file_near_its_limit() {
    use outboxd::store::sqlite::pool::WAL_LIMIT;
    const ROWS: usize = 40_000;
    let env = TestEnv::on(Db::Sqlite).await;
    let queue = unique("q");
    drop(QueueReader::open(&amqp_url(), &queue).await.unwrap());
    // 400-byte payloads over 300 keys: each bucket's rows are spread over
    // the file's pages, so every recorded batch rewrites a page per row.
    env.db
        .exec(&format!(
            "INSERT INTO outbox (message_key, exchange, routing_key, payload)
             WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {})
             SELECT 'k-' || (i % 300), '', '{queue}', randomblob(400) FROM n",
            ROWS - 1
        ))
        .await;
    let wal = format!("{}-wal", file_of(&env));
    let size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    let start = std::time::Instant::now();
    let mut largest = 0;
    while env.count("published_at IS NULL").await > 0 {
        largest = largest.max(size());
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the backlog was not drained"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = start.elapsed();
    // The checkpoint runs once a second: two of them after the drain.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let after = size();
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "{ROWS} rows drained in {drained:?}: WAL file at most {:.1} MB during, {:.1} MB after (limit {:.0} MB)",
        mb(largest),
        mb(after),
        mb(WAL_LIMIT)
    );
    assert!(
        after <= WAL_LIMIT,
        "the WAL file stayed at {:.1} MB",
        mb(after)
    );
    assert!(
        largest <= 3 * WAL_LIMIT,
        "the WAL file grew to {:.1} MB",
        mb(largest)
    );
    assert!(worker.terminate(EXIT_WITHIN).success());
}
