//! What the kubelet's pod-resources API says about the node's GPUs, reduced to plain data:
//! NVIDIA's device IDs (`GPU-<uuid>` and, under time-slicing, `GPU-<uuid>::<n>`), the
//! replicas allocated and allocatable per GPU, the pods holding each, and their declared
//! VRAM. `attribute::podresources` builds it; the metrics and the `vram` annotation read it.

use std::collections::{BTreeMap, BTreeSet};

/// A pod as the kubelet's pod-resources API names it: (namespace, name).
pub type PodKey = (String, String);

/// One device ID of NVIDIA's device plugin, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuDevice<'a> {
    /// `GPU-<uuid>`, as NVML reports it.
    pub uuid: &'a str,
    /// The time-slicing replica number, when the ID has a `::<n>` suffix.
    pub replica: Option<u32>,
}

/// Splits `GPU-<uuid>` / `GPU-<uuid>::<n>`; None for anything else.
pub fn parse_device_id(id: &str) -> Option<GpuDevice<'_>> {
    let (uuid, replica) = match id.split_once("::") {
        Some((uuid, n)) => (uuid, Some(n.parse::<u32>().ok()?)),
        None => (id, None),
    };
    let body = uuid.strip_prefix("GPU-")?;
    let plausible = !body.is_empty() && body.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    plausible.then_some(GpuDevice { uuid, replica })
}

/// What the kubelet says about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuReplicas {
    /// Device IDs on this GPU the kubelet can hand out (the time-slicing replica count, or 1).
    pub allocatable: u32,
    /// Distinct device IDs on this GPU held by pods not in a terminal phase.
    pub allocated: u32,
    /// Those pods.
    pub pods: BTreeSet<PodKey>,
}

/// The kubelet's allocations on this node, by GPU and by pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocations {
    /// By GPU UUID; a GPU only `List` names (allocatable 0) is kept, so nothing held is lost.
    pub gpus: BTreeMap<String, GpuReplicas>,
    /// The GPUs each non-terminal pod holds a replica of.
    pub pod_gpus: BTreeMap<PodKey, BTreeSet<String>>,
}

impl Allocations {
    /// Whether `pod` holds a replica of the GPU `uuid`.
    pub fn holds(&self, pod: &PodKey, uuid: &str) -> bool {
        self.pod_gpus.get(pod).is_some_and(|g| g.contains(uuid))
    }

    /// The declared VRAM of the pods holding a replica of `uuid`: `request_mib` gives a pod's
    /// `gpu-warden.io/vram-request-mib` (None: unset, counted as 0). A pod holding replicas of
    /// several GPUs is counted on each, since the request states what one GPU must hold.
    pub fn declared_mib(&self, uuid: &str, request_mib: impl Fn(&PodKey) -> Option<u64>) -> u64 {
        self.gpus.get(uuid).map_or(0, |g| {
            g.pods
                .iter()
                .map(|p| request_mib(p).unwrap_or(0))
                .fold(0u64, u64::saturating_add)
        })
    }

    /// The GPU NVIDIA's device plugin hands the next replica out on: among GPUs with a
    /// replica left, the one with the fewest allocated (not the one with the most free
    /// memory); ties go to the lower `index_of` (NVML index), GPUs without one last.
    pub fn next_gpu(&self, index_of: impl Fn(&str) -> Option<u32>) -> Option<&str> {
        self.gpus
            .iter()
            .filter(|(_, g)| g.allocated < g.allocatable)
            .min_by_key(|(uuid, g)| (g.allocated, index_of(uuid).unwrap_or(u32::MAX)))
            .map(|(uuid, _)| uuid.as_str())
    }

    /// Per GPU UUID, how many of `processes` (the pod, the GPU it runs on) run on a GPU their
    /// pod holds no replica of: a job that set `NVIDIA_VISIBLE_DEVICES=all`, bypassing the
    /// device plugin. GPUs with no such process are absent.
    pub fn processes_without_replica<'a>(
        &self,
        processes: impl IntoIterator<Item = (&'a PodKey, &'a str)>,
    ) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for (pod, uuid) in processes {
            if !self.holds(pod, uuid) {
                *out.entry(uuid.to_string()).or_insert(0) += 1;
            }
        }
        out
    }
}

/// What one successful poll of the kubelet says, joined with the pod view: the replica
/// counts, and the declared VRAM of the pods holding each GPU. The agent publishes the
/// latest one; the metrics and the `vram` annotation read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaView {
    /// Replicas by GPU and GPUs by pod.
    pub allocations: Allocations,
    /// By GPU UUID: the declared VRAM (MiB) of the pods holding a replica of it.
    pub declared_mib: BTreeMap<String, u64>,
}

impl ReplicaView {
    /// The kubelet's figures for the GPU `uuid`: (allocated, allocatable, declared MiB);
    /// zeros for a GPU the kubelet does not name (it cannot hand it out).
    pub fn gpu(&self, uuid: &str) -> (u32, u32, u64) {
        let (allocated, allocatable) = self
            .allocations
            .gpus
            .get(uuid)
            .map_or((0, 0), |g| (g.allocated, g.allocatable));
        let declared = self.declared_mib.get(uuid).copied().unwrap_or(0);
        (allocated, allocatable, declared)
    }
}
