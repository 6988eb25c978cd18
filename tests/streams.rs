//! Streams, effectively once: outboxd's stream client (`src/stream`)
//! against RabbitMQ's stream port, which `scripts/services.sh` enables — a
//! named producer's repeats stored once, its last stored id read back by
//! any connection, an id below it dropped though confirmed (why a row that
//! commits late cannot go through the bucket's named producer), the
//! look-ups of buckets taken over at once answered by one read — and the
//! relay's stream sink under faults, with a consumer reading the whole
//! stream from its first offset: each committed row once, in order per
//! key, on every database.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::streams::{assert_each_row_once, new_stream, property, read_stream, stream_vars};
use common::*;
use outboxd::amqp::{HEADER_ID, HEADER_PARTITION_KEY};
use outboxd::demo::QueueReader;
use outboxd::producer::Message as Row;
use outboxd::stream::gather::Gather;
use outboxd::stream::lookup::{self, LOOKUP_MARGIN, Rows};
use outboxd::stream::{
    Confirm, Message, OffsetSpecification, SimpleValue, StreamClient, StreamUrl,
};

const WAIT: Duration = Duration::from_secs(10);

fn stream_url() -> StreamUrl {
    let text = std::env::var("OUTBOXD_STREAM_URL").unwrap_or_else(|_| {
        panic!("OUTBOXD_STREAM_URL is not set: run the tests with `scripts/test.sh`")
    });
    StreamUrl::parse(&text).unwrap()
}

fn message(id: u64) -> (u64, Message) {
    (id, Message::builder().body(format!("m{id}")).build())
}

/// The ids the broker confirms until `count` arrived (failing on a refusal).
async fn confirmed(
    confirms: &mut tokio::sync::mpsc::UnboundedReceiver<Confirm>,
    count: usize,
) -> Vec<u64> {
    let mut ids = Vec::new();
    while ids.len() < count {
        match tokio::time::timeout(WAIT, confirms.recv()).await {
            Ok(Some(Confirm::Stored(some))) => ids.extend(some),
            other => panic!("after {ids:?}: {other:?}"),
        }
    }
    ids
}

/// Every message body in `stream`, from its first offset.
async fn bodies(client: &StreamClient, stream: &str, expected: usize) -> Vec<String> {
    let mut reader = client
        .subscribe(stream, OffsetSpecification::First, 1)
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < expected {
        let chunk = tokio::time::timeout(WAIT, reader.chunks.recv())
            .await
            .unwrap_or_else(|_| panic!("only {seen:?} within {WAIT:?}"))
            .expect("connection open");
        for m in chunk {
            let body = m.data().expect("a body");
            seen.push(String::from_utf8(body.to_vec()).unwrap());
        }
        client.credit(reader.id, 1).await.unwrap();
    }
    // Nothing more arrives.
    if let Ok(Some(more)) =
        tokio::time::timeout(Duration::from_millis(500), reader.chunks.recv()).await
    {
        panic!("more than {expected}: {} after {seen:?}", more.len());
    }
    seen
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn a_named_producer_s_repeats_are_confirmed_and_stored_once() {
    let client = StreamClient::connect(&stream_url(), WAIT).await.unwrap();
    let stream = unique("outbox-stream");
    let retention = HashMap::from([("max-length-bytes".to_string(), "10000000".to_string())]);
    assert!(
        client
            .create_stream(&stream, retention.clone())
            .await
            .unwrap()
    );
    assert!(
        !client.create_stream(&stream, retention).await.unwrap(),
        "a second declaration finds it"
    );
    let name = unique("source/p01");
    assert_eq!(client.publisher_sequence(&name, &stream).await.unwrap(), 0);
    let mut producer = client
        .declare_publisher(Some(&name), &stream)
        .await
        .unwrap();

    let mut send = async |messages: Vec<(u64, Message)>| {
        let count = messages.len();
        client.publish(producer.id, messages).await.unwrap();
        confirmed(&mut producer.confirms, count).await
    };
    assert_eq!(
        send((1..=10).map(message).collect()).await,
        (1..=10).collect::<Vec<_>>()
    );
    // Sent again — a new owner replaying what it cannot know was stored:
    // confirmed, and dropped.
    assert_eq!(
        send((5..=10).map(message).collect()).await,
        (5..=10).collect::<Vec<_>>()
    );
    // An id below the last stored — a row that committed after rows with
    // higher ids were sent — is confirmed too, and dropped: the relay sends
    // such a row through an unnamed producer (src/stream/sink.rs).
    let late = Message::builder().body("late").build();
    assert_eq!(send(vec![(7, late)]).await, [7]);
    assert_eq!(send(vec![message(11)]).await, [11]);

    // Any connection reads the producer's last stored id.
    let other = StreamClient::connect(&stream_url(), WAIT).await.unwrap();
    assert_eq!(other.publisher_sequence(&name, &stream).await.unwrap(), 11);
    let expected: Vec<String> = (1..=11).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies(&other, &stream, 11).await, expected);

    client.delete_stream(&stream).await.unwrap();
    other.close().await;
    client.close().await;
}

