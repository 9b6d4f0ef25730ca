//! What one poll publishes to every reader: the snapshot, the exposition bytes rendered
//! from it, and the guard's view for `/state` (the [`StatePart`] port, so this room names
//! no guard type).

use crate::model::pressure::Pressure;
use crate::model::replicas::ReplicaView;
use crate::model::snapshot::Snapshot;
use crate::publish::annotations::FiguresState;
use crate::publish::replica_state::ReplicaState;
use bytes::Bytes;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// One publication, immutable once built; readers hold an `Arc` of it.
#[derive(Debug, Clone)]
pub struct Published {
    pub snapshot: Arc<Snapshot>,
    /// The Prometheus text exposition, rendered once for all scrapes of this poll.
    pub metrics: Bytes,
    /// Monotonic time at which it was published (for `/healthz`).
    pub published_at: Duration,
    /// The guard's per-GPU state and recent decisions, or `None` when it is off; made
    /// JSON only when `/state` is read.
    pub guard: Option<Arc<dyn StatePart>>,
    /// Memory pressure per GPU index as the guard classified it (empty when it is off);
    /// the annotations publish it.
    pub pressure: BTreeMap<u32, Pressure>,
    /// The latest kubelet pod-resources data when the feature is on and has data (None
    /// otherwise); the annotations publish it.
    pub replicas: Option<Arc<ReplicaView>>,
    /// Which object carries the free-VRAM figures and the Node's cadence (`None` when the
    /// agent publishes none: standalone or `--annotations off`).
    pub figures: Option<FiguresState>,
}

/// A part of `/state` another room keeps (the guard's view), written out only when `/state`
/// is read rather than per poll.
pub trait StatePart: std::fmt::Debug + Send + Sync {
    /// The part as `/state` shows it.
    fn to_json(&self) -> serde_json::Value;
}

#[derive(Serialize)]
struct StateView<'a> {
    snapshot: &'a Snapshot,
    guard: serde_json::Value,
    /// True when no poll has finished for too long: the snapshot is the last good one.
    stale: bool,
    /// Why it is stale (null while it is current).
    #[serde(rename = "staleReason")]
    stale_reason: Option<&'a str>,
    /// The kubelet's pod-resources view (absent without the data).
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<ReplicaState<'a>>,
    /// Where the free-VRAM figures are published (null when they are not).
    figures: Option<FiguresState>,
}

impl Published {
    /// The `/state` document of a current publication.
    pub fn state_json(&self) -> Vec<u8> {
        self.state_json_marked(None)
    }

    /// The `/state` document, marked stale with `stale_reason` when given (the sampler is
    /// stuck and this is the last good snapshot).
    pub fn state_json_marked(&self, stale_reason: Option<&str>) -> Vec<u8> {
        let view = StateView {
            snapshot: &self.snapshot,
            guard: self
                .guard
                .as_ref()
                .map_or(serde_json::Value::Null, |g| g.to_json()),
            stale: stale_reason.is_some(),
            stale_reason,
            replicas: self
                .replicas
                .as_deref()
                .map(|v| ReplicaState::new(v, &self.snapshot)),
            figures: self.figures,
        };
        // Serialising plain data into a Vec cannot fail; an empty object is a safe answer
        // should a future field ever refuse.
        serde_json::to_vec_pretty(&view).unwrap_or_else(|_| b"{}".to_vec())
    }
}
