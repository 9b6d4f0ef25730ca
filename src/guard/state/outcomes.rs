//! How outcomes change a GPU's phase: what the enforcer reports for each pod, how an
//! eviction in doubt is resolved from the pod view and the process list, and how a
//! decision is closed.

use super::{Guard, Resolution};
use crate::guard::decision::{Decision, EvictionOutcome};
use crate::guard::ports::Confirmation;
use crate::guard::rank::Victim;
use crate::guard::status::GpuPhase;
use crate::model::pod::PodInfo;
use crate::model::snapshot::ProcessSample;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

impl Guard {
    /// Records what the enforcer got for one pod of a decision. Evictions (and evictions in
    /// doubt) count against the rate limit even if the decision has since timed out;
    /// refused, failed and skipped pods are skipped for `cooldownTimeout`.
    pub fn record_outcome(
        &mut self,
        decision_id: u64,
        pod_uid: &str,
        outcome: EvictionOutcome,
        now: Duration,
    ) {
        self.expire(now);
        match &outcome {
            EvictionOutcome::Evicted | EvictionOutcome::InDoubt(_) => {
                self.answers.evictions.push_back(now);
                self.answers.forbidden = None;
            }
            EvictionOutcome::Blocked(d) | EvictionOutcome::Skipped(d) => {
                self.answers.refused.insert(
                    pod_uid.to_string(),
                    (now + self.policy.cooldown_timeout, d.clone()),
                );
            }
            EvictionOutcome::Forbidden(d) => self.answers.forbidden = Some(d.clone()),
            EvictionOutcome::AlreadyGone
            | EvictionOutcome::Lost(_)
            | EvictionOutcome::Aborted(_)
            | EvictionOutcome::Failed(_)
            | EvictionOutcome::Throttled { .. } => {}
        }
        let timeout = self.policy.cooldown_timeout;
        for st in self.gpus.values_mut() {
            let (outcomes, in_doubt) = match &mut st.phase {
                GpuPhase::Evicting {
                    decision_id: id,
                    outcomes,
                    last_activity,
                } if *id == decision_id => {
                    *last_activity = now;
                    (outcomes, false)
                }
                GpuPhase::InDoubt {
                    decision_id: id,
                    outcomes,
                    ..
                } if *id == decision_id => (outcomes, true),
                _ => continue,
            };
            // The enforcer reports each pod once; the doubt of a pod is resolved by
            // `resolve_doubt`, not by a second report.
            outcomes.insert(pod_uid.to_string(), outcome.clone());
            let outcomes = std::mem::take(outcomes);
            let Some(decision) = st.last_decision.as_ref().filter(|d| d.id == decision_id) else {
                st.set_phase(GpuPhase::Watching, now);
                return;
            };
            let doubt = outcomes
                .values()
                .any(|o| matches!(o, EvictionOutcome::InDoubt(_)));
            let next = if doubt {
                let (since, answered) = match &st.phase {
                    GpuPhase::InDoubt {
                        since, answered, ..
                    } if in_doubt => (*since, *answered),
                    _ => (now, Duration::ZERO),
                };
                GpuPhase::InDoubt {
                    decision_id,
                    outcomes,
                    since,
                    answered,
                }
            } else if let Some(pause) = pause_after(&outcome, timeout) {
                // The answer was about the server, not the pod: pause this GPU so a frozen,
                // busy or misconfigured server gets one attempt per pause, not one per poll.
                match settle(decision, &outcomes, now, timeout) {
                    GpuPhase::Watching => GpuPhase::Cooldown {
                        decision_id,
                        waiting_for_pids: Vec::new(),
                        until: now + pause,
                    },
                    other => other,
                }
            } else {
                let gone: Vec<&str> = outcomes
                    .iter()
                    .filter(|(_, o)| o.reclaims())
                    .map(|(uid, _)| uid.as_str())
                    .collect();
                let all_tried = decision
                    .candidates
                    .iter()
                    .all(|v| outcomes.contains_key(&v.uid));
                if in_doubt || decision.done(&gone) || all_tried {
                    settle(decision, &outcomes, now, timeout)
                } else {
                    GpuPhase::Evicting {
                        decision_id,
                        outcomes,
                        last_activity: now,
                    }
                }
            };
            let unchanged_phase =
                std::mem::discriminant(&next) == std::mem::discriminant(&st.phase);
            if unchanged_phase {
                st.phase = next;
            } else {
                st.set_phase(next, now);
            }
            return;
        }
    }

