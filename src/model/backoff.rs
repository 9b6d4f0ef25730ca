//! Exponential backoff with jitter, shared by the shells that retry against the API server
//! (the pod watch's relist, the node annotator). Pure: the caller sleeps.

use std::time::Duration;

/// Exponential backoff with "equal jitter": each pause lies in `[base/2, base]`, the base
/// doubling from `initial` up to `max`. Jitter spreads the retries of a thousand nodes
/// that all lost the same API server at the same moment; the lower half-bound keeps one
/// node from retrying almost at once.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    base: Option<Duration>,
    rng: u64,
}

impl Backoff {
    /// A backoff with no failures yet; `seed` drives the jitter (any value).
    pub fn new(initial: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            base: None,
            // xorshift has a fixed point at zero.
            rng: if seed == 0 {
                0x9e37_79b9_7f4a_7c15
            } else {
                seed
            },
        }
    }

    /// The pause before the next attempt after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let base = match self.base {
            None => self.initial,
            Some(b) => b.saturating_mul(2).min(self.max),
        };
        self.base = Some(base);
        let half = base / 2;
        let span = u64::try_from((base - half).as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(self.next_random() % span.saturating_add(1))
    }

    /// Forgets the failures (after a success).
    pub fn reset(&mut self) {
        self.base = None;
    }

    /// The base of the last pause (`None` before the first failure or after a reset).
    pub fn current_base(&self) -> Option<Duration> {
        self.base
    }

    /// xorshift64: enough to decorrelate nodes without pulling in `rand`.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(30), 42);
        let waits: Vec<Duration> = (0..10).map(|_| b.next_delay()).collect();
        assert!(waits[0] >= Duration::from_millis(250) && waits[0] <= Duration::from_millis(500));
        assert!(waits[9] >= Duration::from_secs(15) && waits[9] <= Duration::from_secs(30));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(500));
        let mut other = Backoff::new(Duration::from_millis(500), Duration::from_secs(30), 44);
        let theirs: Vec<Duration> = (0..10).map(|_| other.next_delay()).collect();
        assert_ne!(waits, theirs, "jitter differs between agents");
    }
}
