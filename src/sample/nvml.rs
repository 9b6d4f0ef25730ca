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
use crate::snapshot::{
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
    /// Largest process-utilization timestamp seen, passed back to NVML (DESIGN §4).
    last_util_ts: u64,
    lost: bool,
    names: HashMap<u32, String>,
    /// Last slow-counter readings, reported between their (less frequent) reads.
    last_energy: Option<u64>,
    last_replays: Option<u64>,
    gpm: GpmState,
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
    pub fn open(clock: &dyn crate::clock::Clock, gpm: bool) -> Result<NvmlSource, SourceError> {
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
        Ok(DeviceState {
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
            last_energy: None,
            last_replays: None,
            gpm: GpmState::default(),
        })
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

/// NVML gives `00000000:06:00.0` on Linux; older drivers gave a 4-digit domain. dcgm-exporter
/// exports the 8-digit form, so dashboards that join on it see one spelling.
fn normalize_bus_id(id: &str) -> String {
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() < 8 => format!("{domain:0>8}:{rest}"),
        _ => id.to_string(),
    }
}

fn spawn_xid_watcher(
    nvml: &'static Nvml,
    devices: &[DeviceState],
    xids: Arc<Mutex<HashMap<u32, u64>>>,
    stop: Arc<AtomicBool>,
) -> Option<JoinHandle<()>> {
    use nvml_wrapper::bitmasks::event::EventTypes;
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot create an NVML event set; DCGM_FI_DEV_XID_ERRORS will be absent");
            return None;
        }
    };
    let mut registered = Vec::new();
    for d in devices {
        let supported = d
            .device
            .supported_event_types()
            .map(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
            .unwrap_or(false);
        if !supported {
            continue;
        }
        set = match d
            .device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        {
            Ok(s) => {
                registered.push(d.id.index);
                s
            }
            Err(e) => {
                tracing::warn!(gpu = d.id.index, error = %e.error, "cannot watch XID errors");
                // nvml-wrapper frees the set on failure; start a fresh one for the rest.
                match nvml.create_event_set() {
                    Ok(s) => s,
                    Err(_) => return None,
                }
            }
        };
    }
    if registered.is_empty() {
        return None;
    }
    // A watched GPU reports 0 until its first XID, as dcgm-exporter does.
    {
        let mut map = xids.lock().unwrap_or_else(|e| e.into_inner());
        for index in &registered {
            map.entry(*index).or_insert(0);
        }
    }
    let index_by_uuid: HashMap<String, u32> = devices
        .iter()
        .map(|d| (d.id.uuid.clone(), d.id.index))
        .collect();
    std::thread::Builder::new()
        .name("nvml-xid".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match set.wait(500) {
                    Ok(ev) => {
                        let value = match ev.event_data {
                            Some(XidError::Value(v)) => v,
                            _ => continue,
                        };
                        let Some(index) = ev
                            .device
                            .uuid()
                            .ok()
                            .and_then(|u| index_by_uuid.get(&u).copied())
                        else {
                            continue;
                        };
                        tracing::warn!(gpu = index, xid = value, "XID error");
                        xids.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(index, value);
                    }
                    Err(NvmlError::Timeout) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "XID event wait failed; retrying in 1 s");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        })
        .ok()
}

impl Drop for NvmlSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.xid_thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one field, honouring and updating the NotSupported cache, and counting failures.
struct Reader<'a> {
    unsupported: &'a mut HashSet<Field>,
    errors: &'a mut Vec<(&'static str, u64)>,
    lost: bool,
}

impl Reader<'_> {
    fn read<T>(&mut self, field: Field, f: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
        if self.lost || self.unsupported.contains(&field) {
            return None;
        }
        match f().map_err(|e| classify(field.as_str(), e)) {
            Ok(v) => Some(v),
            Err(SampleError::NotSupported) => {
                self.unsupported.insert(field);
                None
            }
            Err(SampleError::GpuLost) => {
                self.lost = true;
                self.errors.push((field.as_str(), 1));
                None
            }
            Err(SampleError::Failed { .. }) => {
                self.errors.push((field.as_str(), 1));
                None
            }
        }
    }
}

