//! The simulated backend's scenario format: GPUs, processes whose VRAM follows a
//! trajectory, and injected faults. Parsing and validation only; `sim.rs` plays it.
//! The format is documented for users in `docs/scenarios.md`.

use super::Field;
use crate::model::cuda::CudaVersion;
use crate::model::snapshot::{ProfSample, RemappedRows};
use crate::model::units::duration_serde;
use serde::Deserialize;
use std::collections::HashSet;
use std::time::Duration;

/// A scenario file that could not be used, with the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {field}: {message}")]
    Invalid {
        path: String,
        field: String,
        message: String,
    },
}

/// A whole scenario.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Reported as the `DCGM_FI_DRIVER_VERSION` label.
    #[serde(default = "default_driver_version")]
    pub driver_version: String,
    /// The CUDA version the driver supports (`"12.8"`); by default the newest CUDA toolkit
    /// of `driver_version`'s branch ([`Scenario::cuda_version`]).
    #[serde(default)]
    pub cuda_driver_version: Option<String>,
    /// When set, process trajectories and lifetimes repeat with this period, so a demo
    /// keeps showing its story; counters (energy) keep growing.
    #[serde(default, deserialize_with = "duration_serde::option::deserialize")]
    pub repeat_every: Option<Duration>,
    pub gpus: Vec<GpuSpec>,
    #[serde(default)]
    pub processes: Vec<ProcessSpec>,
    #[serde(default)]
    pub faults: Vec<FaultSpec>,
}

fn default_driver_version() -> String {
    "580.95.05".to_string()
}

/// One GPU model entry; `count` expands it to several identical GPUs.
/// A reading left out is reported as unsupported by that GPU (no series).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    #[serde(default = "one")]
    pub count: u32,
    pub model: String,
    /// Total framebuffer, MiB.
    pub memory_mib: u64,
    /// Held by driver and firmware, never allocatable, MiB.
    #[serde(default)]
    pub reserved_mib: u64,
    /// Used outside any listed process (contexts, the display), MiB.
    #[serde(default)]
    pub base_used_mib: u64,
    /// Only with `count: 1`; otherwise generated deterministically.
    pub uuid: Option<String>,
    /// Only with `count: 1`; otherwise `00000000:<0x10+index>:00.0`.
    pub pci_bus_id: Option<String>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub gpu_temp_c: Option<u32>,
    pub memory_temp_c: Option<u32>,
    pub power_w: Option<f64>,
    /// Energy counter at time zero, mJ; it grows with `power_w`.
    #[serde(default)]
    pub energy_start_mj: u64,
    /// When left out it is derived from the processes' `sm_util` (capped at 100).
    pub gpu_util_pct: Option<u32>,
    pub mem_copy_util_pct: Option<u32>,
    pub enc_util_pct: Option<u32>,
    pub dec_util_pct: Option<u32>,
    pub pcie_replays: Option<u64>,
    pub remapped_rows: Option<RemappedRows>,
    /// Profiling figures as NVML GPM gives them on Hopper and newer (`DCGM_FI_PROF_*`).
    pub prof: Option<ProfSample>,
    /// NVLink data sent plus received over all links, KiB per second: the
    /// `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` counter grows by it. Left out: the GPU has no
    /// NVLink (no series), as on a PCIe card.
    pub nvlink_kib_per_second: Option<u64>,
    /// UUIDs of MIG devices on this GPU (MIG mode on), as NVML names them: `MIG-<uuid>`.
    /// Only with `count: 1`.
    #[serde(default)]
    pub mig_devices: Vec<String>,
}

fn one() -> u32 {
    1
}

/// A process on one GPU.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    pub pid: u32,
    /// Index of the GPU (after `count` expansion).
    pub gpu: u32,
    #[serde(default = "default_process_name")]
    pub name: String,
    pub memory: Trajectory,
    /// Share of SM time, 0..1.
    pub sm_util: Option<f64>,
    /// Share of SM time over time since the start (`[{at: 5m, util: 0.9}, …]`, 0 before the
    /// first step); replaces `sm_util` (`sample::scenario_util`).
    #[serde(default)]
    pub sm_util_steps: Vec<super::scenario_util::UtilStep>,
    #[serde(default, deserialize_with = "duration_serde::deserialize")]
    pub start: Duration,
    #[serde(default, deserialize_with = "duration_serde::option::deserialize")]
    pub stop: Option<Duration>,
    /// The pod and container this process runs in (used by attribution tests and demos).
    pub pod: Option<PodPlacement>,
}

