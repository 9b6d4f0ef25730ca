//! The guard's port: what carries a decision out. The agent's loop calls it; the
//! Kubernetes shell (`act::enforce`) implements it, and tests record what it is asked.

use super::decision::{Decision, EvictionOutcome};
use crate::model::pod::PodMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

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

    /// The executor's own part of /state (JSON null when it has none).
    fn status(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}
