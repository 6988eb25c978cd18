//! Publishing a batch: [`ConfirmChannel::publish_batch`] sends rows in
//! order on one confirm channel, pipelining runs of rows to the same
//! destination, and awaits the writes and the confirms in order under one
//! deadline. It reports the confirmed prefix and why a batch stopped early
//! ([`PublishError`]: the row's own fault, a timeout, a lost broker). A
//! batch under a lease holds the connection's [`gate`] until its frames are
//! known to be written.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};

use super::gate;
use super::message::message_properties;
use crate::sink::{BatchOutcome, PublishError, PublishLimits};
use crate::store::outbox::ClaimedMessage;

/// A channel in confirm mode, used by one bucket at a time.
pub struct ConfirmChannel {
    channel: Channel,
    /// The broker connection it is on ([`super::Broker::abandon_node`]).
    generation: u64,
    confirm_timeout: Duration,
    gate: Arc<gate::SendGate>,
    /// Held from the start of a batch under a lease until its frames are
    /// known to be written: all confirmed, or the channel closed cleanly.
    hold: Option<gate::GateHold>,
}

impl ConfirmChannel {
    pub(super) fn new(
        channel: Channel,
        generation: u64,
        confirm_timeout: Duration,
        gate: Arc<gate::SendGate>,
    ) -> Self {
        Self {
            channel,
            generation,
            confirm_timeout,
            gate,
            hold: None,
        }
    }

    /// The generation of the connection it is on.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the channel can still be used.
    pub fn is_usable(&self) -> bool {
        self.channel.status().connected()
    }

    /// Publishes `rows` in order and awaits their confirms in order.
    ///
    /// Consecutive rows to the same destination (exchange, routing key) are
    /// pipelined; before a row to another destination is sent, every row in
    /// flight must be confirmed. A row the broker returns as unroutable can
    /// therefore only have rows to the *same* destination in flight behind
    /// it, which the broker routes the same way: nothing of the bucket
    /// reaches a queue ahead of a failed head, unless the destination's
    /// routing changes during the few milliseconds that run is in flight.
    ///
    /// Sending stops at the first row that cannot be sent (too large,
    /// invalid headers). Rows already sent when an earlier confirm fails are
    /// not counted as confirmed: they are replayed after the failed row (a
    /// duplicate, never a gap).
    pub async fn publish_batch(
        &mut self,
        rows: &[ClaimedMessage],
        limits: PublishLimits,
    ) -> BatchOutcome {
        // A trust that lapsed before the batch (a slow claim) sends nothing,
        // and holding it would close the gate — drop the connection — for
        // every other bucket on it.
        if limits.trust.as_ref().is_some_and(|t| !t.is_valid()) {
            return BatchOutcome {
                confirmed: 0,
                failure: Some(PublishError::LeaseLapsed),
            };
        }
        // Until every frame of this batch is known to be written, no byte
        // goes to the socket once the lease's trust has lapsed. The hold is
        // kept after a failure: only a clean close proves the frames left.
        if let Some(trust) = limits.trust.clone()
            && let Some(earlier) = self.hold.replace(self.gate.hold(trust))
        {
            earlier.linger();
        }
        let outcome = self.publish_rows(rows, &limits).await;
        if outcome.failure.is_none() {
            self.hold = None;
        }
        outcome
    }

    async fn publish_rows(&self, rows: &[ClaimedMessage], limits: &PublishLimits) -> BatchOutcome {
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        // Each row's publish future (lapin's, over 1 KiB: beyond the
        // allocator's per-thread cache) lives in one allocation for the
        // batch rather than a box of its own.
        let mut slots: Pin<Box<[Option<_>]>> = rows.iter().map(|_| None).collect::<Box<_>>().into();
        let mut free_slots = pinned_elements(slots.as_mut());
        let mut in_flight = Vec::new();
        let mut confirmed = 0;
        let mut destination: Option<(&str, &str)> = None;
        for row in rows {
            let here = (row.exchange.as_str(), row.routing_key.as_str());
            if destination.is_some_and(|d| d != here)
                && let Err(e) = self
                    .await_confirms(&mut in_flight, &mut confirmed, deadline)
                    .await
            {
                return BatchOutcome {
                    confirmed,
                    failure: Some(e),
                };
            }
            destination = Some(here);
            let lapsed = limits
                .stop_sending_at
                .is_some_and(|stop| tokio::time::Instant::now() >= stop);
            let sent = if lapsed {
                Err(PublishError::LeaseLapsed)
            } else {
                match prepare(row, limits) {
                    Ok(prepared) => {
                        let slot = free_slots.next().expect("a slot for every row");
                        start_send(slot, self.send(prepared, &row.payload)).await
                    }
                    Err(e) => Err(e),
                }
            };
            match sent {
                Ok(confirm) => in_flight.push(confirm),
                Err(e) => {
                    // Rows before this one may still be confirmed.
                    let failure = match self
                        .await_confirms(&mut in_flight, &mut confirmed, deadline)
                        .await
                    {
                        Ok(()) => e,
                        Err(earlier) => earlier,
                    };
                    return BatchOutcome {
                        confirmed,
                        failure: Some(failure),
                    };
                }
            }
        }
        let failure = self
            .await_confirms(&mut in_flight, &mut confirmed, deadline)
            .await
            .err();
        BatchOutcome { confirmed, failure }
    }

