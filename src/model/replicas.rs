//! What the kubelet's pod-resources API says about the node's GPUs, reduced to plain data:
//! NVIDIA's device IDs in every form its device plugin writes, matched with the GPUs NVML
//! sees; the replicas allocated and allocatable per GPU, the pods holding each, their
//! declared VRAM; and, joined with a snapshot, the replicas held with no process behind them
//! and the processes running on a GPU their pod holds nothing of; why the kubelet gave
//! nothing (its errors live here, beside the answer that carries them to `/state`).
//! `attribute::podresources` builds it; the metrics, the `vram` annotation and `/state` read it.

use crate::model::device_plugin::{self, Replicas};
use crate::model::snapshot::{GpuSample, Owner, PodRef, ProcessSample, Snapshot, MIB};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// A pod as the kubelet's pod-resources API names it: (namespace, name).
pub type PodKey = (String, String);

/// Every resource NVIDIA's device plugin advertises starts with this, renamed ones too: its
/// `NewResourceName` (api/config/v1/resources.go) prefixes any name given without it.
pub const NVIDIA_RESOURCE_PREFIX: &str = "nvidia.com/";

/// What one device ID names, before it is matched with the GPUs NVML sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceTarget<'a> {
    /// `GPU-<uuid>`, NVML's UUID of a whole GPU (also the parent named inside a pre-R470
    /// MIG ID, `MIG-GPU-<uuid>/<gi>/<ci>`).
    Gpu(&'a str),
    /// `MIG-<uuid>` (driver R470 and later): a MIG device; its parent is the GPU whose MIG
    /// devices NVML lists it among.
    Mig(&'a str),
    /// `<n>`: the GPU with NVML index n.
    Index(u32),
    /// `<n>:<m>`: MIG device m of the GPU with NVML index n (the plugin's index form).
    MigIndex(u32, u32),
    /// An NVIDIA device no NVML GPU can be matched with: `tegra` (Jetson's integrated GPU)
    /// or `all` (WSL2's one device for every GPU).
    Unaddressable,
}

/// One device ID, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceId<'a> {
    pub target: DeviceTarget<'a>,
    /// The time-slicing (or MPS) replica number of a `<id>::<n>` ID.
    pub replica: Option<u32>,
}

fn uuid_like(body: &str) -> bool {
    !body.is_empty() && body.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

fn decimal(s: &str) -> Option<u32> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// Splits a device ID the kubelet lists under `resource`. UUID forms are recognised under
/// any resource name (they cannot be mistaken); the bare forms (`0`, `0:1`, `tegra`, `all`)
/// only under `nvidia.com/…`, so another vendor's `0` is never taken for GPU 0. None: not
/// an NVIDIA GPU device (another resource, or an ID of no known form).
///
/// The forms follow the device plugin's source: `rm.BuildDevice` sets every ID to the
/// device's UUID (`GPU-…`, or `MIG-…` for a MIG device) under both `deviceIDStrategy`
/// values — the strategy only picks what goes into `NVIDIA_VISIBLE_DEVICES` — and
/// time-slicing or MPS sharing appends `::<n>` (`rm.NewAnnotatedID`); Tegra and WSL devices
/// are `tegra` and `all`. The index forms are what the plugin calls a device's `Index`
/// (`<n>`, `<n>:<m>` for MIG), accepted for plugins that advertise those.
pub fn parse_device_id<'a>(resource: &str, id: &'a str) -> Option<DeviceId<'a>> {
    let (base, replica) = match id.split_once("::") {
        Some((base, n)) => (base, Some(decimal(n)?)),
        None => (id, None),
    };
    let target = if let Some(legacy) = base.strip_prefix("MIG-GPU-") {
        let (uuid, instance) = legacy.split_once('/')?;
        let (gi, ci) = instance.split_once('/')?;
        decimal(gi)?;
        decimal(ci)?;
        if !uuid_like(uuid) {
            return None;
        }
        DeviceTarget::Gpu(&base["MIG-".len()..base.len() - instance.len() - 1])
    } else if let Some(body) = base.strip_prefix("GPU-") {
        uuid_like(body).then_some(DeviceTarget::Gpu(base))?
    } else if let Some(body) = base.strip_prefix("MIG-") {
        uuid_like(body).then_some(DeviceTarget::Mig(base))?
    } else if !resource.starts_with(NVIDIA_RESOURCE_PREFIX) {
        return None;
    } else if base == "tegra" || base == "all" {
        DeviceTarget::Unaddressable
    } else if let Some((gpu, mig)) = base.split_once(':') {
        DeviceTarget::MigIndex(decimal(gpu)?, decimal(mig)?)
    } else {
        DeviceTarget::Index(decimal(base)?)
    };
    Some(DeviceId { target, replica })
}

