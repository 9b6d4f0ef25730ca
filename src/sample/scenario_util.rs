//! A simulated process's SM utilisation over time: the scenario's `sm_util` (constant) or
//! `sm_util_steps` (a job that holds the GPU idle, computes, then idles again), read by the
//! simulator at each poll. Plain data and its one lookup.

use super::scenario::ProcessSpec;
use crate::model::units::duration_serde;
use serde::Deserialize;
use std::time::Duration;

/// From `at` (time since the process started) on, the process's kernels run on the SMs
/// this share of the time (0..1), until the next step.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UtilStep {
    #[serde(deserialize_with = "duration_serde::deserialize")]
    pub at: Duration,
    pub util: f64,
}

impl ProcessSpec {
    /// The SM share at `t` since the process started: the last step at or before `t` (0
    /// before the first), else the constant `sm_util`; None when the scenario gives neither.
    pub fn sm_util_at(&self, t: Duration) -> Option<f64> {
        if self.sm_util_steps.is_empty() {
            return self.sm_util;
        }
        Some(
            self.sm_util_steps
                .iter()
                .take_while(|s| s.at <= t)
                .last()
                .map_or(0.0, |s| s.util),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::sample::scenario::Scenario;
    use std::time::Duration;

    #[test]
    fn steps_override_the_constant_and_are_checked() {
        let s = Scenario::parse(
            "gpus:\n  - {model: X, memory_mib: 100}\nprocesses:\n  - {pid: 5, gpu: 0, memory: {constant: 10}, sm_util_steps: [{at: 10s, util: 0.9}, {at: 20s, util: 0}]}\n",
            "t",
        )
        .unwrap();
        let p = &s.processes[0];
        let at = |s: u64| p.sm_util_at(Duration::from_secs(s));
        assert_eq!(
            (at(0), at(10), at(19), at(20)),
            (Some(0.0), Some(0.9), Some(0.9), Some(0.0))
        );
        let e = Scenario::parse(
            "gpus:\n  - {model: X, memory_mib: 100}\nprocesses:\n  - {pid: 5, gpu: 0, memory: {constant: 10}, sm_util_steps: [{at: 1s, util: 1.5}]}\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("processes[0].sm_util_steps"), "{e}");
    }
}
