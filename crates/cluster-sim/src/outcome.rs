//! What a run reports: the trace of every job attempt and the figures of the table.

use crate::scenario::{OnDecision, PolicyKind};

/// What happened to one job attempt (kept for tests and for tracing a run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Placed on (node, GPU index).
    Started(usize, u32),
    /// Ran to completion.
    Finished,
    /// Killed by a CUDA out-of-memory error.
    OomKilled,
    /// Evicted by the guard (it is queued again).
    Evicted,
}

/// One event of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Seconds since the start.
    pub at_s: u64,
    /// The job.
    pub job: u64,
    /// What happened.
    pub kind: EventKind,
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The policy.
    pub policy: PolicyKind,
    /// The guard's action on decision.
    pub on_decision: OnDecision,
    /// The seed.
    pub seed: u64,
    /// Time-slicing replicas per GPU.
    pub replicas: u32,
    /// Jobs submitted.
    pub jobs: usize,
    /// Jobs that ran to completion.
    pub finished: usize,
    /// Jobs killed by GPU OOM (each fails; it is not retried).
    pub oom_killed: usize,
    /// Of those, the jobs that never used more than they declared (they did everything
    /// asked of them and died of a neighbour).
    pub oom_within_declared: usize,
    /// Of those, the jobs that declared nothing.
    pub oom_undeclared: usize,
    /// Evictions (each retried: the job is queued again).
    pub evictions: usize,
    /// Of those, victims that were not growing (`GROWING_WINDOW_S` in crates/cluster-sim/src/kubelet.rs): bystanders.
    pub evicted_not_growing: usize,
    /// Of those, the ones within their declared `vram-request-mib`.
    pub evicted_not_growing_within_declared: usize,
    /// MiB the guard's victims allocated after its decision (the kubelet's grace, when
    /// they are not stopped).
    pub victim_growth_mib: u64,
    /// OOM kills by cause (see `Engine::kill_cause`): whether the job grew past the need
    /// the extender placed it on, a neighbour did, or the needs together passed the GPU.
    pub oom_causes: std::collections::BTreeMap<String, usize>,
    /// Jobs finished after the warm-up, per GPU-hour of the rest of the run.
    pub jobs_per_gpu_hour: f64,
    /// Evictions per hour.
    pub evictions_per_hour: f64,
    /// Queue wait of every attempt, seconds (attempts still queued at the end count with
    /// the wait so far), p95.
    pub wait_p95_s: f64,
    /// GiB-hours used / GiB-hours available.
    pub utilisation: f64,
    /// Replica-steps after the warm-up with jobs queued and no job on the replica, as a
    /// share of all replica-steps then (`idle.rs`).
    pub idle_replicas: f64,
    /// Of all those replica-steps, the idle ones on a GPU the extender sees with under
    /// 4 GiB of room.
    pub idle_short_of_room: f64,
    /// Of all those replica-steps, the idle ones the extender's view counts as taken (the
    /// node's figures and the ledger's pending pods leave none on their GPU).
    pub idle_counted_taken: f64,
    /// Every event, in order.
    pub trace: Vec<Event>,
}

impl Outcome {
    /// OOM kills as a share of submitted jobs.
    pub fn oom_share(&self) -> f64 {
        self.oom_killed as f64 / (self.jobs.max(1)) as f64
    }
}

/// The `p` quantile of sorted values (nearest rank).
pub fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}
