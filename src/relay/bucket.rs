//! One bucket's drain loop: claim → publish → record, strictly in `id` order.
//!
//! ```text
//!            ┌──────────── wake (NOTIFY) / idle_backoff ────────────┐
//!            ▼                                                      │
//!   [wait while broker blocked] → claim ready prefix ── empty ──────┘
//!                                     │ rows (id order)
//!                                     ▼
//!                     publish in order, await confirms in order
//!                                     │
//!        all confirmed ───────────────┼──── row k failed
//!              │                      │            │
//!   record published (fenced)         │   prefix published, row k: attempts+1,
//!              │                      │   last_error, available_at += backoff,
//!              └────── next batch ◄───┘   rest of the claim handed back
//! ```
//!
//! After a failure the bucket is *careful*: it claims one row at a time until
//! one succeeds, so a failing head is retried alone and nothing queues up in
//! flight behind it. The failed row keeps its place as the head: the claim
//! only takes a ready prefix, so rows behind a head that waits for its
//! backoff are not claimed. Other buckets are unaffected.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::wakeups::BucketWakeup;
use super::{Drain, RelayContext};
use crate::amqp::{ConfirmChannel, PublishError, PublishLimits};
use crate::coordinator::lease::LeaseGrant;
use crate::store::StoreError;
use crate::store::outbox::{
    ClaimToken, ClaimedMessage, FailurePolicy, Fence, record_partial_failure,
};

/// Drains one bucket until cancelled, or (with [`Drain::UntilEmpty`]) until
/// nothing in it is ready.
///
/// In fleet mode it holds a [`LeaseGrant`]: it claims only while the lease is
/// trusted, stops sending at the trust deadline, and every write carries the
/// lease fence (see `coordinator::lease` for the argument).
pub(crate) struct BucketDrainer {
    pub partition_key: String,
    pub lease: Option<LeaseGrant>,
    fence: Option<Fence>,
    pub ctx: Arc<RelayContext>,
    pub wake: BucketWakeup,
    pub cancel: CancellationToken,
    channel: Option<ConfirmChannel>,
    careful: bool,
}

