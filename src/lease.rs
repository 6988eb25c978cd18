//! A bucket lease as one worker sees it, and why it is safe. Its own
//! module, below the coordinator that takes and renews leases, the relay
//! that drains under them and the broker's send gate that checks them.
//!
//! ```text
//!                 acquire (free or expired; epoch + 1)
//!    ┌──────┐ ─────────────────────────────────────────▶ ┌──────┐
//!    │ free │                                             │ held │──┐ renew every lease_renew
//!    └──────┘ ◀──── release (owner and epoch match) ───── └──────┘◀─┘ (owner and epoch match)
//!        ▲                                                 │   │
//!        │ lease_until passes, another worker acquires     │   │ renew matched nothing,
//!        └──────────────── (epoch + 1) ◀───────────────────┘   │ or the trust deadline passed
//!                                                              ▼
//!                                                        ┌──────────┐
//!                                                        │ lost     │ drainer stops; every later
//!                                                        │ (local)  │ write of it matches 0 rows
//!                                                        └──────────┘
//! ```
//!
//! **Fencing argument (G3).** A worker may publish bucket `b` only while it
//! trusts its lease `(b, owner, epoch)`:
//!
//! 1. *Trust deadline.* A renew that *started* at local monotonic instant `t`
//!    and succeeded proves the database set `lease_until >= t + lease_ttl` (the
//!    database ran the statement after `t`). The worker trusts the lease until
//!    `t + lease_ttl - margin` and sends nothing for `b` past that instant —
//!    each publish checks it. Monotonic time keeps running while a process is
//!    stopped, so a worker resumed after SIGSTOP finds its trust expired.
//! 2. *Takeover only after expiry.* Another worker acquires `b` only when
//!    `lease_until <= now()` on the database clock, i.e. after the first
//!    worker's trust ended (up to the margin, which absorbs clock-rate drift
//!    and the time between a check and a send).
//! 3. *Fenced writes.* Every claim and every `published_at` / failure write
//!    carries `(partition_key, lease_owner, lease_epoch)` in its `WHERE`; the
//!    takeover bumped the epoch, so anything the old owner still writes
//!    matches 0 rows. The new owner also drops the old owner's claims, so
//!    they do not hold the bucket up until `claim_ttl`.
//!
//! 4. *Gated sends.* RabbitMQ cannot check a fencing token, and frames
//!    already handed to the AMQP client when a process stalls would be
//!    written by the client's I/O thread the moment it resumes, before any
//!    of our code runs. So every socket write of the AMQP connection passes
//!    a gate ([`crate::amqp::gate`]) that refuses it while a batch in
//!    flight holds a lapsed trust: the connection drops and the buffered
//!    frames with it. Only bytes already in the kernel's socket buffer get
//!    out, and the kernel sends those while the process is stopped — before
//!    the trust deadline, so before the lease can end. The one exception is
//!    a pause that lands between the gate's check and the write it allowed:
//!    those frames go out after the pause, are reported as an error, and
//!    cost a late duplicate, never a gap or a reordering of first deliveries
//!    ([`crate::amqp::gate`]).
//!
//! 5. *Bounded waits.* Every database call of a worker fails after
//!    `database.query_timeout`, and a connection whose peer went silent is
//!    declared dead within `dead_peer_timeout` ([`crate::net`]). A renew
//!    given up that way may still have been applied by the database: that
//!    is harmless, since trust is only ever extended by a renew whose
//!    success the worker saw (point 1), and a lease extended behind its
//!    back merely expires `lease_ttl` after that renew — the others wait
//!    for it, which delays a takeover but never makes two owners. The same
//!    holds for an acquire abandoned at shutdown: no drainer ever ran under
//!    it, and it expires.
//! 6. *Stepping aside.* A worker that cannot reach the broker for longer
//!    than `broker_grace` stops its drainers and releases their leases
//!    (owner and epoch must match) only once each drainer has ended, so
//!    nothing of it is in flight when another worker acquires the bucket
//!    under a higher epoch.
//! 7. *Settled before released.* A released lease tells its next owner
//!    that everything sent under it was recorded (`LeaseGrant::was_free`):
//!    a de-duplicating sink (a stream) then takes an unrecorded row below
//!    what the broker stored for a row that committed late, and sends it.
//!    So a lease under which rows went to such a sink and are not all
//!    recorded — a batch whose confirm never came, a record that failed —
//!    is not released but left to expire ([`Trust::is_settled`]): its next
//!    owner then counts those rows as sent. A lease taken over after it
//!    expired inherits that doubt: it is unsettled from the start, until
//!    its drainer finds the bucket with no pending row at all (a row the
//!    earlier owner sent and left unrecorded was pending, so this drainer
//!    has recorded it since); given up before that, it is left to expire
//!    too. Finding no *ready* row is not enough: a head the earlier owner
//!    put in backoff (a batch whose confirm never came, its rows perhaps
//!    stored) hides the rows behind it from every claim.
//!
//! Hence a row's state is only ever recorded by the worker that held the
//! bucket's lease, and nothing reaches the broker from a worker after its
//! trust in the lease ended (`tests/fleet.rs` stops a worker with SIGSTOP
//! for 3 × lease_ttl and asserts that nothing under its lost leases arrives
//! after SIGCONT).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::outbox::Fence;

