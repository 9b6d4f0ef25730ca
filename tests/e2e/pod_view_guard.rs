//! The guard on a pod view the API proves only by LISTs (issue 30): the real binary
//! (simulated GPU, guard in enforce mode) against the API double, where every pod watch is
//! answered `410 Expired` while LISTs work (kube-apiserver's `errWatcher` shape: 200, one
//! ERROR event). Before, each 410 dropped the view and each good LIST reset the backoff:
//! ~2.5 LISTs + watches a second and no decision through 28 s of hard pressure. Now each
//! LIST proves the view at its resourceVersion and the 410 loop backs off (to 8 s): the
//! guard decides on the freshly listed view and evicts the greedy job — only it.
//!
//! The GPU: 22.6 GiB usable; a trainer (priority 1000000, 8 GiB), a CI job (3 GiB) and a
//! greedy CI job growing 1 GiB/s from 1 s: soft pressure at ≈9 s, hard at ≈10.5 s. The
//! double plays the faithful kubelet in real time (as in guard_api_faults): with grace 0 the
//! API server deletes an evicted pod at once, and the kubelet's signals reach no process here
//! — the simulated processes live in the agent — so the cooldown (60 s) keeps the guard from
//! deciding twice.

use crate::support::*;
use apiserver_double::{ApiServer, Fault, FaultAction, Method};
use std::time::{Duration, Instant};

const NODE: &str = "gpu-node-1";

const SCENARIO: &str = r#"
driver_version: "580.95.05"
gpus:
  - model: NVIDIA A10G
    uuid: GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b
    pci_bus_id: "00000000:00:1E.0"
    memory_mib: 23028
    reserved_mib: 434
processes:
  - pid: 500
    gpu: 0
    name: torchrun
    memory: {constant: 8192}
    pod: {namespace: ml-train, name: trainer, container: main, priority: 1000000}
  - pid: 501
    gpu: 0
    name: pytest
    memory: {constant: 3072}
    pod: {namespace: ci, name: ci-a, container: build, priority: 0}
  - pid: 503
    gpu: 0
    name: python3
    start: 1s
    memory: {linear: {from: 512, per_second: 1024}}
    pod: {namespace: ci, name: greedy, container: build, priority: 0}
"#;

#[test]
fn the_guard_acts_on_a_view_proven_by_lists_when_every_watch_expires() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let scenario = gpu_warden::sample::scenario::Scenario::parse(SCENARIO, "expired").unwrap();
    server
        .add_node(serde_json::json!({"metadata": {"name": NODE}}))
        .unwrap();
    for pod in gpu_warden::sample::sim::scenario_pods(&scenario, NODE) {
        server.add_pod(pod).unwrap();
    }
    server.inject(Fault::new("/api/v1/pods", FaultAction::ExpireWatch));
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = dir.path().join("expired.yaml");
    std::fs::write(&scenario_path, SCENARIO).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "mode: enforce\nevictionGracePeriodSeconds: 0\ncooldownTimeout: 60s\n",
    )
    .unwrap();
    let args = AgentArgs::sim()
        .scenario(&scenario_path)
        .node(NODE)
        .poll("250ms")
        .guard_config(&policy);
    let started = Instant::now();
    let agent = Agent::start_with_env(&args.args(), &[("KUBECONFIG", kubeconfig.as_os_str())]);
    let state = || -> serde_json::Value {
        get(agent.port, "/state")
            .ok()
            .and_then(|r| serde_json::from_str(&r.body).ok())
            .unwrap_or_default()
    };
    let evicted = || -> Vec<String> {
        server
            .evictions()
            .into_iter()
            .map(|e| format!("{}/{}", e.namespace, e.name))
            .collect()
    };
    gpu_warden::testkit::wait_for_seen(
        "the view proven by a LIST",
        Duration::from_secs(10),
        || {
            let st = state();
            if st["guard"].is_object() && st["guard"]["held"].is_null() {
                Ok(())
            } else {
                Err(st)
            }
        },
    );
    gpu_warden::testkit::wait_for_seen(
        "the greedy job's eviction",
        Duration::from_secs(25),
        || {
            if evicted().is_empty() {
                Err(state())
            } else {
                Ok(())
            }
        },
    );
    let decided = started.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(evicted(), vec!["ci/greedy".to_string()], "{}", state());
    let posts = server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::POST && r.path.ends_with("/eviction"))
        .count();
    assert_eq!(posts, 1);
    // The 410 loop backed off: 0.25–0.5, 0.5–1, 1–2, 2–4, 4–8 s between LISTs while the
    // GPU is calm (at most 5 LISTs in the first 7 s: a backoff reset by each LIST gave ~17),
    // at most 2 s apart once it is under pressure (the urgent cap), never a storm.
    let lists: Vec<Instant> = server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
        .map(|r| r.at)
        .collect();
    let calm = lists
        .iter()
        .filter(|t| **t < started + Duration::from_secs(7))
        .count();
    assert!((3..=5).contains(&calm), "{calm} LISTs in the first 7 s");
    // (Pressure beginning wakes one relist at once, whenever the last one was.)
    let bursts = lists
        .windows(2)
        .filter(|w| w[1] - w[0] < Duration::from_millis(240))
        .count();
    assert!(bursts <= 1, "{lists:?}");
    assert!(decided < Duration::from_secs(20), "{decided:?}");
    let (status, _, log) = agent.terminate();
    assert!(status.success(), "{log}");
    assert!(log.contains("pod watch expired"), "{log}");
}
