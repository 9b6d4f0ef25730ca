//! The simulated backend: plays a [`Scenario`] as if it were NVML. A product feature, not
//! only a test aid: it powers the demo, the tests and the benchmarks on machines with no GPU.

// A `hang` fault blocks the polling thread for real time, as a stuck NVML ioctl does;
// everything else here runs on the time it is given.
#![allow(clippy::disallowed_methods)]

use super::scenario::{
    FaultSpec, GpuSpec, PodPlacement, ProcessSpec, Scenario, ScenarioError, Trajectory,
};
pub use super::sim_world::{scenario_pods, simulated_cgroup, SimProcWriter};
use super::{Field, GpuSource, MemoryReading, PollRequest, RawPoll, SampleError};
use crate::model::ids::fnv64;
use crate::model::snapshot::{
    GpuHealth, GpuIdentity, GpuSample, MemoryInfo, Owner, ProcessSample, MIB,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One expanded GPU of the scenario.
#[derive(Debug, Clone)]
struct SimGpu {
    id: GpuIdentity,
    spec: GpuSpec,
}

/// Shared control over a running simulation: lets a test (or the API double playing the
/// kubelet) kill processes, and reports which processes hit an out-of-memory condition.
#[derive(Debug, Clone, Default)]
pub struct SimHandle {
    inner: Arc<Mutex<SimShared>>,
}

#[derive(Debug, Default)]
struct SimShared {
    /// pid → time from which it is gone.
    killed: HashMap<u32, Duration>,
    /// pid → time from which it is stopped (SIGSTOP): it holds what it had then.
    stopped: HashMap<u32, Duration>,
    /// pid → number of polls at which it wanted more memory than was free.
    ooms: BTreeMap<u32, u64>,
    /// Whether memory-only readings count OOMs too ([`SimHandle::count_ooms_at_every_reading`]).
    every_reading: bool,
    /// How long an allocation is inside the driver ([`SimHandle::set_in_driver`]).
    in_driver: Duration,
}

impl SimHandle {
    /// Ends these processes at `at` (their memory is freed from then on).
    pub fn kill(&self, pids: &[u32], at: Duration) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for &pid in pids {
            s.killed.entry(pid).or_insert(at);
        }
    }

    /// Stops these processes at `at`, as SIGSTOP would: each holds the memory it wanted then
    /// and asks for no more until [`SimHandle::resume`].
    pub fn stop(&self, pids: &[u32], at: Duration) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for &pid in pids {
            s.stopped.entry(pid).or_insert(at);
        }
    }

    /// Lets stopped processes run on (their trajectories go on from the current time).
    pub fn resume(&self, pids: &[u32]) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for pid in pids {
            s.stopped.remove(pid);
        }
    }

    /// The instant up to which a stopped process's trajectory still lands: its stop, plus the
    /// time an allocation spends inside the driver ([`SimHandle::set_in_driver`]).
    fn stopped_at(&self, pid: u32) -> Option<Duration> {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.stopped.get(&pid).map(|at| *at + s.in_driver)
    }

    /// Lets an allocation that lands up to `d` after a process's stop land all the same. Why:
    /// SIGSTOP is taken on the return to user space, so a cudaMalloc already inside the
    /// driver when the signal comes completes (the harness's 2 GiB allocations take about a
    /// millisecond there, docs/validation.md §9p); a scenario's step is the instant it lands.
    pub fn set_in_driver(&self, d: Duration) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .in_driver = d;
    }

    /// Counts OOMs at memory-only readings too, not only at full polls. Why: a neighbour
    /// whose allocation fails only for the 50 ms a killed job's memory takes to come back
    /// fails between two full polls, and the guard asks for none then.
    pub fn count_ooms_at_every_reading(&self) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .every_reading = true;
    }

    fn counts_every_reading(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .every_reading
    }

    /// Processes that asked for more memory than the GPU had free, with how many polls
    /// saw it. A real CUDA process would have died of OOM at the first.
    pub fn ooms(&self) -> BTreeMap<u32, u64> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ooms
            .clone()
    }

    fn killed_at(&self, pid: u32) -> Option<Duration> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .killed
            .get(&pid)
            .copied()
    }

    fn record_oom(&self, pid: u32) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        *s.ooms.entry(pid).or_insert(0) += 1;
    }
}

