//! The fleet coordinator of one worker: targets, leases, drainers.
//!
//! Each cycle (on a `NOTIFY` from a joining, leaving or releasing peer, or
//! every `POLL` while something is pending, every `IDLE_POLL` otherwise):
//!
//! 1. read the sorted live fleet-mode workers (less late ones without a
//!    valid lease: dead ones, retargeted once their leases can be taken — see
//!    [`WorkerStore::live_leasing`](crate::store::workers::WorkerStore::live_leasing))
//!    and compute this worker's target buckets ([`assignment`](super::assignment)).
//!    Where the peers' announcements arrive (`LISTEN`, or the workers
//!    table's fingerprint read with the poller's polls), the last read's
//!    targets serve until an announcement, a handover, or the first moment
//!    that read says a peer could be left out, `lease_renew` at most —
//!    where the fingerprint also marks late peers, until it changes
//!    ([`Fleet::targets`]);
//! 2. every `lease_renew`, renew every held lease (owner *and* epoch must
//!    match); a lease that did not renew is lost: its drainer is stopped and
//!    its trust revoked;
//! 3. stop the drainers of held buckets that are no longer targets; once a
//!    drainer has finished its in-flight batch, release the lease and
//!    announce it, so the new target owner takes it at once;
//! 4. acquire the target buckets not held (free or expired leases), and start
//!    a drainer for each under its [`LeaseGrant`].
//!
//! Steady state is quiet: renewals only, no lease changes. On shutdown every
//! drainer finishes its batch, every lease is released in one statement and
//! the peers are told, so they take the buckets over within a cycle.
//!
//! **A worker that cannot publish steps aside.** When the broker has been
//! unreachable for longer than `worker.broker_grace`, the worker marks its
//! row `can_publish = false` and tells the fleet: every worker (itself
//! included) leaves it out of the target computation, so it releases its
//! buckets after their in-flight batches and the others take them. When the
//! broker answers again it marks itself back and gets its share back the
//! same way. If *every* worker lost the broker, every one steps aside: no
//! bucket is leased and nothing is published (nothing could be) until the
//! first worker reaches the broker again and takes all the buckets; the
//! others rejoin as they recover. Only a change of reachability moves a
//! lease, so there is no release/reacquire loop. The same flag admits a
//! joining worker: it registers with `can_publish = false` and its first
//! cycle sets it, so peers hand buckets over only to a coordinator that
//! runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::RenewalBeats;
use super::assignment::{Assignment, targets};
use super::housekeeping::Housekeeping;
use crate::lease::{LeaseGrant, Trust, trust_deadline};
use crate::partitioner::Partitioner;
use crate::relay::wakeups::FleetSignal;
use crate::relay::{Drain, Relay};
use crate::sink::Reach;
use crate::store::outbox::Fence;
use crate::store::workers::suspect_after;
use crate::store::{Channel, Store};

/// How often a cycle runs while targets are not all held or buckets are
/// being handed over.
const POLL: Duration = Duration::from_millis(250);
/// How often a cycle runs at steady state: a membership check when one is
/// due, which bounds how late a dead peer's buckets are retargeted after its
/// leases lapsed (a second after is soon enough) and, where peers'
/// announcements do not arrive (no `LISTEN` — MariaDB, SQLite, a
/// transaction pooler without `listen_url` — and no fingerprint read by a
/// poll within `FLEET_LOOK_STANDS`: a worker that drains no bucket), how
/// late a join or a leave is noticed. (Every 500 ms there, until the checks
/// of 64 idle MariaDB workers were 128 of the database's statements a
/// second.)
const IDLE_POLL: Duration = Duration::from_secs(1);

/// How long a cycle in progress may still take on shutdown.
const CYCLE_ON_EXIT: Duration = Duration::from_secs(1);
/// How long releasing every lease may take on shutdown.
const RELEASE_ON_EXIT: Duration = Duration::from_secs(2);