fn default_process_name() -> String {
    "python".to_string()
}

/// Where a simulated process lives in Kubernetes.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PodPlacement {
    pub namespace: String,
    pub name: String,
    #[serde(default = "default_container")]
    pub container: String,
    /// Pod UID; generated from namespace/name when left out.
    pub uid: Option<String>,
    /// 64-hex container ID; generated when left out.
    pub container_id: Option<String>,
    /// `spec.priority` of the pod.
    pub priority: Option<i32>,
    /// `spec.priorityClassName` of the pod.
    pub priority_class: Option<String>,
    /// Pod labels.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Pod annotations (e.g. `gpu-warden.io/vram-request-mib`, `job.runner.gitlab.com/id`).
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Kind of the controlling owner (`Job`, `DaemonSet`, …).
    pub owner_kind: Option<String>,
    /// `metadata.creationTimestamp` (RFC 3339); defaults to a fixed instant.
    pub created_at: Option<String>,
}

fn default_container() -> String {
    "main".to_string()
}

/// How a process's VRAM (MiB) moves over time since its start. Written as a map with
/// exactly one key: `{constant: 4096}`, `{linear: {from, per_second, max}}`,
/// `{steps: [...]}` or `{workspace: {base, mib, every, holds}}`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(try_from = "TrajectoryRepr")]
pub enum Trajectory {
    /// Holds this many MiB.
    Constant(u64),
    /// Starts at `from` MiB and grows `per_second` MiB/s up to `max` MiB.
    Linear {
        from: u64,
        per_second: f64,
        max: Option<u64>,
    },
    /// Jumps to `mib` at each `at` (time since the process started).
    Steps(Vec<Step>),
    /// Holds `base` MiB and, for the first `holds` of every `every`, a workspace of `mib`
    /// more: a training step's activations, an evaluation's buffers, a library's scratch
    /// space, allocated and freed again and again (the neighbour a guard must not mistake for
    /// a grower).
    Workspace {
        base: u64,
        mib: u64,
        every: Duration,
        holds: Duration,
    },
}

/// The on-disk shape of a trajectory. YAML libraries spell enums as tags (`!constant 1`),
/// which nobody writes by hand; a one-key map reads naturally and errors can name the key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrajectoryRepr {
    constant: Option<u64>,
    linear: Option<LinearRepr>,
    steps: Option<Vec<Step>>,
    workspace: Option<WorkspaceRepr>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkspaceRepr {
    base: u64,
    mib: u64,
    #[serde(deserialize_with = "duration_serde::deserialize")]
    every: Duration,
    #[serde(deserialize_with = "duration_serde::deserialize")]
    holds: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinearRepr {
    from: u64,
    per_second: f64,
    max: Option<u64>,
}

/// A `memory:` that is not exactly one trajectory.
#[derive(Debug, thiserror::Error)]
#[error("memory needs exactly one of `constant`, `linear`, `steps` or `workspace`")]
pub struct TrajectoryShapeError;

impl TryFrom<TrajectoryRepr> for Trajectory {
    type Error = TrajectoryShapeError;
    fn try_from(r: TrajectoryRepr) -> Result<Self, TrajectoryShapeError> {
        match (r.constant, r.linear, r.steps, r.workspace) {
            (Some(c), None, None, None) => Ok(Trajectory::Constant(c)),
            (None, Some(l), None, None) => Ok(Trajectory::Linear {
                from: l.from,
                per_second: l.per_second,
                max: l.max,
            }),
            (None, None, Some(s), None) => Ok(Trajectory::Steps(s)),
            (None, None, None, Some(w)) => Ok(Trajectory::Workspace {
                base: w.base,
                mib: w.mib,
                every: w.every,
                holds: w.holds,
            }),
            _ => Err(TrajectoryShapeError),
        }
    }
}

/// One step of a stepped trajectory.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(deserialize_with = "duration_serde::deserialize")]
    pub at: Duration,
    pub mib: u64,
}

