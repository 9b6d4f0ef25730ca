//! The test kit every test, soak and bench uses: table builders for snapshots and pods
//! ([`fixtures`]), a simulated node on the real agent core ([`rig`]), and a bounded wait.
//! It is part of the library so the integration tests and benches share one copy.

pub mod fixtures;
pub mod rig;

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it returns `Some`, or panics naming `what` after `within`.
/// For tests only: a timeout here is a failed assertion.
#[allow(clippy::disallowed_methods)] // waits on real time, by design
pub fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
