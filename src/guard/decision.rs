//! A guard decision and what became of it: the rule that fired, the minimum-reclaim plan
//! over the ranked candidates, and each eviction's outcome as the enforcer reports it.

use super::levels::{Levels, Pressure};
use super::policy::Mode;
use super::rank::{fmt_bytes, Excluded, Victim};
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::time::Duration;

/// Which rule made the guard act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Free memory fell below `hard`.
    Hard,
    /// Free memory stayed below `soft` for the whole `grace` period.
    SoftGrace,
    /// Free memory is below `soft` and the trend projects the GPU full within `horizon`.
    SoftTrend,
    /// Sustained growth would cross `hard` within `actBudget`, before the rules above
    /// could act in time (possibly while free is still above `soft`).
    EarlyTrend,
    /// Free memory is below `soft` and less than what a pod gave back within `horizon`
    /// (a workspace that can no longer return): taken only on the pods that climbed into its
    /// room, above the most they held in the minute before (`guard::state::need`).
    SoftNeed,
    /// Free memory is above `soft` but less than `hard` and what a pod gave back within
    /// `horizon` while the GPU steps up: taken only on the pods still rising above the most
    /// they held in the minute before (`guard::state::need`).
    EarlyNeed,
    /// Not a decision of this process: an eviction in doubt or a cooldown carried over an
    /// agent restart (`guard::carry`), restored so the guard does not decide again on it.
    Restored,
}

impl Trigger {
    /// Spelling for logs and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Hard => "hard",
            Trigger::SoftGrace => "soft_grace",
            Trigger::SoftTrend => "soft_trend",
            Trigger::EarlyTrend => "early_trend",
            Trigger::SoftNeed => "soft_need",
            Trigger::EarlyNeed => "early_need",
            Trigger::Restored => "restored",
        }
    }
}

/// What became of one eviction attempt, as the enforcer reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", content = "detail", rename_all = "snake_case")]
pub enum EvictionOutcome {
    /// The Eviction API accepted it (201).
    Evicted,
    /// 404: the pod was already gone; its memory is going away all the same.
    AlreadyGone,
    /// Refused because of this pod: its PodDisruptionBudget forbids it now (a 429 with the
    /// `DisruptionBudget` cause, and the other budget answers of docs/guard.md). The pod is
    /// skipped for `cooldownTimeout` and the walk moves on.
    Blocked(String),
    /// Not carried out, for a reason that is not about the pod (a malformed request, 400 or
    /// 422; or, resolved from a doubt, still running long after): the walk stops and the
    /// GPU pauses briefly, as after `Aborted`.
    Failed(String),
    /// The server is busy (a 429 without the `DisruptionBudget` cause: API Priority and
    /// Fairness, max-in-flight). Nothing was done; the walk stops and the GPU waits
    /// `retry_after_ms` (as told, within bounds) before deciding again — on the same pod.
    Throttled {
        /// The server's answer.
        detail: String,
        /// The server's `Retry-After`, in milliseconds.
        retry_after_ms: u64,
    },
    /// The agent may not evict (403 from RBAC or an admission webhook, 401): every pod
    /// would get the same answer. The walk stops, the GPU pauses for `cooldownTimeout`,
    /// and the agent says so loudly (an error log, `/state`, the Node Event).
    Forbidden(String),
    /// Nobody knows: the request was sent and no answer came (timeout, connection lost, a
    /// gateway's 502/503/504), or an internal error (500: `etcdserver: request timed out` is
    /// a write etcd may still commit). The eviction may still happen, so the walk stops, the
    /// pod's memory counts as reclaimed-pending, and no further eviction happens on that GPU
    /// until the pod is seen gone (or still running after `inDoubtTimeout` on a current view).
    InDoubt(String),
    /// Not attempted: the fresh read just before the eviction showed the pod no longer
    /// eligible (the pod view was behind). Skipped for `cooldownTimeout`; the walk moves on.
    Skipped(String),
    /// Not attempted: the fresh read of the pod failed or timed out, so the API server is not
    /// healthy enough to act on. The walk stops; the GPU may decide again after a short pause.
    Aborted(String),
    /// Resolved from a doubt: the pod's UID is gone from the API server while a pod of the
    /// same namespace and name runs under another UID — the server restarted with new UIDs
    /// (its queue, and the eviction in it, lost with it), or the pod was re-created. What
    /// runs now was not evicted; the old UID's processes count as on their way out, as
    /// for `already_gone` (the kubelet reconciles what no longer exists in the API).
    Lost(String),
}

