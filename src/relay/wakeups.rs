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
//!   ready head and wakes those.
//!
//! Behind `database.pooler = "transaction"` without a `listen_url`, no
//! `LISTEN` is attempted: start-up says the worker polls. A database
//! without notifications at all (MySQL/MariaDB) is polled *adaptively*:
//! every `database.poll_interval` while polls find new rows and for a
//! second after the last that did, then doubling the delay after each poll
//! that finds none, up to `outbox.idle_backoff_ms`.
//! `outbox.idle_backoff_ms` stays the drainers' last resort either way.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{DatabaseConfig, Pooler, fmt_duration};
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
#[derive(Clone, Default)]
pub struct Wakeups {
    buckets: Arc<HashMap<String, Arc<Signal>>>,
    fleet: Arc<Notify>,
    /// `LISTEN` works (checked): polling pauses.
    listening: Arc<AtomicBool>,
}

/// A drainer's hold on its bucket's signal; the bucket is polled while one
/// is alive.
pub struct BucketWakeup(Arc<Signal>);

impl BucketWakeup {
    /// Resolves when the bucket may have new rows. A wake-up that came while
    /// nobody waited is kept, so none is lost mid-batch.
    pub async fn notified(&self) {
        self.0.notify.notified().await
    }
}

impl Drop for BucketWakeup {
    fn drop(&mut self) {
        self.0.drained.store(false, Ordering::Relaxed);
    }
}

impl Wakeups {
    pub fn new(labels: &[String]) -> Self {
        Self {
            buckets: Arc::new(
                labels
                    .iter()
                    .map(|l| (l.clone(), Arc::new(Signal::default())))
                    .collect(),
            ),
            fleet: Arc::new(Notify::new()),
            listening: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The coordinator's signal.
    pub fn fleet(&self) -> Arc<Notify> {
        self.fleet.clone()
    }

    /// The signal of one bucket, for its drainer.
    pub fn of(&self, label: &str) -> BucketWakeup {
        let signal = self.buckets.get(label).cloned().unwrap_or_default();
        signal.drained.store(true, Ordering::Relaxed);
        BucketWakeup(signal)
    }

    fn wake(&self, label: &str) {
        if let Some(s) = self.buckets.get(label) {
            // notify_one keeps a permit when the drainer is busy.
            s.notify.notify_one();
        }
    }

    fn wake_all(&self) {
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
        let every = fmt_duration(db.poll_interval);
        if !store.has_notifications() {
            tracing::info!(
                "{} has no notifications: polling for new rows every {every} \
                 (database.poll_interval) while rows keep coming, backing off to {} \
                 (outbox.idle_backoff_ms) while none do",
                store.kind().name(),
                fmt_duration(idle_backoff)
            );
            let polling = Polling {
                every: db.poll_interval,
                back_off_to: Some(idle_backoff.max(db.poll_interval)),
            };
            return vec![tokio::spawn(self.clone().poll(
                store.clone(),
                polling,
                cancel.clone(),
            ))];
        }
        let polling = Polling {
            every: db.poll_interval,
            back_off_to: None,
        };
        let mut tasks = vec![tokio::spawn(self.clone().poll(
            store.clone(),
            polling,
            cancel.clone(),
        ))];
        match (db.pooler, db.listen_url()) {
            (Pooler::Transaction, None) => tracing::info!(
                "database.pooler = \"transaction\" and no database.listen_url: no LISTEN through \
                 the pooler, polling for new rows every {every} (database.poll_interval); set \
                 database.listen_url to a direct connection for immediate wake-ups"
            ),
            (_, direct) => {
                tasks.push(tokio::spawn(self.clone().listen(
                    store.clone(),
                    direct.map(str::to_string),
                    db.poll_interval,
                    cancel.clone(),
                )));
            }
        }
        tasks
    }

    /// While `LISTEN` is not known to work, wakes the buckets drained here
    /// whose head is ready, every `polling.every` — or, adaptively, that
    /// often while polls find something and for [`QUIET_BEFORE_BACKOFF`]
    /// after the last that did, then backing off (doubling) to
    /// `polling.back_off_to` while they find nothing.
    async fn poll(self, store: Store, polling: Polling, cancel: CancellationToken) {
        let mut delay = polling.every;
        let mut quiet_since: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            if self.listening.load(Ordering::Relaxed) {
                continue;
            }
            let labels = self.drained_here();
            if labels.is_empty() {
                continue;
            }
            let found = match store.ready_buckets(&labels).await {
                Ok(ready) => {
                    tracing::trace!(polled = labels.len(), ?ready, "polled for new rows");
                    ready.iter().for_each(|l| self.wake(l));
                    !ready.is_empty()
                }
                Err(e) => {
                    tracing::debug!(error = %e, "polling for new rows failed");
                    false
                }
            };
            delay = match polling.back_off_to {
                Some(max) if !found => {
                    let quiet = quiet_since.get_or_insert_with(tokio::time::Instant::now);
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
        poll_interval: Duration,
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
                    "LISTEN received no test notification: it could not be sent. Polling for \
                     new rows every {} from now on; if a pooler in transaction mode is in \
                     between, set database.listen_url to a direct connection (see the README)",
                    fmt_duration(poll_interval)
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
                             notifications. Polling for new rows every {} from now on; set \
                             database.listen_url to a direct connection (see the README)",
                            fmt_duration(SELF_CHECK),
                            fmt_duration(poll_interval)
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
                    Ok(Some(n)) => self.wake(&n.payload),
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

/// How the poller paces itself.
#[derive(Debug, Clone, Copy)]
struct Polling {
    /// Between polls (while they find something, when adaptive).
    every: Duration,
    /// Adaptive: each poll that finds nothing doubles the delay, up to this.
    back_off_to: Option<Duration>,
}
