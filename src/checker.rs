//! The consumer-side checker: what arrived at the broker, judged against
//! what was committed to the outbox.
//!
//! It sees deliveries as `(message_key, outbox id)` pairs (outboxd sets both
//! as headers) and keeps, per key, the id of the latest *first* delivery: a
//! first delivery with a lower id than that is an order violation (G2).
//! Repeated ids are duplicates, allowed by at-least-once (G1) but counted.
//! [`Checker::verdict`] compares the ids seen with the ids committed: lost
//! (committed, never delivered) and unexpected (delivered, never committed).

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::Serialize;

/// A first delivery that arrived after a later message of its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderViolation {
    pub message_key: String,
    /// The id that arrived late.
    pub id: i64,
    /// The higher id of the same key that had already arrived.
    pub after: i64,
}

/// Accumulates deliveries.
#[derive(Debug, Default)]
pub struct Checker {
    latest_first: HashMap<String, i64>,
    seen: HashSet<i64>,
    deliveries: u64,
    duplicates: u64,
    violations: Vec<OrderViolation>,
}

/// The checker's judgement.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Verdict {
    pub deliveries: u64,
    pub unique: usize,
    pub duplicates: u64,
    pub keys: usize,
    pub lost: Vec<i64>,
    pub unexpected: Vec<i64>,
    pub order_violations: Vec<OrderViolation>,
}

impl Verdict {
    /// The counts on one line.
    pub fn summary(&self) -> String {
        format!(
            "distinct {} duplicates {} lost {} unexpected {} order violations {}",
            self.unique,
            self.duplicates,
            self.lost.len(),
            self.unexpected.len(),
            self.order_violations.len()
        )
    }

    /// No loss, nothing unexpected, no order violation.
    pub fn is_clean(&self) -> bool {
        self.lost.is_empty() && self.unexpected.is_empty() && self.order_violations.is_empty()
    }
}

impl Checker {
    /// Records one delivery.
    pub fn observe(&mut self, message_key: &str, id: i64) {
        self.deliveries += 1;
        if !self.seen.insert(id) {
            self.duplicates += 1;
            return;
        }
        match self.latest_first.get_mut(message_key) {
            Some(latest) if id < *latest => self.violations.push(OrderViolation {
                message_key: message_key.to_string(),
                id,
                after: *latest,
            }),
            Some(latest) => *latest = id,
            None => {
                self.latest_first.insert(message_key.to_string(), id);
            }
        }
    }

    /// Distinct ids delivered so far.
    pub fn unique(&self) -> usize {
        self.seen.len()
    }

    pub fn deliveries(&self) -> u64 {
        self.deliveries
    }

    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// What arrived so far, as the demo consumer prints it after its
    /// count: `(distinct …, duplicates …), order violations …`.
    pub fn tally(&self) -> String {
        format!(
            "(distinct {}, duplicates {}), order violations {}",
            self.unique(),
            self.duplicates(),
            self.violations().len()
        )
    }

    pub fn violations(&self) -> &[OrderViolation] {
        &self.violations
    }

    /// Whether `id` has been delivered.
    pub fn has(&self, id: i64) -> bool {
        self.seen.contains(&id)
    }

    /// Judges the deliveries against the ids that were committed.
    pub fn verdict(&self, committed: impl IntoIterator<Item = i64>) -> Verdict {
        let committed: BTreeSet<i64> = committed.into_iter().collect();
        let lost = committed
            .iter()
            .filter(|id| !self.seen.contains(id))
            .copied()
            .collect();
        let mut unexpected: Vec<i64> = self
            .seen
            .iter()
            .filter(|id| !committed.contains(id))
            .copied()
            .collect();
        unexpected.sort_unstable();
        Verdict {
            deliveries: self.deliveries,
            unique: self.seen.len(),
            duplicates: self.duplicates,
            keys: self.latest_first.len(),
            lost,
            unexpected,
            order_violations: self.violations.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_with_duplicates_is_clean() {
        let mut c = Checker::default();
        for (k, id) in [("a", 1), ("b", 2), ("a", 3), ("a", 1), ("a", 3), ("b", 4)] {
            c.observe(k, id);
        }
        let v = c.verdict([1, 2, 3, 4]);
        assert!(v.is_clean(), "{v:?}");
        assert_eq!((v.deliveries, v.unique, v.duplicates, v.keys), (6, 4, 2, 2));
    }

    #[test]
    fn a_late_first_delivery_is_a_violation_but_a_replay_is_not() {
        let mut c = Checker::default();
        // 3 overtakes 1 (both key a): violation when 1 first arrives.
        for (k, id) in [("a", 3), ("b", 2), ("a", 1)] {
            c.observe(k, id);
        }
        let v = c.verdict([1, 2, 3]);
        assert_eq!(
            v.order_violations,
            vec![OrderViolation {
                message_key: "a".into(),
                id: 1,
                after: 3
            }]
        );
        assert!(!v.is_clean());
    }

    #[test]
    fn lost_and_unexpected_are_reported() {
        let mut c = Checker::default();
        c.observe("a", 1);
        c.observe("a", 9);
        let v = c.verdict([1, 2]);
        assert_eq!(v.lost, vec![2]);
        assert_eq!(v.unexpected, vec![9]);
    }
}
