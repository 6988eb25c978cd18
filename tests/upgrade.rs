//! A rolling upgrade from the previous tagged release (CHANGELOG.md) to
//! this code: old and new workers side by side over a migrated schema,
//! under a producer.
//!
//! It builds that release first (a few minutes on a fresh machine, cached in
//! `target/previous-release/`), so it is opt-in: `scripts/test.sh
//! --run-ignored only -E 'binary(upgrade)'`.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use outboxd::demo::QueueReader;

/// The previous release, and its commit (for a clone without tags).
const PREVIOUS: (&str, &str) = ("v0.1.0", "28aba54aa33f6f393f9866646432a65fbb34a50f");

/// The previous release's `outboxd`, built from its source tree (`git
/// archive` of the tag) once and kept.
fn previous_release() -> PathBuf {
    let (tag, commit) = PREVIOUS;
    let repo = repo_dir();
    let out = repo.join("target/previous-release").join(tag);
    let bin = out.join("target/debug/outboxd");
    if bin.exists() {
        return bin;
    }
    let tree = out.join("src");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree).unwrap();
    let rev = if Command::new("git")
        .args(["rev-parse", "--verify", "-q", &format!("{tag}^{{commit}}")])
        .current_dir(&repo)
        .output()
        .is_ok_and(|o| o.status.success())
    {
        tag
    } else {
        commit
    };
    let unpacked = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "git -C '{}' archive --format=tar {rev} | tar -x -C '{}'",
            repo.display(),
            tree.display()
        ))
        .status()
        .unwrap();
    assert!(unpacked.success(), "git archive {rev}");
    let built = Command::new("cargo")
        .args(["build", "--locked", "--bin", "outboxd"])
        .env("CARGO_TARGET_DIR", out.join("target"))
        .current_dir(&tree)
        .status()
        .unwrap();
    assert!(built.success(), "building {tag} failed");
    bin
}

/// Three workers of the previous release under a producer; the new
/// `outboxd migrate`; each old worker replaced by a new one, one at a time
/// (old and new side by side); then an old worker started against the new
/// schema, which must refuse with one line (it never half-works). Nothing
/// lost, per-key order kept, no epoch acquired twice, duplicates counted
/// and bounded.
async fn old_workers_replaced_one_by_one_by_new_ones_lose_nothing(db: Db) {
    let old_bin = previous_release();
    let env = TestEnv::with(Tuning {
        migrate: false,
        ..Tuning::fleet().on(db)
    })
    .await;
    let migrated = Command::new(&old_bin)
        .arg("--config")
        .arg(&env.config_path)
        .arg("migrate")
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "the old migrate: {}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue)
        .await
        .unwrap()
        .keep_log();
    let producer = tokio::spawn(produce_evenly(
        env.db.clone(),
        queue.clone(),
        6_000,
        60,
        Duration::from_secs(30),
    ));
    let mut fleet: Vec<WorkerProcess> =
        (0..3).map(|_| env.spawn_worker_of(&old_bin, &[])).collect();
    tokio::time::sleep(Duration::from_secs(4)).await;

    let migrate = env.command(&["migrate"]).output().unwrap();
    assert!(
        migrate.status.success(),
        "the new migrate beside running old workers: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    for (i, w) in fleet.iter_mut().enumerate() {
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            w.terminate(EXIT_WITHIN).success(),
            "old worker {i}: {}",
            w.log_text()
        );
        *w = env.spawn_worker(&[]);
    }
    // An old worker started now: refuses, in one line, and exits.
    let mut late = env.spawn_worker_of(&old_bin, &[]);
    let status = late.wait(Duration::from_secs(20));
    let said = late.log_text();
    let last = said.lines().last().unwrap_or_default();
    println!("an old worker started against the new schema: {status}; {last}");
    assert!(!status.success(), "it ran: {said}");
    assert!(
        last.contains("newer than this outboxd knows"),
        "not one line saying why: {said}"
    );

    producer.await.unwrap();
    let committed = env.count("true").await as usize;
    let (all, v) = read_and_judge(&mut reader, &env, committed, Duration::from_secs(60)).await;
    let shared: Vec<(String, i64, i64)> = env
        .db
        .rows(
            "SELECT partition_key, new_epoch, count(DISTINCT worker_id) FROM outbox_lease_events
             WHERE action = 'acquire' GROUP BY 1, 2 HAVING count(DISTINCT worker_id) > 1",
        )
        .await;
    println!(
        "rolling upgrade {} -> this code on {db:?}: {committed} rows; {}; epochs acquired twice: {}",
        PREVIOUS.0,
        v.summary(),
        shared.len()
    );
    assert!(all, "{}", v.summary());
    assert!(v.is_clean(), "{}", v.summary());
    assert!(shared.is_empty(), "{shared:?}");
    // Each hand-over is a graceful stop: at most the batches in flight at
    // the three stops (batch size 100 per bucket, a few buckets each).
    assert!(v.duplicates <= 3 * 400, "{}", v.summary());
    terminate_all(&mut fleet);
}

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "builds the previous release (minutes): --run-ignored only -E 'binary(upgrade)'"]
    async fn old_workers_replaced_one_by_one_by_new_ones_lose_nothing() {
        super::old_workers_replaced_one_by_one_by_new_ones_lose_nothing(super::Db::Postgres).await
    }
}

mod mariadb {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "builds the previous release (minutes): --run-ignored only -E 'binary(upgrade)'"]
    async fn old_workers_replaced_one_by_one_by_new_ones_lose_nothing() {
        super::old_workers_replaced_one_by_one_by_new_ones_lose_nothing(super::Db::MariaDb).await
    }
}
