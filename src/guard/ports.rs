//! The guard's port: what carries a decision out. The agent's loop calls it; the
//! Kubernetes shell (`act::enforce`) implements it, and tests record what it is asked.

use super::decision::{Decision, EvictionOutcome};
use crate::model::pod::PodMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What executing a decision yields: each pod tried, with its outcome.
pub type Outcomes = Vec<(String, EvictionOutcome)>;

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

    /// The agent is stopping: undo whatever is still pending (resume stopped processes),
    /// since nobody will resolve it.
    fn shutdown(&self) {}

    /// The executor's own part of /state (JSON null when it has none).
    fn status(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}
