//! The annotation values of a snapshot: per-GPU readings, quantized, summed and
//! serialised; and the JSON merge patches that set or remove them.

use super::schema::{owned_keys, GpuFigures, PerKey, ReplicaFigures, SCHEMA_VERSION};
use crate::model::cuda::CudaVersion;
use crate::model::pressure::Pressure;
use crate::model::replicas::ReplicaView;
use crate::model::snapshot::{GpuHealth, Snapshot, MIB};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The annotation values, before they are turned into strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationValues {
    /// Wall time of the snapshot, clamped to what RFC 3339 can spell.
    pub observed_at: SystemTime,
    /// GPUs with a memory reading, by index.
    pub gpus: Vec<GpuFigures>,
    /// Sum of the GPUs' quantized free MiB.
    pub free_mib: u64,
    /// Largest quantized free MiB of any GPU (0 with no GPU).
    pub max_free_mib: u64,
    /// With pod-resources data: the UUID of the GPU NVIDIA's device plugin hands the next
    /// replica out on (`Some(None)`: no GPU has a replica left). `None` without the data.
    pub next_gpu: Option<Option<String>>,
    /// The CUDA version the driver supports, when known (`<prefix>/cuda-driver-version`).
    pub cuda_driver_version: Option<CudaVersion>,
}

#[derive(Serialize)]
struct VramDoc<'a> {
    v: u32,
    #[serde(rename = "observedAt")]
    observed_at: &'a str,
    gpus: &'a [GpuFigures],
    #[serde(rename = "nextGpuUuid", skip_serializing_if = "Option::is_none")]
    next_gpu: Option<Option<&'a str>>,
}

impl AnnotationValues {
    /// `vram-observed-at`: RFC 3339, seconds precision, UTC (`…Z`).
    pub fn observed_at_rfc3339(&self) -> String {
        humantime::format_rfc3339_seconds(self.observed_at).to_string()
    }

    /// The `vram` JSON document, keys in the documented order.
    pub fn vram_json(&self) -> String {
        let observed = self.observed_at_rfc3339();
        let doc = VramDoc {
            v: SCHEMA_VERSION,
            observed_at: &observed,
            gpus: &self.gpus,
            next_gpu: self.next_gpu.as_ref().map(Option::as_deref),
        };
        // Plain structs of strings and integers always serialise; the fallback keeps the
        // annotation parseable should that ever change.
        serde_json::to_string(&doc).unwrap_or_else(|_| {
            format!(r#"{{"v":{SCHEMA_VERSION},"observedAt":"{observed}","gpus":[]}}"#)
        })
    }

    /// Each key's value, `None` for one not written (the CUDA version the driver does not
    /// tell).
    pub fn per_key(&self) -> PerKey<Option<String>> {
        PerKey {
            free: Some(self.free_mib.to_string()),
            max_free: Some(self.max_free_mib.to_string()),
            vram: Some(self.vram_json()),
            observed_at: Some(self.observed_at_rfc3339()),
            cuda_driver_version: self.cuda_driver_version.map(|c| c.to_string()),
        }
    }

    /// The annotations (the CUDA version's only when known), keyed by full name.
    pub fn to_annotations(&self, prefix: &str) -> BTreeMap<String, String> {
        owned_keys(prefix)
            .into_array()
            .into_iter()
            .zip(self.per_key().into_array())
            .filter_map(|(key, value)| Some((key, value?)))
            .collect()
    }
}

/// A GPU's exact reading, kept beside the quantized figures for the hysteresis test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reading {
    pub(super) index: u32,
    pub(super) uuid: String,
    pub(super) total_mib: u64,
    pub(super) used_mib: u64,
    pub(super) free_mib: u64,
    pub(super) pressure: Pressure,
    pub(super) replicas: Option<ReplicaFigures>,
    /// The node's driver's CUDA version (the same on every GPU): carried here so every
    /// path from readings to values publishes it.
    pub(super) cuda: Option<CudaVersion>,
}

