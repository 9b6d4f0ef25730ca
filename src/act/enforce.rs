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
use crate::act::eviction_answer::{self, Answer, DETAIL_LIMIT};
use crate::act::read_timeout::ReadTimeout;
use crate::act::stop::{self, Stopper};
use crate::attribute::pods::pod_info;
use crate::guard::decision::{Decision, EvictionOutcome};
use crate::guard::notes::{self, EventDraft};
use crate::guard::policy::{Mode, Policy};
use crate::guard::ports::{ConfirmRequest, Confirmation, DecisionExecutor, StopStatus};
use crate::guard::rank::Victim;
use crate::guard::recheck;
use crate::kubeapi::Pods;
use crate::model::clock::Clock;
use crate::model::pod::PodMap;
use crate::publish::self_metrics::SelfMetrics;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::PostParams;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long one eviction request may take before its outcome is in doubt.
pub const DEFAULT_EVICTION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the fresh read of a victim may take before the walk stops, evicting nothing,
/// while the API answers fast; it grows with the server's measured latency
/// ([`ReadTimeout`]) up to [`MAX_READ_TIMEOUT`].
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest the fresh read's limit grows to on a slow API server.
pub const MAX_READ_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the fresh read of one victim is retried, while the API server is slow or fails,
/// before the walk gives up on it and evicts nothing (a stopped victim is then resumed). A
/// slow read is a fact about the server, not the pod: on the H200 a server answering the read
/// after 3 s, with a single 2 s limit, resumed the stopped grower and its neighbours lost 43
/// allocations a run (issue 38); retried within this bound, the read answers and the victim
/// stays stopped until the kubelet kills it. It is the longest the read's own limit grows
/// to, so a server slower than that for one read is also given up on.
pub const DEFAULT_READ_BOUND: Duration = MAX_READ_TIMEOUT;
/// The first pause between two fresh reads that failed at once (a 5xx, a dropped
/// connection); each further one doubles it, up to [`MAX_READ_RETRY_PAUSE`].
const READ_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The longest pause between two fresh reads of a victim.
const MAX_READ_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// How long a decision's Events may take, all together (they are best effort).
pub const DEFAULT_EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one decision's walk through its candidates may take: `cooldownTimeout` less
/// 10 s, at least 5 s (20 s at the default 30 s). The guard closes a decision it has heard
/// nothing about for `cooldownTimeout` and may then decide again, so the walk plus the
/// Events ([`DEFAULT_EVENT_TIMEOUT`]) must end well before that, or two walks could evict
/// for the same pressure.
pub fn walk_budget(cooldown_timeout: Duration) -> Duration {
    cooldown_timeout
        .saturating_sub(Duration::from_secs(10))
        .max(Duration::from_secs(5))
}

/// Carries out guard decisions: evictions (enforce), Events and metrics.
pub struct Enforcer {
    evict: kube::Client,
    node: String,
    metrics: SelfMetrics,
    clock: Arc<dyn Clock>,
    policy: Policy,
    grace_period_seconds: i64,
    read_timeout: std::sync::Mutex<ReadTimeout>,
    read_bound: Duration,
    eviction_timeout: Duration,
    event_timeout: Duration,
    walk_budget: Duration,
    events: EventSender,
    /// Stops (or kills) the victims' GPU processes at decision, and resumes them.
    stopper: Option<Arc<Stopper>>,
}

/// What was done to the victims' processes during a walk: `(pod uid, what)`, in order.
type Actions = Vec<(String, String)>;

