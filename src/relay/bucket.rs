//! One bucket's drain loop: claim → publish → record, strictly in `id` order,
//! with the database and the broker working at the same time.
//!
//! ```text
//!            ┌──────────── wake (NOTIFY / poll / safety-net poll) ──────┐
//!            ▼                                                          │
//!   [wait while broker blocked] → record previous batch ∥ claim ─ empty ─┘
//!                                     │ batch N (id order)
//!                                     ▼
//!        ┌─ broker: publish N in order, await its confirms in order
//!        └─ database, meanwhile, at once: record N-1; claim N+1 (skipping
//!           N-1's and N's rows)
//!                                     │
//!        all of N confirmed ──────────┼──── row k of N failed
//!              │                      │            │
//!   N+1 is the next batch;            │   prefix of N recorded, row k:
//!   N is recorded during N+1          │   attempts+1, last_error,
//!              └────── next round ◄───┘   available_at += backoff;
//!                                         N+1 dropped unsent
//! ```
//!
//! N+1 is read ahead only when N was a full batch (a trickle of short
//! batches costs no extra claim per message); after a short batch, while
//! `LISTEN` announces every committed row, the next round records N alone
//! unless a row of the bucket was announced meanwhile (a claim would find
//! nothing else: one claim per trickled message, not two). Batch N+1 is
//! sent only once every row of N is confirmed, so reading it ahead changes
//! nothing about order: a failed row still stops everything behind it.
//! The claim that reads N+1 skips exactly the rows of N and of N-1, whose
//! record runs beside it (not every id below N's last): a row with a lower
//! id that committed late is taken at its place, ahead of the rows after
//! it.
//!
//! A claim asks for `batch_size` rows, or `stream_batch_size` after a
//! batch whose every row went to a stream ([`BucketDrainer::batch_limit`]);
//! a batch is *full* when it holds as many rows as its claim asked for.
//!
//! After a failure the bucket is *careful*: it claims one row at a time,
//! without reading ahead, until one succeeds, so a failing head is retried
//! alone and nothing queues up in flight behind it. The failed row keeps its
//! place as the head: the claim only takes a ready prefix, so rows behind a
//! head that waits for its backoff are not claimed. Other buckets are
//! unaffected.
//!
//! The drainer holds the bucket's claim under one token for its lifetime
//! (`store::outbox`), records what is confirmed before it idles or stops,
//! and hands the claim back when it stops.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::spans::{self, BatchTimes};
use super::wakeups::BucketWakeup;
use super::{Drain, RelayContext};
use crate::backoff::Backoff;
use crate::lease::LeaseGrant;
use crate::logs::Visible;
use crate::sink::{BatchOutcome, PublishError, PublishLimits, Session};
use crate::store::StoreError;
use crate::store::outbox::{
    Claim, ClaimToken, ClaimedMessage, Failure, FailurePolicy, FailureRecord, Fence, Holder,
};

/// Drains one bucket until cancelled, or (with [`Drain::UntilEmpty`]) until
/// nothing in it is ready.
///
/// In fleet mode it holds a [`LeaseGrant`]: it claims only while the lease is
/// trusted, stops sending at the trust deadline, and every write carries the
/// lease fence (see `crate::lease` for the argument).
pub(crate) struct BucketDrainer {
    pub partition_key: String,
    pub lease: Option<LeaseGrant>,
    fence: Option<Fence>,
    pub ctx: Arc<RelayContext>,
    pub wake: BucketWakeup,
    pub cancel: CancellationToken,
    /// This drainer's way to the broker (`crate::sink`).
    session: Option<Box<dyn Session>>,
    careful: bool,
    /// This drainer's claim on the bucket (one token for its lifetime).
    token: ClaimToken,
    /// Until when this drainer holds that claim with `claim_min_left` to
    /// spare, as far as it knows: `claim_ttl - claim_min_left` after the
    /// start of the last claim that took or renewed it. Until then a claim
    /// is a read alone (`store::outbox::Claim::held`).
    held_until: Mutex<Option<Instant>>,
    /// The next batch, read while the current one was being confirmed,
    /// and how many rows its claim asked for.
    next: Option<(Vec<ClaimedMessage>, u32)>,
    /// Every row of the last batch went to a stream, and no claim has
    /// found the bucket empty since: the next claim asks for
    /// `stream_batch_size` rows instead of `batch_size`.
    streaming: bool,
    /// Ids of the last confirmed batch, recorded during the next round.
    unrecorded: Option<Vec<i64>>,
    /// The highest id sent to a de-duplicating sink under the lease, and
    /// the highest recorded (published, or refused by the broker): while
    /// the first is above the second the lease is not settled
    /// ([`crate::lease`], point 7).
    deduplicated_sent: i64,
    settled_up_to: AtomicI64,
    /// The lease was taken over after it expired, and its earlier owner
    /// may have sent rows to a de-duplicating sink without recording
    /// them: unsettled until the bucket has no pending row left
    /// ([`Self::end_inheritance`]).
    inherited: bool,
    /// The last claim found fewer rows than it asked for, and all of them
    /// were confirmed: the bucket was drained as of that claim.
    drained: bool,
    /// When the head that last failed here is ready again: an idle wait
    /// ends then, whatever wakes the bucket meanwhile.
    retry_at: Option<tokio::time::Instant>,
    /// The relay's start gate (`super::STARTING_AT_ONCE`).
    gate: Arc<Semaphore>,
    /// Held from before this drainer's first statement until its first
    /// claim has answered.
    starting: Option<OwnedSemaphorePermit>,
}