/// Until when a lease may be trusted, on the local monotonic clock. Shared
/// by the coordinator (which extends it on every successful renew) and the
/// bucket's drainer (which checks it before every claim and every send).
#[derive(Debug)]
pub struct Trust {
    base: Instant,
    until_nanos: AtomicU64,
    /// The lease it is for, as "bucket epoch N" — for reports.
    lease: String,
    /// False while rows sent under it to a de-duplicating sink are not
    /// all recorded (point 7 above).
    settled: AtomicBool,
}

impl Trust {
    pub fn new(until: Instant, bucket: &str, epoch: i64) -> Self {
        let base = Instant::now();
        let t = Self {
            base,
            until_nanos: AtomicU64::new(0),
            lease: format!("{bucket} epoch {epoch}"),
            settled: AtomicBool::new(true),
        };
        t.set(until);
        t
    }

    /// The lease this trust is for: "bucket epoch N".
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// Moves the deadline (renewals only ever push it later).
    pub fn set(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.base).as_nanos() as u64;
        self.until_nanos.fetch_max(nanos, Ordering::AcqRel);
    }

    /// Ends trust now (the lease is known lost).
    pub fn revoke(&self) {
        self.until_nanos.store(0, Ordering::Release);
    }

    pub fn until(&self) -> Instant {
        self.base + Duration::from_nanos(self.until_nanos.load(Ordering::Acquire))
    }

    pub fn is_valid(&self) -> bool {
        Instant::now() < self.until()
    }

    /// Whether the lease may be released: every row its drainer sent to a
    /// de-duplicating sink was recorded (point 7 above). Otherwise the
    /// coordinator leaves it to expire.
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Set by the drainer: false from before it sends such rows until they
    /// are recorded.
    pub fn set_settled(&self, settled: bool) {
        self.settled.store(settled, Ordering::Release);
    }
}

/// What a drainer publishes under in fleet mode.
#[derive(Debug, Clone)]
pub struct LeaseGrant {
    pub fence: Fence,
    pub trust: Arc<Trust>,
    /// The lease was free when taken: its previous owner (if any)
    /// released it, after recording what it had sent; not taken over
    /// from an expired lease.
    pub was_free: bool,
}

/// The trust deadline after a lease statement that started at `started`.
pub fn trust_deadline(started: Instant, lease_ttl: Duration) -> Instant {
    started + lease_ttl.saturating_sub(safety_margin(lease_ttl))
}

/// A tenth of the TTL, at least 500 ms: room for clock-rate drift and for
/// the gap between checking the deadline and a frame leaving the socket.
pub fn safety_margin(lease_ttl: Duration) -> Duration {
    (lease_ttl / 10).max(Duration::from_millis(500))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trust_only_moves_forward_until_revoked() {
        let now = Instant::now();
        let t = Trust::new(now + Duration::from_secs(10), "p00", 1);
        assert!(t.is_valid());
        t.set(now + Duration::from_secs(5));
        assert_eq!(t.until(), now + Duration::from_secs(10));
        t.revoke();
        assert!(!t.is_valid());
    }

    #[test]
    fn the_deadline_keeps_a_margin_before_the_lease_ends() {
        let start = Instant::now();
        assert_eq!(
            trust_deadline(start, Duration::from_secs(15)),
            start + Duration::from_millis(13_500)
        );
        assert_eq!(
            trust_deadline(start, Duration::from_secs(3)),
            start + Duration::from_millis(2_500)
        );
    }
}
