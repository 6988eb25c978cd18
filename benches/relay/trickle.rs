//! The trickle: a producer committing one message per transaction at a
//! steady rate while a consumer takes them off the queue, every message
//! timed from its producer to its delivery. Sections 2, 8 and 10 use its
//! default shape and report commit-to-queue times; section 14
//! (`relay/shapes.rs`) varies the [`Shape`] and reports every stage.
//!
//! Per message the producer notes when its transaction began (just before
//! the `INSERT`) and when its commit returned; the consumer notes the
//! delivery. On PostgreSQL a listener of the bench's own (`LISTEN` on the
//! outbox's channel, a connection like the worker's) notes when each
//! commit's notification arrived: the producer sends one transaction at a
//! time and each sends one notification, so the k-th notification belongs
//! to the k-th commit. `OUTBOXD_BENCH_TRICKLE_DUMP=<dir>` writes every
//! message's times to a file per trickle ([`dump`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use outboxd::amqp::message_properties;
use outboxd::producer::{Message, Producer};
use outboxd::store::outbox::ClaimedMessage;
use sqlx::postgres::{PgListener, PgPoolOptions};

use super::{BUCKETS, PAYLOAD, ms};

/// How a trickle is produced and consumed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Shape {
    /// Distinct message keys, used in turn.
    pub keys: usize,
    /// Each message on a connection opened for it (after the connect, the
    /// clock starts) and closed after its commit, instead of a pool's.
    pub fresh_connection: bool,
    /// The consumer acknowledges every delivery; else it consumes with
    /// `no_ack`.
    pub acks: bool,
    /// The producer publishes each message itself right after its commit,
    /// with a confirm, to the same queue (a dual write; no relay runs).
    pub bare: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            keys: 200,
            fresh_connection: false,
            acks: true,
            bare: false,
        }
    }
}

/// One trickle's timings, each sorted.
pub(crate) struct Trickled {
    /// Transaction begun (just before the `INSERT`) → delivery.
    pub from_insert: Vec<Duration>,
    /// Commit returned → delivery.
    pub from_commit: Vec<Duration>,
    /// Transaction begun → commit returned.
    pub commit: Vec<Duration>,
    /// Commit returned → its notification at the bench's listener (empty
    /// off PostgreSQL, for a bare trickle, or when the counts disagree).
    pub notified: Vec<Duration>,
}

/// Commit-to-queue latencies of the default shape, sorted.
pub(crate) async fn trickle(
    db_url: &str,
    amqp_url: &str,
    queue: &str,
    rate: u64,
    over: Duration,
) -> Vec<Duration> {
    trickle_shaped(db_url, amqp_url, queue, (rate, over), Shape::default())
        .await
        .from_commit
}

