//! The getting-started page's five-minute tour, run as written: its `sh tour`
//! block goes to bash unchanged, against a fresh PostgreSQL database and the
//! test services' RabbitMQ, with this build's `outboxd` on the `PATH`. What
//! the page says to look for is what this test checks.

mod common;

use std::process::Command;

use common::db::Db;
use common::*;

/// The block of docs/getting-started.md fenced as ```` ```sh tour ````.
fn tour_block() -> String {
    let page = std::fs::read_to_string(repo_dir().join("docs/getting-started.md")).unwrap();
    let start = page
        .find("```sh tour\n")
        .expect("docs/getting-started.md has a `sh tour` block")
        + "```sh tour\n".len();
    let end = start + page[start..].find("\n```").unwrap();
    page[start..=end].to_string()
}

/// The worker rows (`name … buckets …`) of the last `outboxd status` in `out`.
fn buckets_per_worker(out: &str) -> Vec<(String, u32)> {
    let last = out.rfind("workers ").expect("a status in the output");
    out[last..]
        .lines()
        .skip_while(|l| !l.starts_with("WORKER"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols[0].to_string(), cols[5].parse().unwrap())
        })
        .collect()
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_getting_started_tour_runs_as_written() {
    let admin = Db::Postgres.admin_url();
    let name = unique("t_tour");
    Db::Postgres.create_database(&admin, &name).await;
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    // The tour's queue, empty: a message an earlier run left would count.
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let _ = ch.queue_delete("tour".into(), Default::default()).await;
    let _ = conn.close(200, "bye".into()).await;

    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let script = format!(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n{}",
        tour_block()
    );
    let out = Command::new("timeout")
        .args(["120", "bash", "-c", &script])
        .current_dir(&dir)
        .env(
            "PATH",
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        )
        .env("DATABASE_URL", with_database(&admin, &name))
        .env("AMQP_URL", amqp_url())
        .env_remove("OUTBOXD_CONFIG")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the tour failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("total consumed 1 (distinct 1, duplicates 0), order violations 0"),
        "the consumer did not report the message:\n{stdout}"
    );
    assert!(
        stdout.contains("workers 1 live | buckets 16/16 owned | pending 0 |"),
        "the first status is not as the page says:\n{stdout}"
    );
    let mut shares = buckets_per_worker(&stdout);
    shares.sort();
    assert_eq!(
        shares,
        vec![("first".to_string(), 8), ("second".to_string(), 8)],
        "after the second worker joined:\n{stdout}"
    );
    std::fs::remove_dir_all(&dir).ok();
    Db::Postgres.drop_database(&admin, &name).await;
}