    /// Publishes one row, `mandatory`, its frames queued when the returned
    /// future is first polled (see [`start_send`]).
    fn send<'a>(
        &'a self,
        prepared: Prepared,
        payload: &'a [u8],
    ) -> impl Future<Output = Result<PublisherConfirm, lapin::Error>> + Send + 'a {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        self.channel.basic_publish(
            prepared.exchange,
            prepared.routing_key,
            options,
            payload,
            prepared.properties,
        )
    }

    /// Awaits one of lapin's futures (a queued publish's write, a confirm)
    /// by the batch's deadline, classifying its error.
    async fn by_deadline<T>(
        &self,
        deadline: tokio::time::Instant,
        step: impl Future<Output = Result<T, lapin::Error>>,
    ) -> Result<T, PublishError> {
        match tokio::time::timeout_at(deadline, step).await {
            Err(_) => Err(PublishError::Timeout(self.confirm_timeout)),
            Ok(Err(e)) => Err(classify(&e)),
            Ok(Ok(done)) => Ok(done),
        }
    }

    /// Awaits the writes and then the confirms of `in_flight` in order,
    /// counting each success into `confirmed`; stops at the first failure.
    async fn await_confirms(
        &self,
        in_flight: &mut Vec<
            InFlight<'_, impl Future<Output = Result<PublisherConfirm, lapin::Error>>>,
        >,
        confirmed: &mut usize,
        deadline: tokio::time::Instant,
    ) -> Result<(), PublishError> {
        for sent in in_flight.drain(..) {
            let confirm = match sent {
                InFlight::Sent(confirm) => confirm,
                InFlight::Sending(publish) => self.by_deadline(deadline, publish).await?,
            };
            accepted(self.by_deadline(deadline, confirm).await?)?;
            *confirmed += 1;
        }
        Ok(())
    }

    /// Closes the channel; errors are irrelevant, it is being discarded.
    pub async fn close(mut self) {
        let closed = tokio::time::timeout(
            Duration::from_secs(1),
            self.channel.close(200, "done".into()),
        )
        .await;
        // A clean close-ok means everything sent before it was written.
        if let Some(hold) = self.hold.take()
            && !matches!(closed, Ok(Ok(())))
        {
            hold.linger();
        }
    }
}

impl Drop for ConfirmChannel {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            hold.linger();
        }
    }
}

/// A channel-level (soft) protocol error is caused by what was published —
/// a missing exchange, a refused or oversized message — so it is the row's
/// fault; anything else means the broker or the network is gone.
pub(super) fn classify(e: &lapin::Error) -> PublishError {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind()
        && let AMQPErrorKind::Soft(soft) = amqp.kind()
        && matches!(
            soft,
            AMQPSoftError::NOTFOUND
                | AMQPSoftError::ACCESSREFUSED
                | AMQPSoftError::PRECONDITIONFAILED
                | AMQPSoftError::CONTENTTOOLARGE
                | AMQPSoftError::NOROUTE
        )
    {
        // The broker's reply text names the problem and the object, e.g.
        // "NOT_FOUND - no exchange 'orders' in vhost '/'".
        return PublishError::Rejected(format!("refused by the broker: {}", amqp.get_message()));
    }
    PublishError::Unavailable(e.to_string())
}

/// Whether a confirm accepted its message: an ack without a returned
/// message; anything else is a failure.
fn accepted(confirmation: Confirmation) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(PublishError::Rejected(format!(
            "unroutable: returned by the broker ({} {})",
            returned.reply_code, returned.reply_text
        ))),
        Confirmation::Nack(_) => Err(PublishError::Rejected(
            "rejected by the broker (basic.nack)".into(),
        )),
        Confirmation::NotRequested => Err(PublishError::Unavailable(
            "channel is not in confirm mode".into(),
        )),
    }
}

/// Queues one row's frames on the channel: lapin queues them (and takes
/// the row's delivery tag) when its publish future is first polled, which
/// happens here, before the next row's, so rows go out in the order they
/// are started. Waiting for the socket write is left to
/// [`ConfirmChannel::await_confirms`], so a batch costs the I/O thread one
/// wake-up, not one round trip per row.
async fn start_send<F>(
    mut slot: Pin<&mut Option<F>>,
    publish: F,
) -> Result<InFlight<'_, F>, PublishError>
where
    F: Future<Output = Result<PublisherConfirm, lapin::Error>>,
{
    slot.set(Some(publish));
    let mut publish = slot.as_pin_mut().expect("just set");
    match futures_util::poll!(publish.as_mut()) {
        Poll::Ready(Ok(confirm)) => Ok(InFlight::Sent(confirm)),
        Poll::Ready(Err(e)) => Err(classify(&e)),
        Poll::Pending => Ok(InFlight::Sending(publish)),
    }
}

