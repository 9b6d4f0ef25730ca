//! The NVML floor: the calls gpu-warden makes per full poll, in a tight loop, with nothing
//! else — no snapshot, no attribution, no rendering. `scripts/perf_h200.py` compares the
//! agent's per-poll cost with this (issue 7).
//!
//!     cargo run --release --example nvml_floor -- [iterations] [--with-slow-counters]

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Nvml;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let iterations: u32 = args
        .iter()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let slow = args.iter().any(|a| a == "--with-slow-counters");
    let nvml = Nvml::init()?;
    let devices: Vec<_> = (0..nvml.device_count()?)
        .map(|i| nvml.device_by_index(i))
        .collect::<Result<_, _>>()?;
    let fields = [
        FieldId(82),
        FieldId(142),
        FieldId(143),
        FieldId(144),
        FieldId(145),
    ];
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
