//! Pure reduction of the kubelet's pod-resources answers to per-GPU replica figures.
//!
//! NVIDIA's device plugin names a whole GPU `GPU-<uuid>` and, under time-slicing, each of
//! its replicas `GPU-<uuid>::<n>`. `GetAllocatableResources` lists every ID the kubelet can
//! hand out; `List` lists the IDs each pod's containers hold. Unlike dcgm-exporter, which keeps
//! one pod per UUID, every pod sharing a GPU is kept here. Pods in a terminal phase are
//! dropped: the kubelet's `List` still reports their devices although they are free again
//! (kubernetes #119423). Devices that are not NVIDIA GPU IDs (other resources, MIG devices,
//! the plugin's `index` ID strategy) are ignored.

use super::generated::{AllocatableResourcesResponse, ContainerDevices, ListPodResourcesResponse};
use crate::model::pod::{PodInfo, PodMap};
use crate::model::replicas::{parse_device_id, Allocations, GpuDevice, PodKey, ReplicaView};
use std::collections::{BTreeSet, HashMap};

fn gpu_ids(devices: &[ContainerDevices]) -> impl Iterator<Item = (&str, GpuDevice<'_>)> {
    devices
        .iter()
        .flat_map(|d| d.device_ids.iter())
        .filter_map(|id| parse_device_id(id).map(|g| (id.as_str(), g)))
}

/// Reduces the two answers. `is_terminal(namespace, name)` says whether the pod view has the
/// pod in phase `Succeeded` or `Failed`; a pod the view does not know is kept (the watch may
/// lag the kubelet, and the kubelet is the authority on what it handed out).
pub fn allocations(
    list: &ListPodResourcesResponse,
    allocatable: &AllocatableResourcesResponse,
    is_terminal: impl Fn(&str, &str) -> bool,
) -> Allocations {
    let mut out = Allocations::default();
    let mut allocatable_ids: BTreeSet<&str> = BTreeSet::new();
    for (id, dev) in gpu_ids(&allocatable.devices) {
        if allocatable_ids.insert(id) {
            out.gpus
                .entry(dev.uuid.to_string())
                .or_default()
                .allocatable += 1;
        }
    }
    // An ID is counted once however many containers list it: the kubelet hands an init
    // container's devices on to the app containers of the same pod.
    let mut held: BTreeSet<&str> = BTreeSet::new();
    for pod in &list.pod_resources {
        if is_terminal(&pod.namespace, &pod.name) {
            continue;
        }
        let key: PodKey = (pod.namespace.clone(), pod.name.clone());
        for container in &pod.containers {
            for (id, dev) in gpu_ids(&container.devices) {
                let gpu = out.gpus.entry(dev.uuid.to_string()).or_default();
                if held.insert(id) {
                    gpu.allocated += 1;
                }
                gpu.pods.insert(key.clone());
                out.pod_gpus
                    .entry(key.clone())
                    .or_default()
                    .insert(dev.uuid.to_string());
            }
        }
    }
    out
}

