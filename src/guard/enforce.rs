//! The enforcer shell: carries out a guard [`Decision`] against the API server
//! (DESIGN §3.5, §3.6, §4). In enforce mode it posts policy/v1 Evictions in rank order
//! until the decision is done; in dry-run it evicts nothing. In both it emits the
//! decision's Events ([`super::events`]) and counts the decision and eviction metrics.
//!
//! Evictions go through the `evict` client, whose kube default retry is off: a
//! PodDisruptionBudget's 429 must come back at once so the next candidate can be tried
//! while the GPU still has memory left. Pods are never deleted directly: only the
//! Eviction API honours PodDisruptionBudgets.

use super::events::{self, EventDraft};
use super::policy::Mode;
use super::rank::Victim;
use super::state::{Decision, EvictionOutcome};
use crate::agent::DecisionExecutor;
use crate::attribute::pods::PodMap;
use crate::kube::KubeClients;
use crate::publish::self_metrics::SelfMetrics;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::{Api, PostParams};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How long one eviction request may take before it counts as failed.
pub const DEFAULT_EVICTION_TIMEOUT: Duration = Duration::from_secs(5);
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
    main: kube::Client,
    evict: kube::Client,
    node: String,
    metrics: SelfMetrics,
    grace_period_seconds: i64,
    eviction_timeout: Duration,
    event_timeout: Duration,
    walk_budget: Duration,
    /// Set once the API server answered 404 for `events.k8s.io` and a core/v1 Event went
    /// through instead: later Events skip the doomed first attempt.
    core_events_only: AtomicBool,
}

impl Enforcer {
    /// An enforcer for `node` using `clients.direct` (no retry) for evictions and
    /// `clients.main` for Events; evicted pods get `grace_period_seconds`
    /// (`Policy::eviction_grace_period_seconds`). Timeouts start at the `DEFAULT_*` values.
    pub fn new(
        clients: &KubeClients,
        node: impl Into<String>,
        metrics: SelfMetrics,
        grace_period_seconds: i64,
    ) -> Self {
        Enforcer {
            main: clients.main.clone(),
            evict: clients.direct.clone(),
            node: node.into(),
            metrics,
            grace_period_seconds,
            eviction_timeout: DEFAULT_EVICTION_TIMEOUT,
            event_timeout: DEFAULT_EVENT_TIMEOUT,
            walk_budget: DEFAULT_WALK_BUDGET,
            core_events_only: AtomicBool::new(false),
        }
    }

    /// Sets the per-eviction-request timeout and the budget of a decision's Events.
    #[must_use]
    pub fn with_timeouts(mut self, eviction: Duration, events: Duration) -> Self {
        self.eviction_timeout = eviction;
        self.event_timeout = events;
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
    /// - Enforce: walks `decision.candidates` in rank order, posting an Eviction for each
    ///   until `decision.done(..)` (target reclaimed, or `max_evictions` evicted: a
    ///   rate-limited decision with no allowance evicts nobody). A 429 (PDB), 5xx, timeout
    ///   or connection error records the pod and moves straight on to the next; 404 is
    ///   `AlreadyGone`. Candidates not reached (done, or the walk budget spent) get no
    ///   outcome.
    /// - Dry-run: evicts nothing and returns nothing, so the guard cools down on the
    ///   planned victims' processes exactly as its dry-run semantics say.
    /// - Off: does nothing (the guard makes no decisions in that mode).
    ///
    /// Then the decision's Events are sent, best effort and bounded by the Events timeout;
    /// their failures are logged and change no outcome. Never panics, never errors.
    pub async fn execute(
        &self,
        decision: &Decision,
        pods: &PodMap,
    ) -> Vec<(String, EvictionOutcome)> {
        if decision.mode == Mode::Off {
            tracing::debug!(decision = decision.id, "mode off: decision ignored");
            return Vec::new();
        }
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
        let started = Instant::now();
        let mut outcomes: Vec<(String, EvictionOutcome)> = Vec::new();
        let mut gone: Vec<String> = Vec::new();
        for (rank, victim) in decision.candidates.iter().enumerate() {
            let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
            if decision.done(&refs) {
                break;
            }
            let left = self.walk_budget.saturating_sub(started.elapsed());
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
            let t0 = Instant::now();
            let outcome = self
                .evict_one(victim, self.eviction_timeout.min(left))
                .await;
            let elapsed_ms = t0.elapsed().as_millis() as u64;
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
            outcomes.push((victim.uid.clone(), outcome));
        }
        let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
        tracing::info!(
            gpu = decision.gpu,
            uuid = %decision.uuid,
            decision = decision.id,
            attempted = outcomes.len(),
            reclaimed = gone.len(),
            enough = decision.reclaimed_enough(&refs),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "eviction walk finished"
        );
        outcomes
    }

    /// One Eviction, bounded by `timeout`.
    async fn evict_one(&self, victim: &Victim, timeout: Duration) -> EvictionOutcome {
        let api: Api<Pod> = Api::namespaced(self.evict.clone(), &victim.namespace);
        let eviction = eviction_for(victim, self.grace_period_seconds);
        let pp = PostParams::default();
        // The Eviction struct itself, not its bytes: kube serializes `data` (DESIGN §4).
        let call = api.create_subresource::<Eviction, serde_json::Value>(
            "eviction",
            &victim.name,
            &pp,
            &eviction,
        );
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => outcome_of(result.map(|_| ())),
            Err(_) => {
                EvictionOutcome::Failed(format!("no answer within {} ms", timeout.as_millis()))
            }
        }
    }

