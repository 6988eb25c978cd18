//! One connection to a RabbitMQ stream port: the handshake (peer
//! properties, SASL PLAIN, tune, open), requests answered by correlation
//! id, heartbeats, publishers whose confirmations arrive on a channel of
//! their own, and readers of a stream (subscriptions).
//!
//! A task reads every frame the broker sends and hands it on: an answer to
//! the request that waits for it, a publisher's confirmations and refusals
//! to that publisher, a tune to the handshake. When the connection ends,
//! every waiting request fails with [`StreamError::Closed`] and every
//! publisher's channel closes: nothing waits on a dead connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use futures_util::{SinkExt, StreamExt};
use rabbitmq_stream_protocol::codec::{Decoder as _, Encoder as _};
use rabbitmq_stream_protocol::commands::Command;
use rabbitmq_stream_protocol::commands::close::CloseRequest;
use rabbitmq_stream_protocol::commands::create_stream::CreateStreamCommand;
use rabbitmq_stream_protocol::commands::credit::CreditCommand;
use rabbitmq_stream_protocol::commands::declare_publisher::DeclarePublisherCommand;
use rabbitmq_stream_protocol::commands::delete::Delete;
use rabbitmq_stream_protocol::commands::delete_publisher::DeletePublisherCommand;
use rabbitmq_stream_protocol::commands::heart_beat::HeartBeatCommand;
use rabbitmq_stream_protocol::commands::open::OpenCommand;
use rabbitmq_stream_protocol::commands::peer_properties::PeerPropertiesCommand;
use rabbitmq_stream_protocol::commands::publish::PublishCommand;
use rabbitmq_stream_protocol::commands::query_publisher_sequence::QueryPublisherRequest;
use rabbitmq_stream_protocol::commands::sasl_authenticate::SaslAuthenticateCommand;
use rabbitmq_stream_protocol::commands::sasl_handshake::SaslHandshakeCommand;
use rabbitmq_stream_protocol::commands::subscribe::{OffsetSpecification, SubscribeCommand};
use rabbitmq_stream_protocol::commands::tune::TunesCommand;
use rabbitmq_stream_protocol::commands::unsubscribe::UnSubscribeCommand;
use rabbitmq_stream_protocol::error::DecodeError;
use rabbitmq_stream_protocol::message::Message;
use rabbitmq_stream_protocol::types::PublishedMessage;
use rabbitmq_stream_protocol::{Request, RequestKind, Response, ResponseCode, ResponseKind};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite};

/// The only version of each command this client sends: the protocol's
/// first, which every broker with the stream plugin speaks.
const VERSION: u16 = 1;

/// The largest frame this client accepts or sends, unless the broker asks
/// for less.
const MAX_FRAME: u32 = 1024 * 1024;

/// What a publish frame adds to its messages: size, key, version,
/// publisher id, count.
const FRAME_OVERHEAD: u32 = 4 + 2 + 2 + 1 + 4;

/// Why a stream operation did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StreamError {
    #[error("invalid stream URL: {0}")]
    Url(String),
    #[error("cannot reach the stream port: {0}")]
    Io(String),
    /// The broker answered, and said no.
    #[error("the broker refused {doing}: {code:?}")]
    Refused {
        doing: &'static str,
        code: ResponseCode,
    },
    #[error("stream protocol: {0}")]
    Protocol(String),
    #[error("the stream connection is closed")]
    Closed,
    #[error("no answer from the broker within {0:?}")]
    Timeout(Duration),
}

/// Where the stream port is, parsed from
/// `rabbitmq-stream://user:password@host:port/vhost` (or
/// `rabbitmq-stream+tls://`, the TLS port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamUrl {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
    /// `rabbitmq-stream+tls://`: the connection is TLS, never plain.
    pub tls: bool,
}

