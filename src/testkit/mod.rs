//! The test kit every test, soak and bench uses: table builders for snapshots and pods
//! ([`fixtures`]), a simulated node on the real agent core ([`rig`]), the benchmark node
//! generator ([`scenarios`]) and a bounded wait. Its own crate, so the integration tests and
//! benches share one copy as a dev-dependency and the shipped binary does not contain it.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
use gpu_warden_agent as agent;
use gpu_warden_attribute as attribute;
use gpu_warden_guard as guard;
use gpu_warden_model as model;
use gpu_warden_publish as publish;
use gpu_warden_sample as sample;

pub use gpu_warden_fixtures as fixtures;
pub mod rig;
pub mod scenarios;

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it returns `Some`, or panics naming `what` after `within`.
/// For tests only: a timeout here is a failed assertion.
pub fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    wait_for_seen(what, within, || f().ok_or(""))
}

/// As [`wait_for`], for a probe that says what it saw when it is not there yet (`Err`): the
/// panic after `within` shows the last of it, so a timeout explains itself.
#[allow(clippy::disallowed_methods)] // waits on real time, by design
pub fn wait_for_seen<T, S: std::fmt::Display>(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> Result<T, S>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let seen = match f() {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            let seen = seen.to_string();
            if seen.is_empty() {
                panic!("timed out waiting for {what}");
            }
            panic!("timed out waiting for {what}; last seen:\n{seen}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