impl DeviceTarget<'_> {
    /// The UUID of the GPU this names among `gpus` (a MIG device: its parent GPU). A
    /// `GPU-<uuid>` is its own answer even when NVML does not see that GPU (the kubelet may
    /// hand out a GPU the agent could not open); the other forms need NVML to match them.
    pub fn gpu_uuid(&self, gpus: &[GpuSample]) -> Option<String> {
        let found = match *self {
            DeviceTarget::Gpu(uuid) => return Some(uuid.to_string()),
            DeviceTarget::Mig(uuid) => gpus
                .iter()
                .find(|g| g.mig_devices.iter().any(|m| m == uuid)),
            DeviceTarget::Index(i) | DeviceTarget::MigIndex(i, _) => {
                gpus.iter().find(|g| g.id.index == i)
            }
            DeviceTarget::Unaddressable => None,
        };
        found.map(|g| g.id.uuid.clone())
    }
}

/// One NVIDIA GPU device as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeletDevice {
    /// The extended resource, e.g. `nvidia.com/gpu`, `nvidia.com/gpu.shared`,
    /// `nvidia.com/mig-1g.10gb`.
    pub resource: String,
    pub id: String,
}

/// A pod the kubelet's `List` names and the pod view does not have in a terminal phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedPod {
    pub key: PodKey,
    /// The NVIDIA GPU devices its containers hold, each once (the kubelet hands an init
    /// container's devices on to the app containers of the same pod).
    pub devices: Vec<KubeletDevice>,
    /// Its declared VRAM (`<prefix>/vram-request-mib`; unset counts as 0).
    pub declared_mib: u64,
}

/// Why the kubelet's pod-resources data could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodResourcesError {
    /// No socket: not a kubelet node, or the directory is not mounted. The feature is off.
    #[error("{}: no kubelet pod-resources socket (mount the host's /var/lib/kubelet/pod-resources read-only)", path.display())]
    Absent {
        /// The socket path tried.
        path: PathBuf,
    },
    /// The socket exists but this process may not connect (the kubelet's socket is root's).
    /// The feature is off.
    #[error("{}: permission denied on the kubelet pod-resources socket (the agent must run as a user that may connect to it)", path.display())]
    Denied {
        /// The socket path tried.
        path: PathBuf,
    },
    /// Something other than a socket is at the path. A directory is what a `hostPath` mount
    /// of the socket *file* leaves when the socket did not exist at that moment: the kubelet
    /// can never be reached through it. The feature is off.
    #[error("{}: {what}, not a socket{}", path.display(), if *what == "a directory" {
        " (a hostPath mount of the socket file creates a directory when the socket is missing; mount the directory /var/lib/kubelet/pod-resources instead)"
    } else { "" })]
    NotASocket {
        /// The socket path tried.
        path: PathBuf,
        /// `a directory`, `a regular file`, …
        what: &'static str,
    },
    /// A call failed: the kubelet is restarting, refused it, or did not answer in time.
    #[error("pod-resources {call}: {message}")]
    Call {
        /// `List` or `GetAllocatableResources`.
        call: &'static str,
        /// The gRPC status or transport error, and what it means.
        message: String,
    },
}

impl PodResourcesError {
    /// Whether the feature should be switched off (as opposed to a poll that may succeed later).
    pub fn disables(&self) -> bool {
        matches!(
            self,
            Self::Absent { .. } | Self::Denied { .. } | Self::NotASocket { .. }
        )
    }
}

/// Why `GetAllocatableResources` gave nothing while `List` answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocatableError {
    /// This kubelet does not serve it: `Unimplemented` (Kubernetes 1.20, before the call
    /// existed) or `Unknown: Pod Resources API GetAllocatableResources disabled` (1.21–1.22
    /// with the `KubeletPodResourcesGetAllocatable` gate off). Asked again only after the
    /// kubelet restarts (a new connection).
    #[error("GetAllocatableResources is not served by this kubelet ({0})")]
    Unavailable(String),
    /// It failed this time.
    #[error(transparent)]
    Failed(PodResourcesError),
}

