//! The free-VRAM Node annotations of docs/annotations.md: what to publish, and when.
//!
//! Pure: no I/O, no async, time is handed in. [`annotation_values`] turns a snapshot and
//! the guard's per-GPU pressure into the four annotation values; [`AnnotationPlanner`]
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

use crate::model::pressure::Pressure;
use crate::model::replicas::ReplicaView;
use crate::model::snapshot::{GpuHealth, Snapshot, MIB};
use crate::model::units::DnsNameError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
/// The `v` field of the `vram` JSON; bumped only on an incompatible change.
pub const SCHEMA_VERSION: u32 = 1;
/// How early a poll may come and still carry a due heartbeat, at most: 1 % of the
/// heartbeat, capped at this (polls wobble by milliseconds around their schedule).
pub const HEARTBEAT_SLACK: std::time::Duration = std::time::Duration::from_millis(250);

/// How the annotations are named and how often they may be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationConfig {
    /// Key prefix, a DNS subdomain (`<prefix>/vram-free-mib`, …).
    pub prefix: String,
    /// Values move in steps of this many MiB.
    pub quantum_mib: u64,
    /// Re-publish at least this often, so consumers can judge staleness.
    pub heartbeat: Duration,
    /// Never patch more often than this, except for a pressure rise.
    pub min_interval: Duration,
}

impl Default for AnnotationConfig {
    fn default() -> Self {
        AnnotationConfig {
            prefix: DEFAULT_PREFIX.to_string(),
            quantum_mib: 256,
            heartbeat: Duration::from_secs(60),
            min_interval: Duration::from_secs(5),
        }
    }
}

/// An unusable [`AnnotationConfig`]; messages name the command-line flag at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationConfigError {
    /// The prefix is not a DNS subdomain, so the API server would refuse every key.
    #[error("--annotation-prefix {prefix:?}: {reason}; it must be a DNS subdomain (lowercase letters, digits, '-' and '.', each part 1–63 characters starting and ending with a letter or digit, at most 253 characters), e.g. gpu-warden.io")]
    Prefix {
        /// The prefix given.
        prefix: String,
        /// What is wrong with it.
        reason: DnsNameError,
    },
    /// A zero quantum would make every MiB a reason to patch.
    #[error("--annotation-quantum-mib must be at least 1")]
    Quantum,
    /// A zero heartbeat would patch on every poll.
    #[error("--annotation-heartbeat must be longer than zero")]
    Heartbeat,
    /// The heartbeat could never be honoured.
    #[error("--annotation-heartbeat ({heartbeat}) must not be shorter than --annotation-min-interval ({min_interval})")]
    HeartbeatBelowMinInterval {
        /// The heartbeat given, human-readable.
        heartbeat: String,
        /// The minimum interval given, human-readable.
        min_interval: String,
    },
}

impl AnnotationConfig {
    /// Checks the configuration; the agent refuses to start on an error.
    pub fn validate(&self) -> Result<(), AnnotationConfigError> {
        if let Err(reason) = crate::model::units::check_dns_subdomain(&self.prefix) {
            return Err(AnnotationConfigError::Prefix {
                prefix: self.prefix.clone(),
                reason,
            });
        }
        if self.quantum_mib == 0 {
            return Err(AnnotationConfigError::Quantum);
        }
        if self.heartbeat.is_zero() {
            return Err(AnnotationConfigError::Heartbeat);
        }
        if self.heartbeat < self.min_interval {
            return Err(AnnotationConfigError::HeartbeatBelowMinInterval {
                heartbeat: humantime::format_duration(self.heartbeat).to_string(),
                min_interval: humantime::format_duration(self.min_interval).to_string(),
            });
        }
        Ok(())
    }

    /// The full key `<prefix>/<name>`.
    pub fn key(&self, name: &str) -> String {
        annotation_key(&self.prefix, name)
    }

    /// The four keys this agent owns, in the order of docs/annotations.md.
    pub fn keys(&self) -> [String; 4] {
        owned_keys(&self.prefix)
    }
}