/// The coordinator's share of the configuration.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    pub lease_ttl: Duration,
    pub lease_renew: Duration,
    pub heartbeat_ttl: Duration,
    pub broker_grace: Duration,
    pub assignment: Assignment,
    pub partitioner: Partitioner,
}

/// Announcements on the fleet channel.
pub mod announce {
    pub const JOIN: &str = "join";
    pub const LEAVE: &str = "leave";
    pub const RELEASE: &str = "release";
    pub const BROKER: &str = "broker";
}

struct Held {
    epoch: i64,
    trust: Arc<Trust>,
    cancel: CancellationToken,
    handle: JoinHandle<()>,
    /// Why the drainer was told to stop, once it was.
    stopping: Option<Stop>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// No longer a target: release once the drainer finished.
    Rebalance,
    /// The renew failed: the lease is not ours; nothing to release.
    Lost,
}

/// Logs a lease left to expire rather than released ([`crate::lease`],
/// point 7).
fn leave_to_expire(bucket: &str, epoch: i64) {
    tracing::info!(
        %bucket,
        epoch,
        "rows sent to a stream under this lease (or by its owner before, whose lease expired) may not all be recorded: it is left to expire, so that its next owner looks them up in the stream"
    );
}

/// One worker's coordinator.
pub struct Fleet {
    store: Store,
    relay: Arc<Relay>,
    me: Uuid,
    settings: FleetSettings,
    wake: FleetSignal,
    owned: watch::Sender<Vec<String>>,
    held: BTreeMap<String, Held>,
    /// Whether this worker takes part in the targets (it can publish).
    can_publish: bool,
    /// `can_publish`, for the worker's readiness probe.
    publishing: watch::Sender<bool>,
    /// `can_publish` as last written to the worker row (`None`: to write).
    recorded_can_publish: Option<bool>,
    /// The targets of the last membership read, while they stand.
    known: Option<Known>,
    /// A peer announced a change since the last membership read.
    announced: bool,
    /// Whether this worker does the fleet-wide chores (the dead-row
    /// cleanup here), set from every membership read.
    housekeeping: Housekeeping,
    /// Where a renewal that also beat is recorded for the heartbeat task.
    beats: RenewalBeats,
}

/// Targets from a membership read, and until when they stand without
/// another (see [`Fleet::targets`]).
struct Known {
    targets: BTreeSet<String>,
    until: Instant,
    /// Later than `until` while no peer was near being left out: how long
    /// the targets stand while the fingerprint watches for that
    /// ([`FleetSignal::lateness_watched`]).
    watched_until: Instant,
}

/// While the poller's fingerprint watches the peers' lateness, a membership
/// read stands for this many `lease_renew`s at most: nothing it depends on
/// can change unseen, so this is only a safety net.
const WATCHED_STANDS_RENEWS: u32 = 10;

impl Fleet {
    pub fn new(
        store: Store,
        relay: Arc<Relay>,
        me: Uuid,
        settings: FleetSettings,
        wake: FleetSignal,
        housekeeping: Housekeeping,
        beats: RenewalBeats,
    ) -> Self {
        Self {
            store,
            relay,
            me,
            settings,
            wake,
            owned: watch::channel(Vec::new()).0,
            held: BTreeMap::new(),
            can_publish: true,
            publishing: watch::channel(false).0,
            // The row says false until the first cycle records true.
            recorded_can_publish: None,
            known: None,
            announced: false,
            housekeeping,
            beats,
        }
    }

    /// The buckets this worker drains, sent at the end of every cycle
    /// (also when unchanged: a receiver sees the loop turn).
    pub fn owned(&self) -> watch::Receiver<Vec<String>> {
        self.owned.subscribe()
    }

    /// Whether this worker takes part in the fleet's targets (false until
    /// its first cycle, and while it steps aside for the broker).
    pub fn publishing(&self) -> watch::Receiver<bool> {
        self.publishing.subscribe()
    }

