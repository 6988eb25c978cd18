//! The project's own service scripts: `scripts/services.sh up` then `down`
//! in a network namespace of its own (its own loopback, so its ports and
//! its epmd are private) leaves no process behind.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A network namespace whose processes are killed and which is removed on
/// drop, also when the test fails.
struct Namespace(String);

impl Namespace {
    fn new() -> Self {
        // `oxsvc-*`: scripts/test.sh removes leftovers of killed runs.
        let name = unique("oxsvc");
        let ok = |args: &[&str]| Command::new("ip").args(args).status().unwrap().success();
        assert!(ok(&["netns", "add", &name]), "ip netns add (needs root)");
        assert!(ok(&["-n", &name, "link", "set", "lo", "up"]));
        Self(name)
    }

    fn pids(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.0])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        for pid in self.pids() {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn command_lines(pids: &[String]) -> String {
    pids.iter()
        .map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            format!("{p}: {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn services_down_leaves_no_process_of_its_own() {
    let ns = Namespace::new();
    let state = std::env::temp_dir().join(unique("outboxd-services"));
    let services = |action: &str| {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.0, "bash"])
            .arg(repo_dir().join("scripts/services.sh"))
            .arg(action)
            .env("OUTBOXD_STATE_DIR", &state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "services.sh {action}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    services("up");
    let running = ns.pids();
    assert!(
        running.len() >= 4,
        "PostgreSQL, PgBouncer, MariaDB and RabbitMQ run:\n{}",
        command_lines(&running)
    );
    services("down");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut left = ns.pids();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        left = ns.pids();
    }
    assert!(
        left.is_empty(),
        "left behind by services.sh down:\n{}",
        command_lines(&left)
    );
    let _ = std::fs::remove_dir_all(&state);
}

/// The harness itself: a test that passes leaves neither its database nor
/// its queues behind (tests/common/mod.rs, `impl Drop for TestEnv`).
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn a_passing_test_leaves_neither_its_database_nor_its_queues() {
    let queue = unique("q");
    let (pg, my) = {
        let pg = TestEnv::on(Db::Postgres).await;
        let my = TestEnv::on(Db::MariaDb).await;
        let _reader = outboxd::demo::QueueReader::open(&amqp_url(), &queue)
            .await
            .unwrap();
        (pg.db_name.clone(), my.db_name.clone())
    };
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&admin_url())
        .await
        .unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&pg)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(!exists, "database {pg} is still there");
    let mut admin = <sqlx::MySqlConnection as sqlx::Connection>::connect(&mysql_admin_url())
        .await
        .unwrap();
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
    )
    .bind(&my)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(exists, 0, "database {my} is still there");
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declared = ch
        .queue_declare(queue.as_str().into(), passive, Default::default())
        .await;
    assert!(declared.is_err(), "queue {queue} is still there");
}
