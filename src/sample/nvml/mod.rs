//! The real backend: NVML through nvml-wrapper, loading `libnvidia-ml.so.1` at run time.
//!
//! Only the sampler thread calls into it (every call is a blocking ioctl). `NotSupported`
//! is cached per GPU and field, so an unsupported reading costs one call in the agent's
//! life and never becomes a zero. XIDs arrive through an NVML event set on a thread of
//! their own, because `nvmlEventSetWait` blocks.
//!
//! On GPUs where `nvmlGpmQueryDeviceSupport` says yes (Hopper and newer), every full poll
//! also takes one GPM sample (about 0.85 ms on an H200) and computes dcgm-exporter's
//! `DCGM_FI_PROF_*` figures over the window since the previous poll's sample: a ring of
//! two samples per GPU (`gpm.rs`). `--gpm off` (`GPU_WARDEN_GPM=off`) turns GPM off (cost measurements,
//! or an escape hatch should a driver misbehave). See `docs/gpm.md`.

use super::gpm::{self, SampleRing, PROF_METRICS};
use super::{Field, GpuSource, MemoryReading, PollRequest, RawPoll, SampleError, SourceError};
use crate::model::snapshot::{
    GpuHealth, GpuIdentity, GpuSample, MemoryInfo, Owner, ProcessSample, ProfSample, RemappedRows,
};
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::GpmSample;
use nvml_wrapper::{Device, Nvml};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

mod device;
mod xid;

use xid::spawn_xid_watcher;

/// NVML is initialised once per process and lives for its whole life, so `Device<'static>`
/// handles can be kept (nvml-wrapper's devices borrow the `Nvml` they came from).
static NVML: OnceLock<Nvml> = OnceLock::new();

const FI_MEMORY_TEMP: u32 = 82;
const FI_REMAPPED_COR: u32 = 142;
const FI_REMAPPED_UNC: u32 = 143;
const FI_REMAPPED_PENDING: u32 = 144;
const FI_REMAPPED_FAILURE: u32 = 145;

fn nvml() -> Result<&'static Nvml, SourceError> {
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let n = Nvml::init().map_err(|e| SourceError::NvmlUnavailable(e.to_string()))?;
    Ok(NVML.get_or_init(|| n))
}

/// Maps an NVML error onto our vocabulary. A symbol missing from an older driver means
/// the driver cannot do it: that is "not supported", not a failure to retry every poll.
fn classify(call: &'static str, e: NvmlError) -> SampleError {
    match e {
        NvmlError::NotSupported
        | NvmlError::FunctionNotFound
        | NvmlError::FailedToLoadSymbol(_) => SampleError::NotSupported,
        NvmlError::GpuLost => SampleError::GpuLost,
        other => SampleError::Failed {
            call,
            message: other.to_string(),
        },
    }
}

struct DeviceState {
    device: Device<'static>,
    id: GpuIdentity,
    unsupported: HashSet<Field>,
    /// Largest process-utilization timestamp seen, passed back to NVML.
    last_util_ts: u64,
    lost: bool,
    names: HashMap<u32, String>,
    /// This poll's processes (pid, memory) and where each pid sits in that list: kept
    /// between polls so a crowded GPU's lists cost no allocation and no quadratic search.
    procs: Vec<(u32, Option<u64>)>,
    slot: HashMap<u32, usize>,
    /// Last slow-counter readings, reported between their (less frequent) reads.
    last_energy: Option<u64>,
    last_replays: Option<u64>,
    gpm: GpmState,
    /// The MIG devices' UUIDs, read at start and again with the slow counters (MIG is
    /// reconfigured rarely, with the GPU idle); `mig_unsupported` once NVML said no MIG.
    mig: Vec<String>,
    mig_unsupported: bool,
}

/// GPM state of one GPU. Whether GPM is unsupported lives in `unsupported` (`Field::Prof`).
#[derive(Default)]
struct GpmState {
    /// `gpm_support` answered yes.
    supported: bool,
    /// The previous poll's sample (an NVML buffer, freed on drop).
    ring: SampleRing<GpmSample<'static>>,
    /// The figures computed last, reported again by the polls inside `--gpm-interval`.
    last: Option<ProfSample>,
    /// Metrics were computed (or tried) at least once, so `--gpm-interval` applies: a GPU
    /// whose metrics keep failing is not asked again at every poll.
    computed_once: bool,
    /// The first computed figures were logged with the units NVML reported.
    announced: bool,
}

