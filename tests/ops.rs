//! `outboxd status` and `outboxd failed`, run as real commands.

mod common;

use std::process::Output;
use std::time::Duration;

use common::*;
use outboxd::demo::QueueReader;
use outboxd::producer::Message;

fn run(env: &TestEnv, args: &[&str]) -> Output {
    env.command(args).output().unwrap()
}

/// Asserts the command exited 0, showing its stderr if not.
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn park(env: &TestEnv, ids: &[i64], error: &str) {
    env.db
        .exec(&format!(
            "UPDATE outbox SET failed_at = {}, attempts = 5, last_error = '{error}' WHERE id IN ({})",
            env.db.now(),
            list(ids)
        ))
        .await;
}

/// `n` messages of keys k0, k1, … to `queue`; their ids.
async fn enqueue_keys(env: &TestEnv, queue: &str, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            env.db
                .enqueue(Message::new(format!("k{i}"), "", queue, "x"))
                .await,
        );
    }
    ids
}

async fn status_prints_the_summary_as_text_and_json(db: Db) {
    let env = TestEnv::on(db).await;
    let ids = enqueue_keys(&env, "q", 12).await;
    park(&env, &ids[..2], "unroutable").await;
    env.db
        .exec(&format!(
            "UPDATE outbox SET attempts = 1, last_error = 'boom' WHERE id = {}",
            ids[5]
        ))
        .await;
    let blocked: String = env
        .db
        .value(&format!(
            "SELECT partition_key FROM outbox WHERE id = {}",
            ids[5]
        ))
        .await;

    let out = run(&env, &["status", "--json"]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["totals"]["pending"], 10);
    assert_eq!(v["totals"]["parked"], 2);
    assert_eq!(v["totals"]["blocked_buckets"], 1);
    assert_eq!(v["partitions"].as_array().unwrap().len(), 16);

    let out = run(&env, &["status"]);
    let text = stdout(&out);
    assert!(out.status.success());
    assert!(
        text.starts_with("workers 0 live | buckets 0/16 owned | pending 10 | parked 2 | blocked 1"),
        "{text}"
    );
    let line = text.lines().find(|l| l.starts_with(&blocked)).unwrap();
    assert!(
        line.ends_with(&format!("BLOCKED at #{}: boom", ids[5])),
        "{line}"
    );
    // No worker has registered: one line says so, not an empty table.
    assert!(
        text.contains("\nno workers: none has registered (start one with `outboxd work`)\n"),
        "{text}"
    );
    assert!(!text.contains("WORKER "), "{text}");
}

async fn a_requeued_message_goes_out_before_the_later_pending_messages_of_its_bucket(db: Db) {
    let env = TestEnv::on(db).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    // One key: its first message is parked, the next two are still pending.
    let m = |n: &str| Message::new("order-7", "", queue.clone(), n);
    let first = env.db.enqueue(m("1")).await;
    let later = [env.db.enqueue(m("2")).await, env.db.enqueue(m("3")).await];
    park(&env, &[first], "unroutable: fixed since").await;
    let bucket = env.partitioner().label_for("order-7");

    let out = run(&env, &["failed", "list", "--bucket", &bucket]);
    assert!(
        stdout(&out).contains(&format!("{first:>10} {bucket}")),
        "{}",
        stdout(&out)
    );
    let out = run(&env, &["failed", "list", "--bucket", "p99"]);
    assert!(!out.status.success());
    let out = run(&env, &["failed", "requeue", &first.to_string()]);
    assert_ok(&out);
    assert!(stdout(&out).contains("requeued 1 message(s)"));

    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    let (all, v) = read_and_judge(&mut reader, &env, 3, Duration::from_secs(20)).await;
    assert!(all && v.is_clean(), "{v:?}");
    // First deliveries in id order for the key: the requeued one first.
    assert_eq!(v.order_violations.len(), 0);
    assert!(
        reader.checker.has(first) && reader.checker.has(later[0]) && reader.checker.has(later[1])
    );
    let audited: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_audit WHERE action = 'requeue' AND actor LIKE 'cli %'")
        .await;
    assert_eq!(audited, 1);
    assert!(worker.terminate(EXIT_WITHIN).success());
}