impl BucketDrainer {
    pub fn new(
        partition_key: String,
        lease: Option<LeaseGrant>,
        ctx: Arc<RelayContext>,
        wake: BucketWakeup,
        cancel: CancellationToken,
        gate: Arc<Semaphore>,
    ) -> Self {
        let inherited = lease.as_ref().is_some_and(|l| !l.was_free) && ctx.sink.deduplicates_any();
        if let Some(lease) = lease.as_ref().filter(|_| inherited) {
            lease.trust.set_settled(false);
        }
        Self {
            partition_key,
            fence: lease.as_ref().map(|l| l.fence),
            lease,
            ctx,
            wake,
            cancel,
            session: None,
            careful: false,
            token: ClaimToken::new(),
            held_until: Mutex::new(None),
            next: None,
            streaming: false,
            unrecorded: None,
            deduplicated_sent: 0,
            settled_up_to: AtomicI64::new(0),
            inherited,
            drained: false,
            retry_at: None,
            gate,
            starting: None,
        }
    }

    pub async fn run(mut self, drain: Drain) {
        let mut db_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        self.starting = tokio::select! {
            permit = self.gate.clone().acquire_owned() => permit.ok(),
            () = self.cancel.cancelled() => return,
        };
        if !self.clear_earlier_claims().await {
            return;
        }
        while !self.cancel.is_cancelled() {
            if !self.wait_until_unblocked().await {
                break;
            }
            if !self.trusted() {
                // The coordinator either renews the lease (trust returns) or
                // finds it lost and stops this drainer.
                if drain == Drain::UntilEmpty {
                    break;
                }
                self.sleep(Duration::from_millis(100)).await;
                continue;
            }
            match self.step().await {
                Ok(Step::Worked) => db_backoff.reset(),
                Ok(Step::Idle) => {
                    db_backoff.reset();
                    if drain == Drain::UntilEmpty {
                        break;
                    }
                    self.idle_wait().await;
                }
                Ok(Step::Cancelled) => break,
                Err(e) => {
                    let delay = db_backoff.pause();
                    tracing::warn!(bucket = %self.partition_key, error = %e, retry_in = ?delay, "database unavailable");
                    if drain == Drain::UntilEmpty && !e.is_transient() {
                        break;
                    }
                    self.sleep(delay).await;
                }
            }
        }
        self.flush_record().await;
        self.release_claim().await;
        if let Some(session) = self.session.take() {
            session.close(None).await;
        }
    }

