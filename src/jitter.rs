//! Spreads periodic work: [`jittered`] turns a period into one up to 10 %
//! shorter or longer, at random, so that the periodic statements of one
//! worker (coordinator cycle, safety-net poll) do not fall into step and
//! run at the same moment every time — which made an idle worker's pool
//! keep a second connection open (see `store::trim`) — and the workers of
//! a fleet do not either.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

/// `period` ± up to 10 %, at random.
pub fn jittered(period: Duration) -> Duration {
    // RandomState's keys are random per process and advance per call.
    let r = RandomState::new().hash_one(0u8) % 2001; // 0..=2000
    let tenth = period / 10;
    (period - tenth) + tenth * (r as u32) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_ten_percent_and_varies() {
        let period = Duration::from_millis(500);
        let seen: Vec<Duration> = (0..200).map(|_| jittered(period)).collect();
        assert!(
            seen.iter()
                .all(|d| *d >= Duration::from_millis(450) && *d <= Duration::from_millis(550))
        );
        let distinct: std::collections::BTreeSet<_> = seen.iter().collect();
        assert!(distinct.len() > 50, "{} distinct", distinct.len());
    }
}
