//! What the agent knows of a pod on its node: the plain-data view that attribution,
//! the guard and the events need, taken from the pod watch. No I/O here.

use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

/// One container of a pod and its current runtime container ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerInfo {
    /// Container name from the pod spec.
    pub name: String,
    /// Runtime container ID without its `containerd://`, `cri-o://` or `docker://` scheme;
    /// `None` until the container has started.
    pub container_id: Option<String>,
    /// `image` from the pod spec, as written (the reference the CUDA check reads).
    pub image: Option<String>,
    /// The container asks for an NVIDIA device resource (`nvidia.com/gpu`, `…/gpu.shared`,
    /// `…/mig-<profile>`) in its requests or limits.
    pub gpu: bool,
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

/// How much the pod view can be trusted right now (the watch shell, `attribute::watch`,
/// fills it in; the guard decides only on a [`trustworthy`](PodViewStatus::trustworthy) view).
///
/// The view is *proven* when the API server showed it current: a LIST answered (proven as
/// of when the LIST was sent, at the LIST's resourceVersion), or a watch from the view's
/// resourceVersion delivered an event or a bookmark or ended at its timeout. A proof lasts a
/// bounded time (docs/guard.md, "When the API server does not answer"). A failure of the
/// server (an error answer, a dropped connection, a request timeout, a silent stall) or a
/// fresh read that disagrees drops the proof at once; a watch answered `410 Expired` does
/// not: the server is working and says only that it cannot resume from that
/// resourceVersion, so the view stays as proven as its last proof while it is relisted.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PodViewStatus {
    /// The initial list has completed at least once.
    pub synced: bool,
    /// The view is proven now (see above): synced, and its last proof is recent enough.
    pub healthy: bool,
    /// The latest failure since a watch last worked. May be set on a healthy view (a watch
    /// answered 410 while LISTs prove the view).
    pub last_error: Option<String>,
    /// How long before this status was taken the server last proved the view current;
    /// `None` before the first proof and after a failure or a distrust dropped it.
    #[serde(serialize_with = "ser_opt_secs")]
    pub proven_ago: Option<Duration>,
    /// How long before this status was taken the last proof *arrived* (a LIST's answer, a
    /// watch event or bookmark, a watch's clean end). `proven_ago` dates a LIST's proof
    /// from when it was sent — the view is at least that fresh — but a LIST held by a frozen
    /// server is sent long before it is answered; the time the guard counts as the server
    /// answering runs between arrivals, not between the moments they prove.
    #[serde(serialize_with = "ser_opt_secs")]
    pub heard_ago: Option<Duration>,
    /// The resourceVersion the view is current at (its last LIST's, or the last event's or
    /// bookmark's since).
    pub resource_version: Option<String>,
    /// The API server's measured latency: the slowest of its last few answers to the view's
    /// LISTs and watch requests (timeouts count as their length).
    #[serde(serialize_with = "ser_opt_secs")]
    pub api_latency: Option<Duration>,
}

impl PodViewStatus {
    /// The status of a view that is current by construction (a fixed set of pods).
    pub fn fixed() -> Self {
        PodViewStatus {
            synced: true,
            healthy: true,
            proven_ago: Some(Duration::ZERO),
            heard_ago: Some(Duration::ZERO),
            ..PodViewStatus::default()
        }
    }

    /// Whether decisions that depend on pods (evictions) may be taken on this view.
    pub fn trustworthy(&self) -> bool {
        self.synced && self.healthy
    }
}

fn ser_opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
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
