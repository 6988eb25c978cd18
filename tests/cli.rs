//! Bad input on the command line and in configuration: one clear line on
//! stderr naming the problem, a non-zero exit, never a panic. And start-up
//! refusals against a database that does not fit.

mod common;

use std::process::Output;

use common::*;

fn run(args: &[&str], env: &[(&str, &str)], dir: &std::path::Path) -> Output {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("OUTBOXD_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Asserts `out` succeeded (showing its stderr if not) and returns its
/// stdout.
fn stdout_of_success(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts a refusal: non-zero, exactly one line on stderr that contains
/// `needle`, no panic, no secret.
fn assert_one_line_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got:\n{stderr}");
    assert!(lines[0].starts_with("outboxd: "), "{}", lines[0]);
    assert!(
        lines[0].contains(needle),
        "expected '{needle}' in: {}",
        lines[0]
    );
    assert!(!stderr.contains("hunter2"), "a password leaked: {stderr}");
}

fn temp_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(unique("outboxd-cli"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn bad_flags_give_one_line_and_exit_2() {
    let dir = temp_dir();
    for (args, needle) in [
        (vec!["work", "--no-leasing", "--frobnicate"], "--frobnicate"),
        (vec!["work", "--interval-ms", "0"], "--interval-ms"),
        (vec!["work", "--interval-ms", "fast"], "--interval-ms"),
        (vec!["work", "--window", "-3"], "-3"),
        (vec!["work", "--json", "--silent"], "--silent"),
        (vec!["launch"], "launch"),
    ] {
        let out = run(&args, &[], &dir);
        assert_one_line_error(&out, needle);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn bad_configuration_names_the_key_and_exits_2() {
    let dir = temp_dir();
    let cases = [
        (
            "[worker]\nlease_ttl = \"5s\"\nlease_renew = \"6s\"\n",
            "worker.lease_renew (6s) must be shorter than worker.lease_ttl (5s)",
        ),
        ("[outbox]\nbatch_size = 0\n", "outbox.batch_size"),
        (
            "[outbox]\npartition_count = 5000\n",
            "outbox.partition_count",
        ),
        (
            "[tables]\noutbox = \"outbox; drop table x\"\n",
            "tables.outbox",
        ),
        (
            "[database]\nurl = \"postgres://u:hunter2@db:notaport/x\"\n",
            "database.url",
        ),
        ("[amqp]\nurl = \"http://u:hunter2@mq/%2f\"\n", "amqp.url"),
        (
            "[amqp]\nurl = \"amqps://u:hunter2@mq/%2f\"\n[amqp.tls]\nca_file = \"/nonexistent/ca.pem\"\n",
            "amqp.tls.ca_file (/nonexistent/ca.pem): cannot read",
        ),
        ("[outbox]\nbatch_sise = 10\n", "batch_sise"),
        (
            "[outbox]\nclaim_ttl = \"fifteen\"\n",
            "line 2, key claim_ttl: 'fifteen' is not a duration",
        ),
        ("[outbox\n", "config file"),
    ];
    for (toml, needle) in cases {
        let path = dir.join("c.toml");
        std::fs::write(&path, toml).unwrap();
        let out = run(
            &["--config", path.to_str().unwrap(), "work", "--no-leasing"],
            &[],
            &dir,
        );
        assert_one_line_error(&out, needle);
        assert_eq!(out.status.code(), Some(2), "{toml}");
    }
    let out = run(
        &["--config", "/nonexistent/outboxd.toml", "migrate"],
        &[],
        &dir,
    );
    assert_one_line_error(&out, "/nonexistent/outboxd.toml");
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn environment_urls_are_validated_and_redacted() {
    let dir = temp_dir();
    let out = run(
        &["work", "--no-leasing"],
        &[("DATABASE_URL", "oracle://u:hunter2@h/db")],
        &dir,
    );
    assert_one_line_error(&out, "database.url has scheme 'oracle'");
    let out = run(
        &["migrate"],
        &[(
            "DATABASE_URL",
            "sqlite:///nonexistent-outboxd-dir/outbox.db",
        )],
        &dir,
    );
    assert_one_line_error(&out, "its directory must exist and be writable");
    let out = run(
        &["work", "--no-leasing"],
        &[("AMQP_URL", "not a url at all hunter2")],
        &dir,
    );
    assert_one_line_error(&out, "amqp.url");
    // The flag overrides the environment.
    let out = run(
        &[
            "--database-url",
            "postgres://u:hunter2@h:notaport/db",
            "work",
            "--no-leasing",
        ],
        &[("DATABASE_URL", "postgres://ok@h/db")],
        &dir,
    );
    assert_one_line_error(&out, "database.url");
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn secrets_come_from_files_and_an_unreadable_one_is_named() {
    let dir = temp_dir();
    let secret = dir.join("amqp_url");
    std::fs::write(&secret, "amqps://relay:hunter2@mq.example/%2f\n").unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "a-dashboard-token-from-a-file\n").unwrap();
    let out = run(
        &["config"],
        &[
            ("AMQP_URL_FILE", secret.to_str().unwrap()),
            ("OUTBOXD_DASHBOARD__TOKEN_FILE", token.to_str().unwrap()),
        ],
        &dir,
    );
    let stdout = stdout_of_success(&out);
    assert!(
        stdout.contains("url = \"amqps://relay:***@mq.example/%2f\""),
        "{stdout}"
    );
    assert!(
        !stdout.contains("hunter2") && !stdout.contains("a-dashboard-token-from-a-file"),
        "{stdout}"
    );
    let out = run(
        &["config"],
        &[("DATABASE_URL_FILE", "/nonexistent/database-url")],
        &dir,
    );
    assert_one_line_error(
        &out,
        "DATABASE_URL_FILE: cannot read /nonexistent/database-url",
    );
    assert_eq!(out.status.code(), Some(2));
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn every_key_comes_from_the_environment_and_config_says_from_where() {
    let dir = temp_dir();
    let file = dir.join("outboxd.toml");
    std::fs::write(&file, "[outbox]\nclaim_ttl = \"20s\"\nbatch_size = 200\n").unwrap();
    let out = run(
        &[
            "--config",
            file.to_str().unwrap(),
            "--amqp-url",
            "amqp://x:secret@mq/%2f",
            "config",
        ],
        &[
            ("OUTBOXD_OUTBOX__BATCH_SIZE", "500"),
            ("OUTBOXD_DATABASE__POOLER", "transaction"),
            ("OUTBOXD_AMQP__URL", "amqp://overridden-by-the-flag/%2f"),
        ],
        &dir,
    );
    let stdout = stdout_of_success(&out);
    for line in [
        "batch_size = 500  # environment (OUTBOXD_OUTBOX__BATCH_SIZE)",
        "pooler = \"transaction\"  # environment (OUTBOXD_DATABASE__POOLER)",
        "claim_ttl = \"20s\"  # file",
        "url = \"amqp://x:***@mq/%2f\"  # flag (--amqp-url)",
        "partition_count = 16  # default",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing {line:?} in:\n{stdout}"
        );
    }
    assert!(
        stdout.contains(&format!("Configuration file: read {}", file.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("Variables used: OUTBOXD_DATABASE__POOLER, OUTBOXD_OUTBOX__BATCH_SIZE"),
        "{stdout}"
    );

    // A typo is refused in one line, with the key it probably meant; the
    // project's other variables are no keys and pass.
    let out = run(
        &["config"],
        &[
            ("OUTBOXD_OUTBOX__BACTH_SIZE", "5"),
            ("OUTBOXD_STATE_DIR", "/x"),
            ("OUTBOXD_PG_PORT", "1"),
        ],
        &dir,
    );
    assert_one_line_error(
        &out,
        "OUTBOXD_OUTBOX__BACTH_SIZE names no configuration key (did you mean OUTBOXD_OUTBOX__BATCH_SIZE?)",
    );
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["config"], &[("OUTBOXD_OUTBOX__BATCH_SIZE", "many")], &dir);
    assert_one_line_error(
        &out,
        "OUTBOXD_OUTBOX__BATCH_SIZE: 'many' is not a whole number",
    );
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn usage_errors_name_what_is_missing_suggest_and_exit_2() {
    let dir = temp_dir();
    let out = run(&["wrok"], &[], &dir);
    assert_one_line_error(
        &out,
        "unrecognized subcommand 'wrok'; tip: a similar subcommand exists: 'work'",
    );
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["purge"], &[], &dir);
    assert_one_line_error(
        &out,
        "required arguments were not provided: --older-than <DURATION>",
    );
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["failed", "requeue"], &[], &dir);
    assert_one_line_error(&out, "<IDS|--bucket <BUCKET>|--all>");
    assert_eq!(out.status.code(), Some(2));
    // A URL that does not parse shows everything but its password.
    let out = run(
        &[
            "--database-url",
            "postgres://u:hunter2@db.example:99999/app",
            "config",
        ],
        &[],
        &dir,
    );
    assert_one_line_error(&out, "postgres://u:***@db.example:99999/app");
    assert_eq!(out.status.code(), Some(2));
    // The help names every backend.
    let help = String::from_utf8(run(&["--help"], &[], &dir).stdout).unwrap();
    assert!(
        help.contains("MySQL/MariaDB") && help.contains("mysql://") && help.contains("amqps://"),
        "{help}"
    );
}

/// A refused configuration is said in the log format asked for: with JSON
/// logs, one JSON object, whether `log.format` comes from the environment
/// or from the file.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn a_refused_configuration_is_one_json_line_when_json_logs_are_asked_for() {
    let dir = temp_dir();
    let file = dir.join("json.toml");
    std::fs::write(
        &file,
        "[log]\nformat = \"json\"\n[outbox]\nbatch_size = 0\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    for (args, env, needle) in [
        (
            vec!["config"],
            vec![
                ("OUTBOXD_LOG__FORMAT", "json"),
                ("OUTBOXD_OUTBOX__BACTH_SIZE", "5"),
            ],
            "OUTBOXD_OUTBOX__BACTH_SIZE names no configuration key",
        ),
        (
            vec!["--config", file, "config"],
            vec![],
            "outbox.batch_size",
        ),
    ] {
        let out = run(&args, &env, &dir);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        let line: serde_json::Value = serde_json::from_str(err.trim())
            .unwrap_or_else(|e| panic!("not one JSON line ({e}): {err}"));
        assert_eq!(line["level"], "ERROR", "{err}");
        let message = line["message"].as_str().unwrap();
        assert!(
            message.starts_with("outboxd: config: ") && message.contains(needle),
            "{err}"
        );
    }
}

/// A CA, certificate or key file a database URL names that cannot be read
/// is one line naming the setting and the path, before any connection.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn an_unreadable_tls_file_of_the_database_names_its_setting_and_path() {
    let dir = temp_dir();
    for (url, needle) in [
        (
            "postgres://u:hunter2@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            "database.url: sslrootcert /nonexistent/ca.pem: cannot read",
        ),
        (
            "mysql://u:hunter2@127.0.0.1:1/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/nonexistent/ca.pem",
            "database.url: ssl-ca /nonexistent/ca.pem: cannot read",
        ),
    ] {
        let out = run(&["--database-url", url, "status"], &[], &dir);
        assert_one_line_error(&out, needle);
        assert_eq!(out.status.code(), Some(2), "{needle}");
    }
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn an_unreachable_database_is_one_line_without_the_password() {
    let dir = temp_dir();
    let out = run(
        &[
            "--database-url",
            "postgres://u:hunter2@127.0.0.1:1/db",
            "work",
            "--no-leasing",
        ],
        &[],
        &dir,
    );
    assert_one_line_error(
        &out,
        "cannot connect to PostgreSQL at postgres://u:***@127.0.0.1:1/db",
    );
    assert_eq!(out.status.code(), Some(1));
}

/// Database refusals name their cause once, without PostgreSQL's source
/// positions, and an unreachable server says "refused" at once.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn database_connection_errors_say_their_cause_once() {
    let dir = temp_dir();
    let admin = url::Url::parse(&admin_url()).unwrap();
    let with = |user: &str, password: &str, db: &str| {
        let mut u = admin.clone();
        u.set_username(user).unwrap();
        u.set_password(Some(password)).unwrap();
        u.set_path(db);
        u.to_string()
    };
    // The exit code: 3 for a refusal no restart gets past, 1 for an outage.
    let cases = [
        (
            with("outboxd", "hunter2", "outboxd"),
            "password authentication failed for user \"outboxd\"",
            3,
        ),
        (
            with("outboxd", "outboxd", "nosuchdb"),
            "database \"nosuchdb\" does not exist",
            3,
        ),
        (
            "postgres://u:hunter2@127.0.0.1:1/db".to_string(),
            "Connection refused",
            1,
        ),
    ];
    for (url, cause, code) in cases {
        let started = std::time::Instant::now();
        let out = run(&["--database-url", &url, "status"], &[], &dir);
        assert_one_line_error(&out, cause);
        assert_eq!(out.status.code(), Some(code), "{cause}");
        let line = String::from_utf8_lossy(&out.stderr);
        assert_eq!(line.matches(cause).count(), 1, "{line}");
        assert!(!line.contains("at line"), "{line}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "{line}"
        );
    }
}

async fn work_refuses_an_unmigrated_database(db: Db) {
    let env = TestEnv::with(Tuning {
        migrate: false,
        ..Tuning::default().on(db)
    })
    .await;
    let out = env
        .command(&["work", "--no-leasing", "--once"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "run `outboxd migrate` first");
    // migrate fixes it, twice is harmless.
    for _ in 0..2 {
        let out = env.command(&["migrate"]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = env
        .command(&["work", "--no-leasing", "--once"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn work_refuses_a_newer_schema(db: Db) {
    let env = TestEnv::on(db).await;
    env.db
        .exec(
            "INSERT INTO outbox_schema_migrations (version, description, success, checksum, execution_time)
             VALUES (999999, 'from the future', true, '\\x00', 0)",
        )
        .await;
    let out = env
        .command(&["work", "--no-leasing", "--once"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "newer than this outboxd knows");
    assert_eq!(out.status.code(), Some(3), "only another binary helps");
}

async fn work_refuses_a_partition_count_that_differs_from_the_database(db: Db) {
    let env = TestEnv::on(db).await;
    let path = env.dir.join("other.toml");
    let text = std::fs::read_to_string(&env.config_path)
        .unwrap()
        .replace("partition_count = 16", "partition_count = 32");
    std::fs::write(&path, text).unwrap();
    // Only the file configures these commands: an inherited DATABASE_URL
    // would point them at another database.
    let with_32 = |args: &[&str]| {
        std::process::Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .output()
            .unwrap()
    };
    let out = with_32(&["work", "--no-leasing", "--once"]);
    assert_one_line_error(
        &out,
        "outbox.partition_count is 32 but the database has 16 buckets",
    );
    assert_eq!(out.status.code(), Some(2), "a configuration problem");
    let out = with_32(&["migrate"]);
    assert_one_line_error(&out, "has 16 buckets");
    assert_eq!(out.status.code(), Some(2), "a configuration problem");
}

async fn no_leasing_refuses_to_start_while_another_worker_is_live(db: Db) {
    let env = TestEnv::on(db).await;
    let mut first = env.spawn_worker(&["--no-leasing", "--silent"]);
    // Wait for the first worker's row.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let n: i64 = env
            .db
            .value(&format!(
                "SELECT count(*) FROM outbox_workers WHERE heartbeat_until > {}",
                env.db.now()
            ))
            .await;
        if n == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "first worker never registered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let out = env
        .command(&["work", "--no-leasing", "--once"])
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        "refusing to start in --no-leasing mode: 1 other outboxd worker(s) are live",
    );
    assert!(
        first
            .terminate(std::time::Duration::from_secs(15))
            .success()
    );
    // Once it left, a new one may start.
    let out = env
        .command(&["work", "--no-leasing", "--once"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The commands that only read or change the database run with what only
/// the broker needs missing — a CA file that is not there, streams without
/// the stream port — so an init container or a dashboard that shares the
/// workers' configuration need not hold the broker's secrets; a worker
/// given the same configuration refuses it, naming each key in turn.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn database_commands_run_without_the_broker_s_files_and_stream_port() {
    let env = TestEnv::with(Tuning {
        migrate: false,
        ..Tuning::default()
    })
    .await;
    let shared = std::fs::read_to_string(&env.config_path).unwrap();
    let streams = shared.replacen("[amqp]\n", "[amqp]\nstreams = [\"orders\"]\n", 1);
    assert_ne!(streams, shared);
    let both = format!("{streams}\n[amqp.tls]\nca_file = \"/nonexistent/ca.pem\"\n");
    let config = env.dir.join("without-the-broker.toml");
    std::fs::write(&config, &both).unwrap();

    for args in [&["migrate"][..], &["status"], &["partition", "order-1"]] {
        let out = env.command_with(&config, args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (mut ui, url) = spawn_ui(&env, &config);
    // It reads the database the migrate above set up: 16 buckets.
    let parts = http("GET", &format!("{url}/outbox/api/partitions"), &[], None).await;
    assert_eq!(parts.status, 200, "{}", parts.body);
    assert_eq!(
        parts.json().as_array().map(Vec::len),
        Some(16),
        "{}",
        parts.body
    );
    assert!(ui.terminate(std::time::Duration::from_secs(10)).success());

    let out = env
        .command_with(&config, &["work", "--no-leasing", "--once"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "amqp.tls.ca_file (/nonexistent/ca.pem): cannot read");
    assert_eq!(out.status.code(), Some(2));
    std::fs::write(&config, &streams).unwrap();
    let out = env
        .command_with(&config, &["work", "--no-leasing", "--once"])
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        "amqp.streams names [\"orders\"], but amqp.stream_url is empty",
    );
    assert_eq!(out.status.code(), Some(2));
}

/// A log pipe that closes (a collector restarted, `| head`) must not turn
/// into a worker that ignores SIGTERM. It did: tracing-subscriber reported
/// the failed write with `eprintln!`, which panicked whichever task logged
/// next — the signal task included.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn a_worker_whose_stderr_closes_still_stops_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let env = TestEnv::new().await;
    let mut child = env
        .command(&["work", "--no-leasing", "--silent"])
        .env("OUTBOXD_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("draining") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "worker exited");
    }
    drop(stderr);
    let pid = child.id().to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        if std::time::Instant::now() > deadline {
            child.kill().ok();
            panic!("the worker ignored SIGTERM after its stderr closed");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Without any database URL configured, the error says the built-in default
/// was used and how to set one; a value that cannot hold a password is shown.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn errors_say_when_the_default_url_was_used_and_show_harmless_values() {
    let dir = temp_dir();
    let out = run(&["status"], &[], &dir);
    assert_one_line_error(&out, "the built-in default: set DATABASE_URL");
    let line = String::from_utf8_lossy(&out.stderr);
    assert!(line.contains("127.0.0.1:5432"), "{line}");
    let out = run(&["status"], &[("DATABASE_URL", "not-a-url")], &dir);
    assert_one_line_error(&out, "database.url is not a valid URL");
    assert!(String::from_utf8_lossy(&out.stderr).contains(": not-a-url"));
}

/// `outboxd config` prints the effective configuration as TOML that reads
/// back as the same configuration, secrets redacted.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn config_prints_toml_that_reads_back_the_same() {
    let dir = temp_dir();
    let file = dir.join("outboxd.toml");
    std::fs::write(
        &file,
        "[database]\nurl = \"postgres://app:hunter2@db:6432/app\"\npooler = \"transaction\"\n\
         query_timeout = \"2500ms\"\n[worker]\nassignment = \"sticky\"\nlease_ttl = \"1m\"\n\
         lease_renew = \"20s\"\n[dashboard]\ntoken = \"hunter2hunter2hunter2\"\n",
    )
    .unwrap();
    let out = run(&["--config", path_str(&file), "config"], &[], &dir);
    let printed = stdout_of_success(&out);
    assert!(!printed.contains("hunter2"), "{printed}");
    let mut again = outboxd::config::Config::from_toml(&printed).expect("the output is TOML");
    assert_eq!(again.database.url, "postgres://app:***@db:6432/app");
    assert_eq!(again.dashboard.token, "***");
    // Everything but the secrets reads back the same.
    let original = outboxd::config::Config::from_file(&file).unwrap();
    again.database.url = original.database.url.clone();
    again.dashboard.token = original.dashboard.token.clone();
    again.amqp.url = original.amqp.url.clone();
    again.validate().expect("a valid configuration");
    assert_eq!(format!("{original:?}"), format!("{again:?}"));
    assert_eq!(again.database.pooler, outboxd::config::Pooler::Transaction);
}

/// A valid value that costs what nobody would choose knowingly is named
/// in `outboxd config`'s output, as a TOML comment.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn config_names_a_claim_ttl_that_leaves_no_claim_unwritten() {
    let dir = temp_dir();
    let out = run(
        &["config"],
        &[("OUTBOXD_AMQP__CONFIRM_TIMEOUT", "14s")],
        &dir,
    );
    let printed = stdout_of_success(&out);
    assert!(
        printed.contains(
            "\n# caution: outbox.claim_ttl (15s) is at most amqp.confirm_timeout + 1 s (15s): every claim writes its bucket's row"
        ),
        "{printed}"
    );
    outboxd::config::Config::from_toml(&printed).expect("the output is TOML");
    let out = run(&["config"], &[], &dir);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("caution"));
    // With sources, each source's own values, the source named.
    let file = dir.join("sources.toml");
    std::fs::write(
        &file,
        "[[source]]\nname = \"orders\"\nurl = \"postgres://app@db/orders\"\n\
         [source.outbox]\nclaim_ttl = \"11s\"\n\
         [[source]]\nname = \"billing\"\nurl = \"postgres://app@db/billing\"\n",
    )
    .unwrap();
    let out = run(&["--config", path_str(&file), "config"], &[], &dir);
    let printed = stdout_of_success(&out);
    let cautions: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("# caution:"))
        .collect();
    assert_eq!(cautions.len(), 1, "{printed}");
    assert!(
        cautions[0].starts_with("# caution: source orders: outbox.claim_ttl (11s) is at most"),
        "{printed}"
    );
}

on_every_db!(
    work_refuses_an_unmigrated_database,
    work_refuses_a_newer_schema,
    work_refuses_a_partition_count_that_differs_from_the_database,
    no_leasing_refuses_to_start_while_another_worker_is_live,
);
