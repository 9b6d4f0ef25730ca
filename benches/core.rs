//! Criterion benches of the agent's per-poll work, on the simulated backend.
//! `cargo bench` measures; `cargo bench -- --test` (CI) runs each once so they never rot.

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_warden::agent::Core;
use gpu_warden::attribute::attributor::ProcAttributor;
use gpu_warden::attribute::cgroup::parse_proc_cgroup;
use gpu_warden::attribute::pods::{index_json, StaticPods};
use gpu_warden::attribute::procfs::ProcFs;
use gpu_warden::guard::policy::Policy;
use gpu_warden::guard::rank::rank;
use gpu_warden::model::clock::{Clock, ManualClock};
use gpu_warden::model::snapshot::Snapshot;
use gpu_warden::publish::metrics::{self, MetricsConfig};
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::sample::sampler::Stamper;
use gpu_warden::sample::scenario::Scenario;
use gpu_warden::sample::sim::{scenario_pods, SimSource};
use gpu_warden::sample::{GpuSource, PollRequest};
use gpu_warden::testkit::rig::{Rig, RigOptions};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// A scenario with `gpus` H100s and `procs` processes spread over them, each in its own pod.
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
    Scenario::parse(&y, "bench").expect("bench scenario")
}

fn attributed_snapshot(
    gpus: u32,
    procs: u32,
    dir: &std::path::Path,
) -> (Snapshot, Core, Arc<StaticPods>) {
    let sc = scenario(gpus, procs);
    let pods = Arc::new(StaticPods(Arc::new(index_json(scenario_pods(&sc, "node")))));
    let mut src = SimSource::new(sc).with_proc_root(dir).expect("proc root");
    let clock = Arc::new(ManualClock::new(UNIX_EPOCH));
    let raw = src.poll(
        Duration::ZERO,
        PollRequest {
            process_utilization: true,
            slow_counters: true,
        },
    );
    let mut snap = Stamper::default().stamp(raw, Duration::ZERO, clock.wall());
    let mut core = Core::new(
        MetricsConfig {
            hostname: "node".into(),
            ..Default::default()
        },
        SelfMetrics::new("bench").expect("metrics"),
        clock,
    )
    .with_attributor(Box::new(ProcAttributor::new(
        ProcFs::new(dir),
        pods.clone(),
        None,
    )));
    core.prepare(&mut snap, Duration::from_micros(100));
    (snap, core, pods)
}

fn exposition(c: &mut Criterion) {
    let mut g = c.benchmark_group("exposition");
    for gpus in [1u32, 8] {
        for procs in [0u32, 10, 100] {
            let dir = tempfile::tempdir().expect("tempdir");
            let (snap, _, _) = attributed_snapshot(gpus, procs, dir.path());
            let cfg = MetricsConfig {
                hostname: "node".into(),
                ..Default::default()
            };
            let mut scratch = metrics::Scratch::default();
            let render = |out: &mut Vec<u8>, scratch: &mut metrics::Scratch, snap: &Snapshot| {
                out.clear();
                metrics::write_device_families(out, scratch, snap, &cfg);
                metrics::write_container_families(out, scratch, snap, &cfg);
            };
            let mut out = Vec::with_capacity(64 * 1024);
            render(&mut out, &mut scratch, &snap);
            let series = out
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty() && l[0] != b'#')
                .count();
            g.throughput(Throughput::Elements(series as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{gpus}gpu"), procs),
                &snap,
                |b, snap| {
                    b.iter(|| {
                        render(&mut out, &mut scratch, snap);
                        black_box(out.len())
                    })
                },
            );
        }
    }
    g.finish();
}

const CGROUP_CORPUS: &[&str] = &[
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1c2d3e_4f50_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-5f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8.scope\n",
    "0::/kubepods.slice/kubepods-pod0b1c2d3e_4f50_4a6b_8c7d_9e0f1a2b3c4d.slice/crio-5f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8.scope\n",
    "12:memory:/kubepods/besteffort/pod0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d/5f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8\n11:cpu,cpuacct:/kubepods/besteffort/pod0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d/5f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8\n1:name=systemd:/kubepods/besteffort/pod0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d/5f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8\n",
    "0::/../../kubepods-burstable-pod0b1c2d3e_4f50_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-5f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8.scope\n",
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    "0::/system.slice/containerd.service\n",
];

fn cgroup_parsing(c: &mut Criterion) {
    let mut g = c.benchmark_group("cgroup");
    g.throughput(Throughput::Elements(CGROUP_CORPUS.len() as u64));
    g.bench_function("parse_corpus", |b| {
        b.iter(|| {
            for text in CGROUP_CORPUS {
                black_box(parse_proc_cgroup(black_box(text)));
            }
        })
    });
    g.finish();
}

fn ranking(c: &mut Criterion) {
    let mut g = c.benchmark_group("rank");
    for n in [10u32, 100, 1000] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (snap, _, pods) = attributed_snapshot(1, n, dir.path());
        let policy = Policy::default();
        let refused = Default::default();
        let pods = gpu_warden::attribute::ports::PodSource::pods(pods.as_ref());
        g.throughput(Throughput::Elements(u64::from(n)));
        g.bench_with_input(BenchmarkId::from_parameter(n), &snap, |b, snap| {
            b.iter(|| {
                black_box(
                    rank(&policy, 0, &snap.processes, &pods, &refused)
                        .candidates
                        .len(),
                )
            })
        });
    }
    g.finish();
}

/// One full poll through the real agent core (`Core::on_full`: attribution, the guard,
/// rendering), on the test kit's simulated node; the simulator's own poll is outside the
/// measured time.
fn full_poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("pipeline");
    for (gpus, procs) in [(1u32, 4u32), (8, 64)] {
        let mut rig = Rig::from_scenario(
            scenario(gpus, procs),
            RigOptions {
                policy: Some(Policy::default()),
                ..RigOptions::default()
            },
        )
        .expect("rig");
        g.bench_function(format!("{gpus}gpu_{procs}procs"), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    rig.clock.advance(Duration::from_secs(1));
                    let snap = rig.sample();
                    let t0 = Instant::now();
                    let (published, decisions) = rig.core.on_full(snap, Duration::from_micros(100));
                    spent += t0.elapsed();
                    black_box((decisions.len(), published.metrics.len()));
                }
                spent
            })
        });
    }
    g.finish();
}

criterion_group!(benches, exposition, cgroup_parsing, ranking, full_poll);
criterion_main!(benches);
