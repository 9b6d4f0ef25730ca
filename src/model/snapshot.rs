//! The data model every reader works from: one immutable [`Snapshot`] per poll.
//!
//! Plain data, no I/O. Every optional field follows the "absent, not zero" rule of the
//! design contract: `None` means the backend could not (or may not) give the value, and
//! the exporters emit no series for it.

use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime};

/// One MiB in bytes; NVML reports bytes, dcgm-exporter exports MiB.
pub const MIB: u64 = 1024 * 1024;

/// Framebuffer memory of one GPU, in bytes, as NVML's `memory_info` (v2) reports it.
///
/// `free` is what CUDA can still allocate; `reserved` is held by the driver and firmware and
/// is never allocatable, so `total = used + free + reserved`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryInfo {
    pub total: u64,
    pub used: u64,
    pub free: u64,
    pub reserved: u64,
}

/// Row-remapping state of an HBM GPU (Ampere and newer). Scenario files give it in the
/// same shape (fields left out are 0 / false).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemappedRows {
    pub correctable: u64,
    pub uncorrectable: u64,
    pub pending: bool,
    pub failure: bool,
}

/// Profiling ratios (0..1) and PCIe byte rates, from NVML GPM on Hopper and newer.
/// Scenario files give it in the same shape, with the PCIe rates named `pcie_tx_bytes` /
/// `pcie_rx_bytes` (dcgm-exporter's family names); a field left out has no series.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProfSample {
    pub gr_engine_active: Option<f64>,
    pub sm_active: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub pipe_tensor_active: Option<f64>,
    pub dram_active: Option<f64>,
    pub pipe_fp64_active: Option<f64>,
    pub pipe_fp32_active: Option<f64>,
    pub pipe_fp16_active: Option<f64>,
    #[serde(rename(deserialize = "pcie_tx_bytes"))]
    pub pcie_tx_bytes_per_second: Option<f64>,
    #[serde(rename(deserialize = "pcie_rx_bytes"))]
    pub pcie_rx_bytes_per_second: Option<f64>,
}

impl ProfSample {
    /// The ratio fields with their scenario names.
    pub fn ratios(&self) -> [(&'static str, Option<f64>); 8] {
        [
            ("gr_engine_active", self.gr_engine_active),
            ("sm_active", self.sm_active),
            ("sm_occupancy", self.sm_occupancy),
            ("pipe_tensor_active", self.pipe_tensor_active),
            ("dram_active", self.dram_active),
            ("pipe_fp64_active", self.pipe_fp64_active),
            ("pipe_fp32_active", self.pipe_fp32_active),
            ("pipe_fp16_active", self.pipe_fp16_active),
        ]
    }

    /// The byte-rate fields with their scenario names.
    pub fn rates(&self) -> [(&'static str, Option<f64>); 2] {
        [
            ("pcie_tx_bytes", self.pcie_tx_bytes_per_second),
            ("pcie_rx_bytes", self.pcie_rx_bytes_per_second),
        ]
    }
}

/// Whether a GPU answered this poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason", rename_all = "snake_case")]
pub enum GpuHealth {
    /// Every call that matters answered (fields may still be unsupported).
    Ok,
    /// The GPU fell off the bus (`GpuIsLost`): only its identity remains.
    Lost(String),
    /// The memory read failed this poll; other fields may be present but the guard ignores it.
    Degraded(String),
}

/// The stable identity of a GPU: everything that goes into dcgm-exporter's label set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuIdentity {
    /// NVML index (`gpu` label).
    pub index: u32,
    /// `GPU-…` UUID (`UUID` label).
    pub uuid: String,
    /// PCI bus id in NVML's 8-digit-domain form, e.g. `00000000:06:00.0`.
    pub pci_bus_id: String,
    /// Device node name, `nvidia<minor>` (`device` label).
    pub device: String,
    /// Marketing name (`modelName` label).
    pub model: String,
}

/// Everything read from one GPU in one poll.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSample {
    pub id: GpuIdentity,
    pub health: GpuHealth,
    pub memory: Option<MemoryInfo>,
    /// Percent of time a kernel ran (0..100).
    pub gpu_util_pct: Option<u32>,
    /// Percent of time device memory was read or written (0..100).
    pub mem_copy_util_pct: Option<u32>,
    pub enc_util_pct: Option<u32>,
    pub dec_util_pct: Option<u32>,
    pub gpu_temp_c: Option<u32>,
    pub memory_temp_c: Option<u32>,
    pub power_mw: Option<u32>,
    /// Energy since the driver loaded, in mJ.
    pub energy_mj: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub pcie_replays: Option<u64>,
    pub remapped_rows: Option<RemappedRows>,
    /// The value of the last XID error seen on this GPU since the agent started.
    pub last_xid: Option<u64>,
    pub prof: Option<ProfSample>,
    /// NVLink data sent plus received over all of the GPU's links since the driver loaded,
    /// KiB (NVML's `NVLINK_THROUGHPUT_DATA_TX` + `_RX`, all links); `None` on a GPU without
    /// NVLink.
    pub nvlink_kib: Option<u64>,
    /// UUIDs (`MIG-…`) of the MIG devices on this GPU while MIG mode is on; empty otherwise.
    /// The kubelet names a MIG slice by this UUID, and a process on it shows on this GPU.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<String>,
}

