//! The injected clock. The core never reads the time itself: it is handed a [`Clock`], so
//! tests can run minutes of scenario in microseconds and assert exact instants.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// A source of monotonic and wall-clock time.
pub trait Clock: Send + Sync {
    /// Monotonic time since this clock's origin.
    fn mono(&self) -> Duration;
    /// Wall-clock time now.
    fn wall(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose monotonic origin is now.
    // The one place the agent reads the machine's clock.
    #[allow(clippy::disallowed_methods)]
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn mono(&self) -> Duration {
        self.origin.elapsed()
    }
    #[allow(clippy::disallowed_methods)]
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to; wall time is `wall_origin + mono`.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<Duration>>,
    wall_origin: SystemTime,
}

impl ManualClock {
    /// A clock at monotonic zero whose wall time starts at `wall_origin`.
    pub fn new(wall_origin: SystemTime) -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(Duration::ZERO)),
            wall_origin,
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
    }

    /// Sets the monotonic time (never backwards).
    pub fn set(&self, to: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        if to > *now {
            *now = to;
        }
    }
}

impl Clock for ManualClock {
    fn mono(&self) -> Duration {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn wall(&self) -> SystemTime {
        self.wall_origin + self.mono()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let c = ManualClock::new(SystemTime::UNIX_EPOCH);
        c.advance(Duration::from_secs(2));
        c.set(Duration::from_secs(1));
        assert_eq!(c.mono(), Duration::from_secs(2));
        assert_eq!(c.wall(), SystemTime::UNIX_EPOCH + Duration::from_secs(2));
    }
}
