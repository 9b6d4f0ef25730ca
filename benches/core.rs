//! Criterion benches of the agent's per-poll work, on the simulated backend.
//! `cargo bench` measures; `cargo test --benches -- --test` (CI) runs each once, unoptimised, so they never rot.

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_warden_attribute::cgroup::parse_proc_cgroup;
use gpu_warden_guard::policy::Policy;
use gpu_warden_guard::rank::rank;
use gpu_warden_model::snapshot::Snapshot;
use gpu_warden_publish::metrics::{self, MetricsConfig};
use gpu_warden_publish::self_metrics::SelfMetrics;
use gpu_warden_sample::scenario::Scenario;
use gpu_warden_testkit::rig::{Rig, RigOptions};
use gpu_warden_testkit::scenarios::BenchNode;
use std::hint::black_box;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// The test kit's benchmark node: `gpus` H100s, `procs` processes, each in its own pod.
fn scenario(gpus: u32, procs: u32) -> Scenario {
    Scenario::parse(&BenchNode::new(gpus, procs).yaml(), "bench").expect("bench scenario")
}

/// A snapshot of the benchmark node, attributed by the test kit's core (the real attributor
/// over the simulated `/proc`), and the rig it came from.
fn attributed_snapshot(gpus: u32, procs: u32) -> (Snapshot, Rig) {
    let mut rig = Rig::from_scenario(
        scenario(gpus, procs),
        RigOptions {
            metrics: Some(SelfMetrics::new("bench").expect("metrics")),
            wall_origin: UNIX_EPOCH,
            ..RigOptions::default()
        },
    )
    .expect("rig");
    let mut snap = rig.sample();
    rig.core.prepare(&mut snap, Duration::from_micros(100));
    (snap, rig)
}

fn exposition(c: &mut Criterion) {
    let mut g = c.benchmark_group("exposition");
    for gpus in [1u32, 8] {
        for procs in [0u32, 10, 100] {
            let (snap, _rig) = attributed_snapshot(gpus, procs);
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
        let (snap, rig) = attributed_snapshot(1, n);
        let policy = Policy::default();
        let refused = Default::default();
        let pods = rig.pods.pods();
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