impl EvictionOutcome {
    /// The `result` label of `gpu_warden_evictions_total`.
    pub fn as_str(&self) -> &'static str {
        match self {
            EvictionOutcome::Evicted => "evicted",
            EvictionOutcome::AlreadyGone => "already_gone",
            EvictionOutcome::Blocked(_) => "blocked",
            EvictionOutcome::Failed(_) => "failed",
            EvictionOutcome::Throttled { .. } => "throttled",
            EvictionOutcome::Forbidden(_) => "forbidden",
            EvictionOutcome::InDoubt(_) => "in_doubt",
            EvictionOutcome::Skipped(_) => "skipped",
            EvictionOutcome::Aborted(_) => "aborted",
            EvictionOutcome::Lost(_) => "lost",
        }
    }

    /// The API server's answer or the reason, for outcomes that carry one.
    pub fn detail(&self) -> Option<&str> {
        match self {
            EvictionOutcome::Evicted | EvictionOutcome::AlreadyGone => None,
            EvictionOutcome::Blocked(d)
            | EvictionOutcome::Failed(d)
            | EvictionOutcome::Throttled { detail: d, .. }
            | EvictionOutcome::Forbidden(d)
            | EvictionOutcome::InDoubt(d)
            | EvictionOutcome::Skipped(d)
            | EvictionOutcome::Aborted(d)
            | EvictionOutcome::Lost(d) => Some(d),
        }
    }

    /// Whether the enforcer must stop the walk after this outcome. It walks on only after
    /// an answer about *this pod* (blocked by its budget, skipped, gone, evicted): an answer
    /// about the server (throttled, forbidden, failed, aborted) would be the same for the
    /// next pod, and one in doubt may still be carried out.
    pub fn ends_walk(&self) -> bool {
        matches!(
            self,
            EvictionOutcome::InDoubt(_)
                | EvictionOutcome::Aborted(_)
                | EvictionOutcome::Throttled { .. }
                | EvictionOutcome::Forbidden(_)
                | EvictionOutcome::Failed(_)
        )
    }

    /// Whether the pod was left as it was: the eviction was not carried out (and, unlike an
    /// outcome in doubt, never will be). A pod whose processes were stopped at decision is
    /// resumed after such an outcome.
    pub fn not_carried_out(&self) -> bool {
        matches!(
            self,
            EvictionOutcome::Blocked(_)
                | EvictionOutcome::Failed(_)
                | EvictionOutcome::Throttled { .. }
                | EvictionOutcome::Forbidden(_)
                | EvictionOutcome::Skipped(_)
                | EvictionOutcome::Aborted(_)
        )
    }

    /// Whether the pod is (or is about to be) gone, so its memory counts as reclaimed.
    pub fn reclaims(&self) -> bool {
        matches!(
            self,
            EvictionOutcome::Evicted | EvictionOutcome::AlreadyGone | EvictionOutcome::Lost(_)
        )
    }
}

/// One decision to reclaim memory on one GPU.
///
/// The enforcer walks `candidates` in order, skipping any whose eviction is blocked or
/// fails, and stops as soon as [`Decision::done`] says so: when the pods it has evicted
/// reclaim `reclaim_target_bytes`, or when it has evicted `max_evictions` pods (the
/// rate limit's allowance). Every attempt is reported with [`Guard::record_outcome`].
/// In dry-run mode it evicts nothing and reports nothing; the plan is the first `planned`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Unique per guard, increasing.
    pub id: u64,
    /// NVML index of the GPU.
    pub gpu: u32,
    /// UUID of the GPU.
    pub uuid: String,
    /// Monotonic time of the decision (seconds in JSON).
    #[serde(serialize_with = "ser_secs")]
    pub at: Duration,
    /// The mode it was made in (dry-run decisions are announced, never carried out).
    pub mode: Mode,
    /// The rule that fired.
    pub trigger: Trigger,
    /// Pressure at the time.
    pub pressure: Pressure,
    /// Framebuffer total, bytes.
    pub total: u64,
    /// Framebuffer used, bytes.
    pub used: u64,
    /// Framebuffer free, bytes (NVML v2 `free`, which excludes `reserved`).
    pub free: u64,
    /// The thresholds resolved for this GPU.
    pub levels: Levels,
    /// Trend projection of the GPU filling up, when the trend had one.
    #[serde(serialize_with = "ser_opt_secs")]
    pub time_to_full: Option<Duration>,
    /// Bytes to reclaim to bring free back to `levels.target` (soft + reclaim margin).
    pub reclaim_target_bytes: u64,
    /// Every eligible pod on the GPU, first to evict first.
    pub candidates: Vec<Victim>,
    /// The minimum-reclaim plan: the first `planned` candidates are the smallest prefix
    /// whose use covers `reclaim_target_bytes` (all of them if none does), cut to the
    /// rate limit's allowance.
    pub planned: usize,
    /// Most pods the enforcer may evict for this decision: the rate limit's allowance,
    /// reserved for this decision while it is in flight so the global limit holds.
    pub max_evictions: usize,
    /// The plan was cut (possibly to nothing) by the global rate limit.
    pub rate_limited: bool,
    /// Pods on the GPU that may not be evicted, with the reason (for logs and /state).
    pub excluded: Vec<Excluded>,
    /// Memory held by processes outside any known pod: part of the pressure, not evictable.
    pub other_bytes: u64,
    /// Set when this decision was taken while memory was on its way back (an earlier
    /// decision's victims, terminating pods): who kept filling the GPU, and why that could
    /// not wait (`guard::state::escalate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalated: Option<Escalation>,
    /// Per pod UID on the GPU at the decision, the most it used at any full poll of the
    /// `horizon` before it: what a later decision, taken while this one's victims still
    /// hold their memory, measures the others' growth from.
    pub high_water: BTreeMap<String, u64>,
}