impl Enforcer {
    /// An enforcer for `node` using `clients.direct` (no retry) for fresh reads and
    /// evictions and `clients.main` for Events. `policy` judges a victim's fresh state (the
    /// same exclusions the ranking applies), gives the evicted pods' grace period
    /// (`evictionGracePeriodSeconds`) and, through its `cooldownTimeout`, the walk's budget
    /// ([`walk_budget`]). Timeouts start at the `DEFAULT_*` values; the walk's budget, the
    /// logged durations and the Events' times are read from `clock`.
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
            read_timeout: std::sync::Mutex::new(ReadTimeout::new(
                DEFAULT_READ_TIMEOUT,
                MAX_READ_TIMEOUT,
            )),
            read_bound: DEFAULT_READ_BOUND,
            eviction_timeout: DEFAULT_EVICTION_TIMEOUT,
            event_timeout: DEFAULT_EVENT_TIMEOUT,
            walk_budget: walk_budget(policy.cooldown_timeout),
            events: EventSender::new(clients.main.clone(), node),
            stopper: None,
        }
    }

    /// Stops (or kills) each victim's GPU processes before its eviction, as `stopper`'s
    /// action says, and resumes them when the eviction does not happen.
    #[must_use]
    pub fn with_stopper(mut self, stopper: Arc<Stopper>) -> Self {
        self.stopper = Some(stopper);
        self
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
        self.read_timeout =
            std::sync::Mutex::new(ReadTimeout::new(read, MAX_READ_TIMEOUT.max(read)));
        self
    }

    /// Sets how long the fresh read of one victim is retried before the walk gives up on it
    /// ([`DEFAULT_READ_BOUND`]).
    #[must_use]
    pub fn with_read_bound(mut self, bound: Duration) -> Self {
        self.read_bound = bound;
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
    ///   now excludes it (or moved to another node) is `Skipped`. Then the Eviction, its
    ///   answer read by [`eviction_answer::classify`]: an answer about this pod (its PDB's
    ///   429, 404) records the pod and moves on; an answer about the server (APF's 429, 403,
    ///   400) ends the walk with nothing more tried; no answer or an ambiguous one (timeout,
    ///   connection lost, 500, a gateway's 502/503/504) is `InDoubt` and ends the walk.
    ///   Candidates not reached get no outcome.
    /// - Dry-run: evicts nothing and returns nothing, so the guard cools down on the
    ///   planned victims' processes exactly as its dry-run semantics say.
    /// - Off: never reaches here (a guard in mode off makes no decision).
    ///
    /// Then the decision's Events are sent, best effort and bounded by the Events timeout;
    /// their failures are logged and change no outcome. Never panics, never errors.
    /// Boxed: docs/architecture.md, "Crates".
    pub fn execute<'a>(
        &'a self,
        decision: &'a Decision,
        pods: &'a PodMap,
    ) -> futures::future::BoxFuture<'a, Vec<(String, EvictionOutcome)>> {
        Box::pin(self.execute_inner(decision, pods))
    }
    async fn execute_inner(
        &self,
        decision: &Decision,
        pods: &PodMap,
    ) -> Vec<(String, EvictionOutcome)> {
        let escalated = if decision.escalated.is_some() {
            "true"
        } else {
            "false"
        };
        self.metrics
            .decisions
            .with_label_values(&[escalated, decision.mode.as_str(), decision.trigger.as_str()])
            .inc();
        let (outcomes, actions) = match decision.mode {
            Mode::Enforce => self.walk(decision).await,
            _ => {
                tracing::info!(
                    gpu = decision.gpu,
                    uuid = %decision.uuid,
                    decision = decision.id,
                    planned = decision.planned,
                    "dry-run: evicting nothing"
                );
                (Vec::new(), Vec::new())
            }
        };
        self.announce(decision, &outcomes, &actions, pods).await;
        outcomes
    }

    async fn walk(&self, decision: &Decision) -> (Vec<(String, EvictionOutcome)>, Actions) {
        let started = self.clock.mono();
        let elapsed = |since: Duration| self.clock.mono().saturating_sub(since);
        let mut outcomes: Vec<(String, EvictionOutcome)> = Vec::new();
        let mut gone: Vec<String> = Vec::new();
        let mut actions: Actions = Vec::new();
        let mut act = |uid: &str, what: Option<String>| {
            if let Some(what) = what {
                actions.push((uid.to_string(), what));
            }
        };
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
            // Stopping is undone if the fresh read disagrees, so it comes first: the
            // growth stops one API round trip sooner. A kill waits for the read.
            let stopper = self.stopper.as_deref();
            act(&victim.uid, stopper.and_then(|s| s.stop(decision, victim)));
            let outcome = match self.recheck(victim, left).await {
                Some(outcome) => outcome,
                None => {
                    act(&victim.uid, stopper.and_then(|s| s.kill(decision, victim)));
                    let left = self.walk_budget.saturating_sub(elapsed(started));
                    self.evict_one(victim, self.eviction_timeout.min(left))
                        .await
                }
            };
            act(
                &victim.uid,
                stopper.and_then(|s| s.after(decision.id, victim, &outcome)),
            );
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
        let evicted = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, EvictionOutcome::Evicted | EvictionOutcome::InDoubt(_)))
            .count();
        self.metrics.decision_evictions.observe(evicted as f64);
        let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
        tracing::info!(
            gpu = decision.gpu,
            uuid = %decision.uuid,
            decision = decision.id,
            escalated = decision.escalated.is_some(),
            evicted,
            attempted = outcomes.len(),
            reclaimed = gone.len(),
            enough = decision.reclaimed_enough(&refs),
            elapsed_ms = elapsed(started).as_millis() as u64,
            "eviction walk finished"
        );
        (outcomes, actions)
    }

    /// One GET of a pod, bounded by `timeout`; its latency (or the timeout) feeds the
    /// read limit ([`ReadTimeout`]) that every fresh read follows.
    async fn read_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Result<Pod, kube::Error>, tokio::time::error::Elapsed> {
        let pods = Pods::namespaced(self.evict.clone(), namespace);
        let t0 = self.clock.mono();
        let read = tokio::time::timeout(timeout, pods.get(name)).await;
        let mut bound = self.read_timeout.lock().unwrap_or_else(|e| e.into_inner());
        match &read {
            Err(_) => bound.timed_out(timeout),
            Ok(_) => bound.answered(self.clock.mono().saturating_sub(t0)),
        }
        read
    }

    /// The fresh read before an eviction: `None` to go ahead, else the outcome that stands
    /// in for the eviction (see [`recheck::recheck`]). A read that times out or fails is
    /// tried again — each time with the limit the server's latency set — for up to the
    /// read bound (within what is left of the walk's budget): only an answer about the pod
    /// (gone, changed) or the bound ends it without an eviction. A 401 or 403 ends it at
    /// once: the agent may not read pods, and asking again changes nothing.
    async fn recheck(&self, victim: &Victim, left: Duration) -> Option<EvictionOutcome> {
        let bound = self.read_bound.min(left);
        let mut tries = 0u32;
        let mut last = String::from("not tried");
        let read = async {
            let mut pause = READ_RETRY_PAUSE;
            loop {
                tries += 1;
                let limit = self.read_limit();
                let failure = match self.read_pod(&victim.namespace, &victim.name, limit).await {
                    Err(_) => format!("no answer within {} ms", limit.as_millis()),
                    Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                        return Some(EvictionOutcome::AlreadyGone)
                    }
                    Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => {
                        return Some(EvictionOutcome::Aborted(notes::clean(
                            &format!(
                                "fresh read of the pod refused ({} {}); evicting nothing",
                                s.code, s.message
                            ),
                            DETAIL_LIMIT,
                        )))
                    }
                    Ok(Err(e)) => {
                        let failure = format!("failed: {e}");
                        if tries == 1 {
                            self.warn_read_retry(victim, &failure, bound);
                        }
                        last.clone_from(&failure);
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_READ_RETRY_PAUSE);
                        continue;
                    }
                    Ok(Ok(pod)) => return self.judge_fresh(victim, &pod),
                };
                if tries == 1 {
                    self.warn_read_retry(victim, &failure, bound);
                }
                last = failure;
            }
        };
        match tokio::time::timeout(bound, read).await {
            Ok(verdict) => verdict,
            Err(_) => Some(EvictionOutcome::Aborted(notes::clean(
                &format!(
                    "the API server did not answer the fresh read of the pod within {} ({tries} tries, the last {last}); evicting nothing",
                    humantime::format_duration(bound)
                ),
                DETAIL_LIMIT,
            ))),
        }
    }

    /// Said once per victim: a slow or failing server is otherwise silent until the bound,
    /// and an operator watching a stopped pod wants to know why it is neither evicted nor
    /// resumed.
    fn warn_read_retry(&self, victim: &Victim, failure: &str, bound: Duration) {
        tracing::warn!(
            pod = %format!("{}/{}", victim.namespace, victim.name),
            failure,
            "retrying the fresh read of the victim for up to {}; it is neither evicted nor resumed meanwhile",
            humantime::format_duration(bound)
        );
    }

    /// What a fresh read of `victim` says: `None` to go ahead ([`recheck::recheck`]).
    fn judge_fresh(&self, victim: &Victim, pod: &Pod) -> Option<EvictionOutcome> {
        let Some(info) = pod_info(pod) else {
            return Some(EvictionOutcome::Aborted(
                "fresh read of the pod: the answer has no uid, name or namespace".into(),
            ));
        };
        let spec_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        recheck::recheck(&self.policy, victim, &info, spec_node, &self.node, phase)
    }

    /// The fresh read that may end a doubt as "not carried out" (`guard::state::confirm`):
    /// only the same pod, with no deletion timestamp and not finished, is `Running`.
    async fn confirm_read(&self, request: &ConfirmRequest) -> Confirmation {
        let timeout = self.read_limit();
        let answer = match self
            .read_pod(&request.namespace, &request.name, timeout)
            .await
        {
            Err(_) => Confirmation::Unknown(format!("no answer within {} ms", timeout.as_millis())),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                Confirmation::Gone("the pod is gone (404)".into())
            }
            Ok(Err(e)) => Confirmation::Unknown(notes::clean(&e.to_string(), DETAIL_LIMIT)),
            Ok(Ok(pod)) => {
                let uid = pod.metadata.uid.as_deref();
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                if uid != Some(request.uid.as_str()) {
                    Confirmation::Gone("re-created under its name (another UID)".into())
                } else if pod.metadata.deletion_timestamp.is_some() {
                    Confirmation::Gone("terminating".into())
                } else if matches!(phase, Some("Succeeded" | "Failed")) {
                    Confirmation::Gone(format!("finished ({})", phase.unwrap_or_default()))
                } else {
                    Confirmation::Running
                }
            }
        };
        tracing::info!(
            decision = request.decision_id,
            namespace = %request.namespace,
            pod = %request.name,
            uid = %request.uid,
            answer = ?answer,
            "fresh read of a pod whose eviction is in doubt"
        );
        answer
    }

    /// The fresh read's limit now: it follows the server's latency ([`ReadTimeout`]).
    fn read_limit(&self) -> Duration {
        self.read_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .limit()
    }

    /// One Eviction, bounded by `timeout`. Sent as a raw request so the answer's status,
    /// `Retry-After` and body all reach [`eviction_answer::classify`]: kube's typed call
    /// drops the header, and APF's 429 is not even a `Status`.
    async fn evict_one(&self, victim: &Victim, timeout: Duration) -> EvictionOutcome {
        match tokio::time::timeout(timeout, self.post_eviction(victim)).await {
            Ok(Ok(answer)) => eviction_answer::classify(&answer),
            Ok(Err(e)) => EvictionOutcome::InDoubt(notes::clean(
                &format!("{e}; the eviction may still be carried out"),
                DETAIL_LIMIT,
            )),
            Err(_) => EvictionOutcome::InDoubt(format!(
                "no answer within {} ms; the eviction may still be carried out",
                timeout.as_millis()
            )),
        }
    }

    async fn post_eviction(&self, victim: &Victim) -> Result<Answer, kube::Error> {
        use http_body_util::BodyExt;
        let eviction = eviction_for(victim, self.grace_period_seconds);
        let body = serde_json::to_vec(&eviction).map_err(kube::Error::SerdeError)?;
        let url = format!("/api/v1/namespaces/{}/pods", victim.namespace);
        let request = kube::core::Request::new(url)
            .create_subresource("eviction", &victim.name, &PostParams::default(), body)
            .map_err(kube::Error::BuildRequest)?;
        let response = self
            .evict
            .send(request.map(kube::client::Body::from))
            .await?;
        let code = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = response.into_body().collect().await?.to_bytes();
        // Only the start of a body is read into the outcome.
        let cut = &bytes[..bytes.len().min(64 * 1024)];
        Ok(Answer::new(code, retry_after.as_deref(), cut))
    }

    async fn announce(
        &self,
        decision: &Decision,
        outcomes: &[(String, EvictionOutcome)],
        actions: &Actions,
        pods: &PodMap,
    ) {
        let mut drafts = notes::drafts(
            decision,
            outcomes,
            pods,
            &self.node,
            &self.policy.vram_request_annotation(),
        );
        stop::annotate(&mut drafts, decision, actions);
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

/// What [`DecisionExecutor::confirm`] returns.
type Confirming<'a> = Pin<Box<dyn Future<Output = Confirmation> + Send + 'a>>;

/// What [`DecisionExecutor::execute`] returns.
type Executing<'a> = Pin<Box<dyn Future<Output = Vec<(String, EvictionOutcome)>> + Send + 'a>>;

impl DecisionExecutor for Enforcer {
    fn execute(&self, decision: Decision, pods: Arc<PodMap>) -> Executing<'_> {
        Box::pin(async move { Enforcer::execute(self, &decision, &pods).await })
    }

    fn resolved(&self, uid: &str, outcome: &EvictionOutcome) {
        if let Some(s) = &self.stopper {
            s.resolved(uid, outcome);
        }
    }

    fn hold_again(&self, decision: &Decision) {
        if let Some(s) = &self.stopper {
            for v in decision.candidates.iter().take(decision.planned) {
                s.stop_again(decision, v);
            }
        }
    }

    fn confirm(&self, request: ConfirmRequest) -> Confirming<'_> {
        Box::pin(async move { self.confirm_read(&request).await })
    }

    fn shutdown(&self) {
        if let Some(s) = &self.stopper {
            s.resume_all("the agent is shutting down");
        }
    }

    fn status(&self) -> Option<StopStatus> {
        self.stopper.as_ref().map(|s| s.status())
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
        EvictionOutcome::Failed(_) => {
            log!(warn, "eviction refused for a reason not about the pod; walk stopped, GPU paused")
        }
        EvictionOutcome::Throttled { .. } => log!(
            warn,
            "API server busy (429 without a disruption-budget cause); walk stopped, retrying the same pod after the server's Retry-After"
        ),
        EvictionOutcome::Forbidden(_) => log!(
            error,
            "the agent is not allowed to evict (RBAC or an admission webhook); walk stopped, no pod will be evicted until this is fixed"
        ),
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
        // Only ever a doubt's resolution (`guard::state`), never the walk's.
        EvictionOutcome::Lost(_) => log!(warn, "the pod's UID is gone; the eviction was lost"),
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
            grew_bytes: 0,
            grew_over_ms: 0,
            growth_ahead_bytes: 0,
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

    #[test]
    fn the_walk_ends_well_inside_the_cooldown() {
        let s = Duration::from_secs;
        assert_eq!(walk_budget(Policy::default().cooldown_timeout), s(20));
        assert_eq!(walk_budget(s(60)), s(50));
        assert_eq!(walk_budget(s(12)), s(5), "never below 5 s");
        assert_eq!(walk_budget(s(1)), s(5));
    }
}
