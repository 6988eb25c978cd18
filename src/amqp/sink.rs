//! The AMQP 0-9-1 path as the relay's [`Sink`]: a session is one confirm
//! channel ([`ConfirmChannel`]) on the [`Broker`]'s connection; closing a
//! session after a timeout gives up on that node (`Broker::abandon_node`)
//! when the broker is a cluster. What it delivers is counted per exchange
//! or queue.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Broker, ConfirmChannel};
use crate::sink::{BatchOutcome, Destinations, PublishError, PublishLimits, Reach, Session, Sink};
use crate::store::outbox::ClaimedMessage;

/// RabbitMQ's exchanges and queues, through publisher confirms.
pub struct AmqpSink {
    broker: Arc<Broker>,
    delivered: Arc<Destinations>,
}

impl AmqpSink {
    /// Publishes through `broker`; confirmed rows are counted in
    /// `delivered`.
    pub fn new(broker: Arc<Broker>, delivered: Arc<Destinations>) -> Self {
        Self { broker, delivered }
    }
}

#[async_trait]
impl Sink for AmqpSink {
    async fn open(&self, cancel: &CancellationToken) -> Option<Box<dyn Session>> {
        let channel = self.broker.open_channel(cancel).await?;
        Some(Box::new(AmqpSession {
            channel,
            broker: self.broker.clone(),
            delivered: self.delivered.clone(),
        }))
    }

    fn blocked(&self) -> watch::Receiver<Option<String>> {
        self.broker.blocked()
    }

    fn reach(&self) -> watch::Receiver<Reach> {
        self.broker.watch_reach()
    }

    async fn keep_connected(&self, cancel: CancellationToken) {
        self.broker.clone().keep_connected(cancel).await
    }
}

/// One drainer's confirm channel.
struct AmqpSession {
    channel: ConfirmChannel,
    broker: Arc<Broker>,
    delivered: Arc<Destinations>,
}

#[async_trait]
impl Session for AmqpSession {
    fn is_usable(&self) -> bool {
        self.channel.is_usable()
    }

    async fn send(&mut self, rows: &[ClaimedMessage], limits: PublishLimits) -> BatchOutcome {
        let outcome = self.channel.publish_batch(rows, limits).await;
        self.delivered.count_amqp(&rows[..outcome.confirmed]);
        outcome
    }

    async fn close(self: Box<Self>, after: Option<&PublishError>) {
        let generation = self.channel.generation();
        self.channel.close().await;
        if matches!(after, Some(PublishError::Timeout(_))) {
            self.broker.abandon_node(generation).await;
        }
    }
}
