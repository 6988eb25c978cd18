//! The last fence: between the AMQP client's buffers and the socket.
//!
//! The database fences every write a superseded worker makes, and a drainer
//! stops *starting* publishes at its lease's trust deadline. Neither stops
//! frames the client library had already accepted but not yet written to
//! the socket when the whole process stalled (SIGSTOP, a VM pause, a long
//! swap): lapin's I/O loop writes them the moment the process runs again,
//! before any code of ours runs — under a lease another worker may hold by
//! then. Without the gate the SIGSTOP test saw this in about 1 run in 8.
//!
//! The gate sits in the socket's write path. While a batch is being
//! published under a lease, the batch *holds* the gate with that lease's
//! [`Trust`]; every write first checks that every held trust is still
//! valid. After a stall the trust has lapsed (it is measured on the
//! monotonic clock, which runs on while the process is stopped), so the
//! write fails, the connection drops, and the buffered frames die with it.
//! Their rows were never recorded as published, so the bucket's owner
//! publishes them: at least once, and nothing under a lost lease.
//!
//! What the gate cannot stop: bytes already in the kernel's socket buffer.
//! The kernel sends those while the process is stopped, so they reach the
//! broker within moments of being written — before the trust deadline, and
//! so before the lease can end (the deadline keeps a safety margin).
//!
//! Nor a pause that lands between the gate's check and the `write` it
//! allowed: the check read a clock from before the pause, and the write
//! goes out after it. No check can close that gap (there is always one
//! after the last check), only keep it short: the clock read, a lock, the
//! write. A pause lands in it rarely where reading the clock never enters
//! the kernel (the vDSO); under libfaketime every clock read is a system
//! call, where a pending SIGSTOP takes effect, so the tests' stops land in
//! it often enough to be seen (`tests/faults.rs`, skewed clocks). Each
//! write is therefore checked again after it returns, and frames written
//! after a held trust lapsed are reported as an error naming the leases.
//! What such frames cost: they are rows the worker claimed as its bucket's
//! head and never recorded, which the new owner publishes from the same
//! head; a consumer may see one again after later messages — a duplicate —
//! while first deliveries keep their order and nothing is lost.
//!
//! The gate is per connection, not per bucket: a lapsed trust drops the
//! connection for every bucket on it. That only happens when a lease was
//! lost mid-batch, where dropping everything in flight is the safe answer
//! (the other buckets' batches are replayed: duplicates, not gaps).
//!
//! For `amqps://` the socket is TLS ([`BrokerStream::Tls`]) *above* the
//! gate: the gate sees the encrypted records, so TLS adds no buffer the gate
//! cannot stop. A plain connection whose server answers with a TLS record
//! fails at once with a hint to use `amqps://`.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_rs::Tokio;
use async_rs::traits::{Executor, Reactor, RuntimeKit};
use async_rs::util::{DummyIO, Task};
use futures_io::{AsyncRead, AsyncWrite};

use crate::lease::Trust;

/// The leases under which frames may be in the client's buffers.
#[derive(Debug, Default)]
pub struct SendGate {
    held: Mutex<Vec<Held>>,
    next: AtomicU64,
    /// Writes that went out after a held trust lapsed (each reported);
    /// shared with the worker's counters ([`SendGate::late_writes`]).
    late_writes: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Held {
    id: u64,
    trust: Arc<Trust>,
    /// Released by its holder without proof that its frames were written:
    /// kept until the connection they were on is replaced.
    lingering: bool,
}

impl SendGate {
    /// Holds the gate with `trust` until the returned guard is dropped.
    pub fn hold(self: &Arc<Self>, trust: Arc<Trust>) -> GateHold {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().push(Held {
            id,
            trust,
            lingering: false,
        });
        GateHold {
            gate: self.clone(),
            id,
            linger: false,
        }
    }

    /// Whether bytes may go to the socket: every held trust is valid.
    pub fn is_open(&self) -> bool {
        let now = tokio::time::Instant::now();
        self.lock().iter().all(|h| now < h.trust.until())
    }

