//! What a node's gpu-warden annotations say, read with the agent's own types
//! ([`crate::publish::annotations`]), so the writer and this reader cannot drift apart.

use crate::model::cuda::CudaVersion;
use crate::publish::annotations::{owned_keys, parse_vram_json, GpuFigures};
use std::collections::BTreeMap;
use std::time::SystemTime;

/// A node's published VRAM figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVram {
    /// When the agent took the poll the figures come from.
    pub observed_at: SystemTime,
    /// The GPUs with a memory reading, by index.
    pub gpus: Vec<GpuFigures>,
    /// `None`: no pod-resources data; `Some(None)`: every replica is out;
    /// `Some(Some(uuid))`: the GPU NVIDIA's device plugin hands out next.
    pub next_gpu: Option<Option<String>>,
    /// The CUDA version the node's driver supports (`<prefix>/cuda-driver-version`); `None`
    /// when not published (an older agent, or NVML could not tell) or unreadable: such a
    /// node is not judged on CUDA.
    pub cuda: Option<CudaVersion>,
}

impl NodeVram {
    /// Whether every GPU carries the kubelet's replica figures.
    pub fn has_replicas(&self) -> bool {
        !self.gpus.is_empty()
            && self
                .gpus
                .iter()
                .all(|g| g.replicas_allocated.is_some() && g.replicas_allocatable.is_some())
    }

    /// Σ replicas allocated over the node's GPUs, when known.
    pub fn replicas_allocated(&self) -> Option<u32> {
        self.has_replicas()
            .then(|| self.gpus.iter().filter_map(|g| g.replicas_allocated).sum())
    }
}

/// What the annotations of one node amount to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// No gpu-warden annotations (no agent, agent off, or removed on shutdown).
    Missing,
    /// Present but unreadable; the text says what is wrong.
    Malformed(String),
    /// Readable figures.
    Known(NodeVram),
}

/// Reads the `vram` and `vram-observed-at` annotations under `prefix`.
pub fn read_node(annotations: &BTreeMap<String, String>, prefix: &str) -> NodeState {
    let keys = owned_keys(prefix);
    let vram_key = &keys.vram;
    let Some(text) = annotations.get(vram_key) else {
        return NodeState::Missing;
    };
    let doc = match parse_vram_json(text) {
        Ok(d) => d,
        Err(e) => return NodeState::Malformed(format!("{vram_key} is not readable JSON: {e}")),
    };
    if doc.v != 1 {
        return NodeState::Malformed(format!(
            "{vram_key} has schema version {} (this extender reads 1)",
            doc.v
        ));
    }
    // The separate key is the documented staleness signal; the JSON's copy is the fallback.
    let observed_key = &keys.observed_at;
    let observed = annotations
        .get(observed_key)
        .map(String::as_str)
        .unwrap_or(&doc.observed_at);
    let observed_at = match humantime::parse_rfc3339(observed) {
        Ok(t) => t,
        Err(e) => {
            return NodeState::Malformed(format!(
                "{observed_key} {observed:?} is not an RFC 3339 time: {e}"
            ))
        }
    };
    NodeState::Known(NodeVram {
        observed_at,
        gpus: doc.gpus,
        next_gpu: doc.next_gpu,
        cuda: annotations
            .get(&keys.cuda_driver_version)
            .and_then(|v| CudaVersion::parse(v).ok()),
    })
}
