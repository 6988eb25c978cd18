//! The book's walk-throughs, run as written: the getting-started page's
//! five-minute tour (its `sh tour` block) and the streams page's worker
//! that dies between the broker and the database (`sh stream-tour`) go to
//! bash unchanged, each against a fresh PostgreSQL database and the test
//! services' RabbitMQ, with this build's `outboxd` on the `PATH`. What the
//! pages say to look for is what these tests check.

mod common;

use std::process::Command;

use common::db::Db;
use common::*;

/// The block of `page` (under docs/) fenced as ```` ```sh <tag> ````.
fn block(page: &str, tag: &str) -> String {
    let text = std::fs::read_to_string(repo_dir().join("docs").join(page)).unwrap();
    let fence = format!("```sh {tag}\n");
    let start = text
        .find(&fence)
        .unwrap_or_else(|| panic!("docs/{page} has a `sh {tag}` block"))
        + fence.len();
    let end = start + text[start..].find("\n```").unwrap();
    text[start..=end].to_string()
}

/// A fresh PostgreSQL database and a directory of its own for one
/// walk-through.
struct Walk {
    admin: String,
    name: String,
    dir: std::path::PathBuf,
}

impl Walk {
    async fn new(prefix: &str) -> Self {
        let admin = Db::Postgres.admin_url();
        let name = unique(prefix);
        Db::Postgres.create_database(&admin, &name).await;
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        Self { admin, name, dir }
    }

    /// Runs `block` there ([`run_block`]); its standard output.
    fn run(&self, block: &str, env: &[(&str, String)]) -> String {
        let url = with_database(&self.admin, &self.name);
        run_block(block, &self.dir, &url, env)
    }

    async fn end(self) {
        std::fs::remove_dir_all(&self.dir).ok();
        Db::Postgres.drop_database(&self.admin, &self.name).await;
    }
}

/// Runs `block` in bash (its background jobs stopped at the end) in `dir`,
/// against the database `url`, with this build's `outboxd` on the `PATH`
/// and `env` besides; its standard output, after it succeeded.
fn run_block(block: &str, dir: &std::path::Path, url: &str, env: &[(&str, String)]) -> String {
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let script =
        format!("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n{block}");
    let out = Command::new("timeout")
        .args(["120", "bash", "-c", &script])
        .current_dir(dir)
        .env(
            "PATH",
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        )
        .env("DATABASE_URL", url)
        .env("AMQP_URL", amqp_url())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("OUTBOXD_CONFIG")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the block failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
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
    let walk = Walk::new("t_tour").await;
    // The tour's queue, empty: a message an earlier run left would count.
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let _ = ch.queue_delete("tour".into(), Default::default()).await;
    let _ = conn.close(200, "bye".into()).await;

    let stdout = walk.run(&block("getting-started.md", "tour"), &[]);
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
    walk.end().await;
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL and RabbitMQ with its stream port: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_walkthrough_runs_as_written() {
    let walk = Walk::new("t_stream_tour").await;
    let stdout = walk.run(
        &block("streams.md", "stream-tour"),
        &[("OUTBOXD_STREAM_URL", streams::stream_url())],
    );
    assert!(
        stdout.contains("rows already in the stream (the broker's last stored id is "),
        "the second worker did not find the rows in the stream:\n{stdout}"
    );
    assert!(
        stdout.contains(
            "total read 6000 from the stream (distinct 6000, duplicates 0), order violations 0"
        ),
        "the stream does not hold each row once:\n{stdout}"
    );
    walk.end().await;
}
