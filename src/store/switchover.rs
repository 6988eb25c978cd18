//! What a pool does after a switchover: the old address may answer as a
//! read-only standby (a demoted primary, a replica behind a moved name). A
//! statement failing because the server is read-only marks every
//! connection of *its store* opened before it as stale, and the store's
//! pool closes stale connections instead of handing them out
//! ([`Switchover::opened_before_stale`]), so workers reconnect — to
//! whatever the name or the pooler points at now — and retry.
//!
//! Each store has its own [`Switchover`] (in its [`super::Bounds`]): a
//! read-only answer from one source's database never makes another
//! source's pool reconnect.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One store's view of its database's last read-only answer.
#[derive(Debug, Default)]
pub struct Switchover {
    /// When a statement last failed because the database is read-only,
    /// in milliseconds since [`epoch`] (0: never).
    read_only_seen_ms: AtomicU64,
}

/// The process's reference instant, so a mark fits in one atomic.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch_ms(at: Instant) -> u64 {
    // +1 so that a mark at the epoch itself is not "never".
    at.saturating_duration_since(epoch()).as_millis() as u64 + 1
}

/// True when an error says the server is read-only: PostgreSQL's SQLSTATE
/// 25006 (a standby, or a primary being demoted); MySQL's 1290 (running
/// with `--read-only`) and 1836 (read-only mode).
pub fn is_read_only(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(my.number(), 1290 | 1836);
    }
    db.code().as_deref() == Some("25006")
}

impl Switchover {
    /// Called with every failed statement of the store: a read-only server
    /// makes every connection opened so far stale.
    pub(crate) fn note_failure(&self, e: &sqlx::Error) {
        if is_read_only(e) {
            self.mark_read_only(Instant::now());
        }
    }

    /// Every connection opened up to `at` is stale.
    fn mark_read_only(&self, at: Instant) {
        let _ = epoch();
        let now = since_epoch_ms(at);
        let before = self.read_only_seen_ms.swap(now, Ordering::Relaxed);
        if before == 0 || now.saturating_sub(before) > 10_000 {
            tracing::warn!(
                "the database is read-only (a standby, or a switchover in progress): \
                 reconnecting every connection and retrying"
            );
        }
    }

    /// True when a connection of age `age` was opened before (or when) the
    /// database was last seen read-only.
    pub(crate) fn opened_before_stale(&self, age: Duration) -> bool {
        let seen = self.read_only_seen_ms.load(Ordering::Relaxed);
        if seen == 0 {
            return false;
        }
        let opened = Instant::now().checked_sub(age).unwrap_or_else(epoch);
        since_epoch_ms(opened) <= seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_opened_before_a_read_only_error_are_stale_and_later_ones_are_not() {
        let _ = epoch();
        let store = Switchover::default();
        std::thread::sleep(Duration::from_millis(30));
        // Opened 20 ms ago, then the database turned out read-only.
        let opened_earlier = Instant::now() - Duration::from_millis(20);
        store.mark_read_only(Instant::now());
        std::thread::sleep(Duration::from_millis(5));
        let age = |opened: Instant| Instant::now().duration_since(opened);
        assert!(store.opened_before_stale(age(opened_earlier)));
        // A connection opened after the error.
        let opened_later = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(!store.opened_before_stale(age(opened_later)));
    }

    #[test]
    fn a_read_only_answer_of_one_store_leaves_another_stores_connections_alone() {
        let (one, other) = (Switchover::default(), Switchover::default());
        let opened = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        one.mark_read_only(Instant::now());
        let age = opened.elapsed();
        assert!(one.opened_before_stale(age));
        assert!(!other.opened_before_stale(age));
    }
}
