//! Wake-ups: what tells an idle drainer that its bucket has new rows, and
//! the fleet coordinator that workers joined, left or released buckets.
//!
//! Two sources feed the same signals ([`Wakeups`]):
//!
//! - **`LISTEN`** on `<outbox>_enqueued` and `<outbox>_fleet`, on
//!   `database.listen_url` when set, else on `database.url`. Each time the
//!   listener (re)connects it checks itself: it sends a `NOTIFY` through the
//!   workers' pool — the way producers' notifications travel — and waits
//!   for it ([`SELF_CHECK`]). A pooler in transaction mode between the
//!   listener and the database loses notifications; the check notices, says
//!   so once, and the worker polls from then on.
//! - **Polling** ([`Wakeups::poll`]): every `database.poll_interval`, while
//!   `LISTEN` is not known to work (not configured, reconnecting, or failed
//!   its check), one query finds which of the buckets drained here have a
//!   ready head and wakes those. Between polls a *probe* ([`Probe`]) reads
//!   the rows added since the newest id it saw (one range read of the
//!   primary key: a single index lookup when nothing was added) and wakes
//!   their buckets at once: every `database.probe_interval` (5 ms) while
//!   rows keep coming, backing off to `database.poll_interval` while none
//!   do; after [`LONG_QUIET`] without any it stops, and the polls (which
//!   back off to `outbox.idle_backoff_ms` where adaptive) start it again
//!   when they find a row. So a polling worker relays a new row within
//!   milliseconds while traffic flows, within a poll interval after a
//!   quiet spell, and within a backed-off poll after a long silence. A row
//!   whose id was taken earlier but committed after the probe read past it
//!   (ids commit out of order) is left to the polls.
//!
//! Without `LISTEN`, a poll also reads a fingerprint of the workers table
//! (in the same statement, at most every [`FLEET_LOOK_EVERY`]) and wakes
//! the fleet coordinator when it changed ([`FleetLook`]): the poll stands
//! in for the peers' announcements, so an idle coordinator need not read
//! the membership every second — and, since the fingerprint also marks a
//! peer whose heartbeat is late ([`LateWatch`]), nor every `lease_renew`
//! to notice one that died. Such a poll after one that found nothing
//! asks only whether any bucket drained here has a pending row (one probe
//! of the pending index, with the fingerprint) and reads the buckets'
//! heads only when one has: an idle fleet's polls are most of what it
//! asks of a database without notifications.
//!
//! Behind `database.pooler = "transaction"` without a `listen_url`, no
//! `LISTEN` is attempted: start-up says the worker polls. A database
//! without notifications at all (MySQL/MariaDB, SQLite) is polled
//! *adaptively*: every `database.poll_interval` while polls find new rows
//! and for a second after the last that did, then doubling the delay after
//! each poll that finds none, up to `outbox.idle_backoff_ms`. Where the
//! store can tell that the database changed (`NotifyStore::changes`:
//! SQLite's files, watched through the kernel), each change brings the
//! probe forward to within [`PROBE_AFTER_CHANGE`].
//!
//! While `LISTEN` works, the poller still looks, in the same one query for
//! every bucket drained here: the safety net for a row no notification
//! announced (a producer without the trigger) and for a drainer that went
//! idle before its head was claimable (another token's claim not yet
//! lapsed, a lease too close to its end). It looks every
//! `outbox.idle_backoff_ms` while it finds a ready head or rows are
//! announced, and backs off (doubling) to [`SAFETY_NET_BACKS_OFF_TO`]
//! while neither: an idle worker runs one such query per 30 s, not one a
//! second, and one announcement brings the pace back. A head waiting out
//! its retry backoff is not the net's to find: its drainer times the retry
//! itself (`super::bucket`). An idle drainer waits for its signal only, so
//! an idle worker runs no claim per bucket.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::Instrument;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{DatabaseConfig, Pooler, fmt_duration};
use crate::store::workers::LateWatch;
use crate::store::{Channel, Store};

/// How long the listener waits for its own test notification.
pub const SELF_CHECK: Duration = Duration::from_secs(5);

/// Adaptive polling keeps its shortest delay for this long after the last
/// poll that found new rows, so a steady trickle (a message every few
/// hundred milliseconds) never waits for a backed-off poll.
pub const QUIET_BEFORE_BACKOFF: Duration = Duration::from_secs(1);