fn field_u64(samples: &[Result<FieldValueSample, NvmlError>], id: u32) -> Result<u64, NvmlError> {
    use nvml_wrapper::enums::device::SampleValue;
    let s = samples
        .iter()
        .filter_map(|s| s.as_ref().ok())
        .find(|s| s.field == FieldId(id))
        .ok_or(NvmlError::NotSupported)?;
    match &s.value {
        Ok(SampleValue::U32(v)) => Ok(u64::from(*v)),
        Ok(SampleValue::U64(v)) => Ok(*v),
        Ok(SampleValue::I64(v)) => u64::try_from(*v).map_err(|_| NvmlError::NotSupported),
        Ok(SampleValue::F64(v)) if *v >= 0.0 => Ok(*v as u64),
        Ok(_) => Err(NvmlError::NotSupported),
        Err(NvmlError::NotSupported) => Err(NvmlError::NotSupported),
        Err(e) => {
            tracing::debug!(field = id, error = %e, "field value failed");
            Err(NvmlError::Unknown)
        }
    }
}

/// One GPM step of a full poll: a new sample (when the window since the previous one is
/// long enough) and the metrics over the pair. Every failure stays inside GPM: it is
/// counted under `call="prof"` (or cached as not supported) and the poll goes on.
fn read_gpm(
    nvml: &'static Nvml,
    dev: &Device<'static>,
    g: &mut GpmState,
    r: &mut Reader<'_>,
    gpu: u32,
    at: Duration,
    interval: Duration,
) -> Option<ProfSample> {
    if r.lost || r.unsupported.contains(&Field::Prof) {
        return None;
    }
    if !g.supported {
        match r.read(Field::Prof, || gpm_permission(gpu, dev.gpm_support()))? {
            true => g.supported = true,
            false => {
                r.unsupported.insert(Field::Prof);
                return None;
            }
        }
    }
    if !g.ring.due(at, gpm::interval_now(interval, g.computed_once)) {
        // A full poll right after the last one (the guard's PollNow), or one inside
        // `--gpm-interval`: keep the window growing and report the figures computed last.
        return g.last;
    }
    let sample = r.read(Field::Prof, || gpm_permission(gpu, dev.gpm_sample()))?;
    let ids = gpm::metric_ids();
    let results = g.ring.advance(at, sample, |older, newer, _window| {
        g.computed_once = true;
        r.read(Field::Prof, || {
            gpm_permission(gpu, gpm_metrics_get(nvml, older, newer, &ids))
        })
    });
    if r.unsupported.contains(&Field::Prof) {
        g.ring.clear();
    }
    let results = match results {
        // The first sample since start (or since a failure): nothing to compute over yet.
        None => return None,
        Some(None) => {
            g.last = None;
            return None;
        }
        Some(Some(v)) => v,
    };
    let raw: Vec<Option<f64>> = PROF_METRICS
        .iter()
        .zip(&results)
        .map(|(m, res)| match res {
            Ok(v) if v.metric_id == m.id => Some(v.value),
            _ => None,
        })
        .collect();
    if !g.announced {
        g.announced = true;
        announce_gpm(gpu, &results);
    }
    g.last = gpm::prof_from_raw(&raw);
    g.last
}

/// Logs, once per GPU, what NVML answered for each GPM metric with the unit string it
/// reported, and warns when that unit is not the one the conversion assumes (docs/gpm.md).
fn announce_gpm(
    gpu: u32,
    results: &[Result<nvml_wrapper::struct_wrappers::gpm::GpmMetricResult, NvmlError>],
) {
    let mut seen = Vec::with_capacity(PROF_METRICS.len());
    for (m, res) in PROF_METRICS.iter().zip(results) {
        match res {
            Ok(v) => {
                let unit = v.metric_info.unit.as_str();
                seen.push(format!("{}={:.3}{}", m.nvml_name, v.value, unit));
                if !unit.is_empty() && !unit.contains(m.unit.expected_token()) {
                    tracing::warn!(
                        gpu,
                        metric = m.nvml_name,
                        unit,
                        expected = m.unit.expected_token(),
                        "NVML reports a GPM unit the conversion does not assume"
                    );
                }
            }
            Err(e) => seen.push(format!("{}=error({e})", m.nvml_name)),
        }
    }
    tracing::info!(gpu, raw = %seen.join(" "), "first GPM figures (raw NVML values and units)");
}