fn annotation_key(prefix: &str, name: &str) -> String {
    format!("{prefix}/{name}")
}

fn owned_keys(prefix: &str) -> [String; 4] {
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
    fn replicas(&self) -> Option<ReplicaFigures> {
        Some(ReplicaFigures {
            allocated: self.replicas_allocated?,
            allocatable: self.replicas_allocatable,
            declared_mib: self.declared_mib?,
        })
    }
}

/// One GPU's pod-resources figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReplicaFigures {
    allocated: u32,
    /// None when the kubelet does not serve `GetAllocatableResources`.
    allocatable: Option<u32>,
    declared_mib: u64,
}

/// The four annotation values, before they are turned into strings.
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

    /// The four annotations, keyed by full name.
    pub fn to_annotations(&self, prefix: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (annotation_key(prefix, KEY_FREE), self.free_mib.to_string()),
            (
                annotation_key(prefix, KEY_MAX_FREE),
                self.max_free_mib.to_string(),
            ),
            (annotation_key(prefix, KEY_VRAM), self.vram_json()),
            (
                annotation_key(prefix, KEY_OBSERVED_AT),
                self.observed_at_rfc3339(),
            ),
        ])
    }
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

/// A GPU's exact reading, kept beside the quantized figures for the hysteresis test.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reading {
    index: u32,
    uuid: String,
    total_mib: u64,
    used_mib: u64,
    free_mib: u64,
    pressure: Pressure,
    replicas: Option<ReplicaFigures>,
}

fn readings(
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
            })
        })
        .collect();
    out.sort_by_key(|r| r.index);
    out
}

/// The GPU the device plugin hands out next, among those NVML sees (ties by NVML index).
fn next_gpu(snap: &Snapshot, replicas: Option<&ReplicaView>) -> Option<Option<String>> {
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

fn quantize(
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

/// The merge patch that deletes our four keys (and leaves every other annotation).
pub fn removal_patch(prefix: &str) -> Value {
    merge_patch(owned_keys(prefix).map(|k| (k, Value::Null)))
}

/// Why the planner asked for a patch (for logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchReason {
    /// Nothing has been published yet (or nothing successfully).
    Initial,
    /// A GPU's pressure rose: sent at once, regardless of the minimum interval.
    PressureRaised,
    /// A GPU's pressure fell.
    PressureEased,
    /// A GPU appeared, disappeared, or lost or regained its memory reading.
    GpusChanged,
    /// The kubelet's replica figures (or the next GPU) changed, or the data came or went.
    ReplicasChanged,
    /// A GPU's free memory moved by at least a quantum.
    FreeMoved,
    /// Nothing moved, but the heartbeat is due.
    Heartbeat,
}

impl PatchReason {
    /// A short label for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            PatchReason::Initial => "initial",
            PatchReason::PressureRaised => "pressure-raised",
            PatchReason::PressureEased => "pressure-eased",
            PatchReason::GpusChanged => "gpus-changed",
            PatchReason::ReplicasChanged => "replicas-changed",
            PatchReason::FreeMoved => "free-moved",
            PatchReason::Heartbeat => "heartbeat",
        }
    }
}

/// One planned patch.
#[derive(Debug, Clone, PartialEq)]
pub struct AnnotationPatch {
    /// The JSON merge-patch body: `{"metadata":{"annotations":{…our four keys…}}}`.
    pub body: Value,
    /// The values it carries.
    pub values: AnnotationValues,
    /// Why now.
    pub reason: PatchReason,
}

/// What a patch carried, kept until the API server confirms it.
#[derive(Debug, Clone)]
struct Sent {
    gpus: Vec<GpuFigures>,
    next_gpu: Option<Option<String>>,
    snapshot_at: Duration,
    planned_at: Duration,
}

