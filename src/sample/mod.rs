//! Where snapshots come from: the [`GpuSource`] trait in gpu-warden's vocabulary, its
//! NVML and simulated backends, and the sampler thread that polls one of them.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
#[cfg(test)]
use crate as sample;
use gpu_warden_model as model;

pub mod gpm;
pub mod nvml;
pub mod sampler;
pub mod scenario;
pub mod scenario_util;
pub mod sim;
pub mod sim_world;

use crate::model::snapshot::{CallErrors, GpuSample, MemoryInfo, ProcessSample};
use std::time::Duration;

/// A per-GPU reading that a backend may be unable to give. Used to cache `NotSupported`
/// verdicts, to name failed calls in `gpu_warden_nvml_errors_total{call}`, and to name
/// fields in scenario fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    Memory,
    Utilization,
    EncoderUtilization,
    DecoderUtilization,
    GpuTemp,
    MemoryTemp,
    Power,
    Energy,
    SmClock,
    MemClock,
    PcieReplays,
    RemappedRows,
    Processes,
    ProcessUtilization,
    Prof,
    NvLink,
}

impl Field {
    /// Every field, in a stable order.
    pub const ALL: [Field; 16] = [
        Field::Memory,
        Field::Utilization,
        Field::EncoderUtilization,
        Field::DecoderUtilization,
        Field::GpuTemp,
        Field::MemoryTemp,
        Field::Power,
        Field::Energy,
        Field::SmClock,
        Field::MemClock,
        Field::PcieReplays,
        Field::RemappedRows,
        Field::Processes,
        Field::ProcessUtilization,
        Field::Prof,
        Field::NvLink,
    ];

    /// The snake_case name used in scenario files and in the `call` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Memory => "memory",
            Field::Utilization => "utilization",
            Field::EncoderUtilization => "encoder_utilization",
            Field::DecoderUtilization => "decoder_utilization",
            Field::GpuTemp => "gpu_temp",
            Field::MemoryTemp => "memory_temp",
            Field::Power => "power",
            Field::Energy => "energy",
            Field::SmClock => "sm_clock",
            Field::MemClock => "mem_clock",
            Field::PcieReplays => "pcie_replays",
            Field::RemappedRows => "remapped_rows",
            Field::Processes => "processes",
            Field::ProcessUtilization => "process_utilization",
            Field::Prof => "prof",
            Field::NvLink => "nvlink",
        }
    }

    /// Parses [`Field::as_str`]'s names.
    pub fn parse(name: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.as_str() == name)
    }
}

/// What one full poll asks of the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollRequest {
    /// Read per-process SM utilization this time (the expensive call, ~1.8 ms per H200).
    pub process_utilization: bool,
    /// Read the slow counters this time: the energy counter (measured 4.07 ms per read on an
    /// H200 with driver 580 — every other device field costs microseconds) and the PCIe
    /// replay counter (0.15 ms). Between reads the backend reports the last value read.
    pub slow_counters: bool,
}

/// The raw result of a full poll, before the sampler stamps it into a snapshot.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RawPoll {
    pub driver_version: String,
    /// The CUDA version the driver supports, read once at start (None: not read).
    pub cuda_driver_version: Option<crate::model::cuda::CudaVersion>,
    pub gpus: Vec<GpuSample>,
    pub processes: Vec<ProcessSample>,
    pub errors: CallErrors,
}

/// A memory-only reading of one GPU, for the guard's fast watch.
pub type MemoryReading = (u32, Result<MemoryInfo, SampleError>);

/// Why a reading failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("not supported on this GPU")]
    NotSupported,
    #[error("GPU is lost (fell off the bus)")]
    GpuLost,
    #[error("{call} failed: {message}")]
    Failed { call: &'static str, message: String },
}

/// Errors that stop a backend from starting at all.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot load NVML ({0}); is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path? Use --backend sim to run without a GPU")]
    NvmlUnavailable(String),
    #[error("NVML call {call} failed at start-up: {message}")]
    NvmlInit { call: &'static str, message: String },
    #[error("scenario: {0}")]
    Scenario(#[from] scenario::ScenarioError),
}

/// A source of GPU readings. Implementations block (NVML calls are ioctls), so they are
/// only ever driven from the sampler's own thread.
pub trait GpuSource: Send {
    /// A short name for logs (`nvml`, `sim`).
    fn name(&self) -> &'static str;

    /// Reads every GPU and process. `now` is the monotonic time of the poll (the simulated
    /// backend evaluates its trajectories at it; NVML ignores it). Never fails as a whole:
    /// a GPU that errors is reported with its health and the others still answer.
    fn poll(&mut self, now: Duration, req: PollRequest) -> RawPoll;

    /// Reads only each GPU's memory: microseconds per GPU, for the guard's fast watch.
    fn memory(&mut self, now: Duration) -> Vec<MemoryReading>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_round_trip() {
        for f in Field::ALL {
            assert_eq!(Field::parse(f.as_str()), Some(f));
        }
        assert_eq!(Field::parse("nope"), None);
    }
}
