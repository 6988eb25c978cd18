//! The demo consumer's queue reader, also the tests' way to read what a
//! worker published to a queue: it consumes, acknowledges in batches from
//! a task of its own ([`Acks`]), and feeds every delivery to the
//! [`Checker`]. It declares the queue durable when it is missing and
//! consumes a queue of another type (a quorum queue) as it is; a stream is
//! not read as a queue (`outboxd consume` reads the streams of
//! `amqp.streams`, and names one left out of them).

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

use crate::amqp::{HEADER_ID, HEADER_LEASE_EPOCH, HEADER_MESSAGE_KEY, HEADER_PARTITION_KEY};
use crate::checker::Checker;
use crate::config::Redacted;

/// Reads a queue and checks what arrives.
pub struct QueueReader {
    conn: Connection,
    channel: lapin::Channel,
    consumer: lapin::Consumer,
    queue: String,
    args: FieldTable,
    pub checker: Checker,
    /// Every delivery in arrival order, when enabled with [`QueueReader::keep_log`].
    pub log: Option<Vec<Delivered>>,
    /// The newest delivery taken but not yet acknowledged, and how many
    /// such there are: acknowledged together (`multiple`) every
    /// [`ACK_EVERY`] deliveries and when a read ends.
    unacked: Option<lapin::Acker>,
    unacked_count: usize,
    /// The acknowledgements' own task (see [`Acks`]).
    acks: Acks,
}

/// At most this many deliveries are taken before they are acknowledged.
const ACK_EVERY: usize = 100;

/// Sends a reader's acknowledgements one after another from a task of its
/// own. One awaited `basic.ack` per message cost a round trip through
/// lapin's I/O task each (10 s of reading 16,700 messages back in the fault
/// suite). Acknowledging many at once (`multiple`) needs them in order:
/// lapin sends each acknowledgement from a future of its own, so one whose
/// caller stopped waiting (a read's timeout) could be overtaken by the next,
/// and RabbitMQ closes the channel on the late, already covered delivery
/// tag — the consumer then ends and the reader reads nothing more. Here
/// each waits for the one before it, whoever stopped waiting.
struct Acks {
    tx: tokio::sync::mpsc::UnboundedSender<AckAsked>,
}

/// An acknowledgement to send, and whom to tell once it is sent.
type AckAsked = (lapin::Acker, Option<tokio::sync::oneshot::Sender<()>>);

impl Acks {
    fn start() -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<AckAsked>();
        tokio::spawn(async move {
            while let Some((acker, sent)) = rx.recv().await {
                // A closed channel makes it fail; its deliveries come again
                // to whoever consumes next, as after any lost connection.
                let _ = acker.ack(BasicAckOptions { multiple: true }).await;
                if let Some(sent) = sent {
                    let _ = sent.send(());
                }
            }
        });
        Self { tx }
    }

    /// Acknowledges `acker`'s delivery and every one before it on its
    /// channel, after what was asked before.
    fn send(&self, acker: lapin::Acker) {
        let _ = self.tx.send((acker, None));
    }

    /// As [`Acks::send`], and waits until it is sent.
    async fn send_and_wait(&self, acker: lapin::Acker) {
        let (sent, done) = tokio::sync::oneshot::channel();
        if self.tx.send((acker, Some(sent))).is_ok() {
            let _ = done.await;
        }
    }
}

/// The type of an existing queue that a declaration of another type was
/// refused for, from the broker's reply: "PRECONDITION_FAILED -
/// inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received
/// none but current is the value 'stream' of type 'longstr'".
fn declared_type(e: &lapin::Error) -> Option<String> {
    let lapin::ErrorKind::ProtocolError(amqp) = e.kind() else {
        return None;
    };
    let message = amqp.get_message().to_string();
    if !message.contains("'x-queue-type'") {
        return None;
    }
    let (_, current) = message.split_once("current is the value '")?;
    current.split_once('\'').map(|(kind, _)| kind.to_string())
}