/// The [`ReplicaView`] of one poll: joins the kubelet's answers with the pod view `pods`: pods the view has in a terminal
/// phase are dropped, and each remaining pod's declared VRAM is read from its annotation
/// `request_key` (`<prefix>/vram-request-mib`; unset or unparsable counts as 0).
pub fn replica_view(
    list: &ListPodResourcesResponse,
    allocatable: &AllocatableResourcesResponse,
    pods: &PodMap,
    request_key: &str,
) -> ReplicaView {
    // The kubelet names pods by namespace/name, the view keys them by UID.
    let by_name: HashMap<(&str, &str), &PodInfo> = pods
        .values()
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), p))
        .collect();
    let allocations = allocations(list, allocatable, |ns, name| {
        by_name.get(&(ns, name)).is_some_and(|p| p.is_terminal())
    });
    let declared_mib = allocations
        .gpus
        .keys()
        .map(|uuid| {
            let mib = allocations.declared_mib(uuid, |(ns, name)| {
                by_name
                    .get(&(ns.as_str(), name.as_str()))
                    .and_then(|p| p.vram_request_mib(request_key))
            });
            (uuid.clone(), mib)
        })
        .collect();
    ReplicaView {
        allocations,
        declared_mib,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::podresources::generated::{ContainerResources, PodResources};

    const G0: &str = "GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b";
    const G1: &str = "GPU-66666666-7777-8888-9999-000000000000";

    fn devices(ids: &[String]) -> ContainerDevices {
        ContainerDevices {
            resource_name: "nvidia.com/gpu".into(),
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
                    devices: vec![devices(ids)],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn r(gpu: &str, n: u32) -> String {
        format!("{gpu}::{n}")
    }

    fn key(ns: &str, name: &str) -> PodKey {
        (ns.into(), name.into())
    }

    #[test]
    fn device_ids() {
        assert_eq!(
            parse_device_id(&r(G0, 3)),
            Some(GpuDevice {
                uuid: G0,
                replica: Some(3)
            })
        );
        assert_eq!(
            parse_device_id(G0),
            Some(GpuDevice {
                uuid: G0,
                replica: None
            })
        );
        for bad in [
            "0",
            "0::1",
            "MIG-3f5e2a8b-1c4d",
            "GPU-",
            "GPU-xyz",
            "GPU-3f5e::x",
            "/dev/fuse",
        ] {
            assert_eq!(parse_device_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn time_sliced_replicas_on_two_gpus() {
        let allocatable = AllocatableResourcesResponse {
            devices: vec![
                devices(&(0..4).map(|n| r(G0, n)).collect::<Vec<_>>()),
                devices(&(0..4).map(|n| r(G1, n)).collect::<Vec<_>>()),
                ContainerDevices {
                    resource_name: "example.com/fpga".into(),
                    device_ids: vec!["fpga0".into()],
                    topology: None,
                },
            ],
            ..Default::default()
        };
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod("ci", "job-1", &[&[r(G0, 0)]]),
                // Init container's replica handed on to the app container: counted once.
                pod("ci", "job-2", &[&[r(G0, 1)], &[r(G0, 1)]]),
                pod("ml", "train-0", &[&[r(G1, 2), r(G1, 3)]]),
                pod("ci", "done", &[&[r(G0, 2)]]),
                pod("ci", "no-gpu", &[]),
            ],
        };
        let a = allocations(&list, &allocatable, |ns, n| (ns, n) == ("ci", "done"));
        let g0 = &a.gpus[G0];
        assert_eq!((g0.allocatable, g0.allocated), (4, 2));
        assert_eq!(
            g0.pods.iter().collect::<Vec<_>>(),
            vec![&key("ci", "job-1"), &key("ci", "job-2")]
        );
        let g1 = &a.gpus[G1];
        assert_eq!((g1.allocatable, g1.allocated), (4, 2));
        assert!(
            !a.pod_gpus.contains_key(&key("ci", "done")),
            "terminal pods are dropped"
        );
        assert!(a.holds(&key("ml", "train-0"), G1));
        assert!(!a.holds(&key("ml", "train-0"), G0));

        let req = |p: &PodKey| match p.1.as_str() {
            "job-1" => Some(4096),
            "train-0" => Some(20000),
            _ => None,
        };
        assert_eq!(a.declared_mib(G0, req), 4096);
        assert_eq!(a.declared_mib(G1, req), 20000);
        assert_eq!(a.declared_mib("GPU-unknown", req), 0);

        // Both have 2 allocated: the lower NVML index wins the tie.
        let index = |u: &str| match u {
            G0 => Some(0),
            G1 => Some(1),
            _ => None,
        };
        assert_eq!(a.next_gpu(index), Some(G0));
        let index_swapped = |u: &str| index(u).map(|i| 1 - i);
        assert_eq!(a.next_gpu(index_swapped), Some(G1));

        let (j1, t0, stray) = (
            key("ci", "job-1"),
            key("ml", "train-0"),
            key("ci", "no-gpu"),
        );
        let procs = [(&j1, G0), (&t0, G0), (&t0, G1), (&stray, G1), (&stray, G1)];
        let without = a.processes_without_replica(procs);
        assert_eq!(without.get(G0), Some(&1));
        assert_eq!(without.get(G1), Some(&2));
    }

    #[test]
    fn full_gpus_are_never_next_and_whole_gpus_count_as_one_replica() {
        let allocatable = AllocatableResourcesResponse {
            devices: vec![devices(&[G0.to_string(), G1.to_string()])],
            ..Default::default()
        };
        let list = ListPodResourcesResponse {
            pod_resources: vec![pod("ml", "a", &[&[G0.to_string()]])],
        };
        let a = allocations(&list, &allocatable, |_, _| false);
        assert_eq!((a.gpus[G0].allocatable, a.gpus[G0].allocated), (1, 1));
        assert_eq!(a.next_gpu(|_| None), Some(G1));
        let list = ListPodResourcesResponse {
            pod_resources: vec![pod("ml", "a", &[&[G0.to_string(), G1.to_string()]])],
        };
        assert_eq!(
            allocations(&list, &allocatable, |_, _| false).next_gpu(|_| None),
            None
        );
    }

    #[test]
    fn the_view_drops_terminal_pods_and_sums_declared_vram() {
        use crate::model::pod::PodInfo;
        let info = |ns: &str, name: &str, phase: &str, request: Option<&str>| PodInfo {
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
        };
        let pods: PodMap = [
            info("ci", "a", "Running", Some("4096")),
            info("ci", "b", "Running", Some("4Gi")),
            info("ci", "done", "Succeeded", Some("8000")),
            info("ci", "failed", "Failed", Some("8000")),
        ]
        .into_iter()
        .map(|p| (p.uid.clone(), p))
        .collect();
        let allocatable = AllocatableResourcesResponse {
            devices: vec![devices(&(0..4).map(|n| r(G0, n)).collect::<Vec<_>>())],
            ..Default::default()
        };
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod("ci", "a", &[&[r(G0, 0)]]),
                pod("ci", "b", &[&[r(G0, 1)]]),
                pod("ci", "done", &[&[r(G0, 2)]]),
                pod("ci", "failed", &[&[r(G0, 3)]]),
                // Not in the view yet (the watch lags): kept, declares nothing.
                pod("ci", "new", &[&[r(G1, 0)]]),
            ],
        };
        let v = replica_view(&list, &allocatable, &pods, "gpu-warden.io/vram-request-mib");
        assert_eq!(v.gpu(G0), (2, 4, 4096), "the unparsable 4Gi counts as 0");
        assert_eq!(v.gpu(G1), (1, 0, 0));
        assert_eq!(v.gpu("GPU-00000000"), (0, 0, 0));
        assert!(v.allocations.holds(&key("ci", "new"), G1));
        assert!(!v.allocations.pod_gpus.contains_key(&key("ci", "failed")));
    }

    #[test]
    fn a_gpu_only_list_names_is_kept() {
        let list = ListPodResourcesResponse {
            pod_resources: vec![pod("ml", "a", &[&[r(G1, 0)]])],
        };
        let a = allocations(&list, &AllocatableResourcesResponse::default(), |_, _| {
            false
        });
        assert_eq!((a.gpus[G1].allocatable, a.gpus[G1].allocated), (0, 1));
        assert_eq!(a.next_gpu(|_| None), None);
    }
}
