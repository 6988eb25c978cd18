//! Faults applied for real (the start of the fault-injection suite).

mod common;

use std::time::{Duration, Instant};

use common::*;
use outboxd::demo::QueueReader;

/// RabbitMQ memory alarm: the broker blocks publishing connections. The
/// relay logs the blocked state, publishes nothing while it lasts, stays
/// responsive, and drains the backlog once the alarm clears, losing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_alarm_blocks_publishing_and_the_backlog_drains_when_it_clears() {
    let broker = PrivateBroker::start();
    let env = TestEnv::with(Tuning {
        amqp_url: Some(broker.url()),
        confirm_timeout: "3s",
        ..Tuning::default()
    })
    .await;
    let queue = unique("q");
    // Declared (and consumed from) only after the alarm: consumers are not
    // blocked, but keeping the test to one connection at a time is simpler.
    drop(QueueReader::open(&broker.url(), &queue).await.unwrap());
    let mut worker = env.spawn_worker(&["--no-leasing", "--silent"]);
    produce_evenly(
        env.db_url.clone(),
        queue.clone(),
        300,
        30,
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(
        env.wait_count("published_at IS NOT NULL", 300, Duration::from_secs(30))
            .await,
        300
    );

    broker.ctl(&["set_vm_memory_high_watermark", "0"]);
    let alarm_at = Instant::now();
    produce_evenly(
        env.db_url.clone(),
        queue.clone(),
        1_000,
        50,
        Duration::from_secs(2),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = env.count("published_at IS NOT NULL").await;
    let log = worker.log_text();
    assert!(
        log.contains("blocked publishing"),
        "the blocked state is not logged:\n{log}"
    );
    // Nothing (beyond what was in flight when the alarm began) goes out.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.count("published_at IS NOT NULL").await,
        during,
        "published while blocked"
    );

    broker.ctl(&["set_vm_memory_high_watermark", "0.4"]);
    let cleared = Instant::now();
    let published = env
        .wait_count("published_at IS NOT NULL", 1_300, Duration::from_secs(60))
        .await;
    let drained_after = cleared.elapsed();
    assert_eq!(
        published,
        1_300,
        "backlog not drained; log:\n{}",
        worker.log_text()
    );
    let mut reader = QueueReader::open(&broker.url(), &queue).await.unwrap();
    let (all, v) = read_and_judge(&mut reader, &env, 1_300, Duration::from_secs(30)).await;
    println!(
        "memory alarm: {during} published during {:?} of alarm (300 before it); backlog drained {drained_after:?} after it cleared; {}",
        cleared.duration_since(alarm_at),
        v.summary()
    );
    assert!(all && v.is_clean(), "{v:?}");
    // Responsive throughout: a clean stop, in time.
    let stop = Instant::now();
    assert!(worker.terminate(Duration::from_secs(15)).success());
    assert!(
        stop.elapsed() < Duration::from_secs(10),
        "stop took {:?}",
        stop.elapsed()
    );
}