    /// Hands the bucket's claim back on the way out, so that the bucket's
    /// next drainer (this worker's after a lease move back, or a restarted
    /// `--no-leasing` worker) need not wait for it to expire. Best effort:
    /// an unreleased claim lapses after `claim_ttl`.
    async fn release_claim(&self) {
        let release = self
            .ctx
            .store
            .release_claim(&self.partition_key, self.token);
        if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(2), release).await {
            tracing::debug!(bucket = %self.partition_key, error = %e, "could not release the bucket's claim");
        }
    }

    /// What this drainer's writes are checked against.
    fn holder(&self) -> Holder<'_> {
        Holder {
            partition_key: &self.partition_key,
            token: self.token,
            fence: self.fence,
            published: self.ctx.settings.published,
        }
    }

    fn trusted(&self) -> bool {
        self.lease.as_ref().is_none_or(|l| l.trust.is_valid())
    }

    /// A new lease owner first drops the claims earlier owners left behind
    /// (fenced by its own lease). False when cancelled first.
    async fn clear_earlier_claims(&self) -> bool {
        let Some(fence) = self.fence else { return true };
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            match self
                .ctx
                .store
                .clear_claims(&self.partition_key, fence)
                .await
            {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(bucket = %self.partition_key, claims = n, "dropped claims of an earlier lease");
                    }
                    return true;
                }
                Err(e) => {
                    let delay = backoff.pause();
                    tracing::warn!(bucket = %self.partition_key, error = %e, retry_in = ?delay, "cannot clear earlier claims");
                    self.sleep(delay).await;
                    // Only cancellation ends this: a lapsed trust may come
                    // back with the database (the coordinator cancels the
                    // drainer if the lease is lost), and a drainer that
                    // gave up here left its bucket owned and undrained.
                    if self.cancel.is_cancelled() {
                        return false;
                    }
                }
            }
        }
    }

    /// One round: publish a batch, and meanwhile record the previous one
    /// and claim the next.
    async fn step(&mut self) -> Result<Step, StoreError> {
        let Some(session) = self.usable_session().await else {
            return Ok(Step::Cancelled);
        };
        let (rows, asked) = match self.next.take() {
            Some((rows, asked)) if !rows.is_empty() => (rows, asked),
            _ => match self.record_and_claim().await {
                Ok(claimed) => claimed,
                Err(e) => {
                    self.session = Some(session);
                    return Err(e);
                }
            },
        };
        if rows.is_empty() {
            self.streaming = false;
            self.end_inheritance().await;
            self.session = Some(session);
            return Ok(Step::Idle);
        }
        self.ctx.stats.add_claimed(rows.len());
        // Asked of each row only when some row may go where the broker
        // keeps ids: a sink of queues alone answers no for every row.
        let deduplicates_any = self.ctx.sink.deduplicates_any();
        self.streaming = deduplicates_any && rows.iter().all(|r| self.ctx.sink.deduplicates(r));

        let limits = PublishLimits {
            max_payload_bytes: self.ctx.settings.max_payload_bytes,
            stop_sending_at: self.lease.as_ref().map(|l| l.trust.until()),
            lease_epoch: self.fence.map(|f| f.epoch),
            trust: self.lease.as_ref().map(|l| l.trust.clone()),
            lease_was_free: self.lease.as_ref().is_some_and(|l| l.was_free),
        };
        let last_deduplicated = if deduplicates_any {
            rows.iter().rev().find(|r| self.ctx.sink.deduplicates(r))
        } else {
            None
        };
        if let Some(last) = last_deduplicated {
            self.deduplicated_sent = self.deduplicated_sent.max(last.id);
            self.settle(0);
        }
        let mut session = session;
        let wall_start = SystemTime::now();
        let publish = async {
            let started = Instant::now();
            let outcome = session.send(&rows, limits).await;
            self.ctx.stats.publish_latency.observe(started.elapsed());
            outcome
        };
        // While the broker confirms this batch, the database records the
        // previous one and, at the same time, reads the next (skipping the
        // rows of both). The next batch is only sent once this one is wholly
        // confirmed, so nothing overtakes a row that fails. Nothing is read
        // ahead after a careful (one-row) round, nor after a batch shorter
        // than the limit: only a full batch suggests more is ready, and a
        // trickle then costs no extra claim per message.
        let previous = self.unrecorded.take();
        let read_ahead = !self.careful && rows.len() >= asked as usize;
        let database = async {
            let record = async {
                match &previous {
                    Some(ids) => self.record_published(ids).await,
                    None => true,
                }
            };
            if !read_ahead {
                record.await;
                return None;
            }
            // The record of N-1 and the read of N+1 at once, on two
            // connections: the read skips N-1's rows as well as N's, since
            // the record may not have committed when it runs; N+1 is kept
            // only if every row of N-1 was recorded.
            let skip: Vec<i64> = previous
                .iter()
                .flatten()
                .copied()
                .chain(rows.iter().map(|r| r.id))
                .collect();
            let limit = self.batch_limit();
            let claim = self.claim(limit, &skip);
            let (recorded, next) = tokio::join!(record, claim);
            next.ok().filter(|_| recorded).map(|rows| (rows, limit))
        };
        let (outcome, next) = tokio::join!(publish, database);
        self.trace(&rows, &outcome, wall_start);
        let ids: Vec<i64> = rows[..outcome.confirmed].iter().map(|r| r.id).collect();
        match outcome.failure {
            None => {
                self.unrecorded = Some(ids);
                // (A careful round asked for one row only.)
                self.drained = !self.careful && rows.len() < asked as usize;
                self.next = next;
                self.careful = false;
                self.session = Some(session);
            }
            Some(failure) => {
                // What was read ahead is dropped unsent: the failed row
                // stays the head and everything behind it waits.
                let failed = &rows[outcome.confirmed];
                if let Some(backoff) = self.record_failure(&ids, failed, &failure).await {
                    self.retry_at = Some(tokio::time::Instant::now() + backoff + RETRY_MARGIN);
                }
                self.careful = true;
                // After a refusal the session may still be fine, but later
                // rows of the batch may have been confirmed on it: the
                // replay starts on a fresh session, as after a timeout.
                session.close(Some(&failure)).await;
                if matches!(failure, PublishError::Unavailable(_)) {
                    self.sleep(Duration::from_millis(200)).await;
                }
                if matches!(failure, PublishError::LeaseLapsed) {
                    // Keep the batch size: this was not the row's fault.
                    self.careful = false;
                }
            }
        }
        Ok(Step::Worked)
    }

    /// This drainer's session, or a fresh one in place of a stale one;
    /// `None` when cancelled while the broker is away.
    async fn usable_session(&mut self) -> Option<Box<dyn Session>> {
        match self.session.take() {
            Some(session) if session.is_usable() => Some(session),
            stale => {
                if let Some(session) = stale {
                    session.close(None).await;
                }
                self.ctx.sink.open(&self.cancel).await
            }
        }
    }

    /// Hands the batch's spans to the tracer (when export is on).
    fn trace(&self, rows: &[ClaimedMessage], outcome: &BatchOutcome, started: SystemTime) {
        if !self.ctx.tracer.enabled() {
            return;
        }
        let times = BatchTimes {
            started,
            ended: SystemTime::now(),
            lease_epoch: self.fence.map(|f| f.epoch),
        };
        let failure = outcome.failure.as_ref();
        let spans = spans::of_batch(rows, outcome.confirmed, failure, &times);
        self.ctx.tracer.record(spans);
    }

    /// How many rows the next claim asks for: one while careful, and while
    /// the bucket's rows go to streams `stream_batch_size`. A drain into a
    /// stream is bound by the database, whose cost is much of it per
    /// statement, not by the broker: larger claims pay there (BENCHMARKS.md,
    /// section 15). The first batch after a start, after the bucket was
    /// found drained, or after one with a row for a queue, is `batch_size`.
    fn batch_limit(&self) -> u32 {
        let settings = &self.ctx.settings;
        if self.careful {
            1
        } else if self.streaming {
            settings.stream_batch_size
        } else {
            settings.batch_size
        }
    }

    /// Claims up to `limit` ready rows of the bucket, skipping `in_flight`.
    async fn claim(
        &self,
        limit: u32,
        in_flight: &[i64],
    ) -> Result<Vec<ClaimedMessage>, StoreError> {
        let started = Instant::now();
        let held_until = *self.held_until.lock().expect("never poisoned");
        let held = held_until.is_some_and(|until| started < until);
        let settings = &self.ctx.settings;
        let rows = self
            .ctx
            .store
            .claim(Claim {
                holder: self.holder(),
                limit,
                claim_ttl: settings.claim_ttl,
                min_left: settings.claim_min_left,
                in_flight,
                held,
            })
            .await;
        self.ctx.stats.claim_latency.observe(started.elapsed());
        // A claim made without the belief that returns rows took or renewed
        // the claim, for claim_ttl from (no earlier than) `started`.
        if !held && rows.as_ref().is_ok_and(|r| !r.is_empty()) {
            let spare = settings.claim_ttl.saturating_sub(settings.claim_min_left);
            *self.held_until.lock().expect("never poisoned") = Some(started + spare);
        }
        rows
    }

    /// A round's batch when nothing was claimed ahead: the previous batch's
    /// record and the claim at once (an idle bucket leaves nothing
    /// unrecorded). The claim skips the rows being recorded; if they could
    /// not be recorded they are pending again, and are claimed anew, ahead
    /// of what follows them. After a short batch, while notifications
    /// announce every row, the record runs alone unless a row was announced
    /// meanwhile: a trickle costs one claim per message, not two.
    async fn record_and_claim(&mut self) -> Result<(Vec<ClaimedMessage>, u32), StoreError> {
        let limit = self.batch_limit();
        let previous = self.unrecorded.take().unwrap_or_default();
        if std::mem::take(&mut self.drained) && !self.wake.may_have_more() {
            if self.record_published(&previous).await {
                return Ok((Vec::new(), limit));
            }
            return Ok((self.claim(limit, &[]).await?, limit));
        }
        let record = async { self.record_published(&previous).await };
        let (recorded, claimed) = tokio::join!(record, self.claim(limit, &previous));
        self.starting = None;
        let rows = match claimed {
            Ok(_) if !recorded => self.claim(limit, &[]).await,
            claimed => claimed,
        };
        Ok((rows?, limit))
    }

    /// Counts rows up to `id` as recorded, and tells the lease whether
    /// everything sent to a de-duplicating sink under it is.
    fn settle(&self, id: i64) {
        let up_to = self.settled_up_to.fetch_max(id, Ordering::AcqRel).max(id);
        if let Some(lease) = &self.lease {
            lease
                .trust
                .set_settled(!self.inherited && up_to >= self.deduplicated_sent);
        }
    }

    /// After a claim that found nothing: an inherited doubt ends when the
    /// bucket has no pending row at all, as the database saw it under a
    /// lease that was still ours (the trust outlives the read only if the
    /// lease did, `crate::lease`). Whatever an earlier owner sent and left
    /// unrecorded was pending, so it has been recorded since, by this
    /// drainer. An empty claim alone does not say it: a head in backoff
    /// (the earlier owner's batch failed, its rows perhaps stored) hides
    /// every row behind it from the claim.
    async fn end_inheritance(&mut self) {
        if !self.inherited {
            return;
        }
        let heads = self
            .ctx
            .store
            .bucket_heads(std::slice::from_ref(&self.partition_key))
            .await;
        let empty = matches!(&heads, Ok(heads) if heads.iter().all(|h| h.id.is_none()));
        if empty && self.trusted() {
            self.inherited = false;
            self.settle(0);
        }
    }

    /// Records the last confirmed batch, if it is not recorded yet.
    async fn flush_record(&mut self) {
        if let Some(ids) = self.unrecorded.take() {
            self.record_published(&ids).await;
        }
    }

    /// Records the confirmed rows, retrying while the database is away: a
    /// confirmed row that is not recorded is published again later. True
    /// when every row was recorded.
    async fn record_published(&self, ids: &[i64]) -> bool {
        if ids.is_empty() {
            return true;
        }
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            let started = Instant::now();
            let recorded = self.ctx.store.record_published(self.holder(), ids).await;
            self.ctx.stats.record_latency.observe(started.elapsed());
            match recorded {
                Ok(n) => {
                    if n as usize == ids.len() {
                        self.settle(ids.iter().copied().max().unwrap_or(0));
                    }
                    self.ctx
                        .stats
                        .add_published(&self.partition_key, n as usize);
                    self.ctx.stats.add_fenced(ids.len() - n as usize);
                    if (n as usize) < ids.len() {
                        tracing::warn!(bucket = %self.partition_key, confirmed = ids.len(), recorded = n,
                            "some confirmed rows were no longer ours to record (claim or lease lost); they will be published again");
                    }
                    return n as usize == ids.len();
                }
                Err(e) if self.cancel.is_cancelled() || !e.is_transient() => {
                    tracing::error!(bucket = %self.partition_key, error = %e, rows = ids.len(),
                        "could not record published rows; they will be published again");
                    // A record that keeps failing would otherwise send the
                    // same rows again at once, round after round.
                    self.sleep(UNRECORDED_PAUSE).await;
                    return false;
                }
                Err(e) => {
                    let delay = backoff.pause();
                    tracing::warn!(bucket = %self.partition_key, error = %e, retry_in = ?delay, "recording published rows failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Records the confirmed prefix of a batch and its failed row; the
    /// failed row's backoff when it stays the head, to wait out.
    async fn record_failure(
        &self,
        confirmed: &[i64],
        failed: &ClaimedMessage,
        failure: &PublishError,
    ) -> Option<Duration> {
        let error = failure.to_string();
        let counted = failure.counts_attempt().then(|| Failure {
            id: failed.id,
            error: &error,
            policy: FailurePolicy {
                max_attempts: self.ctx.settings.max_attempts,
                may_park: failure.is_rows_fault(),
                backoff_initial_ms: self.ctx.settings.retry_backoff_initial.as_millis() as f64,
                backoff_max_ms: self.ctx.settings.retry_backoff.as_millis() as f64,
            },
        });
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            let result = if counted.is_none() && confirmed.is_empty() {
                Ok(FailureRecord::default())
            } else {
                self.ctx
                    .store
                    .record_failure(self.holder(), confirmed, counted)
                    .await
            };
            match result {
                Ok(FailureRecord { published, parked }) => {
                    // A refused row is not in the broker; rows after it
                    // may be, and stay unsettled until recorded.
                    if published as usize == confirmed.len() {
                        let refused = failure.is_rows_fault().then_some(failed.id);
                        self.settle(confirmed.iter().copied().chain(refused).max().unwrap_or(0));
                    }
                    self.ctx
                        .stats
                        .add_published(&self.partition_key, published as usize);
                    self.ctx
                        .stats
                        .add_fenced(confirmed.len() - published as usize);
                    if failure.counts_attempt() && parked.is_none() {
                        self.ctx.stats.add_fenced(1);
                    }
                    if failure.counts_attempt() {
                        self.ctx.stats.add_failed(1);
                    }
                    if parked == Some(true) {
                        self.ctx.stats.add_parked(1);
                        tracing::error!(bucket = %self.partition_key, id = failed.id, message_key = %Visible(&failed.message_key),
                            attempts = failed.attempts + 1, error = %Visible(&error.to_string()),
                            "row parked after its last allowed attempt; requeue it once the cause is fixed");
                    } else if failure.counts_attempt() {
                        tracing::warn!(bucket = %self.partition_key, id = failed.id, message_key = %Visible(&failed.message_key),
                            attempts = failed.attempts + 1, error = %Visible(&error.to_string()),
                            "publish failed; the row stays the head of its bucket and is retried after a backoff");
                    } else {
                        tracing::warn!(bucket = %self.partition_key, error = %error, "broker unavailable; the rest of the batch is sent again later");
                    }
                    return match (counted, parked) {
                        (Some(f), Some(false)) => Some(f.policy.backoff_after(failed.attempts)),
                        _ => None,
                    };
                }
                Err(e) if self.cancel.is_cancelled() || !e.is_transient() => {
                    tracing::error!(bucket = %self.partition_key, error = %e,
                        "could not record a failed publish; the claim lapses after outbox.claim_ttl and the batch is replayed");
                    return None;
                }
                Err(e) => {
                    let delay = backoff.pause();
                    tracing::warn!(bucket = %self.partition_key, error = %e, retry_in = ?delay, "recording a failure failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Waits while the broker blocks publishing. False when cancelled.
    async fn wait_until_unblocked(&self) -> bool {
        let mut blocked = self.ctx.sink.blocked();
        loop {
            if blocked.borrow_and_update().is_none() {
                return true;
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return false,
                changed = blocked.changed() => if changed.is_err() { return true },
            }
        }
    }

    /// Waits for the bucket's wake-up — a notification, a poll, or the
    /// worker's safety-net poll ([`super::wakeups`]) — or for the head that
    /// failed here to be ready again: its retry is timed here, not left to
    /// the safety net, which backs off on an idle worker.
    async fn idle_wait(&mut self) {
        let retry = async {
            match self.retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            _ = self.wake.notified() => {}
            _ = retry => {}
        }
        if self
            .retry_at
            .is_some_and(|at| at <= tokio::time::Instant::now())
        {
            self.retry_at = None;
        }
    }

    async fn sleep(&self, d: Duration) {
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }
}

enum Step {
    Worked,
    Idle,
    Cancelled,
}

/// How long after a failed head's backoff its drainer claims it: the
/// database's clock started the backoff a little before this one did, and
/// SQLite rounds it to the millisecond.
const RETRY_MARGIN: Duration = Duration::from_millis(5);

/// How long a drainer waits after a batch it could not record (an error
/// retrying would not fix) before its rows are claimed and sent again: one
/// repeat a second at most, whatever the error.
const UNRECORDED_PAUSE: Duration = Duration::from_secs(1);
