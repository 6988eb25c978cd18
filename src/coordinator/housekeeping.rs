//! Which worker of a fleet does its fleet-wide chores: removing the rows of
//! workers that died, parking rows in unknown buckets, pruning the
//! throughput tables. One worker suffices for each, and each costs the
//! database a statement or more per run whoever runs it, so the fleet
//! leaves them to the first of its live members (the lowest id of the last
//! membership read, which every member computes alike).
//!
//! A worker keeps house from its start until a membership read names another
//! first (so a lone worker, and a `--no-leasing` worker, always does), and
//! keeps the last read's answer while it cannot read the membership or has
//! stepped aside. Two workers may both keep house for a while as the fleet
//! changes, which repeats a chore and nothing else; a fleet is never left
//! without one for longer than a membership read, as its first member
//! always counts itself in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use uuid::Uuid;

/// Whether this worker keeps the fleet's house; cloned to every task that
/// runs a chore.
#[derive(Debug, Clone)]
pub struct Housekeeping(Arc<AtomicBool>);

impl Default for Housekeeping {
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl Housekeeping {
    /// Whether this worker runs the fleet-wide chores now.
    pub fn is_mine(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Follows a membership read: `live` is sorted (see
    /// [`Membership::live`](crate::store::workers::Membership::live)).
    pub fn follow(&self, me: Uuid, live: &[Uuid]) {
        let mine = live.first().is_none_or(|first| *first == me);
        if self.0.swap(mine, Ordering::Relaxed) == mine {
            return;
        }
        if mine {
            tracing::debug!("the fleet-wide chores are this worker's");
        } else {
            tracing::debug!(first = %live[0], "the fleet-wide chores are another worker's");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_live_worker_keeps_house_and_a_lone_one_always_does() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let house = Housekeeping::default();
        assert!(house.is_mine(), "until a read says otherwise");
        house.follow(b, &[a, b]);
        assert!(!house.is_mine());
        house.follow(b, &[b]);
        assert!(house.is_mine());
        house.follow(b, &[]);
        assert!(house.is_mine());
        house.follow(a, &[a, b]);
        assert!(house.is_mine());
    }
}