    /// Coordinates until `cancel` fires, then hands every bucket back.
    /// With [`Drain::UntilEmpty`] (`--once`): one acquisition round, drain
    /// what is ready, release, return.
    pub async fn run(
        mut self,
        drain: Drain,
        cancel: CancellationToken,
        shutdown_timeout: Duration,
    ) {
        let mut next_renew = Instant::now() + self.settings.lease_renew;
        let mut next_cleanup = Instant::now();
        loop {
            // On shutdown the cycle in progress may finish if the database
            // answers within CYCLE_ON_EXIT (so leases it is taking are
            // released like the others); otherwise it is abandoned, and a
            // lease it took unseen is released by owner (see `shutdown`).
            let busy = {
                let cycle = self.cycle(drain, &mut next_renew, &mut next_cleanup);
                tokio::pin!(cycle);
                tokio::select! {
                    busy = &mut cycle => Some(busy),
                    _ = cancel.cancelled() => {
                        let _ = tokio::time::timeout(CYCLE_ON_EXIT, &mut cycle).await;
                        None
                    }
                }
            };
            let Some(busy) = busy else { break };
            self.owned.send_replace(self.held.keys().cloned().collect());
            if drain == Drain::UntilEmpty {
                self.renew_until_drained(&cancel, &mut next_renew).await;
                break;
            }
            let pause = crate::jitter::jittered(if busy { POLL } else { IDLE_POLL });
            let until = (Instant::now() + pause).min(next_renew);
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = self.wake.notified() => self.announced = true,
                _ = tokio::time::sleep_until(until) => {}
            }
        }
        self.shutdown(drain, shutdown_timeout).await;
    }

    /// `--once`: keeps the leases renewed until every drainer has drained
    /// what was ready (or `cancel` fires).
    async fn renew_until_drained(&mut self, cancel: &CancellationToken, next_renew: &mut Instant) {
        while self.held.values().any(|h| !h.handle.is_finished()) {
            let until = (Instant::now() + Duration::from_millis(20)).min(*next_renew);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(until) => {}
            }
            if Instant::now() >= *next_renew {
                *next_renew = self.renew().await;
            }
        }
    }

    /// One cycle; true while anything is still in motion.
    async fn cycle(
        &mut self,
        drain: Drain,
        next_renew: &mut Instant,
        next_cleanup: &mut Instant,
    ) -> bool {
        let store = self.store.clone();
        self.check_broker().await;
        let target_set = if self.can_publish {
            self.targets().await
        } else {
            // Stepped aside: no targets, whatever the membership (read
            // afresh once it is back).
            self.known = None;
            Some(BTreeSet::new())
        };

        if Instant::now() >= *next_renew {
            *next_renew = self.renew().await;
        }
        if let Some(targets) = &target_set {
            for (bucket, h) in self.held.iter_mut() {
                if h.stopping.is_none() && !targets.contains(bucket) {
                    tracing::info!(%bucket, epoch = h.epoch, "no longer a target; handing over after the in-flight batch");
                    h.cancel.cancel();
                    h.stopping = Some(Stop::Rebalance);
                }
            }
        }
        self.reap_and_release("rebalance").await;

        let mut pending = self.held.values().any(|h| h.stopping.is_some());
        if let Some(targets) = target_set {
            let wanted: Vec<String> = targets
                .into_iter()
                .filter(|b| !self.held.contains_key(b))
                .collect();
            if !wanted.is_empty() {
                self.acquire(&wanted, drain).await;
                pending |= wanted.iter().any(|b| !self.held.contains_key(b));
            }
        }
        if Instant::now() >= *next_cleanup {
            *next_cleanup = Instant::now() + self.settings.lease_renew;
            if !self.can_publish {
                // Written again now and then: a re-registered row (after
                // the database lost it) would say it can publish.
                self.recorded_can_publish = None;
            }
            if self.housekeeping.is_mine() {
                match store.remove_dead(self.settings.heartbeat_ttl).await {
                    Ok(n) if n > 0 => tracing::info!(rows = n, "removed rows of workers that died"),
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "dead-row cleanup failed"),
                }
            }
        }
        pending
    }

    /// This worker's target buckets (`None`: the membership could not be
    /// read). From a membership read — or, while the peers' announcements
    /// arrive (`LISTEN` works, or the poller reads the workers table's
    /// fingerprint: [`FleetSignal::announcements_arrive`]), none came since
    /// the last read and no handover is under way, from that read for as
    /// long as it stands
    /// ([`Membership::stable_for`](crate::store::workers::Membership::stable_for)),
    /// `lease_renew` at most. A read meanwhile would find nothing new: a
    /// join, a leave, a release or a change of broker state is announced
    /// (the fingerprint shows each but a release, and a released bucket's
    /// new owner, whose targets include it, tries to take it every cycle
    /// until it does), and a dead peer is left out no sooner than
    /// `stable_for` says. Only a stalled peer that comes back is not
    /// announced: it gets its share
    /// within `lease_renew` rather than within a cycle. An idle fleet thus
    /// reads its membership every `lease_renew` per worker instead of every
    /// cycle — and, where the fingerprint also marks the peers near being
    /// left out ([`FleetSignal::lateness_watched`]: a database without
    /// notifications), only when it changes, while no peer is within
    /// `lease_renew` of that: a peer that stops beating becomes near
    /// `lease_renew` before it could be left out, and the read its mark
    /// brings sets the next at that moment; a stalled peer's return clears
    /// its mark.
    async fn targets(&mut self) -> Option<BTreeSet<String>> {
        let now = Instant::now();
        let announced = std::mem::take(&mut self.announced);
        let handing_over = self.held.values().any(|h| h.stopping.is_some());
        if let Some(known) = &self.known
            && !announced
            && !handing_over
            && (self.wake.announcements_arrive() && now < known.until
                || self.wake.lateness_watched() && now < known.watched_until)
        {
            return Some(known.targets.clone());
        }
        let suspect_after = suspect_after(self.settings.lease_ttl, self.settings.heartbeat_ttl);
        let stats = &self.relay.context().stats;
        stats.membership_reads.fetch_add(1, Ordering::Relaxed);
        match self.store.membership(self.me, suspect_after).await {
            Ok(members) => {
                self.housekeeping.follow(self.me, &members.live);
                let targets: BTreeSet<String> = targets(
                    self.settings.assignment,
                    &members.live,
                    self.me,
                    self.settings.partitioner.count(),
                )
                .into_iter()
                .map(|b| self.settings.partitioner.label(b))
                .collect();
                let renew = self.settings.lease_renew;
                let stands = members.stable_for.map_or(renew, |s| s.min(renew));
                let watched = if stands < renew {
                    stands
                } else {
                    renew * WATCHED_STANDS_RENEWS
                };
                self.known = Some(Known {
                    targets: targets.clone(),
                    until: now + stands,
                    watched_until: now + watched,
                });
                Some(targets)
            }
            Err(e) => {
                self.known = None;
                tracing::warn!(error = %e, "cannot read the fleet membership; keeping current leases");
                None
            }
        }
    }

    /// Steps aside when the broker has been unreachable for longer than
    /// `broker_grace`, and back in once it is reachable; records the state
    /// in the worker row (retried every cycle until it is written) and
    /// tells the fleet.
    async fn check_broker(&mut self) {
        let reach = self.relay.context().sink.reach().borrow().clone();
        let can_publish = reach.unreachable_for() <= self.settings.broker_grace;
        let error = match &reach {
            Reach::Unreachable { error, .. } if !can_publish => Some(error.as_str()),
            Reach::Never { error } => Some(error.as_deref().unwrap_or("not connected yet")),
            _ => None,
        };
        self.publishing
            .send_if_modified(|p| std::mem::replace(p, can_publish) != can_publish);
        if can_publish != self.can_publish {
            self.can_publish = can_publish;
            match (&reach, error) {
                (Reach::Never { .. }, Some(error)) => tracing::warn!(
                    %error,
                    "RabbitMQ not reached yet: taking no bucket until it is"
                ),
                (_, Some(error)) => tracing::warn!(
                    unreachable_for = ?reach.unreachable_for(),
                    broker_grace = ?self.settings.broker_grace,
                    %error,
                    "RabbitMQ unreachable for longer than worker.broker_grace: giving every bucket up until it is reachable again"
                ),
                (_, None) => {
                    tracing::info!("RabbitMQ reachable: taking part in the fleet's targets again")
                }
            }
        }
        if self.recorded_can_publish == Some(self.can_publish) {
            return;
        }
        match self
            .store
            .set_broker_state(self.me, self.can_publish, error)
            .await
        {
            Ok(_) => {
                self.recorded_can_publish = Some(self.can_publish);
                if let Err(e) = self.store.notify(Channel::Fleet, announce::BROKER).await {
                    tracing::debug!(error = %e, "could not announce the broker state");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot record the broker state; retrying"),
        }
    }

    /// Renews every held lease; returns when the next renew is due.
    async fn renew(&mut self) -> Instant {
        let renewing: Vec<(String, i64)> = self
            .held
            .iter()
            .filter(|(_, h)| h.stopping != Some(Stop::Lost))
            .map(|(b, h)| (b.clone(), h.epoch))
            .collect();
        let started = Instant::now();
        if renewing.is_empty() {
            return started + self.settings.lease_renew;
        }
        let renewed = self.store.renew_and_beat(
            self.me,
            &renewing,
            self.settings.lease_ttl,
            self.settings.heartbeat_ttl,
        );
        match renewed.await {
            Ok((renewed, beat)) => {
                if beat {
                    self.beats.record(started.into_std());
                }
                let renewed: BTreeSet<String> = renewed.into_iter().collect();
                let deadline = trust_deadline(started, self.settings.lease_ttl);
                for (bucket, h) in self.held.iter_mut() {
                    if renewed.contains(bucket) {
                        h.trust.set(deadline);
                    } else if h.stopping != Some(Stop::Lost) {
                        tracing::warn!(%bucket, epoch = h.epoch, "lease lost (renew matched nothing); stopping its drainer");
                        h.trust.revoke();
                        h.cancel.cancel();
                        h.stopping = Some(Stop::Lost);
                    }
                }
                started + self.settings.lease_renew
            }
            Err(e) => {
                // Trust is not extended: drainers stop at their deadline
                // unless a retry succeeds first.
                tracing::warn!(error = %e, "renewing leases failed; retrying");
                started + Duration::from_millis(500).min(self.settings.lease_renew)
            }
        }
    }

    /// Removes finished drainers; releases the leases of those stopped for
    /// a rebalance and announces the release. A drainer that ended without
    /// being stopped (it should not) would leave its bucket owned and
    /// undrained: its lease is released too, so the bucket is acquired
    /// again, with a new drainer, on a later cycle.
    async fn reap_and_release(&mut self, reason: &str) {
        // (A drainer ended by shutdown is left to `shutdown`, which releases.)
        let finished: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| {
                h.handle.is_finished() && (h.stopping.is_some() || !h.cancel.is_cancelled())
            })
            .map(|(b, _)| b.clone())
            .collect();
        let mut release = Vec::new();
        for bucket in finished {
            let h = self.held.remove(&bucket).expect("present");
            match h.stopping {
                Some(Stop::Lost) => continue,
                Some(Stop::Rebalance) => {}
                None => {
                    tracing::warn!(%bucket, epoch = h.epoch, "a drainer ended on its own; giving its lease up to start over");
                }
            }
            if h.trust.is_settled() {
                release.push((bucket, h.epoch));
            } else {
                leave_to_expire(&bucket, h.epoch);
            }
        }
        self.release(&release, reason).await;
    }

    async fn release(&self, leases: &[(String, i64)], reason: &str) {
        if leases.is_empty() {
            return;
        }
        match self.store.release_leases(self.me, leases, reason).await {
            Ok(released) => {
                tracing::info!(buckets = ?released, reason, "leases released");
                if let Err(e) = self.store.notify(Channel::Fleet, announce::RELEASE).await {
                    tracing::debug!(error = %e, "could not announce the release");
                }
            }
            // Not fatal: the leases expire after lease_ttl.
            Err(e) => {
                tracing::warn!(error = %e, "releasing leases failed; they expire after lease_ttl")
            }
        }
    }

    async fn acquire(&mut self, wanted: &[String], drain: Drain) {
        let started = Instant::now();
        let acquired = match self
            .store
            .acquire(self.me, wanted, self.settings.lease_ttl, "target")
            .await
        {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "acquiring leases failed");
                return;
            }
        };
        let deadline = trust_deadline(started, self.settings.lease_ttl);
        for a in acquired {
            tracing::info!(bucket = %a.partition_key, epoch = a.lease_epoch, "lease acquired");
            let trust = Arc::new(Trust::new(deadline, &a.partition_key, a.lease_epoch));
            let cancel = CancellationToken::new();
            let grant = LeaseGrant {
                fence: Fence {
                    owner: self.me,
                    epoch: a.lease_epoch,
                },
                trust: trust.clone(),
                was_free: a.was_free,
            };
            let handle =
                self.relay
                    .spawn_bucket(&a.partition_key, Some(grant), drain, cancel.clone());
            self.held.insert(
                a.partition_key,
                Held {
                    epoch: a.lease_epoch,
                    trust,
                    cancel,
                    handle,
                    stopping: None,
                },
            );
        }
    }

    /// Stops every drainer (in-flight batches finish, bounded by
    /// `timeout`), then releases every lease still ours in one statement.
    async fn shutdown(mut self, drain: Drain, timeout: Duration) {
        if drain == Drain::Forever {
            tracing::info!(
                buckets = self.held.len(),
                "shutting down: finishing in-flight batches, then releasing every lease"
            );
        }
        for h in self.held.values_mut() {
            h.cancel.cancel();
            h.stopping.get_or_insert(Stop::Rebalance);
        }
        let deadline = Instant::now() + timeout;
        while self.held.values().any(|h| !h.handle.is_finished()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.held.values().any(|h| !h.handle.is_finished()) {
            tracing::warn!(
                ?timeout,
                "in-flight batches did not finish in time; abandoned (their rows are published again later)"
            );
        }
        let mut settled = Vec::new();
        let mut unsettled = false;
        for (bucket, h) in std::mem::take(&mut self.held) {
            // Whatever an abandoned batch left buffered never goes out once
            // the lease is released (the send gate refuses it).
            h.trust.revoke();
            h.handle.abort();
            if h.trust.is_settled() {
                settled.push((bucket, h.epoch));
            } else {
                leave_to_expire(&bucket, h.epoch);
                unsettled = true;
            }
        }
        let reason = if drain == Drain::UntilEmpty {
            "once: drained"
        } else {
            "shutdown"
        };
        // Every lease of this worker, also one an abandoned cycle took
        // without seeing the answer (unless one must expire: then the
        // settled ones only); no drainer runs any more. A database that
        // stopped answering must not hold the exit up: the leases then
        // simply expire after lease_ttl.
        let store = &self.store;
        let release = async {
            let released = if unsettled {
                store.release_leases(self.me, &settled, reason).await?
            } else {
                store.release_all_leases(self.me, reason).await?
            };
            tracing::info!(buckets = ?released, reason, "leases released");
            store.notify(Channel::Fleet, announce::RELEASE).await
        };
        match tokio::time::timeout(RELEASE_ON_EXIT, release).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "releasing leases failed; they expire after lease_ttl")
            }
            Err(_) => tracing::warn!(
                ?RELEASE_ON_EXIT,
                "the database did not answer the release in time; the leases expire after lease_ttl"
            ),
        }
        self.owned.send_replace(Vec::new());
    }
}
