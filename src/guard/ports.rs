//! The guard's port: what carries a decision out. The agent's loop calls it; the
//! Kubernetes shell (`act::enforce`) implements it, and tests record what it is asked.

use super::decision::{Decision, EvictionOutcome};
use crate::model::pod::PodMap;
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// What executing a decision yields: each pod tried, with its outcome.
pub type Outcomes = Vec<(String, EvictionOutcome)>;

/// A fresh read the guard wants before it ends a doubt as "not carried out": an eviction in
/// doubt whose pod still looks alive after `inDoubtTimeout` of the server answering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmRequest {
    /// The decision the eviction in doubt belongs to.
    pub decision_id: u64,
    /// The pod's UID when it was chosen.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What the fresh read of a pod in doubt showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// The pod is there, the same UID, with no deletion timestamp and not finished: the
    /// eviction was not carried out.
    Running,
    /// Gone (404), terminating, finished or re-created under its name: the eviction (or
    /// something else) took it.
    Gone(String),
    /// The read failed or timed out: still in doubt; asked again later.
    Unknown(String),
}

/// What stop-at-decision did and holds (`act::stop`), for `/state`'s `guard.onDecision`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StopStatus {
    /// The policy's `onDecision`.
    pub on_decision: &'static str,
    /// Whether the agent may signal the victims' processes.
    pub permitted: bool,
    /// Why not, when it may not.
    pub not_permitted_reason: Option<String>,
    /// Pods whose processes are stopped now, awaiting their eviction's fate.
    pub stopped: Vec<HeldStop>,
    /// The last things done to victims' processes, oldest first.
    pub recent: Vec<ActionRecord>,
}

/// A pod whose processes are stopped now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldStop {
    /// The pod's UID.
    pub uid: String,
    /// `namespace/name`.
    pub pod: String,
    /// The decision that stopped them.
    pub decision_id: u64,
    /// The stopped processes.
    pub pids: Vec<u32>,
    /// When they were stopped (monotonic, seconds in JSON).
    #[serde(serialize_with = "crate::guard::decision::ser_secs")]
    pub since: Duration,
}

/// One thing done to a pod's processes, for /state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionRecord {
    pub decision_id: u64,
    pub pod: String,
    pub uid: String,
    /// What was done, as the Events say it.
    pub action: String,
    #[serde(serialize_with = "crate::guard::decision::ser_secs")]
    pub at: Duration,
}

/// Carries out a guard decision (the enforcer shell in production, a recorder in tests)
/// and returns what happened to each pod it tried.
pub trait DecisionExecutor: Send + Sync {
    /// Executes `decision` against the pods of the current view.
    fn execute(
        &self,
        decision: Decision,
        pods: Arc<PodMap>,
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + '_>>;

    /// The guard resolved an eviction that was in doubt (pod `uid`): the executor undoes
    /// what it did before the eviction (resumes stopped processes) if it was not carried out.
    fn resolved(&self, _uid: &str, _outcome: &EvictionOutcome) {}

    /// `decision` restored an eviction in doubt from before an agent restart: the executor
    /// does again what it did before that eviction (stops the pods' processes, which the
    /// earlier process resumed when it shut down), so a pod whose eviction may still land
    /// cannot grow meanwhile. Only the plan's pods (`candidates[..planned]`) are meant.
    fn hold_again(&self, _decision: &Decision) {}

    /// Reads the pod of an eviction in doubt afresh (see [`ConfirmRequest`]). An executor
    /// that reads no pods leaves every doubt in doubt.
    fn confirm(
        &self,
        _request: ConfirmRequest,
    ) -> Pin<Box<dyn Future<Output = Confirmation> + Send + '_>> {
        Box::pin(async { Confirmation::Unknown("this executor reads no pods".into()) })
    }

    /// The agent is stopping: undo whatever is still pending (resume stopped processes),
    /// since nobody will resolve it.
    fn shutdown(&self) {}

    /// What stop-at-decision did and holds, when the executor stops (`/state`).
    fn status(&self) -> Option<StopStatus> {
        None
    }
}