/// The signal of one bucket.
#[derive(Default)]
struct Signal {
    notify: Notify,
    /// A drainer of this worker waits on it (so polling looks at it).
    drained: AtomicBool,
}

/// Wake-up signals: one per bucket (new rows), one for the fleet
/// coordinator (workers joining, leaving, releasing buckets).
#[derive(Clone)]
pub struct Wakeups {
    buckets: Arc<HashMap<String, Arc<Signal>>>,
    fleet: Arc<Notify>,
    /// `LISTEN` works (checked): polling pauses.
    listening: Arc<AtomicBool>,
    /// Rows were announced (or everything woken): a backed-off safety net
    /// returns to its shortest pace.
    announced: Arc<Notify>,
    /// The workers table as the polls last saw it.
    fleet_look: Arc<FleetLook>,
    /// Which peers the fingerprint marks as near being left out.
    watch: LateWatch,
}

/// The fleet coordinator's signal: woken by the peers' announcements
/// (joining, leaving, releasing) where they arrive (`LISTEN` up), or by
/// the poller when the workers table's fingerprint it reads with its polls
/// changed ([`FleetLook`]); else only the coordinator's own membership
/// checks notice a change.
#[derive(Clone, Default)]
pub struct FleetSignal {
    wake: Arc<Notify>,
    /// `LISTEN` works (checked).
    listening: Arc<AtomicBool>,
    look: Arc<FleetLook>,
}

impl FleetSignal {
    /// Resolves at the next announcement.
    pub async fn notified(&self) {
        self.wake.notified().await
    }

    /// Whether a change of the fleet's rows (a join, a leave, a step aside
    /// or back) wakes the coordinator without a membership read of its own:
    /// `LISTEN` works, or the poller read the workers table's fingerprint
    /// within [`FLEET_LOOK_STANDS`]. (While `LISTEN` reconnects announcements
    /// do not arrive; once it is back, everything is woken, the coordinator
    /// too.)
    pub fn announcements_arrive(&self) -> bool {
        self.listening.load(Ordering::Relaxed) || self.look.fresh()
    }

    /// Whether a peer nearing being left out, or coming back from it, wakes
    /// the coordinator too: the poller reads the fingerprint, which marks
    /// such peers ([`LateWatch`]), and its look is fresh. `LISTEN` carries
    /// no such news (a dead peer announces nothing).
    pub fn lateness_watched(&self) -> bool {
        !self.listening.load(Ordering::Relaxed) && self.look.fresh()
    }
}

/// A poll carries the workers table's fingerprint when the last look is
/// older than this (every idle poll, every few polls under load).
pub const FLEET_LOOK_EVERY: Duration = Duration::from_millis(500);
/// How long a look stands in for the announcements: a poller at its
/// default idle pace (`outbox.idle_backoff_ms` = 1 s) looks again well
/// within it; one that backs off further, or stops polling (no bucket
/// drained here), leaves its coordinator to read the membership every
/// cycle, as without a look.
pub const FLEET_LOOK_STANDS: Duration = Duration::from_millis(1500);

/// Where no announcements arrive (MySQL/MariaDB, SQLite, a transaction
/// pooler without `listen_url`), the poller reads a fingerprint of the
/// workers table with its poll, in the same statement
/// ([`OutboxLookups::ready_buckets_and_fleet`](crate::store::OutboxLookups::ready_buckets_and_fleet)),
/// and wakes the coordinator when it changed — a join, a leave, a step
/// aside or back, a peer's heartbeat becoming late or near its end
/// ([`LateWatch`]) or on time again, each a change of the table's rows as
/// the fingerprint reads them. The coordinator then reads the membership
/// only when so woken or when its last read says a peer could be left out
/// within `lease_renew` (a safety-net read every ten `lease_renew`s
/// besides): 64 idle MariaDB workers read it 64 times a second before the
/// fingerprint, and each once per `lease_renew` before the late marks.
#[derive(Default)]
struct FleetLook {
    /// The last fingerprint read, and when.
    last: std::sync::Mutex<Option<(String, std::time::Instant)>>,
}

impl FleetLook {
    /// Whether the next poll should carry the fingerprint.
    fn due(&self) -> bool {
        self.last_at()
            .is_none_or(|at| at.elapsed() >= FLEET_LOOK_EVERY)
    }