    /// Called after bytes went to the socket: reports the leases whose
    /// trust lapsed between [`SendGate::is_open`] and the write's return.
    /// The process was paused in between (the one gap no check can close);
    /// those bytes are already on their way.
    fn after_write(&self) {
        let now = tokio::time::Instant::now();
        let lapsed: Vec<String> = self
            .lock()
            .iter()
            .filter(|h| now >= h.trust.until())
            .map(|h| h.trust.lease().to_owned())
            .collect();
        if !lapsed.is_empty() {
            self.late_writes.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                leases = ?lapsed,
                "frames were written after their lease's trust deadline: the process was paused \
                 between the send gate's check and the socket write, where nothing can stop a \
                 pause. They may reach the queue after the bucket's new owner's messages: a \
                 late duplicate for consumers; nothing is lost and first deliveries keep their order"
            );
        }
    }

    /// The count of writes that went out after a held trust lapsed.
    pub fn late_writes(&self) -> Arc<AtomicU64> {
        self.late_writes.clone()
    }

    /// A new connection replaces the old one: frames buffered for the old
    /// one can no longer be written, so lingering holds end.
    pub fn connection_replaced(&self) {
        self.lock().retain(|h| !h.lingering);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Held>> {
        // A panic while holding this lock cannot leave the list inconsistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Releases its hold on the gate when dropped — drop it only once every
/// frame sent under it is known to be written (confirmed, or its channel
/// closed cleanly); otherwise [`GateHold::linger`].
#[derive(Debug)]
pub struct GateHold {
    gate: Arc<SendGate>,
    id: u64,
    linger: bool,
}

impl GateHold {
    /// Gives up the hold without knowing whether its frames were written:
    /// the gate keeps checking its trust until the connection is replaced.
    pub fn linger(mut self) {
        self.linger = true;
    }
}

impl Drop for GateHold {
    fn drop(&mut self) {
        let mut held = self.gate.lock();
        if self.linger {
            if let Some(h) = held.iter_mut().find(|h| h.id == self.id) {
                h.lingering = true;
            }
        } else {
            held.retain(|h| h.id != self.id);
        }
    }
}

fn gate_closed() -> io::Error {
    io::Error::other(
        "a lease's trust deadline passed while frames were unsent (the process stalled?): \
         dropping the connection so they are never sent",
    )
}

/// A socket whose writes pass the gate first.
#[derive(Debug)]
pub struct GatedStream<S> {
    inner: S,
    gate: Arc<SendGate>,
}

impl<S: AsyncRead + Unpin> AsyncRead for GatedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> GatedStream<S> {
    /// One write through the gate: refused while a held trust has lapsed,
    /// checked again when it returns ([`SendGate::after_write`]).
    fn gated_write(
        &mut self,
        write: impl FnOnce(Pin<&mut S>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if !self.gate.is_open() {
            return Poll::Ready(Err(gate_closed()));
        }
        let written = write(Pin::new(&mut self.inner));
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.gate.after_write();
        }
        written
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GatedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.gated_write(|inner| inner.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.gated_write(|inner| inner.poll_write_vectored(cx, bufs))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}

/// How a broker connection is secured: `None` for `amqp://`.
#[derive(Debug, Clone)]
pub struct TlsTarget {
    /// Built from `amqp.tls.*` for this very connection (files re-read).
    pub config: Arc<rustls::ClientConfig>,
    /// The URL's host: the name the certificate must carry.
    pub name: rustls::pki_types::ServerName<'static>,
    /// Where a failed handshake leaves its error, for
    /// [`crate::tls::explain`] (lapin reports it only as text).
    pub failure: Arc<Mutex<Option<rustls::Error>>>,
}

/// lapin's default Tokio runtime kit, with every TCP connection gated,
/// hardened against a silent peer ([`crate::net::harden`]) and, for
/// `amqps://`, wrapped in TLS above the gate.
#[derive(Debug, Clone)]
pub struct GatedTokio {
    inner: Tokio,
    gate: Arc<SendGate>,
    dead_peer_timeout: Duration,
    tls: Option<TlsTarget>,
}

impl GatedTokio {
    /// The kit for the current Tokio runtime, gating through `gate`.
    pub fn new(gate: Arc<SendGate>, dead_peer_timeout: Duration, tls: Option<TlsTarget>) -> Self {
        Self {
            inner: Tokio::current(),
            gate,
            dead_peer_timeout,
            tls,
        }
    }
}

impl RuntimeKit for GatedTokio {}

impl Executor for GatedTokio {
    type Task<T: Send + 'static> = <Tokio as Executor>::Task<T>;

    fn block_on<T, F: Future<Output = T>>(&self, f: F) -> T {
        self.inner.block_on(f)
    }

    fn spawn<T: Send + 'static, F: Future<Output = T> + Send + 'static>(
        &self,
        f: F,
    ) -> Task<Self::Task<T>> {
        self.inner.spawn(f)
    }

    fn spawn_blocking<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(
        &self,
        f: F,
    ) -> Task<Self::Task<T>> {
        self.inner.spawn_blocking(f)
    }
}

type Gated = GatedStream<<Tokio as Reactor>::TcpStream>;

/// The broker socket: plain, or TLS over the gated socket (the gate sees
/// the encrypted records, so nothing at all is written once it closes).
pub enum BrokerStream {
    /// `amqp://`. `answered` turns true with the first byte read: a first
    /// byte that opens a TLS record means the port speaks TLS.
    Plain { stream: Gated, answered: bool },
    /// With TLS 1.3 a server refuses a client certificate after the
    /// client's side of the handshake is done: that alert arrives on the
    /// first read, and is kept in `failure` as a failed handshake is.
    Tls {
        stream: Box<futures_rustls::client::TlsStream<Gated>>,
        failure: Arc<Mutex<Option<rustls::Error>>>,
    },
}

/// Keeps the rustls error of a failed TLS read or handshake for
/// [`crate::tls::explain`].
fn keep_failure(failure: &Mutex<Option<rustls::Error>>, error: &io::Error) {
    if let Some(cause) = crate::tls::find_rustls(error) {
        *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(cause.clone());
    }
}

impl std::fmt::Debug for BrokerStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BrokerStream::Plain { .. } => "BrokerStream::Plain",
            BrokerStream::Tls { .. } => "BrokerStream::Tls",
        })
    }
}

/// The first byte of a TLS record a server sends first: a handshake or an
/// alert. An AMQP server's first frame starts with 1 (a method frame).
fn opens_tls_record(byte: u8) -> bool {
    byte == 0x15 || byte == 0x16
}

impl AsyncRead for BrokerStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match &mut *self {
            BrokerStream::Plain { stream, answered } => {
                let read = std::task::ready!(Pin::new(stream).poll_read(cx, buf))?;
                if !*answered && read > 0 {
                    *answered = true;
                    if opens_tls_record(buf[0]) {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "the server answered in TLS: this port wants an amqps:// URL",
                        )));
                    }
                }
                Poll::Ready(Ok(read))
            }
            BrokerStream::Tls { stream, failure } => {
                let read = std::task::ready!(Pin::new(stream.as_mut()).poll_read(cx, buf));
                if let Err(e) = &read {
                    keep_failure(failure, e);
                }
                Poll::Ready(read)
            }
        }
    }
}

