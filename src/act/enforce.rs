//! The enforcer shell: carries out a guard [`Decision`] against the API server
//! (docs/guard.md; RBAC in docs/deploy.md). In enforce mode it posts policy/v1 Evictions in rank order
//! until the decision is done; in dry-run it evicts nothing. In both it emits the
//! decision's Events ([`super::events`], sent by [`super::event_sender`]) and counts the decision and eviction metrics.
//!
//! Evictions go through the `evict` client, whose kube default retry is off: a
//! PodDisruptionBudget's 429 must come back at once so the next candidate can be tried
//! while the GPU still has memory left. Pods are never deleted directly: only the
//! Eviction API honours PodDisruptionBudgets.
//!
//! Two rules keep the walk within its plan whatever the API server does (docs/guard.md,
//! "When the API server does not answer"):
//! - **fresh before acting**: each victim is read (GET, its own short timeout) just before
//!   its eviction; a failed read stops the walk with nothing evicted, and a pod that changed
//!   since the plan (gone, terminating, re-created, moved, now excluded) is not evicted;
//! - **in doubt is not failed**: an eviction with no answer may still be carried out, so the
//!   walk stops there and the guard waits to learn the pod's fate.

use crate::act::client::KubeClients;
use crate::act::event_sender::EventSender;
use crate::attribute::pods::pod_info;
use crate::guard::decision::{Decision, EvictionOutcome};
use crate::guard::notes::{self, EventDraft};
use crate::guard::policy::{Mode, Policy};
use crate::guard::ports::DecisionExecutor;
use crate::guard::rank::Victim;
use crate::guard::recheck;
use crate::model::clock::Clock;
use crate::model::pod::PodMap;
use crate::publish::self_metrics::SelfMetrics;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::{Api, PostParams};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long one eviction request may take before its outcome is in doubt.
pub const DEFAULT_EVICTION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the fresh read of a victim may take before the walk stops, evicting nothing.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a decision's Events may take, all together (they are best effort).
pub const DEFAULT_EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one decision's walk through its candidates may take. The guard closes a
/// decision it has heard nothing about for `cooldownTimeout` (default 30 s) and may then
/// decide again, so the walk plus the Events must end well before that, or two walks
/// could evict for the same pressure.
pub const DEFAULT_WALK_BUDGET: Duration = Duration::from_secs(20);

/// Longest API-server message kept in a `Blocked`/`Failed` outcome: it lands in the
/// guard's state, /state and the Node Event.
const DETAIL_LIMIT: usize = 300;

/// Carries out guard decisions: evictions (enforce), Events and metrics.
pub struct Enforcer {
    evict: kube::Client,
    node: String,
    metrics: SelfMetrics,
    clock: Arc<dyn Clock>,
    policy: Policy,
    grace_period_seconds: i64,
    read_timeout: Duration,
    eviction_timeout: Duration,
    event_timeout: Duration,
    walk_budget: Duration,
    events: EventSender,
}

impl Enforcer {
    /// An enforcer for `node` using `clients.direct` (no retry) for fresh reads and
    /// evictions and `clients.main` for Events. `policy` judges a victim's fresh state (the
    /// same exclusions the ranking applies) and gives the evicted pods' grace period
    /// (`evictionGracePeriodSeconds`). Timeouts start at the `DEFAULT_*` values; the walk's
    /// budget, the logged durations and the Events' times are read from `clock`.
    pub fn new(
        clients: &KubeClients,
        node: impl Into<String>,
        metrics: SelfMetrics,
        policy: &Policy,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let node = node.into();
        Enforcer {
            evict: clients.direct.clone(),
            node: node.clone(),
            metrics,
            clock,
            policy: policy.clone(),
            grace_period_seconds: policy.eviction_grace_period_seconds,
            read_timeout: DEFAULT_READ_TIMEOUT,
            eviction_timeout: DEFAULT_EVICTION_TIMEOUT,
            event_timeout: DEFAULT_EVENT_TIMEOUT,
            walk_budget: DEFAULT_WALK_BUDGET,
            events: EventSender::new(clients.main.clone(), node),
        }
    }