impl Trajectory {
    /// Desired MiB at `t` since the process started.
    pub fn mib_at(&self, t: Duration) -> u64 {
        match self {
            Trajectory::Constant(m) => *m,
            Trajectory::Linear {
                from,
                per_second,
                max,
            } => {
                let grown = (*from as f64 + per_second * t.as_secs_f64()).max(0.0) as u64;
                max.map_or(grown, |m| grown.min(m))
            }
            Trajectory::Steps(steps) => steps
                .iter()
                .take_while(|s| s.at <= t)
                .last()
                .map_or(0, |s| s.mib),
            Trajectory::Workspace {
                base,
                mib,
                every,
                holds,
            } => {
                let into = t.as_nanos() % every.as_nanos().max(1);
                if into < holds.as_nanos() {
                    base.saturating_add(*mib)
                } else {
                    *base
                }
            }
        }
    }
}

/// An injected fault.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultSpec {
    /// The GPU answers `NotSupported` for this field, always.
    Unsupported { gpu: u32, field: String },
    /// Calls for this field fail from `from` until `until` (forever if left out).
    Error {
        gpu: u32,
        field: String,
        #[serde(default, deserialize_with = "duration_serde::deserialize")]
        from: Duration,
        #[serde(default, deserialize_with = "duration_serde::option::deserialize")]
        until: Option<Duration>,
    },
    /// The GPU falls off the bus at `at` and never comes back.
    Lost {
        gpu: u32,
        #[serde(deserialize_with = "duration_serde::deserialize")]
        at: Duration,
    },
    /// Calls for this field block (the thread sleeps, as in an NVML call stuck in the
    /// driver) from `at` until `until` or `at + for`, or for good when neither is given. A
    /// call made inside the window returns when the window ends; later calls answer.
    Hang {
        gpu: u32,
        field: String,
        #[serde(deserialize_with = "duration_serde::deserialize")]
        at: Duration,
        #[serde(
            default,
            rename = "for",
            deserialize_with = "duration_serde::option::deserialize"
        )]
        for_: Option<Duration>,
        #[serde(default, deserialize_with = "duration_serde::option::deserialize")]
        until: Option<Duration>,
    },
    /// An XID error with this value is raised at `at`.
    Xid {
        gpu: u32,
        #[serde(deserialize_with = "duration_serde::deserialize")]
        at: Duration,
        value: u64,
    },
}

impl FaultSpec {
    /// For a hang, the window `[at, end)` in which calls block; `end` is None for a hang
    /// that never ends. None for the other kinds.
    pub fn hang_window(&self) -> Option<(Duration, Option<Duration>)> {
        match self {
            FaultSpec::Hang {
                at, for_, until, ..
            } => Some((
                *at,
                // A window too long to add up lasts for good.
                until.or_else(|| for_.and_then(|d| at.checked_add(d))),
            )),
            _ => None,
        }
    }
}

/// serde_yaml_ng's message, made to say where: some scanner errors carry no line
/// ("found character that cannot start any token") or only a byte offset ("control
/// characters are not allowed at position 8"); those get the line and column.
fn yaml_error_message(text: &str, e: &serde_yaml_ng::Error) -> String {
    let message = e.to_string();
    // A key-naming message says what already; its location can be a placeholder (1:1).
    if message.contains(" line ") || message.contains("key \"") {
        return message;
    }
    let offset = message
        .rsplit_once("at position ")
        .and_then(|(_, n)| n.trim().parse::<usize>().ok());
    let (line, column) = match (offset, e.location()) {
        (Some(at), _) => {
            let before = text.get(..at.min(text.len())).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            (line, column)
        }
        (None, Some(loc)) => (loc.line(), loc.column()),
        // "more than one document" carries no location: point at the second document's
        // `---` (or a `...` end marker), the first one after any content.
        (None, None) => match second_document(text) {
            Some(line) => (line, 1),
            None => return message,
        },
    };
    format!("{message} (line {line} column {column})")
}

/// The 1-based line of the marker that starts a second YAML document, if any.
fn second_document(text: &str) -> Option<usize> {
    let mut content = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_end();
        if (t == "---" || t.starts_with("--- ") || t == "...") && content {
            return Some(i + 1);
        }
        if !t.is_empty() && !t.trim_start().starts_with('#') && t != "---" {
            content = true;
        }
    }
    None
}

/// Largest framebuffer a scenario may declare, MiB (16 TiB): byte figures stay far from
/// overflowing a u64.
const MAX_MEMORY_MIB: u64 = 1 << 24;

