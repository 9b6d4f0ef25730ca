//! The pod view's time bounds, as pure rules the watch shell (`attribute::watch`) applies:
//! how long its LIST and watch requests may take (following the API server's measured
//! latency), how long a proof of the view stays good, and the jittered period of the relist
//! that bounds how far behind a watch that shows life but loses events can keep the view.
//! docs/guard.md ("When the API server does not answer") states the bounds for operators.

use std::collections::VecDeque;
use std::time::Duration;

/// How many of the API server's latest answers the latency estimate keeps.
pub const LATENCY_SAMPLES: usize = 4;
/// A request may take this many times the slowest recent answer before it is abandoned.
pub const TIMEOUT_PER_LATENCY: u32 = 4;

/// The API server's recent round-trip times on one kind of the watch's requests (LIST
/// answers, or watch starts), and requests abandoned (each a lower bound on the latency).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiLatency {
    recent: VecDeque<Duration>,
}

impl ApiLatency {
    /// Records an answer that took `took` (or a request abandoned after `took`).
    pub fn observe(&mut self, took: Duration) {
        if self.recent.len() == LATENCY_SAMPLES {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
    }

    /// The slowest of the recent samples: one fast answer does not hide a server that is
    /// slow most of the time, and a slow spell is forgotten after [`LATENCY_SAMPLES`] answers.
    pub fn slowest(&self) -> Option<Duration> {
        self.recent.iter().max().copied()
    }
}

/// The range a LIST or watch request's timeout may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBounds {
    /// The shortest timeout, however fast the server (a fast server's hiccup is not a
    /// failure).
    pub floor: Duration,
    /// The longest: a request that takes more than this is abandoned whatever the server's
    /// measured latency, and the first request (nothing measured yet) waits this long.
    pub ceiling: Duration,
}

impl RequestBounds {
    /// The timeout of the next request: [`TIMEOUT_PER_LATENCY`] × the slowest recent answer,
    /// within `floor..=ceiling`; `ceiling` while nothing has been measured (the first LIST
    /// is the one with no view at all: abandoning it early only delays the view).
    pub fn timeout(&self, latency: &ApiLatency) -> Duration {
        let ceiling = self.ceiling.max(self.floor);
        match latency.slowest() {
            None => ceiling,
            Some(l) => l
                .saturating_mul(TIMEOUT_PER_LATENCY)
                .clamp(self.floor, ceiling),
        }
    }
}

/// How long after the API server last proved the view current it still counts as proven:
/// the stall bound (the longest a healthy watch is silent), stretched to the request
/// timeout while the server is slow, so that waiting out one slow answer does not count as
/// the view going stale.
pub fn proof_lifetime(stall_bound: Duration, request_timeout: Duration) -> Duration {
    stall_bound.max(request_timeout)
}

/// The period until the next periodic relist: `period` shortened by up to a quarter,
/// drawn from `seed` (the node) and `n` (how many relists so far), so that the agents of a
/// fleet that all relisted after the same outage do not keep relisting in step.
pub fn jittered(period: Duration, seed: u64, n: u64) -> Duration {
    // splitmix64's finaliser: neighbouring seeds and counts give unrelated draws.
    let mut x = seed ^ n.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let quarter = period / 4;
    let span = u64::try_from(quarter.as_nanos()).unwrap_or(u64::MAX);
    period - Duration::from_nanos(x % span.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn timeouts_follow_the_slowest_recent_answer_within_bounds() {
        let bounds = RequestBounds {
            floor: s(30),
            ceiling: s(90),
        };
        // (answers so far, expected timeout of the next request)
        let cases: Vec<(Vec<Duration>, Duration)> = vec![
            (vec![], s(90)),
            (vec![Duration::from_millis(40)], s(30)),
            (vec![s(5), s(10)], s(40)),
            // the 31 s LIST of issue 30: the next one may take 90 s, not 30
            (vec![s(31)], s(90)),
            // one fast answer does not hide a slow server
            (vec![s(12), Duration::from_millis(40)], s(48)),
            // a slow spell is forgotten after four answers
            (vec![s(31), s(1), s(1), s(1), s(1)], s(30)),
        ];
        for (samples, want) in cases {
            let mut l = ApiLatency::default();
            for x in &samples {
                l.observe(*x);
            }
            assert_eq!(bounds.timeout(&l), want, "{samples:?}");
        }
        // a ceiling below the floor is the floor
        let odd = RequestBounds {
            floor: s(30),
            ceiling: s(10),
        };
        assert_eq!(odd.timeout(&ApiLatency::default()), s(30));
    }

    #[test]
    fn a_proof_lasts_the_stall_bound_or_the_request_timeout() {
        assert_eq!(proof_lifetime(s(30), s(30)), s(30));
        assert_eq!(proof_lifetime(s(30), s(90)), s(90));
        assert_eq!(proof_lifetime(s(30), s(10)), s(30));
    }

    #[test]
    fn relist_periods_are_jittered_down_by_at_most_a_quarter() {
        let p = s(300);
        let draws: Vec<Duration> = (0..50).map(|n| jittered(p, 42, n)).collect();
        assert!(
            draws.iter().all(|d| *d <= p && *d >= p * 3 / 4),
            "{draws:?}"
        );
        assert!(draws.windows(2).any(|w| w[0] != w[1]), "not all alike");
        assert_ne!(jittered(p, 42, 0), jittered(p, 43, 0), "nodes differ");
        assert_eq!(jittered(Duration::ZERO, 1, 1), Duration::ZERO);
    }
}