impl AllocatableError {
    /// Why there are no allocatable figures, as `/state` and the logs say it: the kubelet's
    /// own words when it does not serve the call, the failure otherwise.
    pub fn why(&self) -> String {
        match self {
            Self::Unavailable(why) => why.clone(),
            Self::Failed(e) => e.to_string(),
        }
    }
}

/// What one poll of the kubelet answered, before its IDs are matched with NVML's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletAnswer {
    pub pods: Vec<ListedPod>,
    /// `GetAllocatableResources`' NVIDIA GPU devices, or why there are none: the call is
    /// judged apart from `List` (kubelets before 1.23 may not serve it).
    pub allocatable: Result<Vec<KubeletDevice>, AllocatableError>,
}

/// One device a pod holds, and the GPU it was matched with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeldDevice {
    pub resource: String,
    pub id: String,
    /// The GPU's UUID; None when no GPU NVML sees could be matched with the ID.
    pub gpu: Option<String>,
}

/// What the kubelet says about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuReplicas {
    /// Device IDs on this GPU the kubelet can hand out (the time-slicing replica count, 1
    /// for a whole GPU, the MIG devices on it; 0 when unknown, see
    /// [`Allocations::allocatable_unknown`]).
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
    /// Every non-terminal pod the kubelet's `List` names, with devices or without: a pod it
    /// does not name started after the poll, and what it holds is not known yet.
    pub listed: BTreeSet<PodKey>,
    /// The NVIDIA GPU devices each pod holds, matched with GPUs (`/state`'s pod map).
    pub pod_devices: BTreeMap<PodKey, Vec<HeldDevice>>,
    /// Each holding pod's declared VRAM, MiB.
    pub declared_mib_by_pod: BTreeMap<PodKey, u64>,
    /// Allocatable device IDs no GPU NVML sees could be matched with.
    pub unmapped_allocatable: Vec<String>,
    /// Why the allocatable figures are unknown (`GetAllocatableResources` unavailable or
    /// failing); None when they are known.
    pub allocatable_unknown: Option<String>,
}

impl Allocations {
    /// Whether `pod` holds a replica of the GPU `uuid`.
    pub fn holds(&self, pod: &PodKey, uuid: &str) -> bool {
        self.pod_gpus.get(pod).is_some_and(|g| g.contains(uuid))
    }

    /// Whether the allocatable figures are known.
    pub fn allocatable_known(&self) -> bool {
        self.allocatable_unknown.is_none()
    }

    /// Whether `pod` holds a GPU device that could not be matched with a GPU: which GPU it
    /// holds is not known, so none of its processes counts as bypassing the device plugin.
    pub fn holds_unmapped(&self, pod: &PodKey) -> bool {
        self.pod_devices
            .get(pod)
            .is_some_and(|d| d.iter().any(|d| d.gpu.is_none()))
    }

    /// Whether a process of `pod` on the GPU `uuid` runs there without the device plugin
    /// having handed the pod any of it (a container that set `NVIDIA_VISIBLE_DEVICES=all`,
    /// or asked for no GPU). Never for a pod the kubelet's last `List` did not name (it may
    /// have started since) nor one holding a device that names no GPU.
    pub fn bypasses(&self, pod: &PodKey, uuid: &str) -> bool {
        self.listed.contains(pod) && !self.holds(pod, uuid) && !self.holds_unmapped(pod)
    }

    /// How many device IDs `pod` holds on the GPU `uuid`.
    pub fn replicas_held(&self, pod: &PodKey, uuid: &str) -> u32 {
        self.pod_devices.get(pod).map_or(0, |d| {
            d.iter().filter(|d| d.gpu.as_deref() == Some(uuid)).count() as u32
        })
    }

