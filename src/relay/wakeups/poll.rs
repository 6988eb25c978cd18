//! Polling (part of [`super`]): the poller's loop, its pace ([`Polling`]),
//! and the probe for added rows ([`Probe`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{QUIET_BEFORE_BACKOFF, Wakeups};
use crate::config::DatabaseConfig;
use crate::store::Store;

impl Wakeups {
    /// While `LISTEN` is not known to work, wakes the buckets drained here
    /// whose head is ready, every `polling.every` — or, adaptively, that
    /// often while polls find something and for [`QUIET_BEFORE_BACKOFF`]
    /// after the last that did, then backing off (doubling) to
    /// `polling.back_off_to` while they find nothing. Between polls the
    /// [`Probe`] wakes the buckets of rows added since it last looked (rows
    /// it finds count as found).
    pub(super) async fn poll(self, store: Store, polling: Polling, cancel: CancellationToken) {
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
    /// workers table's fingerprint when a look is due ([`super::FleetLook`]); a
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
}

/// How far apart the safety net's polls grow while `LISTEN` works and
/// neither they find a ready head nor rows are announced: what an idle
/// worker costs the database, and how long a row nobody announced (the
/// trigger dropped, a notification lost some other way than with the
/// listener's connection) can wait on a worker that has seen no traffic.
pub const SAFETY_NET_BACKS_OFF_TO: Duration = Duration::from_secs(30);

/// How the poller paces itself.
#[derive(Debug, Clone, Copy)]
pub(super) struct Polling {
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
    pub(super) fn new(
        db: &DatabaseConfig,
        back_off_to: Option<Duration>,
        while_listening: Duration,
    ) -> Self {
        Self {
            every: db.poll_interval,
            back_off_to: back_off_to.map(|max| max.max(db.poll_interval)),
            probe: (!db.probe_interval.is_zero()).then_some(db.probe_interval),
            while_listening,
        }
    }
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
pub(super) struct Probe {
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
pub(super) const LONG_QUIET: Duration = Duration::from_secs(30);
/// How far off a stopped probe's next run is.
const STOPPED: Duration = Duration::from_secs(24 * 3600);

/// How soon the probe runs after the database reported a change: soon,
/// but not for every commit of a busy database.
pub(super) const PROBE_AFTER_CHANGE: Duration = Duration::from_millis(1);

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
