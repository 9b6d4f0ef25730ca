//! What one run depends on: the node group, the job stream, the policies (the shipped
//! extender policy file by default), the kubelet's and the agents' timing, and which
//! components place and protect the jobs.

use crate::workload::{Job, WorkloadModel};
use gpu_warden_guard::policy::Policy;

/// The namespace the runner creates job pods in.
pub const NAMESPACE: &str = "gitlab-runner";
/// The annotation prefix (agents, guard and extender agree on it).
pub const PREFIX: &str = "gpu-warden.io";
/// The extender policy the chart and kustomize ship (the kustomize file; CI checks the
/// chart renders the same).
pub const SHIPPED_EXTENDER_POLICY: &str =
    include_str!("../../../deploy/components/scheduler/extender.yaml");
/// The scheduler's extender weight as shipped (deploy/components/scheduler): the
/// extender's 0..10 score is scaled by 10 and by this weight before it is added to the
/// plugins' scores.
pub const EXTENDER_WEIGHT: i64 = 5;

/// Which components place and protect the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PolicyKind {
    /// kube-scheduler's default plugins and NVIDIA's device plugin alone.
    DevicePlugin,
    /// Plus gpu-warden's guard (enforce mode).
    Guard,
    /// Plus the extender filtering and scoring nodes.
    ExtenderGuard,
}

impl PolicyKind {
    /// All three, in report order.
    pub const ALL: [PolicyKind; 3] = [
        PolicyKind::DevicePlugin,
        PolicyKind::Guard,
        PolicyKind::ExtenderGuard,
    ];

    /// Label in the report.
    pub fn label(self) -> &'static str {
        match self {
            PolicyKind::DevicePlugin => "device plugin",
            PolicyKind::Guard => "+ guard",
            PolicyKind::ExtenderGuard => "+ extender + guard",
        }
    }

    /// Short name for the CSV.
    pub fn key(self) -> &'static str {
        match self {
            PolicyKind::DevicePlugin => "device-plugin",
            PolicyKind::Guard => "guard",
            PolicyKind::ExtenderGuard => "extender-guard",
        }
    }

    /// Whether the guard runs.
    pub fn guard(self) -> bool {
        self != PolicyKind::DevicePlugin
    }

    /// Whether the extender runs.
    pub fn extender(self) -> bool {
        self == PolicyKind::ExtenderGuard
    }
}

/// What the guard does to its victim when it decides (the policy key `onDecision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OnDecision {
    /// Evict only: the job keeps running, and allocating, until the kubelet's SIGKILL at
    /// `max(grace, 2 s)` (its shell PID 1 ignores the SIGTERM).
    Evict,
    /// SIGSTOP the victim's GPU processes, then evict: growth halts at once, the memory
    /// comes back with the SIGKILL at `max(grace, 2 s)`.
    Stop,
    /// SIGKILL them, then evict: the memory comes back ≈60 ms after the decision.
    Kill,
}

impl OnDecision {
    /// The policy value.
    pub fn key(self) -> &'static str {
        match self {
            OnDecision::Evict => "evict",
            OnDecision::Stop => "stop",
            OnDecision::Kill => "kill",
        }
    }

    /// Parses the policy value.
    pub fn parse(s: &str) -> Option<OnDecision> {
        match s {
            "evict" => Some(OnDecision::Evict),
            "stop" => Some(OnDecision::Stop),
            "kill" => Some(OnDecision::Kill),
            _ => None,
        }
    }
}

/// The node group.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// Nodes with one GPU (g5.xlarge: 4 vCPU, 16 GiB).
    pub small_nodes: usize,
    /// Nodes with `big_gpus` GPUs (g5.12xlarge: 48 vCPU, 192 GiB).
    pub big_nodes: usize,
    /// GPUs per big node.
    pub big_gpus: u32,
    /// Framebuffer of one GPU, MiB (an A10G reports 23028).
    pub gpu_total_mib: u64,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            small_nodes: 30,
            big_nodes: 5,
            big_gpus: 4,
            gpu_total_mib: 23028,
        }
    }
}

impl Cluster {
    /// GPUs in the group.
    pub fn gpus(&self) -> usize {
        self.small_nodes + self.big_nodes * self.big_gpus as usize
    }
}

/// Everything one run depends on.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The seed of the job stream and of the scheduler's tie-breaks.
    pub seed: u64,
    /// The node group.
    pub cluster: Cluster,
    /// The job stream's shape.
    pub workload: WorkloadModel,
    /// Simulated time, seconds (jobs arrive throughout).
    pub horizon_s: u64,
    /// Throughput is counted after this (the queue has built up by then).
    pub warmup_s: u64,
    /// Step, seconds (also the agents' poll interval).
    pub step_s: u64,
    /// The eviction's grace period (the guard's `evictionGracePeriodSeconds`); the kubelet
    /// kills at `max(grace, 2 s)`.
    pub eviction_grace_s: u64,
    /// What the guard does when it decides.
    pub on_decision: OnDecision,
    /// How often the figures the extender reads are re-published unchanged (a changed
    /// value goes at most every `annotation_min_interval_s`, a pressure rise at once). The
    /// extender reads them from the agent's Lease (src/extender/liveness.rs), renewed every
    /// `--lease-renew-interval` (15 s), not from the Node's 5m30s annotations; with the
    /// Node's cadence the extender's default `staleAfter` (120 s) would call every quiet
    /// node stale.
    pub annotation_heartbeat_s: u64,
    /// The agents' `--annotation-min-interval`.
    pub annotation_min_interval_s: u64,
    /// Most pods the scheduler tries per step (kube-scheduler is not infinitely fast).
    pub attempts_per_step: usize,
    /// The extender's policy file (YAML, as `--config` reads it).
    pub extender_policy: String,
    /// The guard's policy (mode is forced to enforce).
    pub guard_policy: Policy,
    /// CPU and memory each job pod requests (millicores, MiB): what the default
    /// scheduler's NodeResourcesFit sees.
    pub pod_request: (u64, u64),
    /// Jobs to serve instead of drawing them from `workload` (tests).
    pub jobs: Option<Vec<Job>>,
}

impl Default for Scenario {
    fn default() -> Self {
        // Past what 50 GPUs finish at `replicas` 2 and 4 (the queue never empties there).
        let workload = WorkloadModel {
            arrivals_per_min: 16.0,
            ..WorkloadModel::default()
        };
        Scenario {
            seed: 1,
            cluster: Cluster::default(),
            workload,
            horizon_s: 3 * 3600,
            warmup_s: 1800,
            step_s: 2,
            eviction_grace_s: 5,
            on_decision: OnDecision::Stop,
            annotation_heartbeat_s: 15,
            annotation_min_interval_s: 5,
            attempts_per_step: 64,
            extender_policy: SHIPPED_EXTENDER_POLICY.to_string(),
            guard_policy: Policy::default(),
            pod_request: (400, 1536),
            jobs: None,
        }
    }
}

/// Why the simulation cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError(pub String);

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SimError {}