impl StreamUrl {
    /// Parses a `rabbitmq-stream://` URL (port 5552) or a
    /// `rabbitmq-stream+tls://` one (port 5551); vhost `/` unless given,
    /// as AMQP URLs default to theirs.
    pub fn parse(text: &str) -> Result<Self, StreamError> {
        let url = url::Url::parse(text).map_err(|e| StreamError::Url(e.to_string()))?;
        let tls = match url.scheme() {
            "rabbitmq-stream" => false,
            "rabbitmq-stream+tls" => true,
            other => {
                return Err(StreamError::Url(format!(
                    "scheme {other:?}: expected rabbitmq-stream:// or rabbitmq-stream+tls://"
                )));
            }
        };
        let host = url
            .host_str()
            .ok_or_else(|| StreamError::Url("no host".into()))?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|e| StreamError::Url(e.to_string()))
        };
        let vhost = match url.path().strip_prefix('/') {
            None | Some("") => "/".to_string(),
            Some(v) => decode(v)?,
        };
        Ok(Self {
            host: host.trim_matches(['[', ']']).to_string(),
            port: url.port().unwrap_or(if tls { 5551 } else { 5552 }),
            user: match url.username() {
                "" => "guest".to_string(),
                u => decode(u)?,
            },
            password: decode(url.password().unwrap_or("guest"))?,
            vhost,
            tls,
        })
    }
}

/// What the broker said of published messages, by publishing id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirm {
    /// Stored — or already stored under that id, and dropped as a repeat.
    Stored(Vec<u64>),
    /// Not stored, with the broker's reason.
    Refused(Vec<(u64, ResponseCode)>),
}

/// A named producer on one stream ([`StreamClient::declare_publisher`]).
pub struct Publisher {
    pub id: u8,
    /// The broker's answers to this publisher's messages, in the order it
    /// sent them; closed with the connection.
    pub confirms: mpsc::UnboundedReceiver<Confirm>,
}

/// A reader of one stream ([`StreamClient::subscribe`]).
pub struct Subscription {
    pub id: u8,
    /// Each chunk the broker delivers, in stream order; closed with the
    /// connection. Each chunk spends one credit: grant more with
    /// [`StreamClient::credit`].
    pub chunks: mpsc::UnboundedReceiver<Chunk>,
}

/// A chunk of a stream: its messages and the offset of the first.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub first_offset: u64,
    pub messages: Vec<Message>,
}

impl Chunk {
    /// The offset after its last message.
    pub fn next_offset(&self) -> u64 {
        self.first_offset + self.messages.len() as u64
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

impl IntoIterator for Chunk {
    type Item = Message;
    type IntoIter = std::vec::IntoIter<Message>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.into_iter()
    }
}

/// The connection's socket: plain TCP, or whatever the caller connected
/// (the relay's is gated and may be TLS: [`crate::stream::link`]).
pub trait Socket: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<S: AsyncRead + AsyncWrite + Send + Unpin + 'static> Socket for S {}

type Io = Box<dyn Socket>;
type Writer = FramedWrite<WriteHalf<Io>, Codec>;

/// What the reading task shares with the requests.
#[derive(Default)]
struct Shared {
    answers: Mutex<HashMap<u32, oneshot::Sender<Response>>>,
    publishers: Mutex<HashMap<u8, mpsc::UnboundedSender<Confirm>>>,
    subscriptions: Mutex<HashMap<u8, mpsc::UnboundedSender<Chunk>>>,
    tune: Mutex<Option<oneshot::Sender<TunesCommand>>>,
    closed: AtomicBool,
}

impl Shared {
    /// Ends every wait: the connection is gone.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.answers.lock().expect("not poisoned").clear();
        self.publishers.lock().expect("not poisoned").clear();
        self.subscriptions.lock().expect("not poisoned").clear();
        self.tune.lock().expect("not poisoned").take();
    }
}