pub(super) fn readings(
    snap: &Snapshot,
    pressure: &BTreeMap<u32, Pressure>,
    replicas: Option<&ReplicaView>,
) -> Vec<Reading> {
    let mut out: Vec<Reading> = snap
        .gpus
        .iter()
        .filter(|g| !matches!(g.health, GpuHealth::Lost(_)))
        .filter_map(|g| {
            let m = g.memory?;
            // Floor, as DCGM_FI_DEV_FB_* do: with a quantum of 1 the figures equal the metrics.
            Some(Reading {
                index: g.id.index,
                uuid: g.id.uuid.clone(),
                total_mib: m.total / MIB,
                used_mib: m.used / MIB,
                free_mib: m.free / MIB,
                pressure: pressure.get(&g.id.index).copied().unwrap_or_default(),
                replicas: replicas.map(|v| {
                    let (allocated, _, declared_mib) = v.gpu(&g.id.uuid);
                    let allocatable = v.allocatable(&g.id.uuid);
                    ReplicaFigures {
                        allocated,
                        allocatable,
                        declared_mib,
                    }
                }),
                cuda: snap.cuda_driver_version,
            })
        })
        .collect();
    out.sort_by_key(|r| r.index);
    out
}

/// The GPU the device plugin hands out next, among those NVML sees (ties by NVML index).
pub(super) fn next_gpu(snap: &Snapshot, replicas: Option<&ReplicaView>) -> Option<Option<String>> {
    // Without the allocatable figures which GPU is next is not known: absent, not null.
    let replicas = replicas.filter(|v| v.allocations.allocatable_known());
    replicas.map(|v| {
        let index_of = |uuid: &str| {
            snap.gpus
                .iter()
                .find(|g| g.id.uuid == uuid)
                .map(|g| g.id.index)
        };
        v.allocations.next_gpu(index_of).map(str::to_string)
    })
}

pub(super) fn quantize(
    readings: &[Reading],
    quantum_mib: u64,
    wall: SystemTime,
    next_gpu: Option<Option<String>>,
) -> AnnotationValues {
    let q = quantum_mib.max(1);
    let gpus: Vec<GpuFigures> = readings
        .iter()
        .map(|r| GpuFigures {
            index: r.index,
            uuid: r.uuid.clone(),
            total_mib: r.total_mib,
            used_mib: r.used_mib.div_ceil(q).saturating_mul(q).min(r.total_mib),
            free_mib: r.free_mib / q * q,
            pressure: r.pressure,
            replicas_allocated: r.replicas.map(|f| f.allocated),
            replicas_allocatable: r.replicas.and_then(|f| f.allocatable),
            declared_mib: r.replicas.map(|f| f.declared_mib),
        })
        .collect();
    AnnotationValues {
        observed_at: clamp_wall(wall),
        free_mib: gpus.iter().map(|g| g.free_mib).sum(),
        max_free_mib: gpus.iter().map(|g| g.free_mib).max().unwrap_or(0),
        gpus,
        next_gpu,
        cuda_driver_version: readings.first().and_then(|r| r.cuda),
    }
}

/// humantime refuses (panics on) times before 1970 and after 9999; a broken host clock
/// must not take the annotator down.
fn clamp_wall(t: SystemTime) -> SystemTime {
    const LAST: Duration = Duration::from_secs(253_402_300_799);
    match t.duration_since(UNIX_EPOCH) {
        Err(_) => UNIX_EPOCH,
        Ok(d) if d > LAST => UNIX_EPOCH + LAST,
        Ok(_) => t,
    }
}

/// The annotation values of `snap`, with `pressure` per GPU index (missing means `none`)
/// and figures quantized to `quantum_mib` (0 is treated as 1).
pub fn annotation_values(
    snap: &Snapshot,
    pressure: &BTreeMap<u32, Pressure>,
    quantum_mib: u64,
) -> AnnotationValues {
    annotation_values_with(snap, pressure, None, quantum_mib)
}

/// As [`annotation_values`], with the kubelet's pod-resources figures when there are any.
pub fn annotation_values_with(
    snap: &Snapshot,
    pressure: &BTreeMap<u32, Pressure>,
    replicas: Option<&ReplicaView>,
    quantum_mib: u64,
) -> AnnotationValues {
    quantize(
        &readings(snap, pressure, replicas),
        quantum_mib,
        snap.wall,
        next_gpu(snap, replicas),
    )
}

/// A JSON merge patch that sets (or, with `null`, removes) exactly these annotations and
/// touches nothing else on the Node.
pub fn merge_patch<V: Into<Value>>(annotations: impl IntoIterator<Item = (String, V)>) -> Value {
    let map: Map<String, Value> = annotations
        .into_iter()
        .map(|(k, v)| (k, v.into()))
        .collect();
    let mut metadata = Map::new();
    metadata.insert("annotations".into(), Value::Object(map));
    let mut root = Map::new();
    root.insert("metadata".into(), Value::Object(metadata));
    Value::Object(root)
}