/// Plays a scenario.
#[derive(Debug)]
pub struct SimSource {
    scenario: Scenario,
    gpus: Vec<SimGpu>,
    handle: SimHandle,
    proc_writer: Option<SimProcWriter>,
    /// When the current `poll`/`memory` call began (real time): a `hang` fault blocks
    /// until this plus what was left of its window at the call's `now`.
    entered: std::time::Instant,
}

/// A UUID-shaped string (8-4-4-4-12 hex) derived from `parts`.
pub fn uuid_from(parts: &[&str]) -> String {
    let a = fnv64(parts);
    let b = fnv64(&[&a.to_string()]);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// The pod UID a placement stands for (given, or derived from namespace/name).
pub fn placement_uid(p: &PodPlacement) -> String {
    p.uid
        .clone()
        .unwrap_or_else(|| uuid_from(&["pod", &p.namespace, &p.name]))
}

/// The 64-hex container ID a placement stands for (given, or derived).
pub fn placement_container_id(p: &PodPlacement) -> String {
    p.container_id.clone().unwrap_or_else(|| {
        let mut s = String::with_capacity(64);
        for i in 0..4 {
            let h = fnv64(&["ctr", &p.namespace, &p.name, &p.container, &i.to_string()]);
            s.push_str(&format!("{h:016x}"));
        }
        s
    })
}

impl Scenario {
    /// Reads, parses and validates a scenario file. (Here, with the simulator's other I/O:
    /// the scenario module itself only parses text.)
    pub fn load(path: &std::path::Path) -> Result<Scenario, ScenarioError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: shown.clone(),
            source,
        })?;
        Scenario::parse(&text, &shown)
    }
}

impl SimSource {
    /// A source playing `scenario`.
    pub fn new(scenario: Scenario) -> Self {
        let mut gpus = Vec::new();
        for spec in &scenario.gpus {
            for _ in 0..spec.count {
                let index = gpus.len() as u32;
                let uuid = spec.uuid.clone().unwrap_or_else(|| {
                    format!(
                        "GPU-{}",
                        uuid_from(&["gpu", &spec.model, &index.to_string()])
                    )
                });
                let pci_bus_id = spec
                    .pci_bus_id
                    .clone()
                    .unwrap_or_else(|| format!("00000000:{:02X}:00.0", 0x10 + index));
                gpus.push(SimGpu {
                    id: GpuIdentity {
                        index,
                        uuid,
                        pci_bus_id,
                        device: format!("nvidia{index}"),
                        model: spec.model.clone(),
                    },
                    spec: spec.clone(),
                });
            }
        }
        SimSource {
            scenario,
            gpus,
            handle: SimHandle::default(),
            proc_writer: None,
            entered: std::time::Instant::now(),
        }
    }

    /// Also keeps a simulated `/proc` under `root` in step with the live processes.
    pub fn with_proc_root(mut self, root: impl Into<std::path::PathBuf>) -> std::io::Result<Self> {
        self.proc_writer = Some(SimProcWriter::new(root)?);
        Ok(self)
    }

    /// The control handle shared with tests.
    pub fn handle(&self) -> SimHandle {
        self.handle.clone()
    }

    /// The scenario being played.
    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    fn scenario_time(&self, now: Duration) -> Duration {
        match self.scenario.repeat_every {
            Some(p) if !p.is_zero() => Duration::from_nanos((now.as_nanos() % p.as_nanos()) as u64),
            _ => now,
        }
    }

    fn lost_at(&self, gpu: u32) -> Option<Duration> {
        self.scenario.faults.iter().find_map(|f| match f {
            FaultSpec::Lost { gpu: g, at } if *g == gpu => Some(*at),
            _ => None,
        })
    }

