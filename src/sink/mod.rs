//! The sink contract: how the relay hands a bucket's rows to a broker.
//!
//! A drainer ([`crate::relay::bucket`]) opens one [`Session`] of the
//! relay's [`Sink`] and sends its batches through it, one at a time, in
//! the bucket's order; everything about the broker — its connection, its
//! protocol, its confirmations — is behind these two traits. The AMQP
//! 0-9-1 path ([`crate::amqp`]: lapin, publisher confirms, the send gate)
//! is one implementation; another broker is one more, not a fork of the
//! drain loop.
//!
//! What an implementation promises:
//!
//! - **Order.** [`Session::send`] delivers the rows of a batch in the
//!   order given, and reports a prefix: rows `0..confirmed` are durably the
//!   broker's. A row after the first failure is never counted, even if the
//!   broker took it; it is sent again, after the failed row (a duplicate,
//!   never a gap).
//! - **Confirmation.** A row counts as confirmed only when the broker said
//!   it has it (or, for a broker that de-duplicates, that it already had
//!   it). The drain loop records those rows as published, and only those.
//! - **Refusals, classified.** A row that stops the batch carries a
//!   [`PublishError`]: the row's own fault ([`PublishError::Rejected`] —
//!   counts an attempt and may park the row), no answer in time
//!   ([`PublishError::Timeout`]), the broker lost
//!   ([`PublishError::Unavailable`] — not the row's fault: the rest is
//!   sent again on a new session), or the lease's trust ran out
//!   ([`PublishError::LeaseLapsed`]).
//! - **The lease's deadline.** Nothing of a batch sent under a lease
//!   ([`PublishLimits::trust`]) reaches the broker after that lease's
//!   trust deadline, even if the process stalls mid-batch.
//! - **Surrender.** After a failure the drain loop closes the session
//!   ([`Session::close`], told why) and opens a fresh one for the rest: a
//!   session never carries a failed batch's state into the next.
//!   [`Sink::open`] waits for the broker, backing off, until it answers or
//!   the drainer is cancelled.
//! - **Counts.** A sink adds what it delivered to each destination to the
//!   worker's [`Destinations`] (what the dashboard shows per destination).
//! - **Reach.** [`Sink::reach`] says whether every link the sink publishes
//!   through can be reached, the worst of them ([`reach`]); the fleet
//!   coordinator gives the worker's buckets up when it could not for longer
//!   than `worker.broker_grace` (G5). [`Sink::keep_connected`] keeps those
//!   links open while no drainer uses them, so that a broker back is
//!   noticed and the worker takes its share again.

pub mod destinations;
pub mod reach;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use destinations::Destinations;
pub use reach::Reach;

use crate::store::outbox::ClaimedMessage;

/// Where the relay's drainers send their rows.
#[async_trait]
pub trait Sink: Send + Sync {
    /// A session for one drainer, once the broker answers; `None` when
    /// `cancel` fires first.
    async fn open(&self, cancel: &CancellationToken) -> Option<Box<dyn Session>>;

    /// Why the broker refuses publishes right now (`None`: it does not).
    /// Drainers claim nothing while it refuses.
    fn blocked(&self) -> watch::Receiver<Option<String>>;

    /// Whether the broker can be reached through every link the sink
    /// publishes through, as last seen and as it changes.
    fn reach(&self) -> watch::Receiver<Reach>;

    /// Keeps the sink's links connected, and [`Self::reach`] current,
    /// until `cancel` fires: while no bucket is drained (the worker gave
    /// its buckets up), this is what notices that the broker is back.
    async fn keep_connected(&self, cancel: CancellationToken);

    /// Whether the broker keeps `row`'s id and drops a repeat (a stream's
    /// named producer): then a lease under which such a row was sent and
    /// not recorded is left to expire rather than released
    /// ([`crate::lease`], point 7). False by default.
    fn deduplicates(&self, _row: &ClaimedMessage) -> bool {
        false
    }

    /// Whether any row may go where the broker keeps ids
    /// ([`Self::deduplicates`]): then a lease taken over after it expired
    /// is unsettled from the start, since its earlier owner may have left
    /// such rows unrecorded ([`crate::lease`], point 7). False by default.
    fn deduplicates_any(&self) -> bool {
        false
    }
}

/// One drainer's way to the broker, used by one batch at a time.
#[async_trait]
pub trait Session: Send + Sync {
    /// Whether the session can still send (its connection is up).
    fn is_usable(&self) -> bool;

    /// Sends `rows` in order and awaits the broker's confirmations in
    /// order (see the module docs for what the outcome promises).
    async fn send(&mut self, rows: &[ClaimedMessage], limits: PublishLimits) -> BatchOutcome;

    /// Closes the session; `after` is the failure that ended its last
    /// batch, if one did (a sink may give up on the node that timed out).
    async fn close(self: Box<Self>, after: Option<&PublishError>);
}

/// Why a publish did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// The row cannot be published as it is (too large, invalid headers,
    /// unroutable, rejected). Counts an attempt; may park the row.
    #[error("{0}")]
    Rejected(String),
    /// No confirm arrived in time. Counts an attempt, never parks: the
    /// broker may just be slow.
    #[error("no publisher confirm within {0:?}")]
    Timeout(Duration),
    /// The broker connection or channel is gone. Not the row's fault: the
    /// claim is handed back and the worker reconnects.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The bucket's lease can no longer be trusted: nothing more is sent.
    /// Not the row's fault either.
    #[error("lease trust deadline reached; stopped publishing this bucket")]
    LeaseLapsed,
}

impl PublishError {
    /// Whether the failure is the row's own (and so may park it).
    pub fn is_rows_fault(&self) -> bool {
        matches!(self, PublishError::Rejected(_))
    }

    /// Whether the failure counts as an attempt at the row.
    pub fn counts_attempt(&self) -> bool {
        !matches!(
            self,
            PublishError::Unavailable(_) | PublishError::LeaseLapsed
        )
    }
}

/// What a batch is published under.
#[derive(Debug, Clone)]
pub struct PublishLimits {
    /// Rows with a larger payload fail without being sent.
    pub max_payload_bytes: u64,
    /// Nothing is sent at or after this instant (the lease trust deadline).
    pub stop_sending_at: Option<tokio::time::Instant>,
    /// Stamped into the `outbox-lease-epoch` header when set.
    pub lease_epoch: Option<i64>,
    /// The lease's trust: holds the connection's send gate for the batch.
    pub trust: Option<Arc<crate::lease::Trust>>,
    /// The bucket's lease was free when this worker took it, so its
    /// previous owner recorded everything it sent: an unpublished row
    /// below what a de-duplicating broker stored was never sent (it
    /// committed late). False after taking over an expired lease, and
    /// without leases, where such a row may have been sent and not
    /// recorded.
    pub lease_was_free: bool,
}

/// What happened to a batch.
#[derive(Debug)]
pub struct BatchOutcome {
    /// Rows `0..confirmed` were confirmed by the broker, in order.
    pub confirmed: usize,
    /// Set when the batch stopped at row `confirmed`.
    pub failure: Option<PublishError>,
}