/// The write discipline of docs/annotations.md as a state machine over monotonic time.
///
/// Protocol: call [`plan`](Self::plan) with each new snapshot (and when
/// [`next_due`](Self::next_due) passes); when it returns a patch, send it and report
/// [`patch_succeeded`](Self::patch_succeeded) or [`patch_failed`](Self::patch_failed).
/// Only confirmed values count as published, so a failed patch is planned again (with the
/// then-current values) instead of being lost; backing off between attempts is the
/// caller's job.
#[derive(Debug, Clone)]
pub struct AnnotationPlanner {
    cfg: AnnotationConfig,
    /// What the API server holds, as far as we know.
    applied: Option<Sent>,
    in_flight: Option<Sent>,
    last_attempt: Option<Duration>,
    last_success: Option<Duration>,
    gated_until: Option<Duration>,
}

impl AnnotationPlanner {
    /// A planner that has published nothing yet.
    pub fn new(cfg: AnnotationConfig) -> Self {
        AnnotationPlanner {
            cfg,
            applied: None,
            in_flight: None,
            last_attempt: None,
            last_success: None,
            gated_until: None,
        }
    }

    /// The configuration it plans with.
    pub fn config(&self) -> &AnnotationConfig {
        &self.cfg
    }

    /// Monotonic time of the last confirmed patch.
    pub fn last_success(&self) -> Option<Duration> {
        self.last_success
    }

    /// When a change held back by the minimum interval may go: the caller should call
    /// [`plan`](Self::plan) again then, even if no new snapshot arrived.
    pub fn next_due(&self) -> Option<Duration> {
        self.gated_until
    }

    /// Decides whether `snap` (with the guard's `pressure`) is worth a patch at monotonic
    /// time `now`. Returns `None` while a planned patch awaits its outcome.
    pub fn plan(
        &mut self,
        snap: &Snapshot,
        pressure: &BTreeMap<u32, Pressure>,
        now: Duration,
    ) -> Option<AnnotationPatch> {
        self.plan_with_replicas(snap, pressure, None, now)
    }

    /// As [`plan`](Self::plan), with the kubelet's pod-resources figures when there are any.
    pub fn plan_with_replicas(
        &mut self,
        snap: &Snapshot,
        pressure: &BTreeMap<u32, Pressure>,
        replicas: Option<&ReplicaView>,
        now: Duration,
    ) -> Option<AnnotationPatch> {
        if self.in_flight.is_some() {
            return None;
        }
        let current = readings(snap, pressure, replicas);
        let next = next_gpu(snap, replicas);
        let reason = self.reason(&current, &next, snap.at, now);
        let Some(reason) = reason else {
            self.gated_until = None;
            return None;
        };
        if reason != PatchReason::PressureRaised {
            if let Some(last) = self.last_attempt {
                let free_at = last.saturating_add(self.cfg.min_interval);
                if now < free_at {
                    self.gated_until = Some(free_at);
                    return None;
                }
            }
        }
        self.gated_until = None;
        let values = quantize(&current, self.cfg.quantum_mib, snap.wall, next);
        let body = merge_patch(values.to_annotations(&self.cfg.prefix));
        self.in_flight = Some(Sent {
            gpus: values.gpus.clone(),
            next_gpu: values.next_gpu.clone(),
            snapshot_at: snap.at,
            planned_at: now,
        });
        self.last_attempt = Some(now);
        Some(AnnotationPatch {
            body,
            values,
            reason,
        })
    }

