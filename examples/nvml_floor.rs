//! The NVML floor: the calls gpu-warden makes per full poll, in a tight loop, with nothing
//! else — no snapshot, no attribution, no rendering. `hw/perf_h200.py` compares the
//! agent's per-poll cost with this (issue 7).
//!
//!     cargo run --release --example nvml_floor -- [iterations] [--with-slow-counters]
//!     cargo run --release --example nvml_floor -- [iterations] --per-call
//!
//! `--per-call` times each kind of call on its own (mean µs per call over every GPU and
//! iteration), including the per-process calls gpu-warden makes on a slower cadence
//! (process utilization every 5 s, a process's name once per pid), so a poll that slows
//! down with many processes can be pinned to the call that does it. The two process lists
//! are also timed as their count-only halves (`*_count`): nvml-wrapper makes both calls
//! for every list.
//!
//!     cargo run --release --example nvml_floor -- --cadence --seconds 60 [--gpm-interval-s 10] [--xid]
//!
//! `--cadence` is the floor at the agent's cadence (issue 20): a long-running process that
//! makes the agent's NVML calls on the agent's schedule and nothing else — every second the
//! full-poll calls; energy and the PCIe replay counter every 10th poll (`--slow-every`);
//! process utilization every 5 s (`--util-every`) when the GPU lists processes; a process's
//! name once per pid; with `--gpm-interval-s S` (S > 0) one GPM sample and the ten metrics
//! every S seconds; with `--xid` a thread blocked in `nvmlEventSetWait` 5 s at a time
//! (`--xid-wait-ms`, the agent's wait; it used to be 500 ms), as
//! the agent's XID watcher is. `hw/perf_h200.py --plan peers` measures its CPU (every
//! thread's schedstat) and RSS beside the agent's: this is the "NVML-only process".

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Nvml;
use std::time::{Duration, Instant};

/// Memory temperature and the four row-remap fields, as `sample::nvml` reads them.
const FIELDS: [FieldId; 5] = [
    FieldId(82),
    FieldId(142),
    FieldId(143),
    FieldId(144),
    FieldId(145),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let iterations: u32 = args
        .iter()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let slow = args.iter().any(|a| a == "--with-slow-counters");
    if args.iter().any(|a| a == "--cadence") {
        return cadence(&args);
    }
    let nvml = Nvml::init()?;
    let devices: Vec<_> = (0..nvml.device_count()?)
        .map(|i| nvml.device_by_index(i))
        .collect::<Result<_, _>>()?;
    if args.iter().any(|a| a == "--per-call") {
        per_call(&nvml, &devices, iterations);
        return Ok(());
    }
    let fields = FIELDS;
    let mut sink = 0u64;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    for _ in 0..iterations {
        for d in &devices {
            // The same calls as sample::nvml per full poll (errors ignored: the floor only
            // measures the cost of asking).
            sink += d.memory_info().map_or(0, |m| m.used);
            sink += d.utilization_rates().map_or(0, |u| u64::from(u.gpu));
            sink += d
                .encoder_utilization()
                .map_or(0, |u| u64::from(u.utilization));
            sink += d
                .decoder_utilization()
                .map_or(0, |u| u64::from(u.utilization));
            sink += d.temperature(TemperatureSensor::Gpu).map_or(0, u64::from);
            sink += d.power_usage().map_or(0, u64::from);
            sink += d.clock_info(Clock::SM).map_or(0, u64::from);
            sink += d.clock_info(Clock::Memory).map_or(0, u64::from);
            sink += d.field_values_for(&fields).map_or(0, |v| v.len() as u64);
            sink += d.running_compute_processes().map_or(0, |p| p.len() as u64);
            sink += d.running_graphics_processes().map_or(0, |p| p.len() as u64);
            if slow {
                sink += d.total_energy_consumption().unwrap_or(0);
                sink += d.pcie_replay_counter().map_or(0, u64::from);
            }
        }
    }
    let wall = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    println!(
        "nvml floor: {} GPU(s), {} iterations{}: {:.1} µs wall, {:.1} µs CPU per poll (sink {})",
        devices.len(),
        iterations,
        if slow { " with slow counters" } else { "" },
        wall.as_secs_f64() * 1e6 / f64::from(iterations),
        cpu.as_secs_f64() * 1e6 / f64::from(iterations),
        sink % 10
    );
    Ok(())
}

