//! One GPU's full poll: every field read once through a [`Reader`] that caches
//! `NotSupported` verdicts and counts errors, GPM figures, processes and their memory.

use super::*;

/// Reads one field, honouring and updating the NotSupported cache, and counting failures.
pub(super) struct Reader<'a> {
    pub(super) unsupported: &'a mut HashSet<Field>,
    pub(super) errors: &'a mut Vec<(&'static str, u64)>,
    pub(super) lost: bool,
}

impl Reader<'_> {
    pub(super) fn read<T>(
        &mut self,
        field: Field,
        f: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
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

/// NVML's NVLink data throughput counters (nvml.h `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` /
/// `_RX`): payload KiB, what `nvidia-smi nvlink -gt d` lists per link as "Data Tx/Rx".
const FI_NVLINK_DATA_TX: u32 = 138;
const FI_NVLINK_DATA_RX: u32 = 139;

/// `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`: KiB sent plus received over every link, read with
/// `scopeId = UINT_MAX` (NVML's sum over all links; nvml-wrapper's own call would read link 0
/// only, hence `nvml_scoped`). A GPU without NVLink answers NotSupported, which the reader
/// caches: no series, never a 0. hw/nvlink_h200.py checks the sum against `nvidia-smi nvlink`.
fn nvlink_kib(dev: &Device) -> Result<u64, NvmlError> {
    use nvml_scoped::{field_values_u64, ALL_LINKS};
    let mut v = field_values_u64(
        dev,
        &[
            (FI_NVLINK_DATA_TX, ALL_LINKS),
            (FI_NVLINK_DATA_RX, ALL_LINKS),
        ],
    )?
    .into_iter();
    match (v.next(), v.next()) {
        (Some(tx), Some(rx)) => Ok(tx?.saturating_add(rx?)),
        // NVML fills the array it was given; a short one would be a broken library.
        _ => Err(NvmlError::Unknown),
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
    pub(super) fn sample_device(
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
        if req.slow_counters {
            refresh_mig(d, &mut out.errors);
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
        let nvlink = r.read(Field::NvLink, || nvlink_kib(dev));
        let mut procs = std::mem::take(&mut d.procs);
        procs.clear();
        d.slot.clear();
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
                match d.slot.get(&p.pid) {
                    // A process with compute and graphics contexts is one process.
                    Some(&i) => {
                        let existing = &mut procs[i];
                        existing.1 = match (existing.1, used) {
                            (Some(a), Some(b)) => Some(a.max(b)),
                            (a, b) => a.or(b),
                        }
                    }
                    None => {
                        d.slot.insert(p.pid, procs.len());
                        procs.push((p.pid, used));
                    }
                }
            }
        }
        let mut utils: HashMap<u32, (f64, u32)> = HashMap::new();
        let util_ok = req.process_utilization && !procs.is_empty() && {
            let last = d.last_util_ts;
            let res = r.read(Field::ProcessUtilization, || {
                match dev.process_utilization_stats(last) {
                    // No samples since `last` is an empty answer, not a failure.
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
        let slot = &d.slot;
        d.names.retain(|pid, _| slot.contains_key(pid));
        out.processes.reserve(procs.len());
        for &(pid, used) in &procs {
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
        d.procs = procs;
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
            nvlink_kib: nvlink,
            mig_devices: d.mig.clone(),
        }
    }
}