/// Why a decision was taken while memory was on its way back (the rule of
/// `guard::state::escalate`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Escalation {
    /// The decision whose cooldown gave way, if one was cooling down (`None`: only pods
    /// terminating for another reason held memory on its way back).
    pub after_decision: Option<u64>,
    /// What the pods that may be evicted, other than the pending victims, grew by above
    /// their baselines, summed.
    pub others_grew_bytes: u64,
    /// Those that grew, most first.
    pub growers: Vec<String>,
    /// The GPU's sustained growth, bytes per second.
    pub growth_bytes_per_second: f64,
    /// When the GPU would reach `hard` at that rate (zero: below it already).
    #[serde(serialize_with = "ser_secs")]
    pub hard_in: Duration,
    /// The memory on its way back.
    pub returning_bytes: u64,
    /// When it is due back.
    #[serde(serialize_with = "ser_secs")]
    pub returning_in: Duration,
}

impl Escalation {
    /// One clause for logs and Events.
    pub fn describe(&self) -> String {
        let after = match self.after_decision {
            Some(id) => format!("after decision {id}, whose victims hold"),
            None => "while terminating pods hold".to_string(),
        };
        format!(
            "escalated {after} {} due back within {:.1} s: {} grew {} above their high-water marks and the GPU fills at {}/s, reaching hard in {:.1} s",
            fmt_bytes(self.returning_bytes),
            self.returning_in.as_secs_f64(),
            self.growers.join(", "),
            fmt_bytes(self.others_grew_bytes),
            fmt_bytes(self.growth_bytes_per_second as u64),
            self.hard_in.as_secs_f64()
        )
    }
}

impl Decision {
    /// The victims the minimum-reclaim plan takes.
    pub fn planned_victims(&self) -> &[Victim] {
        self.candidates
            .get(..self.planned)
            .unwrap_or(&self.candidates)
    }

    /// Whether the candidates with these UIDs (evicted, or already gone) reclaim the
    /// target. Unknown or repeated UIDs count once or not at all.
    pub fn reclaimed_enough(&self, evicted_uids: &[&str]) -> bool {
        let reclaimed: u64 = self
            .candidates
            .iter()
            .filter(|v| evicted_uids.contains(&v.uid.as_str()))
            .map(|v| v.use_bytes)
            .sum();
        reclaimed >= self.reclaim_target_bytes
    }

    /// Whether the enforcer should stop: the target is reclaimed or the allowance used.
    pub fn done(&self, evicted_uids: &[&str]) -> bool {
        let evicted = self
            .candidates
            .iter()
            .filter(|v| evicted_uids.contains(&v.uid.as_str()))
            .count();
        self.reclaimed_enough(evicted_uids) || evicted >= self.max_evictions
    }

    /// One line for logs and the Node Event.
    pub fn summary(&self) -> String {
        let limit = if self.rate_limited {
            format!(" (cut by the rate limit to {})", self.planned)
        } else {
            String::new()
        };
        let names: Vec<String> = self
            .planned_victims()
            .iter()
            .map(|v| format!("{}/{}", v.namespace, v.name))
            .collect();
        let summary = format!(
            "GPU {} ({}): {} of {} used, {} free, {} pressure ({}); plan: evict {} of {} candidates{limit} [{}] to reclaim {}",
            self.gpu,
            self.uuid,
            fmt_bytes(self.used),
            fmt_bytes(self.total),
            fmt_bytes(self.free),
            self.pressure,
            self.trigger.as_str(),
            self.planned,
            self.candidates.len(),
            names.join(", "),
            fmt_bytes(self.reclaim_target_bytes)
        );
        match &self.escalated {
            Some(e) => format!("{summary}; {}", e.describe()),
            None => summary,
        }
    }
}

pub(crate) fn ser_secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

pub(crate) fn ser_opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}
