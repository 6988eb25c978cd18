//! The dashboard in a real headless browser (Debian's Chromium, driven by
//! tests/browser/dashboard.mjs through playwright-core) against a real
//! 3-worker fleet with a producer running: workers, leases and throughput
//! show the database's values, a value changes live without a reload, each
//! destination (a queue through AMQP, a stream) is shown with its sink, the
//! live per-second rate moves, a worker stopped with SIGTERM shows up on the
//! lease timeline as its buckets' release and the survivors' acquisitions
//! (without a reload), and a parked message is requeued through the UI —
//! then published for real. And (tests/browser/stopped_search.mjs): a slow
//! answer does not overwrite the message view chosen after it, and a search
//! of published messages by key that the database stops shows why in place
//! of the rows. And (tests/browser/worker_states.mjs): each worker is shown
//! by its name, the same as in `outboxd status` and its log lines, with what
//! it is doing (publishing; waiting on a blocked head until its retry time).
//! And (tests/browser/sources.mjs): with several sources, the overview shows
//! a source whose database is stopped as unhealthy and the others healthy,
//! live, and `/metrics` labels each source's figures.
//!
//! `scripts/test.sh` installs Chromium, Node.js and the script's package.
//! Set `OUTBOXD_SCREENSHOT=path.png` to keep a screenshot of the page.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::streams::{new_stream, stream_url, stream_vars};
use common::*;
use outboxd::coordinator::assignment::{Assignment, owner_index};
use outboxd::demo::QueueReader;
use outboxd::producer::Message;

/// How long a wait for the fleet or the page to get where a test needs it
/// lasts: the browser scripts' `PATIENCE` (`tests/browser/common.mjs`), for
/// the same reason — these tests run beside others on a 2-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

fn prerequisites() -> (String, std::path::PathBuf) {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let script = repo_dir().join("tests/browser/dashboard.mjs");
    let module = repo_dir().join("tests/browser/node_modules/playwright-core");
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        node && std::path::Path::new(&chromium).exists() && module.exists(),
        "the browser test needs node, {chromium} and tests/browser/node_modules: run it through scripts/test.sh, which installs them"
    );
    (chromium, script)
}