async fn drop_needs_yes_takes_only_parked_rows_and_is_audited(db: Db) {
    let env = TestEnv::on(db).await;
    let parked = env.db.enqueue(Message::new("k", "", "q", "x")).await;
    let pending = env.db.enqueue(Message::new("k2", "", "q", "y")).await;
    park(&env, &[parked], "too large").await;

    let out = run(&env, &["failed", "drop", &parked.to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        env.count(&format!("id = {parked}")).await,
        1,
        "nothing dropped without --yes"
    );

    let out = run(
        &env,
        &[
            "failed",
            "drop",
            &parked.to_string(),
            &pending.to_string(),
            "--yes",
            "--reason",
            "bad payload",
        ],
    );
    // The parked row goes; the pending one is named, and the command fails.
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("dropped 1 message(s)"),
        "{}",
        stdout(&out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "not dropped (neither parked nor a blocked head waiting for its retry, or no such id): [{pending}]"
        )),
        "{err}"
    );
    assert_eq!(env.count(&format!("id = {parked}")).await, 0);
    assert_eq!(
        env.count(&format!("id = {pending}")).await,
        1,
        "a pending row is never dropped"
    );
    let detail: serde_json::Value = env
        .db
        .value("SELECT detail FROM outbox_audit WHERE action = 'drop'")
        .await;
    let (reason, dropped_id) = (
        detail["reason"].as_str().unwrap().to_string(),
        detail["messages"][0]["id"].as_i64().unwrap(),
    );
    assert_eq!((reason.as_str(), dropped_id), ("bad payload", parked));
}

/// A row the broker cannot route, under the default `max_attempts = 0`,
/// blocks its bucket: `outboxd failed list` names it, `failed retry` sends
/// it again now (still unroutable), `failed park` lets the rest of its
/// bucket go on with one command, audited; after a queue is there,
/// A row that is not a blocked head (here a published and a parked one) is
/// refused by `park` and `retry`, which exit 1 naming it.
async fn a_blocked_head_is_unblocked_with_one_command(db: Db) {
    let env = TestEnv::with(Tuning {
        retry_backoff_initial: "60s",
        retry_backoff: "60s",
        ..Tuning::default().on(db)
    })
    .await;
    let queue = unique("q");
    let missing = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    // One key: its first message goes nowhere, the next one to the queue.
    let head = env
        .db
        .enqueue(Message::new("order-9", "", missing.clone(), "1"))
        .await;
    let behind = env
        .db
        .enqueue(Message::new("order-9", "", queue.clone(), "2"))
        .await;
    let never_failed = env
        .db
        .enqueue(Message::new("k-other", "", queue.clone(), "3"))
        .await;
    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    env.wait_count(
        &format!("id = {head} AND attempts = 1"),
        1,
        Duration::from_secs(20),
    )
    .await;
    let bucket = env.partitioner().label_for("order-9");

    let out = run(&env, &["failed", "list"]);
    assert_ok(&out);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{head} {bucket}")))
        .unwrap_or_else(|| panic!("the blocked head is not listed:\n{text}"));
    assert!(line.contains("unroutable"), "{line}");

    // Retry now: sent again at once (a second attempt), not in a minute.
    let out = run(&env, &["failed", "retry", &head.to_string()]);
    assert_ok(&out);
    env.wait_count(
        &format!("id = {head} AND attempts = 2"),
        1,
        Duration::from_secs(20),
    )
    .await;

    // Park: the row behind it goes out, the head waits for a decision.
    let out = run(
        &env,
        &[
            "failed",
            "park",
            &head.to_string(),
            "--reason",
            "no such queue yet",
        ],
    );
    assert_ok(&out);
    assert!(
        stdout(&out).contains("parked 1 message(s)"),
        "{}",
        stdout(&out)
    );
    assert!(
        reader
            .read_until(Duration::from_secs(20), |c| c.has(behind)
                && c.has(never_failed))
            .await
            .unwrap(),
        "the bucket did not resume after its head was parked"
    );
    let audit: serde_json::Value = env
        .db
        .value("SELECT detail FROM outbox_audit WHERE action = 'park'")
        .await;
    assert_eq!(audit["reason"], "no such queue yet");
    assert_eq!(audit["messages"][0]["id"].as_i64(), Some(head));
    let retried: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_audit WHERE action = 'retry'")
        .await;
    assert_eq!(retried, 1);

    // Refused, named, exit 1: a published row and one that is parked now.
    for action in [["failed", "park"], ["failed", "retry"]] {
        let out = run(
            &env,
            &[action[0], action[1], &behind.to_string(), &head.to_string()],
        );
        assert_eq!(out.status.code(), Some(1), "{action:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not a blocked head waiting for its retry")
                && err.contains(&format!("[{behind}, {head}]")),
            "{action:?}: {err}"
        );
    }
    assert!(worker.terminate(EXIT_WITHIN).success());
}