    /// Whether `field` on `gpu` answers at `now`: Ok, NotSupported or a failure.
    fn field_state(&self, gpu: u32, field: Field, now: Duration) -> Result<(), SampleError> {
        for f in &self.scenario.faults {
            match f {
                FaultSpec::Unsupported {
                    gpu: g,
                    field: name,
                } if *g == gpu && Field::parse(name) == Some(field) => {
                    return Err(SampleError::NotSupported);
                }
                FaultSpec::Error {
                    gpu: g,
                    field: name,
                    from,
                    until,
                } if *g == gpu
                    && Field::parse(name) == Some(field)
                    && now >= *from
                    && until.is_none_or(|u| now < u) =>
                {
                    return Err(SampleError::Failed {
                        call: field.as_str(),
                        message: "injected fault".into(),
                    });
                }
                FaultSpec::Hang {
                    gpu: g,
                    field: name,
                    ..
                } if *g == gpu && Field::parse(name) == Some(field) => {
                    if let Some((at, end)) = f.hang_window() {
                        if now >= at && end.is_none_or(|e| now < e) {
                            self.block(gpu, field, now, end);
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Sleeps as a stuck NVML call would: until the hang's `end` (counted from when the
    /// current call began), or for good.
    fn block(&self, gpu: u32, field: Field, now: Duration, end: Option<Duration>) {
        // An end too far away to represent blocks for good.
        let deadline = end.and_then(|e| self.entered.checked_add(e.saturating_sub(now)));
        if deadline.is_some_and(|d| d <= std::time::Instant::now()) {
            return;
        }
        tracing::warn!(
            gpu,
            call = field.as_str(),
            until = ?end,
            "simulated hang: the call blocks"
        );
        loop {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(std::time::Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left);
        }
    }

    fn alive(&self, p: &ProcessSpec, now: Duration, t: Duration) -> bool {
        if t < p.start || p.stop.is_some_and(|s| t >= s) {
            return false;
        }
        self.handle.killed_at(p.pid).is_none_or(|k| now < k)
    }

    /// Processes alive on `gpu` with the MiB each holds. Memory goes to processes in the
    /// order they started; one that wants more than is left gets only what is left, as a
    /// failed cudaMalloc would leave it, and is recorded as having hit OOM. A workspace that
    /// does not fit is not allocated at all: the process keeps its base (what a training step
    /// whose activations fail to allocate holds), not a part of the workspace.
    fn allocations(&self, gpu: &SimGpu, now: Duration, record: bool) -> Vec<(&ProcessSpec, u64)> {
        let t = self.scenario_time(now);
        let mut procs: Vec<&ProcessSpec> = self
            .scenario
            .processes
            .iter()
            .filter(|p| p.gpu == gpu.id.index && self.alive(p, now, t))
            .collect();
        procs.sort_by_key(|p| p.start);
        let mut left = gpu.spec.memory_mib - gpu.spec.reserved_mib - gpu.spec.base_used_mib;
        procs
            .into_iter()
            .map(|p| {
                let at = match self.handle.stopped_at(p.pid) {
                    Some(stop) => t.min(self.scenario_time(stop)),
                    None => t,
                };
                let want = p.memory.mib_at(at.saturating_sub(p.start));
                let got = match p.memory {
                    Trajectory::Workspace { base, .. } if want > left => base.min(left),
                    _ => want.min(left),
                };
                if got < want && record {
                    self.handle.record_oom(p.pid);
                }
                left -= got;
                (p, got)
            })
            .collect()
    }

    /// The GPU's memory at `now`; `record`: count the OOMs it shows.
    fn memory_of(&self, gpu: &SimGpu, now: Duration, record: bool) -> MemoryInfo {
        let procs: u64 = self
            .allocations(gpu, now, record)
            .iter()
            .map(|(_, m)| m)
            .sum();
        let s = &gpu.spec;
        let used = (s.base_used_mib + procs) * MIB;
        let total = s.memory_mib * MIB;
        let reserved = s.reserved_mib * MIB;
        MemoryInfo {
            total,
            used,
            free: total - reserved - used,
            reserved,
        }
    }

    fn latest_xid(&self, gpu: u32, now: Duration) -> Option<u64> {
        self.scenario
            .faults
            .iter()
            .filter_map(|f| match f {
                FaultSpec::Xid { gpu: g, at, value } if *g == gpu && *at <= now => {
                    Some((*at, *value))
                }
                _ => None,
            })
            .max_by_key(|(at, _)| *at)
            .map_or(Some(0), |(_, v)| Some(v))
    }

    fn sample_gpu(
        &self,
        gpu: &SimGpu,
        now: Duration,
        req: PollRequest,
        out: &mut RawPoll,
    ) -> GpuSample {
        let idx = gpu.id.index;
        if self.lost_at(idx).is_some_and(|at| now >= at) {
            out.errors.push((Field::Memory.as_str(), 1));
            return GpuSample::empty(gpu.id.clone(), GpuHealth::Lost("GPU is lost".into()));
        }
        let s = &gpu.spec;
        let mut errors: Vec<&'static str> = Vec::new();
        let mut read = |field: Field, value: Option<u64>| -> Option<u64> {
            match self.field_state(idx, field, now) {
                Ok(()) => value,
                Err(SampleError::NotSupported) => None,
                Err(_) => {
                    errors.push(field.as_str());
                    None
                }
            }
        };
        let allocs = self.allocations(gpu, now, true);
        let derived_util = (allocs
            .iter()
            .map(|(p, _)| p.sm_util_at(now.saturating_sub(p.start)).unwrap_or(0.0))
            .sum::<f64>()
            * 100.0)
            .round()
            .min(100.0) as u64;
        let memory = read(Field::Memory, Some(0)).map(|_| self.memory_of(gpu, now, false));
        let gpu_util = read(
            Field::Utilization,
            Some(s.gpu_util_pct.map_or(derived_util, u64::from)),
        );
        let mem_copy = read(Field::Utilization, s.mem_copy_util_pct.map(u64::from));
        let enc = read(Field::EncoderUtilization, s.enc_util_pct.map(u64::from));
        let dec = read(Field::DecoderUtilization, s.dec_util_pct.map(u64::from));
        let gpu_temp = read(Field::GpuTemp, s.gpu_temp_c.map(u64::from));
        let mem_temp = read(Field::MemoryTemp, s.memory_temp_c.map(u64::from));
        let power_mw = read(Field::Power, s.power_w.map(|w| (w * 1000.0).round() as u64));
        let energy = read(
            Field::Energy,
            s.power_w.map(|w| {
                s.energy_start_mj
                    .saturating_add((w * 1000.0 * now.as_secs_f64()) as u64)
            }),
        );
        let sm_clock = read(Field::SmClock, s.sm_clock_mhz.map(u64::from));
        let mem_clock = read(Field::MemClock, s.mem_clock_mhz.map(u64::from));
        let replays = read(Field::PcieReplays, s.pcie_replays);
        let remapped = read(Field::RemappedRows, s.remapped_rows.map(|_| 0)).and(s.remapped_rows);
        // The GPM figures, as NVML's GPM gives them on Hopper and newer (already in DCGM's
        // units: ratios 0..1, bytes per second).
        let prof = read(Field::Prof, s.prof.map(|_| 0)).and(s.prof);
        let nvlink = read(
            Field::NvLink,
            s.nvlink_kib_per_second
                .map(|r| (r as f64 * now.as_secs_f64()) as u64),
        );
        let procs_ok = read(Field::Processes, Some(0)).is_some();
        let util_ok = req.process_utilization && read(Field::ProcessUtilization, Some(0)).is_some();
        if procs_ok {
            for (p, mib) in &allocs {
                out.processes.push(ProcessSample {
                    pid: p.pid,
                    gpu: idx,
                    used_bytes: Some(mib * MIB),
                    sm_util: if util_ok {
                        p.sm_util_at(now.saturating_sub(p.start))
                    } else {
                        None
                    },
                    name: p.name.clone(),
                    owner: Owner::Unknown,
                });
            }
        }
        for call in errors {
            out.errors.push((call, 1));
        }
        let as_u32 = |v: Option<u64>| v.map(|v| v.min(u64::from(u32::MAX)) as u32);
        GpuSample {
            id: gpu.id.clone(),
            health: if memory.is_some() {
                GpuHealth::Ok
            } else {
                GpuHealth::Degraded("memory read failed".into())
            },
            memory,
            gpu_util_pct: as_u32(gpu_util),
            mem_copy_util_pct: as_u32(mem_copy),
            enc_util_pct: as_u32(enc),
            dec_util_pct: as_u32(dec),
            gpu_temp_c: as_u32(gpu_temp),
            memory_temp_c: as_u32(mem_temp),
            power_mw: as_u32(power_mw),
            energy_mj: energy,
            sm_clock_mhz: as_u32(sm_clock),
            mem_clock_mhz: as_u32(mem_clock),
            pcie_replays: replays,
            remapped_rows: remapped,
            last_xid: self.latest_xid(idx, now),
            prof,
            nvlink_kib: nvlink,
            mig_devices: gpu.spec.mig_devices.clone(),
        }
    }
}

impl GpuSource for SimSource {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn poll(&mut self, now: Duration, req: PollRequest) -> RawPoll {
        self.entered = std::time::Instant::now();
        let mut out = RawPoll {
            driver_version: self.scenario.driver_version.clone(),
            cuda_driver_version: self.scenario.cuda_version(),
            ..RawPoll::default()
        };
        let gpus = self.gpus.clone();
        for gpu in &gpus {
            let sample = self.sample_gpu(gpu, now, req, &mut out);
            out.gpus.push(sample);
        }
        if let Some(mut w) = self.proc_writer.take() {
            let t = self.scenario_time(now);
            let live: Vec<&ProcessSpec> = self
                .scenario
                .processes
                .iter()
                .filter(|p| self.alive(p, now, t))
                .collect();
            w.sync(&live);
            self.proc_writer = Some(w);
        }
        out
    }

    fn memory(&mut self, now: Duration) -> Vec<MemoryReading> {
        self.entered = std::time::Instant::now();
        self.gpus
            .iter()
            .map(|g| {
                let idx = g.id.index;
                if self.lost_at(idx).is_some_and(|at| now >= at) {
                    return (idx, Err(SampleError::GpuLost));
                }
                (
                    idx,
                    self.field_state(idx, Field::Memory, now)
                        .map(|()| self.memory_of(g, now, self.handle.counts_every_reading())),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(text: &str) -> SimSource {
        SimSource::new(Scenario::parse(text, "t").unwrap())
    }

    const TWO: &str = r#"
gpus:
  - model: NVIDIA A10G
    count: 2
    memory_mib: 1000
    reserved_mib: 100
    base_used_mib: 50
    power_w: 100
    gpu_temp_c: 40
processes:
  - pid: 10
    gpu: 0
    memory: {constant: 200}
    sm_util: 0.5
  - pid: 11
    gpu: 0
    start: 1s
    memory: {linear: {from: 100, per_second: 100}}
faults:
  - {kind: unsupported, gpu: 1, field: gpu_temp}
  - {kind: lost, gpu: 1, at: 10s}
  - {kind: xid, gpu: 0, at: 2s, value: 79}
"#;

    const ALL: PollRequest = PollRequest {
        process_utilization: true,
        slow_counters: true,
    };

    #[test]
    fn memory_sums_processes_and_respects_reserved() {
        let mut s = source(TWO);
        let p = s.poll(Duration::ZERO, ALL);
        let m = p.gpus[0].memory.unwrap();
        assert_eq!(m.total, 1000 * MIB);
        assert_eq!(m.used, 250 * MIB);
        assert_eq!(m.free, 650 * MIB);
        assert_eq!(m.total, m.used + m.free + m.reserved);
        assert_eq!(p.processes.len(), 1);
        assert_eq!(p.processes[0].sm_util, Some(0.5));
        assert_eq!(p.gpus[0].gpu_util_pct, Some(50));
    }

    #[test]
    fn growth_is_capped_at_free_memory_and_recorded_as_oom() {
        let mut s = source(TWO);
        let h = s.handle();
        // At t=1s+10s the grower wants 1100 MiB; only 650 MiB is allocatable beside pid 10.
        let p = s.poll(Duration::from_secs(11), ALL);
        let m = p.gpus[0].memory.unwrap();
        assert_eq!(m.free, 0);
        assert_eq!(h.ooms().get(&11), Some(&1));
        assert!(!h.ooms().contains_key(&10));
    }

    #[test]
    fn a_workspace_that_does_not_fit_keeps_its_base_and_is_an_oom() {
        let sc = "gpus:\n  - {model: X, memory_mib: 1000}\nprocesses:\n  - {pid: 10, gpu: 0, memory: {constant: 500}}\n  - {pid: 11, gpu: 0, start: 1s, memory: {workspace: {base: 300, mib: 300, every: 1s, holds: 500ms}}}\n";
        let mut s = source(sc);
        let h = s.handle();
        // 1.2 s: the workspace (600 MiB in all) does not fit beside 500: only the base.
        let m = s.poll(Duration::from_millis(1200), ALL).gpus[0]
            .memory
            .unwrap();
        assert_eq!(m.used, 800 * MIB);
        assert_eq!(h.ooms().get(&11), Some(&1));
        // 1.7 s: the workspace is out; the base fits.
        let m = s.poll(Duration::from_millis(1700), ALL).gpus[0]
            .memory
            .unwrap();
        assert_eq!(m.used, 800 * MIB);
        assert_eq!(h.ooms().get(&11), Some(&1));
    }

    #[test]
    fn memory_only_readings_count_ooms_only_when_asked() {
        let mut s = source(TWO);
        let h = s.handle();
        // At t=11s the grower wants more than is free: a memory-only reading counts nothing...
        s.memory(Duration::from_secs(11));
        assert!(h.ooms().is_empty());
        // ...until asked to, once per reading; a full poll still counts once.
        h.count_ooms_at_every_reading();
        s.memory(Duration::from_secs(11));
        assert_eq!(h.ooms().get(&11), Some(&1));
        s.poll(Duration::from_secs(11), ALL);
        assert_eq!(h.ooms().get(&11), Some(&2));
    }

    #[test]
    fn a_stopped_process_holds_its_memory_but_an_allocation_inside_the_driver_lands() {
        let sc = "gpus:\n  - {model: X, memory_mib: 10000}\nprocesses:\n  - {pid: 10, gpu: 0, memory: {steps: [{at: 0s, mib: 100}, {at: 10ms, mib: 2148}, {at: 20ms, mib: 4196}]}}\n";
        let used = |s: &mut SimSource, ms| {
            s.poll(Duration::from_millis(ms), ALL).gpus[0]
                .memory
                .map(|m| m.used)
        };
        let mut s = source(sc);
        let h = s.handle();
        // Stopped 9.5 ms in: the step landing at 10 ms was not in the driver yet.
        h.stop(&[10], Duration::from_micros(9500));
        assert_eq!(used(&mut s, 30), Some(100 * MIB));
        // An allocation 1 ms inside the driver: the 10-ms step lands, the 20-ms one never.
        h.set_in_driver(Duration::from_millis(1));
        assert_eq!(used(&mut s, 30), Some(2148 * MIB));
        // Resumed, it goes on from now.
        h.resume(&[10]);
        assert_eq!(used(&mut s, 30), Some(4196 * MIB));
    }

    #[test]
    fn killed_processes_free_their_memory() {
        let mut s = source(TWO);
        s.handle().kill(&[10], Duration::from_secs(1));
        let p = s.poll(Duration::from_millis(500), ALL);
        assert_eq!(p.processes.len(), 1);
        let p = s.poll(Duration::from_millis(1500), ALL);
        assert!(p.processes.iter().all(|p| p.pid != 10));
    }

    #[test]
    fn faults_apply() {
        let mut s = source(TWO);
        let p = s.poll(Duration::from_secs(3), ALL);
        assert_eq!(p.gpus[1].gpu_temp_c, None, "unsupported is absent");
        assert_eq!(p.gpus[0].gpu_temp_c, Some(40));
        assert_eq!(p.gpus[0].last_xid, Some(79));
        assert_eq!(p.gpus[1].last_xid, Some(0), "watched, none seen yet");
        let p = s.poll(Duration::from_secs(10), ALL);
        assert!(matches!(p.gpus[1].health, GpuHealth::Lost(_)));
        assert_eq!(
            p.gpus[0].health,
            GpuHealth::Ok,
            "the other GPU keeps answering"
        );
        let mem = s.memory(Duration::from_secs(10));
        assert_eq!(mem[1].1, Err(SampleError::GpuLost));
        assert!(mem[0].1.is_ok());
    }

    #[test]
    fn energy_counter_grows_with_power() {
        let mut s = source(TWO);
        let a = s.poll(Duration::from_secs(1), ALL).gpus[0]
            .energy_mj
            .unwrap();
        let b = s.poll(Duration::from_secs(2), ALL).gpus[0]
            .energy_mj
            .unwrap();
        assert_eq!(b - a, 100_000);
    }

    #[test]
    fn process_utilization_only_when_asked() {
        let mut s = source(TWO);
        let p = s.poll(
            Duration::ZERO,
            PollRequest {
                process_utilization: false,
                slow_counters: true,
            },
        );
        assert_eq!(p.processes[0].sm_util, None);
    }

    #[test]
    fn error_faults_count_and_end() {
        let mut s = source(
            "gpus:\n  - {model: X, memory_mib: 100, power_w: 5}\nfaults:\n  - {kind: error, gpu: 0, field: power, from: 1s, until: 2s}\n",
        );
        let p = s.poll(Duration::from_millis(1500), ALL);
        assert_eq!(p.gpus[0].power_mw, None);
        assert_eq!(p.errors, vec![("power", 1)]);
        let p = s.poll(Duration::from_millis(2500), ALL);
        assert_eq!(p.gpus[0].power_mw, Some(5000));
        assert!(p.errors.is_empty());
    }

    #[test]
    fn hang_faults_block_the_call_until_the_window_ends() {
        let mut s = source(
            "gpus:\n  - {model: X, memory_mib: 100, power_w: 5}\n  - {model: X, memory_mib: 100, power_w: 5}\nfaults:\n  - {kind: hang, gpu: 1, field: power, at: 1s, for: 300ms}\n  - {kind: hang, gpu: 0, field: memory, at: 5s, until: 5200ms}\n",
        );
        let timed = |s: &mut SimSource, at: u64| {
            let t0 = std::time::Instant::now();
            let p = s.poll(Duration::from_millis(at), ALL);
            (p, t0.elapsed())
        };
        let (_, took) = timed(&mut s, 900);
        assert!(
            took < Duration::from_millis(100),
            "before the window: {took:?}"
        );
        // Inside the window: blocks for what is left of it (200 ms), then answers.
        let (p, took) = timed(&mut s, 1100);
        assert!(took >= Duration::from_millis(190), "{took:?}");
        assert!(
            took < Duration::from_secs(1),
            "blocked once, not per read: {took:?}"
        );
        assert_eq!(p.gpus[1].power_mw, Some(5000), "a hang that ends answers");
        assert!(p.errors.is_empty());
        let (_, took) = timed(&mut s, 1300);
        assert!(
            took < Duration::from_millis(100),
            "after the window: {took:?}"
        );
        // The memory-only read of the fast watch hangs too.
        let t0 = std::time::Instant::now();
        let mem = s.memory(Duration::from_millis(5100));
        assert!(t0.elapsed() >= Duration::from_millis(90));
        assert!(mem[0].1.is_ok());
    }

    #[test]
    fn prof_figures_follow_the_scenario_and_its_faults() {
        let mut s = source(
            r#"
gpus:
  - model: NVIDIA H100 80GB HBM3
    count: 3
    memory_mib: 1000
    prof: {gr_engine_active: 0.83, sm_active: 0.76, pipe_tensor_active: 0.7, pipe_fp64_active: 0, pcie_rx_bytes: 3.4e8}
  - model: NVIDIA A10G
    memory_mib: 1000
faults:
  - {kind: unsupported, gpu: 1, field: prof}
  - {kind: error, gpu: 2, field: prof, from: 1s, until: 2s}
"#,
        );
        let p = s.poll(Duration::ZERO, ALL);
        let g0 = p.gpus[0].prof.unwrap();
        assert_eq!(g0.gr_engine_active, Some(0.83));
        assert_eq!(g0.sm_active, Some(0.76));
        assert_eq!(g0.pipe_tensor_active, Some(0.7));
        assert_eq!(g0.pipe_fp64_active, Some(0.0));
        assert_eq!(g0.pcie_rx_bytes_per_second, Some(3.4e8));
        assert_eq!(g0.sm_occupancy, None, "left out: no series");
        assert_eq!(g0.pcie_tx_bytes_per_second, None);
        assert_eq!(p.gpus[1].prof, None, "unsupported removes them");
        assert_eq!(p.gpus[2].prof, Some(g0));
        assert_eq!(p.gpus[3].prof, None, "no prof block, no figures");
        let p = s.poll(Duration::from_millis(1500), ALL);
        assert_eq!(
            p.gpus[2].prof, None,
            "a failing GPM read leaves them absent"
        );
        assert_eq!(p.errors, vec![("prof", 1)]);
        assert!(
            p.gpus[2].memory.is_some(),
            "and the rest of the poll answers"
        );
        assert_eq!(p.gpus[2].health, GpuHealth::Ok);
        let p = s.poll(Duration::from_millis(2500), ALL);
        assert_eq!(p.gpus[2].prof, Some(g0));
    }

    #[test]
    fn generated_ids_are_stable_and_well_formed() {
        let a = source(TWO);
        let b = source(TWO);
        assert_eq!(a.gpus[0].id.uuid, b.gpus[0].id.uuid);
        assert_ne!(a.gpus[0].id.uuid, a.gpus[1].id.uuid);
        assert_eq!(a.gpus[0].id.uuid.len(), 4 + 36);
        assert_eq!(a.gpus[1].id.pci_bus_id, "00000000:11:00.0");
    }
}
