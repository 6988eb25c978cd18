//! The demo consumer's stream reader: every message of a stream from its
//! first offset, judged by the [`Checker`] by the `outbox-id` and
//! `outbox-message-key` application properties the relay's stream sink
//! sets. Reading leaves the stream as it is: a stream keeps its messages
//! for every reader (until its retention removes them).

use std::sync::Arc;

use anyhow::Context;
use rabbitmq_stream_protocol::ResponseCode;

use crate::amqp::{HEADER_ID, HEADER_MESSAGE_KEY};
use crate::checker::Checker;
use crate::config::AmqpConfig;
use crate::stream::{
    Message, OffsetSpecification, SimpleValue, StreamClient, StreamError, StreamLink, Subscription,
};

/// Chunks the broker may send ahead of the one being read.
const CREDIT: u16 = 10;

/// Reads one stream and checks what it holds.
pub struct StreamReader {
    /// The connection's link (`amqp.stream_url`, TLS as configured).
    link: StreamLink,
    client: Arc<StreamClient>,
    subscription: Subscription,
    /// Chunks read whose credit is not given back yet.
    owed: u16,
    pub checker: Checker,
}

impl StreamReader {
    /// Subscribes to `stream` from its first offset.
    pub async fn open(amqp: &AmqpConfig, stream: &str) -> anyhow::Result<Self> {
        if amqp.stream_url.trim().is_empty() {
            anyhow::bail!("amqp.stream_url is empty: set it to the broker's stream port");
        }
        let link = StreamLink::new(amqp)?;
        let client = link
            .client()
            .await
            .context("connecting to the stream port")?;
        let subscription = client
            .subscribe(stream, OffsetSpecification::First, CREDIT)
            .await
            .map_err(|e| match e {
                StreamError::Refused {
                    code: ResponseCode::StreamDoesNotExist,
                    ..
                } => anyhow::anyhow!(
                    "stream {stream:?} does not exist: create it (outboxd streams declare {stream})"
                ),
                e => anyhow::anyhow!("reading stream {stream:?}: {e}"),
            })?;
        Ok(Self {
            link,
            client,
            subscription,
            owed: 0,
            checker: Checker::default(),
        })
    }

    /// Reads the next chunk the broker sends (waiting for one while the
    /// stream holds nothing newer). Cancel-safe: a chunk is checked as
    /// soon as it is taken, and the credit it used is given back on the
    /// next call, however the last one ended.
    pub async fn next(&mut self) -> anyhow::Result<()> {
        if self.owed > 0 {
            self.client.credit(self.subscription.id, self.owed).await?;
            self.owed = 0;
        }
        let chunk = self
            .subscription
            .chunks
            .recv()
            .await
            .context("the stream connection closed")?;
        self.owed += 1;
        for message in &chunk.messages {
            let (key, id) = row_of(message)?;
            self.checker.observe(key, id);
        }
        Ok(())
    }

    /// Ends the subscription and the connection.
    pub async fn close(self) {
        let _ = self.client.unsubscribe(self.subscription.id).await;
        drop(self.link);
        if let Ok(client) = Arc::try_unwrap(self.client) {
            client.close().await;
        }
    }

    pub fn summary(&self) -> String {
        let c = &self.checker;
        format!(
            "total read {} from the stream {}",
            c.deliveries(),
            c.tally()
        )
    }
}

/// The message key and row id of a message the relay stored.
fn row_of(message: &Message) -> anyhow::Result<(&str, i64)> {
    let properties = message
        .application_properties()
        .context("a message without application properties: not one of outboxd's")?;
    let id = match properties.get(HEADER_ID) {
        Some(SimpleValue::Ulong(id)) => *id as i64,
        other => anyhow::bail!("a message without an {HEADER_ID} property: {other:?}"),
    };
    match properties.get(HEADER_MESSAGE_KEY) {
        Some(SimpleValue::String(key)) => Ok((key.as_str(), id)),
        other => anyhow::bail!("a message without an {HEADER_MESSAGE_KEY} property: {other:?}"),
    }
}
