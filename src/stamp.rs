//! [`Stamp`]: when something last happened, shared between tasks without a
//! lock (a loop's last turn for the probes, a pool's last opened connection
//! and last refused opening for `store::trim`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A stamp's `last` until it is first marked.
const NEVER: u64 = u64::MAX;

/// When something last happened; made "now". Cheap to clone (clones share
/// the time).
#[derive(Debug, Clone)]
pub struct Stamp {
    origin: Instant,
    /// Milliseconds after `origin`.
    last: Arc<AtomicU64>,
}

impl Default for Stamp {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last: Arc::default(),
        }
    }
}

impl Stamp {
    /// Not happened yet: [`Stamp::ago`] is `Duration::MAX` until marked.
    pub fn never() -> Self {
        Self {
            origin: Instant::now(),
            last: Arc::new(AtomicU64::new(NEVER)),
        }
    }

    /// It happened now.
    pub fn mark(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    /// How long ago it last happened.
    pub fn ago(&self) -> Duration {
        let last = self.last.load(Ordering::Relaxed);
        if last == NEVER {
            return Duration::MAX;
        }
        let last = Duration::from_millis(last);
        self.origin.elapsed().saturating_sub(last)
    }
}