    fn reason(
        &self,
        current: &[Reading],
        next_gpu: &Option<Option<String>>,
        snapshot_at: Duration,
        now: Duration,
    ) -> Option<PatchReason> {
        let Some(applied) = &self.applied else {
            return Some(PatchReason::Initial);
        };
        let same_gpus = current.len() == applied.gpus.len()
            && current
                .iter()
                .zip(&applied.gpus)
                .all(|(c, a)| c.index == a.index && c.uuid == a.uuid && c.total_mib == a.total_mib);
        if !same_gpus {
            return Some(PatchReason::GpusChanged);
        }
        let pairs = || current.iter().zip(&applied.gpus);
        if pairs().any(|(c, a)| c.pressure > a.pressure) {
            return Some(PatchReason::PressureRaised);
        }
        if pairs().any(|(c, a)| c.pressure != a.pressure) {
            return Some(PatchReason::PressureEased);
        }
        if pairs().any(|(c, a)| c.replicas != a.replicas()) || *next_gpu != applied.next_gpu {
            return Some(PatchReason::ReplicasChanged);
        }
        let q = self.cfg.quantum_mib.max(1);
        let rise = q.saturating_add(q / 2);
        if pairs()
            .any(|(c, a)| c.free_mib < a.free_mib || c.free_mib >= a.free_mib.saturating_add(rise))
        {
            return Some(PatchReason::FreeMoved);
        }
        // A heartbeat can only go out with a poll, and polls come a few ms early or late
        // against the last one: without slack, a 60 s heartbeat on 1 s polls went out at
        // 61 s about every other time.
        let slack = HEARTBEAT_SLACK.min(self.cfg.heartbeat / 100);
        let heartbeat_due = self
            .last_success
            .is_none_or(|t| now.saturating_add(slack).saturating_sub(t) >= self.cfg.heartbeat);
        if heartbeat_due && snapshot_at > applied.snapshot_at {
            return Some(PatchReason::Heartbeat);
        }
        None
    }

    /// The patch last planned was applied; its values are now what consumers see.
    pub fn patch_succeeded(&mut self, _now: Duration) {
        if let Some(sent) = self.in_flight.take() {
            // The heartbeat counts from when the values were taken, not from when the
            // API server answered, so a slow server does not stretch the cadence.
            self.last_success = Some(sent.planned_at);
            self.applied = Some(sent);
        }
    }

