//! What the agent knows of a pod on its node: the plain-data view that attribution,
//! the guard and the events need, taken from the pod watch. No I/O here.

use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

/// One container of a pod and its current runtime container ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerInfo {
    /// Container name from the pod spec.
    pub name: String,
    /// Runtime container ID without its `containerd://`, `cri-o://` or `docker://` scheme;
    /// `None` until the container has started.
    pub container_id: Option<String>,
}

/// A pod scheduled on this node, reduced to what gpu-warden uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodInfo {
    /// `metadata.uid`, with dashes (`0b1c…-…`).
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `spec.priority` (0 when unset, as the admission controller would default it).
    pub priority: i32,
    /// `spec.priorityClassName`, if any.
    pub priority_class: Option<String>,
    /// Kind of the controlling owner reference (`DaemonSet`, `Job`, `ReplicaSet`, …).
    pub owner_kind: Option<String>,
    /// A static pod's mirror on the API server (annotation `kubernetes.io/config.mirror`).
    pub is_mirror: bool,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `metadata.creationTimestamp`.
    #[serde(skip)]
    pub created_at: Option<SystemTime>,
    /// `metadata.deletionTimestamp` is set: the pod is already going away.
    pub terminating: bool,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`), when set.
    pub phase: Option<String>,
    /// Regular, init and ephemeral containers with their current IDs.
    pub containers: Vec<ContainerInfo>,
}

/// Annotation the kubelet sets on the API-server mirror of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

impl PodInfo {
    /// A static pod (its API object is the kubelet's mirror, or the Node owns it): the
    /// Eviction API cannot remove it and the kubelet would restart it.
    pub fn is_static(&self) -> bool {
        self.is_mirror
            || self.annotations.contains_key(MIRROR_ANNOTATION)
            || self.owner_kind.as_deref() == Some("Node")
    }

    /// Whether the pod is in a terminal phase (`Succeeded` or `Failed`): its containers have
    /// ended for good, so the devices the kubelet still lists for it are free again
    /// (kubernetes #119423).
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// The pod's declared VRAM from the annotation `key` (`<prefix>/vram-request-mib`), in
    /// MiB; None when unset or not a whole number ([`super::vram_request::parse_mib`]).
    pub fn vram_request_mib(&self, key: &str) -> Option<u64> {
        super::vram_request::parse_mib(self.annotations.get(key)?)
    }

    /// The container whose runtime ID is `container_id`.
    pub fn container_by_id(&self, container_id: &str) -> Option<&ContainerInfo> {
        self.containers
            .iter()
            .find(|c| c.container_id.as_deref() == Some(container_id))
    }
}

/// Pods on this node by UID.
pub type PodMap = HashMap<String, PodInfo>;

/// How much the pod view can be trusted right now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodViewStatus {
    /// The initial list has completed at least once.
    pub synced: bool,
    /// The watch is connected and current (no error since the last successful event).
    pub healthy: bool,
    /// The last watch error, if the watch is not healthy.
    pub last_error: Option<String>,
}

impl PodViewStatus {
    /// Whether decisions that depend on pods (evictions) may be taken on this view.
    pub fn trustworthy(&self) -> bool {
        self.synced && self.healthy
    }
}

/// Strips the runtime scheme from a `status.containerStatuses[].containerID`.
pub fn strip_runtime_scheme(id: &str) -> &str {
    match id.split_once("://") {
        Some((_, rest)) => rest,
        None => id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_known_schemes() {
        assert_eq!(strip_runtime_scheme("containerd://abc"), "abc");
        assert_eq!(strip_runtime_scheme("cri-o://abc"), "abc");
        assert_eq!(strip_runtime_scheme("docker://abc"), "abc");
        assert_eq!(strip_runtime_scheme("abc"), "abc");
    }
}
