//! Wake-ups: what tells an idle drainer that its bucket has new rows, and
//! the fleet coordinator that workers joined, left or released buckets.
//!
//! Two sources feed the same signals ([`Wakeups`]), each in a module of
//! its own ([`listen`], [`poll`]):
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
//!   ready head and wakes those. Between polls a *probe* ([`poll::Probe`]) reads
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
//! probe forward to within [`poll::PROBE_AFTER_CHANGE`].
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
use crate::store::Store;
use crate::store::workers::LateWatch;

mod listen;
mod poll;

pub use poll::SAFETY_NET_BACKS_OFF_TO;
use poll::{LONG_QUIET, Polling};

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
    ///
    /// The listener's first connection is opened before this returns, that
    /// is before the drain starts: a server that caps the worker's
    /// connections then leaves it one to listen on, instead of the drain's
    /// statements taking every one and the listener polling for as long as
    /// they keep them busy.
    pub async fn start(
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
                let first = tokio::select! {
                    _ = cancel.cancelled() => return tasks,
                    first = store.listen(direct) => first,
                };
                let listen = self.clone().listen(
                    store.clone(),
                    direct.map(str::to_string),
                    first,
                    finding_rows(db),
                    cancel.clone(),
                );
                tasks.push(tokio::spawn(listen.in_current_span()));
            }
        }
        tasks
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
