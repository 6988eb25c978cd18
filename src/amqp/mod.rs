//! RabbitMQ: the connection, confirm channels, and publishing a batch with
//! publisher confirms — the relay's sink ([`crate::sink`]) as [`AmqpSink`].
//! In four parts: the connection ([`connection`]), a batch on a confirm
//! channel ([`publish`]), the message a row becomes ([`message`]), and the
//! sink over them ([`sink`]); every socket write passes the [`gate`].
//!
//! [`Broker`] owns one connection, opened lazily and reopened with
//! exponential backoff after it is lost (no automatic recovery inside lapin:
//! the relay must know when a channel died, to replay from its first
//! unconfirmed row). Given several node URLs (a cluster), it connects to
//! the first that answers, starting with the node that worked last, and
//! moves to another when its node is lost. It watches `connection.blocked`
//! so the relay stops claiming while the broker refuses publishes, and it
//! tracks whether the broker can be reached at all
//! ([`crate::sink::Reach`]): the fleet coordinator gives a worker's buckets
//! up when it could not for longer than `worker.broker_grace`. [`Broker::keep_connected`] keeps trying
//! while no bucket does, so recovery is noticed.
//!
//! [`ConfirmChannel::publish_batch`] publishes rows in order on one confirm
//! channel (persistent, `mandatory`, AMQP `message_id` = the row's
//! `message_id`), pipelining runs of rows to the same destination — their
//! frames are queued in order without waiting for each socket write — and
//! awaits the writes and the confirms in order under one deadline (lapin's
//! confirm future has no timeout of its own). It reports the length
//! of the confirmed prefix and, if the batch stopped early, why — classified
//! as the row's own fault, a timeout, or a lost broker
//! ([`crate::sink::PublishError`]). An ack that carries a returned message
//! means *unroutable*: a failure.
//!
//! An `amqps://` node is reached over TLS that outboxd wraps around the
//! socket itself ([`gate::BrokerStream`], [`crate::tls`]): the server's
//! certificate and name verified against `amqp.tls.ca_file` or the system's
//! roots, an optional client certificate (with the EXTERNAL mechanism when
//! the URL has no password), the files re-read at every connect, and never
//! a fall-back to plain TCP.
//!
//! Every connection's socket writes pass a [`gate::SendGate`]: frames of a
//! batch published under a lease are never written after that lease's trust
//! deadline, even when the process stalled with them buffered.

mod connection;
pub mod gate;
mod message;
mod publish;
mod sink;

pub use connection::{Broker, FRAME_MAX};
pub use message::{
    HEADER_ID, HEADER_LEASE_EPOCH, HEADER_MESSAGE_KEY, HEADER_PARTITION_KEY, message_properties,
};
pub use publish::ConfirmChannel;
pub use sink::AmqpSink;
