//! Pure reduction of the kubelet's pod-resources answers to a [`KubeletAnswer`]: the NVIDIA
//! GPU devices each pod holds and the node's allocatable ones, in every ID form NVIDIA's
//! device plugin writes (`model::replicas::parse_device_id`: `GPU-<uuid>`, `MIG-<uuid>`,
//! with or without `::<n>`, under any resource name, renamed ones included). Matching the
//! IDs with the GPUs NVML sees happens later, against each snapshot
//! ([`KubeletAnswer::resolve`]). Unlike dcgm-exporter, which keeps one pod per UUID, every pod
//! sharing a GPU is kept. Pods in a terminal phase are dropped: the kubelet's `List` still
//! reports their devices although they are free again (kubernetes #119423). Devices of other
//! resources (NICs, FPGAs) are not kept at all.

use super::generated::{AllocatableResourcesResponse, ContainerDevices, ListPodResourcesResponse};
use crate::model::pod::{PodInfo, PodMap};
use crate::model::replicas::{
    parse_device_id, AllocatableError, KubeletAnswer, KubeletDevice, ListedPod,
};
use std::collections::{BTreeSet, HashMap};

fn gpu_devices<'a>(
    devices: impl Iterator<Item = &'a ContainerDevices> + 'a,
) -> impl Iterator<Item = KubeletDevice> + 'a {
    devices.flat_map(|d| {
        d.device_ids
            .iter()
            .filter(|id| parse_device_id(&d.resource_name, id).is_some())
            .map(|id| KubeletDevice {
                resource: d.resource_name.clone(),
                id: id.clone(),
            })
    })
}

/// Reduces the two answers. `allocatable` is `GetAllocatableResources`' answer, or why there
/// is none. `is_terminal(namespace, name)` says whether the pod view has the pod in phase
/// `Succeeded` or `Failed`; a pod the view does not know is kept (the watch may lag the
/// kubelet, and the kubelet is the authority on what it handed out). `declared(namespace,
/// name)` is a pod's declared VRAM in MiB.
pub fn reduce(
    list: &ListPodResourcesResponse,
    allocatable: Result<&AllocatableResourcesResponse, &AllocatableError>,
    is_terminal: impl Fn(&str, &str) -> bool,
    declared: impl Fn(&str, &str) -> Option<u64>,
) -> KubeletAnswer {
    let pods = list
        .pod_resources
        .iter()
        .filter(|p| !is_terminal(&p.namespace, &p.name))
        .map(|p| {
            let held: BTreeSet<KubeletDevice> =
                gpu_devices(p.containers.iter().flat_map(|c| c.devices.iter())).collect();
            ListedPod {
                key: (p.namespace.clone(), p.name.clone()),
                devices: held.into_iter().collect(),
                declared_mib: declared(&p.namespace, &p.name).unwrap_or(0),
            }
        })
        .collect();
    KubeletAnswer {
        pods,
        allocatable: allocatable
            .map(|a| gpu_devices(a.devices.iter()).collect())
            .map_err(Clone::clone),
    }
}