    /// Sets the per-eviction-request timeout and the budget of a decision's Events.
    #[must_use]
    pub fn with_timeouts(mut self, eviction: Duration, events: Duration) -> Self {
        self.eviction_timeout = eviction;
        self.event_timeout = events;
        self
    }

    /// Sets the timeout of the fresh read that precedes each eviction.
    #[must_use]
    pub fn with_read_timeout(mut self, read: Duration) -> Self {
        self.read_timeout = read;
        self
    }

    /// Sets the budget of one decision's eviction walk; keep it plus the Events' timeout
    /// below the policy's `cooldownTimeout` (see [`DEFAULT_WALK_BUDGET`]).
    #[must_use]
    pub fn with_walk_budget(mut self, budget: Duration) -> Self {
        self.walk_budget = budget;
        self
    }

    /// Carries out `decision` and returns `(pod uid, outcome)` for every eviction attempted,
    /// in the order tried; the caller feeds each to `Guard::record_outcome(decision.id, …)`.
    ///
    /// - Enforce: walks `decision.candidates` in rank order until `decision.done(..)`
    ///   (target reclaimed, or `max_evictions` evicted: a rate-limited decision with no
    ///   allowance evicts nobody). Each victim is first read fresh: a read that fails or
    ///   times out is `Aborted` and ends the walk; a pod gone, terminating, finished or
    ///   re-created under its name is `AlreadyGone`; one that changed so that the policy
    ///   now excludes it (or moved to another node) is `Skipped`. Then the Eviction: a 429
    ///   (PDB) or another answer that says it was refused records the pod and moves
    ///   straight on; 404 is `AlreadyGone`; no answer (timeout, connection lost, a
    ///   gateway's 502/503/504) is `InDoubt` and ends the walk. Candidates not reached get
    ///   no outcome.
    /// - Dry-run: evicts nothing and returns nothing, so the guard cools down on the
    ///   planned victims' processes exactly as its dry-run semantics say.
    /// - Off: never reaches here (a guard in mode off makes no decision).
    ///
    /// Then the decision's Events are sent, best effort and bounded by the Events timeout;
    /// their failures are logged and change no outcome. Never panics, never errors.
    pub async fn execute(
        &self,
        decision: &Decision,
        pods: &PodMap,
    ) -> Vec<(String, EvictionOutcome)> {
        self.metrics
            .decisions
            .with_label_values(&[decision.mode.as_str(), decision.trigger.as_str()])
            .inc();
        let outcomes = match decision.mode {
            Mode::Enforce => self.walk(decision).await,
            _ => {
                tracing::info!(
                    gpu = decision.gpu,
                    uuid = %decision.uuid,
                    decision = decision.id,
                    planned = decision.planned,
                    "dry-run: evicting nothing"
                );
                Vec::new()
            }
        };
        self.announce(decision, &outcomes, pods).await;
        outcomes
    }