    /// The patch last planned was not applied; whatever it carried is still owed.
    pub fn patch_failed(&mut self, _now: Duration) {
        self.in_flight = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::replicas::{Allocations, GpuReplicas};
    use crate::model::snapshot::{GpuIdentity, GpuSample, MemoryInfo};
    use serde_json::json;

    const Q: u64 = 256;

    fn gpu(index: u32, total_mib: u64, used_mib: u64) -> GpuSample {
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

    fn snap_at(secs: f64, gpus: Vec<GpuSample>) -> Snapshot {
        let at = Duration::from_secs_f64(secs);
        Snapshot {
            seq: (secs * 1000.0) as u64,
            at,
            wall: UNIX_EPOCH + Duration::from_secs(1_780_000_000) + at,
            driver_version: "580.95.05".into(),
            gpus,
            processes: vec![],
            errors: vec![],
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn none() -> BTreeMap<u32, Pressure> {
        BTreeMap::new()
    }

    fn cfg() -> AnnotationConfig {
        AnnotationConfig::default()
    }

    /// Plans and immediately reports success, as a healthy API server would.
    fn step(
        p: &mut AnnotationPlanner,
        s: &Snapshot,
        pr: &BTreeMap<u32, Pressure>,
    ) -> Option<PatchReason> {
        let out = p.plan(s, pr, s.at)?;
        p.patch_succeeded(s.at);
        Some(out.reason)
    }

    #[test]
    fn config_validation() {
        assert_eq!(cfg().validate(), Ok(()));
        assert_eq!(cfg().prefix, "gpu-warden.io");
        assert_eq!(cfg().quantum_mib, 256);
        let good = ["gpu-warden.io", "a", "example.com", "x1.y-2.z3", "gpu"];
        for p in good {
            let c = AnnotationConfig {
                prefix: p.into(),
                ..cfg()
            };
            assert_eq!(c.validate(), Ok(()), "{p}");
        }
        let long = format!("{}.io", "a".repeat(251));
        let bad = [
            ("", "empty"),
            ("GPU-warden.io", "character"),
            ("gpu_warden.io", "character"),
            ("gpu-warden.io/", "character"),
            ("-gpu.io", "starts or ends"),
            ("gpu-.io", "starts or ends"),
            ("gpu..io", "empty part"),
            (".gpu.io", "empty part"),
            (long.as_str(), "253"),
        ];
        for (p, needle) in bad {
            let c = AnnotationConfig {
                prefix: p.into(),
                ..cfg()
            };
            let e = c.validate().unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("--annotation-prefix") && msg.contains(needle),
                "{p}: {msg}"
            );
        }
        let e = AnnotationConfig {
            quantum_mib: 0,
            ..cfg()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e, AnnotationConfigError::Quantum);
        let e = AnnotationConfig {
            heartbeat: Duration::ZERO,
            min_interval: Duration::ZERO,
            ..cfg()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e, AnnotationConfigError::Heartbeat);
        let e = AnnotationConfig {
            heartbeat: secs(4.0),
            ..cfg()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--annotation-heartbeat (4s) must not be shorter than --annotation-min-interval (5s)"
        );
        // Equal is fine; a zero minimum interval is allowed (no rate limit).
        for (hb, mi) in [(5.0, 5.0), (1.0, 0.0)] {
            let c = AnnotationConfig {
                heartbeat: secs(hb),
                min_interval: secs(mi),
                ..cfg()
            };
            assert_eq!(c.validate(), Ok(()));
        }
        assert_eq!(
            cfg().keys(),
            [
                "gpu-warden.io/vram-free-mib",
                "gpu-warden.io/vram-max-free-mib",
                "gpu-warden.io/vram",
                "gpu-warden.io/vram-observed-at"
            ]
        );
    }

    /// Two GPUs time-sliced 4 ways: GPU 0 has 3 replicas out, GPU 1 has 1.
    fn replica_view(g1_allocated: u32) -> ReplicaView {
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
    fn replica_changes_are_a_reason_to_patch_within_the_min_interval() {
        let mut p = AnnotationPlanner::new(cfg());
        let gpus = || vec![gpu(0, 10_340, 2048), gpu(1, 10_340, 0)];
        let r = |s: &Snapshot, p: &mut AnnotationPlanner, v: Option<&ReplicaView>| {
            let out = p.plan_with_replicas(s, &none(), v, s.at)?;
            p.patch_succeeded(s.at);
            Some(out.reason)
        };
        let v1 = replica_view(1);
        assert_eq!(
            r(&snap_at(0.0, gpus()), &mut p, None),
            Some(PatchReason::Initial)
        );
        // The data arrives: held back by the minimum interval, then sent.
        assert_eq!(r(&snap_at(1.0, gpus()), &mut p, Some(&v1)), None);
        assert_eq!(
            r(&snap_at(5.0, gpus()), &mut p, Some(&v1)),
            Some(PatchReason::ReplicasChanged)
        );
        assert_eq!(
            r(&snap_at(11.0, gpus()), &mut p, Some(&v1)),
            None,
            "unchanged"
        );
        let v2 = replica_view(2);
        assert_eq!(
            r(&snap_at(12.0, gpus()), &mut p, Some(&v2)),
            Some(PatchReason::ReplicasChanged)
        );
        // Withdrawn: the keys go.
        assert_eq!(
            r(&snap_at(20.0, gpus()), &mut p, None),
            Some(PatchReason::ReplicasChanged)
        );
    }

    /// (total, used) MiB per GPU → (used, free) quantized per GPU, sum, max. Free is
    /// total − 100 reserved − used.
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
        let mut want = p.config().keys().to_vec();
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
            }}})
        );
    }

    #[test]
    fn first_plan_patches_and_an_unchanged_snapshot_does_not() {
        let mut p = AnnotationPlanner::new(cfg());
        let g = || vec![gpu(0, 10_340, 2048)];
        assert_eq!(
            step(&mut p, &snap_at(0.0, g()), &none()),
            Some(PatchReason::Initial)
        );
        // Only observedAt moves: no reason to patch, for the whole heartbeat.
        for t in 1..60 {
            assert_eq!(
                step(&mut p, &snap_at(f64::from(t), g()), &none()),
                None,
                "t={t}"
            );
        }
        assert_eq!(
            step(&mut p, &snap_at(60.0, g()), &none()),
            Some(PatchReason::Heartbeat)
        );
        assert_eq!(p.last_success(), Some(secs(60.0)));
    }

    /// Free MiB on one GPU over time (1 s apart, min interval 0 so only hysteresis
    /// matters) → whether each poll patches. Published free starts at 8192 (from 8240).
    #[test]
    fn hysteresis_table() {
        type Row = (&'static str, &'static [u64], &'static [bool]);
        let rows: &[Row] = &[
            (
                "small moves absorbed",
                &[8200, 8300, 8447, 8192],
                &[false, false, false, false],
            ),
            ("dropping below the claim patches at once", &[8191], &[true]),
            (
                "each quantum crossed downward patches",
                &[8000, 7950, 7936, 7935],
                &[true, false, false, true],
            ),
            (
                "rising needs 1.5 quanta",
                &[8447, 8575, 8576],
                &[false, false, true],
            ),
            // After the rise to 8576 (published 8448) noise of ±100 never flaps.
            (
                "noise around a boundary never flaps",
                &[8576, 8448, 8540, 8460, 8575, 8450],
                &[true, false, false, false, false, false],
            ),
        ];
        for (name, frees, want) in rows {
            let mut p = AnnotationPlanner::new(AnnotationConfig {
                min_interval: Duration::ZERO,
                ..cfg()
            });
            let total = 10_340;
            let at = |t: f64, free: u64| snap_at(t, vec![gpu(0, total, total - 100 - free)]);
            assert!(step(&mut p, &at(0.0, 8240), &none()).is_some());
            let got: Vec<bool> = frees
                .iter()
                .enumerate()
                .map(|(i, &f)| step(&mut p, &at(1.0 + i as f64, f), &none()).is_some())
                .collect();
            assert_eq!(&got, want, "{name}");
        }
    }

    /// 60 s heartbeats on 1 s polls whose stamps wobble by a few ms go out every 60 polls,
    /// never 61.
    #[test]
    fn the_heartbeat_keeps_its_period_on_jittery_polls() {
        let mut p = AnnotationPlanner::new(cfg());
        let mut sent = Vec::new();
        for k in 0..400u32 {
            let jitter = [0.004, -0.003, 0.001, -0.004, 0.002, -0.001, 0.0][k as usize % 7];
            let s = snap_at(f64::from(k) + jitter, vec![gpu(0, 10_340, 0)]);
            if step(&mut p, &s, &none()).is_some() {
                sent.push(k);
            }
        }
        let gaps: Vec<u32> = sent.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            !gaps.is_empty() && gaps.iter().all(|g| *g == 60),
            "{sent:?}"
        );
    }

    #[test]
    fn heartbeat_needs_a_new_snapshot() {
        let mut p = AnnotationPlanner::new(cfg());
        let s = snap_at(0.0, vec![gpu(0, 10_340, 0)]);
        assert!(step(&mut p, &s, &none()).is_some());
        // The sampler stopped: the same snapshot, long after the heartbeat, is not re-sent;
        // observedAt ages so consumers can see it.
        assert!(p.plan(&s, &none(), secs(600.0)).is_none());
        assert_eq!(p.next_due(), None);
    }

    #[test]
    fn min_interval_holds_a_change_back_and_says_when() {
        let mut p = AnnotationPlanner::new(cfg());
        let at = |t: f64, used: u64| snap_at(t, vec![gpu(0, 10_340, used)]);
        assert!(step(&mut p, &at(0.0, 0), &none()).is_some());
        assert_eq!(step(&mut p, &at(1.0, 1000), &none()), None);
        assert_eq!(p.next_due(), Some(secs(5.0)));
        assert_eq!(step(&mut p, &at(4.9, 1000), &none()), None);
        assert_eq!(
            step(&mut p, &at(5.0, 1000), &none()),
            Some(PatchReason::FreeMoved)
        );
        assert_eq!(p.next_due(), None);
        // A change that reverts before the interval ends costs nothing.
        assert_eq!(step(&mut p, &at(6.0, 3000), &none()), None);
        assert_eq!(p.next_due(), Some(secs(10.0)));
        assert_eq!(step(&mut p, &at(7.0, 1000), &none()), None);
        assert_eq!(p.next_due(), None);
    }

    #[test]
    fn pressure_rise_goes_at_once_and_a_fall_waits_for_the_interval() {
        let mut p = AnnotationPlanner::new(cfg());
        let s = |t: f64| snap_at(t, vec![gpu(0, 10_340, 0), gpu(1, 10_340, 0)]);
        let pr = |a: Pressure, b: Pressure| BTreeMap::from([(0, a), (1, b)]);
        use Pressure::{Hard, None as Calm, Soft};
        assert!(step(&mut p, &s(0.0), &pr(Calm, Calm)).is_some());
        let rows = [
            (0.1, Soft, Calm, Some(PatchReason::PressureRaised)),
            (0.2, Hard, Calm, Some(PatchReason::PressureRaised)),
            (0.3, Hard, Soft, Some(PatchReason::PressureRaised)),
            // A fall inside the minimum interval waits…
            (1.0, Soft, Soft, None),
            // …unless something rises at the same time.
            (1.5, Calm, Hard, Some(PatchReason::PressureRaised)),
            (2.0, Calm, Soft, None),
            (6.4, Calm, Soft, None),
            (6.5, Calm, Soft, Some(PatchReason::PressureEased)),
            (6.6, Calm, Calm, None),
            (11.5, Calm, Calm, Some(PatchReason::PressureEased)),
        ];
        for (t, a, b, want) in rows {
            assert_eq!(step(&mut p, &s(t), &pr(a, b)), want, "t={t}");
        }
        // A GPU missing from the map is `none` (the guard is off or has no verdict).
        assert_eq!(step(&mut p, &s(12.0), &none()), None);
    }

    #[test]
    fn a_gpu_dropping_out_is_a_change() {
        let mut p = AnnotationPlanner::new(cfg());
        let both = |t| snap_at(t, vec![gpu(0, 10_340, 0), gpu(1, 10_340, 0)]);
        assert!(step(&mut p, &both(0.0), &none()).is_some());
        let mut lost = gpu(1, 10_340, 0);
        lost.memory = None;
        lost.health = GpuHealth::Lost("fell off the bus".into());
        let one = snap_at(1.0, vec![gpu(0, 10_340, 0), lost]);
        assert_eq!(step(&mut p, &one, &none()), None, "min interval");
        let one = snap_at(5.0, one.gpus.clone());
        assert_eq!(step(&mut p, &one, &none()), Some(PatchReason::GpusChanged));
    }

    #[test]
    fn a_failed_patch_is_planned_again_without_losing_the_change() {
        let mut p = AnnotationPlanner::new(cfg());
        let at = |t: f64, used: u64| snap_at(t, vec![gpu(0, 10_340, used)]);
        // The very first patch fails: still owed.
        let first = p.plan(&at(0.0, 0), &none(), secs(0.0)).unwrap();
        assert_eq!(first.reason, PatchReason::Initial);
        // Nothing more is planned while it is in flight.
        assert!(p.plan(&at(0.5, 0), &none(), secs(0.5)).is_none());
        p.patch_failed(secs(0.6));
        assert_eq!(p.last_success(), None);
        // The retry respects the minimum interval since the failed attempt…
        assert!(p.plan(&at(1.0, 0), &none(), secs(1.0)).is_none());
        assert_eq!(p.next_due(), Some(secs(5.0)));
        let retry = p.plan(&at(5.0, 0), &none(), secs(5.0)).unwrap();
        assert_eq!(retry.reason, PatchReason::Initial);
        p.patch_succeeded(secs(5.1));
        // A change whose patch fails is carried with the then-current values.
        let c = p.plan(&at(10.0, 2000), &none(), secs(10.0)).unwrap();
        assert_eq!(c.values.gpus[0].free_mib, 8192);
        p.patch_failed(secs(10.1));
        let c = p.plan(&at(15.0, 2600), &none(), secs(15.0)).unwrap();
        assert_eq!(c.reason, PatchReason::FreeMoved);
        assert_eq!(c.values.gpus[0].free_mib, 7640 / Q * Q);
        p.patch_succeeded(secs(15.1));
        // A pressure rise whose patch fails is retried at once (the caller's backoff
        // is the only brake), and a failed heartbeat stays due.
        let soft = BTreeMap::from([(0, Pressure::Soft)]);
        assert!(p.plan(&at(16.0, 2600), &soft, secs(16.0)).is_some());
        p.patch_failed(secs(16.0));
        let r = p.plan(&at(16.5, 2600), &soft, secs(16.5)).unwrap();
        assert_eq!(r.reason, PatchReason::PressureRaised);
        p.patch_succeeded(secs(16.5));
        let hb = p.plan(&at(76.5, 2600), &soft, secs(76.5)).unwrap();
        assert_eq!(hb.reason, PatchReason::Heartbeat);
        p.patch_failed(secs(76.6));
        assert_eq!(
            p.plan(&at(81.5, 2600), &soft, secs(81.5)).map(|x| x.reason),
            Some(PatchReason::Heartbeat)
        );
    }

    /// The "Done when" figure: 10 minutes of 1 s polls of a steady node patch at most 11
    /// times, each patch touching only our four keys.
    #[test]
    fn ten_minute_steady_run_patches_at_most_eleven_times() {
        let mut p = AnnotationPlanner::new(cfg());
        let pr = BTreeMap::from([(0, Pressure::None), (1, Pressure::None)]);
        let keys: std::collections::BTreeSet<String> = p.config().keys().into_iter().collect();
        let mut patches = Vec::new();
        for t in 0..=600 {
            let s = snap_at(
                f64::from(t),
                vec![gpu(0, 81_559, 20_000), gpu(1, 81_559, 3_000)],
            );
            if let Some(out) = p.plan(&s, &pr, s.at) {
                let touched: std::collections::BTreeSet<String> = out.body["metadata"]
                    ["annotations"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect();
                assert_eq!(touched, keys);
                assert_eq!(out.body.as_object().unwrap().len(), 1);
                patches.push(t);
                p.patch_succeeded(s.at);
            }
        }
        assert!(patches.len() <= 11, "{patches:?}");
        assert_eq!(patches, (0..=600).step_by(60).collect::<Vec<_>>());
    }

    /// A process growing 100 MiB/s crosses a quantum every ~2.6 s; with a 5 s minimum
    /// interval patches come every 5 s, each with the then-current figures.
    #[test]
    fn growing_process_patches_as_it_crosses_quanta_but_not_faster_than_min_interval() {
        let mut p = AnnotationPlanner::new(cfg());
        let mut times = Vec::new();
        let mut last_free = u64::MAX;
        for tenth in 0..=600 {
            let t = f64::from(tenth) / 10.0;
            let used = 1000 + (100.0 * t) as u64;
            let s = snap_at(t, vec![gpu(0, 81_559, used)]);
            if let Some(out) = p.plan(&s, &none(), s.at) {
                let free = out.values.gpus[0].free_mib;
                assert!(free < last_free, "t={t}");
                assert!(free <= 81_559 - 100 - used, "never over-promises");
                last_free = free;
                times.push(s.at);
                p.patch_succeeded(s.at);
            }
        }
        assert!(
            times.windows(2).all(|w| w[1] - w[0] >= secs(5.0)),
            "{times:?}"
        );
        assert_eq!(times.len(), 13, "{times:?}");
    }
}