    /// The devices held that could not be matched with a GPU, with their pods.
    pub fn unmapped(&self) -> impl Iterator<Item = (&PodKey, &HeldDevice)> {
        self.pod_devices
            .iter()
            .flat_map(|(p, d)| d.iter().map(move |d| (p, d)))
            .filter(|(_, d)| d.gpu.is_none())
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

    /// The GPU NVIDIA's device plugin hands the next replica out on, by its rule
    /// (`src/model/device_plugin.rs`), with `index_of` giving a GPU's NVML index. None also
    /// when the allocatable figures are unknown.
    pub fn next_gpu(&self, index_of: impl Fn(&str) -> Option<u32>) -> Option<&str> {
        if !self.allocatable_known() {
            return None;
        }
        device_plugin::next(self.gpus.iter().map(|(uuid, g)| {
            let replicas = Replicas {
                allocated: g.allocated,
                allocatable: g.allocatable,
                index: index_of(uuid),
            };
            (replicas, uuid.as_str())
        }))
    }
}

impl KubeletAnswer {
    /// Matches the answer's device IDs with `gpus` (the latest snapshot's) and counts
    /// replicas per GPU. An ID is counted once however many containers or pods list it.
    pub fn resolve(&self, gpus: &[GpuSample]) -> ReplicaView {
        let gpu_of = |d: &KubeletDevice| {
            parse_device_id(&d.resource, &d.id).and_then(|p| p.target.gpu_uuid(gpus))
        };
        let mut a = Allocations::default();
        match &self.allocatable {
            Ok(devices) => {
                let mut seen = BTreeSet::new();
                for d in devices {
                    if !seen.insert(&d.id) {
                        continue;
                    }
                    match gpu_of(d) {
                        Some(uuid) => a.gpus.entry(uuid).or_default().allocatable += 1,
                        None => a.unmapped_allocatable.push(d.id.clone()),
                    }
                }
            }
            Err(e) => a.allocatable_unknown = Some(e.why()),
        }
        let mut held = BTreeSet::new();
        for pod in &self.pods {
            a.listed.insert(pod.key.clone());
            if pod.devices.is_empty() {
                continue;
            }
            let mut devices = Vec::with_capacity(pod.devices.len());
            for d in &pod.devices {
                let gpu = gpu_of(d);
                if let Some(uuid) = &gpu {
                    let g = a.gpus.entry(uuid.clone()).or_default();
                    if held.insert(&d.id) {
                        g.allocated += 1;
                    }
                    g.pods.insert(pod.key.clone());
                    a.pod_gpus
                        .entry(pod.key.clone())
                        .or_default()
                        .insert(uuid.clone());
                }
                devices.push(HeldDevice {
                    resource: d.resource.clone(),
                    id: d.id.clone(),
                    gpu,
                });
            }
            a.pod_devices.insert(pod.key.clone(), devices);
            a.declared_mib_by_pod
                .insert(pod.key.clone(), pod.declared_mib);
        }
        let declared_mib = a
            .gpus
            .keys()
            .map(|uuid| {
                let mib = a.declared_mib(uuid, |p| a.declared_mib_by_pod.get(p).copied());
                (uuid.clone(), mib)
            })
            .collect();
        ReplicaView {
            allocations: a,
            declared_mib,
        }
    }
}

/// What one successful poll of the kubelet says, matched with NVML's GPUs and joined with
/// the pod view: the replica counts, and the declared VRAM of the pods holding each GPU.
/// The agent publishes the latest one; the metrics, the `vram` annotation and `/state` read
/// it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaView {
    /// Replicas by GPU and GPUs by pod.
    pub allocations: Allocations,
    /// By GPU UUID: the declared VRAM (MiB) of the pods holding a replica of it.
    pub declared_mib: BTreeMap<String, u64>,
}

