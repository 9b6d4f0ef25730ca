//! A seeded, deterministic simulator of a time-sliced GPU node group serving GitLab CI
//! jobs, to show what gpu-warden's extender and guard buy over NVIDIA's device plugin alone.
//!
//! It calls gpu-warden's real code wherever a decision is made: the guard is
//! `guard::state::Guard` fed full polls (its ranking, levels and reclaim plan included);
//! what the extender reads is the agent's own annotation planner's output
//! (`publish::annotations::AnnotationPlanner`, serialised by `to_annotations`, read by
//! `extender::nodes::read_node`), and its verdicts come from
//! `extender::core::{evaluate, filter_result, prioritize_result}` with the real reservation
//! ledger and the shipped policy file. The simulator owns only the world: jobs (allocating
//! in steps, sharing the GPU's compute), OOM, the kubelet's eviction timing, the default
//! scheduler's scoring and the device plugin's GPU choice.

mod agent;
pub mod engine;
mod idle;
mod kubelet;
mod learning;
pub mod outcome;
pub mod report;
pub mod rng;
pub mod scenario;
mod scheduler;
pub mod workload;

pub use engine::simulate;

/// The engine's public face under its former module name (crates/write-load uses it).
pub mod sim {
    pub use crate::engine::simulate;
    pub use crate::outcome::{Event, EventKind, Outcome};
    pub use crate::scenario::{Cluster, OnDecision, PolicyKind, Scenario, SimError};
}
pub use outcome::{Event, EventKind, Outcome};
pub use scenario::{Cluster, OnDecision, PolicyKind, Scenario, SimError};

/// Runs every policy at every `replicas` setting, in report order.
pub fn run_all(sc: &Scenario, replicas: &[u32]) -> Result<Vec<Outcome>, SimError> {
    let mut out = Vec::new();
    for p in PolicyKind::ALL {
        for r in replicas {
            out.push(simulate(sc, p, *r)?);
        }
    }
    Ok(out)
}
