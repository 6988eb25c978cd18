//! The dashboard's JSON API against the database state, and its access
//! control, with a real `outboxd ui` process.

mod common;

use std::time::{Duration, Instant};

use common::*;
use outboxd::demo::QueueReader;
use outboxd::producer::Message;
use outboxd::store::workers::{Registration, WorkerMode};
use serde_json::Value;
use uuid::Uuid;

const TOKEN: &str = "test-token-0123456789";
/// What a URL with a password would contain (user:password@host).
const SECRET: &str = ":outboxd@";

struct Fixture {
    env: TestEnv,
    worker: Uuid,
    pending: Vec<i64>,
    published: Vec<i64>,
    parked: Vec<i64>,
    blocked_head: i64,
}

async fn fixture(db: Db) -> Fixture {
    let env = TestEnv::on(db).await;
    let mut ids = Vec::new();
    for i in 0..40 {
        let id = env
            .db
            .enqueue(
                Message::new(
                    format!("k{}", i % 10),
                    "orders",
                    "order.created",
                    format!("{{\"n\":{i}}}"),
                )
                .content_type("application/json")
                .header("tenant", "acme"),
            )
            .await;
        ids.push(id);
    }
    let published = ids[..5].to_vec();
    let parked = ids[5..7].to_vec();
    let blocked_head = ids[7];
    let now = env.db.now();
    env.db
        .exec(&format!(
            "UPDATE outbox SET published_at = {now} WHERE id IN ({})",
            list(&published)
        ))
        .await;
    env.db
        .exec(&format!(
            "UPDATE outbox SET failed_at = {now}, attempts = 3, \
             last_error = 'unroutable: returned by the broker (312 NO_ROUTE)' WHERE id IN ({})",
            list(&parked)
        ))
        .await;
    env.db
        .exec(&format!(
            "UPDATE outbox SET attempts = 2, last_error = 'boom', available_at = {} WHERE id = {blocked_head}",
            env.db.now_plus(3600)
        ))
        .await;
    let worker = Uuid::new_v4();
    let me = Registration {
        worker_id: worker,
        hostname: "host-a",
        name: "billing-a",
        mode: WorkerMode::Leasing,
        heartbeat_ttl: Duration::from_secs(60),
        can_publish: true,
    };
    env.store.register(me, &|_| true).await.unwrap();
    let mine: Vec<String> = ["p00", "p01", "p02", "p03"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    env.store
        .acquire(worker, &mine, Duration::from_secs(60), "test")
        .await
        .unwrap();
    env.store.record_throughput(7, 1).await.unwrap();
    let pending = ids[7..].to_vec();
    Fixture {
        env,
        worker,
        pending,
        published,
        parked,
        blocked_head,
    }
}

async fn get(url: &str) -> HttpResponse {
    http("GET", url, &[], None).await
}

fn ids_of(page: &Value) -> Vec<i64> {
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect()
}

async fn every_endpoint_answers_what_the_database_holds(db: Db) {
    let f = fixture(db).await;
    let env = &f.env;
    let (mut ui, base) = spawn_ui(env, &env.config_path);
    let api = format!("{base}/outbox/api");

    let r = get(&format!("{base}/healthz")).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    // The site's root leads to the dashboard.
    let r = get(&format!("{base}/")).await;
    assert_eq!((r.status, r.header("location")), (303, Some("/outbox/")));

    // Every response carries the security headers; the API's are not cached.
    for path in [
        "/outbox/",
        "/outbox/app.js",
        "/outbox/api/summary",
        "/healthz",
        "/nowhere",
    ] {
        let r = get(&format!("{base}{path}")).await;
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
            "{path}: {csp}"
        );
        assert_eq!(r.header("x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(r.header("referrer-policy"), Some("no-referrer"), "{path}");
        let cached = r.header("cache-control");
        assert_eq!(
            cached == Some("no-store"),
            path.contains("/api/"),
            "{path}: {cached:?}"
        );
    }
    // A NUL in a key search is bad input, not an outage.
    let r = get(&format!(
        "{base}/outbox/api/messages?state=pending&key=a%00b"
    ))
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("NUL"), "{}", r.body);

    // Workers.
    let w = get(&format!("{api}/workers")).await.json();
    let w = w.as_array().unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0]["worker_id"], f.worker.to_string());
    assert_eq!(w[0]["live"], true);
    assert_eq!(w[0]["buckets"], 4);
    let ttl = w[0]["heartbeat_ttl_seconds"].as_f64().unwrap();
    assert!(ttl > 0.0 && ttl <= 60.0, "{ttl}");

    // Partitions: counts and leases match the table.
    let parts = get(&format!("{api}/partitions")).await.json();
    let parts = parts.as_array().unwrap();
    assert_eq!(parts.len(), 16);
    for p in parts {
        let key = p["partition_key"].as_str().unwrap();
        let pending = env
            .count(&format!(
                "partition_key = '{key}' AND published_at IS NULL AND failed_at IS NULL"
            ))
            .await;
        let parked = env
            .count(&format!(
                "partition_key = '{key}' AND failed_at IS NOT NULL"
            ))
            .await;
        assert_eq!(p["pending"], pending, "{key}");
        assert_eq!(p["parked"], parked, "{key}");
        let owned = ["p00", "p01", "p02", "p03"].contains(&key);
        assert_eq!(p["lease_owner"] == f.worker.to_string(), owned, "{key}");
    }
    let blocked_bucket: String = env
        .db
        .value(&format!(
            "SELECT partition_key FROM outbox WHERE id = {}",
            f.blocked_head
        ))
        .await;
    let blocked = parts
        .iter()
        .find(|p| p["partition_key"] == blocked_bucket)
        .unwrap();
    assert_eq!(blocked["head_id"], f.blocked_head);
    assert_eq!(blocked["head_error"], "boom");

    // Messages: each view, in its order, and search by key and by id.
    let page = get(&format!("{api}/messages?state=pending&limit=100"))
        .await
        .json();
    assert_eq!(ids_of(&page), f.pending);
    let page = get(&format!("{api}/messages?state=published")).await.json();
    assert_eq!(
        ids_of(&page),
        f.published.iter().rev().copied().collect::<Vec<_>>()
    );
    assert_eq!(
        page["keep_published"], true,
        "the default keeps published rows"
    );
    let page = get(&format!("{api}/messages?state=failed")).await.json();
    assert_eq!(
        ids_of(&page),
        f.parked.iter().rev().copied().collect::<Vec<_>>()
    );
    let page = get(&format!("{api}/messages?state=pending&key=k3"))
        .await
        .json();
    let k3: Vec<i64> = env
        .db
        .column(
            "SELECT id FROM outbox WHERE message_key = 'k3' AND published_at IS NULL AND failed_at IS NULL ORDER BY id",
        )
        .await;
    assert_eq!(ids_of(&page), k3);
    let page = get(&format!("{api}/messages?key=%23{}", f.parked[0]))
        .await
        .json();
    assert_eq!(ids_of(&page), vec![f.parked[0]]);
    // Paging: two pages of 10 are the first 20.
    let p1 = get(&format!("{api}/messages?state=pending&limit=10"))
        .await
        .json();
    let cursor = p1["next_cursor"].as_i64().unwrap();
    let p2 = get(&format!(
        "{api}/messages?state=pending&limit=10&cursor={cursor}"
    ))
    .await
    .json();
    assert_eq!(
        [ids_of(&p1), ids_of(&p2)].concat(),
        f.pending[..20].to_vec()
    );

    // One message in detail.
    let m = get(&format!("{api}/messages/{}", f.parked[0])).await.json();
    assert_eq!(m["headers"]["tenant"], "acme");
    assert_eq!(m["payload_preview"]["text"], "{\"n\":5}");
    assert_eq!(m["attempts"], 3);
    assert!(m["last_error"].as_str().unwrap().contains("unroutable"));
    assert_eq!(get(&format!("{api}/messages/999999999")).await.status, 404);

    // Throughput: 60 minutes, the fixture's counts in the last one or two
    // (a minute may have turned between the fixture and this request).
    let t = get(&format!("{api}/throughput")).await.json();
    let minutes = t["minutes"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    let last_two: i64 = minutes[58..]
        .iter()
        .map(|m| m["published"].as_i64().unwrap())
        .sum();
    assert_eq!(last_two, 7, "{:?}", &minutes[58..]);
    assert_eq!(t["failed_last_hour"], 1);
    // And per second: 300 seconds, the counts in the last one or two.
    let seconds = t["seconds"].as_array().unwrap();
    assert_eq!(seconds.len(), 300);
    let recent: i64 = seconds
        .iter()
        .map(|s| s["published"].as_i64().unwrap())
        .sum();
    assert_eq!(recent, 7, "{seconds:?}");

    // Lease events of the last minutes: the fixture's four acquisitions.
    let events = get(&format!("{api}/lease-events?since_seconds=300"))
        .await
        .json();
    let events = events.as_array().unwrap();
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(
        events
            .iter()
            .all(|e| e["action"] == "acquire" && e["worker_id"] == f.worker.to_string())
    );

    let s = get(&format!("{api}/summary")).await.json();
    assert_eq!(s["totals"]["parked"], 2);
    assert_eq!(s["totals"]["blocked_buckets"], 1);
    assert_eq!(s["totals"]["pending"], f.pending.len() as i64);

    // Requeue: POST only, with the action header; audited.
    assert_eq!(get(&format!("{api}/requeue")).await.status, 405);
    let body = format!("{{\"ids\":[{}]}}", f.parked[0]);
    let json = [("Content-Type", "application/json")];
    let r = http("POST", &format!("{api}/requeue"), &json, Some(&body)).await;
    assert_eq!(r.status, 403, "{}", r.body);
    let r = http(
        "POST",
        &format!("{api}/requeue"),
        &[
            ("Content-Type", "application/json"),
            ("X-Outboxd-Action", "1"),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["requeued"], serde_json::json!([f.parked[0]]));
    assert_eq!(
        env.count(&format!(
            "id = {} AND failed_at IS NULL AND attempts = 0",
            f.parked[0]
        ))
        .await,
        1
    );
    let audited: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_audit WHERE action = 'requeue'")
        .await;
    assert_eq!(audited, 1);

    // Metrics.
    let m = get(&format!("{base}/metrics")).await;
    assert_eq!(m.status, 200);
    assert!(m.body.contains("outboxd_workers_live 1"), "{}", m.body);
    assert!(
        m.body
            .contains("outboxd_bucket_lag_seconds{bucket=\"p00\"}")
    );
    assert!(m.body.contains(&format!(
        "outboxd_leases_held{{worker=\"{}\",name=\"billing-a\",host=\"host-a\"}} 4",
        f.worker
    )));

    // Pages and assets, and no secret anywhere.
    let page = get(&format!("{base}/outbox/")).await;
    assert!(page.status == 200 && page.body.contains("<title>outboxd</title>"));
    assert_eq!(get(&format!("{base}/outbox/app.js")).await.status, 200);
    for body in [
        &page.body,
        &m.body,
        &get(&format!("{api}/summary")).await.body,
    ] {
        assert!(!body.contains(SECRET), "a password leaked");
    }

    // A blocked head: retried now from the page's API, audited; a row that
    // is not one is refused with 409, an unknown action with 400.
    let act = |body: String| {
        let url = format!("{api}/head");
        async move {
            http(
                "POST",
                &url,
                &[
                    ("Content-Type", "application/json"),
                    ("X-Outboxd-Action", "1"),
                ],
                Some(&body),
            )
            .await
        }
    };
    let never_failed = *f.pending.iter().find(|&&id| id != f.blocked_head).unwrap();
    let r = act(format!("{{\"id\":{never_failed},\"action\":\"park\"}}")).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("not a blocked head"), "{}", r.body);
    let r = act(format!(
        "{{\"id\":{},\"action\":\"explode\"}}",
        f.blocked_head
    ))
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r = act(format!(
        "{{\"id\":{},\"action\":\"retry\"}}",
        f.blocked_head
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["done"], serde_json::json!([f.blocked_head]));
    assert_eq!(
        env.count(&format!(
            "id = {} AND available_at <= {} AND attempts = 2",
            f.blocked_head,
            env.db.now()
        ))
        .await,
        1
    );
    let audited: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_audit WHERE action = 'retry'")
        .await;
    assert_eq!(audited, 1);
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
    assert!(
        !ui.log_text().contains(SECRET),
        "a password leaked into the log"
    );
}

async fn with_a_token_everything_but_healthz_is_refused_without_it(db: Db) {
    let f = fixture(db).await;
    let env = &f.env;
    let config = env.dir.join("token.toml");
    let text = std::fs::read_to_string(&env.config_path).unwrap();
    std::fs::write(&config, format!("{text}[dashboard]\ntoken = \"{TOKEN}\"\n")).unwrap();
    let (mut ui, base) = spawn_ui(env, &config);
    let api = format!("{base}/outbox/api");
    let bearer = format!("Bearer {TOKEN}");

    assert_eq!(get(&format!("{base}/healthz")).await.status, 200);
    for path in [
        "/outbox/api/summary",
        "/outbox/api/workers",
        "/outbox/api/messages",
        "/metrics",
    ] {
        let r = get(&format!("{base}{path}")).await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        let r = http(
            "GET",
            &format!("{base}{path}"),
            &[("Authorization", "Bearer wrong-token-00000000")],
            None,
        )
        .await;
        assert_eq!(r.status, 401, "{path}");
        let r = http(
            "GET",
            &format!("{base}{path}"),
            &[("Authorization", &bearer)],
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{path}");
    }
    // Pages send the browser to the login form.
    let r = get(&format!("{base}/outbox/")).await;
    assert_eq!(
        (r.status, r.header("location")),
        (303, Some("/outbox/login"))
    );
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let r = http(
        "POST",
        &format!("{base}/outbox/login"),
        &form,
        Some("token=nope"),
    )
    .await;
    assert_eq!(r.status, 401);
    let r = http(
        "POST",
        &format!("{base}/outbox/login"),
        &form,
        Some(&format!("token={TOKEN}")),
    )
    .await;
    assert_eq!(r.status, 303);
    let cookie = r.header("set-cookie").unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    // The session's key comes once, in the redirect's fragment.
    let key = r
        .header("location")
        .and_then(|l| l.split_once("#k="))
        .map(|(_, k)| k.to_string())
        .expect("the login's redirect carries the session's key");

    // A cookie alone reads nothing; with its key it does.
    let r = http(
        "GET",
        &format!("{api}/summary"),
        &[("Cookie", &session)],
        None,
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.body);
    let r = http(
        "GET",
        &format!("{api}/summary"),
        &[("Cookie", &session), ("X-Outboxd-Session", &key)],
        None,
    )
    .await;
    assert_eq!(r.status, 200);
    // A cookie alone cannot act: the action header is needed (no CSRF).
    let body = format!("{{\"bucket\":\"{}\"}}", "p00");
    let r = http(
        "POST",
        &format!("{api}/requeue"),
        &[("Cookie", &session), ("Content-Type", "application/json")],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 403);
    let r = http(
        "POST",
        &format!("{api}/requeue"),
        &[
            ("Cookie", &session),
            ("Content-Type", "application/json"),
            ("X-Outboxd-Action", "1"),
            ("X-Outboxd-Session", &key),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // An API client with the token may act directly.
    let body = format!("{{\"ids\":[{}]}}", f.parked[1]);
    let r = http(
        "POST",
        &format!("{api}/requeue"),
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Without any credential an action is 401, never performed.
    let r = http(
        "POST",
        &format!("{api}/requeue"),
        &[
            ("X-Outboxd-Action", "1"),
            ("Content-Type", "application/json"),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 401);
    // Logging out ends the session.
    let r = http(
        "POST",
        &format!("{base}/outbox/logout"),
        &[("Cookie", &session)],
        None,
    )
    .await;
    assert_eq!(r.status, 303);
    let r = http(
        "GET",
        &format!("{api}/summary"),
        &[("Cookie", &session), ("X-Outboxd-Session", &key)],
        None,
    )
    .await;
    assert_eq!(r.status, 401);
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
    assert!(
        !ui.log_text().contains(TOKEN),
        "the token leaked into the log"
    );
}

/// The schema's key index covers unpublished rows: the Pending and Failed
/// views' searches use it, the Published view's reads the table; after
/// the book's *Searching published messages by key* the Published view's
/// search uses that index. Each answer is checked against the table, and
/// each use of an index by its scan count (one per search).
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn every_key_search_answers_and_uses_its_index() {
    let f = fixture(Db::Postgres).await;
    let env = &f.env;
    let indexes = || async {
        env.db
            .column::<String>("SELECT indexname::text FROM pg_indexes WHERE tablename = 'outbox'")
            .await
    };
    let before = indexes().await;
    assert!(
        before.iter().any(|i| i == "outbox_unpublished_key_idx")
            && !before.iter().any(|i| i == "outbox_message_key_idx"),
        "{before:?}"
    );
    // Enough other rows, of every state, that reading by key is the
    // planner's only good choice where an index allows it.
    env.db
        .exec(
            "INSERT INTO outbox (partition_key, message_key, routing_key, payload, failed_at, published_at)
             SELECT outbox_partition_for('bulk-' || g), 'bulk-' || g, 'q', 'x',
                    CASE WHEN g % 3 = 0 THEN now() END, CASE WHEN g % 3 = 1 THEN now() END
             FROM generate_series(1, 60000) g",
        )
        .await;
    env.db.exec("ANALYZE outbox").await;
    let (mut ui, base) = spawn_ui(env, &env.config_path);
    let api = format!("{base}/outbox/api");
    let scans = |index: &'static str| async move {
        env.db
            .value::<i64>(&format!(
                "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = '{index}'"
            ))
            .await
    };
    // Searches every key of the fixture in `state` and compares each page
    // with the table (read with an expression no index serves); then, when
    // `index` is named, waits for its scan count to grow by one per search.
    let api = &api;
    let search = |state: &'static str, index: Option<&'static str>| async move {
        let which = match state {
            "pending" => "published_at IS NULL AND failed_at IS NULL ORDER BY id",
            "failed" => "failed_at IS NOT NULL ORDER BY id DESC",
            _ => "published_at IS NOT NULL ORDER BY id DESC",
        };
        let counted = match index {
            Some(index) => scans(index).await,
            None => 0,
        };
        for k in 0..10 {
            let page = get(&format!("{api}/messages?state={state}&key=k{k}"))
                .await
                .json();
            let expected: Vec<i64> = env
                .db
                .column(&format!(
                    "SELECT id FROM outbox WHERE message_key || '' = 'k{k}' AND {which}"
                ))
                .await;
            assert_eq!(ids_of(&page), expected, "{state}, key k{k}");
        }
        if let Some(index) = index {
            // An idle session reports its statistics within 10 s.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while scans(index).await < counted + 10 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the {state} view's key search did not use {index}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // Whatever was still to be reported of this view is in now.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    };
    search("pending", Some("outbox_unpublished_key_idx")).await;
    search("failed", Some("outbox_unpublished_key_idx")).await;
    search("published", None).await;

    let statements = readme::published_key_index();
    assert_eq!(statements.len(), 1, "{statements:?}");
    env.db.exec(&statements[0]).await;
    assert!(
        indexes()
            .await
            .iter()
            .any(|i| i == "outbox_message_key_idx"),
        "the book's statement made no outbox_message_key_idx"
    );
    env.db.exec("ANALYZE outbox").await;
    search("published", Some("outbox_message_key_idx")).await;
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
}

/// With `outbox.keep_published = false` the Published view is empty by
/// design, and its page says so (the page then explains it), while a
/// message published through a worker is gone from the table.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn with_published_rows_deleted_the_published_view_says_so() {
    let env = TestEnv::with(Tuning {
        keep_published: false,
        ..Tuning::default()
    })
    .await;
    let queue = unique("q");
    drop(QueueReader::open(&amqp_url(), &queue).await.unwrap());
    env.db
        .enqueue(Message::new("k", "", queue.as_str(), "gone once published"))
        .await;
    let mut worker = env.spawn_worker(&["--no-leasing", "--once"]);
    assert!(worker.wait(Duration::from_secs(30)).success());
    assert_eq!((env.committed().await, env.count("true").await), (1, 0));
    let (mut ui, base) = spawn_ui(&env, &env.config_path);
    let page = get(&format!("{base}/outbox/api/messages?state=published"))
        .await
        .json();
    assert_eq!(page["keep_published"], false);
    assert_eq!(ids_of(&page), Vec::<i64>::new());
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
}

/// The Published view's search by key, which may read the whole table, is
/// stopped by the database after its bound and says so; the other views
/// are not held up by it. (A lock held on the table stands in for a table
/// too large to scan in time: the statement waits on it under the same
/// bound.)
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn a_published_key_search_that_runs_too_long_is_stopped_and_says_why() {
    let f = fixture(Db::Postgres).await;
    let env = &f.env;
    let (mut ui, base) = spawn_ui(env, &env.config_path);
    let api = format!("{base}/outbox/api");
    let mut locker = env.db.pg().begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let r = get(&format!("{api}/messages?state=published&key=k1")).await;
    let took = started.elapsed();
    locker.rollback().await.unwrap();
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.body.contains("searching published messages by key") && r.body.contains("within 5s"),
        "{}",
        r.body
    );
    assert!(
        (Duration::from_millis(4500)..Duration::from_secs(9)).contains(&took),
        "answered after {took:?}"
    );
    // The lock is gone: the same search answers, and nothing was left
    // holding a connection.
    let page = get(&format!("{api}/messages?state=published&key=k1")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
}

/// A source whose database hangs (every process of its server stopped,
/// connections open, nothing answering) is unhealthy in the overview with
/// "no answer within 2s", in `/healthz`'s lines and in `/metrics`, while
/// the other source stays healthy and every poll is answered promptly; once
/// the server resumes, the source is healthy again by itself. (A read that
/// ran out of its 2 s used to be stopped, dropping the connection it was
/// opening: on a loaded machine, where opening one took longer, no source
/// ever became healthy.)
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_whose_database_hangs_is_unhealthy_the_other_is_not_and_it_recovers() {
    let pg = PrivatePostgres::start();
    let billing = TestEnv::with(Tuning::default()).await;
    let stock = TestEnv::with(Tuning {
        server_admin_url: Some(pg.admin_url()),
        ..Tuning::default()
    })
    .await;
    let sources = format!(
        "\n[[source]]\nname = \"billing\"\nurl = \"{}\"\n\n[[source]]\nname = \"stock\"\nurl = \"{}\"\n",
        billing.worker_db_url, stock.worker_db_url
    );
    let config = billing.config_variant("sources", |text| format!("{text}{sources}"));
    let (mut ui, base) = spawn_ui(&billing, &config);
    let overview = format!("{base}/outbox/api/sources");
    let rows = || async {
        let started = std::time::Instant::now();
        let r = get(&overview).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(6), "the overview took {took:?}");
        let rows: Value = serde_json::from_str(&r.body).unwrap();
        let row = |name: &str| {
            let row = rows
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name)
                .unwrap()
                .clone();
            (row["healthy"].as_bool().unwrap(), row["error"].clone())
        };
        (row("billing"), row("stock"))
    };
    let until = |want_stock: bool| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (billing, stock) = rows().await;
            if stock.0 == want_stock || std::time::Instant::now() > deadline {
                return (billing, stock);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (b, s) = until(true).await;
    assert!(
        b.0 && s.0,
        "both healthy at first: billing {b:?}, stock {s:?}"
    );

    pg.signal_all("STOP");
    let (b, s) = until(false).await;
    assert!(b.0, "billing unhealthy while only stock hangs: {b:?}");
    assert_eq!(s, (false, Value::from("database: no answer within 2s")));
    // Polls go on being answered (each waits on the read in flight) while
    // the other source stays healthy.
    for _ in 0..4 {
        let (b, s) = rows().await;
        assert!(b.0 && !s.0, "billing {b:?}, stock {s:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let health = get(&format!("{base}/healthz")).await;
    assert_eq!(health.status, 200, "{}", health.body);
    assert!(
        health.body.contains("billing: ok")
            && health
                .body
                .contains("stock: database unreachable: no answer"),
        "{}",
        health.body
    );
    let metrics = get(&format!("{base}/metrics")).await.body;
    for line in [
        "outboxd_database_up{source=\"billing\"} 1",
        "outboxd_database_up{source=\"stock\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in:\n{metrics}"
        );
    }

    pg.signal_all("CONT");
    let (b, s) = until(true).await;
    assert!(
        b.0 && s.0,
        "after the server resumed: billing {b:?}, stock {s:?}"
    );
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
}

on_every_db!(
    every_endpoint_answers_what_the_database_holds,
    with_a_token_everything_but_healthz_is_refused_without_it,
);

/// `outboxd ui` with `[dashboard]` settings appended to the test's config.
fn spawn_ui_with(env: &TestEnv, dashboard: &str) -> (WorkerProcess, String) {
    let config = env.dir.join(format!("{}.toml", unique("dashboard")));
    let text = std::fs::read_to_string(&env.config_path).unwrap();
    std::fs::write(&config, format!("{text}[dashboard]\n{dashboard}")).unwrap();
    spawn_ui(env, &config)
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_hosts_guessing_expired_sessions_and_misattributed_audits_are_refused() {
    let f = fixture(Db::Postgres).await;
    let env = &f.env;
    let (mut ui, base) = spawn_ui_with(
        env,
        &format!("token = \"{TOKEN}\"\nsession_ttl = \"2s\"\nallowed_hosts = [\"ops.example\"]\n"),
    );
    let port = base.rsplit(':').next().unwrap().to_string();
    let summary = format!("{base}/outbox/api/summary");
    let bearer = format!("Bearer {TOKEN}");

    // DNS rebinding: a page's own name, resolved to the dashboard's address.
    let foreign = format!("rebound.example:{port}");
    let r = http(
        "GET",
        &summary,
        &[("Host", &foreign), ("Authorization", &bearer)],
        None,
    )
    .await;
    assert_eq!(r.status, 421, "{}", r.body);
    for host in [format!("localhost:{port}"), "ops.example".to_string()] {
        let r = http(
            "GET",
            &summary,
            &[("Host", &host), ("Authorization", &bearer)],
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }

    // A Bearer request that also carries a bogus session cookie is audited
    // as the Bearer credential that was checked.
    let body = format!("{{\"ids\":[{}]}}", f.parked[0]);
    let r = http(
        "POST",
        &format!("{base}/outbox/api/requeue"),
        &[
            ("Authorization", &bearer),
            ("Cookie", "outboxd_session=bogus"),
            ("Content-Type", "application/json"),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let actor: String = env
        .db
        .value("SELECT actor FROM outbox_audit WHERE action = 'requeue'")
        .await;
    assert_eq!(actor, "dashboard API (bearer token)");
    // An empty action header is no action header.
    let login = |token: &str| {
        let body = format!("token={token}");
        let url = format!("{base}/outbox/login");
        async move {
            http(
                "POST",
                &url,
                &[("Content-Type", "application/x-www-form-urlencoded")],
                Some(&body),
            )
            .await
        }
    };
    let r = login(TOKEN).await;
    assert_eq!(r.status, 303);
    let session = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let r = http(
        "POST",
        &format!("{base}/outbox/api/requeue"),
        &[
            ("Cookie", &session),
            ("Content-Type", "application/json"),
            ("X-Outboxd-Action", ""),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);

    // The session expires: the page sends the browser to the login form.
    let page = format!("{base}/outbox/");
    assert_eq!(
        http("GET", &page, &[("Cookie", &session)], None)
            .await
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let r = http("GET", &page, &[("Cookie", &session)], None).await;
    assert_eq!(
        (r.status, r.header("location")),
        (303, Some("/outbox/login"))
    );

    // Guessing: ten wrong tokens a minute from one address, then even the
    // right one is refused, and the refusal names the address.
    for i in 0..10 {
        assert_eq!(
            login(&format!("wrong-token-{i:08}")).await.status,
            401,
            "attempt {i}"
        );
    }
    let r = login(TOKEN).await;
    assert_eq!(r.status, 429, "{}", r.body);
    let r = http("GET", &summary, &[("Authorization", &bearer)], None).await;
    assert_eq!(r.status, 429, "a Bearer token from the same address too");
    ui.signal("TERM");
    ui.wait(Duration::from_secs(10));
    let log = ui.log_text();
    assert!(
        log.contains("dashboard login with a wrong token") && log.contains("client=127.0.0.1"),
        "{log}"
    );
    assert!(
        log.contains("refused a token from an address that sent 10 wrong ones"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "the token leaked into the log");
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_serves_https_with_its_own_certificate() {
    let env = TestEnv::new().await;
    let pki = common::tls::Pki::new();
    let files = pki.dir.join("dashboard");
    pki.server_files(&files, common::tls::ServerCert::Good);
    let (mut ui, base) = spawn_ui_with(
        &env,
        &format!(
            "token = \"{TOKEN}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            files.join("server.pem").display(),
            files.join("server.key").display()
        ),
    );
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let curl = |extra: &[&str]| {
        std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args(extra)
            .arg(format!("{base}/outbox/api/summary"))
            .output()
            .unwrap()
    };
    let ca = pki.ca.display().to_string();
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let ok = curl(&["--cacert", &ca, "-H", &bearer]);
    assert_eq!(
        String::from_utf8_lossy(&ok.stdout),
        "200",
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // Without the CA the certificate is not trusted; plain HTTP gets nothing.
    assert!(!curl(&[]).status.success());
    let plain = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("{}/healthz", base.replace("https://", "http://")))
        .output()
        .unwrap();
    assert_ne!(String::from_utf8_lossy(&plain.stdout), "200");
    // The session cookie is `__Host-` and Secure, and HSTS is on: a
    // browser sends the cookie over HTTPS only, and no page on plain HTTP
    // can set or shadow it.
    let login = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null", "-D", "-"])
        .args(["--cacert", &ca, "--data", &format!("token={TOKEN}")])
        .arg(format!("{base}/outbox/login"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&login.stdout).to_ascii_lowercase();
    assert!(
        head.contains("set-cookie: __host-outboxd_session=")
            && head.contains("; path=/; secure; httponly; samesite=strict"),
        "{head}"
    );
    assert!(
        head.contains("strict-transport-security: max-age=31536000"),
        "{head}"
    );
    ui.signal("TERM");
    assert!(ui.wait(Duration::from_secs(10)).success());
}

/// A connection from `source` to `to`, its header sent up to `head`.
async fn connect_from(source: &str, to: &str) -> Option<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(to.parse().unwrap()).await.ok()
}

/// Whether the server closed `stream` (or answered and closed) within
/// `limit`.
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 512];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, read).await.is_ok()
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// Half-sent requests cannot take the dashboard down: one address holds at
/// most 64 connections (the rest are closed at once), each for at most the
/// header deadline (10 s), and another address is answered meanwhile.
async fn slow_connections_are_capped_and_closed_and_others_are_served() {
    use tokio::io::AsyncWriteExt;
    let env = TestEnv::new().await;
    let (mut ui, base) = spawn_ui_with(&env, &format!("token = \"{TOKEN}\"\n"));
    let addr = base.trim_start_matches("http://").to_string();
    let mut held = Vec::new();
    let mut refused = 0;
    let started = Instant::now();
    for _ in 0..200 {
        let mut s = connect_from("127.0.0.1", &addr).await.unwrap();
        // Half a request: the header never ends.
        if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .is_err()
        {
            refused += 1;
            continue;
        }
        held.push(s);
    }
    // Those beyond the cap are closed at once.
    let mut closed_at_once = 0;
    for s in held.iter_mut() {
        if closed_within(s, Duration::from_millis(20)).await {
            closed_at_once += 1;
        }
    }
    let open = held.len() - closed_at_once;
    println!(
        "200 half-open connections: {open} held, {} refused",
        refused + closed_at_once
    );
    assert_eq!(open, 64, "the per-address cap");
    // Another address is answered at once, with the token's status only.
    let asked = Instant::now();
    let mut other = connect_from("127.0.0.2", &addr).await.unwrap();
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut other, &mut answer)
        .await
        .unwrap();
    let took = asked.elapsed();
    println!("/healthz from another address: {took:?}");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The held ones are closed by the header deadline (10 s).
    for s in held.iter_mut() {
        assert!(closed_within(s, Duration::from_secs(15)).await);
    }
    let closed_after = started.elapsed();
    println!("every held connection closed after {closed_after:?}");
    assert!(closed_after >= Duration::from_secs(9), "{closed_after:?}");
    // And the address is served again.
    assert_eq!(get(&format!("{base}/healthz")).await.status, 200);
    ui.signal("TERM");
    assert!(ui.wait(Duration::from_secs(10)).success());
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// Every form of naming another host is refused (421), with the security
/// headers and without repeating what was sent.
async fn every_form_of_a_foreign_host_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = TestEnv::new().await;
    let (mut ui, base) = spawn_ui_with(&env, "");
    let addr = base.trim_start_matches("http://").to_string();
    let raw = |request: String| {
        let addr = addr.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            s.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            s.read_to_string(&mut answer).await.unwrap();
            answer
        }
    };
    let ok = raw(format!(
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    ))
    .await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    for request in [
        format!("GET /healthz HTTP/1.1\r\nHost: {addr}@evil.example\r\nConnection: close\r\n\r\n"),
        "GET /healthz HTTP/1.0\r\n\r\n".to_string(),
        format!(
            "GET http://evil.example/healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        ),
        format!(
            "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        ),
        "GET /healthz HTTP/1.1\r\nHost: <script>evil.example\r\nConnection: close\r\n\r\n"
            .to_string(),
    ] {
        let answer = raw(request.clone()).await;
        let status = answer.split(' ').nth(1).unwrap_or_default();
        assert!(status == "421" || status == "400", "{request:?}: {answer}");
        assert!(!answer.contains("evil"), "echoed: {answer}");
        if status == "421" {
            let lower = answer.to_ascii_lowercase();
            assert!(
                lower.contains("content-security-policy:")
                    && lower.contains("x-frame-options: deny"),
                "{answer}"
            );
        }
    }
    ui.signal("TERM");
    assert!(ui.wait(Duration::from_secs(10)).success());
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// With a token, `/healthz` says only the status to a caller without it:
/// the driver's error (which names the database's user, host and port)
/// only with the token.
async fn healthz_names_database_details_only_with_the_token() {
    let billing = TestEnv::with(Tuning::default()).await;
    let sources = format!(
        "\n[[source]]\nname = \"billing\"\nurl = \"{}\"\n\n[[source]]\nname = \"stock\"\nurl = \"postgres://stock_user@127.0.0.1:1/stock_db\"\n\n[dashboard]\ntoken = \"{TOKEN}\"\n",
        billing.worker_db_url
    );
    let config = billing.config_variant("healthz", |text| format!("{text}{sources}"));
    let (mut ui, base) = spawn_ui(&billing, &config);
    let url = format!("{base}/healthz");
    let deadline = Instant::now() + Duration::from_secs(20);
    let anonymous = loop {
        let r = get(&url).await;
        if r.body.contains("billing: ok") || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(anonymous.status, 200, "{}", anonymous.body);
    assert_eq!(anonymous.body, "ok\nbilling: ok\nstock: unreachable\n");
    let bearer = format!("Bearer {TOKEN}");
    let detailed = http("GET", &url, &[("Authorization", &bearer)], None).await;
    assert!(detailed.body.contains("stock: "), "{}", detailed.body);
    assert!(
        detailed.body.contains("127.0.0.1:1") || detailed.body.contains("stock_user"),
        "the token's caller sees why: {}",
        detailed.body
    );
    println!(
        "without the token: {:?}\nwith it: {:?}",
        anonymous.body, detailed.body
    );
    ui.signal("TERM");
    assert!(ui.wait(Duration::from_secs(10)).success());
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// The icon is where browsers look for it, and needs no token (the login
/// page shows it too).
async fn the_favicon_is_served_without_a_token() {
    let env = TestEnv::new().await;
    let (mut ui, base) = spawn_ui_with(&env, &format!("token = \"{TOKEN}\"\n"));
    for path in ["/favicon.ico", "/outbox/favicon.svg"] {
        let r = get(&format!("{base}{path}")).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(r.header("content-type"), Some("image/svg+xml"), "{path}");
        assert!(r.body.starts_with("<svg"), "{path}");
    }
    ui.signal("TERM");
    assert!(ui.wait(Duration::from_secs(10)).success());
}

/// A request from the loopback address `source`: (status, head and body).
async fn request_from(source: &str, addr: &str, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = connect_from(source, addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer).await;
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// Five addresses guessing nine tokens each: the first 30 wrong tokens are
/// answered 401, the rest 429; then an address that never logged in is
/// refused even with the right token, one that did is not, and a session
/// cookie another page set under a narrower path does not hide the real
/// one. A lock-out's refusals are one log line per address, not one each.
async fn guessing_from_many_addresses_is_limited_in_all_and_a_tossed_cookie_is_ignored() {
    let env = TestEnv::new().await;
    let (mut ui, base) = spawn_ui_with(&env, &format!("token = \"{TOKEN}\"\n"));
    let addr = base.trim_start_matches("http://").to_string();
    let bearer = |token: &str| {
        format!(
            "GET /outbox/api/summary HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
    };
    // 127.0.0.1 logs in first.
    let login = format!(
        "POST /outbox/login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\ntoken={TOKEN}",
        TOKEN.len() + 6
    );
    let (status, answer) = request_from("127.0.0.1", &addr, &login).await;
    assert_eq!(status, 303, "{answer}");
    let session = answer
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_string();

    let mut answers = Vec::new();
    for a in 2..=6 {
        for i in 0..9 {
            let wrong = format!("wrong-token-{a}-{i:04}");
            answers.push(
                request_from(&format!("127.0.0.{a}"), &addr, &bearer(&wrong))
                    .await
                    .0,
            );
        }
    }
    let unauthorized = answers.iter().filter(|s| **s == 401).count();
    let limited = answers.iter().filter(|s| **s == 429).count();
    println!("45 wrong tokens from 5 addresses: {unauthorized} answered 401, {limited} 429");
    assert_eq!((unauthorized, limited), (30, 15), "{answers:?}");
    // The right token from an address that never logged in: refused too.
    let (status, _) = request_from("127.0.0.7", &addr, &bearer(TOKEN)).await;
    assert_eq!(status, 429);
    // From the address that logged in: answered.
    let (status, answer) = request_from("127.0.0.1", &addr, &bearer(TOKEN)).await;
    assert_eq!(status, 200, "{answer}");
    // A session cookie tossed under a narrower path comes first: ignored.
    let page = format!(
        "GET /outbox/ HTTP/1.1\r\nHost: {addr}\r\nCookie: outboxd_session=junk; {session}\r\nConnection: close\r\n\r\n"
    );
    let (status, answer) = request_from("127.0.0.1", &addr, &page).await;
    assert_eq!(status, 200, "{answer}");

    ui.signal("TERM");
    assert!(ui.wait(Duration::from_secs(10)).success());
    let log = ui.log_text();
    let refusal_lines = log
        .lines()
        .filter(|l| l.contains("refused a token"))
        .count();
    println!("{limited} refusals, {refusal_lines} log lines");
    assert!(
        (1..=4).contains(&refusal_lines),
        "one line per refused address, not one per refusal:\n{log}"
    );
    assert!(!log.contains(TOKEN));
}
