//! Traces: W3C trace context from the producer's span to the consumer, and
//! the relay's own spans exported over OTLP/HTTP to a receiver run by the
//! test (`common::otlp`, its own protobuf reader).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use common::otlp::{Receiver, Value};
use common::*;
use outboxd::demo::QueueReader;
use outboxd::producer::{Message, Producer, TraceContext};

tokio::task_local! {
    /// The application's "current span", as a tracing library keeps it.
    static CURRENT: TraceContext;
}

const TRACED: usize = 100;

fn trace_id(i: usize) -> [u8; 16] {
    let mut id = [0xa5u8; 16];
    id[8..].copy_from_slice(&(i as u64 + 1).to_be_bytes());
    id
}

fn span_id(i: usize) -> [u8; 8] {
    (0x5150_0000_0000_0000u64 + i as u64).to_be_bytes()
}

/// 100 messages produced inside spans of known trace ids (every tenth not
/// sampled), 5 outside any span, and one sampled message to an exchange
/// that does not exist; a 2-worker fleet exporting to the receiver.
/// Every delivered message carries its producer's `traceparent` and
/// `tracestate`; every sampled one has exactly one exported span, a child
/// of the producer's span with the bucket, epoch and outbox id; the
/// unroutable one has a span with an error status; the unsampled and
/// untraced ones none.
async fn every_message_continues_its_producers_trace(db: Db) {
    let env = TestEnv::with(Tuning {
        max_attempts: 2,
        ..Tuning::fleet().on(db)
    })
    .await;
    let receiver = Receiver::start().await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue)
        .await
        .unwrap()
        .keep_log();
    let producer = Producer::default().with_trace_source(|| CURRENT.try_with(Clone::clone).ok());

    let mut expected: HashMap<i64, (usize, TraceContext)> = HashMap::new();
    for i in 0..TRACED {
        let context =
            TraceContext::new(trace_id(i), span_id(i), i % 10 != 0).with_state(format!("t=v{i}"));
        let message = Message::new(format!("k{}", i % 13), "", queue.clone(), "x");
        let id = CURRENT
            .scope(context.clone(), env.db.enqueue_by(&producer, message))
            .await
            .unwrap();
        expected.insert(id, (i, context));
    }
    let mut untraced = BTreeSet::new();
    for i in 0..5 {
        let message = Message::new(format!("k{i}"), "", queue.clone(), "x");
        untraced.insert(env.db.enqueue_by(&producer, message).await.unwrap());
    }
    let bad_context = TraceContext::new(trace_id(999), span_id(999), true);
    let unroutable = CURRENT
        .scope(
            bad_context,
            env.db.enqueue_by(
                &producer,
                Message::new("k-unroutable", unique("missing"), "rk", "x"),
            ),
        )
        .await
        .unwrap();

    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k"),
        ("OTEL_SERVICE_NAME", "outboxd-under-test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_METRICS_EXPORTER", "otlp"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
    ];
    // Each worker's probes listener, for its /metrics.
    let probes: Vec<String> = (0..2)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        })
        .collect();
    let mut workers: Vec<WorkerProcess> = probes
        .iter()
        .map(|addr| {
            let mut vars = vars.to_vec();
            vars.push(("OUTBOXD_WORKER__HEALTH_LISTEN", addr));
            env.spawn_worker_with(None, &env.config_path, &["--silent"], &vars)
        })
        .collect();

    let (all, verdict) =
        read_and_judge(&mut reader, &env, TRACED + 5, Duration::from_secs(60)).await;
    assert!(all, "not everything arrived: {verdict:?}");
    env.wait_count("failed_at IS NOT NULL", 1, Duration::from_secs(30))
        .await;
    let sampled = expected
        .values()
        .filter(|(_, c)| c.parent.sampled())
        .count();
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.spans().len() < sampled + 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The receiver keeps a request before it answers, the worker counts
    // it after the answer, and a retry's span may still come: poll until
    // the counts meet (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let received = receiver.spans().len();
        let mut exported = 0;
        for addr in &probes {
            let metrics = http("GET", &format!("http://{addr}/metrics"), &[], None).await;
            exported += metrics
                .body
                .lines()
                .find_map(|l| l.strip_prefix("outboxd_trace_spans_exported_total "))
                .unwrap_or_else(|| panic!("no span counter: {}", metrics.body))
                .parse::<usize>()
                .unwrap();
        }
        if exported == received {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the workers' /metrics count {exported} spans, the receiver has {received}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    terminate_all(&mut workers);
    // The workers' counters reached the collector as OTLP metrics too: the
    // last values each sent (at the latest when it stopped) add up to
    // every message published, once at least.
    let counters = receiver.counters();
    let published: i64 = counters
        .iter()
        .filter(|((_, name), _)| name == "outboxd.published")
        .map(|(_, v)| v)
        .sum();
    let exported: i64 = counters
        .iter()
        .filter(|((_, name), _)| name == "outboxd.trace.spans_exported")
        .map(|(_, v)| v)
        .sum();
    assert!(
        published >= (TRACED + 5) as i64,
        "OTLP metrics: {published} published, {counters:?}"
    );
    assert!(exported > 0, "OTLP metrics: {counters:?}");
    assert_eq!(
        verdict.lost,
        [unroutable],
        "only the unroutable one is not delivered"
    );
    assert!(
        verdict.unexpected.is_empty() && verdict.order_violations.is_empty(),
        "{verdict:?}"
    );

    // Every delivered message carries its producer's context unchanged.
    let delivered = reader.log.take().unwrap();
    let mut epochs = BTreeMap::new();
    for d in &delivered {
        match expected.get(&d.id) {
            Some((_, context)) => {
                assert_eq!(
                    d.traceparent.as_deref(),
                    Some(context.parent.to_string().as_str()),
                    "message {}",
                    d.id
                );
                assert_eq!(d.tracestate, context.state, "message {}", d.id);
            }
            None => {
                assert!(untraced.contains(&d.id), "unknown message {}", d.id);
                assert_eq!(d.traceparent, None);
            }
        }
        epochs.insert(d.id, (d.partition_key.clone(), d.lease_epoch));
    }

    // One span per sampled message, a child of the producer's span.
    let spans = receiver.spans();
    let mut seen = BTreeSet::new();
    let mut span_ids = BTreeSet::new();
    let mut failed = Vec::new();
    for span in &spans {
        let Some(Value::Int(id)) = span.attributes.get("outboxd.outbox_id").cloned() else {
            panic!("span without outboxd.outbox_id: {span:?}");
        };
        assert!(span_ids.insert(span.span_id.clone()), "span id reused");
        assert_eq!(span.span_id.len(), 8);
        assert_eq!(span.kind, 4, "a PRODUCER span");
        assert!(span.start > 0 && span.start <= span.end, "{span:?}");
        assert_eq!(
            span.resource.get("service.name"),
            Some(&Value::Str("outboxd-under-test".into()))
        );
        if id == unroutable {
            assert_eq!(span.trace_id, trace_id(999));
            let (code, message) = span.status.clone().expect("an error status");
            assert_eq!(code, 2, "STATUS_CODE_ERROR");
            assert!(!message.is_empty());
            failed.push(id);
            continue;
        }
        let (i, context) = expected
            .get(&id)
            .unwrap_or_else(|| panic!("a span for message {id}, which is not sampled"));
        assert!(context.parent.sampled(), "message {id} was not sampled");
        assert_eq!(span.trace_id, trace_id(*i), "message {id}");
        assert_eq!(span.parent_span_id, span_id(*i), "message {id}");
        assert_eq!(span.trace_state, format!("t=v{i}"));
        assert_eq!(span.name, "publish amq.default");
        assert_eq!(span.status, None, "message {id}");
        let (bucket, epoch) = &epochs[&id];
        assert_eq!(
            span.attributes.get("outboxd.bucket"),
            Some(&Value::Str(bucket.clone()))
        );
        assert_eq!(
            span.attributes.get("outboxd.lease_epoch"),
            epoch.map(Value::Int).as_ref(),
            "message {id}"
        );
        assert_eq!(
            span.attributes
                .get("messaging.rabbitmq.destination.routing_key"),
            Some(&Value::Str(queue.clone()))
        );
        seen.insert(id);
    }
    let want: BTreeSet<i64> = expected
        .iter()
        .filter(|(_, (_, c))| c.parent.sampled())
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(seen, want, "one span for each sampled message");
    assert!(
        !failed.is_empty(),
        "the unroutable message's failed publish has a span"
    );
    for headers in receiver.request_headers() {
        assert_eq!(headers["authorization"], "Bearer t0k");
        assert_eq!(headers["content-type"], "application/x-protobuf");
    }
    println!(
        "{} delivered, {} spans ({} sampled messages, {} failed attempts)",
        delivered.len(),
        spans.len(),
        want.len(),
        failed.len()
    );
}

on_every_db!(every_message_continues_its_producers_trace);

/// Without an endpoint nothing is exported (and nothing is tried); a value
/// outboxd cannot honour stops start-up with one line naming the variable.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test]
async fn export_settings_that_cannot_be_honoured_stop_start_up_in_one_line() {
    let env = TestEnv::new().await;
    let out = env
        .command(&["work", "--once"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("outboxd: telemetry: OTEL_EXPORTER_OTLP_PROTOCOL=grpc: "),
        "{stderr}"
    );
    // A CA file for an https collector that cannot be read: the same.
    let out = env
        .command(&["work", "--once"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4318")
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "/nonexistent/ca.pem",
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "outboxd: telemetry: OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE /nonexistent/ca.pem: cannot read: No such file or directory (os error 2)"
    );
}