    /// Resolves the evictions in doubt on `index` from the pod view and the GPU's process
    /// list: a pod absent from the view, terminating, or whose processes have all left the
    /// GPU was evicted; one still running after `inDoubtTimeout` of time the server
    /// answered since the doubt began, on a view proven current (`fresh_view`), was not.
    pub(super) fn resolve_doubt(
        &mut self,
        index: u32,
        processes: &[ProcessSample],
        pods: &HashMap<String, PodInfo>,
        fresh_view: bool,
        now: Duration,
    ) {
        let timeout = self.policy.cooldown_timeout;
        let window = self.policy.in_doubt_timeout;
        let Some(st) = self.gpus.get_mut(&index) else {
            return;
        };
        let GpuPhase::InDoubt {
            decision_id,
            outcomes,
            answered,
            ..
        } = &mut st.phase
        else {
            return;
        };
        let Some(decision) = st.last_decision.as_ref().filter(|d| d.id == *decision_id) else {
            st.set_phase(GpuPhase::Watching, now);
            return;
        };
        // Only time the server answered counts (see `Guard::note_view_proof`).
        let waited = *answered;
        for (uid, outcome) in outcomes.iter_mut() {
            let EvictionOutcome::InDoubt(detail) = outcome else {
                continue;
            };
            let pids: Vec<u32> = decision
                .candidates
                .iter()
                .find(|v| &v.uid == uid)
                .map(|v| v.pids.clone())
                .unwrap_or_default();
            let on_gpu = processes
                .iter()
                .any(|p| p.gpu == index && pids.contains(&p.pid));
            let answer = self.doubts.confirms.answer(*decision_id, uid).cloned();
            let gone = pods.get(uid).is_none_or(|p| p.terminating)
                || !on_gpu
                || matches!(answer, Some(Confirmation::Gone(_)));
            if gone {
                *outcome = match renamed(pods, decision, uid) {
                    Some(now) if !pods.contains_key(uid) => EvictionOutcome::Lost(format!(
                        "lost: the pod's UID {uid} is no longer known to the API server and {now} runs under that name (the server restarted with new UIDs, or the pod was re-created): the pod running now was not evicted"
                    )),
                    _ => EvictionOutcome::Evicted,
                };
                self.doubts.confirms.forget(*decision_id, uid);
                self.doubts.resolutions.push(Resolution {
                    decision_id: *decision_id,
                    uid: uid.clone(),
                    outcome: outcome.clone(),
                });
            } else if fresh_view && waited >= window {
                // The view says running; only a fresh read of the pod may say so for good.
                if answer != Some(Confirmation::Running) {
                    if let Some(victim) = decision.candidates.iter().find(|v| &v.uid == uid) {
                        self.doubts.confirms.ask(*decision_id, victim, now);
                    }
                    continue;
                }
                let why = format!(
                    "eviction was in doubt ({detail}) and the pod was still running after {} s of the API server answering, as a fresh read of it confirmed (no deletion timestamp): not carried out",
                    waited.as_secs()
                );
                self.answers
                    .refused
                    .insert(uid.clone(), (now + timeout, why.clone()));
                *outcome = EvictionOutcome::Failed(why);
                self.doubts.confirms.forget(*decision_id, uid);
                self.doubts.resolutions.push(Resolution {
                    decision_id: *decision_id,
                    uid: uid.clone(),
                    outcome: outcome.clone(),
                });
            }
        }
        if outcomes
            .values()
            .all(|o| !matches!(o, EvictionOutcome::InDoubt(_)))
        {
            let next = settle(decision, outcomes, now, timeout);
            st.set_phase(next, now);
        }
    }
}