    async fn walk(&self, decision: &Decision) -> Vec<(String, EvictionOutcome)> {
        let started = self.clock.mono();
        let elapsed = |since: Duration| self.clock.mono().saturating_sub(since);
        let mut outcomes: Vec<(String, EvictionOutcome)> = Vec::new();
        let mut gone: Vec<String> = Vec::new();
        for (rank, victim) in decision.candidates.iter().enumerate() {
            let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
            if decision.done(&refs) {
                break;
            }
            let left = self.walk_budget.saturating_sub(elapsed(started));
            if left.is_zero() {
                tracing::warn!(
                    gpu = decision.gpu,
                    uuid = %decision.uuid,
                    decision = decision.id,
                    untried = decision.candidates.len() - rank,
                    budget_ms = self.walk_budget.as_millis() as u64,
                    "eviction walk budget spent; the guard will decide again"
                );
                break;
            }
            let t0 = self.clock.mono();
            let outcome = match self.recheck(victim, self.read_timeout.min(left)).await {
                Some(outcome) => outcome,
                None => {
                    let left = self.walk_budget.saturating_sub(elapsed(started));
                    self.evict_one(victim, self.eviction_timeout.min(left))
                        .await
                }
            };
            let elapsed_ms = elapsed(t0).as_millis() as u64;
            self.metrics
                .evictions
                .with_label_values(&[victim.namespace.as_str(), outcome.as_str()])
                .inc();
            log_outcome(
                decision,
                rank,
                victim,
                &outcome,
                elapsed_ms,
                self.grace_period_seconds,
            );
            if outcome.reclaims() {
                gone.push(victim.uid.clone());
            }
            let stop = outcome.ends_walk();
            outcomes.push((victim.uid.clone(), outcome));
            if stop {
                break;
            }
        }
        let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
        tracing::info!(
            gpu = decision.gpu,
            uuid = %decision.uuid,
            decision = decision.id,
            attempted = outcomes.len(),
            reclaimed = gone.len(),
            enough = decision.reclaimed_enough(&refs),
            elapsed_ms = elapsed(started).as_millis() as u64,
            "eviction walk finished"
        );
        outcomes
    }

    /// The fresh read before an eviction: `None` to go ahead, else the outcome that stands
    /// in for the eviction (see [`recheck::recheck`]).
    async fn recheck(&self, victim: &Victim, timeout: Duration) -> Option<EvictionOutcome> {
        let api: Api<Pod> = Api::namespaced(self.evict.clone(), &victim.namespace);
        let pod = match tokio::time::timeout(timeout, api.get(&victim.name)).await {
            Err(_) => {
                return Some(EvictionOutcome::Aborted(format!(
                    "fresh read of the pod: no answer within {} ms; evicting nothing",
                    timeout.as_millis()
                )))
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                return Some(EvictionOutcome::AlreadyGone)
            }
            Ok(Err(e)) => {
                return Some(EvictionOutcome::Aborted(notes::clean(
                    &format!("fresh read of the pod failed: {e}; evicting nothing"),
                    DETAIL_LIMIT,
                )))
            }
            Ok(Ok(pod)) => pod,
        };
        let Some(info) = pod_info(&pod) else {
            return Some(EvictionOutcome::Aborted(
                "fresh read of the pod: the answer has no uid, name or namespace".into(),
            ));
        };
        let spec_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        recheck::recheck(&self.policy, victim, &info, spec_node, &self.node, phase)
    }

    /// One Eviction, bounded by `timeout`.
    async fn evict_one(&self, victim: &Victim, timeout: Duration) -> EvictionOutcome {
        let api: Api<Pod> = Api::namespaced(self.evict.clone(), &victim.namespace);
        let eviction = eviction_for(victim, self.grace_period_seconds);
        let pp = PostParams::default();
        // The Eviction struct itself, not its bytes: kube serializes `data`.
        let call = api.create_subresource::<Eviction, serde_json::Value>(
            "eviction",
            &victim.name,
            &pp,
            &eviction,
        );
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => outcome_of(result.map(|_| ())),
            Err(_) => EvictionOutcome::InDoubt(format!(
                "no answer within {} ms; the eviction may still be carried out",
                timeout.as_millis()
            )),
        }
    }

    async fn announce(
        &self,
        decision: &Decision,
        outcomes: &[(String, EvictionOutcome)],
        pods: &PodMap,
    ) {
        let drafts = notes::drafts(decision, outcomes, pods, &self.node);
        let at = self.clock.wall();
        let sends = drafts.iter().map(|d| self.send_event(decision, d, at));
        if tokio::time::timeout(self.event_timeout, futures::future::join_all(sends))
            .await
            .is_err()
        {
            tracing::warn!(
                gpu = decision.gpu,
                decision = decision.id,
                timeout_ms = self.event_timeout.as_millis() as u64,
                "Events not all sent in time; given up (they are best effort)"
            );
        }
    }

    async fn send_event(&self, decision: &Decision, draft: &EventDraft, at: SystemTime) {
        if let Err(e) = self.events.send(draft, at).await {
            log_event_error(decision, draft, e.api, &e.source);
        }
    }
}