/// The value after `flag`, parsed, or `default`.
fn flag<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> T {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The agent's NVML calls on the agent's schedule, for `--seconds` (see the module docs).
fn cadence(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    use std::collections::HashMap;
    let seconds: u64 = flag(args, "--seconds", 60);
    let poll = Duration::from_millis(flag(args, "--cadence-ms", 1000));
    let slow_every: u64 = flag(args, "--slow-every", 10);
    let util_every = Duration::from_secs(flag(args, "--util-every", 5));
    let gpm_every = Duration::from_secs(flag(args, "--gpm-interval-s", 0));
    let xid = args.iter().any(|a| a == "--xid");
    // The agent's wait (`sample::nvml`'s XID_WAIT_MS); `--xid-wait-ms 500` is the earlier one.
    let xid_wait_ms: u32 = flag(args, "--xid-wait-ms", 5000);
    let nvml: &'static Nvml = Box::leak(Box::new(Nvml::init()?));
    let devices: Vec<_> = (0..nvml.device_count()?)
        .map(|i| nvml.device_by_index(i))
        .collect::<Result<_, _>>()?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let xid_thread = if xid {
        let stop = stop.clone();
        Some(std::thread::Builder::new().name("nvml-xid".into()).spawn(
            move || -> Result<(), nvml_wrapper::error::NvmlError> {
                use nvml_wrapper::bitmasks::event::EventTypes;
                let mut set = nvml.create_event_set()?;
                for i in 0..nvml.device_count()? {
                    let d = nvml.device_by_index(i)?;
                    set = d
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .map_err(|e| e.error)?;
                }
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = set.wait(xid_wait_ms);
                }
                Ok(())
            },
        )?)
    } else {
        None
    };
    let ids = gpu_warden::sample::gpm::metric_ids();
    let mut gpm_prev: Vec<Option<nvml_wrapper::GpmSample>> = devices.iter().map(|_| None).collect();
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut last_util_ts = vec![0u64; devices.len()];
    let fields = FIELDS;
    let (mut sink, mut polls, mut gpm_samples, mut name_calls) = (0u64, 0u64, 0u64, 0u64);
    let t0 = Instant::now();
    let mut next = t0;
    let (mut next_util, mut next_gpm) = (t0, t0);
    while t0.elapsed() < Duration::from_secs(seconds) {
        let now = Instant::now();
        let slow = polls % slow_every.max(1) == 0;
        let util = now >= next_util;
        if util {
            next_util = now + util_every;
        }
        let gpm = !gpm_every.is_zero() && now >= next_gpm;
        if gpm {
            next_gpm = now + gpm_every;
        }
        for (i, d) in devices.iter().enumerate() {
            sink += d.memory_info().map_or(0, |m| m.used);
            sink += d.utilization_rates().map_or(0, |u| u64::from(u.gpu));
            sink += d
                .encoder_utilization()
                .map_or(0, |u| u64::from(u.utilization));
            sink += d
                .decoder_utilization()
                .map_or(0, |u| u64::from(u.utilization));
            sink += d.temperature(TemperatureSensor::Gpu).map_or(0, u64::from);
            sink += d.power_usage().map_or(0, u64::from);
            if slow {
                sink += d.total_energy_consumption().unwrap_or(0);
                sink += d.pcie_replay_counter().map_or(0, u64::from);
            }
            sink += d.clock_info(Clock::SM).map_or(0, u64::from);
            sink += d.clock_info(Clock::Memory).map_or(0, u64::from);
            sink += d.field_values_for(&fields).map_or(0, |v| v.len() as u64);
            if gpm {
                if let Ok(s) = d.gpm_sample() {
                    gpm_samples += 1;
                    if let Some(prev) = &gpm_prev[i] {
                        sink += nvml_wrapper::gpm::gpm_metrics_get(nvml, prev, &s, &ids)
                            .map_or(0, |v| v.len() as u64);
                    }
                    gpm_prev[i] = Some(s);
                }
            }
            let compute = d.running_compute_processes().unwrap_or_default();
            let graphics = d.running_graphics_processes().unwrap_or_default();
            if util && !(compute.is_empty() && graphics.is_empty()) {
                if let Ok(samples) = d.process_utilization_stats(last_util_ts[i]) {
                    for s in &samples {
                        last_util_ts[i] = last_util_ts[i].max(s.timestamp);
                    }
                    sink += samples.len() as u64;
                }
            }
            for p in compute.iter().chain(&graphics) {
                names.entry(p.pid).or_insert_with(|| {
                    name_calls += 1;
                    nvml.sys_process_name(p.pid, 64).unwrap_or_default()
                });
            }
        }
        polls += 1;
        next += poll;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // As the agent: not joined (it may be inside a wait of up to --xid-wait-ms); one that
    // already failed says why.
    if let Some(t) = xid_thread.filter(|t| t.is_finished()) {
        if let Ok(Err(e)) = t.join() {
            eprintln!("xid thread: {e}");
        }
    }
    println!(
        "{{\"mode\":\"cadence\",\"gpus\":{},\"polls\":{polls},\"gpm_samples\":{gpm_samples},\"name_calls\":{name_calls},\"xid\":{xid},\"sink\":{}}}",
        devices.len(),
        sink % 10
    );
    Ok(())
}

/// Mean wall time of each kind of call, one line each.
fn per_call(nvml: &Nvml, devices: &[nvml_wrapper::Device], iterations: u32) {
    let fields = FIELDS;
    let mut totals: Vec<(&'static str, Duration, u64, u64)> = Vec::new();
    let mut time = |name: &'static str, f: &mut dyn FnMut() -> u64| {
        let t = Instant::now();
        let n = f();
        let took = t.elapsed();
        match totals.iter_mut().find(|e| e.0 == name) {
            Some(e) => {
                e.1 += took;
                e.2 += 1;
                e.3 = n;
            }
            None => totals.push((name, took, 1, n)),
        }
    };
    for _ in 0..iterations {
        for d in devices {
            time("memory_info", &mut || d.memory_info().map_or(0, |m| m.used));
            time("utilization_rates", &mut || {
                d.utilization_rates().map_or(0, |u| u64::from(u.gpu))
            });
            time("encoder_utilization", &mut || {
                d.encoder_utilization()
                    .map_or(0, |u| u64::from(u.utilization))
            });
            time("temperature", &mut || {
                d.temperature(TemperatureSensor::Gpu).map_or(0, u64::from)
            });
            time("power_usage", &mut || d.power_usage().map_or(0, u64::from));
            time("clock_info(SM)", &mut || {
                d.clock_info(Clock::SM).map_or(0, u64::from)
            });
            time("field_values(5)", &mut || {
                d.field_values_for(&fields).map_or(0, |v| v.len() as u64)
            });
            let mut pids = Vec::new();
            time("running_compute_processes", &mut || {
                let ps = d.running_compute_processes().unwrap_or_default();
                pids = ps.iter().map(|p| p.pid).collect();
                pids.len() as u64
            });
            time("running_graphics_processes", &mut || {
                d.running_graphics_processes().map_or(0, |p| p.len() as u64)
            });
            // nvml-wrapper's list calls ask NVML twice (the count with no buffer, then the
            // list); the count alone shows what a single-call list would save.
            time("running_compute_processes_count", &mut || {
                d.running_compute_processes_count().map_or(0, u64::from)
            });
            time("running_graphics_processes_count", &mut || {
                d.running_graphics_processes_count().map_or(0, u64::from)
            });
            time("process_utilization_stats(0)", &mut || {
                d.process_utilization_stats(0u64)
                    .map_or(0, |p| p.len() as u64)
            });
            for pid in &pids {
                time("sys_process_name (per pid)", &mut || {
                    nvml.sys_process_name(*pid, 64)
                        .map_or(0, |n| n.len() as u64)
                });
            }
        }
    }
    for (name, took, calls, last) in totals {
        println!(
            "{name}: {:.1} µs mean over {calls} calls (last answer {last})",
            took.as_secs_f64() * 1e6 / calls as f64
        );
    }
}

/// This process's user + system CPU time, from /proc/self/stat (clock ticks of 10 ms; the
/// loop runs long enough for that to be fine).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}
