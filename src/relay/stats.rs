//! Counters of one worker process, read by the tick reporter.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Totals since the worker started.
#[derive(Debug, Default)]
pub struct RelayStats {
    published: AtomicU64,
    failed: AtomicU64,
    parked: AtomicU64,
    claimed: AtomicU64,
    batches: AtomicU64,
    fenced: AtomicU64,
}

/// A copy of the counters at one instant.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Rows confirmed by the broker and recorded as published.
    pub published: u64,
    /// Failed publish attempts (each bumps a row's `attempts`).
    pub failed: u64,
    /// Rows parked (`failed_at` set) after their last allowed attempt.
    pub parked: u64,
    /// Rows claimed.
    pub claimed: u64,
    /// Batches claimed.
    pub batches: u64,
    /// Writes that matched no row because the claim or the lease had moved
    /// on (fleet mode: a lease lost while a batch was in flight).
    pub fenced: u64,
}

impl RelayStats {
    pub fn add_published(&self, n: usize) {
        self.published.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_failed(&self, n: usize) {
        self.failed.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_parked(&self, n: usize) {
        self.parked.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_fenced(&self, n: usize) {
        self.fenced.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_claimed(&self, n: usize) {
        self.claimed.fetch_add(n as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            published: self.published.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            claimed: self.claimed.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
        }
    }
}

impl StatsSnapshot {
    /// The counts between `earlier` and `self`.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            published: self.published - earlier.published,
            failed: self.failed - earlier.failed,
            parked: self.parked - earlier.parked,
            claimed: self.claimed - earlier.claimed,
            batches: self.batches - earlier.batches,
            fenced: self.fenced - earlier.fenced,
        }
    }
}