/// What [`DecisionExecutor::execute`] returns.
type Executing<'a> = Pin<Box<dyn Future<Output = Vec<(String, EvictionOutcome)>> + Send + 'a>>;

impl DecisionExecutor for Enforcer {
    fn execute(&self, decision: Decision, pods: Arc<PodMap>) -> Executing<'_> {
        Box::pin(async move { Enforcer::execute(self, &decision, &pods).await })
    }
}

/// The policy/v1 Eviction for `victim`. The UID precondition makes sure a pod recreated
/// under the same name (a StatefulSet's) is not evicted in its predecessor's place.
pub fn eviction_for(victim: &Victim, grace_period_seconds: i64) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(victim.name.clone()),
            namespace: Some(victim.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(grace_period_seconds),
            preconditions: Some(Preconditions {
                uid: Some(victim.uid.clone()),
                ..Preconditions::default()
            }),
            ..DeleteOptions::default()
        }),
    }
}

/// What an Eviction's answer means for the guard. A 2xx whose body does not parse is an
/// accepted eviction all the same. An `Err` that is not an API status (connection reset,
/// TLS, …) and a gateway's 502/503/504 are in doubt: the request may have reached the
/// server and may still be carried out. Other API statuses say it was not.
pub fn outcome_of(result: Result<(), kube::Error>) -> EvictionOutcome {
    match result {
        Ok(()) | Err(kube::Error::SerdeError(_)) => EvictionOutcome::Evicted,
        Err(kube::Error::Api(s)) => {
            let detail = || {
                let reason = if s.reason.is_empty() {
                    String::new()
                } else {
                    format!(" {}", s.reason)
                };
                notes::clean(&format!("{}{reason}: {}", s.code, s.message), DETAIL_LIMIT)
            };
            match s.code {
                404 => EvictionOutcome::AlreadyGone,
                // Only the UID precondition's conflict means "the pod we chose is gone";
                // a 409 can also be the PDB's status update losing a race.
                409 if s.message.to_ascii_lowercase().contains("precondition") => {
                    EvictionOutcome::AlreadyGone
                }
                429 => EvictionOutcome::Blocked(detail()),
                502..=504 => EvictionOutcome::InDoubt(detail()),
                _ => EvictionOutcome::Failed(detail()),
            }
        }
        Err(e) => EvictionOutcome::InDoubt(notes::clean(
            &format!("{e}; the eviction may still be carried out"),
            DETAIL_LIMIT,
        )),
    }
}

fn log_outcome(
    decision: &Decision,
    rank: usize,
    victim: &Victim,
    outcome: &EvictionOutcome,
    elapsed_ms: u64,
    grace_period_seconds: i64,
) {
    let detail = outcome.detail().unwrap_or("");
    macro_rules! log {
        ($level:ident, $msg:literal) => {
            tracing::$level!(
                gpu = decision.gpu,
                uuid = %decision.uuid,
                decision = decision.id,
                namespace = %victim.namespace,
                pod = %victim.name,
                uid = %victim.uid,
                rank = rank + 1,
                use_mib = victim.use_bytes / crate::model::snapshot::MIB,
                outcome = outcome.as_str(),
                detail,
                elapsed_ms,
                grace_period_seconds,
                ci_job = victim.ci_job_id.as_deref().unwrap_or(""),
                $msg
            )
        };
    }
    match outcome {
        EvictionOutcome::Evicted => log!(warn, "pod evicted to relieve GPU memory pressure"),
        EvictionOutcome::AlreadyGone => log!(info, "pod already gone"),
        EvictionOutcome::Blocked(_) => log!(warn, "eviction blocked; trying the next candidate"),
        EvictionOutcome::Failed(_) => log!(warn, "eviction failed; trying the next candidate"),
        EvictionOutcome::InDoubt(_) => log!(
            warn,
            "eviction outcome unknown; no further eviction on this GPU until the pod's fate is known"
        ),
        EvictionOutcome::Skipped(_) => {
            log!(warn, "pod changed since the plan; not evicted, trying the next candidate")
        }
        EvictionOutcome::Aborted(_) => {
            log!(warn, "cannot read the pod fresh; evicting nothing for this decision")
        }
    }
}