    fn fresh(&self) -> bool {
        self.last_at()
            .is_some_and(|at| at.elapsed() < FLEET_LOOK_STANDS)
    }

    fn last_at(&self) -> Option<std::time::Instant> {
        self.last.lock().expect("fleet look").as_ref().map(|l| l.1)
    }

    /// Records a fingerprint; true when the coordinator should read the
    /// membership: it differs from the one before, or there was none
    /// standing before. Only an unbroken chain of looks vouches for targets
    /// read meanwhile: a poller that just got its first bucket (a worker
    /// that just joined) or looks again after a pause may find a change
    /// that came after its coordinator's last read and before this look.
    fn saw(&self, fingerprint: String) -> bool {
        let mut last = self.last.lock().expect("fleet look");
        let changed = last
            .as_ref()
            .is_none_or(|(f, at)| *f != fingerprint || at.elapsed() >= FLEET_LOOK_STANDS);
        *last = Some((fingerprint, std::time::Instant::now()));
        changed
    }
}

/// A drainer's hold on its bucket's signal; the bucket is polled while one
/// is alive.
pub struct BucketWakeup {
    signal: Arc<Signal>,
    /// `LISTEN` works: every committed row announces itself.
    listening: Arc<AtomicBool>,
}

impl BucketWakeup {
    /// Resolves when the bucket may have new rows. A wake-up that came while
    /// nobody waited is kept, so none is lost mid-batch.
    pub async fn notified(&self) {
        self.signal.notify.notified().await
    }

    /// Whether rows may have come since the bucket was last found drained:
    /// false only while `LISTEN` works (each committed row announces its
    /// bucket) and no announcement came since — one that did is taken
    /// here. Without notifications only a claim can tell.
    pub fn may_have_more(&self) -> bool {
        use futures_util::FutureExt;
        !self.listening.load(Ordering::Relaxed)
            || self.signal.notify.notified().now_or_never().is_some()
    }
}

impl Drop for BucketWakeup {
    fn drop(&mut self) {
        self.signal.drained.store(false, Ordering::Relaxed);
    }
}

impl Wakeups {
    /// The signals of `labels`; the fingerprint the polls read marks the
    /// workers `watch` says (a fleet's: [`LateWatch::for_fleet`]).
    pub fn new(labels: &[String], watch: LateWatch) -> Self {
        Self {
            buckets: Arc::new(
                labels
                    .iter()
                    .map(|l| (l.clone(), Arc::new(Signal::default())))
                    .collect(),
            ),
            fleet: Arc::new(Notify::new()),
            listening: Arc::new(AtomicBool::new(false)),
            announced: Arc::new(Notify::new()),
            fleet_look: Arc::default(),
            watch,
        }
    }

    /// The coordinator's signal.
    pub fn fleet(&self) -> FleetSignal {
        FleetSignal {
            wake: self.fleet.clone(),
            listening: self.listening.clone(),
            look: self.fleet_look.clone(),
        }
    }

    /// The signal of one bucket, for its drainer.
    pub fn of(&self, label: &str) -> BucketWakeup {
        let signal = self.buckets.get(label).cloned().unwrap_or_default();
        signal.drained.store(true, Ordering::Relaxed);
        BucketWakeup {
            signal,
            listening: self.listening.clone(),
        }
    }

    fn wake(&self, label: &str) {
        if let Some(s) = self.buckets.get(label) {
            // notify_one keeps a permit when the drainer is busy.
            s.notify.notify_one();
        }
    }

    /// Wakes the bucket of an announced row.
    fn announce(&self, label: &str) {
        self.announced.notify_one();
        self.wake(label);
    }

    fn wake_all(&self) {
        self.announced.notify_one();
        self.buckets.values().for_each(|s| s.notify.notify_one());
        self.fleet.notify_one();
    }

    fn drained_here(&self) -> Vec<String> {
        let mut labels: Vec<String> = self
            .buckets
            .iter()
            .filter(|(_, s)| s.drained.load(Ordering::Relaxed))
            .map(|(l, _)| l.clone())
            .collect();
        labels.sort();
        labels
    }

