//! The pod view: Kubernetes `Pod` objects reduced to [`PodInfo`], indexed by UID. The
//! conversion is pure; the watch that feeds it lives in `attribute::watch`.

use super::ports::PodSource;
use crate::kubeapi;
use crate::model::pod::{
    strip_runtime_scheme, ContainerInfo, PodInfo, PodMap, PodViewStatus, MIRROR_ANNOTATION,
};
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// A fixed set of pods (tests, and standalone runs with no cluster).
#[derive(Debug, Clone, Default)]
pub struct StaticPods(pub Arc<PodMap>);

impl PodSource for StaticPods {
    fn pods(&self) -> Arc<PodMap> {
        self.0.clone()
    }
    fn status(&self) -> PodViewStatus {
        PodViewStatus::fixed()
    }
}

/// Reduces a Pod to what gpu-warden uses. `None` for an object without a UID, name or
/// namespace (never served by a real API server, but a double or a bug could).
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let meta = &pod.metadata;
    let uid = meta.uid.clone()?;
    let name = meta.name.clone()?;
    let namespace = meta.namespace.clone()?;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let owner_kind = meta
        .owner_references
        .as_ref()
        .and_then(|refs| {
            refs.iter()
                .find(|r| r.controller == Some(true))
                .or_else(|| refs.first())
        })
        .map(|r| r.kind.clone());
    let annotations: std::collections::BTreeMap<String, String> =
        meta.annotations.clone().unwrap_or_default();
    let mut containers = Vec::new();
    if let Some(spec) = spec {
        let ids = |statuses: Option<&Vec<k8s_openapi::api::core::v1::ContainerStatus>>,
                   name: &str| {
            statuses
                .and_then(|v| v.iter().find(|s| s.name == name))
                .and_then(|s| s.container_id.as_deref())
                .filter(|id| !id.is_empty())
                .map(|id| strip_runtime_scheme(id).to_string())
        };
        for c in &spec.containers {
            containers.push(ContainerInfo {
                name: c.name.clone(),
                container_id: ids(status.and_then(|s| s.container_statuses.as_ref()), &c.name),
                image: c.image.clone(),
                gpu: asks_nvidia(c.resources.as_ref()),
            });
        }
        for c in spec.init_containers.iter().flatten() {
            containers.push(ContainerInfo {
                name: c.name.clone(),
                container_id: ids(
                    status.and_then(|s| s.init_container_statuses.as_ref()),
                    &c.name,
                ),
                image: c.image.clone(),
                gpu: asks_nvidia(c.resources.as_ref()),
            });
        }
        for c in spec.ephemeral_containers.iter().flatten() {
            containers.push(ContainerInfo {
                name: c.name.clone(),
                container_id: ids(
                    status.and_then(|s| s.ephemeral_container_statuses.as_ref()),
                    &c.name,
                ),
                image: c.image.clone(),
                // Ephemeral containers cannot ask for resources.
                gpu: false,
            });
        }
    }
    let created_at = meta.creation_timestamp.as_ref().and_then(|t| {
        let secs = t.0.as_second();
        u64::try_from(secs)
            .ok()
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
    });
    Some(PodInfo {
        uid,
        namespace,
        name,
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        priority_class: spec.and_then(|s| s.priority_class_name.clone()),
        is_mirror: annotations.contains_key(MIRROR_ANNOTATION)
            || owner_kind.as_deref() == Some("Node"),
        owner_kind,
        labels: meta.labels.clone().unwrap_or_default(),
        annotations,
        created_at,
        terminating: meta.deletion_timestamp.is_some(),
        phase: status.and_then(|s| s.phase.clone()),
        containers,
    })
}

/// Whether a container's requests or limits name an NVIDIA device resource (the device
/// plugin's `nvidia.com/gpu`, its time-slicing and MIG names).
fn asks_nvidia(r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>) -> bool {
    let Some(r) = r else { return false };
    [r.requests.as_ref(), r.limits.as_ref()]
        .into_iter()
        .flatten()
        .any(|m| m.keys().any(|k| k.starts_with("nvidia.com/")))
}

/// Builds the map from a list of pods; later entries with the same UID win.
pub fn index<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> PodMap {
    pods.into_iter()
        .filter_map(pod_info)
        .map(|p| (p.uid.clone(), p))
        .collect()
}