impl AsyncWrite for BrokerStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut *self {
            BrokerStream::Plain { stream, .. } => Pin::new(stream).poll_write(cx, buf),
            BrokerStream::Tls { stream: tls, .. } => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut *self {
            BrokerStream::Plain { stream, .. } => Pin::new(stream).poll_write_vectored(cx, bufs),
            BrokerStream::Tls { stream: tls, .. } => {
                Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs)
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            BrokerStream::Plain { stream, .. } => Pin::new(stream).poll_flush(cx),
            BrokerStream::Tls { stream: tls, .. } => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            BrokerStream::Plain { stream, .. } => Pin::new(stream).poll_close(cx),
            BrokerStream::Tls { stream: tls, .. } => Pin::new(tls.as_mut()).poll_close(cx),
        }
    }
}

impl Reactor for GatedTokio {
    type TcpStream = BrokerStream;
    type Sleep = <Tokio as Reactor>::Sleep;

    /// Registering raw handles is not used by lapin (it connects with
    /// [`Reactor::tcp_connect_addr`]), and an ungated handle would bypass
    /// the gate: refused.
    fn register<H: io::Read + io::Write + Send + 'static>(
        &self,
        _socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static> {
        Err::<DummyIO, _>(io::Error::other(
            "outboxd's AMQP runtime only opens TCP connections",
        ))
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.inner.sleep(dur)
    }

