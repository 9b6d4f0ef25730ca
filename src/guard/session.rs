//! The guard as the agent runs it: the state machine, the recent decisions `/state` shows,
//! when decisions are held for a pod view that cannot be vouched for, and the log lines an
//! operator reads for each of them. The agent's per-poll step hands it plain values (the
//! snapshot, the pod view and its status, the executor's outcomes); it hands back the
//! decisions to execute and what the pod view got wrong.

use super::decision::{Decision, EvictionOutcome};
use super::history::{GuardView, History};
use super::hold::hold_reason;
use super::ports::{ConfirmRequest, Confirmation, DecisionExecutor, Outcomes};
use super::state::Guard;
use crate::model::pod::{PodMap, PodViewStatus};
use crate::model::pressure::Pressure;
use crate::model::snapshot::{MemoryInfo, Snapshot};
use std::sync::Arc;
use std::time::Duration;

/// The guard, its history and the executor its decisions go to.
pub struct GuardSession {
    guard: Guard,
    history: History,
    /// None when there is no cluster to act on: the guard then only tracks pressure (its
    /// mode is `off`, so it takes no decision).
    executor: Option<Arc<dyn DecisionExecutor>>,
}

impl GuardSession {
    /// A session of `guard` whose decisions go to `executor`.
    pub fn new(guard: Guard, executor: Option<Arc<dyn DecisionExecutor>>) -> Self {
        GuardSession {
            guard,
            history: History::default(),
            executor,
        }
    }

    /// The state machine, for what it reports (pressure, carried state, cadence).
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The state machine, for what the agent hands it outside a poll (a restore at start).
    pub fn guard_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }

    /// The executor decisions go to, if the guard acts.
    pub fn executor(&self) -> Option<Arc<dyn DecisionExecutor>> {
        self.executor.clone()
    }

    /// A full poll: holds or resumes decisions by the pod view's `status` (seen at `now`),
    /// observes, and returns the decisions to execute (none without an executor).
    pub fn on_full(
        &mut self,
        snap: &Arc<Snapshot>,
        pods: &Arc<PodMap>,
        status: &PodViewStatus,
        now: Duration,
    ) -> Vec<Decision> {
        self.note_view(status, now);
        let decisions = self.guard.observe(snap, pods, now);
        if tracing::enabled!(tracing::Level::DEBUG) {
            for (gpu, why) in self.guard.held_back_at(now) {
                tracing::debug!(gpu, "trigger held back: {why}");
            }
        }
        let restored = self.guard.take_restored();
        if let Some(e) = &self.executor {
            for d in &restored {
                e.hold_again(d);
            }
        }
        self.note_resolutions();
        self.dispatch(decisions)
    }

    /// A memory-only reading between full polls. Returns whether a full poll is wanted at
    /// once: a trigger fired, and victims are ranked only on a process list read together
    /// with the memory.
    pub fn on_memory(&mut self, readings: &[(u32, MemoryInfo)], at: Duration) -> bool {
        let decisions = self.guard.observe_memory(readings, at);
        debug_assert!(
            decisions.is_empty(),
            "fast readings never decide on their own"
        );
        self.guard.take_refresh_request()
    }

    /// What the executor got for decision `id`. Returns, for each pod skipped because its
    /// fresh read disagreed with the pod view, why the view should relist.
    pub fn on_outcomes(&mut self, id: u64, results: Outcomes, now: Duration) -> Vec<String> {
        let mut distrust = Vec::new();
        for (uid, outcome) in results {
            if let EvictionOutcome::Skipped(why) = &outcome {
                distrust.push(format!(
                    "a fresh read of pod {uid} disagrees with the pod view ({why})"
                ));
            }
            self.history.record(id, &uid, &outcome);
            self.guard.record_outcome(id, &uid, outcome, now);
        }
        distrust
    }

    /// The fresh reads of pods in doubt the guard wants now.
    pub fn take_confirms(&mut self) -> Vec<ConfirmRequest> {
        self.guard.take_confirm_requests()
    }

    /// What the fresh read of a pod in doubt showed.
    pub fn on_confirmation(
        &mut self,
        request: &ConfirmRequest,
        answer: Confirmation,
        now: Duration,
    ) {
        self.guard
            .record_confirmation(request.decision_id, &request.uid, answer, now);
        self.note_resolutions();
    }

    /// The GPU's pressure, for the metric.
    pub fn pressure(&self, gpu_index: u32) -> Pressure {
        self.guard.pressure(gpu_index)
    }

    /// The guard's part of `/state`.
    pub fn view(&self) -> GuardView {
        // What stop-at-decision did and holds (`act::stop`), when the executor stops.
        let on_decision = self.executor.as_ref().and_then(|e| e.status());
        self.history
            .view(self.guard.status(), self.guard.held(), on_decision)
    }

    fn note_view(&mut self, st: &PodViewStatus, now: Duration) {
        // Only time the server answered counts toward an eviction in doubt's timeout: the
        // time between the arrivals of proofs, not between the moments they prove (a LIST
        // a frozen server held proves the moment it was sent, and arrives at the thaw).
        let heard_at = st
            .proven_ago
            .and(st.heard_ago)
            .map(|ago| now.saturating_sub(ago));
        self.guard.note_view_proof(heard_at);
        let reason = hold_reason(st);
        if reason.as_deref() != self.guard.held() {
            match &reason {
                Some(r) => tracing::warn!(reason = %r, "guard decisions paused"),
                None => tracing::info!("guard decisions resumed: pod view is current"),
            }
        }
        self.guard.hold_decisions(reason);
    }

    /// Logs what the guard learned of evictions that were in doubt.
    fn note_resolutions(&mut self) {
        for r in self.guard.take_resolutions() {
            match &r.outcome {
                EvictionOutcome::Evicted => tracing::warn!(
                    decision = r.decision_id,
                    uid = %r.uid,
                    "eviction that was in doubt was carried out: the pod is gone or terminating"
                ),
                EvictionOutcome::Lost(detail) => tracing::warn!(
                    decision = r.decision_id,
                    uid = %r.uid,
                    detail = %detail,
                    "eviction that was in doubt was lost with the pod's UID"
                ),
                other => tracing::warn!(
                    decision = r.decision_id,
                    uid = %r.uid,
                    detail = other.detail().unwrap_or(""),
                    "eviction that was in doubt was not carried out"
                ),
            }
            self.history.record(r.decision_id, &r.uid, &r.outcome);
            if let Some(exec) = &self.executor {
                exec.resolved(&r.uid, &r.outcome);
            }
        }
    }

    fn dispatch(&mut self, decisions: Vec<Decision>) -> Vec<Decision> {
        let mut out = Vec::new();
        for d in decisions {
            tracing::warn!(
                gpu = d.gpu,
                uuid = %d.uuid,
                decision = d.id,
                mode = d.mode.as_str(),
                trigger = d.trigger.as_str(),
                "{}",
                d.summary()
            );
            self.history.push(d.clone());
            if self.executor.is_some() {
                out.push(d);
            }
        }
        out
    }
}
