//! Streams for the tests: the stream port `scripts/services.sh` enables, a
//! stream made for one test, the environment that points workers at it,
//! and a reader that judges every message from the stream's first offset
//! against the committed rows.

use std::collections::HashMap;
use std::time::Duration;

use outboxd::checker::{Checker, Verdict};
use outboxd::stream::SimpleValue;
use outboxd::stream::{Message, OffsetSpecification, StreamClient, StreamUrl};

use super::{TestEnv, unique};

const WAIT: Duration = Duration::from_secs(10);

/// The shared broker's stream port.
pub fn stream_url() -> String {
    std::env::var("OUTBOXD_STREAM_URL").unwrap_or_else(|_| {
        panic!("OUTBOXD_STREAM_URL is not set: run the tests with `scripts/test.sh`")
    })
}

/// A new stream on the port at `url` (10 MB of retention is plenty).
pub async fn new_stream(url: &str) -> String {
    let client = connect(url).await;
    let stream = unique("s");
    let retention = HashMap::from([("max-length-bytes".to_string(), "200000000".to_string())]);
    assert!(client.create_stream(&stream, retention).await.unwrap());
    client.close().await;
    stream
}

pub async fn connect(url: &str) -> StreamClient {
    StreamClient::connect(&StreamUrl::parse(url).unwrap(), WAIT)
        .await
        .unwrap()
}

/// The environment that sends a worker's rows for `stream` there.
pub fn stream_vars(url: &str, stream: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OUTBOXD_AMQP__STREAM_URL", url.to_string()),
        ("OUTBOXD_AMQP__STREAMS", stream.to_string()),
    ]
}

/// An application property of a message.
pub fn property<'m>(message: &'m Message, name: &str) -> Option<&'m SimpleValue> {
    message.application_properties()?.get(name)
}

/// Every message of `stream` from its first offset, until `expected`
/// arrived (and half a second more, so that extras would show) or
/// `timeout` passed.
pub async fn read_stream(
    url: &str,
    stream: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Message> {
    let client = connect(url).await;
    let mut reader = client
        .subscribe(stream, OffsetSpecification::First, 10)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let until = tokio::time::Instant::now() + timeout;
    let mut extra = None;
    loop {
        let deadline = match extra {
            Some(t) => t,
            None if seen.len() >= expected => {
                let t = tokio::time::Instant::now() + Duration::from_millis(500);
                extra = Some(t);
                t
            }
            None => until,
        };
        match tokio::time::timeout_at(deadline, reader.chunks.recv()).await {
            Ok(Some(chunk)) => {
                seen.extend(chunk);
                client.credit(reader.id, 1).await.unwrap();
            }
            Ok(None) => panic!("the stream connection closed after {} messages", seen.len()),
            Err(_) => break,
        }
    }
    client.close().await;
    seen
}

/// Reads `stream` and judges it: each committed row once, in order per
/// key, nothing else.
pub async fn judge_stream(env: &TestEnv, url: &str, stream: &str) -> Verdict {
    let committed = env.committed().await as usize;
    let messages = read_stream(url, stream, committed, Duration::from_secs(120)).await;
    let mut checker = Checker::default();
    for m in &messages {
        let id = match property(m, "outbox-id") {
            Some(SimpleValue::Ulong(id)) => *id as i64,
            other => panic!("outbox-id: {other:?}"),
        };
        let key = match property(m, "outbox-message-key") {
            Some(SimpleValue::String(key)) => key.clone(),
            other => panic!("outbox-message-key: {other:?}"),
        };
        checker.observe(&key, id);
    }
    checker.verdict(env.all_ids().await)
}

/// Judges the stream against every committed row ([`judge_stream`]),
/// prints the verdict after `what`, with the rows the workers' logs say
/// they found stored and sent as committed late ([`stream_paths`]), and
/// fails unless each row is in the stream once, in order per key.
pub async fn assert_each_row_once(env: &TestEnv, url: &str, stream: &str, what: &str) {
    let v = judge_stream(env, url, stream).await;
    let (stored, late) = stream_paths(env);
    println!(
        "{what}; {stored} rows found in the stream and recorded without sending, {late} committed late; {}",
        v.summary()
    );
    assert!(v.is_clean(), "{}", v.summary());
    assert_eq!(v.duplicates, 0, "{}", v.summary());
}

/// What the test's workers (killed ones too) said they did with rows for
/// a stream: rows found already stored (recorded without sending) and
/// rows committed late (sent through an unnamed producer), summed from
/// their logs.
pub fn stream_paths(env: &TestEnv) -> (u64, u64) {
    let (mut stored, mut late) = (0, 0);
    let logs = std::fs::read_dir(&env.dir).expect("the test's directory");
    for path in logs.filter_map(|e| Some(e.ok()?.path())) {
        if path.extension().is_none_or(|x| x != "log") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines() {
            let rows = || -> u64 {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix("rows=")?.parse().ok())
                    .unwrap_or(0)
            };
            if line.contains("recorded without sending them again") {
                stored += rows();
            } else if line.contains("sent through an unnamed producer") {
                late += rows();
            }
        }
    }
    (stored, late)
}