/// Reads real GPUs through NVML.
pub struct NvmlSource {
    nvml: &'static Nvml,
    devices: Vec<DeviceState>,
    driver_version: String,
    cuda_driver_version: Option<crate::model::cuda::CudaVersion>,
    xids: Arc<Mutex<HashMap<u32, u64>>>,
    stop: Arc<AtomicBool>,
    xid_thread: Option<JoinHandle<()>>,
    /// How often a GPM sample is taken (`--gpm-interval`); full polls in between repeat
    /// the last figures.
    gpm_interval: Duration,
}

impl NvmlSource {
    /// Loads NVML and reads each GPU's identity once. A GPU whose identity cannot be read
    /// is skipped with a warning rather than stopping the agent. `gpm` (`--gpm`) says
    /// whether GPM is read at all; GPM windows are measured on `clock`, the clock the
    /// sampler stamps its polls with.
    pub fn open(
        clock: &dyn crate::model::clock::Clock,
        gpm: bool,
    ) -> Result<NvmlSource, SourceError> {
        let nvml = nvml()?;
        let count = nvml.device_count().map_err(|e| SourceError::NvmlInit {
            call: "device_count",
            message: e.to_string(),
        })?;
        let driver_version = nvml
            .sys_driver_version()
            .map_err(|e| SourceError::NvmlInit {
                call: "sys_driver_version",
                message: e.to_string(),
            })?;
        let cuda_driver_version = cuda_driver_version(nvml);
        let mut devices = Vec::new();
        for index in 0..count {
            match Self::open_device(nvml, index) {
                Ok(d) => devices.push(d),
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "skipping a GPU whose identity cannot be read")
                }
            }
        }
        if gpm {
            for d in &mut devices {
                prime_gpm(d, clock.mono());
            }
        } else {
            tracing::info!("--gpm off: GPM is not read; DCGM_FI_PROF_* are absent");
            for d in &mut devices {
                d.unsupported.insert(Field::Prof);
            }
        }
        let xids = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let xid_thread = spawn_xid_watcher(nvml, &devices, xids.clone(), stop.clone());
        Ok(NvmlSource {
            nvml,
            devices,
            driver_version,
            cuda_driver_version,
            xids,
            stop,
            xid_thread,
            gpm_interval: Duration::ZERO,
        })
    }

    /// Takes a GPM sample at most every `interval` (by default every full poll). Computing
    /// the ten metrics costs NVML about 1.8 ms per GPU on an H200, so a node with many GPUs
    /// may trade the window's length for CPU (docs/gpm.md).
    pub fn with_gpm_interval(mut self, interval: Duration) -> Self {
        self.gpm_interval = interval;
        self
    }

    fn open_device(nvml: &'static Nvml, index: u32) -> Result<DeviceState, NvmlError> {
        let device = nvml.device_by_index(index)?;
        let uuid = device.uuid()?;
        let pci_bus_id = device.pci_info()?.bus_id;
        let model = device.name()?;
        let minor = device.minor_number().unwrap_or(index);
        let mut d = DeviceState {
            device,
            id: GpuIdentity {
                index,
                uuid,
                pci_bus_id: normalize_bus_id(&pci_bus_id),
                device: format!("nvidia{minor}"),
                model,
            },
            unsupported: HashSet::new(),
            last_util_ts: 0,
            lost: false,
            names: HashMap::new(),
            procs: Vec::new(),
            slot: HashMap::new(),
            last_energy: None,
            last_replays: None,
            gpm: GpmState::default(),
            mig: Vec::new(),
            mig_unsupported: false,
        };
        refresh_mig(&mut d, &mut Vec::new());
        Ok(d)
    }

    /// Number of GPUs being read.
    pub fn gpu_count(&self) -> usize {
        self.devices.len()
    }
}

/// GPM is a monitoring read, like every other call here; NVML documents no privilege for
/// it. Should a driver still refuse it (`NoPermission`), that is a standing property of the
/// deployment, not a failure to count every poll: it is reported once and cached as "not
/// supported", so the GPU simply has no `DCGM_FI_PROF_*` series.
fn gpm_permission<T>(gpu: u32, r: Result<T, NvmlError>) -> Result<T, NvmlError> {
    match r {
        Err(NvmlError::NoPermission) => {
            tracing::warn!(
                gpu,
                "NVML refused GPM (NoPermission); DCGM_FI_PROF_* will be absent for this GPU (docs/gpm.md)"
            );
            Err(NvmlError::NotSupported)
        }
        other => other,
    }
}

