//! How long the fresh read of a victim may take: it follows the API server's measured
//! latency within bounds, so a slow but working server slows the guard down instead of
//! switching it off (issue 30: every GET answered after 3 s against a fixed 2 s limit, the
//! walk aborted five times and the GPU filled). Pure: the enforcer reports each read.

use std::collections::VecDeque;
use std::time::Duration;

/// How many recent reads the bound remembers.
const REMEMBERED: usize = 5;
/// The limit is this many times the slowest recent read.
const HEADROOM: u32 = 2;

/// The fresh-read limit: `HEADROOM` × the slowest of the last `REMEMBERED` reads (a read
/// that timed out counts as its limit, so each timeout doubles it), never below `floor`
/// nor above `ceiling`.
#[derive(Debug, Clone)]
pub struct ReadTimeout {
    floor: Duration,
    ceiling: Duration,
    recent: VecDeque<Duration>,
}

impl ReadTimeout {
    /// Starts at `floor`; grows up to `ceiling`.
    pub fn new(floor: Duration, ceiling: Duration) -> Self {
        ReadTimeout {
            floor,
            ceiling: ceiling.max(floor),
            recent: VecDeque::new(),
        }
    }

    /// The limit for the next read.
    pub fn limit(&self) -> Duration {
        let slowest = self.recent.iter().max().copied().unwrap_or_default();
        (slowest * HEADROOM).clamp(self.floor, self.ceiling)
    }

    fn push(&mut self, d: Duration) {
        self.recent.push_back(d);
        while self.recent.len() > REMEMBERED {
            self.recent.pop_front();
        }
    }

    /// A read answered after `took`.
    pub fn answered(&mut self, took: Duration) {
        self.push(took);
    }

    /// A read got no answer within `limit`: the server is slower than that.
    pub fn timed_out(&mut self, limit: Duration) {
        self.push(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn the_limit_follows_the_server_within_bounds() {
        let mut t = ReadTimeout::new(ms(2000), ms(15_000));
        assert_eq!(t.limit(), ms(2000), "starts at the floor");
        t.answered(ms(5));
        assert_eq!(t.limit(), ms(2000), "a fast server keeps the floor");
        // A server answering after 3 s: the first read times out at 2 s, the next waits 4 s.
        t.timed_out(ms(2000));
        assert_eq!(t.limit(), ms(4000), "each timeout doubles the limit");
        t.answered(ms(3000));
        assert_eq!(t.limit(), ms(6000), "then twice the slowest answer");
        // Never above the ceiling, however slow.
        for _ in 0..5 {
            t.timed_out(t.limit());
        }
        assert_eq!(t.limit(), ms(15_000));
        // Back to normal once the slow reads are forgotten.
        for _ in 0..REMEMBERED {
            t.answered(ms(10));
        }
        assert_eq!(t.limit(), ms(2000));
    }
}