async fn purge_deletes_only_published_rows_past_the_cut_off_and_respects_the_lock(db: Db) {
    let env = TestEnv::on(db).await;
    let ids = enqueue_keys(&env, "q", 11).await;
    let ago = |days: i64| env.db.now_plus(-days * 86_400);
    let db = &env.db;
    let set = |assignments: String, ids: &[i64]| {
        let sql = format!(
            "UPDATE outbox SET {assignments} WHERE id IN ({})",
            list(ids)
        );
        async move { db.exec(&sql).await }
    };
    // 5 published 10 days ago, 3 published an hour ago, 2 old pending, 1 old parked.
    set(
        format!("created_at = {}, published_at = {}", ago(11), ago(10)),
        &ids[..5],
    )
    .await;
    set(
        format!("published_at = {}", env.db.now_plus(-3600)),
        &ids[5..8],
    )
    .await;
    set(format!("created_at = {}", ago(30)), &ids[8..10]).await;
    set(
        format!("created_at = {}, failed_at = {}", ago(30), ago(20)),
        &ids[10..],
    )
    .await;

    let out = run(&env, &["purge", "--older-than", "7d", "--dry-run"]);
    assert_eq!(
        stdout(&out).trim(),
        "would delete 5 published row(s) older than 7d"
    );
    assert_eq!(env.count("true").await, 11, "a dry run deletes nothing");

    // While another process holds the purge lock, nothing is deleted
    // (SQLite has no purge lock: purges take turns on the file's write lock).
    if let Some(holder) = hold_purge_lock(&env).await {
        let out = run(&env, &["purge", "--older-than", "7d"]);
        assert_eq!(
            stdout(&out).trim(),
            "deleted 0 published row(s) older than 7d"
        );
        holder.commit().await;
    }

    let out = run(&env, &["purge", "--older-than", "7d"]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out).trim(),
        "deleted 5 published row(s) older than 7d"
    );
    assert_eq!(
        env.count("published_at IS NOT NULL").await,
        3,
        "newer published rows are kept"
    );
    assert_eq!(
        env.count("published_at IS NULL AND failed_at IS NULL")
            .await,
        2,
        "pending rows are never purged"
    );
    assert_eq!(
        env.count("failed_at IS NOT NULL").await,
        1,
        "parked rows are never purged"
    );
    let out = run(&env, &["purge", "--older-than", "soon"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Holds the lock that lets one process purge at a time, the way another
/// purging process does, until the returned transaction ends.
async fn hold_purge_lock(env: &TestEnv) -> Option<Held> {
    Some(match &env.db {
        TestDb::Pg(pool) => {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(outboxd::store::postgres::outbox::PURGE_LOCK)
                .execute(&mut *tx)
                .await
                .unwrap();
            Held::Pg(tx)
        }
        TestDb::My(pool) => {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SELECT name FROM outbox_locks WHERE name = 'purge' FOR UPDATE")
                .execute(&mut *tx)
                .await
                .unwrap();
            Held::My(tx)
        }
        TestDb::Lite(_) => return None,
    })
}

/// Repartitioning with rows pending: a fleet drained part of a backlog and
/// was stopped; `repartition --to 7` runs while a producer keeps writing
/// (it must wait for the change, not slip rows in under the old count);
/// a worker with the old count refuses to start; a fleet with the new count
/// delivers everything: 0 lost, per-key order kept across the change.
async fn repartition_with_rows_pending_keeps_per_key_order_and_loses_nothing(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    // The backlog: 10,000 rows over 200 keys, committed in one go.
    let keys: Vec<String> = (0..200).map(|k| format!("key-{k}")).collect();
    env.db.exec(&plain_insert(&keys, &queue, 10_000)).await;

    let mut worker = env.spawn_worker(&["--silent", "--batch-size", "10"]);
    env.wait_count("published_at IS NOT NULL", 300, Duration::from_secs(30))
        .await;
    let out = run(&env, &["repartition", "--to", "7"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 worker(s) are live"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // With streams configured the refusal comes before the streams are
    // read: no stream port needed (nothing listens on this one).
    let out = env
        .command(&["repartition", "--to", "7"])
        .env(
            "OUTBOXD_AMQP__STREAM_URL",
            "rabbitmq-stream://guest:guest@127.0.0.1:9/%2f",
        )
        .env("OUTBOXD_AMQP__STREAMS", "nowhere")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 worker(s) are live"), "{err}");
    assert!(worker.terminate(EXIT_WITHIN).success());
    let published_before = env.count("published_at IS NOT NULL").await;
    assert!(
        published_before < 10_000,
        "the backlog drained before the change"
    );

    let out = run(&env, &["repartition", "--to", "7", "--dry-run"]);
    assert_ok(&out);
    assert!(
        stdout(&out).starts_with("dry run: 16 → 7 buckets"),
        "{}",
        stdout(&out)
    );
    assert_eq!(env.count("true").await, 10_000);

    // A producer writes through the change.
    let producing = tokio::spawn(produce_evenly(
        env.db.clone(),
        queue.clone(),
        1_000,
        200,
        Duration::from_secs(3),
    ));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let out = run(&env, &["repartition", "--to", "7"]);
    assert_ok(&out);
    assert!(
        stdout(&out).starts_with("repartitioned 16 → 7 buckets"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("set outbox.partition_count = 7"));
    producing.await.unwrap();

    let count: i32 = env
        .db
        .value("SELECT partition_count FROM outbox_settings")
        .await;
    assert_eq!(count, 7);
    let seven = outboxd::partitioner::Partitioner::new(7);
    let unpublished: Vec<(String, String)> = env
        .db
        .rows("SELECT message_key, partition_key FROM outbox WHERE published_at IS NULL")
        .await;
    assert!(
        unpublished
            .iter()
            .all(|(key, label)| *label == seven.label_for(key)),
        "an unpublished row kept a label of the old count"
    );
    assert_eq!(
        env.count("published_at IS NULL AND partition_key > 'p06'")
            .await,
        0
    );
    let buckets: Vec<String> = env
        .db
        .column("SELECT partition_key FROM outbox_partitions ORDER BY 1")
        .await;
    assert_eq!(buckets, ["p00", "p01", "p02", "p03", "p04", "p05", "p06"]);
    let audited: serde_json::Value = env
        .db
        .value("SELECT detail FROM outbox_audit WHERE action = 'repartition'")
        .await;
    assert_eq!(audited["from"], 16);
    assert_eq!(audited["to"], 7);

    // The old count is refused; the new one drains everything.
    let out = env.command(&["work", "--once"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the database has 7 buckets"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let toml = std::fs::read_to_string(&env.config_path).unwrap();
    std::fs::write(
        &env.config_path,
        toml.replace("partition_count = 16", "partition_count = 7"),
    )
    .unwrap();
    let mut fleet = [
        env.spawn_worker(&["--silent"]),
        env.spawn_worker(&["--silent"]),
    ];
    let (all, v) = read_and_judge(&mut reader, &env, 11_000, Duration::from_secs(90)).await;
    assert!(all, "{}", v.summary());
    assert!(
        v.lost.is_empty() && v.unexpected.is_empty(),
        "{}",
        v.summary()
    );
    assert!(v.order_violations.is_empty(), "{}", v.summary());
    eprintln!(
        "repartition 16 → 7 with {} of 10,000 published before it: {}",
        published_before,
        v.summary()
    );
    terminate_all(&mut fleet);
}

/// A row whose label is not a bucket of this deployment (a producer that
/// computed labels with another bucket count) would wait forever; it is
/// parked with an error that names the label and the right bucket, the
/// other buckets go on, and `failed requeue` re-labels and delivers it.
async fn a_row_with_an_unknown_bucket_label_is_parked_visibly_and_requeue_relabels_it(db: Db) {
    let env = TestEnv::on(db).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    enqueue_keys(&env, &queue, 20).await;
    env.db
        .exec(&format!(
            "INSERT INTO outbox (partition_key, message_key, routing_key, payload)
             VALUES ('p42', 'stray-key', '{queue}', 'x')"
        ))
        .await;
    let stray: i64 = env
        .db
        .value("SELECT id FROM outbox WHERE message_key = 'stray-key'")
        .await;
    let right = env.partitioner().label_for("stray-key");

    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    env.wait_count("failed_at IS NOT NULL", 1, Duration::from_secs(15))
        .await;
    let error: String = env
        .db
        .value(&format!("SELECT last_error FROM outbox WHERE id = {stray}"))
        .await;
    assert_eq!(
        error,
        format!(
            "unknown bucket label p42: this deployment has 16 buckets, and key 'stray-key' belongs to bucket {right}; requeue it to re-label it"
        )
    );
    let list = stdout(&run(&env, &["failed", "list"]));
    assert!(list.contains(&format!("{stray:>10} p42")), "{list}");
    let (_, v) = read_and_judge(&mut reader, &env, 20, Duration::from_secs(20)).await;
    assert_eq!(v.lost, vec![stray], "{}", v.summary());
    assert!(worker.log_text().contains("bucket label does not exist"));

    let out = run(&env, &["failed", "requeue", "--all"]);
    assert!(
        stdout(&out).contains(&format!("requeued 1 message(s): [{stray}]")),
        "{}",
        stdout(&out)
    );
    let (all, v) = read_and_judge(&mut reader, &env, 21, Duration::from_secs(20)).await;
    assert!(all && v.is_clean(), "{}", v.summary());
    let label: String = env
        .db
        .value(&format!(
            "SELECT partition_key FROM outbox WHERE id = {stray}"
        ))
        .await;
    assert_eq!(label, right);
    assert!(worker.terminate(EXIT_WITHIN).success());
}

/// A purge that deleted many rows vacuums the table, so the pending index
/// does not keep an entry for every purged row until autovacuum comes by.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn a_large_purge_vacuums_the_outbox_table() {
    let env = TestEnv::new().await;
    env.db
        .exec(
            "INSERT INTO outbox (partition_key, message_key, routing_key, payload, published_at)
             SELECT outbox_partition_for('k' || (g % 50)), 'k' || (g % 50), 'q', '\\x00',
                    now() - interval '2 days'
             FROM generate_series(1, 60000) g",
        )
        .await;
    let out = run(&env, &["purge", "--older-than", "1d"]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out).trim(),
        "deleted 60000 published row(s) older than 1d"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tidied the outbox table"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vacuumed: bool = env
        .db
        .value("SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'outbox'")
        .await;
    assert!(vacuumed);
}

/// A worker that outlives a change of the bucket count (one stopped while
/// `repartition` ran, then resumed) must not drain on with the old count:
/// its maintenance task sees the new count, the worker releases its leases
/// and exits with the same clear message a fresh start would give.
async fn a_running_worker_stops_when_the_database_is_repartitioned_under_it(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let mut worker = env.spawn_worker(&["--silent"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while leases(&env).await.iter().all(|l| l.lease_owner.is_none()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker leased nothing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What `repartition` records (it would refuse while this worker is live).
    env.db
        .exec("UPDATE outbox_settings SET partition_count = 8")
        .await;
    let status = worker.wait(Duration::from_secs(45));
    // Its configuration now disagrees with the database: exit code 2.
    assert_eq!(status.code(), Some(2), "{}", worker.log_text());
    let log = worker.log_text();
    assert!(
        log.contains("outbox.partition_count is 16 but the database has 8 buckets"),
        "{log}"
    );
    let held: i64 = env
        .db
        .value(&format!(
            "SELECT count(*) FROM outbox_partitions WHERE lease_owner IS NOT NULL AND lease_until > {}",
            env.db.now()
        ))
        .await;
    assert_eq!(held, 0, "leases were not released");
}

on_every_db!(
    status_prints_the_summary_as_text_and_json,
    a_requeued_message_goes_out_before_the_later_pending_messages_of_its_bucket,
    drop_needs_yes_takes_only_parked_rows_and_is_audited,
    a_blocked_head_is_unblocked_with_one_command,
    purge_deletes_only_published_rows_past_the_cut_off_and_respects_the_lock,
    repartition_with_rows_pending_keeps_per_key_order_and_loses_nothing,
    a_row_with_an_unknown_bucket_label_is_parked_visibly_and_requeue_relabels_it,
    a_running_worker_stops_when_the_database_is_repartitioned_under_it,
);

/// A key is user data: in the worker's log (text and JSON) and in `failed
/// list`, nothing in it may move a terminal's cursor, start a new line or
/// hide text — escape sequences, line breaks, bidi controls and the other
/// default-ignorable characters are written as `\u{XXXX}`.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn hostile_keys_cannot_forge_or_hide_log_lines() {
    let env = TestEnv::new().await;
    let key = "evil\u{1b}[2J\n2026-01-01T00:00:00Z INFO forged\u{202E}gnp\u{2028}x";
    let head = env
        .db
        .enqueue(Message::new(key, "", unique("missing"), "1"))
        .await;
    for format in ["text", "json"] {
        let vars = [("OUTBOXD_LOG__FORMAT", format)];
        let mut worker =
            env.spawn_worker_with(None, &env.config_path, &["--no-leasing", "--silent"], &vars);
        env.wait_count(
            &format!("id = {head} AND attempts >= 1"),
            1,
            Duration::from_secs(20),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        worker.terminate(EXIT_WITHIN);
        let log = worker.log_text();
        let line = log
            .lines()
            .find(|l| l.contains("publish failed"))
            .unwrap_or_else(|| panic!("{format}: no line for the refused row:\n{log}"));
        // JSON writes the escape's own backslash as `\\`.
        let shown = |text: &str| match format {
            "json" => text.replace('\\', "\\\\"),
            _ => text.to_string(),
        };
        for part in [
            "evil\\u{001B}[2J\\u{000A}2026",
            "forged\\u{202E}gnp\\u{2028}x",
        ] {
            assert!(line.contains(&shown(part)), "{format}: {line}");
        }
        for raw in ['\u{1b}', '\u{202E}', '\u{2028}'] {
            assert!(
                !log.contains(raw),
                "{format}: a raw {raw:?} in the log:\n{log}"
            );
        }
        assert!(
            !log.lines()
                .any(|l| l.starts_with("2026-01-01T00:00:00Z INFO forged"))
        );
        if format == "text" {
            env.db.exec("UPDATE outbox SET attempts = 0").await;
        }
    }
    // Parked by hand: with a 200 ms retry backoff the row may be ready
    // again by the time a `failed park` runs, and so no blocked head.
    park(&env, &[head], "unroutable").await;
    let listed = stdout(&run(&env, &["failed", "list"]));
    assert!(listed.contains("evil\\u{001B}[2J\\u{000A}"), "{listed}");
    assert!(
        !listed.contains('\u{1b}') && !listed.contains('\u{202E}'),
        "{listed}"
    );
}
