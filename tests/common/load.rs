//! Load and verdicts the long fault scenarios share (tests/faults.rs,
//! tests/soak.rs): producers that write through faults, and the fencing
//! checks on what the broker received.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outboxd::demo::QueueReader;
use outboxd::producer::Message;

use super::{TestDb, TestEnv};

/// Producers for the scenarios: `tasks` transactions in flight at once,
/// every 7th rolled back. Each task owns its keys, so a key's ids are
/// committed in id order (the premise of the order check). Database errors
/// (a restart) are waited out; what was committed is read back from the
/// table at the end, so an ambiguous commit does not matter.
pub struct Producers {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
}

impl Producers {
    pub fn start(
        env: &TestEnv,
        exchange: &str,
        routing_key: &str,
        tasks: usize,
        rate: f64,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let period = Duration::from_secs_f64(tasks as f64 / rate);
        let tasks = (0..tasks)
            .map(|t| {
                let (kind, db_url, exchange, routing_key, stop) = (
                    env.kind,
                    env.db_url.clone(),
                    exchange.to_string(),
                    routing_key.to_string(),
                    stop.clone(),
                );
                tokio::spawn(async move {
                    let db = TestDb::connect_lazy(kind, &db_url, 1, Duration::from_secs(2));
                    let mut committed = 0;
                    let mut next = tokio::time::Instant::now();
                    for i in 0u64.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        next += period;
                        tokio::time::sleep_until(next).await;
                        let message = Message::new(
                            format!("t{t}-k{}", i % 40),
                            exchange.as_str(),
                            routing_key.as_str(),
                            i.to_string(),
                        );
                        let commit = i % 7 != 6;
                        if db.enqueue_in_tx(vec![message], commit).await.is_ok() && commit {
                            committed += 1;
                        }
                    }
                    db.close().await;
                    committed
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops producing; returns the commits that were acknowledged.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut n = 0;
        for t in self.tasks {
            n += t.await.unwrap();
        }
        n
    }
}

/// Lease epochs that more than one worker acquired: `(bucket, epoch,
/// workers)`. Fencing allows none.
pub async fn epochs_acquired_twice(env: &TestEnv) -> Vec<(String, i64, i64)> {
    env.db
        .rows(
            "SELECT partition_key, new_epoch, count(DISTINCT worker_id) FROM outbox_lease_events
             WHERE action = 'acquire' GROUP BY 1, 2 HAVING count(DISTINCT worker_id) > 1",
        )
        .await
}

/// First deliveries of a bucket whose lease epoch is older than one that
/// had already arrived: a message published under a lease its worker no
/// longer held. (`reader` keeps its log.)
pub fn epoch_regressions(reader: &QueueReader) -> usize {
    let mut seen = std::collections::HashSet::new();
    let mut latest_epoch: HashMap<String, i64> = HashMap::new();
    let mut regressions = 0;
    for d in reader.log.as_ref().unwrap() {
        if !seen.insert(d.id) {
            continue;
        }
        let e = d.lease_epoch.expect("fleet deliveries carry their epoch");
        let latest = latest_epoch.entry(d.partition_key.clone()).or_insert(e);
        if e < *latest {
            regressions += 1;
        }
        *latest = (*latest).max(e);
    }
    regressions
}

/// Deliveries of a bucket — any, duplicates too — under an older lease
/// epoch than one that had already arrived: a message sent by a worker
/// after another had taken its bucket over. Fencing stops a worker's sends
/// when its trust ends, before anyone can take its buckets, so there are
/// none; without the send gate, a worker resumed after SIGSTOP sends what
/// it had in flight. Returns `(bucket, late epoch, newer epoch seen)`.
pub fn late_deliveries(reader: &QueueReader) -> Vec<(String, i64, i64)> {
    let mut latest_epoch: HashMap<String, i64> = HashMap::new();
    let mut late = Vec::new();
    for d in reader.log.as_ref().unwrap() {
        let e = d.lease_epoch.expect("fleet deliveries carry their epoch");
        let latest = latest_epoch.entry(d.partition_key.clone()).or_insert(e);
        if e < *latest {
            late.push((d.partition_key.clone(), e, *latest));
        }
        *latest = (*latest).max(e);
    }
    late
}