/// One connection to a stream port.
pub struct StreamClient {
    writer: Arc<tokio::sync::Mutex<Writer>>,
    shared: Arc<Shared>,
    correlation: AtomicU32,
    /// How long a request waits for its answer.
    timeout: Duration,
    max_frame: u32,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl StreamClient {
    /// Connects over plain TCP and opens the URL's vhost; each step waits
    /// at most `timeout`.
    pub async fn connect(url: &StreamUrl, timeout: Duration) -> Result<Self, StreamError> {
        if url.tls {
            return Err(StreamError::Url(
                "a rabbitmq-stream+tls:// URL needs a TLS socket (StreamClient::over)".into(),
            ));
        }
        let socket =
            tokio::time::timeout(timeout, TcpStream::connect((url.host.as_str(), url.port)))
                .await
                .map_err(|_| StreamError::Timeout(timeout))?
                .map_err(|e| StreamError::Io(format!("{}:{}: {e}", url.host, url.port)))?;
        let _ = socket.set_nodelay(true);
        Self::over(Box::new(socket), url, timeout).await
    }

    /// Opens the URL's vhost over a connected `socket`; each step waits
    /// at most `timeout`.
    pub async fn over(socket: Io, url: &StreamUrl, timeout: Duration) -> Result<Self, StreamError> {
        let (read, write) = tokio::io::split(socket);
        let shared = Arc::new(Shared::default());
        let (tune_tx, tune_rx) = oneshot::channel();
        *shared.tune.lock().expect("not poisoned") = Some(tune_tx);
        let reader = tokio::spawn(read_frames(FramedRead::new(read, Codec), shared.clone()));
        let mut client = Self {
            writer: Arc::new(tokio::sync::Mutex::new(FramedWrite::new(write, Codec))),
            shared,
            correlation: AtomicU32::new(1),
            timeout,
            max_frame: MAX_FRAME,
            tasks: vec![reader],
        };
        client.handshake(url, tune_rx).await?;
        Ok(client)
    }

    async fn handshake(
        &mut self,
        url: &StreamUrl,
        tune: oneshot::Receiver<TunesCommand>,
    ) -> Result<(), StreamError> {
        let properties = HashMap::from([
            ("product".to_string(), "outboxd".to_string()),
            ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ]);
        self.call("exchanging properties", |c| {
            PeerPropertiesCommand::new(c, properties)
        })
        .await?;
        let mechanisms = self
            .call("the SASL handshake", SaslHandshakeCommand::new)
            .await?;
        let ResponseKind::SaslHandshake(mechanisms) = mechanisms.kind() else {
            return Err(StreamError::Protocol("no SASL mechanisms".into()));
        };
        if !mechanisms.mechanisms.iter().any(|m| m == "PLAIN") {
            return Err(StreamError::Protocol(format!(
                "the broker offers {:?}, not PLAIN",
                mechanisms.mechanisms
            )));
        }
        let secret = format!("\u{0}{}\u{0}{}", url.user, url.password);
        let answer = self
            .call("the credentials", |c| {
                SaslAuthenticateCommand::new(c, "PLAIN".into(), secret.into_bytes())
            })
            .await?;
        ok(answer, "the credentials")?;
        // The broker proposes the frame size and the heartbeat; this
        // client takes them, the frame size at most its own.
        let tune = tokio::time::timeout(self.timeout, tune)
            .await
            .map_err(|_| StreamError::Timeout(self.timeout))?
            .map_err(|_| StreamError::Closed)?;
        self.max_frame = match tune.max_frame_size {
            0 => MAX_FRAME,
            n => n.min(MAX_FRAME),
        };
        self.send(TunesCommand::new(self.max_frame, tune.heartbeat).into())
            .await?;
        if tune.heartbeat > 0 {
            self.tasks.push(tokio::spawn(beat(
                self.writer.clone(),
                self.shared.clone(),
                Duration::from_secs(u64::from(tune.heartbeat)),
            )));
        }
        let vhost = url.vhost.clone();
        let answer = self
            .call("opening the vhost", |c| OpenCommand::new(c, vhost))
            .await?;
        ok(answer, "opening the vhost")
    }

    /// How long each later request waits for its answer.
    pub fn answer_within(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Whether the connection is still up.
    pub fn is_open(&self) -> bool {
        !self.shared.closed.load(Ordering::Acquire)
    }

    /// Creates a stream with `arguments` (`max-age`, `max-length-bytes`,
    /// `stream-max-segment-size-bytes`, as RabbitMQ names them); false when
    /// it existed already, with these arguments or others (which are left
    /// as they were: the broker answers PRECONDITION_FAILED for those).
    pub async fn create_stream(
        &self,
        name: &str,
        arguments: HashMap<String, String>,
    ) -> Result<bool, StreamError> {
        let answer = self
            .call("creating a stream", |c| {
                CreateStreamCommand::new(c, name.to_string(), arguments)
            })
            .await?;
        match code_of(&answer) {
            Some(ResponseCode::StreamAlreadyExists | ResponseCode::PreconditionFailed) => Ok(false),
            _ => ok(answer, "creating a stream").map(|()| true),
        }
    }

    /// Deletes a stream and every message in it.
    pub async fn delete_stream(&self, name: &str) -> Result<(), StreamError> {
        let answer = self
            .call("deleting a stream", |c| Delete::new(c, name.to_string()))
            .await?;
        ok(answer, "deleting a stream")
    }

    /// Declares a producer on `stream`. A named one (`reference`): the
    /// broker keeps, for that name and stream, the last publishing id it
    /// stored, and stores a message only if its id is greater. An unnamed
    /// one (`None`) stores every message it is sent.
    pub async fn declare_publisher(
        &self,
        reference: Option<&str>,
        stream: &str,
    ) -> Result<Publisher, StreamError> {
        let (id, confirms) = register(&self.shared.publishers)?;
        let answer = self
            .call("declaring a producer", |c| {
                DeclarePublisherCommand::new(c, id, reference.map(Into::into), stream.into())
            })
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                self.forget_publisher(id);
                return Err(e);
            }
        };
        if let Err(e) = ok(answer, "declaring a producer") {
            self.forget_publisher(id);
            return Err(e);
        }
        Ok(Publisher { id, confirms })
    }