/// `namespace/name (UID …)` of a pod other than `uid` that the view holds under the name
/// `uid` had when it was chosen, running (not terminating).
fn renamed(pods: &HashMap<String, PodInfo>, decision: &Decision, uid: &str) -> Option<String> {
    let v = decision.candidates.iter().find(|v| v.uid == uid)?;
    pods.values()
        .find(|p| p.uid != uid && p.namespace == v.namespace && p.name == v.name && !p.terminating)
        .map(|p| format!("{}/{} (UID {})", p.namespace, p.name, p.uid))
}

/// Longest gap between two proofs of the pod view that still counts as the API server
/// answering: the pod view's own stall bound (docs/guard.md). A longer gap is a server
/// that did not answer (frozen, down); it does not count toward `inDoubtTimeout`.
pub const MAX_PROOF_GAP: Duration = Duration::from_secs(30);

impl Guard {
    /// Tells the guard when the last proof of the pod view arrived from the API server
    /// (`None`: not proven). The time between two arrivals no more than [`MAX_PROOF_GAP`]
    /// apart is time the server answered, and counts toward each eviction in doubt's
    /// `inDoubtTimeout`.
    pub fn note_view_proof(&mut self, proven_at: Option<Duration>) {
        let Some(p) = proven_at else {
            return;
        };
        if let Some(last) = self.trust.last_proof.filter(|l| p > *l) {
            if p - last <= MAX_PROOF_GAP {
                for st in self.gpus.values_mut() {
                    if let GpuPhase::InDoubt {
                        since, answered, ..
                    } = &mut st.phase
                    {
                        *answered += p.saturating_sub(last.max(*since));
                    }
                }
            }
        }
        if self.trust.last_proof.is_none_or(|l| p > l) {
            self.trust.last_proof = Some(p);
        }
    }
}

/// How long a GPU pauses after a decision whose fresh read of its victim failed (or whose
/// eviction was refused for a reason that is not about the pod).
pub const ABORT_PAUSE: Duration = Duration::from_secs(5);

/// Shortest pause after a throttled eviction, whatever `Retry-After` says.
pub const MIN_THROTTLE_PAUSE: Duration = Duration::from_millis(200);

/// How long a GPU pauses after an outcome that ends the walk because of the server (none
/// for the others): a throttled eviction waits as the server told it, between
/// [`MIN_THROTTLE_PAUSE`] and `timeout` (`cooldownTimeout`); a forbidden one waits
/// `timeout` (it needs a person); an aborted or failed one [`ABORT_PAUSE`].
pub(super) fn pause_after(outcome: &EvictionOutcome, timeout: Duration) -> Option<Duration> {
    match outcome {
        EvictionOutcome::Throttled { retry_after_ms, .. } => Some(
            Duration::from_millis(*retry_after_ms)
                .max(MIN_THROTTLE_PAUSE)
                .min(timeout),
        ),
        EvictionOutcome::Forbidden(_) => Some(timeout),
        EvictionOutcome::Aborted(_) | EvictionOutcome::Failed(_) => Some(ABORT_PAUSE.min(timeout)),
        _ => None,
    }
}

/// Closes a decision: cool down on the reclaimed victims' PIDs, or, if nothing was
/// reclaimed (every attempt refused or failed), go straight back to watching.
pub(super) fn settle(
    decision: &Decision,
    outcomes: &BTreeMap<String, EvictionOutcome>,
    now: Duration,
    timeout: Duration,
) -> GpuPhase {
    let gone = decision
        .candidates
        .iter()
        .filter(|v| outcomes.get(&v.uid).is_some_and(EvictionOutcome::reclaims));
    let pids = pids_of(gone);
    if pids.is_empty() {
        GpuPhase::Watching
    } else {
        GpuPhase::Cooldown {
            decision_id: decision.id,
            waiting_for_pids: pids,
            until: now + timeout,
        }
    }
}

pub(super) fn pids_of<'a>(victims: impl Iterator<Item = &'a Victim>) -> Vec<u32> {
    let set: BTreeSet<u32> = victims.flat_map(|v| v.pids.iter().copied()).collect();
    set.into_iter().collect()
}
