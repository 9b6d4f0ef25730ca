//! Allocations per poll on the agent's hot path, counted by a global allocator
//! (`crates/alloc-count`), on the simulated backend. Prints one table; asserts nothing
//! (the e2e test `alloc_budget` holds the line). `cargo bench --bench alloc` (or with
//! `-- --test`, as CI runs every bench: fewer polls, same table).

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

use alloc_count::{measure, Counting, Stats};
use gpu_warden::agent::Core;
use gpu_warden::attribute::attributor::ProcAttributor;
use gpu_warden::attribute::pods::{index_json, StaticPods};
use gpu_warden::attribute::procfs::ProcFs;
use gpu_warden::guard::policy::Policy;
use gpu_warden::model::clock::{Clock, ManualClock};
use gpu_warden::model::pressure::Pressure;
use gpu_warden::publish::metrics::MetricsConfig;
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::sample::sampler::Stamper;
use gpu_warden::sample::scenario::Scenario;
use gpu_warden::sample::sim::{scenario_pods, SimSource};
use gpu_warden::sample::{GpuSource, PollRequest};
use gpu_warden::testkit::rig::{Rig, RigOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

#[global_allocator]
static ALLOC: Counting = Counting;

/// `gpus` H100s and `procs` processes spread over them, each in its own pod (the shape of
/// benches/core.rs).
fn scenario(gpus: u32, procs: u32) -> Scenario {
    let mut y = format!(
        "gpus:\n  - {{model: NVIDIA H100 80GB HBM3, count: {gpus}, memory_mib: 81559, reserved_mib: 520, sm_clock_mhz: 1980, mem_clock_mhz: 2619, gpu_temp_c: 41, memory_temp_c: 49, power_w: 412.3, mem_copy_util_pct: 27, enc_util_pct: 0, dec_util_pct: 0, pcie_replays: 0, remapped_rows: {{}}}}\nprocesses:\n"
    );
    for i in 0..procs {
        y.push_str(&format!(
            "  - {{pid: {}, gpu: {}, name: \"python\", memory: {{constant: {}}}, sm_util: 0.1, pod: {{namespace: ci, name: job-{i}, container: build, priority: {}}}}}\n",
            1000 + i,
            i % gpus,
            100 + (i % 7) * 10,
            i % 3
        ));
    }
    Scenario::parse(&y, "alloc").expect("alloc scenario")
}

/// Mean allocations per call of `f` over `n` calls, after `warm` calls that are not counted
/// (first-time growth of reused buffers and caches).
fn per_call(warm: u32, n: u32, mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..warm {
        f();
    }
    let (s, ()) = measure(|| {
        for _ in 0..n {
            f();
        }
    });
    let n = f64::from(n);
    (s.total() as f64 / n, s.bytes as f64 / n, s.frees as f64 / n)
}

fn row(what: &str, shape: &str, (allocs, bytes, _frees): (f64, f64, f64)) {
    println!("| {what} | {shape} | {allocs:.1} | {bytes:.0} |");
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let (warm, n) = if quick { (3, 5) } else { (20, 200) };
    println!("| stage | GPUs × processes | allocations per call | bytes per call |");
    println!("|---|---|---|---|");
    for (gpus, procs) in [(1u32, 4u32), (8, 64)] {
        let shape = format!("{gpus} × {procs}");
        let sc = scenario(gpus, procs);
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = Arc::new(StaticPods(Arc::new(index_json(scenario_pods(&sc, "node")))));
        let mut src = SimSource::new(sc.clone())
            .with_proc_root(dir.path())
            .expect("proc root");
        let clock = Arc::new(ManualClock::new(UNIX_EPOCH));
        let req = PollRequest {
            process_utilization: true,
            slow_counters: true,
        };
        let raw = src.poll(Duration::ZERO, req);

        // The sampler's stamping of a raw poll (src/sample/sampler.rs), on a poll that
        // carries process utilization and on one that does not (the carried-forward path).
        let mut stamper = Stamper::default();
        let mut no_util = raw.clone();
        for p in &mut no_util.processes {
            p.sm_util = None;
        }
        let mut inputs = vec![raw.clone(); (warm + n) as usize];
        row(
            "sampler: `Stamper::stamp` (with process utilization)",
            &shape,
            per_call(warm, n, || {
                let r = inputs.pop().expect("input");
                std::hint::black_box(stamper.stamp(r, Duration::ZERO, UNIX_EPOCH));
            }),
        );
        let mut inputs = vec![no_util.clone(); (warm + n) as usize];
        row(
            "sampler: `Stamper::stamp` (utilization carried forward)",
            &shape,
            per_call(warm, n, || {
                let r = inputs.pop().expect("input");
                std::hint::black_box(stamper.stamp(r, Duration::ZERO, UNIX_EPOCH));
            }),
        );

        let mut core = Core::new(
            MetricsConfig {
                hostname: "node".into(),
                ..Default::default()
            },
            SelfMetrics::new("alloc").expect("metrics"),
            clock.clone(),
        )
        .with_attributor(Box::new(ProcAttributor::new(
            ProcFs::new(dir.path()),
            pods.clone(),
            None,
        )));
        let fresh = Stamper::default().stamp(raw.clone(), Duration::ZERO, UNIX_EPOCH);
        let mut snaps = vec![fresh.clone(); (warm + n) as usize];
        row(
            "core: `Core::prepare` (self metrics, attribution)",
            &shape,
            per_call(warm, n, || {
                let mut s = snaps.pop().expect("snapshot");
                core.prepare(&mut s, Duration::from_micros(100));
                std::hint::black_box(s);
            }),
        );
        let mut attributed = fresh.clone();
        core.prepare(&mut attributed, Duration::from_micros(100));
        let attributed = Arc::new(attributed);
        let pressure: BTreeMap<u32, Pressure> = (0..gpus).map(|g| (g, Pressure::None)).collect();
        row(
            "core: `Core::publish` (the exposition)",
            &shape,
            per_call(warm, n, || {
                let p = core.publish(
                    attributed.clone(),
                    pressure.clone(),
                    serde_json::Value::Null,
                );
                std::hint::black_box(p);
            }),
        );

        for guard in [false, true] {
            let mut rig = Rig::from_scenario(
                scenario(gpus, procs),
                RigOptions {
                    policy: guard.then(Policy::default),
                    ..RigOptions::default()
                },
            )
            .expect("rig");
            let mut snaps: Vec<_> = (0..warm + n).map(|_| rig.sample()).collect();
            let (clock, core) = (rig.clock.clone(), &mut rig.core);
            row(
                if guard {
                    "core: `Core::on_full` (a full poll, guard on)"
                } else {
                    "core: `Core::on_full` (a full poll, no guard)"
                },
                &shape,
                per_call(warm, n, || {
                    clock.advance(Duration::from_secs(1));
                    let s = snaps.pop().expect("snapshot");
                    std::hint::black_box(core.on_full(s, Duration::from_micros(100)));
                }),
            );
            if guard {
                let readings = rig.memory().0;
                let mut inputs = vec![readings; (warm + n) as usize];
                let (clock, core) = (rig.clock.clone(), &mut rig.core);
                row(
                    "core: `Core::on_memory` (a fast memory reading, guard on)",
                    &shape,
                    per_call(warm, n, || {
                        clock.advance(Duration::from_millis(100));
                        let r = inputs.pop().expect("readings");
                        std::hint::black_box(core.on_memory(clock.mono(), r));
                    }),
                );
            }
        }
    }
    let _ = Stats::default();
}
