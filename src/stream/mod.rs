//! RabbitMQ streams, through the stream protocol (the `rabbitmq_stream`
//! plugin's port, 5552 by default).
//!
//! [`sink`] is the relay's sink for streams (effectively once: a producer
//! per bucket, the row's id as the publishing id), [`message`] what a row
//! becomes on a stream; [`link`] its connections, gated and TLS like the
//! AMQP path's; [`lookup`] reads a stream for the rows it holds of some
//! buckets, for the sessions that took expired leases over (their questions
//! gathered into shared reads by [`gather`]) and for [`repartition`], which
//! finds the pending rows the streams hold before a bucket count change
//! names new producers.
//!
//! [`client`] is a small client of outboxd's own over the
//! `rabbitmq-stream-protocol` codec, speaking only the protocol's first
//! version, which every broker with the plugin understands (RabbitMQ 3.9
//! on). Why not the `rabbitmq-stream-client` crate: its releases from 0.5
//! on open every connection with a command RabbitMQ added in 3.11
//! (ExchangeCommandVersions), which Debian's 3.10 answers by closing the
//! connection; the last release without it (0.4.4) owns its socket and its
//! TLS (rustls 0.21, certificates by file name), so neither the send gate
//! nor outboxd's TLS settings could stand between it and the broker.
//!
//! What streams give an outbox: a named producer's messages carry a
//! publishing id, and the broker stores a message only if its id is greater
//! than the last it stored for that name — a message sent twice is stored
//! once — and answers with the last id it stored.

pub mod client;
pub mod declare;
pub mod gather;
pub mod link;
pub mod lookup;
pub mod message;
pub mod repartition;
pub mod sink;

pub use client::{Confirm, Publisher, StreamClient, StreamError, StreamUrl, Subscription};
pub use link::StreamLink;
pub use rabbitmq_stream_protocol::commands::subscribe::OffsetSpecification;
pub use rabbitmq_stream_protocol::message::{Message, SimpleValue};
pub use sink::StreamSink;
