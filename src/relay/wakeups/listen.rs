//! `LISTEN` (part of [`super`]): the listener, its self-check and its
//! reconnects.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{SELF_CHECK, Wakeups};
use crate::backoff::Backoff;
use crate::config::fmt_duration;
use crate::store::{Channel, Listener, Store, StoreError};

impl Wakeups {
    /// Listens for `<outbox>_enqueued` and `<outbox>_fleet` notifications
    /// until cancelled, or until its self-check fails (then polling takes
    /// over for good), starting from `first`, the first attempt to connect.
    /// Reconnects by itself; after a reconnect everything is woken, since
    /// notifications sent meanwhile are lost.
    pub(super) async fn listen(
        self,
        store: Store,
        direct: Option<String>,
        first: Result<Box<dyn Listener>, StoreError>,
        // What it falls back to if its self-check fails ([`finding_rows`]).
        fallback: String,
        cancel: CancellationToken,
    ) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let mut first = Some(first);
        while !cancel.is_cancelled() {
            self.listening.store(false, Ordering::Relaxed);
            let attempt = match first.take() {
                Some(attempt) => attempt,
                None => store.listen(direct.as_deref()).await,
            };
            let mut listener = match attempt {
                Ok(l) => l,
                Err(e) => {
                    let delay = backoff.pause();
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot LISTEN for wake-ups; polling meanwhile");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    continue;
                }
            };
            backoff.reset();
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