/// A trickle of `rate` messages a second for `over`, in `shape`.
pub(crate) async fn trickle_shaped(
    db_url: &str,
    amqp_url: &str,
    queue: &str,
    (rate, over): (u64, Duration),
    shape: Shape,
) -> Trickled {
    let conn = Connection::connect(amqp_url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(1000, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "bench".into(),
            BasicConsumeOptions {
                no_ack: !shape.acks,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let listening = if db_url.starts_with("postgres") && !shape.bare {
        Some(Notifications::listen(db_url).await)
    } else {
        None
    };
    let n = (rate as f64 * over.as_secs_f64()) as usize;
    let times: Times = Default::default();
    let producing = tokio::spawn(produce(
        db_url.to_string(),
        shape.bare.then(|| amqp_url.to_string()),
        queue.to_string(),
        (rate, n),
        shape,
        times.clone(),
    ));
    let mut delivered = Vec::with_capacity(n);
    let mut early: HashMap<i64, Instant> = HashMap::new();
    let deadline = Instant::now() + over + Duration::from_secs(30);
    while delivered.len() < n && Instant::now() < deadline {
        let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_secs(5), consumer.next()).await
        else {
            continue;
        };
        let got = Instant::now();
        let id = match d
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("outbox-id").cloned())
        {
            Some(AMQPValue::LongLongInt(i)) => i,
            _ => continue,
        };
        if shape.acks {
            d.ack(BasicAckOptions::default()).await.unwrap();
        }
        // The delivery can beat the producer's bookkeeping by microseconds.
        early.insert(id, got);
        let map = times.lock().unwrap();
        early.retain(|id, got| match map.get(id) {
            Some(&(began, committed)) => {
                delivered.push((*got, began, committed));
                false
            }
            None => true,
        });
    }
    producing.await.unwrap();
    conn.close(200, "bye".into()).await.ok();
    let mut commits: Vec<(Instant, Instant)> = times.lock().unwrap().values().copied().collect();
    commits.sort();
    let notified = match listening {
        Some(l) => paired(&l.stop().await, &commits),
        None => Vec::new(),
    };
    if let Ok(dir) = std::env::var("OUTBOXD_BENCH_TRICKLE_DUMP") {
        dump(Path::new(&dir), (rate, queue), shape, &delivered);
    }
    let sorted = |mut v: Vec<Duration>| {
        v.sort();
        v
    };
    Trickled {
        from_insert: sorted(delivered.iter().map(|(g, b, _)| *g - *b).collect()),
        from_commit: sorted(
            delivered
                .iter()
                .map(|(g, _, c)| g.saturating_duration_since(*c))
                .collect(),
        ),
        commit: sorted(commits.iter().map(|(b, c)| *c - *b).collect()),
        notified: sorted(notified),
    }
}

/// With `OUTBOXD_BENCH_TRICKLE_DUMP=<dir>`, every message of a trickle in
/// the order it was produced, one line each: milliseconds from the first
/// `INSERT` to its own, its `INSERT` → delivery, its commit → delivery;
/// headed by the wall-clock time (Unix seconds) of the first `INSERT`, to
/// line the trickle up with a server's log. One file per trickle,
/// `trickle-<rate>-<relay|bare>-<queue>-<Unix ms>.txt` (trickles run at
/// once have their own queues): where a tail comes from
/// (a stall of every bucket at once, or one bucket's queue; the start of
/// the trickle, or throughout) shows in the file, not in a percentile.
fn dump(
    dir: &Path,
    (rate, queue): (u64, &str),
    shape: Shape,
    delivered: &[(Instant, Instant, Instant)],
) {
    let Some(first) = delivered.iter().map(|&(_, began, _)| began).min() else {
        return;
    };
    let mut rows: Vec<(f64, f64, f64)> = delivered
        .iter()
        .map(|&(got, began, committed)| {
            (
                ms(began - first),
                ms(got - began),
                ms(got.saturating_duration_since(committed)),
            )
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let started = now.as_secs_f64() - first.elapsed().as_secs_f64();
    let mut text = format!("# first INSERT at {started:.3} (Unix seconds), {shape:?}\n");
    for (at, from_insert, from_commit) in rows {
        text += &format!("{at:.3} {from_insert:.3} {from_commit:.3}\n");
    }
    let arm = if shape.bare { "bare" } else { "relay" };
    let file = dir.join(format!(
        "trickle-{rate}-{arm}-{queue}-{}.txt",
        now.as_millis()
    ));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&file, text))
        .unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
}

/// Per id: when its transaction began, when its commit returned.
type Times = Arc<Mutex<HashMap<i64, (Instant, Instant)>>>;

/// The producer's side: `n` messages at `rate`, one per transaction.
async fn produce(
    db: String,
    bare: Option<String>,
    queue: String,
    (rate, n): (u64, usize),
    shape: Shape,
    times: Times,
) {
    let pooled = if shape.fresh_connection {
        None
    } else {
        Some(ProducerPool::connect(&db, 4).await)
    };
    let confirms = match bare {
        Some(url) => Some(BarePublisher::connect(&url).await),
        None => None,
    };
    let producer = Producer::default();
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let mut next = tokio::time::Instant::now();
    for i in 0..n {
        let key = format!("key-{}", i % shape.keys);
        let m = Message::new(key.clone(), "", queue.as_str(), vec![b'x'; PAYLOAD]);
        let (id, began, committed) = match &pooled {
            Some(pool) => {
                let began = Instant::now();
                let id = pool.enqueue(&producer, vec![m]).await[0];
                (id, began, Instant::now())
            }
            None => {
                let pool = ProducerPool::connect(&db, 1).await;
                let began = Instant::now();
                let id = pool.enqueue(&producer, vec![m]).await[0];
                let committed = Instant::now();
                pool.close().await;
                (id, began, committed)
            }
        };
        times.lock().unwrap().insert(id, (began, committed));
        if let Some(publisher) = &confirms {
            publisher.publish(id, key, &queue).await;
        }
        next += period;
        tokio::time::sleep_until(next).await;
    }
    if let Some(publisher) = confirms {
        publisher.conn.close(200, "bye".into()).await.ok();
    }
}

/// The dual write's publisher: one confirm channel, each message awaited.
struct BarePublisher {
    conn: Connection,
    channel: lapin::Channel,
    partitioner: outboxd::partitioner::Partitioner,
}

impl BarePublisher {
    async fn connect(url: &str) -> Self {
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Self {
            conn,
            channel,
            partitioner: outboxd::partitioner::Partitioner::new(BUCKETS),
        }
    }

    /// The message the relay would send for the row (the relay's own
    /// properties and headers), published and confirmed.
    async fn publish(&self, id: i64, message_key: String, queue: &str) {
        let row = ClaimedMessage {
            id,
            message_id: uuid::Uuid::new_v4(),
            partition_key: self.partitioner.label_for(&message_key),
            message_key,
            exchange: String::new(),
            routing_key: queue.to_string(),
            headers: serde_json::json!({}),
            content_type: None,
            payload: vec![b'x'; PAYLOAD],
            attempts: 0,
            created_at: chrono::Utc::now(),
        };
        let props = message_properties(&row, None).unwrap();
        self.channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &row.payload,
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// The bench's own `LISTEN` on the outbox's channel, noting arrivals.
struct Notifications {
    task: tokio::task::JoinHandle<()>,
    arrived: Arc<Mutex<Vec<Instant>>>,
}

impl Notifications {
    async fn listen(url: &str) -> Self {
        let mut listener = PgListener::connect(url).await.unwrap();
        listener.listen("outbox_enqueued").await.unwrap();
        let arrived: Arc<Mutex<Vec<Instant>>> = Default::default();
        let noted = arrived.clone();
        let task = tokio::spawn(async move {
            while listener.recv().await.is_ok() {
                noted.lock().unwrap().push(Instant::now());
            }
        });
        Self { task, arrived }
    }

    async fn stop(self) -> Vec<Instant> {
        // Notifications of the last commits arrive within milliseconds.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.task.abort();
        self.arrived.lock().unwrap().clone()
    }
}

/// Commit returned → notification, the k-th of each paired; nothing when
/// the counts disagree.
fn paired(arrived: &[Instant], commits: &[(Instant, Instant)]) -> Vec<Duration> {
    if arrived.len() != commits.len() {
        println!(
            "    ({} notifications for {} commits: not paired)",
            arrived.len(),
            commits.len()
        );
        return Vec::new();
    }
    arrived
        .iter()
        .zip(commits)
        .map(|(n, (_, c))| n.saturating_duration_since(*c))
        .collect()
}

/// A producer's pool on either backend (by the URL's scheme).
enum ProducerPool {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

impl ProducerPool {
    async fn connect(url: &str, connections: u32) -> Self {
        if url.starts_with("sqlite://") {
            use std::str::FromStr;
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
                .unwrap()
                .busy_timeout(Duration::from_secs(30));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(connections)
                .connect_with(options)
                .await
                .unwrap();
            ProducerPool::Lite(pool)
        } else if url.starts_with("mysql://") {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(connections)
                .connect(url)
                .await
                .unwrap();
            ProducerPool::My(pool)
        } else {
            let pool = PgPoolOptions::new()
                .max_connections(connections)
                .connect(url)
                .await
                .unwrap();
            ProducerPool::Pg(pool)
        }
    }

    async fn close(&self) {
        match self {
            ProducerPool::Pg(p) => p.close().await,
            ProducerPool::My(p) => p.close().await,
            ProducerPool::Lite(p) => p.close().await,
        }
    }

    /// Enqueues `messages` in one transaction; returns their ids.
    async fn enqueue(&self, producer: &Producer, messages: Vec<Message>) -> Vec<i64> {
        let mut ids = Vec::with_capacity(messages.len());
        match self {
            ProducerPool::Pg(p) => {
                let mut tx = p.begin().await.unwrap();
                for m in messages {
                    ids.push(producer.enqueue(&mut *tx, m).await.unwrap());
                }
                tx.commit().await.unwrap();
            }
            ProducerPool::My(p) => {
                let mut tx = p.begin().await.unwrap();
                for m in messages {
                    ids.push(producer.enqueue(&mut *tx, m).await.unwrap());
                }
                tx.commit().await.unwrap();
            }
            ProducerPool::Lite(p) => {
                let mut tx = p.begin().await.unwrap();
                for m in messages {
                    ids.push(producer.enqueue(&mut *tx, m).await.unwrap());
                }
                tx.commit().await.unwrap();
            }
        }
        ids
    }
}