fn log_event_error(decision: &Decision, draft: &EventDraft, api: &str, e: &kube::Error) {
    let about = match &draft.regarding {
        notes::Regarding::Pod {
            namespace, name, ..
        } => format!("pod {namespace}/{name}"),
        notes::Regarding::Node { name } => format!("node {name}"),
    };
    tracing::warn!(
        gpu = decision.gpu,
        decision = decision.id,
        api,
        regarding = %about,
        reason = draft.reason,
        error = %e,
        "cannot create Event (best effort; evictions unaffected)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16, reason: &str, message: &str) -> Result<(), kube::Error> {
        Err(kube::Error::Api(
            Status::failure(message, reason).with_code(code).boxed(),
        ))
    }

    #[test]
    fn answers_map_to_outcomes() {
        let serde_err = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let rows: Vec<(&str, Result<(), kube::Error>, EvictionOutcome)> = vec![
            ("201", Ok(()), EvictionOutcome::Evicted),
            ("2xx, odd body", Err(kube::Error::SerdeError(serde_err)), EvictionOutcome::Evicted),
            ("404", api(404, "NotFound", "pods \"a\" not found"), EvictionOutcome::AlreadyGone),
            (
                "409 UID precondition",
                api(409, "Conflict", "Operation cannot be fulfilled on pods \"a\": the UID in the precondition (1) does not match the UID in record (2)"),
                EvictionOutcome::AlreadyGone,
            ),
            (
                "409 PDB race",
                api(409, "Conflict", "the object has been modified"),
                EvictionOutcome::Failed("409 Conflict: the object has been modified".into()),
            ),
            (
                "429 PDB",
                api(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."),
                EvictionOutcome::Blocked(
                    "429 TooManyRequests: Cannot evict pod as it would violate the pod's disruption budget.".into(),
                ),
            ),
            ("500", api(500, "InternalError", "boom"), EvictionOutcome::Failed("500 InternalError: boom".into())),
            ("403", api(403, "Forbidden", "no"), EvictionOutcome::Failed("403 Forbidden: no".into())),
            ("503 no reason", api(503, "", "down"), EvictionOutcome::InDoubt("503: down".into())),
            ("504", api(504, "Timeout", "slow"), EvictionOutcome::InDoubt("504 Timeout: slow".into())),
        ];
        for (name, result, want) in rows {
            assert_eq!(outcome_of(result), want, "{name}");
        }
        let long = outcome_of(api(500, "X", &"y\n".repeat(1000)));
        let EvictionOutcome::Failed(d) = long else {
            panic!("{long:?}")
        };
        assert!(d.len() <= DETAIL_LIMIT && !d.contains('\n'));
    }

    #[test]
    fn eviction_body_has_grace_period_and_uid_precondition() {
        let v = Victim {
            uid: "u-1".into(),
            namespace: "ci".into(),
            name: "job-1".into(),
            containers: vec![],
            pids: vec![],
            use_bytes: 0,
            request_bytes: 0,
            priority: 0,
            priority_class: None,
            created_at: None,
            ci_job_id: None,
            ci_job_url: None,
            reason: String::new(),
        };
        let body = serde_json::to_value(eviction_for(&v, 7)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "job-1", "namespace": "ci"},
                "deleteOptions": {"gracePeriodSeconds": 7, "preconditions": {"uid": "u-1"}},
            })
        );
    }
}