    async fn announce(
        &self,
        decision: &Decision,
        outcomes: &[(String, EvictionOutcome)],
        pods: &PodMap,
    ) {
        let drafts = events::drafts(decision, outcomes, pods, &self.node);
        let at = SystemTime::now();
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
        let pp = PostParams::default();
        let mut fell_back = false;
        if !self.core_events_only.load(Ordering::Relaxed) {
            let api: Api<Event> = Api::namespaced(self.main.clone(), &draft.namespace);
            match api
                .create(&pp, &events::events_v1(draft, &self.node, at))
                .await
            {
                // A 2xx whose body does not parse is still a created Event.
                Ok(_) | Err(kube::Error::SerdeError(_)) => return,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    tracing::info!(
                        decision = decision.id,
                        "events.k8s.io/v1 not served (404); sending a core/v1 Event instead"
                    );
                    fell_back = true;
                }
                Err(e) => {
                    log_event_error(decision, draft, "events.k8s.io/v1", &e);
                    return;
                }
            }
        }
        let api: Api<CoreEvent> = Api::namespaced(self.main.clone(), &draft.namespace);
        match api
            .create(&pp, &events::core_v1(draft, &self.node, at))
            .await
        {
            Ok(_) | Err(kube::Error::SerdeError(_)) => {
                if fell_back {
                    self.core_events_only.store(true, Ordering::Relaxed);
                }
            }
            Err(e) => log_event_error(decision, draft, "v1", &e),
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

/// What an Eviction's answer means for the guard. An `Err` that is not an API status
/// (connection refused or reset, TLS, …) is a failure; a 2xx whose body does not parse is
/// an accepted eviction all the same.
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
                events::clean(&format!("{}{reason}: {}", s.code, s.message), DETAIL_LIMIT)
            };
            match s.code {
                404 => EvictionOutcome::AlreadyGone,
                // Only the UID precondition's conflict means "the pod we chose is gone";
                // a 409 can also be the PDB's status update losing a race.
                409 if s.message.to_ascii_lowercase().contains("precondition") => {
                    EvictionOutcome::AlreadyGone
                }
                429 => EvictionOutcome::Blocked(detail()),
                _ => EvictionOutcome::Failed(detail()),
            }
        }
        Err(e) => EvictionOutcome::Failed(events::clean(&e.to_string(), DETAIL_LIMIT)),
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
    let detail = match outcome {
        EvictionOutcome::Blocked(d) | EvictionOutcome::Failed(d) => d.as_str(),
        _ => "",
    };
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
                use_mib = victim.use_bytes / crate::snapshot::MIB,
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
    }
}

fn log_event_error(decision: &Decision, draft: &EventDraft, api: &str, e: &kube::Error) {
    let about = match &draft.regarding {
        events::Regarding::Pod {
            namespace, name, ..
        } => format!("pod {namespace}/{name}"),
        events::Regarding::Node { name } => format!("node {name}"),
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
            ("503 no reason", api(503, "", "down"), EvictionOutcome::Failed("503: down".into())),
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
