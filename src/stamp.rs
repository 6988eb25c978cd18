//! [`Stamp`]: when something last happened, shared between tasks without a
//! lock (a loop's last turn for the probes, a pool's last opened connection
//! for `store::trim`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

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
    /// It happened now.
    pub fn mark(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    /// How long ago it last happened.
    pub fn ago(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }
}
