//! The `replicas` part of `/state` (docs/attribution.md): which pod holds which replica, and,
//! per GPU, the figures of the metrics with the pods behind them — the idle holds and the
//! processes bypassing the device plugin. Pure: the snapshot and the latest
//! [`ReplicaView`] in, a serializable view out.

use crate::model::replicas::{HeldDevice, ReplicaView};
use crate::model::snapshot::Snapshot;
use serde::Serialize;

/// `/state`'s `replicas`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaState<'a> {
    /// Why the allocatable figures are absent (`GetAllocatableResources` not served or
    /// failing); null when they are known.
    allocatable_unknown: Option<&'a str>,
    /// Every pod holding an NVIDIA GPU device, with its devices and the GPU each names.
    pods: Vec<PodHolds<'a>>,
    gpus: Vec<GpuState<'a>>,
    /// Allocatable device IDs that name no GPU NVML sees.
    unmapped_allocatable: &'a [String],
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PodHolds<'a> {
    namespace: &'a str,
    name: &'a str,
    #[serde(rename = "declaredMiB")]
    declared_mib: u64,
    devices: &'a [HeldDevice],
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GpuState<'a> {
    index: u32,
    uuid: &'a str,
    replicas_allocated: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas_allocatable: Option<u32>,
    #[serde(rename = "declaredMiB")]
    declared_mib: u64,
    #[serde(rename = "committedMiB")]
    committed_mib: u64,
    /// Pods holding replicas of this GPU with no process on it.
    idle_holds: Vec<IdleHold<'a>>,
    /// Processes on this GPU whose pod holds none of it.
    bypassing: Vec<Bypassing<'a>>,
}

#[derive(Debug, Serialize)]
struct IdleHold<'a> {
    namespace: &'a str,
    name: &'a str,
    replicas: u32,
}

#[derive(Debug, Serialize)]
struct Bypassing<'a> {
    pid: u32,
    namespace: &'a str,
    pod: &'a str,
    container: &'a str,
}

impl<'a> ReplicaState<'a> {
    /// The view joined with `snap`.
    pub fn new(view: &'a ReplicaView, snap: &'a Snapshot) -> Self {
        let a = &view.allocations;
        let pods = a
            .pod_devices
            .iter()
            .map(|(p, devices)| PodHolds {
                namespace: &p.0,
                name: &p.1,
                declared_mib: a.declared_mib_by_pod.get(p).copied().unwrap_or(0),
                devices,
            })
            .collect();
        let gpus = view
            .usage(snap)
            .into_iter()
            .map(|(g, u)| GpuState {
                index: g.id.index,
                uuid: &g.id.uuid,
                replicas_allocated: view.gpu(&g.id.uuid).0,
                replicas_allocatable: view.allocatable(&g.id.uuid),
                declared_mib: u.declared_mib,
                committed_mib: u.committed_mib,
                idle_holds: u
                    .idle_holds
                    .iter()
                    .map(|(p, n)| IdleHold {
                        namespace: &p.0,
                        name: &p.1,
                        replicas: *n,
                    })
                    .collect(),
                bypassing: u
                    .bypassing
                    .iter()
                    .map(|(p, r)| Bypassing {
                        pid: p.pid,
                        namespace: &r.namespace,
                        pod: &r.pod,
                        container: &r.container,
                    })
                    .collect(),
            })
            .collect();
        ReplicaState {
            allocatable_unknown: a.allocatable_unknown.as_deref(),
            pods,
            gpus,
            unmapped_allocatable: &a.unmapped_allocatable,
        }
    }
}
