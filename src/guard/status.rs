//! The guard's state as `/state` shows it: each GPU's phase, pressure and thresholds, the
//! last decision, and the pods skipped after a refused eviction.

use super::decision::{ser_opt_secs, ser_secs, Decision, EvictionOutcome};
use super::levels::{Levels, Pressure};
use super::policy::Mode;
use crate::model::snapshot::MemoryInfo;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Where one GPU stands in the state machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum GpuPhase {
    /// May decide at the next trigger.
    Watching,
    /// A decision is out and its outcomes are arriving (enforce mode).
    Evicting {
        /// The decision in flight.
        decision_id: u64,
        /// Outcomes so far, by pod UID.
        outcomes: BTreeMap<String, EvictionOutcome>,
        /// When the decision was made or the last outcome arrived: if the enforcer goes
        /// silent for `cooldownTimeout`, the decision is closed as it stands.
        #[serde(serialize_with = "ser_secs")]
        last_activity: Duration,
    },
    /// Waiting for the victims' processes to leave, or for `until`.
    Cooldown {
        /// The decision this cools down from.
        decision_id: u64,
        /// PIDs still expected to leave; empty means only the timeout ends it.
        waiting_for_pids: Vec<u32>,
        /// Monotonic deadline.
        #[serde(serialize_with = "ser_secs")]
        until: Duration,
    },
    /// An eviction's outcome is unknown: no decision on this GPU until every pod in doubt is
    /// seen gone (absent from the pod view, terminating, or its processes off the GPU) or,
    /// on a pod view proven current, still running after `inDoubtTimeout` of `answered` time.
    InDoubt {
        /// The decision whose eviction is in doubt.
        decision_id: u64,
        /// Outcomes so far, by pod UID; the pods in doubt have `in_doubt`.
        outcomes: BTreeMap<String, EvictionOutcome>,
        /// When the doubt began.
        #[serde(serialize_with = "ser_secs")]
        since: Duration,
        /// How long the API server has been answering since the doubt began: the time
        /// between proofs of the pod view no more than `MAX_PROOF_GAP` apart. Only this
        /// counts toward `inDoubtTimeout` — a frozen server that thaws may still carry the
        /// eviction out, whatever the wall clock says.
        #[serde(serialize_with = "ser_secs")]
        answered: Duration,
    },
    /// The last decision was allowed no eviction; waits for rate-limit budget or for the
    /// pressure to end.
    RateLimited {
        /// The rate-limited decision.
        decision_id: u64,
    },
}

/// The guard's view of one GPU, for /state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuGuardStatus {
    /// NVML index.
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Current pressure.
    pub pressure: Pressure,
    /// Monotonic time the pressure took its current value.
    #[serde(serialize_with = "ser_secs")]
    pub pressure_since: Duration,
    /// Monotonic time free memory went below soft, while it stays there.
    #[serde(serialize_with = "ser_opt_secs")]
    pub below_soft_since: Option<Duration>,
    /// State-machine phase.
    pub phase: GpuPhase,
    /// Monotonic time the phase began.
    #[serde(serialize_with = "ser_secs")]
    pub phase_since: Duration,
    /// Why the guard cannot decide for this GPU now, if it cannot.
    pub inactive_reason: Option<String>,
    /// The last early trigger the guard did not act on, and why (docs/guard.md, "Acting
    /// before soft"): kept until the next, since the climb that fired it may be over.
    pub early_held_back: Option<HeldBack>,
    /// Last memory figures.
    pub memory: Option<MemoryInfo>,
    /// Thresholds resolved for this GPU.
    pub levels: Option<Levels>,
    /// Memory growth, bytes per second, when the trend has a fit.
    pub growth_bytes_per_second: Option<f64>,
    /// Projected time until full at that growth.
    #[serde(serialize_with = "ser_opt_secs")]
    pub time_to_full: Option<Duration>,
    /// The last decision made for this GPU.
    pub last_decision: Option<Decision>,
}

/// An early trigger not acted on ([`GpuGuardStatus::early_held_back`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeldBack {
    /// Monotonic time of the full poll that held it back.
    #[serde(serialize_with = "ser_secs")]
    pub at: Duration,
    /// Why.
    pub reason: String,
}

/// A pod skipped because its eviction was refused or failed recently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedPod {
    /// Pod UID.
    pub uid: String,
    /// What the API server answered.
    pub detail: String,
    /// Monotonic time it becomes a candidate again.
    #[serde(serialize_with = "ser_secs")]
    pub until: Duration,
}

/// The guard's state for /state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuardStatus {
    /// The configured mode.
    pub mode: Mode,
    /// One entry per GPU of the last snapshot, by index.
    pub gpus: Vec<GpuGuardStatus>,
    /// Evictions recorded in the current rate-limit window.
    pub evictions_in_window: usize,
    /// Evictions a new decision could be allowed now.
    pub evictions_allowed: usize,
    /// Pods skipped after a refused or failed eviction.
    pub refused: Vec<RefusedPod>,
    /// The API server's last answer saying the agent may not evict at all (RBAC, an
    /// admission webhook), until an eviction goes through again.
    pub forbidden: Option<String>,
}