    /// Deletes a producer of this connection; its id is free again.
    pub async fn delete_publisher(&self, publisher: u8) -> Result<(), StreamError> {
        let answer = self
            .call("deleting a producer", |c| {
                DeletePublisherCommand::new(c, publisher)
            })
            .await;
        self.forget_publisher(publisher);
        ok(answer?, "deleting a producer")
    }

    /// How many producers this connection has (at most 256).
    pub fn publishers(&self) -> usize {
        self.shared.publishers.lock().expect("not poisoned").len()
    }

    fn forget_publisher(&self, id: u8) {
        self.shared
            .publishers
            .lock()
            .expect("not poisoned")
            .remove(&id);
    }

    /// The last publishing id the broker stored for the producer named
    /// `reference` on `stream` (0: none).
    pub async fn publisher_sequence(
        &self,
        reference: &str,
        stream: &str,
    ) -> Result<u64, StreamError> {
        let answer = self
            .call("reading a producer's last id", |c| {
                QueryPublisherRequest::new(c, reference.into(), stream.into())
            })
            .await?;
        match answer.kind() {
            ResponseKind::QueryPublisherSequence(q) => Ok(q.from_response()),
            other => Err(StreamError::Protocol(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Sends `messages` (publishing id, message) for `publisher`, in order,
    /// in as few frames as fit; their confirmations arrive on the
    /// publisher's channel.
    pub async fn publish(
        &self,
        publisher: u8,
        messages: Vec<(u64, Message)>,
    ) -> Result<(), StreamError> {
        let mut frame = Vec::new();
        let mut size = 0u32;
        let mut writer = self.writer.lock().await;
        for (id, message) in messages {
            let message = PublishedMessage::new(id, message, None);
            let grows = message.encoded_size();
            // The frame's own size, key, version, publisher id and count.
            if !frame.is_empty() && size + grows + FRAME_OVERHEAD > self.max_frame {
                let full = std::mem::take(&mut frame);
                feed(&mut writer, PublishCommand::new(publisher, full, VERSION)).await?;
                size = 0;
            }
            size += grows;
            frame.push(message);
        }
        if !frame.is_empty() {
            feed(&mut writer, PublishCommand::new(publisher, frame, VERSION)).await?;
        }
        writer
            .flush()
            .await
            .map_err(|e| StreamError::Io(e.to_string()))
    }

    /// Reads `stream` from `from`, `credit` chunks ahead.
    pub async fn subscribe(
        &self,
        stream: &str,
        from: OffsetSpecification,
        credit: u16,
    ) -> Result<Subscription, StreamError> {
        let (id, chunks) = register(&self.shared.subscriptions)?;
        let answer = self
            .call("subscribing to a stream", |c| {
                SubscribeCommand::new(c, id, stream.into(), from, credit, HashMap::new())
            })
            .await?;
        ok(answer, "subscribing to a stream")?;
        Ok(Subscription { id, chunks })
    }

    /// Lets a subscription receive `chunks` more chunks.
    pub async fn credit(&self, subscription: u8, chunks: u16) -> Result<(), StreamError> {
        self.send(CreditCommand::new(subscription, chunks).into())
            .await
    }

    /// Ends a subscription.
    pub async fn unsubscribe(&self, subscription: u8) -> Result<(), StreamError> {
        let answer = self
            .call("ending a subscription", |c| {
                UnSubscribeCommand::new(c, subscription)
            })
            .await;
        self.shared
            .subscriptions
            .lock()
            .expect("not poisoned")
            .remove(&subscription);
        ok(answer?, "ending a subscription")
    }

    /// Closes the connection, waiting a moment for the broker's answer.
    pub async fn close(self) {
        let closing = self.call("closing", |c| {
            CloseRequest::new(c, ResponseCode::Ok, "outboxd: done".into())
        });
        let _ = tokio::time::timeout(Duration::from_secs(1), closing).await;
    }

    /// Sends a request built with a fresh correlation id and waits for its
    /// answer.
    async fn call<C>(
        &self,
        doing: &'static str,
        make: impl FnOnce(u32) -> C,
    ) -> Result<Response, StreamError>
    where
        C: Command + Into<RequestKind>,
    {
        let id = self.correlation.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.shared
            .answers
            .lock()
            .expect("not poisoned")
            .insert(id, tx);
        if !self.is_open() {
            return Err(StreamError::Closed);
        }
        self.send(Request::from(make(id))).await?;
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(StreamError::Closed),
            Err(_) => {
                self.shared
                    .answers
                    .lock()
                    .expect("not poisoned")
                    .remove(&id);
                tracing::debug!(doing, "no answer from the stream port");
                Err(StreamError::Timeout(self.timeout))
            }
        }
    }

    async fn send(&self, request: Request) -> Result<(), StreamError> {
        let mut writer = self.writer.lock().await;
        writer
            .send(request)
            .await
            .map_err(|e| StreamError::Io(e.to_string()))
    }
}

impl Drop for StreamClient {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The lowest free publisher or subscription id of a connection, with the
/// channel its frames are handed to, registered under it.
fn register<T>(
    to: &Mutex<HashMap<u8, mpsc::UnboundedSender<T>>>,
) -> Result<(u8, mpsc::UnboundedReceiver<T>), StreamError> {
    let mut to = to.lock().expect("not poisoned");
    let id = (0..=u8::MAX)
        .find(|id| !to.contains_key(id))
        .ok_or_else(|| StreamError::Protocol("256 producers on one connection".into()))?;
    let (tx, rx) = mpsc::unbounded_channel();
    to.insert(id, tx);
    Ok((id, rx))
}

/// Queues a publish frame without flushing.
async fn feed(writer: &mut Writer, command: PublishCommand) -> Result<(), StreamError> {
    writer
        .feed(Request::from(command))
        .await
        .map_err(|e| StreamError::Io(e.to_string()))
}

/// Reads the broker's frames until the connection ends.
async fn read_frames(mut frames: FramedRead<ReadHalf<Io>, Codec>, shared: Arc<Shared>) {
    while let Some(frame) = frames.next().await {
        let response = match frame {
            Ok(response) => response,
            Err(e) => {
                tracing::debug!(error = %e, "stream connection: unreadable frame");
                break;
            }
        };
        let publishers = || shared.publishers.lock().expect("not poisoned");
        match response.kind_ref() {
            ResponseKind::PublishConfirm(confirm) => {
                if let Some(tx) = publishers().get(&confirm.publisher_id) {
                    let _ = tx.send(Confirm::Stored(confirm.publishing_ids.clone()));
                }
            }
            ResponseKind::PublishError(refused) => {
                let errors = refused
                    .publishing_errors
                    .iter()
                    .map(|e| (e.publishing_id, e.error_code.clone()))
                    .collect();
                if let Some(tx) = publishers().get(&refused.publisher_id) {
                    let _ = tx.send(Confirm::Refused(errors));
                }
            }
            ResponseKind::Deliver(deliver) => {
                let subscriptions = shared.subscriptions.lock().expect("not poisoned");
                if let Some(tx) = subscriptions.get(&deliver.subscription_id) {
                    let _ = tx.send(Chunk {
                        first_offset: deliver.chunk_first_offset,
                        messages: deliver.messages.clone(),
                    });
                }
            }
            ResponseKind::Tunes(tune) => {
                let tune = TunesCommand::new(tune.max_frame_size, tune.heartbeat);
                if let Some(tx) = shared.tune.lock().expect("not poisoned").take() {
                    let _ = tx.send(tune);
                }
            }
            ResponseKind::Heartbeat(_) | ResponseKind::MetadataUpdate(_) => {}
            _ => {
                let waiting = response
                    .correlation_id()
                    .and_then(|id| shared.answers.lock().expect("not poisoned").remove(&id));
                match waiting {
                    Some(tx) => {
                        let _ = tx.send(response);
                    }
                    None => tracing::debug!(?response, "stream connection: unexpected frame"),
                }
            }
        }
    }
    shared.close();
}

/// Sends a heartbeat every `every` while the connection is up.
async fn beat(writer: Arc<tokio::sync::Mutex<Writer>>, shared: Arc<Shared>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await;
    while !shared.closed.load(Ordering::Acquire) {
        ticks.tick().await;
        let mut writer = writer.lock().await;
        if writer
            .send(Request::from(HeartBeatCommand::default()))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The response code of an answer that carries one.
fn code_of(answer: &Response) -> Option<ResponseCode> {
    match answer.kind_ref() {
        ResponseKind::Generic(g) => Some(g.code().clone()),
        ResponseKind::Open(o) => Some(o.code().clone()),
        _ => None,
    }
}

/// Ok when the answer says so.
fn ok(answer: Response, doing: &'static str) -> Result<(), StreamError> {
    match code_of(&answer) {
        Some(ResponseCode::Ok) | None => Ok(()),
        Some(code) => Err(StreamError::Refused { doing, code }),
    }
}

/// Frames of the stream protocol: a 4-byte size, then the command.
struct Codec;

impl tokio_util::codec::Decoder for Codec {
    type Item = Response;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Response>, std::io::Error> {
        match Response::decode(buf) {
            Ok((rest, response)) => {
                let used = buf.len() - rest.len();
                buf.advance(used);
                Ok(Some(response))
            }
            Err(DecodeError::Incomplete(_)) => Ok(None),
            Err(e) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{e:?}"),
            )),
        }
    }
}

impl tokio_util::codec::Encoder<Request> for Codec {
    type Error = std::io::Error;

    fn encode(&mut self, request: Request, buf: &mut BytesMut) -> Result<(), std::io::Error> {
        buf.reserve(request.encoded_size() as usize + 4);
        let mut writer = buf.writer();
        request
            .encode(&mut writer)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{e:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_default_their_port_and_vhost() {
        let url = StreamUrl::parse("rabbitmq-stream://app:s%40cret@broker.example").unwrap();
        assert_eq!(
            url,
            StreamUrl {
                host: "broker.example".into(),
                port: 5552,
                user: "app".into(),
                password: "s@cret".into(),
                vhost: "/".into(),
                tls: false,
            }
        );
        let url = StreamUrl::parse("rabbitmq-stream+tls://a:b@h").unwrap();
        assert_eq!((url.port, url.tls), (5551, true));
        let url = StreamUrl::parse("rabbitmq-stream://a:b@127.0.0.1:55552/%2f").unwrap();
        assert_eq!((url.port, url.vhost.as_str()), (55552, "/"));
        let url = StreamUrl::parse("rabbitmq-stream://a:b@h/orders").unwrap();
        assert_eq!(url.vhost, "orders");
        assert!(StreamUrl::parse("amqp://h").is_err());
    }
}
