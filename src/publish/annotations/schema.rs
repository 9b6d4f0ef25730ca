//! The wire schema of the free-VRAM Node annotations (docs/annotations.md): the key names,
//! the `vram` JSON's per-GPU entry and the reader's view of the document. The extender and
//! the cluster simulation read the annotations with these types, so writer and readers
//! cannot drift apart.

use crate::model::pressure::Pressure;
use serde::{Deserialize, Serialize};

/// The default annotation key prefix (the node's keys and the pods' share it).
pub const DEFAULT_PREFIX: &str = crate::model::units::DEFAULT_ANNOTATION_PREFIX;
/// Key name (after `<prefix>/`) of the free MiB summed over the node's GPUs.
pub const KEY_FREE: &str = "vram-free-mib";
/// Key name of the most free MiB on any one GPU.
pub const KEY_MAX_FREE: &str = "vram-max-free-mib";
/// Key name of the per-GPU JSON document.
pub const KEY_VRAM: &str = "vram";
/// Key name of the RFC 3339 time of the observation the values come from.
pub const KEY_OBSERVED_AT: &str = "vram-observed-at";
/// Key name of the CUDA version the node's driver supports (`"12.8"`), written with the
/// other figures when the driver tells it; read by the extender's CUDA check (docs/cuda.md).
pub const KEY_CUDA: &str = "cuda-driver-version";
/// The `v` field of the `vram` JSON; bumped only on an incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

pub(crate) fn annotation_key(prefix: &str, name: &str) -> String {
    format!("{prefix}/{name}")
}

pub(crate) fn owned_keys(prefix: &str) -> [String; 4] {
    [KEY_FREE, KEY_MAX_FREE, KEY_VRAM, KEY_OBSERVED_AT].map(|n| annotation_key(prefix, n))
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
