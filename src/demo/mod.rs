//! The demo's producer and consumer (`outboxd produce`, `outboxd consume`),
//! also used by the integration tests.
//!
//! The producer writes order events for many keys from several concurrent
//! tasks; each key belongs to one task, which commits that key's messages one
//! after another, so per-key order is well defined. The consumer reads a
//! queue ([`queue`]) or a stream of `amqp.streams` from its first offset
//! ([`stream`]) and feeds every message to the [`Checker`](crate::checker::Checker).

mod queue;
mod stream;

pub use queue::{Delivered, QueueReader};
pub use stream::StreamReader;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Redacted};
use crate::producer::Message;
use crate::store::Store;

#[derive(Debug, Clone, Args)]
pub struct ProduceArgs {
    /// Queue to route messages to (declared durable; default exchange), or
    /// a stream of `amqp.streams` (not declared: `outboxd streams declare`)
    #[arg(long, default_value = "outboxd-demo")]
    pub queue: String,
    /// Distinct message keys (orders)
    #[arg(long, default_value_t = 200)]
    pub keys: u32,
    /// Messages to enqueue in all; 0 = until stopped
    #[arg(long, default_value_t = 0)]
    pub messages: u64,
    /// Messages per second in all; 0 = as fast as possible
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Concurrent producer tasks (each owns a share of the keys)
    #[arg(long, default_value_t = 4)]
    pub tasks: u32,
}

#[derive(Debug, Clone, Args)]
pub struct ConsumeArgs {
    /// Queue to consume (declared durable), or a stream of amqp.streams
    /// (read from its first offset)
    #[arg(long, default_value = "outboxd-demo")]
    pub queue: String,
    /// Stop after this many distinct messages (a stream: read on for a
    /// second more, so that a repeat stored after them would show); 0 =
    /// until stopped
    #[arg(long, default_value_t = 0)]
    pub expect: u64,
}

/// Enqueues demo orders until `messages` are written or `cancel` fires.
pub async fn produce(
    config: &Config,
    args: &ProduceArgs,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    if !config.amqp.streams.contains(&args.queue) {
        declare_queue(&config.amqp.url, &args.queue).await?;
    }
    let store = Store::connect(
        &crate::store::StoreSettings::from_config(config),
        "outboxd produce",
    )
    .await?;
    let written = Arc::new(AtomicU64::new(0));
    let tasks = args.tasks.clamp(1, args.keys.max(1));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (store, written, cancel, args) =
            (store.clone(), written.clone(), cancel.clone(), args.clone());
        handles.push(tokio::spawn(async move {
            let keys: Vec<u32> = (0..args.keys).filter(|k| k % tasks == t).collect();
            let per_task_rate = args.rate as f64 / tasks as f64;
            let period =
                (per_task_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / per_task_rate));
            let mut next = tokio::time::Instant::now();
            let mut seq = 0u64;
            while !cancel.is_cancelled() {
                let n = written.fetch_add(1, Ordering::Relaxed);
                if args.messages > 0 && n >= args.messages {
                    break;
                }
                let key = format!("order-{}", keys[(seq as usize) % keys.len()]);
                let payload =
                    serde_json::json!({"order": key, "seq": seq, "event": "order.updated"});
                let msg = Message::new(key, "", args.queue.clone(), payload.to_string())
                    .content_type("application/json")
                    .header("source", "outboxd-demo");
                store.enqueue(&msg).await?;
                seq += 1;
                if let Some(p) = period {
                    next += p;
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep_until(next) => {}
                    }
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    let started = Instant::now();
    let mut report = tokio::time::interval(Duration::from_secs(5));
    report.tick().await;
    let mut all = futures_util::future::join_all(handles);
    loop {
        tokio::select! {
            results = &mut all => {
                for r in results {
                    r??;
                }
                break;
            }
            _ = report.tick() => {
                let n = written.load(Ordering::Relaxed);
                crate::say!("total produced {n} ({:.0}/s on average)", n as f64 / started.elapsed().as_secs_f64());
            }
        }
    }
    let n = written.load(Ordering::Relaxed);
    let n = if args.messages > 0 {
        n.min(args.messages)
    } else {
        n
    };
    crate::say!(
        "total produced {n} in {:.1}s (stopped)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Consumes a queue, or reads a stream of `amqp.streams`, printing the
/// checker's view every few seconds.
pub async fn consume(
    config: &Config,
    args: &ConsumeArgs,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    if config.amqp.streams.contains(&args.queue) {
        return read_stream(config, args, cancel).await;
    }
    let mut reader = match QueueReader::open(&config.amqp.url, &args.queue).await {
        Ok(reader) => reader,
        Err(e) => return Err(unlisted_stream(config, &args.queue, e).await),
    };
    let mut report = tokio::time::interval(Duration::from_secs(5));
    report.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = report.tick() => {
                reader.ack_taken().await;
                crate::say!("{}", reader.summary());
            }
            more = reader.next() => if !more? { break },
        }
        if args.expect > 0 && reader.checker.unique() as u64 >= args.expect {
            break;
        }
    }
    reader.ack_taken().await;
    crate::say!("{}", reader.summary());
    Ok(())
}

/// `e`, the refusal of `queue`'s declaration, with a hint when `queue` is
/// a stream not listed in `amqp.streams`: RabbitMQ refuses a queue's
/// declaration of an existing queue whose arguments differ, naming one of
/// them, and the stream port tells whether it is a stream.
async fn unlisted_stream(config: &Config, queue: &str, e: anyhow::Error) -> anyhow::Error {
    if !e.to_string().contains("inequivalent arg") || config.amqp.stream_url.trim().is_empty() {
        return e;
    }
    match StreamReader::open(&config.amqp, queue).await {
        Ok(reader) => {
            reader.close().await;
            anyhow::anyhow!(
                "{queue:?} is a stream: list it in amqp.streams (OUTBOXD_AMQP__STREAMS) to read it from its first offset ({e})"
            )
        }
        Err(_) => e,
    }
}

/// How long a stream's reader reads on after the messages it expected:
/// a repeat stored after them would show.
const READ_ON: Duration = Duration::from_secs(1);

/// Reads a stream from its first offset, printing the checker's view
/// every few seconds.
async fn read_stream(
    config: &Config,
    args: &ConsumeArgs,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let mut reader = StreamReader::open(&config.amqp, &args.queue).await?;
    let mut report = tokio::time::interval(Duration::from_secs(5));
    report.tick().await;
    let mut stop_at = None;
    loop {
        let enough = async {
            match stop_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = enough => break,
            _ = report.tick() => crate::say!("{}", reader.summary()),
            read = reader.next() => read?,
        }
        if stop_at.is_none() && args.expect > 0 && reader.checker.unique() as u64 >= args.expect {
            stop_at = Some(tokio::time::Instant::now() + READ_ON);
        }
    }
    crate::say!("{}", reader.summary());
    reader.close().await;
    Ok(())
}

async fn declare_queue(url: &str, queue: &str) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", Redacted(url)))?;
    let ch = conn.create_channel().await?;
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await?;
    conn.close(200, "bye".into()).await?;
    Ok(())
}