impl GpuSample {
    /// A sample carrying only identity and health, for a GPU that could not be read.
    pub fn empty(id: GpuIdentity, health: GpuHealth) -> Self {
        GpuSample {
            id,
            health,
            memory: None,
            gpu_util_pct: None,
            mem_copy_util_pct: None,
            enc_util_pct: None,
            dec_util_pct: None,
            gpu_temp_c: None,
            memory_temp_c: None,
            power_mw: None,
            energy_mj: None,
            sm_clock_mhz: None,
            mem_clock_mhz: None,
            pcie_replays: None,
            remapped_rows: None,
            last_xid: None,
            prof: None,
            nvlink_kib: None,
            mig_devices: Vec::new(),
        }
    }
}

/// Who owns a GPU process, as attribution found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Owner {
    /// Not looked up yet (attribution off, or the process is new this poll).
    #[default]
    Unknown,
    /// A process outside any Kubernetes pod (a host daemon, a user's shell).
    Host,
    /// `/proc/<pid>` was not readable: typically the agent lacks `hostPID: true`.
    Invisible,
    /// A container of a pod this node runs.
    Pod(PodRef),
}

/// The pod and container a process belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub uid: String,
}

/// One process using one GPU. A process using two GPUs appears twice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessSample {
    pub pid: u32,
    /// NVML index of the GPU.
    pub gpu: u32,
    /// VRAM this process holds on this GPU, in bytes; `None` where NVML cannot tell
    /// (e.g. without permission, or under some virtualisation modes).
    pub used_bytes: Option<u64>,
    /// Share of SM time this process used over the last sampling window (0..1).
    pub sm_util: Option<f64>,
    /// Short command name (`/proc/<pid>/comm` or NVML's process name). Hostile input.
    pub name: String,
    pub owner: Owner,
}

/// Counts of failed NVML calls during a poll, by call name, for `gpu_warden_nvml_errors_total`.
pub type CallErrors = Vec<(&'static str, u64)>;

/// What one poll of the GPU source saw: the GPUs, their processes and any failed calls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Increases by one with every full poll.
    pub seq: u64,
    /// Monotonic time of the poll since the agent's clock began.
    #[serde(serialize_with = "ser_duration_secs")]
    pub at: Duration,
    /// Wall-clock time of the poll (for `observedAt` figures).
    #[serde(serialize_with = "ser_system_time")]
    pub wall: SystemTime,
    /// Driver version string, the `DCGM_FI_DRIVER_VERSION` label.
    pub driver_version: String,
    /// The CUDA version the driver supports (NVML's `cuDriverGetVersion` figure), read once at
    /// start; None when NVML could not tell (no `libcuda.so.1`) or the source has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<super::cuda::CudaVersion>,
    pub gpus: Vec<GpuSample>,
    pub processes: Vec<ProcessSample>,
    /// The processes' `sm_util` was read at this poll; otherwise it is carried from the last
    /// read (`--process-util-interval`), and what a read says covers the time since the
    /// read before it, so the per-job busy time waits for it (src/publish/job_usage.rs).
    #[serde(skip)]
    pub util_fresh: bool,
    /// Calls that failed during this poll (for the self metric).
    #[serde(skip)]
    pub errors: CallErrors,
}

impl Snapshot {
    /// The GPU sample with this NVML index.
    pub fn gpu(&self, index: u32) -> Option<&GpuSample> {
        self.gpus.iter().find(|g| g.id.index == index)
    }

    /// Processes on the GPU with this NVML index.
    pub fn processes_on(&self, index: u32) -> impl Iterator<Item = &ProcessSample> {
        self.processes.iter().filter(move |p| p.gpu == index)
    }
}

fn ser_duration_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn ser_system_time<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_on_filters_by_gpu() {
        let p = |pid, gpu| ProcessSample {
            pid,
            gpu,
            used_bytes: Some(MIB),
            sm_util: None,
            name: "x".into(),
            owner: Owner::Unknown,
        };
        let snap = Snapshot {
            seq: 1,
            at: Duration::ZERO,
            wall: SystemTime::UNIX_EPOCH,
            driver_version: "1".into(),
            cuda_driver_version: None,
            gpus: vec![],
            processes: vec![p(1, 0), p(2, 1), p(3, 0)],
            util_fresh: true,
            errors: vec![],
        };
        let pids: Vec<u32> = snap.processes_on(0).map(|p| p.pid).collect();
        assert_eq!(pids, vec![1, 3]);
        assert!(snap.gpu(0).is_none());
    }
}