/// One GPU's replicas joined with the processes on it at one snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuUse<'a> {
    /// Pods holding replicas of the GPU with no process on it, and how many they hold:
    /// replicas a pod keeps from others while it does not use them.
    pub idle_holds: Vec<(&'a PodKey, u32)>,
    /// Processes on the GPU whose pod holds none of it, with that pod.
    pub bypassing: Vec<(&'a ProcessSample, &'a PodRef)>,
    /// Σ declared VRAM of the pods holding replicas of it, MiB.
    pub declared_mib: u64,
    /// Σ over those pods of the larger of their declared VRAM and what their processes use
    /// on it, MiB: what the GPU has promised, whether in use yet or not.
    pub committed_mib: u64,
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

    /// The allocatable replicas of `uuid`, None when `GetAllocatableResources` gave none.
    pub fn allocatable(&self, uuid: &str) -> Option<u32> {
        self.allocations
            .allocatable_known()
            .then(|| self.gpu(uuid).1)
    }

    /// Each GPU of `snap` (by index order) joined with its replicas: idle holds, bypassing
    /// processes, declared and committed VRAM. Host processes hold no replica and are not
    /// counted; nor are processes attribution has not placed in a pod.
    pub fn usage<'a>(&'a self, snap: &'a Snapshot) -> Vec<(&'a GpuSample, GpuUse<'a>)> {
        let a = &self.allocations;
        snap.gpus
            .iter()
            .map(|g| {
                let uuid = g.id.uuid.as_str();
                let mut u = GpuUse {
                    declared_mib: self.declared_mib.get(uuid).copied().unwrap_or(0),
                    ..GpuUse::default()
                };
                let on_gpu = || {
                    snap.processes_on(g.id.index)
                        .filter_map(|p| match &p.owner {
                            Owner::Pod(r) => Some((p, r)),
                            _ => None,
                        })
                };
                let is = |r: &PodRef, k: &PodKey| r.namespace == k.0 && r.pod == k.1;
                if let Some(held) = a.gpus.get(uuid) {
                    for pod in &held.pods {
                        let used: u64 = on_gpu()
                            .filter(|(_, r)| is(r, pod))
                            .map(|(p, _)| p.used_bytes.unwrap_or(0))
                            .sum();
                        if !on_gpu().any(|(_, r)| is(r, pod)) {
                            u.idle_holds.push((pod, a.replicas_held(pod, uuid)));
                        }
                        let declared = a.declared_mib_by_pod.get(pod).copied().unwrap_or(0);
                        u.committed_mib = u
                            .committed_mib
                            .saturating_add(declared.max(used.div_ceil(MIB)));
                    }
                }
                for (p, r) in on_gpu() {
                    if a.bypasses(&(r.namespace.clone(), r.pod.clone()), uuid) {
                        u.bypassing.push((p, r));
                    }
                }
                (g, u)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::{GpuHealth, GpuIdentity};
    use std::time::{Duration, SystemTime};

    const G0: &str = "GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b";
    const G1: &str = "GPU-66666666-7777-8888-9999-000000000000";
    const M0: &str = "MIG-aa5e2a8b-1c4d-5e6f-9a0b-7c8d9e0f1a2b";
    const M1: &str = "MIG-bb5e2a8b-1c4d-5e6f-9a0b-7c8d9e0f1a2b";
    const GPU: &str = "nvidia.com/gpu";

    fn gpu(index: u32, uuid: &str, mig: &[&str]) -> GpuSample {
        let mut g = GpuSample::empty(
            GpuIdentity {
                index,
                uuid: uuid.into(),
                pci_bus_id: format!("00000000:0{index}:00.0"),
                device: format!("nvidia{index}"),
                model: "NVIDIA H100 80GB HBM3".into(),
            },
            GpuHealth::Ok,
        );
        g.mig_devices = mig.iter().map(|m| m.to_string()).collect();
        g
    }

    fn dev(resource: &str, id: &str) -> KubeletDevice {
        KubeletDevice {
            resource: resource.into(),
            id: id.into(),
        }
    }

    fn pod(name: &str, devices: &[KubeletDevice], declared_mib: u64) -> ListedPod {
        ListedPod {
            key: key(name),
            devices: devices.to_vec(),
            declared_mib,
        }
    }

    fn key(name: &str) -> PodKey {
        ("ci".into(), name.into())
    }

    fn process(pid: u32, gpu: u32, pod: &str, mib: u64) -> ProcessSample {
        ProcessSample {
            pid,
            gpu,
            used_bytes: Some(mib * MIB),
            sm_util: None,
            name: "python".into(),
            owner: Owner::Pod(PodRef {
                namespace: "ci".into(),
                pod: pod.into(),
                container: "build".into(),
                uid: format!("uid-{pod}"),
            }),
        }
    }

    fn snapshot(gpus: Vec<GpuSample>, processes: Vec<ProcessSample>) -> Snapshot {
        Snapshot {
            seq: 1,
            at: Duration::ZERO,
            wall: SystemTime::UNIX_EPOCH,
            driver_version: "580".into(),
            cuda_driver_version: None,
            gpus,
            processes,
            util_fresh: true,
            errors: vec![],
        }
    }

    #[test]
    fn every_id_form_of_the_device_plugin() {
        use DeviceTarget::*;
        fn t<'a>(resource: &str, id: &'a str) -> Option<(DeviceTarget<'a>, Option<u32>)> {
            parse_device_id(resource, id).map(|d| (d.target, d.replica))
        }
        let legacy = "MIG-GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b/7/0";
        for (resource, id, want) in [
            (GPU, G0, Some((Gpu(G0), None))),
            (GPU, &format!("{G0}::3") as &str, Some((Gpu(G0), Some(3)))),
            // Renamed resources (time-slicing's `rename`, `.shared`) keep the IDs.
            (
                "nvidia.com/gpu.shared",
                &format!("{G1}::0"),
                Some((Gpu(G1), Some(0))),
            ),
            ("nvidia.com/a10g-ci", G1, Some((Gpu(G1), None))),
            // MIG, single strategy (nvidia.com/gpu) and mixed (nvidia.com/mig-<profile>).
            (GPU, M0, Some((Mig(M0), None))),
            ("nvidia.com/mig-1g.10gb", M0, Some((Mig(M0), None))),
            (
                "nvidia.com/mig-1g.10gb.shared",
                &format!("{M0}::2"),
                Some((Mig(M0), Some(2))),
            ),
            // Drivers before R470 named a MIG device after its parent.
            (GPU, legacy, Some((Gpu(G0), None))),
            // The index forms.
            (GPU, "0", Some((Index(0), None))),
            (GPU, "1::3", Some((Index(1), Some(3)))),
            (
                "nvidia.com/mig-3g.40gb",
                "0:1",
                Some((MigIndex(0, 1), None)),
            ),
            (GPU, "0:2::1", Some((MigIndex(0, 2), Some(1)))),
            // Tegra and WSL: NVIDIA's, but no NVML GPU to match.
            (GPU, "tegra", Some((Unaddressable, None))),
            (GPU, "all::1", Some((Unaddressable, Some(1)))),
            // Not NVIDIA GPU devices.
            ("example.com/fpga", "0", None),
            ("rdma/hca_shared_devices_a", "tegra", None),
            ("nvidia.com/mlnx_sriov_rdma", "0000:af:00.2", None),
            (GPU, "GPU-", None),
            (GPU, "GPU-xyz", None),
            (GPU, &format!("{G0}::x"), None),
            (GPU, "MIG-GPU-3f5e/7", None),
            (GPU, "/dev/fuse", None),
            (GPU, "-1", None),
        ] {
            assert_eq!(t(resource, id), want, "{resource} {id}");
        }
        // A UUID cannot be mistaken, whatever the resource is called.
        assert_eq!(t("example.com/gpu", G0), Some((Gpu(G0), None)));
    }

    #[test]
    fn ids_are_matched_with_nvml_gpus_mig_to_its_parent_index_through_nvml() {
        // NVML index 0 is G1 here: an index ID names NVML's index, not the UUIDs' order.
        let gpus = [gpu(0, G1, &[]), gpu(1, G0, &[M0, M1])];
        let m = |id: &str| parse_device_id(GPU, id).and_then(|d| d.target.gpu_uuid(&gpus));
        assert_eq!(m(M1).as_deref(), Some(G0));
        assert_eq!(m(&format!("{M0}::1")).as_deref(), Some(G0));
        assert_eq!(m("0").as_deref(), Some(G1));
        assert_eq!(m("1:0::2").as_deref(), Some(G0));
        assert_eq!(m(G0).as_deref(), Some(G0));
        // Named by UUID but not seen by NVML: still that GPU.
        let unseen = "GPU-99999999-0000-0000-0000-000000000000";
        assert_eq!(m(unseen).as_deref(), Some(unseen));
        for unmatched in [
            "MIG-cc5e2a8b-1c4d-5e6f-9a0b-7c8d9e0f1a2b",
            "2",
            "7:0",
            "tegra",
        ] {
            assert_eq!(m(unmatched), None, "{unmatched}");
        }
    }

    #[test]
    fn mig_replicas_count_on_the_parent_and_unmatched_ids_are_no_bypass() {
        let gpus = vec![gpu(0, G0, &[M0, M1]), gpu(1, G1, &[])];
        let answer = KubeletAnswer {
            pods: vec![
                pod("mig-a", &[dev("nvidia.com/mig-1g.10gb", M0)], 10_240),
                pod("mig-b", &[dev("nvidia.com/mig-1g.10gb", M1)], 0),
                pod("index", &[dev(GPU, "1::0")], 4096),
                // A MIG device NVML does not list (reconfigured since): unmatched.
                pod(
                    "stale-mig",
                    &[dev(GPU, "MIG-cc5e2a8b-1c4d-5e6f-9a0b-7c8d9e0f1a2b")],
                    0,
                ),
                pod("no-gpu", &[], 0),
            ],
            allocatable: Ok(vec![
                dev("nvidia.com/mig-1g.10gb", M0),
                dev("nvidia.com/mig-1g.10gb", M1),
                dev(GPU, "1::0"),
                dev(GPU, "1::1"),
                dev(GPU, "tegra"),
            ]),
        };
        let v = answer.resolve(&gpus);
        assert_eq!(v.gpu(G0), (2, 2, 10_240));
        assert_eq!(v.gpu(G1), (1, 2, 4096));
        assert_eq!(
            v.allocations.unmapped_allocatable,
            vec!["tegra".to_string()]
        );
        let unmapped: Vec<&str> = v
            .allocations
            .unmapped()
            .map(|(p, _)| p.1.as_str())
            .collect();
        assert_eq!(unmapped, vec!["stale-mig"]);
        let snap = snapshot(
            gpus,
            vec![
                process(1, 0, "mig-a", 5000),
                process(2, 0, "mig-b", 100),
                process(3, 1, "index", 100),
                // Not counted: the pod's device names no GPU, so where it belongs is unknown.
                process(4, 1, "stale-mig", 100),
                // Counted: listed, holding nothing.
                process(5, 1, "no-gpu", 100),
                // Not counted: the kubelet's last List did not name it (it started since).
                process(6, 1, "newer", 100),
            ],
        );
        let usage = v.usage(&snap);
        assert!(usage[0].1.bypassing.is_empty(), "{:?}", usage[0].1);
        let by: Vec<u32> = usage[1].1.bypassing.iter().map(|(p, _)| p.pid).collect();
        assert_eq!(by, vec![5]);
    }

    #[test]
    fn idle_holds_and_committed_memory() {
        let gpus = vec![gpu(0, G0, &[]), gpu(1, G1, &[])];
        let answer = KubeletAnswer {
            pods: vec![
                // Declared 8 GiB, uses 2: commits 8.
                pod("under", &[dev(GPU, &format!("{G0}::0"))], 8192),
                // Declared 2 GiB, uses 6: commits 6.
                pod("over", &[dev(GPU, &format!("{G0}::1"))], 2048),
                // Holds two replicas of G0, runs nothing there (it runs on G1 instead).
                pod(
                    "idle",
                    &[dev(GPU, &format!("{G0}::2")), dev(GPU, &format!("{G0}::3"))],
                    1024,
                ),
            ],
            allocatable: Ok((0..4).map(|n| dev(GPU, &format!("{G0}::{n}"))).collect()),
        };
        let v = answer.resolve(&gpus);
        let snap = snapshot(
            gpus,
            vec![
                process(1, 0, "under", 2048),
                process(2, 0, "over", 4096),
                process(3, 0, "over", 2048),
                process(4, 1, "idle", 10),
            ],
        );
        let usage = v.usage(&snap);
        let g0 = &usage[0].1;
        assert_eq!(g0.idle_holds, vec![(&key("idle"), 2)]);
        assert_eq!(g0.declared_mib, 8192 + 2048 + 1024);
        assert_eq!(g0.committed_mib, 8192 + 6144 + 1024);
        assert!(g0.bypassing.is_empty());
        let g1 = &usage[1].1;
        assert!(g1.idle_holds.is_empty());
        assert_eq!(g1.bypassing.len(), 1, "idle holds G0, runs on G1");
        assert_eq!(
            v.allocations.next_gpu(|_| Some(0)),
            None,
            "G0 is full, G1 not advertised"
        );
    }

    #[test]
    fn without_allocatable_figures_there_is_no_next_gpu_and_allocated_stays() {
        let gpus = vec![gpu(0, G0, &[])];
        let answer = KubeletAnswer {
            pods: vec![pod("a", &[dev(GPU, &format!("{G0}::0"))], 0)],
            allocatable: Err(AllocatableError::Unavailable("Unimplemented".into())),
        };
        let v = answer.resolve(&gpus);
        assert_eq!(v.gpu(G0).0, 1);
        assert_eq!(v.allocatable(G0), None);
        assert_eq!(v.allocations.next_gpu(|_| Some(0)), None);
        let known = KubeletAnswer {
            allocatable: Ok(vec![
                dev(GPU, &format!("{G0}::0")),
                dev(GPU, &format!("{G0}::1")),
            ]),
            ..answer
        }
        .resolve(&gpus);
        assert_eq!(known.allocatable(G0), Some(2));
        assert_eq!(known.allocations.next_gpu(|_| Some(0)), Some(G0));
    }
}