/// Builds the map from Pod objects as JSON (the simulator's scenario pods, fixtures);
/// objects that do not parse as a Pod are skipped. Decoded by `kubeapi`, and not generic, so
/// `Pod`'s deserializer is not compiled again here or in the callers (docs/architecture.md,
/// "Crates").
pub fn index_json(objects: &[serde_json::Value]) -> PodMap {
    let pods: Vec<Pod> = objects
        .iter()
        .filter_map(|o| kubeapi::decode::pod(o).ok())
        .collect();
    index(pods.iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn ci_pod() -> Pod {
        pod(serde_json::json!({
            "metadata": {
                "name": "runner-abc-project-42-concurrent-0", "namespace": "ci",
                "uid": "0b1c2d3e-0000-4000-8000-000000000001",
                "creationTimestamp": "2026-11-30T10:00:00Z",
                "labels": {"workload-type": "gpu-ci"},
                "annotations": {"job.runner.gitlab.com/id": "123", "gpu-warden.io/vram-request-mib": "4096"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Job", "name": "j", "uid": "x", "controller": true}]
            },
            "spec": {
                "nodeName": "n1", "priority": 100, "priorityClassName": "ci-low",
                "containers": [{"name": "build"}, {"name": "helper"}],
                "initContainers": [{"name": "init-permissions"}]
            },
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "build", "containerID": "containerd://aaaa", "image": "i", "imageID": "", "ready": true, "restartCount": 0},
                    {"name": "helper", "containerID": "", "image": "i", "imageID": "", "ready": false, "restartCount": 0}
                ],
                "initContainerStatuses": [
                    {"name": "init-permissions", "containerID": "cri-o://bbbb", "image": "i", "imageID": "", "ready": false, "restartCount": 0}
                ]
            }
        }))
    }

    #[test]
    fn converts_everything_the_guard_needs() {
        let p = pod_info(&ci_pod()).unwrap();
        assert_eq!(p.namespace, "ci");
        assert_eq!(p.priority, 100);
        assert_eq!(p.priority_class.as_deref(), Some("ci-low"));
        assert_eq!(p.owner_kind.as_deref(), Some("Job"));
        assert!(!p.is_mirror);
        assert!(!p.terminating);
        assert_eq!(p.phase.as_deref(), Some("Running"));
        assert!(!p.is_terminal());
        assert_eq!(
            p.vram_request_mib("gpu-warden.io/vram-request-mib"),
            Some(4096)
        );
        assert_eq!(p.vram_request_mib("other.io/vram-request-mib"), None);
        assert_eq!(p.labels["workload-type"], "gpu-ci");
        assert_eq!(p.annotations["job.runner.gitlab.com/id"], "123");
        assert_eq!(
            p.created_at,
            Some(UNIX_EPOCH + Duration::from_secs(1_796_032_800))
        );
        assert_eq!(p.container_by_id("aaaa").unwrap().name, "build");
        assert_eq!(p.container_by_id("bbbb").unwrap().name, "init-permissions");
        assert_eq!(p.containers[1].container_id, None, "empty IDs are not IDs");
    }

    #[test]
    fn mirror_daemonset_and_defaults() {
        let p = pod_info(&pod(serde_json::json!({
            "metadata": {"name": "kube-proxy-n1", "namespace": "kube-system", "uid": "u1",
                         "annotations": {"kubernetes.io/config.mirror": "abc"},
                         "deletionTimestamp": "2026-11-30T10:00:00Z"},
            "spec": {"containers": [{"name": "c"}]}
        })))
        .unwrap();
        assert!(p.is_mirror);
        assert!(p.terminating);
        assert_eq!(p.priority, 0);
        assert_eq!(p.phase, None);
        for (phase, terminal) in [
            ("Succeeded", true),
            ("Failed", true),
            ("Pending", false),
            ("Unknown", false),
        ] {
            let p = PodInfo {
                phase: Some(phase.into()),
                ..p.clone()
            };
            assert_eq!(p.is_terminal(), terminal, "{phase}");
        }
        let p = pod_info(&pod(serde_json::json!({
            "metadata": {"name": "dcgm", "namespace": "gpu", "uid": "u2",
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "y"}]},
            "spec": {"containers": [{"name": "c"}]}
        })))
        .unwrap();
        assert_eq!(p.owner_kind.as_deref(), Some("DaemonSet"));
    }

    #[test]
    fn objects_without_identity_are_skipped() {
        assert!(pod_info(&pod(serde_json::json!({"metadata": {"name": "x"}}))).is_none());
        let m = index([
            &ci_pod(),
            &pod(serde_json::json!({"metadata": {"name": "x"}})),
        ]);
        assert_eq!(m.len(), 1);
    }
}