impl BucketDrainer {
    pub fn new(
        partition_key: String,
        lease: Option<LeaseGrant>,
        ctx: Arc<RelayContext>,
        wake: BucketWakeup,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            partition_key,
            fence: lease.as_ref().map(|l| l.fence),
            lease,
            ctx,
            wake,
            cancel,
            channel: None,
            careful: false,
        }
    }

    pub async fn run(mut self, drain: Drain) {
        let mut db_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
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
                    let delay = db_backoff.next();
                    tracing::warn!(bucket = %self.partition_key, error = %e, retry_in = ?delay, "database unavailable");
                    if drain == Drain::UntilEmpty && !e.is_transient() {
                        break;
                    }
                    self.sleep(delay).await;
                }
            }
        }
        if let Some(channel) = self.channel.take() {
            channel.close().await;
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
                .tables
                .outbox
                .clear_claims(&self.ctx.store.pool, &self.partition_key, fence)
                .await
            {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(bucket = %self.partition_key, claims = n, "dropped claims of an earlier lease");
                    }
                    return true;
                }
                Err(e) => {
                    let delay = backoff.next();
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

    /// One claim-publish-record round.
    async fn step(&mut self) -> Result<Step, StoreError> {
        let channel = match self.channel.take() {
            Some(ch) if ch.is_usable() => ch,
            stale => {
                if let Some(ch) = stale {
                    ch.close().await;
                }
                match self.ctx.broker.open_channel(&self.cancel).await {
                    Some(ch) => ch,
                    None => return Ok(Step::Cancelled),
                }
            }
        };
        let settings = &self.ctx.settings;
        let limit = if self.careful { 1 } else { settings.batch_size };
        let token = ClaimToken::new();
        let claim_started = std::time::Instant::now();
        let rows = self
            .ctx
            .store
            .tables
            .outbox
            .claim(
                &self.ctx.store.pool,
                &self.partition_key,
                limit,
                token,
                settings.claim_ttl.as_millis() as u64,
                self.fence,
            )
            .await;
        self.ctx
            .stats
            .claim_latency
            .observe(claim_started.elapsed());
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                self.channel = Some(channel);
                return Err(e);
            }
        };
        if rows.is_empty() {
            self.channel = Some(channel);
            return Ok(Step::Idle);
        }
        self.ctx.stats.add_claimed(rows.len());

        let limits = PublishLimits {
            max_payload_bytes: settings.max_payload_bytes,
            stop_sending_at: self.lease.as_ref().map(|l| l.trust.until()),
            lease_epoch: self.fence.map(|f| f.epoch),
            trust: self.lease.as_ref().map(|l| l.trust.clone()),
        };
        let publish_started = std::time::Instant::now();
        let mut channel = channel;
        let outcome = channel.publish_batch(&rows, limits).await;
        self.ctx
            .stats
            .publish_latency
            .observe(publish_started.elapsed());
        let ids: Vec<i64> = rows[..outcome.confirmed].iter().map(|r| r.id).collect();
        match outcome.failure {
            None => {
                self.record_published(&ids, token).await;
                self.careful = false;
                self.channel = Some(channel);
            }
            Some(failure) => {
                let failed = &rows[outcome.confirmed];
                self.record_failure(&ids, failed, &failure, token).await;
                self.careful = true;
                // After a nack or a return the channel is still fine, but
                // later rows of the batch may have been confirmed on it: start
                // the replay on a clean channel, as after a timeout.
                let generation = channel.generation();
                channel.close().await;
                if matches!(failure, PublishError::Timeout(_)) {
                    self.ctx.broker.abandon_node(generation).await;
                }
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

    /// Records the confirmed rows, retrying while the database is away: a
    /// confirmed row that is not recorded is published again later.
    async fn record_published(&self, ids: &[i64], token: ClaimToken) {
        let outbox = &self.ctx.store.tables.outbox;
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            match outbox
                .record_published(
                    &self.ctx.store.pool,
                    ids,
                    token,
                    &self.partition_key,
                    self.fence,
                )
                .await
            {
                Ok(n) => {
                    self.ctx.stats.add_published(n as usize);
                    self.ctx.stats.add_fenced(ids.len() - n as usize);
                    if (n as usize) < ids.len() {
                        tracing::warn!(bucket = %self.partition_key, confirmed = ids.len(), recorded = n,
                            "some confirmed rows were no longer ours to record (claim or lease lost); they will be published again");
                    }
                    return;
                }
                Err(e) if self.cancel.is_cancelled() || !e.is_transient() => {
                    tracing::error!(bucket = %self.partition_key, error = %e, rows = ids.len(),
                        "could not record published rows; they will be published again");
                    return;
                }
                Err(e) => {
                    let delay = backoff.next();
                    tracing::warn!(bucket = %self.partition_key, error = %e, retry_in = ?delay, "recording published rows failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    async fn record_failure(
        &self,
        confirmed: &[i64],
        failed: &ClaimedMessage,
        failure: &PublishError,
        token: ClaimToken,
    ) {
        let store = &self.ctx.store;
        let error = failure.to_string();
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            let result = async {
                let mut tx = store.begin().await?;
                let recorded = if failure.counts_attempt() {
                    let policy = FailurePolicy {
                        max_attempts: self.ctx.settings.max_attempts,
                        may_park: failure.is_rows_fault(),
                        backoff_initial_ms: self.ctx.settings.retry_backoff_initial.as_millis()
                            as f64,
                        backoff_max_ms: self.ctx.settings.retry_backoff.as_millis() as f64,
                    };
                    record_partial_failure(
                        &mut tx,
                        &store.tables.outbox,
                        confirmed,
                        failed.id,
                        &error,
                        policy,
                        token,
                        &self.partition_key,
                        self.fence,
                    )
                    .await?
                } else {
                    let outbox = &store.tables.outbox;
                    let published = if confirmed.is_empty() {
                        0
                    } else {
                        outbox
                            .record_published(
                                &mut tx,
                                confirmed,
                                token,
                                &self.partition_key,
                                self.fence,
                            )
                            .await?
                    };
                    outbox.release(&mut tx, token).await?;
                    (published, None)
                };
                tx.commit().await.map_err(|source| StoreError::Query {
                    doing: "committing a failure",
                    source,
                })?;
                Ok::<_, StoreError>(recorded)
            }
            .await;
            match result {
                Ok((published, parked)) => {
                    self.ctx.stats.add_published(published as usize);
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
                        tracing::error!(bucket = %self.partition_key, id = failed.id, message_key = %failed.message_key,
                            attempts = failed.attempts + 1, error = %error,
                            "row parked after its last allowed attempt; requeue it once the cause is fixed");
                    } else if failure.counts_attempt() {
                        tracing::warn!(bucket = %self.partition_key, id = failed.id, message_key = %failed.message_key,
                            attempts = failed.attempts + 1, error = %error,
                            "publish failed; the row stays the head of its bucket and is retried after a backoff");
                    } else {
                        tracing::warn!(bucket = %self.partition_key, error = %error, "broker unavailable; batch handed back");
                    }
                    return;
                }
                Err(e) if self.cancel.is_cancelled() || !e.is_transient() => {
                    tracing::error!(bucket = %self.partition_key, error = %e,
                        "could not record a failed publish; the claim lapses after outbox.claim_ttl and the batch is replayed");
                    return;
                }
                Err(e) => {
                    let delay = backoff.next();
                    tracing::warn!(bucket = %self.partition_key, error = %e, retry_in = ?delay, "recording a failure failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Waits while the broker blocks publishing. False when cancelled.
    async fn wait_until_unblocked(&self) -> bool {
        let mut blocked = self.ctx.broker.blocked();
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

    async fn idle_wait(&self) {
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(self.ctx.settings.idle_backoff) => {}
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

/// Exponential backoff between `min` and `max`.
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
        }
    }

    pub fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}