/// One delivery as the log keeps it.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub id: i64,
    pub partition_key: String,
    /// The lease epoch it was published under (fleet mode).
    pub lease_epoch: Option<i64>,
    /// Its `traceparent` and `tracestate` headers, when it has them.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl QueueReader {
    /// Declares `queue` (durable) and starts consuming it.
    pub async fn open(url: &str, queue: &str) -> anyhow::Result<Self> {
        Self::open_with(url, queue, FieldTable::default()).await
    }

    /// Declares `queue` as a quorum queue (replicated over a cluster's
    /// nodes) and starts consuming it.
    pub async fn open_quorum(url: &str, queue: &str) -> anyhow::Result<Self> {
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        Self::open_with(url, queue, args).await
    }

    async fn open_with(url: &str, queue: &str, args: FieldTable) -> anyhow::Result<Self> {
        let (conn, channel, consumer) = Self::consume(url, queue, &args).await?;
        Ok(Self {
            conn,
            channel,
            consumer,
            queue: queue.to_string(),
            args,
            checker: Checker::default(),
            log: None,
            unacked: None,
            unacked_count: 0,
            acks: Acks::start(),
        })
    }

    async fn consume(
        url: &str,
        queue: &str,
        args: &FieldTable,
    ) -> anyhow::Result<(Connection, lapin::Channel, lapin::Consumer)> {
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", Redacted(url)))?;
        let mut ch = conn.create_channel().await?;
        if let Err(e) = ch
            .queue_declare(queue.into(), QueueDeclareOptions::durable(), args.clone())
            .await
        {
            match declared_type(&e).as_deref() {
                // Another difference, or a stream, which is not read as a
                // queue (`outboxd consume` names a stream it was not told of).
                None | Some("stream") => return Err(e.into()),
                // Another type (a quorum queue): consumed as it is, on a
                // channel of its own (the refusal closed this one).
                Some(_) => {
                    ch = conn.create_channel().await?;
                    let passive = QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    };
                    ch.queue_declare(queue.into(), passive, FieldTable::default())
                        .await?;
                }
            }
        }
        ch.basic_qos(1000, BasicQosOptions::default()).await?;
        let consumer = ch
            .basic_consume(
                queue.into(),
                format!("outboxd-checker-{}", uuid::Uuid::new_v4()).into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok((conn, ch, consumer))
    }

    /// Consumes again through `url` (another node of a cluster), keeping
    /// what was checked so far. While the old connection is up, its
    /// consumer is cancelled and what it had already received is read
    /// first, so arrival order stays the queue's order. After a lost
    /// connection, what was delivered but not acknowledged comes again:
    /// duplicates, possibly out of order, on the consumer's side.
    pub async fn reconnect(&mut self, url: &str) -> anyhow::Result<()> {
        if self.conn.status().connected() {
            let tag = self.consumer.tag();
            let cancel = self
                .channel
                .basic_cancel(tag, BasicCancelOptions::default());
            if tokio::time::timeout(Duration::from_secs(2), cancel)
                .await
                .is_ok()
            {
                // Ends when the cancelled consumer's stream does.
                let _ = self.read_until(Duration::from_secs(5), |_| false).await;
            }
        }
        self.ack_taken().await;
        let (conn, channel, consumer) = Self::consume(url, &self.queue, &self.args).await?;
        // Closed, not just dropped: a dropped connection lives on.
        let old = std::mem::replace(&mut self.conn, conn);
        let _ = tokio::time::timeout(Duration::from_secs(2), old.close(200, "moving".into())).await;
        (self.channel, self.consumer) = (channel, consumer);
        Ok(())
    }

    /// Whether its connection is still open.
    pub fn is_connected(&self) -> bool {
        self.conn.status().connected()
    }

    /// Keeps every delivery in [`QueueReader::log`].
    pub fn keep_log(mut self) -> Self {
        self.log = Some(Vec::new());
        self
    }

    /// Takes one delivery; false when the consumer ended. What it takes is
    /// acknowledged in batches: [`QueueReader::read_until`] acknowledges
    /// everything taken when it returns, and a caller of `next` calls
    /// [`QueueReader::ack_taken`] before it stops or pauses.
    pub async fn next(&mut self) -> anyhow::Result<bool> {
        let Some(delivery) = self.consumer.next().await else {
            return Ok(false);
        };
        let delivery = delivery?;
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        let id = match headers.inner().get(HEADER_ID) {
            Some(AMQPValue::LongLongInt(i)) => *i,
            other => anyhow::bail!("delivery without an {HEADER_ID} header: {other:?}"),
        };
        let key = match headers.inner().get(HEADER_MESSAGE_KEY) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => anyhow::bail!("delivery without an {HEADER_MESSAGE_KEY} header: {other:?}"),
        };
        self.checker.observe(&key, id);
        if let Some(log) = self.log.as_mut() {
            let lease_epoch = match headers.inner().get(HEADER_LEASE_EPOCH) {
                Some(AMQPValue::LongLongInt(e)) => Some(*e),
                _ => None,
            };
            let text = |name: &str| match headers.inner().get(name) {
                Some(AMQPValue::LongString(s)) => {
                    Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                }
                _ => None,
            };
            log.push(Delivered {
                id,
                partition_key: text(HEADER_PARTITION_KEY).unwrap_or_default(),
                lease_epoch,
                traceparent: text("traceparent"),
                tracestate: text("tracestate"),
            });
        }
        self.unacked = Some(delivery.acker);
        self.unacked_count += 1;
        if self.unacked_count >= ACK_EVERY
            && let Some(acker) = self.unacked.take()
        {
            self.acks.send(acker);
            self.unacked_count = 0;
        }
        Ok(true)
    }

    /// Acknowledges every delivery taken so far and waits until that is
    /// sent, so a reader that stops leaves nothing it has seen for a later one.
    pub async fn ack_taken(&mut self) {
        self.unacked_count = 0;
        if let Some(acker) = self.unacked.take() {
            self.acks.send_and_wait(acker).await;
        }
    }

    /// Reads until `done(checker)` holds or `timeout` passes; true if it held.
    pub async fn read_until(
        &mut self,
        timeout: Duration,
        done: impl Fn(&Checker) -> bool,
    ) -> anyhow::Result<bool> {
        let deadline = tokio::time::Instant::now() + timeout;
        let held = loop {
            if done(&self.checker) {
                break Ok(true);
            }
            match tokio::time::timeout_at(deadline, self.next()).await {
                Err(_) | Ok(Ok(false)) => break Ok(false),
                Ok(Err(e)) => break Err(e),
                Ok(Ok(true)) => {}
            }
        };
        self.ack_taken().await;
        held
    }

    pub fn summary(&self) -> String {
        let c = &self.checker;
        format!("total consumed {} {}", c.deliveries(), c.tally())
    }
}