    /// Starts what feeds the signals until `cancel`: the poller always
    /// (idle while `LISTEN` works), the listener where it can work. Returns
    /// the tasks. `idle_backoff` is where adaptive polling (a database
    /// without notifications) backs off to.
    pub fn start(
        &self,
        store: &Store,
        db: &DatabaseConfig,
        idle_backoff: Duration,
        cancel: &CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        if !store.has_notifications() {
            tracing::info!(
                "{} has no notifications: {} while rows keep coming, backing off to {} \
                 (outbox.idle_backoff_ms) while none do",
                store.kind().name(),
                finding_rows(db),
                fmt_duration(idle_backoff)
            );
            if store.changes().is_some() && !db.probe_interval.is_zero() {
                tracing::info!(
                    "and probing at once whenever the {} files change (the kernel reports every write)",
                    store.kind().name()
                );
            }
            let polling = Polling::new(db, Some(idle_backoff), idle_backoff);
            return vec![tokio::spawn(
                self.clone()
                    .poll(store.clone(), polling, cancel.clone())
                    .in_current_span(),
            )];
        }
        let polling = Polling::new(db, None, idle_backoff);
        let mut tasks = vec![tokio::spawn(
            self.clone()
                .poll(store.clone(), polling, cancel.clone())
                .in_current_span(),
        )];
        match (db.pooler, db.listen_url()) {
            (Pooler::Transaction, None) => tracing::info!(
                "database.pooler = \"transaction\" and no database.listen_url: no LISTEN through \
                 the pooler, {}; set database.listen_url to a direct connection for wake-ups \
                 without either",
                finding_rows(db)
            ),
            (_, direct) => {
                let listen = self.clone().listen(
                    store.clone(),
                    direct.map(str::to_string),
                    finding_rows(db),
                    cancel.clone(),
                );
                tasks.push(tokio::spawn(listen.in_current_span()));
            }
        }
        tasks
    }

