//! Exponential backoff: the pauses between attempts at something that
//! keeps failing (a connection to the broker, a statement the database
//! refused), doubling from a first pause up to a cap. Each pause is spread
//! by up to 10 % ([`crate::jitter`]), so that the drainers of a worker,
//! and the workers of a fleet, do not retry in step against a broker or a
//! database coming back.

use std::time::Duration;

use crate::jitter::jittered;

/// Pauses that double from `first` up to `max`, each ± up to 10 %.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first` (or `max`, if that is shorter).
    pub fn new(first: Duration, max: Duration) -> Self {
        let first = first.min(max);
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The pause before the next attempt; the one after it is twice as
    /// long, up to the cap.
    pub fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (pause * 2).min(self.max);
        jittered(pause)
    }

    /// After a success: the next failure pauses for the first pause again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near(pause: Duration, ms: u64) -> bool {
        let ms = Duration::from_millis(ms);
        pause >= ms - ms / 10 && pause <= ms + ms / 10
    }

    #[test]
    fn doubles_up_to_the_cap_and_starts_over_after_a_reset() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let pauses: Vec<Duration> = (0..5).map(|_| backoff.pause()).collect();
        for (pause, ms) in pauses.iter().zip([100, 200, 400, 500, 500]) {
            assert!(near(*pause, ms), "{pause:?} is not {ms} ms ± 10 %");
        }
        backoff.reset();
        let pause = backoff.pause();
        assert!(near(pause, 100), "{pause:?} after a reset");
    }

    #[test]
    fn a_cap_below_the_first_pause_wins() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_millis(300));
        let pause = backoff.pause();
        assert!(near(pause, 300), "{pause:?}");
    }
}
