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
//! `LISTEN` is attempted: start-up says the worker polls.
//! `outbox.idle_backoff_ms` stays the drainers' last resort either way.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{DatabaseConfig, Pooler, Redacted, fmt_duration};
use crate::store::{DbPool, Store, StoreError};

/// How long the listener waits for its own test notification.
pub const SELF_CHECK: Duration = Duration::from_secs(5);

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
    /// the tasks.
    pub fn start(
        &self,
        store: &Store,
        db: &DatabaseConfig,
        cancel: &CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = vec![tokio::spawn(self.clone().poll(
            store.clone(),
            db.poll_interval,
            cancel.clone(),
        ))];
        let every = fmt_duration(db.poll_interval);
        match (db.pooler, db.listen_url()) {
            (Pooler::Transaction, None) => tracing::info!(
                "database.pooler = \"transaction\" and no database.listen_url: no LISTEN through \
                 the pooler, polling for new rows every {every} (database.poll_interval); set \
                 database.listen_url to a direct connection for immediate wake-ups"
            ),
            (_, direct) => {
                let listen = ListenOn {
                    direct: direct.map(str::to_string),
                    db: db.clone(),
                };
                tasks.push(tokio::spawn(self.clone().listen(
                    store.clone(),
                    listen,
                    cancel.clone(),
                )));
            }
        }
        tasks
    }

    /// Every `every`, while `LISTEN` is not known to work, wakes the
    /// buckets drained here whose head is ready.
    async fn poll(self, store: Store, every: Duration, cancel: CancellationToken) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if self.listening.load(Ordering::Relaxed) {
                continue;
            }
            let labels = self.drained_here();
            if labels.is_empty() {
                continue;
            }
            match store
                .tables
                .outbox
                .ready_buckets(&store.pool, &labels)
                .await
            {
                Ok(ready) => {
                    tracing::trace!(polled = labels.len(), ?ready, "polled for new rows");
                    ready.iter().for_each(|l| self.wake(l))
                }
                Err(e) => tracing::debug!(error = %e, "polling for new rows failed"),
            }
        }
    }

    /// Listens for `<outbox>_enqueued` and `<outbox>_fleet` notifications
    /// until cancelled, or until its self-check fails (then polling takes
    /// over for good). Reconnects by itself; after a reconnect everything is
    /// woken, since notifications sent meanwhile are lost.
    async fn listen(self, store: Store, on: ListenOn, cancel: CancellationToken) {
        let channel = store.tables.notify_channel();
        let fleet_channel = store.tables.fleet_channel();
        let mut delay = Duration::from_millis(100);
        while !cancel.is_cancelled() {
            self.listening.store(false, Ordering::Relaxed);
            let listener = async {
                let pool = on.pool(&store).await?;
                let mut l =
                    PgListener::connect_with(pool.sqlx())
                        .await
                        .map_err(|e| StoreError::Query {
                            doing: "connecting to LISTEN",
                            source: e,
                        })?;
                l.listen_all([channel.as_str(), fleet_channel.as_str()])
                    .await
                    .map_err(|e| StoreError::Query {
                        doing: "starting to LISTEN",
                        source: e,
                    })?;
                Ok::<_, StoreError>(l)
            }
            .await;
            let mut listener = match listener {
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
            for attempt in 1..=5 {
                match Store::notify(&store.pool, &channel, &token).await {
                    Ok(()) => {
                        checked = Some(tokio::time::Instant::now() + SELF_CHECK);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, attempt, "cannot send the LISTEN self-check");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                }
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
                    n = listener.try_recv() => n,
                    _ = timeout => {
                        tracing::warn!(
                            "LISTEN received no test notification within {}: something between \
                             this worker and the database (a pooler in transaction mode?) loses \
                             notifications. Polling for new rows every {} from now on; set \
                             database.listen_url to a direct connection (see the README)",
                            fmt_duration(SELF_CHECK),
                            fmt_duration(on.db.poll_interval)
                        );
                        // Best effort: through a pooler the LISTEN may stay
                        // registered on a server session other clients get.
                        let _ = tokio::time::timeout(SELF_CHECK, listener.unlisten_all()).await;
                        return;
                    }
                };
                match next {
                    Ok(Some(n)) if n.channel() == fleet_channel => self.fleet.notify_one(),
                    Ok(Some(n)) if n.payload() == token => {
                        checked = None;
                        self.listening.store(true, Ordering::Relaxed);
                    }
                    Ok(Some(n)) => self.wake(n.payload()),
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

/// Where the listener connects.
struct ListenOn {
    /// `database.listen_url`, else the workers' own URL.
    direct: Option<String>,
    db: DatabaseConfig,
}

impl ListenOn {
    async fn pool(&self, store: &Store) -> Result<DbPool, StoreError> {
        match &self.direct {
            None => Ok(store.pool.clone()),
            Some(url) => {
                tracing::debug!(url = %Redacted(url), "connecting to LISTEN");
                crate::store::pool::connect_to(&self.db, url, Pooler::None, 2, "outboxd listen")
                    .await
            }
        }
    }
}
