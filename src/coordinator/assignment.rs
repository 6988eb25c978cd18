//! Target computation: which buckets a worker should hold, given the sorted
//! ids of the live workers. Pure; every worker computes the same answer from
//! the same membership, so the fleet agrees without talking.
//!
//! - [`Assignment::Modulo`] (default; docs/DESIGN.md §4): the worker at index `i` of `n`
//!   targets every bucket `b` with `b % n == i`. Balanced to within one
//!   bucket, but a join or leave shifts the index of many workers, so most
//!   buckets move.
//! - [`Assignment::Sticky`]: rendezvous (highest-random-weight) hashing —
//!   each bucket goes to the worker with the highest `score(worker, bucket)`.
//!   A join or leave moves only the buckets won or lost by that worker, about
//!   `1/n` of them, at the price of a less even spread.

use uuid::Uuid;

use crate::partitioner::Bucket;

/// `worker.assignment`, a configuration value (defined with the rest of
/// the configuration, which the coordinator reads).
pub use crate::config::Assignment;

/// The buckets `me` targets among `workers` (sorted ascending). Empty when
/// `me` is not among them.
pub fn targets(
    assignment: Assignment,
    workers: &[Uuid],
    me: Uuid,
    partition_count: u32,
) -> Vec<Bucket> {
    debug_assert!(
        workers.windows(2).all(|w| w[0] < w[1]),
        "workers must be sorted"
    );
    let Some(index) = workers.iter().position(|w| *w == me) else {
        return Vec::new();
    };
    (0..partition_count)
        .filter(|&b| owner_index(assignment, workers, b) == index)
        .map(Bucket)
        .collect()
}

/// Index in `workers` of the target owner of bucket `b`.
pub fn owner_index(assignment: Assignment, workers: &[Uuid], b: u32) -> usize {
    match assignment {
        Assignment::Modulo => b as usize % workers.len(),
        Assignment::Sticky => workers
            .iter()
            .enumerate()
            .max_by_key(|(_, w)| score(**w, b))
            .map(|(i, _)| i)
            .expect("at least one worker"),
    }
}

/// A well-mixed 64-bit score of (worker, bucket) (splitmix64 finaliser).
fn score(worker: Uuid, bucket: u32) -> u64 {
    let (hi, lo) = worker.as_u64_pair();
    let mut z = hi ^ lo.rotate_left(29) ^ u64::from(bucket).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize, seed: u128) -> Vec<Uuid> {
        let mut v: Vec<Uuid> = (0..n as u128)
            .map(|i| {
                Uuid::from_u128(
                    (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835) ^ seed,
                )
            })
            .collect();
        v.sort();
        v
    }

    fn owners(a: Assignment, workers: &[Uuid], count: u32) -> Vec<Uuid> {
        (0..count)
            .map(|b| workers[owner_index(a, workers, b)])
            .collect()
    }

    #[test]
    fn modulo_follows_the_spec_rule() {
        let w = ids(3, 1);
        let t: Vec<u32> = targets(Assignment::Modulo, &w, w[1], 16)
            .into_iter()
            .map(|b| b.0)
            .collect();
        assert_eq!(t, vec![1, 4, 7, 10, 13]);
        assert!(targets(Assignment::Modulo, &w, Uuid::nil(), 16).is_empty());
    }

    #[test]
    fn every_bucket_has_exactly_one_target_owner() {
        for a in [Assignment::Modulo, Assignment::Sticky] {
            for n in 1..=6 {
                let w = ids(n, 7);
                let mut all: Vec<u32> = w
                    .iter()
                    .flat_map(|me| targets(a, &w, *me, 16))
                    .map(|b| b.0)
                    .collect();
                all.sort();
                assert_eq!(all, (0..16).collect::<Vec<_>>(), "{a:?} n={n}");
            }
        }
    }

    /// Buckets moved when going from `from` to `to` workers, averaged over
    /// many random fleets (the joining/leaving worker is a random one).
    fn average_moves(a: Assignment, from: usize, to: usize) -> f64 {
        let trials = 500;
        let mut moved = 0;
        for seed in 0..trials {
            let big = ids(from.max(to), seed as u128 * 7919 + 3);
            let mut small = big.clone();
            small.remove(seed % big.len());
            let (before, after) = if from > to {
                (&big, &small)
            } else {
                (&small, &big)
            };
            let (ob, oa) = (owners(a, before, 16), owners(a, after, 16));
            moved += ob.iter().zip(&oa).filter(|(x, y)| x != y).count();
        }
        moved as f64 / trials as f64
    }

    #[test]
    fn sticky_moves_about_one_nth_and_modulo_moves_most() {
        let m34 = average_moves(Assignment::Modulo, 3, 4);
        let m43 = average_moves(Assignment::Modulo, 4, 3);
        let s34 = average_moves(Assignment::Sticky, 3, 4);
        let s43 = average_moves(Assignment::Sticky, 4, 3);
        println!(
            "buckets moved on 16 buckets: modulo 3->4 {m34:.1}, 4->3 {m43:.1}; sticky 3->4 {s34:.1}, 4->3 {s43:.1}"
        );
        // Ideal for a join/leave between 3 and 4 workers: 16/4 = 4 buckets.
        assert!(
            (3.0..=5.0).contains(&s34) && (3.0..=5.0).contains(&s43),
            "{s34} {s43}"
        );
        assert!(m34 > 8.0 && m43 > 8.0, "{m34} {m43}");
    }
}
