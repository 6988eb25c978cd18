//! The partitioner: which bucket a message key belongs to. Pure, no I/O.
//!
//! `bucket = crc32(message_key) % partition_count`, IEEE CRC-32 of the key's
//! UTF-8 bytes (the same function as PHP `crc32()`, Python `zlib.crc32`, Java
//! `CRC32`), so producers in any language compute the same bucket. The label
//! is `p` followed by the bucket number zero-padded to the number of digits of
//! `partition_count`, at least two: `p00`…`p15` for 16 buckets, `p000`…`p099`
//! for 100.
//!
//! The SQL function `outbox_partition_for()` created by the migrations is the
//! same function; both are checked against `tests/vectors/partitioner.jsonl`,
//! which was produced by Python's `zlib.crc32`.

use std::fmt;

/// Fewest buckets a deployment can have.
pub const MIN_PARTITIONS: u32 = 1;
/// Most buckets a deployment can have; more buckets than this only add
/// per-bucket overhead (leases, channels, lag queries) without more order
/// domains anyone can use.
pub const MAX_PARTITIONS: u32 = 1024;

/// A bucket number, `0..partition_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket(pub u32);

/// Maps message keys to buckets and buckets to their labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partitioner {
    count: u32,
}

impl Partitioner {
    /// A partitioner over `count` buckets. `count` must be within
    /// [`MIN_PARTITIONS`]..=[`MAX_PARTITIONS`]; configuration validates that
    /// before anything is built, so this only asserts it.
    pub fn new(count: u32) -> Self {
        assert!(
            (MIN_PARTITIONS..=MAX_PARTITIONS).contains(&count),
            "partition_count {count} out of range"
        );
        Self { count }
    }

    /// The number of buckets.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The bucket of a message key.
    pub fn bucket(&self, message_key: &str) -> Bucket {
        Bucket(crc32fast::hash(message_key.as_bytes()) % self.count)
    }

    /// The label stored in `outbox.partition_key`, e.g. `p07`.
    pub fn label(&self, bucket: Bucket) -> String {
        format!("p{:0width$}", bucket.0, width = self.label_width())
    }

    /// The label of a message key's bucket.
    pub fn label_for(&self, message_key: &str) -> String {
        self.label(self.bucket(message_key))
    }

    /// Every bucket label in bucket order.
    pub fn labels(&self) -> Vec<String> {
        (0..self.count).map(|b| self.label(Bucket(b))).collect()
    }

    /// Parses a label back into a bucket of this partitioner, if it is one.
    pub fn parse_label(&self, label: &str) -> Option<Bucket> {
        let digits = label.strip_prefix('p')?;
        if digits.len() != self.label_width() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u32 = digits.parse().ok()?;
        (n < self.count).then_some(Bucket(n))
    }

    fn label_width(&self) -> usize {
        self.count.to_string().len().max(2)
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_zero_padded_to_the_width_of_the_count() {
        assert_eq!(Partitioner::new(16).label(Bucket(7)), "p07");
        assert_eq!(Partitioner::new(16).labels().last().unwrap(), "p15");
        assert_eq!(Partitioner::new(1).labels(), vec!["p00"]);
        assert_eq!(Partitioner::new(100).label(Bucket(42)), "p042");
        assert_eq!(Partitioner::new(99).label(Bucket(42)), "p42");
    }

    #[test]
    fn parse_label_round_trips_and_rejects_foreign_labels() {
        let p = Partitioner::new(16);
        for label in p.labels() {
            assert_eq!(p.label(p.parse_label(&label).unwrap()), label);
        }
        for bad in ["p16", "p7", "p007", "q07", "p0x", "", "p"] {
            assert_eq!(p.parse_label(bad), None, "{bad}");
        }
    }

    #[test]
    fn known_crc32_values() {
        // The classic IEEE CRC-32 check value.
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            Partitioner::new(16).bucket("123456789"),
            Bucket(0xCBF4_3926 % 16)
        );
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn zero_buckets_is_refused() {
        Partitioner::new(0);
    }
}
