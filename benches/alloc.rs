//! Allocations per poll on the agent's hot path, counted by a global allocator
//! (`crates/alloc-count`), on the simulated backend. Prints one table; asserts nothing
//! (the e2e test `alloc_budget` holds the line). `cargo bench --bench alloc` (or with
//! `-- --test`, as CI runs every bench: fewer polls, same table).

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

use alloc_count::{measure, Counting, Stats};
use gpu_warden_guard::policy::Policy;
use gpu_warden_model::clock::Clock;
use gpu_warden_model::pressure::Pressure;
use gpu_warden_publish::self_metrics::SelfMetrics;
use gpu_warden_sample::sampler::Stamper;
use gpu_warden_sample::scenario::Scenario;
use gpu_warden_sample::sim::SimSource;
use gpu_warden_sample::{GpuSource, PollRequest};
use gpu_warden_testkit::rig::{Rig, RigOptions};
use gpu_warden_testkit::scenarios::BenchNode;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

#[global_allocator]
static ALLOC: Counting = Counting;

/// The test kit's benchmark node (the shape of benches/core.rs).
fn scenario(gpus: u32, procs: u32) -> Scenario {
    Scenario::parse(&BenchNode::new(gpus, procs).yaml(), "alloc").expect("alloc scenario")
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
        // The stamper's inputs come straight from a simulator; the core is the test kit's,
        // whose attributor reads the simulated `/proc` of its own simulator (same pids).
        let mut src = SimSource::new(sc.clone());
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

        let mut staged = Rig::from_scenario(
            sc.clone(),
            RigOptions {
                metrics: Some(SelfMetrics::new("alloc").expect("metrics")),
                wall_origin: UNIX_EPOCH,
                ..RigOptions::default()
            },
        )
        .expect("rig");
        // Its first poll lays out the simulated `/proc` the attributor reads.
        staged.sample();
        let core = &mut staged.core;
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
                let p = core.publish(attributed.clone(), pressure.clone(), None);
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
