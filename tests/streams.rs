//! outboxd's stream client (`src/stream`) against RabbitMQ's stream port,
//! which `scripts/services.sh` enables: what the relay will build
//! effectively-once delivery on — a named producer's repeats stored once,
//! its last stored id read back by any connection — and why the publishing
//! id cannot be the row id (an id below the last stored is dropped, though
//! confirmed).

use std::collections::HashMap;
use std::time::Duration;

use outboxd::stream::{Confirm, Message, OffsetSpecification, StreamClient, StreamUrl};

const WAIT: Duration = Duration::from_secs(10);

fn stream_url() -> StreamUrl {
    let text = std::env::var("OUTBOXD_STREAM_URL").unwrap_or_else(|_| {
        panic!("OUTBOXD_STREAM_URL is not set: run the tests with `scripts/test.sh`")
    });
    StreamUrl::parse(&text).unwrap()
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
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
    let mut producer = client.declare_publisher(&name, &stream).await.unwrap();

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
    // higher ids were sent, were row ids the publishing ids — is confirmed
    // too, and dropped: the relay numbers what it sends, not what was
    // inserted.
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

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn a_missing_stream_is_refused_by_name() {
    let client = StreamClient::connect(&stream_url(), WAIT).await.unwrap();
    let missing = unique("no-such-stream");
    let refused = client.declare_publisher("source/p01", &missing).await.err();
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