/// The elements of a pinned slice, each pinned in place.
fn pinned_elements<T>(slice: Pin<&mut [T]>) -> impl Iterator<Item = Pin<&mut T>> {
    // SAFETY: the elements of a pinned slice never move (a slice cannot
    // grow or shrink), and each is handed out once, only ever pinned.
    unsafe { slice.get_unchecked_mut() }
        .iter_mut()
        .map(|element| unsafe { Pin::new_unchecked(element) })
}

/// A row sent on a channel: its frames queued (the publish, until lapin
/// has written them) or written, its confirm due.
enum InFlight<'s, F> {
    Sending(Pin<&'s mut F>),
    Sent(PublisherConfirm),
}

struct Prepared {
    exchange: ShortString,
    routing_key: ShortString,
    properties: BasicProperties,
}

/// Everything about a row that can be checked before it is sent.
fn prepare(row: &ClaimedMessage, limits: &PublishLimits) -> Result<Prepared, PublishError> {
    let max_payload_bytes = limits.max_payload_bytes;
    if row.payload.len() as u64 > max_payload_bytes {
        return Err(PublishError::Rejected(format!(
            "payload is {} bytes, more than outbox.max_payload_bytes ({max_payload_bytes})",
            row.payload.len()
        )));
    }
    let exchange = ShortString::try_new(row.exchange.as_str())
        .map_err(|e| PublishError::Rejected(format!("invalid exchange name: {e}")))?;
    let routing_key = ShortString::try_new(row.routing_key.as_str())
        .map_err(|e| PublishError::Rejected(format!("invalid routing key: {e}")))?;
    let properties = message_properties(row, limits.lease_epoch)?;
    Ok(Prepared {
        exchange,
        routing_key,
        properties,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::{HEADER_ID, HEADER_LEASE_EPOCH, HEADER_PARTITION_KEY};
    use lapin::types::AMQPValue;
    use serde_json::{Value as Json, json};

    fn row(headers: Json, payload_len: usize, routing_key: &str) -> ClaimedMessage {
        ClaimedMessage {
            id: 7,
            message_id: uuid::Uuid::nil(),
            partition_key: "p03".into(),
            message_key: "order-1".into(),
            exchange: String::new(),
            routing_key: routing_key.into(),
            headers,
            content_type: Some("application/json".into()),
            payload: vec![b'x'; payload_len],
            attempts: 0,
            created_at: chrono::Utc::now(),
        }
    }

    fn limits(max_payload_bytes: u64) -> PublishLimits {
        PublishLimits {
            max_payload_bytes,
            stop_sending_at: None,
            lease_epoch: Some(4),
            trust: None,
            lease_was_free: false,
        }
    }

    #[test]
    fn headers_carry_id_partition_and_key_and_user_values() {
        let p = prepare(
            &row(
                json!({"tenant": "acme", "n": 3, "nested": {"a": [1, true]}}),
                10,
                "q",
            ),
            &limits(100),
        )
        .unwrap();
        let h = p.properties.headers().as_ref().unwrap();
        assert_eq!(h.inner().get(HEADER_ID), Some(&AMQPValue::LongLongInt(7)));
        assert_eq!(
            h.inner().get(HEADER_PARTITION_KEY),
            Some(&AMQPValue::LongString("p03".into()))
        );
        assert_eq!(h.inner().get("n"), Some(&AMQPValue::LongLongInt(3)));
        assert_eq!(
            h.inner().get(HEADER_LEASE_EPOCH),
            Some(&AMQPValue::LongLongInt(4))
        );
        assert!(matches!(
            h.inner().get("nested"),
            Some(AMQPValue::FieldTable(_))
        ));
        assert_eq!(p.properties.delivery_mode(), &Some(2));
    }

    #[test]
    fn bad_rows_are_rejected_before_sending() {
        let too_big = prepare(&row(json!({}), 101, "q"), &limits(100))
            .err()
            .unwrap();
        assert!(too_big.is_rows_fault() && too_big.to_string().contains("101 bytes"));
        let long_rk = prepare(&row(json!({}), 1, &"r".repeat(256)), &limits(100))
            .err()
            .unwrap();
        assert!(long_rk.to_string().contains("routing key"));
        let long_header = prepare(&row(json!({ "h".repeat(300): 1 }), 1, "q"), &limits(100))
            .err()
            .unwrap();
        assert!(long_header.to_string().contains("invalid headers"));
        let not_object = prepare(&row(json!([1, 2]), 1, "q"), &limits(100))
            .err()
            .unwrap();
        assert!(not_object.to_string().contains("expected a JSON object"));
        let mut deep = json!(1);
        for _ in 0..20 {
            deep = json!({ "d": deep });
        }
        assert!(prepare(&row(deep, 1, "q"), &limits(100)).is_err());
    }
}
