//! The free-VRAM Node annotations of docs/annotations.md: what to publish, and when.
//!
//! Pure: no I/O, no async, time is handed in. [`annotation_values`] turns a snapshot and
//! the guard's per-GPU pressure into the annotation values; [`AnnotationPlanner`]
//! decides when they are worth a PATCH. The cluster's API server is shared by every node,
//! so the planner's job is mostly to say *no*: values are quantized, small moves are
//! absorbed by hysteresis, and patches are spaced by a minimum interval, except when a
//! GPU's pressure rises — the one piece of news a scheduler must get at once.
//!
//! Decisions where the design is silent (documented for consumers in `docs/annotations.md`):
//! - A GPU without a memory reading (lost, or its memory read failed this poll) is left
//!   out of the sums *and* of the `gpus` list, so every list entry carries all figures
//!   and the list's `freeMiB` add up to `vram-free-mib`.
//! - Per-GPU figures are quantized too: `freeMiB` down, `usedMiB` up (both conservative for
//!   a scheduler), `totalMiB` exact. `vram-free-mib` is the sum of the quantized `freeMiB`,
//!   `vram-max-free-mib` their maximum.
//! - Hysteresis: a GPU's figures are re-published when its free memory drops below what
//!   the annotation claims (never over-promise) or rises 1.5 quanta above it (so noise
//!   around a quantum boundary never flaps).
//! - A pressure *rise* goes at once; a pressure *fall* waits for the minimum interval, so
//!   a GPU hovering at a threshold cannot turn into a patch per poll.
//! - A heartbeat needs a snapshot newer than the last published one: re-sending an old
//!   observation would hide that the agent stopped polling.
//! - The kubelet's pod-resources figures (replicas allocated/allocatable, declared MiB per
//!   GPU, the GPU the device plugin hands out next) are additive keys present only while
//!   that data is there; without it the document is exactly what it was before the feature.
//!   A change of any of them is a reason to patch (subject to the minimum interval): a
//!   scheduler needs to see committed memory move.
//!
//! Three parts: [`schema`] (key names and the `vram` JSON's types, which the extender reads),
//! [`values`] (a snapshot's values and the merge patches) and [`planner`] (the write
//! discipline).

pub mod budget;
pub mod channel;
pub mod planner;
pub mod schema;
pub mod values;

pub use budget::*;
pub use channel::*;
pub use planner::*;
pub use schema::*;
pub use values::*;

/// Builders the three parts' tests share.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    pub(crate) use crate::model::pressure::Pressure;
    pub(crate) use crate::model::replicas::{Allocations, GpuReplicas, ReplicaView};
    pub(crate) use crate::model::snapshot::{
        GpuHealth, GpuIdentity, GpuSample, MemoryInfo, Snapshot, MIB,
    };
    pub(crate) use serde_json::json;
    pub(crate) use std::collections::BTreeMap;
    pub(crate) use std::time::{Duration, UNIX_EPOCH};

    pub(crate) const Q: u64 = 256;

    pub(crate) fn gpu(index: u32, total_mib: u64, used_mib: u64) -> GpuSample {
        let mut g = GpuSample::empty(
            GpuIdentity {
                index,
                uuid: format!("GPU-{index:08x}-0000-0000-0000-000000000000"),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + index),
                device: format!("nvidia{index}"),
                model: "NVIDIA H200".into(),
            },
            GpuHealth::Ok,
        );
        // 100 MiB reserved, as real boards hold some back.
        let reserved = 100;
        g.memory = Some(MemoryInfo {
            total: total_mib * MIB,
            used: used_mib * MIB,
            free: (total_mib - reserved - used_mib) * MIB,
            reserved: reserved * MIB,
        });
        g
    }

    pub(crate) fn snap_at(secs: f64, gpus: Vec<GpuSample>) -> Snapshot {
        let at = Duration::from_secs_f64(secs);
        Snapshot {
            seq: (secs * 1000.0) as u64,
            at,
            wall: UNIX_EPOCH + Duration::from_secs(1_780_000_000) + at,
            driver_version: "580.95.05".into(),
            cuda_driver_version: None,
            gpus,
            processes: vec![],
            util_fresh: true,
            errors: vec![],
        }
    }

    pub(crate) fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    pub(crate) fn none() -> BTreeMap<u32, Pressure> {
        BTreeMap::new()
    }

    /// The cadence these tests were written for (a 60 s heartbeat, 5 s apart), as an agent
    /// without a Lease would run.
    pub(crate) fn cfg() -> AnnotationConfig {
        AnnotationConfig {
            heartbeat: Duration::from_secs(60),
            min_interval: Duration::from_secs(5),
            ..AnnotationConfig::default()
        }
    }

    /// Plans and immediately reports success, as a healthy API server would.
    pub(crate) fn step(
        p: &mut AnnotationPlanner,
        s: &Snapshot,
        pr: &BTreeMap<u32, Pressure>,
    ) -> Option<PatchReason> {
        let out = p.plan(s, pr, s.at)?;
        p.patch_succeeded(s.at);
        Some(out.reason)
    }

    /// Two GPUs time-sliced 4 ways: GPU 0 has 3 replicas out, GPU 1 has 1.
    pub(crate) fn replica_view(g1_allocated: u32) -> ReplicaView {
        let uuid = |i: u32| format!("GPU-{i:08x}-0000-0000-0000-000000000000");
        let mut a = Allocations::default();
        for (i, allocated) in [(0, 3), (1, g1_allocated)] {
            a.gpus.insert(
                uuid(i),
                GpuReplicas {
                    allocatable: 4,
                    allocated,
                    pods: Default::default(),
                },
            );
        }
        ReplicaView {
            allocations: a,
            declared_mib: [(uuid(0), 12_288), (uuid(1), 4096)].into(),
        }
    }
}