    /// While `LISTEN` is not known to work, wakes the buckets drained here
    /// whose head is ready, every `polling.every` — or, adaptively, that
    /// often while polls find something and for [`QUIET_BEFORE_BACKOFF`]
    /// after the last that did, then backing off (doubling) to
    /// `polling.back_off_to` while they find nothing. Between polls the
    /// [`Probe`] wakes the buckets of rows added since it last looked (rows
    /// it finds count as found).
    async fn poll(self, store: Store, polling: Polling, cancel: CancellationToken) {
        use tokio::time::Instant;
        let mut delay = polling.every;
        let mut next_poll = Instant::now() + delay;
        let mut quiet_since: Option<Instant> = None;
        let mut probe = polling.probe.map(|every| Probe::new(every, polling.every));
        let changes = store.changes();
        // The safety net's gap while LISTEN works.
        let mut net = polling.while_listening;
        loop {
            let listening = self.listening.load(Ordering::Relaxed);
            let until = match &probe {
                Some(p) if !listening => next_poll.min(p.next),
                _ => next_poll,
            };
            // Only a backed-off safety net waits for announcements: at its
            // shortest pace a stream of them costs the poller nothing.
            let backed_off = listening && net > polling.while_listening;
            let announced = async {
                if backed_off {
                    self.announced.notified().await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(until) => {}
                _ = announced => {
                    net = polling.while_listening;
                    next_poll = next_poll.min(Instant::now() + crate::jitter::jittered(net));
                    continue;
                }
                // The database changed: probe now (at most every
                // PROBE_AFTER_CHANGE), then sleep again.
                _ = changed(changes.as_deref()) => {
                    if let Some(p) = probe.as_mut() {
                        p.next = p.next.min(Instant::now() + PROBE_AFTER_CHANGE);
                    }
                    continue;
                }
            }
            let polling_now = Instant::now() >= next_poll;
            if polling_now {
                next_poll = Instant::now() + delay;
            }
            if self.listening.load(Ordering::Relaxed) {
                // Rows added while LISTEN works are announced; the safety
                // net looks every `polling.while_listening` while it finds
                // ready heads or rows are announced, and backs off
                // (doubling) to `SAFETY_NET_BACKS_OFF_TO` while neither.
                // (Should LISTEN fail, the probe starts afresh at once, at
                // full pace.)
                if let Some(p) = &mut probe {
                    p.rest();
                }
                if polling_now {
                    net = if self.wake_ready(&store, &self.drained_here(), false).await {
                        polling.while_listening
                    } else {
                        (net * 2).min(SAFETY_NET_BACKS_OFF_TO.max(polling.while_listening))
                    };
                    next_poll = Instant::now() + crate::jitter::jittered(net);
                }
                continue;
            }
            let labels = self.drained_here();
            if labels.is_empty() {
                // Nothing to wake (no bucket drained here yet, or none
                // assigned): the probe waits its turn all the same, and
                // starts from the newest id once there is (a new drainer
                // claims what is there without being woken).
                if let Some(p) = probe.as_mut().filter(|p| Instant::now() >= p.next) {
                    p.forget();
                    p.pace(false);
                }
                continue;
            }
            let mut found = false;
            if let Some(p) = probe.as_mut().filter(|p| Instant::now() >= p.next) {
                let added = p.run(&store).await;
                added.iter().for_each(|l| self.wake(l));
                found = !added.is_empty();
            }
            if polling_now
                && self
                    .wake_ready(&store, &labels, quiet_since.is_some())
                    .await
            {
                // Rows come again: the probe (stopped after a long
                // silence, or backed off) runs at full pace.
                if let Some(p) = probe.as_mut().filter(|_| !found) {
                    p.resume();
                }
                found = true;
            } else if !polling_now && !found {
                continue;
            }
            delay = match polling.back_off_to {
                Some(max) if !found => {
                    let quiet = quiet_since.get_or_insert_with(Instant::now);
                    if quiet.elapsed() < QUIET_BEFORE_BACKOFF {
                        polling.every
                    } else {
                        (delay * 2).min(max)
                    }
                }
                _ => {
                    quiet_since = None;
                    polling.every
                }
            };
            next_poll = if polling_now {
                Instant::now() + delay
            } else {
                next_poll.min(Instant::now() + delay)
            };
        }
    }

    /// Wakes the buckets of `labels` whose head is ready (one query); true
    /// when there was one. Without `LISTEN`, the query also reads the
    /// workers table's fingerprint when a look is due ([`FleetLook`]); a
    /// poller that is `idle` (its last poll found nothing) then first looks
    /// only for a pending row in `labels` ([`OutboxLookups::pending_and_fleet`]:
    /// one index probe, not a head per bucket) and reads the heads only if
    /// it found one — on MariaDB less than half the server time of an idle
    /// worker's poll.
    ///
    /// [`OutboxLookups::pending_and_fleet`]: crate::store::OutboxLookups::pending_and_fleet
    async fn wake_ready(&self, store: &Store, labels: &[String], idle: bool) -> bool {
        if labels.is_empty() {
            return false;
        }
        let look = !self.listening.load(Ordering::Relaxed) && self.fleet_look.due();
        let polled = if look && idle {
            match store.pending_and_fleet(labels, self.watch).await {
                Ok((pending, fingerprint)) => {
                    self.saw_fleet(fingerprint);
                    if pending {
                        store.ready_buckets(labels).await
                    } else {
                        Ok(Vec::new())
                    }
                }
                Err(e) => Err(e),
            }
        } else if look {
            store
                .ready_buckets_and_fleet(labels, self.watch)
                .await
                .map(|(ready, fingerprint)| {
                    self.saw_fleet(fingerprint);
                    ready
                })
        } else {
            store.ready_buckets(labels).await
        };
        match polled {
            Ok(ready) => {
                tracing::trace!(polled = labels.len(), ?ready, "polled for new rows");
                ready.iter().for_each(|l| self.wake(l));
                !ready.is_empty()
            }
            Err(e) => {
                tracing::debug!(error = %e, "polling for new rows failed");
                false
            }
        }
    }

    /// Takes a look at the workers table's fingerprint ([`FleetLook`]) and
    /// wakes the coordinator when it should read the membership.
    fn saw_fleet(&self, fingerprint: String) {
        if self.fleet_look.saw(fingerprint) {
            tracing::debug!(
                "the workers table changed (or was not looked at): reading the membership"
            );
            self.fleet.notify_one();
        }
    }

    /// Listens for `<outbox>_enqueued` and `<outbox>_fleet` notifications
    /// until cancelled, or until its self-check fails (then polling takes
    /// over for good). Reconnects by itself; after a reconnect everything is
    /// woken, since notifications sent meanwhile are lost.
    async fn listen(
        self,
        store: Store,
        direct: Option<String>,
        // What it falls back to if its self-check fails ([`finding_rows`]).
        fallback: String,
        cancel: CancellationToken,
    ) {
        let mut delay = Duration::from_millis(100);
        while !cancel.is_cancelled() {
            self.listening.store(false, Ordering::Relaxed);
            let mut listener = match store.listen(direct.as_deref()).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot LISTEN for wake-ups; polling meanwhile");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            delay = Duration::from_millis(100);
            self.wake_all();
            // The self-check: our own notification, sent the way producers'
            // travel, must come back. Until it does, polling goes on.
            let token = format!("outboxd-self-check:{}", uuid::Uuid::new_v4());
            let mut checked = None;
            let mut last_error = None;
            for attempt in 1..=5 {
                match store.notify(Channel::Enqueued, &token).await {
                    Ok(()) => {
                        checked = Some(tokio::time::Instant::now() + SELF_CHECK);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, attempt, "cannot send the LISTEN self-check");
                        last_error = Some(e);
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                }
            }
            if let (None, Some(e)) = (checked, last_error) {
                // Seen behind a transaction pooler whose server sessions a
                // LISTEN polluted: the notification cannot even be sent.
                tracing::warn!(
                    error = %e,
                    "LISTEN received no test notification: it could not be sent. From now on \
                     {fallback}; if a pooler in transaction mode is in between, set \
                     database.listen_url to a direct connection (see docs/postgresql.md)"
                );
                let _ = tokio::time::timeout(SELF_CHECK, listener.stop()).await;
                return;
            }
            loop {
                let timeout = async {
                    match checked {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let next = tokio::select! {
                    _ = cancel.cancelled() => return,
                    n = listener.recv() => n,
                    _ = timeout => {
                        tracing::warn!(
                            "LISTEN received no test notification within {}: something between \
                             this worker and the database (a pooler in transaction mode?) loses \
                             notifications. From now on {fallback}; set database.listen_url to \
                             a direct connection (see docs/postgresql.md)",
                            fmt_duration(SELF_CHECK)
                        );
                        let _ = tokio::time::timeout(SELF_CHECK, listener.stop()).await;
                        return;
                    }
                };
                match next {
                    Ok(Some(n)) if n.channel == Channel::Fleet => self.fleet.notify_one(),
                    Ok(Some(n)) if n.payload == token => {
                        checked = None;
                        self.listening.store(true, Ordering::Relaxed);
                    }
                    Ok(Some(n)) => self.announce(&n.payload),
                    // The connection was lost and re-established.
                    Ok(None) => self.wake_all(),
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection failed; polling while it reconnects");
                        break;
                    }
                }
            }
        }
    }
}

/// How far apart the safety net's polls grow while `LISTEN` works and
/// neither they find a ready head nor rows are announced: what an idle
/// worker costs the database, and how long a row nobody announced (the
/// trigger dropped, a notification lost some other way than with the
/// listener's connection) can wait on a worker that has seen no traffic.
pub const SAFETY_NET_BACKS_OFF_TO: Duration = Duration::from_secs(30);

/// How the poller paces itself.
#[derive(Debug, Clone, Copy)]
struct Polling {
    /// Between polls (while they find something, when adaptive).
    every: Duration,
    /// Adaptive: each poll that finds nothing doubles the delay, up to this.
    back_off_to: Option<Duration>,
    /// Between probes for added rows (`None`: no probe).
    probe: Option<Duration>,
    /// Between polls while `LISTEN` works (`outbox.idle_backoff_ms`).
    while_listening: Duration,
}

impl Polling {
    fn new(db: &DatabaseConfig, back_off_to: Option<Duration>, while_listening: Duration) -> Self {
        Self {
            every: db.poll_interval,
            back_off_to: back_off_to.map(|max| max.max(db.poll_interval)),
            probe: (!db.probe_interval.is_zero()).then_some(db.probe_interval),
            while_listening,
        }
    }
}

/// How a worker without working notifications finds new rows, as its log
/// lines say it: "[probing … every …, ]polling for new rows every …".
fn finding_rows(db: &DatabaseConfig) -> String {
    format!(
        "{}polling for new rows every {} (database.poll_interval)",
        probing(db),
        fmt_duration(db.poll_interval)
    )
}

/// How start-up names the probe: "probing … every …, " or nothing.
fn probing(db: &DatabaseConfig) -> String {
    if db.probe_interval.is_zero() {
        return String::new();
    }
    format!(
        "probing for added rows every {} (database.probe_interval) while rows keep \
         coming and every {} while none do (not at all after {} without any, until a \
         poll finds one), ",
        fmt_duration(db.probe_interval),
        fmt_duration(db.poll_interval.max(db.probe_interval)),
        fmt_duration(LONG_QUIET)
    )
}

/// Rows read by one probe at most; more are read by the next.
const PROBE_ROWS: i64 = 1000;

/// The probe for added rows: one read of the primary key above the newest
/// id it saw, which finds nothing at the cost of one index lookup when
/// nothing was added. It runs every `every` while it finds rows and for
/// [`QUIET_BEFORE_BACKOFF`] after the last it found, then backs off
/// (doubling) to `back_off_to` (the poll interval): a worker that sees no
/// traffic wakes a few times a second, not hundreds. After [`LONG_QUIET`]
/// without a row it stops until a poll finds one (or the database reports a
/// change): once the polls have backed off too, a probe as often as they
/// run would only repeat them — 64 idle MariaDB workers ran 640 probes a
/// second, most of the database's statements.
struct Probe {
    every: Duration,
    back_off_to: Duration,
    delay: Duration,
    /// When it runs next.
    next: tokio::time::Instant,
    /// The newest id seen (`None`: not known yet).
    seen: Option<i64>,
    /// When it last found rows (or started).
    found_at: tokio::time::Instant,
}

/// How long the probe finds nothing before it stops ([`Probe`]).
const LONG_QUIET: Duration = Duration::from_secs(30);
/// How far off a stopped probe's next run is.
const STOPPED: Duration = Duration::from_secs(24 * 3600);

/// How soon the probe runs after the database reported a change: soon,
/// but not for every commit of a busy database.
const PROBE_AFTER_CHANGE: Duration = Duration::from_millis(1);

/// Resolves when `changes` is raised; never without one.
async fn changed(changes: Option<&tokio::sync::Notify>) {
    match changes {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

impl Probe {
    fn new(every: Duration, back_off_to: Duration) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            every,
            back_off_to: back_off_to.max(every),
            delay: every,
            next: now + every,
            seen: None,
            // Quiet since the start: a fleet that never sees a row backs off
            // as one that saw its last a second before it started.
            found_at: now.checked_sub(QUIET_BEFORE_BACKOFF).unwrap_or(now),
        }
    }

    /// While `LISTEN` works: no quiet clock runs, and should `LISTEN` fail
    /// the probe is due at once, from the newest id, at full pace.
    fn rest(&mut self) {
        let now = tokio::time::Instant::now();
        self.forget();
        self.found_at = now;
        self.delay = self.every;
        self.next = now;
    }

    /// Starts again from the newest id at its next run.
    fn forget(&mut self) {
        self.seen = None;
    }

    /// A poll found a ready head: rows come again, so the probe runs at
    /// full pace, from where it was. Only a probe that had stopped starts
    /// again from the newest id (its place may be far behind; the poll
    /// woke what is there). A running probe must keep its place: moved to
    /// the newest id, it skips the rows committed between the poll's read
    /// and its own, and those wait for the next poll — under a steady
    /// trickle, where most polls find a head, a few rows in a hundred.
    fn resume(&mut self) {
        if self.delay == STOPPED {
            self.forget();
        }
        self.pace(true);
    }

    /// The buckets of the rows added since the last run (none on the first
    /// run, which only finds where to start: older rows are the polls' and
    /// the drainers' own to find), and when to run next.
    async fn run(&mut self, store: &Store) -> Vec<String> {
        let added = match self.read(store).await {
            Ok(added) => added,
            Err(e) => {
                tracing::debug!(error = %e, "probing for new rows failed");
                Vec::new()
            }
        };
        self.pace(!added.is_empty());
        added
    }

    /// Sets when to run next, after a run that `found` rows or not.
    fn pace(&mut self, found: bool) {
        self.pace_at(found, tokio::time::Instant::now());
    }

    fn pace_at(&mut self, found: bool, now: tokio::time::Instant) {
        let quiet = now - self.found_at;
        if found {
            self.found_at = now;
            self.delay = self.every;
        } else if quiet >= LONG_QUIET {
            self.delay = STOPPED;
        } else if quiet >= QUIET_BEFORE_BACKOFF {
            self.delay = (self.delay * 2).min(self.back_off_to);
        }
        self.next = now + self.delay;
    }

    async fn read(&mut self, store: &Store) -> Result<Vec<String>, crate::store::StoreError> {
        let Some(after) = self.seen else {
            self.seen = Some(store.newest_id().await?);
            return Ok(Vec::new());
        };
        let rows = store.added_after(after, PROBE_ROWS).await?;
        if let Some((last, _)) = rows.last() {
            self.seen = Some(*last);
        }
        let mut labels: Vec<String> = rows.into_iter().map(|(_, l)| l).collect();
        labels.sort_unstable();
        labels.dedup();
        Ok(labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Paces `probe` as its runs would for `over` from `start`, finding
    /// rows when `finds` says so at the time since `start`; returns the
    /// delay chosen after each run.
    fn delays(
        probe: &mut Probe,
        start: tokio::time::Instant,
        over: Duration,
        finds: impl Fn(Duration) -> bool,
    ) -> Vec<Duration> {
        let mut now = start;
        let mut delays = Vec::new();
        while now - start < over {
            probe.pace_at(finds(now - start), now);
            delays.push(probe.delay);
            now = probe.next;
        }
        delays
    }

    #[test]
    fn the_probe_backs_off_to_the_poll_interval_then_stops_after_a_long_silence() {
        let mut probe = Probe::new(5 * MS, 100 * MS);
        let start = probe.next;
        let quiet = delays(&mut probe, start, LONG_QUIET + 1000 * MS, |_| false);
        // Quiet from the start: doubling at once, to the poll interval.
        assert_eq!(quiet[..5], [10 * MS, 20 * MS, 40 * MS, 80 * MS, 100 * MS]);
        let at_poll = quiet.iter().filter(|d| **d == 100 * MS).count();
        assert!(
            (270..=300).contains(&at_poll),
            "{at_poll} probes 100 ms apart before the long silence"
        );
        // After LONG_QUIET: stopped.
        assert_eq!(
            quiet.last(),
            Some(&STOPPED),
            "{:?}",
            &quiet[quiet.len() - 3..]
        );
        assert_eq!(quiet.iter().filter(|d| **d == STOPPED).count(), 1);

        // A row found (by a poll): back to every 5 ms at once, for a
        // second, and a short silence after it stays at the poll interval.
        let start = probe.next - STOPPED + 300 * MS;
        let busy = delays(&mut probe, start, 20 * 1000 * MS, |t| t.is_zero());
        assert_eq!(busy[0], 5 * MS);
        let fast = busy.iter().take_while(|d| **d == 5 * MS).count();
        assert!(
            (195..=205).contains(&fast),
            "{fast} probes 5 ms apart after a find"
        );
        assert!(
            busy.iter().all(|d| *d <= 100 * MS),
            "20 s of silence after a find: {busy:?}"
        );
    }

    #[test]
    fn a_poll_that_finds_rows_keeps_a_running_probes_place_and_restarts_a_stopped_one() {
        let mut probe = Probe::new(5 * MS, 100 * MS);
        probe.seen = Some(41);
        probe.pace(true);
        // Running: a poll's find must not skip the rows since id 41.
        probe.resume();
        assert_eq!(probe.seen, Some(41));
        assert_eq!(probe.delay, 5 * MS);
        // Backed off, not stopped: the same.
        let later = probe.found_at + QUIET_BEFORE_BACKOFF + 500 * MS;
        probe.pace_at(false, later);
        assert!(probe.delay > 5 * MS && probe.delay < STOPPED);
        probe.resume();
        assert_eq!((probe.seen, probe.delay), (Some(41), 5 * MS));
        // Stopped after a long silence: from the newest id again.
        probe.pace_at(false, probe.found_at + LONG_QUIET);
        assert_eq!(probe.delay, STOPPED);
        probe.resume();
        assert_eq!((probe.seen, probe.delay), (None, 5 * MS));
    }
}
