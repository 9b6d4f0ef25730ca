//! A seeded, deterministic simulator of a time-sliced GPU node group serving GitLab CI
//! jobs, to show what gpu-warden's extender and guard buy over NVIDIA's device plugin alone.
//!
//! It calls gpu-warden's real code wherever a decision is made: the guard is
//! `guard::state::Guard` fed full polls (its ranking, levels and reclaim plan included),
//! the extender's inputs are the agent's own annotation values
//! (`publish::annotations::values::annotation_values_with`, serialised by `to_annotations`) and its
//! verdicts come from `extender::core::{evaluate, filter_result, prioritize_result}` with
//! the real reservation ledger. The simulator owns only the world: jobs, memory growth,
//! OOM, the scheduler's loop and the device plugin's GPU choice
//! (`model::replicas::Allocations::next_gpu`).

pub mod report;
pub mod rng;
pub mod sim;
pub mod workload;

pub use sim::{simulate, Cluster, Outcome, PolicyKind, Scenario};

/// Runs every policy at every `replicas` setting, in report order.
pub fn run_all(sc: &Scenario, replicas: &[u32]) -> Result<Vec<Outcome>, sim::SimError> {
    let mut out = Vec::new();
    for p in PolicyKind::ALL {
        for r in replicas {
            out.push(simulate(sc, p, *r)?);
        }
    }
    Ok(out)
}
