//! Criterion benches of one extender call — `/filter` and `/prioritize` with `NodeNames`
//! (the shipped `nodeCacheCapable: true`) at 100, 1,000 and 5,000 nodes, the body parsed,
//! every node judged from the parsed node cache (and, as shipped with `--lease-namespace`,
//! through each agent's Lease: `filter-through-leases`), the reply encoded — and, after criterion's
//! runs, a latency table (p50/p99 over many calls, one client and 4 clients at once) for
//! docs/performance.md. `cargo bench --bench extender` measures; `-- --test` runs each once.

// Measures real elapsed time.
#![allow(clippy::disallowed_methods)]

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use gpu_warden_extender::config::PolicyFile;
use gpu_warden_extender::core::parse_call;
use gpu_warden_extender::lease_cache::LiveNodes;
use gpu_warden_extender::ledger::Ledger;
use gpu_warden_extender::metrics::ExtenderMetrics;
use gpu_warden_extender::nodes::{read_node, NodeState};
use gpu_warden_extender::server::{answer, ExtenderState};
use gpu_warden_extender::watch::{LedgerFeed, NodeCache, NodeLookup};
use gpu_warden_model::clock::{Clock, ManualClock};
use gpu_warden_model::pressure::Pressure;
use gpu_warden_publish::annotations::{AnnotationValues, GpuFigures};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, UNIX_EPOCH};

/// The node cache as the extender holds it: each node's annotations parsed once.
struct Nodes(HashMap<String, Arc<NodeState>>);

impl NodeLookup for Nodes {
    fn state(&self, node: &str) -> Option<Arc<NodeState>> {
        self.0.get(node).cloned()
    }
    fn annotations(&self, _node: &str) -> Option<std::collections::BTreeMap<String, String>> {
        None
    }
    fn ready(&self) -> bool {
        true
    }
}

fn name(i: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.ec2.internal",
        i / 65536,
        (i / 256) % 256,
        i % 256
    )
}

/// `n` GPU nodes: three in four with one A10G, the rest with four; replicas 4, kubelet
/// figures present; free memory spread so some fit, some do not, and one in 20 is under
/// pressure — the agent's own writer produces the annotations, the extender's reader
/// parses them.
fn state(n: usize) -> ExtenderState {
    let nodes: HashMap<String, Arc<NodeState>> = annotations(n)
        .into_iter()
        .map(|(k, a)| (k, Arc::new(read_node(&a, "gpu-warden.io"))))
        .collect();
    with_nodes(Arc::new(Nodes(nodes)))
}

/// The shipped path (`--lease-namespace`): the Node cache read through each agent's Lease
/// (`extender::lease_cache::LiveNodes`), the figures on the Leases, the Nodes' copies older.
fn lease_state(n: usize) -> ExtenderState {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use kube::runtime::{reflector, watcher};
    let cache = Arc::new(NodeCache::new("gpu-warden.io"));
    let (store, mut writer) = reflector::store::<Lease>();
    for (name, a) in annotations(n) {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                annotations: Some(a.clone()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        cache.apply(watcher::Event::Apply(node), &mut None);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some("gpu-warden".into()),
                annotations: Some(a),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::from_second(1_780_000_010).expect("time"),
                )),
                ..LeaseSpec::default()
            }),
        };
        writer.apply_watcher_event(&watcher::Event::Apply(lease));
    }
    // Both listed once: the extender is ready (else every filter is a quick "not ready").
    cache.apply(watcher::Event::InitDone, &mut None);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let live = LiveNodes::new(
        cache,
        store,
        "gpu-warden",
        "gpu-warden.io",
        Arc::new(AtomicBool::new(true)),
    );
    let st = with_nodes(Arc::new(live));
    assert_eq!(
        st.feed.not_ready(),
        None,
        "the bench must judge, not refuse"
    );
    st
}

/// Each node's annotations as the agent's own writer produces them.
fn annotations(n: usize) -> Vec<(String, std::collections::BTreeMap<String, String>)> {
    let observed = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let mut nodes = Vec::new();
    for i in 0..n {
        let count = if i % 4 == 3 { 4 } else { 1 };
        let gpus: Vec<GpuFigures> = (0..count)
            .map(|g| {
                let used = ((i * 7919 + g * 104_729) % 20_000) as u64;
                GpuFigures {
                    index: g as u32,
                    uuid: format!("GPU-{i:08x}-{g}"),
                    total_mib: 23028,
                    used_mib: used,
                    free_mib: 23028 - used,
                    pressure: if i % 20 == 7 {
                        Pressure::Soft
                    } else {
                        Pressure::None
                    },
                    replicas_allocated: Some(((i + g) % 4) as u32),
                    replicas_allocatable: Some(4),
                    declared_mib: Some(((i * 31) % 8) as u64 * 1024),
                }
            })
            .collect();
        let v = AnnotationValues {
            observed_at: observed,
            free_mib: gpus.iter().map(|g| g.free_mib).sum(),
            max_free_mib: gpus.iter().map(|g| g.free_mib).max().unwrap_or(0),
            next_gpu: Some(Some(gpus[0].uuid.clone())),
            cuda_driver_version: None,
            gpus,
        };
        nodes.push((name(i), v.to_annotations("gpu-warden.io")));
    }
    nodes
}