impl Scenario {
    /// Parses and validates scenario text; `path` only names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Scenario, ScenarioError> {
        let sc: Scenario = serde_yaml_ng::from_str(text).map_err(|e| ScenarioError::Parse {
            path: path.to_string(),
            message: yaml_error_message(text, &e),
        })?;
        sc.validate(path)?;
        Ok(sc)
    }

    /// Number of GPUs after `count` expansion.
    pub fn gpu_count(&self) -> u32 {
        // Saturating: absurd counts must reach validation's "at most 64", not overflow.
        self.gpus
            .iter()
            .fold(0u32, |n, g| n.saturating_add(g.count))
    }

    /// The CUDA version the simulated driver supports: `cuda_driver_version` when given, else
    /// the newest toolkit of the driver's branch (CUDA Toolkit Release Notes, Table 3: R570
    /// ships 12.8, R580 13.0); None for a branch not listed.
    pub fn cuda_version(&self) -> Option<CudaVersion> {
        if let Some(text) = &self.cuda_driver_version {
            return CudaVersion::parse(text).ok();
        }
        let branch: u32 = self.driver_version.split('.').next()?.parse().ok()?;
        let (major, minor) = match branch {
            450 => (11, 0),
            455 => (11, 1),
            460 => (11, 2),
            465 => (11, 3),
            470 => (11, 4),
            495 => (11, 5),
            510 => (11, 6),
            515 => (11, 7),
            520 => (11, 8),
            525 => (12, 0),
            530 => (12, 1),
            535 => (12, 2),
            545 => (12, 3),
            550 => (12, 4),
            555 => (12, 5),
            560 => (12, 6),
            570 => (12, 8),
            575 => (12, 9),
            580 => (13, 0),
            590 => (13, 1),
            595 => (13, 2),
            _ => return None,
        };
        Some(CudaVersion { major, minor })
    }

    fn validate(&self, path: &str) -> Result<(), ScenarioError> {
        let bad = |field: String, message: String| ScenarioError::Invalid {
            path: path.to_string(),
            field,
            message,
        };
        if let Some(Err(e)) = self.cuda_driver_version.as_deref().map(CudaVersion::parse) {
            return Err(bad("cuda_driver_version".into(), e.to_string()));
        }
        if self.gpus.is_empty() {
            return Err(bad("gpus".into(), "at least one GPU is required".into()));
        }
        let total = self.gpu_count();
        if total > 64 {
            return Err(bad(
                "gpus".into(),
                format!("{total} GPUs; at most 64 are supported"),
            ));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            let f = |name: &str| format!("gpus[{i}].{name}");
            if g.count == 0 {
                return Err(bad(f("count"), "must be at least 1".into()));
            }
            if g.count > 1 && (g.uuid.is_some() || g.pci_bus_id.is_some()) {
                return Err(bad(
                    f("uuid"),
                    "uuid and pci_bus_id can only be given with count: 1".into(),
                ));
            }
            if g.memory_mib == 0 || g.memory_mib > MAX_MEMORY_MIB {
                return Err(bad(
                    f("memory_mib"),
                    format!("must be 1..{MAX_MEMORY_MIB} (16 TiB)"),
                ));
            }
            if g.reserved_mib.saturating_add(g.base_used_mib) >= g.memory_mib {
                return Err(bad(
                    f("reserved_mib"),
                    "reserved_mib + base_used_mib must be below memory_mib".into(),
                ));
            }
            for (name, v) in [
                ("gpu_util_pct", g.gpu_util_pct),
                ("mem_copy_util_pct", g.mem_copy_util_pct),
                ("enc_util_pct", g.enc_util_pct),
                ("dec_util_pct", g.dec_util_pct),
            ] {
                if v.is_some_and(|v| v > 100) {
                    return Err(bad(f(name), "a percentage must be 0..100".into()));
                }
            }
            if let Some(prof) = &g.prof {
                for (name, v) in prof.ratios() {
                    if v.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
                        return Err(bad(
                            f(&format!("prof.{name}")),
                            "must be a ratio 0..1".into(),
                        ));
                    }
                }
                for (name, v) in prof.rates() {
                    if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                        return Err(bad(
                            f(&format!("prof.{name}")),
                            "must be a rate in bytes per second, 0 or more".into(),
                        ));
                    }
                }
            }
            if g.power_w.is_some_and(|p| !(0.0..=10_000.0).contains(&p)) {
                return Err(bad(f("power_w"), "must be 0..10000 W".into()));
            }
            if let Some(u) = &g.uuid {
                if !u.starts_with("GPU-") {
                    return Err(bad(f("uuid"), "must start with \"GPU-\"".into()));
                }
            }
            if !g.mig_devices.is_empty() && g.count > 1 {
                return Err(bad(
                    f("mig_devices"),
                    "mig_devices can only be given with count: 1".into(),
                ));
            }
            if let Some(m) = g.mig_devices.iter().find(|m| !m.starts_with("MIG-")) {
                return Err(bad(
                    f("mig_devices"),
                    format!("{m:?} must start with \"MIG-\""),
                ));
            }
        }
        let mut pids = HashSet::new();
        for (i, p) in self.processes.iter().enumerate() {
            let f = |name: &str| format!("processes[{i}].{name}");
            if p.gpu >= total {
                return Err(bad(
                    f("gpu"),
                    format!("GPU {} does not exist (the scenario has {total})", p.gpu),
                ));
            }
            if p.pid == 0 {
                return Err(bad(f("pid"), "must be above 0".into()));
            }
            if !pids.insert((p.pid, p.gpu)) {
                return Err(bad(
                    f("pid"),
                    format!("pid {} is listed twice on GPU {}", p.pid, p.gpu),
                ));
            }
            if p.sm_util.is_some_and(|u| !(0.0..=1.0).contains(&u)) {
                return Err(bad(f("sm_util"), "must be a ratio 0..1".into()));
            }
            if p.sm_util_steps
                .iter()
                .any(|s| !(0.0..=1.0).contains(&s.util))
            {
                return Err(bad(
                    f("sm_util_steps"),
                    "each util must be a ratio 0..1".into(),
                ));
            }
            if p.stop.is_some_and(|s| s <= p.start) {
                return Err(bad(f("stop"), "must be after start".into()));
            }
            match &p.memory {
                Trajectory::Linear { per_second, .. } if !per_second.is_finite() => {
                    return Err(bad(f("memory.linear.per_second"), "must be finite".into()));
                }
                Trajectory::Workspace { every, holds, .. } if every.is_zero() || holds >= every => {
                    return Err(bad(
                        f("memory.workspace"),
                        "`holds` must be shorter than `every`, and `every` above zero".into(),
                    ));
                }
                Trajectory::Steps(steps) => {
                    if steps.is_empty() {
                        return Err(bad(f("memory.steps"), "needs at least one step".into()));
                    }
                    if steps.windows(2).any(|w| w[1].at < w[0].at) {
                        return Err(bad(f("memory.steps"), "steps must be in time order".into()));
                    }
                }
                _ => {}
            }
            if let Some(pod) = &p.pod {
                if let Some(cid) = &pod.container_id {
                    if cid.len() != 64 || !cid.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(bad(
                            f("pod.container_id"),
                            "must be 64 hex characters".into(),
                        ));
                    }
                }
            }
        }
        for (i, fault) in self.faults.iter().enumerate() {
            let (gpu, field) = match fault {
                FaultSpec::Unsupported { gpu, field }
                | FaultSpec::Error { gpu, field, .. }
                | FaultSpec::Hang { gpu, field, .. } => (*gpu, Some(field)),
                FaultSpec::Lost { gpu, .. } | FaultSpec::Xid { gpu, .. } => (*gpu, None),
            };
            if gpu >= total {
                return Err(bad(
                    format!("faults[{i}].gpu"),
                    format!("GPU {gpu} does not exist (the scenario has {total})"),
                ));
            }
            if let FaultSpec::Hang {
                at, for_, until, ..
            } = fault
            {
                if for_.is_some() && until.is_some() {
                    return Err(bad(
                        format!("faults[{i}].until"),
                        "give either `for` or `until`, not both".into(),
                    ));
                }
                if for_.is_some_and(|d| d.is_zero()) {
                    return Err(bad(format!("faults[{i}].for"), "must be above 0".into()));
                }
                if until.is_some_and(|u| u <= *at) {
                    return Err(bad(format!("faults[{i}].until"), "must be after at".into()));
                }
            }
            if let Some(name) = field {
                if Field::parse(name).is_none() {
                    let allowed: Vec<&str> = Field::ALL.iter().map(|f| f.as_str()).collect();
                    return Err(bad(
                        format!("faults[{i}].field"),
                        format!("unknown field {name:?}; one of {}", allowed.join(", ")),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_second_document_is_pointed_at() {
        let e = Scenario::parse("gpus: []\n---\ngpus: []\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2 column 1"), "{e}");
    }

    use super::*;

    const MINIMAL: &str = "gpus:\n  - model: NVIDIA A10G\n    memory_mib: 23028\n";

    fn err(text: &str) -> String {
        match Scenario::parse(text, "t.yaml") {
            Ok(_) => panic!("expected an error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn minimal_scenario_parses_with_defaults() {
        let sc = Scenario::parse(MINIMAL, "t.yaml").unwrap();
        assert_eq!(sc.gpu_count(), 1);
        assert_eq!(sc.gpus[0].count, 1);
        assert!(sc.processes.is_empty());
        assert_eq!(sc.driver_version, "580.95.05");
        assert_eq!(
            sc.cuda_version(),
            Some(CudaVersion {
                major: 13,
                minor: 0
            })
        );
    }

    #[test]
    fn the_cuda_driver_version_is_given_or_follows_the_driver() {
        let with = |extra: &str| Scenario::parse(&format!("{extra}{MINIMAL}"), "t.yaml");
        let sc = with("cuda_driver_version: \"12.4\"\n").unwrap();
        assert_eq!(
            sc.cuda_version(),
            Some(CudaVersion {
                major: 12,
                minor: 4
            })
        );
        let sc = with("driver_version: 570.124.06\n").unwrap();
        assert_eq!(
            sc.cuda_version(),
            Some(CudaVersion {
                major: 12,
                minor: 8
            })
        );
        assert_eq!(
            with("driver_version: \"999.1\"\n").unwrap().cuda_version(),
            None
        );
        let e = err(&format!("cuda_driver_version: \"12\"\n{MINIMAL}"));
        assert_eq!(
            e,
            r#"t.yaml: cuda_driver_version: "12" is not a CUDA version major.minor such as "12.8""#
        );
    }

    #[test]
    fn trajectories_evaluate() {
        let lin = Trajectory::Linear {
            from: 100,
            per_second: 50.0,
            max: Some(300),
        };
        assert_eq!(lin.mib_at(Duration::ZERO), 100);
        assert_eq!(lin.mib_at(Duration::from_secs(2)), 200);
        assert_eq!(lin.mib_at(Duration::from_secs(60)), 300);
        let steps = Trajectory::Steps(vec![
            Step {
                at: Duration::from_secs(1),
                mib: 10,
            },
            Step {
                at: Duration::from_secs(5),
                mib: 20,
            },
        ]);
        assert_eq!(steps.mib_at(Duration::ZERO), 0);
        assert_eq!(steps.mib_at(Duration::from_secs(1)), 10);
        assert_eq!(steps.mib_at(Duration::from_secs(7)), 20);
        assert_eq!(Trajectory::Constant(7).mib_at(Duration::from_secs(9)), 7);
        let ws = Scenario::parse(
            "gpus:\n  - model: X\n    memory_mib: 100\nprocesses:\n  - pid: 1\n    gpu: 0\n    memory: {workspace: {base: 50, mib: 20, every: 300ms, holds: 100ms}}\n",
            "t.yaml",
        )
        .unwrap()
        .processes[0]
            .memory
            .clone();
        let at = |ms| ws.mib_at(Duration::from_millis(ms));
        assert_eq!(
            [at(0), at(99), at(100), at(299), at(300), at(650)],
            [70, 70, 50, 50, 70, 70]
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = err("gpus:\n  - model: X\n    memory_mb: 10\n");
        assert!(e.contains("memory_mb"), "{e}");
        let e = err("gpu:\n  - model: X\n");
        assert!(e.contains("gpu"), "{e}");
    }

    #[test]
    fn wrong_types_are_named() {
        let e = err("gpus:\n  - model: X\n    memory_mib: lots\n");
        assert!(e.contains("memory_mib"), "{e}");
    }

    #[test]
    fn semantic_errors_name_the_field() {
        let cases = [
            ("gpus: []\n", "gpus"),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\n    gpu_util_pct: 101\n",
                "gpus[0].gpu_util_pct",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\n    count: 2\n    uuid: GPU-1\n",
                "gpus[0].uuid",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\n    prof: {pipe_tensor_active: 70}\n",
                "gpus[0].prof.pipe_tensor_active",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\n    prof: {sm_active: -0.1}\n",
                "gpus[0].prof.sm_active",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\n    prof: {pcie_rx_bytes: -1}\n",
                "gpus[0].prof.pcie_rx_bytes",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\n    prof: {pcie_rx_bytes: .nan}\n",
                "gpus[0].prof.pcie_rx_bytes",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nprocesses:\n  - pid: 1\n    gpu: 3\n    memory: {constant: 1}\n",
                "processes[0].gpu",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nprocesses:\n  - pid: 1\n    gpu: 0\n    memory: {workspace: {base: 1, mib: 1, every: 1s, holds: 1s}}\n",
                "processes[0].memory.workspace",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nprocesses:\n  - pid: 1\n    gpu: 0\n    memory: {constant: 1}\n    sm_util: 2\n",
                "processes[0].sm_util",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nprocesses:\n  - pid: 1\n    gpu: 0\n    memory: {constant: 1}\n    start: 5s\n    stop: 1s\n",
                "processes[0].stop",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: unsupported, gpu: 0, field: warp_drive}\n",
                "faults[0].field",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: lost, gpu: 4, at: 1s}\n",
                "faults[0].gpu",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: hang, gpu: 0, field: warp_drive, at: 1s, for: 1s}\n",
                "faults[0].field",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: hang, gpu: 1, field: power, at: 1s}\n",
                "faults[0].gpu",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: hang, gpu: 0, field: power, at: 1s, for: 1s, until: 3s}\n",
                "faults[0].until",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: hang, gpu: 0, field: power, at: 5s, until: 3s}\n",
                "faults[0].until",
            ),
            (
                "gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: hang, gpu: 0, field: power, at: 5s, for: 0s}\n",
                "faults[0].for",
            ),
        ];
        for (text, field) in cases {
            let e = err(text);
            assert!(e.contains(field), "{field} not in {e}");
        }
    }

    #[test]
    fn hang_windows_resolve() {
        let sc = Scenario::parse(
            "gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: hang, gpu: 0, field: power, at: 10s, for: 5s}\n  - {kind: hang, gpu: 0, field: memory, at: 1s, until: 2s}\n  - {kind: hang, gpu: 0, field: processes, at: 3s}\n  - {kind: lost, gpu: 0, at: 1s}\n",
            "t.yaml",
        )
        .unwrap();
        let s = Duration::from_secs;
        let w: Vec<_> = sc.faults.iter().map(FaultSpec::hang_window).collect();
        assert_eq!(
            w,
            vec![
                Some((s(10), Some(s(15)))),
                Some((s(1), Some(s(2)))),
                Some((s(3), None)),
                None
            ]
        );
        let e = err("gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: hang, gpu: 0, field: power, at: 1s, for: 2s, colour: red}\n");
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn prof_block_parses_and_names_unknown_keys() {
        let sc = Scenario::parse(
            "gpus:\n  - model: H\n    memory_mib: 10\n    prof: {gr_engine_active: 0.83, pipe_fp64_active: 0, pcie_tx_bytes: 1.2e9}\n",
            "t.yaml",
        )
        .unwrap();
        let p = sc.gpus[0].prof.unwrap();
        assert_eq!(p.gr_engine_active, Some(0.83));
        assert_eq!(p.pipe_fp64_active, Some(0.0));
        assert_eq!(p.pcie_tx_bytes_per_second, Some(1.2e9));
        assert_eq!(p.sm_active, None);
        assert!(Scenario::parse(MINIMAL, "t.yaml").unwrap().gpus[0]
            .prof
            .is_none());
        let e = err("gpus:\n  - model: H\n    memory_mib: 10\n    prof: {tensor_active: 0.5}\n");
        assert!(e.contains("tensor_active"), "{e}");
    }

    #[test]
    fn bad_durations_explain_the_format() {
        let e = err("gpus:\n  - model: X\n    memory_mib: 10\nfaults:\n  - {kind: lost, gpu: 0, at: soon}\n");
        assert!(e.contains("invalid duration"), "{e}");
    }

    #[test]
    fn shipped_examples_parse() {
        // The package is src/sample; the shipped scenarios are at the repository root.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "yaml") {
                Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 2, "expected the shipped example scenarios");
    }
}