/// Asks whether the GPU has GPM (logging the verdict once at start) and, if so, takes a
/// first sample, so a first poll that comes at least [`gpm::MIN_WINDOW`] later already has
/// a window to compute over. Failures here are left to the polls to retry (and count);
/// only a clear "no" is cached.
fn prime_gpm(d: &mut DeviceState, at: Duration) {
    let gpu = d.id.index;
    match gpm_permission(gpu, d.device.gpm_support()) {
        Ok(true) => d.gpm.supported = true,
        Ok(false) => {
            tracing::info!(
                gpu,
                "no GPM on this GPU (pre-Hopper); DCGM_FI_PROF_* are absent"
            );
            d.unsupported.insert(Field::Prof);
            return;
        }
        Err(
            e @ (NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)),
        ) => {
            // An older driver without the GPM symbols lands here too.
            tracing::info!(gpu, error = %e, "GPM unavailable; DCGM_FI_PROF_* are absent");
            d.unsupported.insert(Field::Prof);
            return;
        }
        Err(e) => {
            tracing::debug!(gpu, error = %e, "GPM support query failed; the polls retry it");
            return;
        }
    }
    match gpm_permission(gpu, d.device.gpm_sample()) {
        Ok(s) => {
            d.gpm.ring.advance(at, s, |_, _, _| ());
            tracing::info!(
                gpu,
                "GPM supported: DCGM_FI_PROF_* are read every --gpm-interval"
            );
        }
        Err(e) => tracing::debug!(gpu, error = %e, "first GPM sample failed; the polls retry it"),
    }
}

/// `nvmlDeviceGetMigMode`'s "enabled" (`NVML_DEVICE_MIG_ENABLE`).
const MIG_ENABLED: u32 = 1;