/// The [`KubeletAnswer`] of one poll, joined with the pod view `pods`: pods the view has in a
/// terminal phase are dropped, and each remaining pod's declared VRAM is read from its
/// annotation `request_key` (`<prefix>/vram-request-mib`; unset or unparsable counts as 0).
pub fn answer(
    list: &ListPodResourcesResponse,
    allocatable: Result<&AllocatableResourcesResponse, &AllocatableError>,
    pods: &PodMap,
    request_key: &str,
) -> KubeletAnswer {
    // The kubelet names pods by namespace/name, the view keys them by UID.
    let by_name: HashMap<(&str, &str), &PodInfo> = pods
        .values()
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), p))
        .collect();
    reduce(
        list,
        allocatable,
        |ns, name| by_name.get(&(ns, name)).is_some_and(|p| p.is_terminal()),
        |ns, name| {
            by_name
                .get(&(ns, name))
                .and_then(|p| p.vram_request_mib(request_key))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::podresources::generated::{ContainerResources, PodResources};
    use crate::model::pod::PodInfo;
    use crate::model::replicas::PodResourcesError;

    const G0: &str = "GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b";
    const G1: &str = "GPU-66666666-7777-8888-9999-000000000000";

    fn devices(resource: &str, ids: &[String]) -> ContainerDevices {
        ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.to_vec(),
            topology: None,
        }
    }

    fn pod(ns: &str, name: &str, containers: &[&[String]]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .iter()
                .enumerate()
                .map(|(i, ids)| ContainerResources {
                    name: format!("c{i}"),
                    devices: vec![devices("nvidia.com/gpu", ids)],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn r(gpu: &str, n: u32) -> String {
        format!("{gpu}::{n}")
    }

    fn info(ns: &str, name: &str, phase: &str, request: Option<&str>) -> PodInfo {
        PodInfo {
            uid: format!("uid-{name}"),
            namespace: ns.into(),
            name: name.into(),
            priority: 0,
            priority_class: None,
            owner_kind: None,
            is_mirror: false,
            labels: Default::default(),
            annotations: request
                .map(|r| [("gpu-warden.io/vram-request-mib".to_string(), r.to_string())].into())
                .unwrap_or_default(),
            created_at: None,
            terminating: false,
            phase: Some(phase.into()),
            containers: vec![],
        }
    }

    #[test]
    fn terminal_pods_dropped_init_containers_once_other_resources_ignored() {
        let allocatable = AllocatableResourcesResponse {
            devices: vec![
                devices(
                    "nvidia.com/gpu",
                    &(0..4).map(|n| r(G0, n)).collect::<Vec<_>>(),
                ),
                devices("example.com/fpga", &["0".to_string()]),
            ],
            ..Default::default()
        };
        let mut list = ListPodResourcesResponse {
            pod_resources: vec![
                pod("ci", "a", &[&[r(G0, 0)]]),
                // Init container's replica handed on to the app container: held once.
                pod("ci", "b", &[&[r(G0, 1)], &[r(G0, 1)]]),
                pod("ci", "done", &[&[r(G0, 2)]]),
                pod("ci", "failed", &[&[r(G0, 3)]]),
                // Not in the view yet (the watch lags): kept, declares nothing.
                pod("ci", "new", &[&[r(G1, 0)]]),
                pod("ci", "no-gpu", &[]),
            ],
        };
        list.pod_resources[0].containers[0]
            .devices
            .push(devices("example.com/fpga", &["0".to_string()]));
        let pods: PodMap = [
            info("ci", "a", "Running", Some("4096")),
            info("ci", "b", "Running", Some("4Gi")),
            info("ci", "done", "Succeeded", Some("8000")),
            info("ci", "failed", "Failed", Some("8000")),
        ]
        .into_iter()
        .map(|p| (p.uid.clone(), p))
        .collect();
        let a = answer(
            &list,
            Ok(&allocatable),
            &pods,
            "gpu-warden.io/vram-request-mib",
        );
        let names: Vec<&str> = a.pods.iter().map(|p| p.key.1.as_str()).collect();
        assert_eq!(names, vec!["a", "b", "new", "no-gpu"]);
        assert_eq!(
            a.pods[0].devices.len(),
            1,
            "the FPGA is not a GPU: {:?}",
            a.pods[0]
        );
        assert_eq!(a.pods[1].devices.len(), 1);
        assert_eq!(a.pods[0].declared_mib, 4096);
        assert_eq!(a.pods[1].declared_mib, 0, "the unparsable 4Gi counts as 0");
        assert_eq!(a.allocatable.as_ref().map(Vec::len), Ok(4));
        let v = a.resolve(&[]);
        assert_eq!(v.gpu(G0), (2, 4, 4096));
        assert_eq!(v.gpu(G1), (1, 0, 0));
        assert!(v
            .allocations
            .listed
            .contains(&("ci".into(), "no-gpu".into())));
        assert!(!v.allocations.listed.contains(&("ci".into(), "done".into())));
        let unserved = AllocatableError::Unavailable("Unimplemented".into());
        let without = answer(&list, Err(&unserved), &pods, "k");
        assert_eq!(without.allocatable, Err(unserved));
        let unknown = |a: &KubeletAnswer| a.resolve(&[]).allocations.allocatable_unknown;
        assert_eq!(unknown(&without).as_deref(), Some("Unimplemented"));
        let failed = AllocatableError::Failed(PodResourcesError::Call {
            call: "GetAllocatableResources",
            message: "deadline exceeded".into(),
        });
        assert_eq!(
            unknown(&answer(&list, Err(&failed), &pods, "k")).as_deref(),
            Some("pod-resources GetAllocatableResources: deadline exceeded")
        );
        assert_eq!(without.pods.len(), 4, "List stands on its own");
    }
}