fn with_nodes(nodes: Arc<dyn NodeLookup>) -> ExtenderState {
    let observed = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let policy = PolicyFile::default().policy().expect("default policy");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(observed + Duration::from_secs(30)));
    ExtenderState {
        feed: Arc::new(LedgerFeed {
            ledger: Arc::new(Mutex::new(Ledger::new(policy.ledger_ttl))),
            policy,
            nodes,
            learned: RwLock::default(),
            pods_synced: AtomicBool::new(true),
            clock,
            metrics: ExtenderMetrics::new().expect("metrics"),
        }),
        max_body_bytes: 64 << 20,
        serve_verbs: true,
    }
}

/// kube-scheduler's body: a GitLab job pod (Go's field order) and the node names.
fn body(n: usize) -> Vec<u8> {
    let names: Vec<String> = (0..n).map(name).collect();
    serde_json::to_vec(&serde_json::json!({
        "Pod": {"metadata": {"name": "runner-abc-project-7-concurrent-0", "namespace": "gitlab-runner",
            "uid": "5f0c7b8e-7d2a-4c1e-9f4b-0a1b2c3d4e5f", "creationTimestamp": "2026-05-28T20:26:40Z",
            "labels": {"project.runner.gitlab.com/id": "7", "pod": "runner-abc"},
            "annotations": {"gpu-warden.io/vram-request-mib": "6144", "job.runner.gitlab.com/id": "4242"}},
            "spec": {"containers": [{"name": "build", "image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04",
                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}],
                "schedulerName": "gpu-warden-scheduler"},
            "status": {"phase": "Pending"}},
        "Nodes": null,
        "NodeNames": names,
    }))
    .expect("body")
}

const SIZES: [usize; 3] = [100, 1_000, 5_000];

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("extender");
    for n in SIZES {
        let (st, b) = (state(n), body(n));
        g.throughput(Throughput::Elements(n as u64));
        for verb in ["filter", "prioritize"] {
            g.bench_with_input(BenchmarkId::new(verb, n), &n, |bench, _| {
                bench.iter(|| {
                    let r = answer(&st, verb, black_box(&b));
                    assert_eq!(r.status(), 200);
                    black_box(r)
                })
            });
        }
        let live = lease_state(n);
        g.bench_with_input(
            BenchmarkId::new("filter-through-leases", n),
            &n,
            |bench, _| {
                bench.iter(|| {
                    let r = answer(&live, "filter", black_box(&b));
                    assert_eq!(r.status(), 200);
                    black_box(r)
                })
            },
        );
    }
    g.finish();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// p50/p99 of one client's calls, then of `clients` calling at once (the scheduler calls
/// filter then prioritize for each pod; several profiles or a burst overlap).
fn latency_table(quick: bool) {
    let (calls, clients) = if quick { (3, 2) } else { (400, 4) };
    println!("\nextender latency, NodeNames (filter + prioritize are timed separately):");
    println!("| nodes | verb | clients | calls | p50 | p99 | calls/s |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for n in SIZES {
        let st = Arc::new(state(n));
        let live = Arc::new(lease_state(n));
        let b = Arc::new(body(n));
        // The JSON parse of the body alone (serde_json), to tell it from the judging.
        let mut parse: Vec<Duration> = (0..calls)
            .map(|_| {
                let t = Instant::now();
                black_box(parse_call(&b).ok());
                t.elapsed()
            })
            .collect();
        parse.sort_unstable();
        println!(
            "| {n} | (body parse only) | 1 | {} | {:.3} ms | {:.3} ms | |",
            parse.len(),
            percentile(&parse, 0.50).as_secs_f64() * 1e3,
            percentile(&parse, 0.99).as_secs_f64() * 1e3,
        );
        for (verb, label, st) in [
            ("filter", "filter", &st),
            ("prioritize", "prioritize", &st),
            ("filter", "filter, through Leases", &live),
        ] {
            for k in [1, clients] {
                let started = Instant::now();
                let handles: Vec<_> = (0..k)
                    .map(|_| {
                        let (st, b) = (st.clone(), b.clone());
                        std::thread::spawn(move || {
                            (0..calls)
                                .map(|_| {
                                    let t = Instant::now();
                                    black_box(answer(&st, verb, &b));
                                    t.elapsed()
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                let mut all: Vec<Duration> = handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect();
                let wall = started.elapsed();
                all.sort_unstable();
                println!(
                    "| {n} | {label} | {k} | {} | {:.3} ms | {:.3} ms | {:.0} |",
                    all.len(),
                    percentile(&all, 0.50).as_secs_f64() * 1e3,
                    percentile(&all, 0.99).as_secs_f64() * 1e3,
                    all.len() as f64 / wall.as_secs_f64()
                );
            }
        }
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    let quick = std::env::args().any(|a| a == "--test" || a == "--list");
    if !std::env::args().any(|a| a == "--list") {
        latency_table(quick);
    }
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