/// The UUIDs (`MIG-<uuid>`) of the MIG devices on `dev` while MIG mode is on; empty while it
/// is off. The kubelet's pod-resources name MIG slices by these (docs/attribution.md).
fn read_mig_devices(dev: &Device<'static>) -> Result<Vec<String>, NvmlError> {
    if dev.mig_mode()?.current != MIG_ENABLED {
        return Ok(Vec::new());
    }
    let slots = dev.mig_device_count()?;
    let mut out = Vec::new();
    for i in 0..slots {
        match dev.mig_device_by_index(i) {
            Ok(m) => out.push(m.uuid()?),
            // An empty slot: fewer instances are configured than the GPU can hold.
            Err(NvmlError::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Re-reads `d`'s MIG devices: a GPU or driver without MIG is asked once in the agent's
/// life; a failed read keeps the last list and is counted under `call="mig"`.
fn refresh_mig(d: &mut DeviceState, errors: &mut Vec<(&'static str, u64)>) {
    if d.mig_unsupported || d.lost {
        return;
    }
    match read_mig_devices(&d.device).map_err(|e| classify("mig", e)) {
        Ok(list) => {
            if list != d.mig {
                tracing::info!(gpu = d.id.index, mig_devices = ?list, "MIG devices");
            }
            d.mig = list;
        }
        Err(SampleError::NotSupported) => d.mig_unsupported = true,
        Err(e) => {
            tracing::debug!(gpu = d.id.index, error = %e, "reading MIG devices failed; keeping the last list");
            errors.push(("mig", 1));
        }
    }
}

/// NVML gives `00000000:06:00.0` on Linux; older drivers gave a 4-digit domain. dcgm-exporter
/// exports the 8-digit form, so dashboards that join on it see one spelling.
fn normalize_bus_id(id: &str) -> String {
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() < 8 => format!("{domain:0>8}:{rest}"),
        _ => id.to_string(),
    }
}

impl Drop for NvmlSource {
    fn drop(&mut self) {
        // The watcher sees the flag when its current wait ends (up to `XID_WAIT_MS`). It is
        // not joined: NVML is never shut down (the handle is 'static), so the thread may
        // finish on its own, and the agent's shutdown does not wait out an XID wait.
        self.stop.store(true, Ordering::Relaxed);
        drop(self.xid_thread.take());
    }
}

/// The CUDA version the driver supports, read once: it changes only with the driver, and a
/// driver upgrade restarts the node's pods. `sys_cuda_driver_version` is NVML's
/// `nvmlSystemGetCudaDriverVersion_v2`, which loads `libcuda.so.1` (`cuDriverGetVersion`):
/// the agent's image must carry no CUDA compat libraries, or it would read theirs
/// (docs/cuda.md). Without `libcuda.so.1` the figure is absent, not guessed.
fn cuda_driver_version(nvml: &Nvml) -> Option<crate::model::cuda::CudaVersion> {
    match nvml.sys_cuda_driver_version() {
        Ok(v) => {
            let version = crate::model::cuda::CudaVersion::from_nvml(v);
            if version.is_none() {
                tracing::warn!(
                    value = v,
                    "NVML's CUDA driver version is not a version; CUDA checks are off"
                );
            }
            version
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the driver's CUDA version (nvmlSystemGetCudaDriverVersion_v2); CUDA checks are off");
            None
        }
    }
}

impl GpuSource for NvmlSource {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn poll(&mut self, now: Duration, req: PollRequest) -> RawPoll {
        let mut out = RawPoll {
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version,
            ..RawPoll::default()
        };
        let nvml = self.nvml;
        let gpm_interval = self.gpm_interval;
        out.gpus.reserve(self.devices.len());
        for d in &mut self.devices {
            // Looked up under the lock per GPU: no copy of the map per poll.
            let xid = self
                .xids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&d.id.index)
                .copied();
            let s = Self::sample_device(nvml, d, xid, req, now, gpm_interval, &mut out);
            out.gpus.push(s);
        }
        out
    }

    fn memory(&mut self, _now: Duration) -> Vec<MemoryReading> {
        self.devices
            .iter_mut()
            .map(|d| {
                if d.lost {
                    return (d.id.index, Err(SampleError::GpuLost));
                }
                let r = d
                    .device
                    .memory_info()
                    .map(|m| MemoryInfo {
                        total: m.total,
                        used: m.used,
                        free: m.free,
                        reserved: m.reserved,
                    })
                    .map_err(|e| classify("memory", e));
                if r == Err(SampleError::GpuLost) {
                    d.lost = true;
                }
                (d.id.index, r)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::device::Reader;
    use super::*;

    #[test]
    fn bus_ids_get_eight_digit_domains() {
        assert_eq!(normalize_bus_id("0000:06:00.0"), "00000000:06:00.0");
        assert_eq!(normalize_bus_id("00000000:06:00.0"), "00000000:06:00.0");
    }

    #[test]
    fn gpm_no_permission_is_cached_as_unavailable() {
        assert!(matches!(
            gpm_permission::<()>(0, Err(NvmlError::NoPermission)),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(
            gpm_permission::<()>(0, Err(NvmlError::Unknown)),
            Err(NvmlError::Unknown)
        ));
        assert_eq!(gpm_permission(0, Ok(7)).ok(), Some(7));
        // Through the reader: cached, not counted, and never asked again.
        let mut unsupported = HashSet::new();
        let mut errors = Vec::new();
        let mut r = Reader {
            unsupported: &mut unsupported,
            errors: &mut errors,
            lost: false,
        };
        let mut calls = 0;
        for _ in 0..3 {
            let v: Option<()> = r.read(Field::Prof, || {
                calls += 1;
                gpm_permission(0, Err(NvmlError::NoPermission))
            });
            assert_eq!(v, None);
        }
        assert_eq!(calls, 1);
        assert!(errors.is_empty());
        assert!(unsupported.contains(&Field::Prof));
    }

    #[test]
    fn errors_classify() {
        assert_eq!(
            classify("x", NvmlError::NotSupported),
            SampleError::NotSupported
        );
        assert_eq!(
            classify("x", NvmlError::FunctionNotFound),
            SampleError::NotSupported
        );
        assert_eq!(classify("x", NvmlError::GpuLost), SampleError::GpuLost);
        assert!(matches!(
            classify("power", NvmlError::Unknown),
            SampleError::Failed { call: "power", .. }
        ));
    }

    #[test]
    fn opening_without_a_driver_is_a_clear_error() {
        // CI machines have no NVIDIA driver: opening must fail with a message that says
        // what is missing and what to do, not panic.
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return;
        }
        match NvmlSource::open(&crate::model::clock::SystemClock::new(), true) {
            Ok(_) => panic!("NVML opened on a machine without /dev/nvidiactl"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("libnvidia-ml.so.1"), "{msg}");
                assert!(msg.contains("--backend sim"), "{msg}");
            }
        }
    }
}