impl NvmlSource {
    fn sample_device(
        nvml: &'static Nvml,
        d: &mut DeviceState,
        xid: Option<u64>,
        req: PollRequest,
        at: Duration,
        gpm_interval: Duration,
        out: &mut RawPoll,
    ) -> GpuSample {
        if d.lost {
            return GpuSample::empty(d.id.clone(), GpuHealth::Lost("GPU is lost".into()));
        }
        let dev = &d.device;
        let mut r = Reader {
            unsupported: &mut d.unsupported,
            errors: &mut out.errors,
            lost: false,
        };
        let memory = r.read(Field::Memory, || {
            dev.memory_info().map(|m| MemoryInfo {
                total: m.total,
                used: m.used,
                free: m.free,
                reserved: m.reserved,
            })
        });
        let util = r.read(Field::Utilization, || dev.utilization_rates());
        let enc = r.read(Field::EncoderUtilization, || {
            dev.encoder_utilization().map(|u| u.utilization)
        });
        let dec = r.read(Field::DecoderUtilization, || {
            dev.decoder_utilization().map(|u| u.utilization)
        });
        let gpu_temp = r.read(Field::GpuTemp, || dev.temperature(TemperatureSensor::Gpu));
        let power = r.read(Field::Power, || dev.power_usage());
        let energy = if req.slow_counters {
            r.read(Field::Energy, || dev.total_energy_consumption())
        } else {
            d.last_energy
        };
        let sm_clock = r.read(Field::SmClock, || dev.clock_info(Clock::SM));
        let mem_clock = r.read(Field::MemClock, || dev.clock_info(Clock::Memory));
        let replays = if req.slow_counters {
            r.read(Field::PcieReplays, || {
                dev.pcie_replay_counter().map(u64::from)
            })
        } else {
            d.last_replays
        };
        // One field-values call covers memory temperature and the four row-remap fields.
        let want_fields = !(r.unsupported.contains(&Field::MemoryTemp)
            && r.unsupported.contains(&Field::RemappedRows));
        let fields = if want_fields && !r.lost {
            match dev.field_values_for(&[
                FieldId(FI_MEMORY_TEMP),
                FieldId(FI_REMAPPED_COR),
                FieldId(FI_REMAPPED_UNC),
                FieldId(FI_REMAPPED_PENDING),
                FieldId(FI_REMAPPED_FAILURE),
            ]) {
                Ok(v) => v,
                Err(e) => {
                    r.errors.push(("field_values", 1));
                    tracing::debug!(gpu = d.id.index, error = %e, "field values failed");
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        let mem_temp = if fields.is_empty() {
            None
        } else {
            r.read(Field::MemoryTemp, || field_u64(&fields, FI_MEMORY_TEMP))
        };
        let remapped = if fields.is_empty() {
            None
        } else {
            r.read(Field::RemappedRows, || {
                Ok(RemappedRows {
                    correctable: field_u64(&fields, FI_REMAPPED_COR)?,
                    uncorrectable: field_u64(&fields, FI_REMAPPED_UNC)?,
                    pending: field_u64(&fields, FI_REMAPPED_PENDING)? != 0,
                    failure: field_u64(&fields, FI_REMAPPED_FAILURE)? != 0,
                })
            })
        };
        let prof = read_gpm(nvml, dev, &mut d.gpm, &mut r, d.id.index, at, gpm_interval);
        let mut procs: Vec<(u32, Option<u64>)> = Vec::new();
        let listed = r.read(Field::Processes, || {
            let compute = dev.running_compute_processes()?;
            // Graphics contexts are rare on compute nodes; a failure there is not fatal.
            let graphics = dev.running_graphics_processes().unwrap_or_default();
            Ok((compute, graphics))
        });
        if let Some((compute, graphics)) = listed {
            for p in compute.into_iter().chain(graphics) {
                let used = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                match procs.iter_mut().find(|(pid, _)| *pid == p.pid) {
                    // A process with compute and graphics contexts is one process.
                    Some(existing) => {
                        existing.1 = match (existing.1, used) {
                            (Some(a), Some(b)) => Some(a.max(b)),
                            (a, b) => a.or(b),
                        }
                    }
                    None => procs.push((p.pid, used)),
                }
            }
        }
        let mut utils: HashMap<u32, (f64, u32)> = HashMap::new();
        let util_ok = req.process_utilization && !procs.is_empty() && {
            let last = d.last_util_ts;
            let res = r.read(Field::ProcessUtilization, || {
                match dev.process_utilization_stats(last) {
                    // No samples since `last` is an empty answer, not a failure (DESIGN §4).
                    Err(NvmlError::NotFound) => Ok(Vec::new()),
                    other => other,
                }
            });
            if let Some(samples) = &res {
                for s in samples {
                    d.last_util_ts = d.last_util_ts.max(s.timestamp);
                    // A pid can be listed more than once: average its samples.
                    let e = utils.entry(s.pid).or_insert((0.0, 0));
                    e.0 += f64::from(s.sm_util.min(100)) / 100.0;
                    e.1 += 1;
                }
            }
            res.is_some()
        };
        let lost = r.lost;
        d.last_energy = energy;
        d.last_replays = replays;
        d.names.retain(|pid, _| procs.iter().any(|(p, _)| p == pid));
        for (pid, used) in procs {
            let name = d
                .names
                .entry(pid)
                .or_insert_with(|| nvml.sys_process_name(pid, 64).unwrap_or_default())
                .clone();
            out.processes.push(ProcessSample {
                pid,
                gpu: d.id.index,
                used_bytes: used,
                sm_util: if util_ok {
                    Some(utils.get(&pid).map_or(0.0, |(sum, n)| sum / f64::from(*n)))
                } else {
                    None
                },
                name,
                owner: Owner::Unknown,
            });
        }
        if lost {
            d.lost = true;
            tracing::error!(gpu = d.id.index, uuid = %d.id.uuid, "GPU fell off the bus (GpuIsLost); it stays reported as lost");
            return GpuSample::empty(d.id.clone(), GpuHealth::Lost("GPU is lost".into()));
        }
        GpuSample {
            id: d.id.clone(),
            health: if memory.is_some() {
                GpuHealth::Ok
            } else {
                GpuHealth::Degraded("memory_info failed".into())
            },
            memory,
            gpu_util_pct: util.as_ref().map(|u| u.gpu),
            mem_copy_util_pct: util.as_ref().map(|u| u.memory),
            enc_util_pct: enc,
            dec_util_pct: dec,
            gpu_temp_c: gpu_temp,
            memory_temp_c: mem_temp.map(|t| t.min(u64::from(u32::MAX)) as u32),
            power_mw: power,
            energy_mj: energy,
            sm_clock_mhz: sm_clock,
            mem_clock_mhz: mem_clock,
            pcie_replays: replays,
            remapped_rows: remapped,
            last_xid: xid,
            prof,
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
            ..RawPoll::default()
        };
        let xids = self.xids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let nvml = self.nvml;
        let gpm_interval = self.gpm_interval;
        for d in &mut self.devices {
            let xid = xids.get(&d.id.index).copied();
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
        match NvmlSource::open(&crate::clock::SystemClock::new(), true) {
            Ok(_) => panic!("NVML opened on a machine without /dev/nvidiactl"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("libnvidia-ml.so.1"), "{msg}");
                assert!(msg.contains("--backend sim"), "{msg}");
            }
        }
    }
}