/// A message as the relay's stream sink marks it: its bucket and row id as
/// application properties, which a takeover's look-up reads.
fn row_message(bucket: &str, id: u64) -> (u64, Message) {
    let message = Message::builder()
        .application_properties()
        .insert(HEADER_PARTITION_KEY, bucket)
        .insert(HEADER_ID, SimpleValue::Ulong(id))
        .message_builder()
        .body(format!("m{id}"))
        .build();
    (id, message)
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn look_ups_asked_at_once_share_one_read_and_answer_each_bucket() {
    let client = Arc::new(StreamClient::connect(&stream_url(), WAIT).await.unwrap());
    let stream = unique("outbox-stream");
    let retention = HashMap::from([("max-length-bytes".to_string(), "10000000".to_string())]);
    client.create_stream(&stream, retention).await.unwrap();
    let created = chrono::Utc::now();
    let bucket = |id: u64| format!("p{:02}", id % 16);
    let mut producer = client
        .declare_publisher(Some(&unique("source/all")), &stream)
        .await
        .unwrap();
    client
        .publish(
            producer.id,
            (1..=320).map(|id| row_message(&bucket(id), id)).collect(),
        )
        .await
        .unwrap();
    confirmed(&mut producer.confirms, 320).await;

    // As after the kill of a worker that held 16 buckets: each asks about
    // its own rows, among them one the stream does not hold.
    let gather = Arc::new(Gather::default());
    let ask = |b: u64, wanted: HashSet<u64>| {
        let (gather, client, stream) = (gather.clone(), client.clone(), stream.clone());
        async move {
            gather
                .stored_among(client, &stream, &bucket(b), wanted, created, WAIT)
                .await
                .unwrap()
        }
    };
    let questions = (0..16).map(|b| {
        let stored: HashSet<u64> = (1..=320).filter(|id| id % 16 == b).skip(10).collect();
        let mut wanted = stored.clone();
        wanted.insert(1_000 + b);
        let answer = ask(b, wanted);
        async move { (answer.await, stored) }
    });
    for (found, stored) in futures_util::future::join_all(questions).await {
        assert_eq!(found, stored, "each bucket's stored rows, and only those");
    }
    assert_eq!(gather.reads(), 1, "16 questions asked at once, one read");

    // A question asked after that read gets a read of its own.
    assert_eq!(ask(3, HashSet::from([3, 1_003])).await, HashSet::from([3]));
    assert_eq!(gather.reads(), 2);

    client.delete_stream(&stream).await.unwrap();
}

/// A takeover's look-up whose read starts after rows the stream holds, as
/// when the database's clock runs more than `LOOKUP_MARGIN` ahead of the
/// broker's: it reads again from further back, for a bucket whose later
/// rows follow that start and for one of which nothing does, rather than
/// take the rows for never sent (and send them again).
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn a_look_up_that_starts_after_stored_rows_reads_from_further_back() {
    let client = StreamClient::connect(&stream_url(), WAIT).await.unwrap();
    let stream = unique("outbox-stream");
    let retention = HashMap::from([("max-length-bytes".to_string(), "10000000".to_string())]);
    client.create_stream(&stream, retention).await.unwrap();
    let mut producer = client
        .declare_publisher(Some(&unique("source/all")), &stream)
        .await
        .unwrap();
    let mut store = async |ids: std::ops::RangeInclusive<u64>, bucket: &str| {
        let messages: Vec<_> = ids.map(|id| row_message(bucket, id)).collect();
        let count = messages.len();
        client.publish(producer.id, messages).await.unwrap();
        confirmed(&mut producer.confirms, count).await;
    };
    // Rows 1-5 of p01 and 6-10 of p02; a second later the database's
    // clock reads `between`; a second after, rows 11-15 of p01.
    store(1..=5, "p01").await;
    store(6..=10, "p02").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let between = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    store(11..=15, "p01").await;
    // The rows in doubt, the oldest created (by a clock ahead of the
    // broker's) so that a read from the margin starts at `between`.
    let oldest = between + LOOKUP_MARGIN;
    let mut from_margin = client
        .subscribe(
            &stream,
            OffsetSpecification::Timestamp(between.timestamp_millis()),
            1,
        )
        .await
        .unwrap();
    let chunk = tokio::time::timeout(WAIT, from_margin.chunks.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        chunk.messages.first().and_then(|m| m.data()),
        Some(&b"m11"[..]),
        "a read from the margin starts at row 11: the broker's clock agrees with this host's"
    );
    client.unsubscribe(from_margin.id).await.unwrap();
    let wanted: Rows = HashMap::from([
        ("p01".to_string(), (1..=5).chain(11..=15).collect()),
        ("p02".to_string(), (6..=10).collect()),
    ]);
    let found = lookup::stored_among(&client, &stream, &wanted, oldest, WAIT)
        .await
        .unwrap();
    assert_eq!(found, wanted, "every stored row found");
    client.delete_stream(&stream).await.unwrap();
    client.close().await;
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn a_missing_stream_is_refused_by_name() {
    let client = StreamClient::connect(&stream_url(), WAIT).await.unwrap();
    let missing = unique("no-such-stream");
    let refused = client
        .declare_publisher(Some("source/p01"), &missing)
        .await
        .err();
    assert!(
        refused
            .as_ref()
            .is_some_and(|e| e.to_string().contains("StreamDoesNotExist")),
        "{refused:?}"
    );
    assert!(client.is_open(), "a refusal leaves the connection up");
    let mut wrong = stream_url();
    wrong.password = "wrong".into();
    let denied = StreamClient::connect(&wrong, WAIT).await.err();
    assert!(
        denied
            .as_ref()
            .is_some_and(|e| e.to_string().contains("AuthenticationFailure")),
        "{denied:?}"
    );
}

/// `outboxd streams declare` creates every stream of `amqp.streams` with
/// the retention asked for, leaves one that exists as it is, and says so;
/// without a stream port configured it names the key to set.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn streams_declare_creates_the_configured_streams_once() {
    let url = common::streams::stream_url();
    let (a, b) = (unique("declared"), unique("declared"));
    let declare = |extra: &[&str]| {
        std::process::Command::new(common::BIN)
            .args(["streams", "declare"])
            .args(extra)
            .env("OUTBOXD_AMQP__STREAM_URL", &url)
            .env("OUTBOXD_AMQP__STREAMS", format!("{a},{b}"))
            .env_remove("AMQP_URL")
            .output()
            .unwrap()
    };
    let first = declare(&["--max-age", "7d", "--max-length-bytes", "100000000"]);
    let said = String::from_utf8_lossy(&first.stdout).to_string();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(said, format!("{a}: created\n{b}: created\n"));
    let again = declare(&[]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(
        String::from_utf8_lossy(&again.stdout).contains(&format!("{a}: exists")),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    // The stream is there: a producer can be declared on it.
    let client = StreamClient::connect(&StreamUrl::parse(&url).unwrap(), WAIT)
        .await
        .unwrap();
    assert!(client.declare_publisher(Some("probe"), &a).await.is_ok());
    for name in [&a, &b] {
        client.delete_stream(name).await.unwrap();
    }
    client.close().await;
    let unset = std::process::Command::new(common::BIN)
        .args(["streams", "declare", "x"])
        .env_remove("AMQP_URL")
        .env_remove("OUTBOXD_AMQP__STREAM_URL")
        .output()
        .unwrap();
    assert!(!unset.status.success());
    assert!(
        String::from_utf8_lossy(&unset.stderr).contains("amqp.stream_url is empty"),
        "{}",
        String::from_utf8_lossy(&unset.stderr)
    );
}

/// `outboxd consume` on a stream of `amqp.streams` that does not exist
/// says how to create it (the stream it does read: `tests/tour.rs`).
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn consume_names_a_stream_that_does_not_exist() {
    let missing = unique("missing");
    consume_refused(
        &missing,
        &missing,
        &format!(
            "stream \"{missing}\" does not exist: create it (outboxd streams declare {missing})"
        ),
    );
}

/// Runs `outboxd consume --queue <queue>` with `amqp.streams = [streams]`
/// and checks that it fails, saying `says`.
fn consume_refused(queue: &str, streams: &str, says: &str) {
    let out = std::process::Command::new(common::BIN)
        .args(["consume", "--queue", queue])
        .env("OUTBOXD_AMQP__STREAM_URL", common::streams::stream_url())
        .env("OUTBOXD_AMQP__STREAMS", streams)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

/// `outboxd consume` on a stream left out of `amqp.streams` says to list
/// it (RabbitMQ refuses the queue's declaration); a quorum queue it reads
/// as it is.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn consume_names_an_unlisted_stream_and_reads_a_quorum_queue() {
    let stream = new_stream(&common::streams::stream_url()).await;
    consume_refused(
        &stream,
        "",
        &format!("{stream:?} is a stream: list it in amqp.streams (OUTBOXD_AMQP__STREAMS)"),
    );
    let quorum = unique("quorum");
    let declared = QueueReader::open_quorum(&amqp_url(), &quorum)
        .await
        .unwrap();
    let reader = QueueReader::open(&amqp_url(), &quorum).await;
    assert!(reader.is_ok(), "{:?}", reader.err());
    drop((declared, reader));
}

// ------------------------------------------------------------ the relay

/// Starts a worker whose rows for `stream` go there.
fn stream_worker(env: &TestEnv, url: &str, stream: &str, args: &[&str]) -> WorkerProcess {
    let vars = stream_vars(url, stream);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.spawn_worker_with(None, &env.config_path, args, &vars)
}

/// Waits until no committed row is unpublished.
async fn wait_drained(env: &TestEnv, timeout: Duration) -> Duration {
    let start = std::time::Instant::now();
    loop {
        let pending = env
            .count("published_at IS NULL AND failed_at IS NULL")
            .await;
        if pending == 0 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "{pending} rows still unpublished after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Rows for a stream reach it once, their headers as application
/// properties, while rows for a queue between them go through AMQP. Then
/// the worker is killed and every row's record taken back — as if it had
/// died between the broker's confirm and the database's record each time
/// — and the worker that takes the expired leases records them all
/// without sending one again, and says so per destination: in its
/// `/metrics` and, through its heartbeat, on the dashboard.
async fn rows_reach_a_stream_once_even_when_every_record_was_lost(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let url = common::streams::stream_url();
    let stream = new_stream(&url).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    for i in 0..330 {
        let to = if i % 11 == 5 { &queue } else { &stream };
        let row = Row::new(format!("k{}", i % 30), "", to.as_str(), format!("m{i}"))
            .header("tenant", "acme")
            .header("attempt", 3)
            .content_type("text/plain");
        env.db.enqueue(row).await;
    }
    let mut worker = stream_worker(&env, &url, &stream, &["--silent"]);
    wait_drained(&env, Duration::from_secs(60)).await;
    worker.signal("KILL");
    worker.wait(Duration::from_secs(5));
    let messages = read_stream(&url, &stream, 300, Duration::from_secs(30)).await;
    assert_eq!(messages.len(), 300, "the stream holds each row once");
    // Buckets drain side by side: the first row is somewhere in the stream.
    let first = messages
        .iter()
        .find(|m| m.data() == Some(&b"m0"[..]))
        .expect("the first row is in the stream");
    assert_eq!(
        property(first, "tenant"),
        Some(&SimpleValue::String("acme".into()))
    );
    assert_eq!(property(first, "attempt"), Some(&SimpleValue::Ulong(3)));
    assert!(matches!(
        property(first, "outbox-id"),
        Some(SimpleValue::Ulong(_))
    ));
    assert!(matches!(
        property(first, "outbox-lease-epoch"),
        Some(SimpleValue::Ulong(_))
    ));
    let content_type = first.properties().and_then(|p| p.content_type.clone());
    assert_eq!(
        content_type.map(|c| c.to_string()).as_deref(),
        Some("text/plain")
    );
    let queued = reader
        .read_until(Duration::from_secs(20), |c| c.unique() >= 30)
        .await
        .unwrap();
    assert!(queued, "the 30 rows for the queue arrived through AMQP");

    env.db.exec("UPDATE outbox SET published_at = NULL").await;
    let mut worker = stream_worker(&env, &url, &stream, &["--silent", "--ui", "127.0.0.1:0"]);
    let base = wait_for_dashboard_url(&worker);
    wait_drained(&env, Duration::from_secs(60)).await;
    let metrics = http("GET", &format!("{base}/metrics"), &[], None)
        .await
        .body;
    let series = |kind: &str, name: &str| {
        let sink = if kind == "stream" { "stream" } else { "amqp" };
        format!(
            "outboxd_destination_delivered_total{{sink=\"{sink}\",kind=\"{kind}\",destination=\"{name}\"}}"
        )
    };
    for (series, n) in [
        (series("stream", &stream), 300),
        (series("queue", &queue), 30),
        ("outboxd_stream_already_stored_total".to_string(), 300),
        ("outboxd_stream_sent_total".to_string(), 0),
    ] {
        assert!(
            metrics.contains(&format!("\n{series} {n}\n")),
            "{series} {n} not in:\n{metrics}"
        );
    }
    // The dashboard adds up the heartbeats: the stream with its sink.
    let summary = format!("{base}/outbox/api/summary");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let shown = loop {
        let body: serde_json::Value =
            serde_json::from_str(&http("GET", &summary, &[], None).await.body).unwrap();
        let shown = body["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == stream.as_str())
            .cloned();
        if let Some(d) = shown.filter(|d| d["already_stored"] == 300) {
            break d;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stream is not on the dashboard: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (
            shown["sink"].as_str(),
            shown["kind"].as_str(),
            shown["delivered"].as_u64()
        ),
        (Some("stream"), Some("stream"), Some(300))
    );
    assert!(worker.terminate(Duration::from_secs(10)).success());
    let v = judge_stream_and_queue(&url, &stream, &mut reader).await;
    assert_eq!(
        v,
        (300, 0, 30),
        "(stream rows, stream duplicates, queue rows again)"
    );
}

/// The stream's rows and duplicates, and how many rows the queue got again.
async fn judge_stream_and_queue(
    url: &str,
    stream: &str,
    reader: &mut QueueReader,
) -> (usize, u64, u64) {
    let messages = read_stream(url, stream, 300, Duration::from_secs(30)).await;
    let mut ids: Vec<i64> = messages
        .iter()
        .map(|m| match property(m, "outbox-id") {
            Some(SimpleValue::Ulong(id)) => *id as i64,
            other => panic!("{other:?}"),
        })
        .collect();
    let total = ids.len();
    ids.sort();
    ids.dedup();
    let before = reader.checker.deliveries();
    let _ = reader
        .read_until(Duration::from_secs(20), |c| c.deliveries() >= before + 30)
        .await
        .unwrap();
    (
        ids.len(),
        (total - ids.len()) as u64,
        reader.checker.deliveries() - before,
    )
}

/// A row for a listed stream that does not exist is refused with the
/// stream's name and what to do, retried, and parked after max_attempts;
/// rows of other buckets keep flowing.
async fn a_row_for_a_missing_stream_is_parked_with_a_clear_error(db: Db) {
    let env = TestEnv::with(Tuning {
        max_attempts: 2,
        ..Tuning::default().on(db)
    })
    .await;
    let url = common::streams::stream_url();
    let missing = unique("missing");
    env.db
        .enqueue(Row::new("k1", "", missing.as_str(), "x"))
        .await;
    let mut worker = stream_worker(&env, &url, &missing, &["--silent"]);
    let start = std::time::Instant::now();
    while env.count("failed_at IS NOT NULL").await != 1 {
        assert!(start.elapsed() < Duration::from_secs(30), "not parked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let error: String = env
        .db
        .value("SELECT last_error FROM outbox WHERE failed_at IS NOT NULL")
        .await;
    assert!(
        error.contains(&format!("stream \"{missing}\" does not exist"))
            && error.contains("outboxd streams declare"),
        "{error}"
    );
    assert!(worker.terminate(Duration::from_secs(10)).success());
}

/// A bucket whose rows all go to a stream claims `outbox.stream_batch_size`
/// rows after its first batch; one whose rows go to a queue keeps to
/// `outbox.batch_size`. 3,000 rows of one key: into the stream in four
/// batches (100, then 1,000 at a time), each row once and in order; into a
/// queue in 30 of 100. (Batches, not claims: on PostgreSQL each row's
/// notification may wake a claim that finds nothing.)
async fn a_bucket_draining_into_a_stream_takes_stream_batch_size_rows(db: Db) {
    let env = TestEnv::with(Tuning::default().on(db)).await;
    let url = common::streams::stream_url();
    let stream = new_stream(&url).await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    let args = ["--no-leasing", "--silent", "--ui", "127.0.0.1:0"];
    let mut worker = stream_worker(&env, &url, &stream, &args);
    let base = wait_for_dashboard_url(&worker);
    let one_key = ["one".to_string()];
    let batches_of = async |to: &str| {
        let before = metric(&base, "outboxd_publish_seconds_count").await;
        env.db.exec(&plain_insert(&one_key, to, 3_000)).await;
        wait_drained(&env, Duration::from_secs(60)).await;
        metric(&base, "outboxd_publish_seconds_count").await - before
    };
    let into_stream = batches_of(&stream).await;
    assert_each_row_once(&env, &url, &stream, "3,000 rows of one key").await;
    let into_queue = batches_of(&queue).await;
    println!(
        "3,000 rows of one key: {into_stream} batches into a stream, {into_queue} into a queue"
    );
    assert_eq!(
        (into_stream, into_queue),
        (4.0, 30.0),
        "batches into a stream, into a queue:\n{}",
        worker.log_text()
    );
    let arrived = reader
        .read_until(Duration::from_secs(20), |c| c.unique() >= 3_000)
        .await
        .unwrap();
    assert!(arrived, "the queue's rows arrived");
    assert!(worker.terminate(Duration::from_secs(10)).success());
}

/// SIGKILL a random worker of three every 3 s, restarting it at once,
/// while producers write several transactions at once: every kill leaves
/// rows the broker stored and the database never recorded, and buckets
/// change hands. The stream holds each committed row once, in order per
/// key.
async fn sigkill_storm_into_a_stream_delivers_each_row_once(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let url = common::streams::stream_url();
    let stream = new_stream(&url).await;
    let spawn = || stream_worker(&env, &url, &stream, &["--silent"]);
    let mut fleet: Vec<WorkerProcess> = (0..3).map(|_| spawn()).collect();
    let producers = Producers::start(&env, "", &stream, 4, 400.0);
    let start = std::time::Instant::now();
    let mut kills = 0;
    while start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let victim = (uuid::Uuid::new_v4().as_u128() % 3) as usize;
        fleet[victim].signal("KILL");
        fleet[victim].wait(Duration::from_secs(5));
        kills += 1;
        fleet[victim] = spawn();
    }
    let acknowledged = producers.stop().await;
    let drained = wait_drained(&env, Duration::from_secs(60)).await;
    let handovers: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_lease_events WHERE action = 'acquire' AND old_owner IS NOT NULL")
        .await;
    let what = format!(
        "SIGKILL storm into a stream: {kills} kills, {handovers} buckets taken from a killed owner, {acknowledged} commits acknowledged, drained {drained:?} after the last kill"
    );
    assert_each_row_once(&env, &url, &stream, &what).await;
    terminate_all(&mut fleet);
}

/// Workers 2 → 6 → 2 every 4 s while producers write: every change hands
/// buckets over mid-drain (a leaving worker releases them, a joining one
/// takes its share), each time with rows in flight. The stream holds each
/// committed row once, in order per key.
async fn handing_buckets_over_2_6_2_into_a_stream_delivers_each_row_once(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let url = common::streams::stream_url();
    let stream = new_stream(&url).await;
    let spawn = || stream_worker(&env, &url, &stream, &["--silent"]);
    let mut fleet: Vec<WorkerProcess> = (0..2).map(|_| spawn()).collect();
    let producers = Producers::start(&env, "", &stream, 4, 400.0);
    let start = std::time::Instant::now();
    let mut changes = 0;
    while start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_secs(4)).await;
        if fleet.len() == 2 {
            fleet.extend((0..4).map(|_| spawn()));
        } else {
            for mut w in fleet.drain(2..) {
                assert!(w.terminate(Duration::from_secs(10)).success());
            }
        }
        changes += 1;
    }
    producers.stop().await;
    wait_drained(&env, Duration::from_secs(60)).await;
    let acquisitions: i64 = env
        .db
        .value("SELECT count(*) FROM outbox_lease_events WHERE action = 'acquire'")
        .await;
    let what = format!("2 ↔ 6 into a stream: {changes} changes, {acquisitions} lease acquisitions");
    assert_each_row_once(&env, &url, &stream, &what).await;
    terminate_all(&mut fleet);
}

/// One worker of three stopped with SIGSTOP for three lease TTLs while
/// producers write: the others take its buckets; when it resumes, the
/// send gate keeps what it had buffered off the stream port. The stream
/// holds each committed row once, in order per key.
async fn a_worker_stopped_past_its_lease_adds_nothing_to_the_stream(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let url = common::streams::stream_url();
    let stream = new_stream(&url).await;
    let mut fleet: Vec<WorkerProcess> = (0..3)
        .map(|_| stream_worker(&env, &url, &stream, &["--silent"]))
        .collect();
    wait_converged(&env, 3, Duration::from_secs(15)).await;
    let producers = Producers::start(&env, "", &stream, 4, 400.0);
    env.wait_count("published_at IS NOT NULL", 300, Duration::from_secs(20))
        .await;
    // Stopped between writes on SQLite (see tests/fleet.rs).
    let writer = env.db.hold_write_lock().await;
    fleet[0].signal("STOP");
    if let Some(writer) = writer {
        fleet[0].wait_stopped();
        writer.commit().await;
    }
    tokio::time::sleep(Duration::from_secs(9)).await;
    fleet[0].signal("CONT");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let acknowledged = producers.stop().await;
    wait_drained(&env, Duration::from_secs(60)).await;
    let what = format!("SIGSTOP 9 s into a stream: {acknowledged} commits acknowledged");
    assert_each_row_once(&env, &url, &stream, &what).await;
    terminate_all(&mut fleet);
}

/// RabbitMQ killed with SIGKILL during a drain and started again, twice:
/// the stream survives on disk, every worker reconnects to the stream
/// port and reads each producer's last stored id again. The stream holds
/// each committed row once, in order per key.
async fn a_stream_broker_killed_twice_delivers_each_row_once(db: Db) {
    let stream_port = free_port_pair(|| 20000 + 2 * (rand_u16() % 2000));
    let broker = PrivateBroker::start_with(vec![(
        "OUTBOXD_STREAM_PORT".into(),
        stream_port.to_string(),
    )]);
    let url = format!("rabbitmq-stream://guest:guest@127.0.0.1:{stream_port}/%2f");
    let env = TestEnv::with(Tuning {
        amqp_url: Some(broker.url()),
        confirm_timeout: "3s",
        ..Tuning::fleet().on(db)
    })
    .await;
    let stream = new_stream(&url).await;
    let spawn = || stream_worker(&env, &url, &stream, &["--silent"]);
    let mut fleet = [spawn(), spawn()];
    let producers = Producers::start(&env, "", &stream, 4, 400.0);
    // The stream's declaration on disk before the first kill.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut kills = 0;
    for _ in 0..2 {
        let before = env.published().await;
        broker.kill9();
        tokio::time::sleep(Duration::from_secs(2)).await;
        broker.run("start");
        kills += 1;
        let resumed = std::time::Instant::now();
        while env.published().await <= before {
            assert!(
                resumed.elapsed() < Duration::from_secs(60),
                "publishing did not resume"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let acknowledged = producers.stop().await;
    wait_drained(&env, Duration::from_secs(90)).await;
    let what = format!("stream broker kill -9 x{kills}: {acknowledged} commits acknowledged");
    assert_each_row_once(&env, &url, &stream, &what).await;
    terminate_all(&mut fleet);
}

/// The bucket count changed with rows pending: a worker drained part of a
/// backlog into a stream and stopped; `outboxd repartition --to 7`
/// re-labelled the rest; two workers with the new count drain it through
/// producers of new names. The stream holds each row once, in order per
/// key across the change.
async fn repartitioning_with_rows_pending_keeps_a_stream_once_and_in_order(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let url = common::streams::stream_url();
    let stream = new_stream(&url).await;
    let keys: Vec<String> = (0..200).map(|k| format!("key-{k}")).collect();
    env.db.exec(&plain_insert(&keys, &stream, 10_000)).await;
    let mut worker = stream_worker(&env, &url, &stream, &["--silent", "--batch-size", "10"]);
    env.wait_count("published_at IS NOT NULL", 300, Duration::from_secs(30))
        .await;
    assert!(worker.terminate(Duration::from_secs(10)).success());
    let published_before = env.count("published_at IS NOT NULL").await;
    assert!(published_before < 10_000, "drained before the change");
    let said = repartition_to_7(&env, &url, &stream).await;
    assert!(
        said.contains("; 0 pending row(s) the streams already hold"),
        "{said}"
    );
    drain_with_7_buckets(&env, &url, &stream).await;
    let what = format!(
        "repartition 16 → 7 into a stream with {published_before} of 10,000 published before it"
    );
    assert_each_row_once(&env, &url, &stream, &what).await;
}

/// `outboxd repartition --to 7` with the stream's settings, as soon as no
/// worker is live (a killed one is until its heartbeat runs out); what it
/// said.
async fn repartition_to_7(env: &TestEnv, url: &str, stream: &str) -> String {
    let vars = stream_vars(url, stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = env
            .command(&["repartition", "--to", "7"])
            .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).to_string();
        }
        assert!(
            stderr.contains("are live") && std::time::Instant::now() < deadline,
            "{stderr}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Two workers with the new count of 7 drain what is left.
async fn drain_with_7_buckets(env: &TestEnv, url: &str, stream: &str) {
    let toml = std::fs::read_to_string(&env.config_path).unwrap();
    std::fs::write(
        &env.config_path,
        toml.replace("partition_count = 16", "partition_count = 7"),
    )
    .unwrap();
    let mut fleet: Vec<WorkerProcess> = (0..2)
        .map(|_| stream_worker(env, url, stream, &["--silent"]))
        .collect();
    wait_drained(env, Duration::from_secs(60)).await;
    terminate_all(&mut fleet);
}

/// The bucket count changed after a worker was killed with rows in the
/// stream it never recorded (the records of 300 more are taken away by
/// hand, as a kill at a worse moment leaves them): `outboxd repartition`
/// finds them in the stream under the old count's producer names and
/// records them, so the workers of the new count, whose producers have new
/// names, send none of them again.
async fn repartitioning_after_a_kill_sends_nothing_the_stream_holds_again(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let url = common::streams::stream_url();
    let stream = new_stream(&url).await;
    let keys: Vec<String> = (0..200).map(|k| format!("key-{k}")).collect();
    env.db.exec(&plain_insert(&keys, &stream, 10_000)).await;
    let mut worker = stream_worker(&env, &url, &stream, &["--silent", "--batch-size", "10"]);
    env.wait_count("published_at IS NOT NULL", 2_000, Duration::from_secs(30))
        .await;
    worker.signal("KILL");
    worker.wait(Duration::from_secs(5));
    env.db
        .exec(
            "UPDATE outbox SET published_at = NULL WHERE id IN (SELECT id FROM (
                SELECT id FROM outbox WHERE published_at IS NOT NULL ORDER BY id DESC LIMIT 300
             ) newest)",
        )
        .await;
    let published_before = env.count("published_at IS NOT NULL").await;
    let said = repartition_to_7(&env, &url, &stream).await;
    let recorded: i64 = said
        .split("; ")
        .last()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of rows found in the streams: {said}"));
    assert!(recorded >= 300, "{said}");
    assert_eq!(
        env.count("published_at IS NOT NULL").await,
        published_before + recorded,
        "{said}"
    );
    drain_with_7_buckets(&env, &url, &stream).await;
    let what = format!(
        "repartition 16 → 7 into a stream after a kill: {recorded} pending rows found in the stream and recorded by the repartition"
    );
    assert_each_row_once(&env, &url, &stream, &what).await;
}

/// A worker is killed with its last rows in the stream, unrecorded, and
/// their heads in backoff (as after a batch whose confirm never came).
/// The next owner takes the expired leases and finds nothing ready; when a
/// third worker joins, the leases it gives up must not pass as settled —
/// their new owner would take the stored rows for rows that committed
/// late and send them again — but be left to expire, so that the new
/// owner reads the stream and records them without sending.
async fn leases_inherited_behind_a_head_in_backoff_keep_a_stream_once(db: Db) {
    let env = TestEnv::with(Tuning::fleet().on(db)).await;
    let url = common::streams::stream_url();
    let stream = new_stream(&url).await;
    let keys: Vec<String> = (0..100).map(|k| format!("key-{k}")).collect();
    env.db.exec(&plain_insert(&keys, &stream, 1_000)).await;
    let mut first = stream_worker(&env, &url, &stream, &["--silent"]);
    wait_drained(&env, Duration::from_secs(60)).await;
    first.signal("KILL");
    first.wait(Duration::from_secs(5));
    let backoff = 12;
    env.db
        .exec(&format!(
            "UPDATE outbox SET published_at = NULL, attempts = 1, \
             last_error = 'no publisher confirm', available_at = {} \
             WHERE id IN (SELECT id FROM (SELECT id FROM outbox ORDER BY id DESC LIMIT 200) newest)",
            env.db.now_plus(backoff)
        ))
        .await;
    let backed_off = std::time::Instant::now();
    let mut second = stream_worker(&env, &url, &stream, &["--silent"]);
    let second_id = worker_id_of(&env, &second).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while held_by(&env, second_id).await.len() < 16 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            leases(&env).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its drainers have claimed and found nothing ready.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut third = stream_worker(&env, &url, &stream, &["--silent"]);
    wait_converged(&env, 2, Duration::from_secs(20)).await;
    assert!(
        backed_off.elapsed() < Duration::from_secs(backoff as u64),
        "the heads left their backoff before the handover: the test proves nothing"
    );
    wait_drained(&env, Duration::from_secs(60)).await;
    assert!(second.terminate(Duration::from_secs(10)).success());
    assert!(third.terminate(Duration::from_secs(10)).success());
    let what = "leases inherited behind a head in backoff, 8 handed over";
    assert_each_row_once(&env, &url, &stream, what).await;
}

on_every_db!(
    leases_inherited_behind_a_head_in_backoff_keep_a_stream_once,
    repartitioning_with_rows_pending_keeps_a_stream_once_and_in_order,
    repartitioning_after_a_kill_sends_nothing_the_stream_holds_again,
    handing_buckets_over_2_6_2_into_a_stream_delivers_each_row_once,
    a_worker_stopped_past_its_lease_adds_nothing_to_the_stream,
    a_stream_broker_killed_twice_delivers_each_row_once,
    rows_reach_a_stream_once_even_when_every_record_was_lost,
    a_row_for_a_missing_stream_is_parked_with_a_clear_error,
    a_bucket_draining_into_a_stream_takes_stream_batch_size_rows,
    sigkill_storm_into_a_stream_delivers_each_row_once,
);
