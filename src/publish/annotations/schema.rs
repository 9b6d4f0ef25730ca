//! The wire schema of the free-VRAM Node annotations (docs/annotations.md): the key names,
//! the `vram` JSON's per-GPU entry and the reader's view of the document. The extender and
//! the cluster simulation read the annotations with these types, so writer and readers
//! cannot drift apart.

use crate::model::pressure::Pressure;
use serde::{Deserialize, Serialize};

/// The default annotation key prefix (the node's keys and the pods' share it).
pub const DEFAULT_PREFIX: &str = crate::model::units::DEFAULT_ANNOTATION_PREFIX;
/// The `v` field of the `vram` JSON; bumped only on an incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Something for each annotation the agent owns, on its Node and on its Lease, by name. A
/// key added here is a field, so the compiler asks every place that builds a set or takes
/// one apart for it: its name ([`KEY_NAMES`]) and its value
/// (`src/publish/annotations/values.rs`). The removal at shutdown and the extender's reading
/// of a Lease (`src/extender/liveness.rs`) go over every key of the set, so a new one is
/// removed and read there without a change (their tests check it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerKey<T> {
    /// `vram-free-mib`: the free MiB summed over the node's GPUs.
    pub free: T,
    /// `vram-max-free-mib`: the most free MiB on any one GPU.
    pub max_free: T,
    /// `vram`: the per-GPU JSON document.
    pub vram: T,
    /// `vram-observed-at`: the RFC 3339 time of the observation the values come from.
    pub observed_at: T,
    /// `cuda-driver-version`: the CUDA version the node's driver supports (`"12.8"`),
    /// written with the other figures when the driver tells it; read by the extender's CUDA
    /// check (docs/cuda.md).
    pub cuda_driver_version: T,
}

/// The keys' names, after `<prefix>/`.
pub const KEY_NAMES: PerKey<&str> = PerKey {
    free: "vram-free-mib",
    max_free: "vram-max-free-mib",
    vram: "vram",
    observed_at: "vram-observed-at",
    cuda_driver_version: "cuda-driver-version",
};

impl<T> PerKey<T> {
    /// Every key's thing, in the order of docs/annotations.md.
    pub fn into_array(self) -> [T; 5] {
        let PerKey {
            free,
            max_free,
            vram,
            observed_at,
            cuda_driver_version,
        } = self;
        [free, max_free, vram, observed_at, cuda_driver_version]
    }

    /// The set of things given in the order of docs/annotations.md.
    pub fn from_array([free, max_free, vram, observed_at, cuda_driver_version]: [T; 5]) -> Self {
        PerKey {
            free,
            max_free,
            vram,
            observed_at,
            cuda_driver_version,
        }
    }

    /// Borrows every key's thing.
    pub fn each_ref(&self) -> PerKey<&T> {
        PerKey::from_array([
            &self.free,
            &self.max_free,
            &self.vram,
            &self.observed_at,
            &self.cuda_driver_version,
        ])
    }

    /// Every key's thing, in the order of docs/annotations.md.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.each_ref().into_array().into_iter()
    }

    /// `f` of every key's thing.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> PerKey<U> {
        PerKey::from_array(self.into_array().map(f))
    }
}

pub(crate) fn annotation_key(prefix: &str, name: &str) -> String {
    format!("{prefix}/{name}")
}

/// The full keys `<prefix>/<name>` the agent owns.
pub fn owned_keys(prefix: &str) -> PerKey<String> {
    KEY_NAMES.map(|n| annotation_key(prefix, n))
}

/// One GPU's entry of the `vram` JSON, quantized. Field order is the JSON's key order.
/// Readers (the scheduler extender) parse it with the same type, so writer and reader
/// cannot drift apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFigures {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Framebuffer size, exact MiB.
    #[serde(rename = "totalMiB")]
    pub total_mib: u64,
    /// Used MiB rounded *up* to the quantum (capped at the total).
    #[serde(rename = "usedMiB")]
    pub used_mib: u64,
    /// Free MiB rounded *down* to the quantum.
    #[serde(rename = "freeMiB")]
    pub free_mib: u64,
    /// The guard's classification (`none` when the guard is off or has no verdict).
    pub pressure: Pressure,
    /// Replicas of this GPU the kubelet has handed out to pods not in a terminal phase
    /// (pod-resources data only; absent from the JSON without it).
    #[serde(
        rename = "replicasAllocated",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub replicas_allocated: Option<u32>,
    /// Replicas of this GPU the kubelet can hand out (the time-slicing replica count, 1 for
    /// a whole GPU, 0 for a GPU the device plugin does not advertise).
    #[serde(
        rename = "replicasAllocatable",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub replicas_allocatable: Option<u32>,
    /// The declared VRAM (`<prefix>/vram-request-mib`, exact MiB) of the pods holding a
    /// replica of this GPU: memory committed on it, used or not yet.
    #[serde(
        rename = "declaredMiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub declared_mib: Option<u64>,
}

impl GpuFigures {
    pub(super) fn replicas(&self) -> Option<ReplicaFigures> {
        Some(ReplicaFigures {
            allocated: self.replicas_allocated?,
            allocatable: self.replicas_allocatable,
            declared_mib: self.declared_mib?,
        })
    }
}

/// One GPU's pod-resources figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReplicaFigures {
    pub(super) allocated: u32,
    /// None when the kubelet does not serve `GetAllocatableResources`.
    pub(super) allocatable: Option<u32>,
    pub(super) declared_mib: u64,
}

/// The `vram` JSON as a reader sees it: what [`AnnotationValues::vram_json`] writes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VramDocument {
    /// Schema version ([`SCHEMA_VERSION`] today).
    pub v: u32,
    /// RFC 3339 time of the poll, as written.
    #[serde(rename = "observedAt")]
    pub observed_at: String,
    /// The GPUs with a memory reading.
    pub gpus: Vec<GpuFigures>,
    /// `None`: the key is absent (no pod-resources data); `Some(None)`: `null`, every
    /// replica is out; `Some(Some(uuid))`: the GPU the device plugin hands out next.
    #[serde(rename = "nextGpuUuid", default, deserialize_with = "present")]
    pub next_gpu: Option<Option<String>>,
}

/// Tells an absent key (`None`, through `default`) from an explicit `null` (`Some(None)`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// Parses a `vram` annotation value. Unknown fields are ignored (the schema is additive).
pub fn parse_vram_json(text: &str) -> Result<VramDocument, serde_json::Error> {
    serde_json::from_str(text)
}