    fn interval(
        &self,
        dur: Duration,
    ) -> impl futures_util::Stream<Item = std::time::Instant> + Send + 'static {
        self.inner.interval(dur)
    }

    fn tcp_connect_addr(
        &self,
        addr: SocketAddr,
    ) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        let (gate, dead_after) = (self.gate.clone(), self.dead_peer_timeout);
        let connect = self.inner.tcp_connect_addr(addr);
        let tls = self.tls.clone();
        async move {
            let inner = connect.await?;
            crate::net::harden(inner.get_ref().as_fd(), dead_after)?;
            let stream = GatedStream { inner, gate };
            let Some(tls) = tls else {
                return Ok(BrokerStream::Plain {
                    stream,
                    answered: false,
                });
            };
            let connector = futures_rustls::TlsConnector::from(tls.config);
            match connector.connect(tls.name, stream).await {
                Ok(stream) => Ok(BrokerStream::Tls {
                    stream: Box::new(stream),
                    failure: tls.failure,
                }),
                Err(e) => {
                    keep_failure(&tls.failure, &e);
                    Err(e)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    #[test]
    fn the_gate_closes_while_a_held_trust_has_lapsed_and_opens_when_released() {
        let gate = Arc::new(SendGate::default());
        assert!(gate.is_open());
        let valid = Arc::new(Trust::new(
            Instant::now() + Duration::from_secs(60),
            "p00",
            1,
        ));
        let lapsed = Arc::new(Trust::new(Instant::now(), "p01", 1));
        let a = gate.hold(valid.clone());
        assert!(gate.is_open());
        let b = gate.hold(lapsed);
        assert!(!gate.is_open());
        drop(b);
        assert!(gate.is_open());
        valid.revoke();
        assert!(!gate.is_open());
        drop(a);
        assert!(gate.is_open());

        // A lingering hold keeps counting until the connection is replaced.
        let stalled = Arc::new(Trust::new(
            Instant::now() + Duration::from_secs(60),
            "p00",
            1,
        ));
        gate.hold(stalled.clone()).linger();
        assert!(gate.is_open());
        stalled.revoke();
        assert!(!gate.is_open());
        gate.connection_replaced();
        assert!(gate.is_open());
    }

    /// A socket whose every write takes `stall` (the process paused
    /// between the gate's check and the write).
    struct StallingSocket {
        stall: Duration,
        written: usize,
    }

    impl AsyncWrite for StallingSocket {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            std::thread::sleep(self.stall);
            self.written += buf.len();
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn a_write_that_returns_after_a_held_trust_lapsed_is_counted_and_the_next_is_refused() {
        let gate = Arc::new(SendGate::default());
        let trust = Arc::new(Trust::new(
            Instant::now() + Duration::from_millis(30),
            "p00",
            1,
        ));
        let _hold = gate.hold(trust);
        let mut socket = GatedStream {
            inner: StallingSocket {
                stall: Duration::from_millis(60),
                written: 0,
            },
            gate: gate.clone(),
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Checked while the trust held: the bytes go out, late, counted.
        let first = Pin::new(&mut socket).poll_write(&mut cx, b"frame");
        assert!(matches!(first, Poll::Ready(Ok(5))));
        assert_eq!(gate.late_writes().load(Ordering::Relaxed), 1);
        // The next write is refused at the check.
        let second = Pin::new(&mut socket).poll_write(&mut cx, b"frame");
        assert!(matches!(second, Poll::Ready(Err(_))));
        assert_eq!(socket.inner.written, 5);
        assert_eq!(gate.late_writes().load(Ordering::Relaxed), 1);
    }
}
