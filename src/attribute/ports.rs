//! The attribution ports: what the agent's core calls to learn who owns each GPU process
//! and which pods are on the node. The shells here (`attributor`, `watch`) implement them;
//! tests inject fixed answers.

use crate::model::pod::{PodMap, PodViewStatus};
use crate::model::snapshot::Snapshot;
use std::sync::Arc;

/// Fills in each process's owner. The real one reads `/proc` and the pod watch; tests
/// inject fixed answers.
pub trait Attributor: Send {
    /// Sets `owner` on every process of `snap`.
    fn attribute(&mut self, snap: &mut Snapshot);
}

/// Where attribution and the guard get the current pods from.
pub trait PodSource: Send + Sync {
    /// The pods on this node now.
    fn pods(&self) -> Arc<PodMap>;
    /// Whether the view is synced and current.
    fn status(&self) -> PodViewStatus;
    /// Something read fresh from the API server disagrees with the view (`reason` says
    /// what): drop it and relist. A fixed view ignores this.
    fn distrust(&self, _reason: &str) {}
    /// Whether some GPU is under memory pressure now: a view that is down comes back
    /// sooner while it is. A fixed view ignores this.
    fn set_urgent(&self, _urgent: bool) {}
}
