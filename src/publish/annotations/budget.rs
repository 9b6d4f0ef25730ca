//! The Node's write budget: a token bucket that lets an over-promise be corrected at once
//! while keeping the Node's writes, averaged over any long span, at one per minimum
//! interval (docs/annotations.md, "Write discipline").
//!
//! Every Node write spends a token; tokens come back at one per `refill` (the minimum
//! interval) and at most `burst` are kept. An ordinary change or a heartbeat waits for the
//! minimum interval since the last write anyway, and by then a token has come back, so only
//! an over-promise correction (which may go sooner) ever has to ask. Over a span `T` the
//! Node is written at most `burst + T / refill` times, whatever the node does: a churning
//! node spends its burst, then corrects at most one over-promise per `refill`.

use std::time::Duration;

/// A token bucket over monotonic time, its credit counted in time (one token = `refill`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBudget {
    refill: Duration,
    burst: u32,
    /// Credit at `at`, capped at `burst × refill`.
    credit: Duration,
    at: Option<Duration>,
}

impl WriteBudget {
    /// A full bucket of `burst` tokens, one coming back per `refill`.
    pub fn new(refill: Duration, burst: u32) -> Self {
        WriteBudget {
            refill,
            burst,
            credit: refill.saturating_mul(burst),
            at: None,
        }
    }

    fn cap(&self) -> Duration {
        self.refill.saturating_mul(self.burst)
    }

    fn credit_at(&self, now: Duration) -> Duration {
        let earned = self.at.map_or(Duration::ZERO, |t| now.saturating_sub(t));
        self.credit.saturating_add(earned).min(self.cap())
    }

    /// Whether a token is there at `now` (always, with a zero `refill`: no budget).
    pub fn has_token(&self, now: Duration) -> bool {
        self.burst > 0 && self.credit_at(now) >= self.refill
    }

    /// When the next token is there (`now` if one is); `None` with a zero burst.
    pub fn token_at(&self, now: Duration) -> Option<Duration> {
        if self.burst == 0 {
            return None;
        }
        let credit = self.credit_at(now);
        Some(now.saturating_add(self.refill.saturating_sub(credit)))
    }

    /// Spends a token at `now`. A write the minimum interval allows goes whether or not a
    /// whole token is there (a heartbeat may come a few ms early); the bucket then stays
    /// empty, never negative.
    pub fn spend(&mut self, now: Duration) {
        self.credit = self.credit_at(now).saturating_sub(self.refill);
        self.at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    #[test]
    fn a_full_bucket_spends_its_burst_then_one_per_refill() {
        let mut b = WriteBudget::new(s(330), 3);
        for t in [0, 1, 2] {
            assert!(b.has_token(s(t)), "t={t}");
            b.spend(s(t));
        }
        assert!(!b.has_token(s(3)));
        // The third spend left 2 s of credit: the next token at 330 s.
        assert_eq!(b.token_at(s(3)), Some(s(330)));
        assert!(!b.has_token(s(329)));
        assert!(b.has_token(s(330)));
        b.spend(s(330));
        assert_eq!(b.token_at(s(331)), Some(s(660)));
        // Idle for long: never more than the burst.
        assert!(b.has_token(s(5000)));
        for t in [5000, 5001, 5002] {
            b.spend(s(t));
        }
        assert!(!b.has_token(s(5003)));
    }

    #[test]
    fn writes_over_any_span_stay_within_burst_plus_span_over_refill() {
        // A node that would correct every 7 s for an hour.
        let mut b = WriteBudget::new(s(330), 3);
        let mut writes = 0;
        for t in (0..3600).step_by(7) {
            if b.has_token(s(t)) {
                b.spend(s(t));
                writes += 1;
            }
        }
        assert!(writes <= 3 + 3600 / 330, "{writes}");
        assert!(writes >= 3600 / 330, "{writes}");
    }

    #[test]
    fn an_early_spend_empties_but_never_overdraws_and_zero_burst_has_no_token() {
        let mut b = WriteBudget::new(s(10), 1);
        b.spend(s(0));
        b.spend(s(1));
        assert_eq!(b.token_at(s(1)), Some(s(11)));
        let z = WriteBudget::new(s(10), 0);
        assert!(!z.has_token(s(100)));
        assert_eq!(z.token_at(s(100)), None);
        let free = WriteBudget::new(Duration::ZERO, 3);
        assert!(free.has_token(s(0)));
    }
}