/// The merge patch that deletes every key we own (and leaves every other annotation).
pub fn removal_patch(prefix: &str) -> Value {
    merge_patch(owned_keys(prefix).into_array().map(|k| (k, Value::Null)))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use serde_json::Value;

    #[test]
    fn replica_figures_are_additive_keys() {
        let s = snap_at(1.0, vec![gpu(0, 10_340, 2048), gpu(1, 10_340, 0)]);
        let without = annotation_values(&s, &none(), Q).vram_json();
        assert!(
            !without.contains("replicas") && !without.contains("nextGpu"),
            "{without}"
        );
        assert_eq!(
            annotation_values_with(&s, &none(), None, Q).vram_json(),
            without
        );
        let view = replica_view(1);
        let with = annotation_values_with(&s, &none(), Some(&view), Q).vram_json();
        let g0 = r#""pressure":"none","replicasAllocated":3,"replicasAllocatable":4,"declaredMiB":12288}"#;
        assert!(with.contains(g0), "{with}");
        assert!(
            with.ends_with(r#"],"nextGpuUuid":"GPU-00000001-0000-0000-0000-000000000000"}"#),
            "the device plugin picks the GPU with the fewest replicas out: {with}"
        );
        // Stripping the new keys gives back the document without the feature.
        let mut doc: Value = serde_json::from_str(&with).unwrap();
        doc.as_object_mut().unwrap().remove("nextGpuUuid");
        for g in doc["gpus"].as_array_mut().unwrap() {
            let g = g.as_object_mut().unwrap();
            for k in ["replicasAllocated", "replicasAllocatable", "declaredMiB"] {
                assert!(g.remove(k).is_some(), "{k}");
            }
        }
        assert_eq!(doc, serde_json::from_str::<Value>(&without).unwrap());
        // Every replica out: no next GPU, said as null.
        let full = ReplicaView {
            allocations: Allocations {
                gpus: view
                    .allocations
                    .gpus
                    .iter()
                    .map(|(u, g)| {
                        (
                            u.clone(),
                            GpuReplicas {
                                allocated: 4,
                                ..g.clone()
                            },
                        )
                    })
                    .collect(),
                ..Default::default()
            },
            ..view.clone()
        };
        let json = annotation_values_with(&s, &none(), Some(&full), Q).vram_json();
        assert!(json.ends_with(r#"],"nextGpuUuid":null}"#), "{json}");
    }

    #[test]
    fn quantization_table() {
        type Row = (&'static [(u64, u64)], u64, &'static [(u64, u64)], u64, u64);
        let rows: &[Row] = &[
            // one GPU, exact multiples
            (&[(10_340, 2048)], 256, &[(2048, 8192)], 8192, 8192),
            // free 8191 → 7936; used 2049 → 2304
            (&[(10_340, 2049)], 256, &[(2304, 7936)], 7936, 7936),
            // free 255 → 0; used rounds up but never past total
            (&[(1_000, 645)], 256, &[(768, 0)], 0, 0),
            (&[(1_000, 900)], 256, &[(1_000, 0)], 0, 0),
            // quantum 1: figures are the exact MiB (match DCGM_FI_DEV_FB_*)
            (&[(10_340, 2049)], 1, &[(2049, 8191)], 8191, 8191),
            // two GPUs: sum of quantized figures (7936 + 3840), max over GPUs
            (
                &[(10_340, 2049), (10_340, 6300)],
                256,
                &[(2304, 7936), (6400, 3840)],
                11_776,
                7936,
            ),
            // quantum larger than a GPU
            (&[(24_000, 1000)], 32_768, &[(24_000, 0)], 0, 0),
        ];
        for (i, &(gpus, q, want, sum, max)) in rows.iter().enumerate() {
            let s = snap_at(
                0.0,
                gpus.iter()
                    .enumerate()
                    .map(|(n, &(t, u))| gpu(n as u32, t, u))
                    .collect(),
            );
            let v = annotation_values(&s, &none(), q);
            let got: Vec<(u64, u64)> = v.gpus.iter().map(|g| (g.used_mib, g.free_mib)).collect();
            assert_eq!(got, want, "row {i}");
            assert_eq!((v.free_mib, v.max_free_mib), (sum, max), "row {i}");
            for g in &v.gpus {
                assert_eq!(g.free_mib % q, 0, "row {i}");
            }
        }
    }

    #[test]
    fn sub_mib_bytes_are_floored_like_the_metrics() {
        let mut g = gpu(0, 1024, 0);
        g.memory = Some(MemoryInfo {
            total: 1024 * MIB,
            used: 10 * MIB + 1,
            free: 1014 * MIB - 1,
            reserved: 0,
        });
        let v = annotation_values(&snap_at(0.0, vec![g]), &none(), 1);
        assert_eq!((v.gpus[0].used_mib, v.gpus[0].free_mib), (10, 1013));
    }

    #[test]
    fn gpus_without_a_memory_reading_are_left_out() {
        let mut lost = gpu(1, 10_340, 0);
        lost.health = GpuHealth::Lost("GPU is lost".into());
        let mut degraded = GpuSample::empty(gpu(2, 10_340, 0).id, GpuHealth::Degraded("x".into()));
        degraded.gpu_temp_c = Some(40);
        let s = snap_at(
            0.0,
            vec![gpu(0, 10_340, 2048), lost, degraded, gpu(3, 10_340, 0)],
        );
        let v = annotation_values(&s, &none(), Q);
        let idx: Vec<u32> = v.gpus.iter().map(|g| g.index).collect();
        assert_eq!(idx, vec![0, 3]);
        assert_eq!(v.free_mib, 8192 + 10_240);
        assert_eq!(v.max_free_mib, 10_240);
        // A node whose GPUs all went away publishes zeros and an empty list, not stale figures.
        let v = annotation_values(&snap_at(0.0, vec![]), &none(), Q);
        assert_eq!((v.free_mib, v.max_free_mib), (0, 0));
        assert!(v.vram_json().ends_with(r#""gpus":[]}"#));
    }

    #[test]
    fn exact_format_of_the_four_values() {
        let s = snap_at(0.75, vec![gpu(0, 143_771, 2049)]);
        let pr = BTreeMap::from([(0, Pressure::Soft)]);
        let a = annotation_values(&s, &pr, Q).to_annotations("gpu-warden.io");
        assert_eq!(a.len(), 4);
        assert_eq!(a["gpu-warden.io/vram-free-mib"], "141568");
        assert_eq!(a["gpu-warden.io/vram-max-free-mib"], "141568");
        // Seconds precision, UTC, `Z`: the sub-second part is cut, not rounded.
        assert_eq!(a["gpu-warden.io/vram-observed-at"], "2026-05-28T20:26:40Z");
        assert_eq!(
            a["gpu-warden.io/vram"],
            r#"{"v":1,"observedAt":"2026-05-28T20:26:40Z","gpus":[{"index":0,"uuid":"GPU-00000000-0000-0000-0000-000000000000","totalMiB":143771,"usedMiB":2304,"freeMiB":141568,"pressure":"soft"}]}"#
        );
    }

    #[test]
    fn json_with_eight_gpus_is_ordered_and_parseable() {
        let gpus: Vec<GpuSample> = (0..8u32)
            .rev()
            .map(|i| gpu(i, 81_559, 1000 * u64::from(i)))
            .collect();
        let pr: BTreeMap<u32, Pressure> = [(2, Pressure::Soft), (5, Pressure::Hard)].into();
        let v = annotation_values(&snap_at(1.0, gpus), &pr, Q);
        let text = v.vram_json();
        // Well under the 256 KiB the API server allows for all annotations together.
        assert!(text.len() < 2048, "{}", text.len());
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["v"], 1);
        let list = doc["gpus"].as_array().unwrap();
        assert_eq!(list.len(), 8);
        let mut sum = 0;
        for (i, g) in list.iter().enumerate() {
            assert_eq!(g["index"], i as u64);
            let keys: std::collections::BTreeSet<&str> =
                g.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            let want: std::collections::BTreeSet<&str> = [
                "index", "uuid", "totalMiB", "usedMiB", "freeMiB", "pressure",
            ]
            .into();
            assert_eq!(keys, want);
            sum += g["freeMiB"].as_u64().unwrap();
            let want = match i {
                2 => "soft",
                5 => "hard",
                _ => "none",
            };
            assert_eq!(g["pressure"], want);
        }
        assert_eq!(sum, v.free_mib);
        // Key order as written: v, observedAt, gpus; within a GPU as docs/annotations.md lists them.
        assert!(text.starts_with(r#"{"v":1,"observedAt":"#), "{text}");
        let first = &text[text.find(r#"{"index":0"#).unwrap()..];
        let order = [
            "\"index\"",
            "\"uuid\"",
            "\"totalMiB\"",
            "\"usedMiB\"",
            "\"freeMiB\"",
            "\"pressure\"",
        ];
        let pos: Vec<usize> = order.iter().map(|k| first.find(k).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{first}");
    }

    #[test]
    fn observed_at_survives_a_broken_host_clock() {
        let mut s = snap_at(0.0, vec![]);
        s.wall = UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(
            annotation_values(&s, &none(), Q).observed_at_rfc3339(),
            "1970-01-01T00:00:00Z"
        );
        s.wall = UNIX_EPOCH + Duration::from_secs(300_000_000_000);
        assert_eq!(
            annotation_values(&s, &none(), Q).observed_at_rfc3339(),
            "9999-12-31T23:59:59Z"
        );
    }

    #[test]
    fn patches_touch_only_our_keys_and_removal_nulls_them() {
        let mut p = AnnotationPlanner::new(AnnotationConfig {
            prefix: "example.com".into(),
            ..cfg()
        });
        let out = p
            .plan(&snap_at(0.0, vec![gpu(0, 10_340, 0)]), &none(), secs(0.0))
            .unwrap();
        let ann = out.body["metadata"]["annotations"].as_object().unwrap();
        assert_eq!(out.body.as_object().unwrap().len(), 1);
        assert_eq!(out.body["metadata"].as_object().unwrap().len(), 1);
        let mut keys: Vec<&String> = ann.keys().collect();
        keys.sort();
        // Every key but the CUDA version's, which this snapshot does not know.
        let all = p.config().keys();
        let mut want: Vec<String> = all
            .iter()
            .filter(|k| **k != all.cuda_driver_version)
            .cloned()
            .collect();
        want.sort();
        assert_eq!(keys, want.iter().collect::<Vec<_>>());
        assert!(ann.values().all(|v| v.is_string()));
        assert_eq!(
            removal_patch("gpu-warden.io"),
            json!({"metadata": {"annotations": {
                "gpu-warden.io/vram-free-mib": null,
                "gpu-warden.io/vram-max-free-mib": null,
                "gpu-warden.io/vram": null,
                "gpu-warden.io/vram-observed-at": null,
                "gpu-warden.io/cuda-driver-version": null,
            }}})
        );
    }

    #[test]
    fn the_cuda_version_is_written_when_the_driver_tells_it() {
        let mut s = snap_at(0.0, vec![gpu(0, 10_340, 0)]);
        let key = "gpu-warden.io/cuda-driver-version";
        let a = annotation_values(&s, &none(), Q).to_annotations("gpu-warden.io");
        assert!(!a.contains_key(key), "{a:?}");
        s.cuda_driver_version = Some(crate::model::cuda::CudaVersion {
            major: 12,
            minor: 8,
        });
        let a = annotation_values(&s, &none(), Q).to_annotations("gpu-warden.io");
        assert_eq!(a.get(key).map(String::as_str), Some("12.8"));
        assert_eq!(a.len(), 5);
    }

    /// Every key of the set is written when its value is known, and every one is removed:
    /// a key added to `PerKey` that the writer or the removal forgot fails here.
    #[test]
    fn every_owned_key_is_written_and_removed() {
        let mut s = snap_at(0.0, vec![gpu(0, 10_340, 0)]);
        s.cuda_driver_version = Some(crate::model::cuda::CudaVersion {
            major: 12,
            minor: 8,
        });
        let keys = owned_keys("gpu-warden.io");
        let written = annotation_values(&s, &none(), Q).to_annotations("gpu-warden.io");
        for key in keys.iter() {
            assert!(written.contains_key(key), "{key} not written: {written:?}");
        }
        assert_eq!(written.len(), keys.iter().count());
        let removal = removal_patch("gpu-warden.io");
        let removed = removal["metadata"]["annotations"].as_object().unwrap();
        for key in keys.iter() {
            assert_eq!(removed.get(key), Some(&Value::Null), "{key} not removed");
        }
        assert_eq!(removed.len(), keys.iter().count());
    }
}