async fn the_dashboard_shows_a_real_fleet_live_and_requeues_a_parked_message_through_the_ui(
    db: Db,
) {
    let (chromium, script) = prerequisites();
    let env = TestEnv::with(Tuning {
        max_attempts: 1,
        ..Tuning::fleet().on(db)
    })
    .await;
    let queue = unique("q");
    let missing = unique("missing");
    // The consumer keeps the demo queue short.
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let parked = env
        .db
        .enqueue(Message::new(
            "parked-key",
            "",
            missing.clone(),
            "parked payload",
        ))
        .await;

    // A quarter of the traffic goes to a stream.
    let stream = new_stream(&stream_url()).await;
    let vars = stream_vars(&stream_url(), &stream);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let spawn = |args: &[&str]| env.spawn_worker_with(None, &env.config_path, args, &vars);
    let mut workers = vec![spawn(&["--silent", "--ui", "127.0.0.1:0"])];
    workers.extend((0..2).map(|_| spawn(&["--silent"])));
    let base = wait_for_dashboard_url(&workers[0]);

    // The fleet settles and the unroutable message is parked.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let live = live(&env).await;
        let leases = leases(&env).await;
        // Converged: every bucket held by the owner the modulo rule names.
        let settled = live.len() == 3
            && leases.iter().enumerate().all(|(b, l)| {
                l.valid
                    && l.lease_owner == Some(live[owner_index(Assignment::Modulo, &live, b as u32)])
            });
        if settled
            && env
                .count(&format!("id = {parked} AND failed_at IS NOT NULL"))
                .await
                == 1
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fleet did not settle or the message was not parked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Steady traffic for the live check; and once the page shows its Failed
    // tab (the browser creates `signal`), one more unroutable message, to be
    // parked while the page is open.
    let signal = std::env::temp_dir().join(format!("{}.signal", unique("dash")));
    let (db, q, s) = (env.db.clone(), queue.clone(), stream.clone());
    let traffic = tokio::spawn(async move {
        for i in 0..3000 {
            let to = if i % 4 == 0 { s.as_str() } else { q.as_str() };
            db.enqueue(Message::new(format!("key-{}", i % 40), "", to, "x"))
                .await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let (db, later, watched) = (env.db.clone(), unique("missing"), signal.clone());
    let parking_later = tokio::spawn(async move {
        while !watched.exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        db.enqueue(Message::new("parked-later", "", later.as_str(), "later"))
            .await;
    });
    let draining = tokio::spawn(async move {
        let _ = reader.read_until(Duration::from_secs(120), |_| false).await;
    });
    // Fix the cause, so the requeued message can be published.
    let _fixed = QueueReader::open(&amqp_url(), &missing).await.unwrap();

    let workers_expected = live(&env).await;
    let owners: BTreeMap<String, String> = leases(&env)
        .await
        .into_iter()
        .map(|l| (l.partition_key, l.lease_owner.unwrap().to_string()))
        .collect();
    let expect = serde_json::json!({
        "workers": workers_expected, "owners": owners, "parkedId": parked,
        "queue": queue, "stream": stream,
    });
    // The browser stops the third worker (not the one serving the page).
    let leaving = worker_id_of(&env, &workers[2]).await;
    let mut cmd = Command::new("node");
    cmd.arg(&script)
        .env("DASH_URL", format!("{base}/outbox/"))
        .env("DASH_STOP_PID", workers[2].pid().to_string())
        .env("DASH_STOP_ID", leaving.to_string())
        .env("DASH_EXPECT", expect.to_string())
        .env("DASH_SIGNAL", &signal)
        .env("CHROMIUM", &chromium);
    if let Ok(path) = std::env::var("OUTBOXD_SCREENSHOT") {
        cmd.env("DASH_SCREENSHOT", path);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let _ = std::fs::remove_file(&signal);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("browser: {stdout}");
    assert!(
        out.status.success(),
        "browser checks failed:\n{stderr}\n{stdout}\nworker log:\n{}",
        workers[0].log_text()
    );

    // The requeue really happened: audited, and the message went out.
    let audits: Vec<serde_json::Value> = env
        .db
        .column("SELECT detail FROM outbox_audit WHERE action = 'requeue'")
        .await;
    let audited = audits
        .iter()
        .filter(|d| {
            d["ids"]
                .as_array()
                .is_some_and(|ids| ids.contains(&parked.into()))
        })
        .count();
    assert_eq!(audited, 1, "{audits:?}");
    let published = env
        .wait_count(
            &format!("id = {parked} AND published_at IS NOT NULL"),
            1,
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(published, 1, "the requeued message was not published");
    traffic.abort();
    parking_later.abort();
    draining.abort();
    let mut left = workers.pop().unwrap();
    assert!(
        left.wait(Duration::from_secs(15)).success(),
        "{}",
        left.log_text()
    );
    for w in &mut workers {
        assert!(w.terminate(EXIT_WITHIN).success(), "{}", w.log_text());
    }
}

on_every_db!(the_dashboard_shows_a_real_fleet_live_and_requeues_a_parked_message_through_the_ui,);

/// Who each worker is and what it is doing, the same in the dashboard,
/// `outboxd status` and its log lines (tests/browser/worker_states.mjs): two
/// workers on two buckets, one named by `worker.name` (its only bucket
/// blocked on a head the broker cannot route, retried in a minute), the
/// other by host:pid (publishing a steady trickle). The blocked one shows
/// the blocked state and the database's retry time, the other "publishing";
/// neither "idle". Last, the blocked head is parked with its bucket's Park
/// button, audited.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_is_shown_by_its_name_and_what_it_is_doing() {
    let (chromium, _) = prerequisites();
    let script = repo_dir().join("tests/browser/worker_states.mjs");
    let env = TestEnv::with(Tuning {
        partition_count: 2,
        retry_backoff_initial: "60s",
        retry_backoff: "60s",
        ..Tuning::fleet()
    })
    .await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let mut workers = vec![
        env.spawn_worker_with(
            None,
            &env.config_path,
            &["--silent"],
            &[("OUTBOXD_WORKER__NAME", "billing-blocked")],
        ),
        env.spawn_worker(&["--silent", "--ui", "127.0.0.1:0"]),
    ];
    let base = wait_for_dashboard_url(&workers[1]);
    let named = worker_id_of(&env, &workers[0]).await;
    let plain = worker_id_of(&env, &workers[1]).await;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let plain_name = format!("{}:{}", host.trim(), workers[1].pid());

    // Each holds one bucket.
    let deadline = Instant::now() + PATIENCE;
    let (blocked_bucket, open_bucket) = loop {
        let leases = leases(&env).await;
        let owner = |b: usize| leases[b].lease_owner.filter(|_| leases[b].valid);
        if let (Some(a), Some(b)) = (owner(0), owner(1))
            && a != b
            && [a, b].contains(&named)
            && [a, b].contains(&plain)
        {
            let (blocked, open) = if a == named { (0, 1) } else { (1, 0) };
            break (
                leases[blocked].partition_key.clone(),
                leases[open].partition_key.clone(),
            );
        }
        assert!(
            Instant::now() < deadline,
            "the two workers did not split the buckets"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The named worker's bucket: a head nobody can route, retried in 60 s.
    let p = env.partitioner();
    let key = &keys_in_bucket(p, &blocked_bucket, 1, "blocked")[0];
    let head = env
        .db
        .enqueue(Message::new(key, "", unique("missing"), "x"))
        .await;
    let retry_at = loop {
        let at: Vec<chrono::DateTime<chrono::Utc>> = env
            .db
            .column(&format!(
                "SELECT available_at FROM outbox WHERE id = {head} AND attempts > 0"
            ))
            .await;
        if let Some(at) = at.first() {
            break *at;
        }
        assert!(Instant::now() < deadline, "the head was never tried");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The other's: a steady trickle.
    let keys = keys_in_bucket(p, &open_bucket, 10, "open");
    let (db, q) = (env.db.clone(), queue.clone());
    let traffic = tokio::spawn(async move {
        for i in 0..6000 {
            db.enqueue(Message::new(&keys[i % 10], "", q.as_str(), "x"))
                .await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let draining = tokio::spawn(async move {
        let _ = reader.read_until(Duration::from_secs(120), |_| false).await;
    });

    let expect = serde_json::json!({
        "names": { named.to_string(): "billing-blocked", plain.to_string(): plain_name },
        "blocked": named,
        "publishing": plain,
        "retryAt": retry_at.to_rfc3339(),
        "blockedBucket": blocked_bucket,
    });
    let vars = vec![
        ("DASH_URL", format!("{base}/outbox/")),
        ("DASH_EXPECT", expect.to_string()),
    ];
    run_browser(script, chromium, vars, || workers[1].log_text()).await;

    // Parked from the page, audited as the page's.
    let parked: i64 = env
        .db
        .value(&format!(
            "SELECT count(*) FROM outbox WHERE id = {head} AND failed_at IS NOT NULL"
        ))
        .await;
    assert_eq!(parked, 1, "the head was not parked from the page");
    let audited: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_audit WHERE action = 'park'")
        .await;
    assert_eq!(audited, 1);

    // `outboxd status`: the same names, as workers and as bucket owners.
    let status = env.command(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{text}");
    for name in ["billing-blocked", plain_name.as_str()] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "no worker line for {name}:\n{text}"
        );
    }
    let line = text
        .lines()
        .find(|l| l.starts_with(&blocked_bucket))
        .unwrap_or_else(|| panic!("{text}"));
    // Its head is parked now (from the page): owned, no longer blocked.
    assert!(
        line.contains("billing-blocked") && !line.contains("BLOCKED"),
        "{line}"
    );

    // Its log lines: from registration on, each names it.
    let log = workers[0].log_text();
    let from = log.find("worker registered").expect("registered");
    let lines: Vec<&str> = log[from..].lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.len() > 1, "{log}");
    for line in lines {
        assert!(line.ends_with(" worker=billing-blocked"), "{line}");
    }

    traffic.abort();
    draining.abort();
    for w in &mut workers {
        assert!(w.terminate(EXIT_WITHIN).success(), "{}", w.log_text());
    }
}

/// A search of published messages by key reads the table (no index serves
/// it unless the book's is built) and is stopped after 5 s; the page must say
/// so in place of the rows. A lock held on the table stands in for a table
/// too large to scan (as in tests/dashboard.rs): taken once the page is up
/// and the key typed in (tests/browser/stopped_search.mjs waits for it),
/// released once the browser is done.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_says_why_a_published_key_search_was_stopped() {
    let (chromium, _) = prerequisites();
    let script = repo_dir().join("tests/browser/stopped_search.mjs");
    let env = TestEnv::on(Db::Postgres).await;
    let id = env
        .db
        .enqueue(Message::new("stopped-key", "", "q".to_string(), "x"))
        .await;
    env.db
        .exec(&format!(
            "UPDATE outbox SET published_at = now() WHERE id = {id}"
        ))
        .await;
    let (mut ui, base) = spawn_ui(&env, &env.config_path);
    let signal = env.dir.join("browser");
    let mut browser = Command::new("node")
        .arg(&script)
        .env("DASH_URL", format!("{base}/outbox/"))
        .env("DASH_KEY", "stopped-key")
        .env("DASH_SIGNAL", &signal)
        .env("CHROMIUM", &chromium)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ready = signal.with_extension("ready");
    let deadline = Instant::now() + PATIENCE;
    while !ready.exists() && browser.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the page never got ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut locker = env.db.pg().begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    std::fs::write(signal.with_extension("locked"), "").unwrap();
    let out = tokio::task::spawn_blocking(move || browser.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    locker.rollback().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("browser: {stdout}");
    assert!(
        out.status.success(),
        "browser checks failed:\n{}\n{stdout}\ndashboard log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        ui.log_text()
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let after = seen["after_ms"].as_u64().unwrap();
    assert!((4500..9000).contains(&after), "shown after {after} ms");
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
}

/// Runs the browser script `script` to its end with `vars` (and Chromium's
/// path) in its environment, and asserts it passed, with `log` (the log of
/// the process the page was served by) beside its output when not. Returns
/// what it printed (one JSON line of observations).
async fn run_browser(
    script: std::path::PathBuf,
    chromium: String,
    vars: Vec<(&'static str, String)>,
    log: impl FnOnce() -> String,
) -> String {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(&script)
            .envs(vars)
            .env("CHROMIUM", &chromium)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("browser: {stdout}");
    assert!(
        out.status.success(),
        "browser checks failed:\n{}\n{stdout}\nlog:\n{}",
        String::from_utf8_lossy(&out.stderr),
        log()
    );
    stdout
}

/// A page on another port that frames `target`: what a clickjacking page
/// would serve. Answers every request with it until the test ends.
async fn framing_page(target: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = format!(
                "<!doctype html><title>innocent</title><p>Click the button!</p>\
                 <iframe src=\"{target}\" width=\"1200\" height=\"800\"></iframe>"
            );
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        }
    });
    url
}

/// With a token: the page works under its content security policy (no
/// violation, clean console), shows invisible characters of a key and its
/// headers visibly, cannot be framed by another page, and an expired
/// session is sent to the login form (tests/browser/hardening.mjs).
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_resists_framing_hidden_characters_and_stale_sessions() {
    let (chromium, _) = prerequisites();
    let script = repo_dir().join("tests/browser/hardening.mjs");
    let env = TestEnv::on(Db::Postgres).await;
    env.db
        .enqueue(
            Message::new("rtl-\u{202E}gnp.exe\u{200B}", "", "q".to_string(), "x")
                .header("file", "invoice-\u{202E}fdp.exe"),
        )
        .await;
    // Every other kind the page must mark: a tag character, a combining
    // grapheme joiner, a variation selector, a Mongolian free variation
    // selector, a Khmer inherent vowel, a line separator.
    env.db
        .enqueue(Message::new(
            "adm\u{E0069}n\u{034F}-x\u{FE0F}\u{180B}\u{17B4}\u{2028}end",
            "",
            "q".to_string(),
            "x",
        ))
        .await;
    let token = "browser-test-token-0123456789";
    let ttl_ms = 20_000;
    let config = env.dir.join("hardened.toml");
    let text = std::fs::read_to_string(&env.config_path).unwrap();
    std::fs::write(
        &config,
        format!("{text}[dashboard]\ntoken = \"{token}\"\nsession_ttl = \"{ttl_ms}ms\"\n"),
    )
    .unwrap();
    let (mut ui, base) = spawn_ui(&env, &config);
    let page = format!("{base}/outbox/");
    let frame = framing_page(page.clone()).await;
    let vars = vec![
        ("DASH_URL", page),
        ("DASH_TOKEN", token.to_string()),
        ("FRAME_URL", frame),
        ("SESSION_TTL_MS", ttl_ms.to_string()),
    ];
    run_browser(script, chromium, vars, || ui.log_text()).await;
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
}

/// The all-sources overview (`outboxd ui` with four `[[source]]`s, one of
/// them on a PostgreSQL server of its own, one with a wrong password, a
/// worker serving them; tests/browser/sources.mjs): the wrong-password
/// source unhealthy from the start, its reason naming the password (never
/// showing it), and the unmigrated one saying what to run; every other source healthy with its worker, live; then
/// that server is stopped: its row turns unhealthy with the reason and the
/// other two stay healthy, without a reload; each row leads to that
/// source's own dashboard.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sources_overview_shows_a_stopped_source_unhealthy_and_the_others_healthy_live() {
    use std::io::{BufRead, BufReader};
    let (chromium, _) = prerequisites();
    let script = repo_dir().join("tests/browser/sources.mjs");
    let pg = PrivatePostgres::start();
    let billing = TestEnv::with(Tuning::fleet()).await;
    let shop = TestEnv::with(Tuning::fleet()).await;
    let stock = TestEnv::with(Tuning {
        server_admin_url: Some(pg.admin_url()),
        ..Tuning::fleet()
    })
    .await;
    // A source whose schema was never migrated: unhealthy from the start,
    // saying what to run.
    let bare = TestEnv::with(Tuning {
        migrate: false,
        ..Tuning::fleet()
    })
    .await;
    // A source whose password is wrong: unhealthy from the start, the
    // reason said, the password not.
    let wrong = "wr0ng-s3cret";
    let locked_url =
        billing
            .worker_db_url
            .replacen("outboxd:outboxd@", &format!("outboxd:{wrong}@"), 1);
    assert_ne!(locked_url, billing.worker_db_url);
    let named = [
        ("billing", billing.worker_db_url.clone()),
        ("shop", shop.worker_db_url.clone()),
        ("stock", stock.worker_db_url.clone()),
        ("locked", locked_url),
        ("bare", bare.worker_db_url.clone()),
    ];
    let sources: String = named
        .iter()
        .map(|(name, url)| format!("\n[[source]]\nname = \"{name}\"\nurl = \"{url}\"\n"))
        .collect();
    let config = billing.config_variant("sources", |text| format!("{text}{sources}"));
    let mut worker = billing.spawn_worker_on(None, &config, &["--silent"]);
    let (mut ui, base) = spawn_ui(&billing, &config);

    let expect = serde_json::json!({
        "sources": ["billing", "shop", "stock"],
        "stopped": "stock",
        "bad": [
            { "name": "locked", "why": "password", "secret": wrong },
            { "name": "bare", "why": "outboxd migrate --source bare", "secret": wrong },
        ],
    });
    let mut node = Command::new("node")
        .arg(&script)
        .env("DASH_URL", format!("{base}/outbox/"))
        .env("DASH_EXPECT", expect.to_string())
        .env("CHROMIUM", &chromium)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let ready = lines.next().and_then(Result::ok);
    if ready.as_deref() == Some("ready") {
        pg.run(&["stop", "immediate"]);
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = node.wait_with_output().unwrap();
    println!("browser: {ready:?} {rest:?}");
    assert!(
        ready.as_deref() == Some("ready") && out.status.success(),
        "browser checks failed:\n{}\n{rest:?}\nui log:\n{}\nworker log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        ui.log_text(),
        worker.log_text()
    );
    // The API and /metrics say the same, per source (each read of a
    // healthy source within its 2 s: on a loaded machine one may miss it,
    // so each is asked until it says so, for up to 30 s).
    let want = [
        ("billing", true),
        ("shop", true),
        ("stock", false),
        ("locked", false),
        ("bare", false),
    ]
    .map(|(n, h)| (n.to_string(), h))
    .to_vec();
    let lines = [
        "outboxd_database_up{source=\"billing\"} 1",
        "outboxd_database_up{source=\"shop\"} 1",
        "outboxd_database_up{source=\"stock\"} 0",
        "outboxd_database_up{source=\"locked\"} 0",
        "outboxd_database_up{source=\"bare\"} 0",
    ];
    let health = |rows: &serde_json::Value| -> Vec<(String, bool)> {
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap().to_string(),
                    r["healthy"].as_bool().unwrap(),
                )
            })
            .collect()
    };
    let deadline = Instant::now() + PATIENCE;
    let (rows, metrics) = loop {
        let rows = http("GET", &format!("{base}/outbox/api/sources"), &[], None)
            .await
            .json();
        let metrics = http("GET", &format!("{base}/metrics"), &[], None)
            .await
            .body;
        let said = health(&rows) == want && lines.iter().all(|l| metrics.lines().any(|m| m == *l));
        if said || Instant::now() > deadline {
            break (rows, metrics);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(health(&rows), want, "{rows}");
    for line in lines {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in:\n{metrics}"
        );
    }
    assert_eq!(
        metrics.matches("# TYPE outboxd_database_up ").count(),
        1,
        "one family, every source's sample under it:\n{metrics}"
    );
    ui.terminate(Duration::from_secs(10));
    // One of the worker's databases is down: its exit may take the whole
    // documented bound (in-flight batches, then the lease release and the
    // farewell each given up on in turn).
    assert!(worker.terminate(EXIT_WITHIN).success());
}

/// A plain-HTTP server on loopback that answers every request with a small
/// page and keeps each request's head.
async fn recording_page() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let body = "<!doctype html><title>elsewhere</title><p>another site";
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (url, heads)
}

/// Over HTTPS a plain-HTTP page of the same host (another port) can
/// neither use the session cookie nor shadow it: Chromium logs in, visits
/// the page, which tosses `outboxd_session=junk` and tries
/// `__Host-outboxd_session=junk`; the dashboard still answers the session,
/// and the cookie the page captured reads nothing when replayed
/// (tests/browser/cookie.mjs).
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_page_can_neither_use_nor_shadow_the_https_session() {
    let (chromium, _) = prerequisites();
    let script = repo_dir().join("tests/browser/cookie.mjs");
    let env = TestEnv::on(Db::Postgres).await;
    let pki = common::tls::Pki::new();
    let files = pki.dir.join("dashboard");
    pki.server_files(&files, common::tls::ServerCert::Good);
    let token = "browser-test-token-0123456789";
    let config = env.dir.join("https.toml");
    let text = std::fs::read_to_string(&env.config_path).unwrap();
    std::fs::write(
        &config,
        format!(
            "{text}[dashboard]\ntoken = \"{token}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            files.join("server.pem").display(),
            files.join("server.key").display()
        ),
    )
    .unwrap();
    let (mut ui, base) = spawn_ui(&env, &config);
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let (plain, heads) = recording_page().await;
    let page = format!("{base}/outbox/");
    let vars = vec![
        ("DASH_URL", page),
        ("DASH_TOKEN", token.to_string()),
        ("PLAIN_URL", plain),
    ];
    run_browser(script, chromium, vars, || ui.log_text()).await;
    // Chromium counts loopback as a secure context: it does send the Secure
    // cookie to the plain page on another port (no cookie attribute stops
    // that). What the page captured reads nothing without the session's
    // key, which only the dashboard's own origin holds.
    let heads = heads.lock().unwrap().clone();
    assert!(!heads.is_empty(), "the plain page was never visited");
    let captured = heads
        .iter()
        .flat_map(|h| h.lines())
        .find_map(|l| l.strip_prefix("Cookie: "))
        .map(str::to_string);
    println!("the plain page was sent: {captured:?}");
    if let Some(cookie) = captured {
        let replay = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args(["--cacert", &pki.ca.display().to_string(), "-H"])
            .arg(format!("Cookie: {cookie}"))
            .arg(format!("{base}/outbox/api/summary"))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&replay.stdout),
            "401",
            "a captured cookie read the API"
        );
    }
    ui.signal("TERM");
    assert!(ui.wait(Duration::from_secs(10)).success());
}
