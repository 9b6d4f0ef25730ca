//! The real binary against the API double: node annotations appear, the guard acts in
//! enforce mode on the A10G demo's greedy job, and a graceful shutdown removes exactly the
//! agent's annotations.

use crate::support::*;
use apiserver_double::ApiServer;
use std::time::{Duration, Instant};

#[test]
fn annotations_guard_and_clean_shutdown() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    // The A10G demo, with the greedy job starting at 2 s and growing 1 GiB/s so the test
    // reaches pressure in seconds.
    let text = std::fs::read_to_string(root().join("examples/a10g-timesliced.yaml"))
        .unwrap()
        .replace("start: 10s", "start: 2s")
        .replace("per_second: 96", "per_second: 1024");
    let scenario = gpu_warden::sample::scenario::Scenario::parse(&text, "fast").unwrap();
    server
        .add_node(serde_json::json!({"metadata": {"name": "gpu-node-1", "labels": {"nvidia.com/gpu.present": "true"}, "annotations": {"team": "ml"}}}))
        .unwrap();
    for pod in gpu_warden::sample::sim::scenario_pods(&scenario, "gpu-node-1") {
        server.add_pod(pod).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = dir.path().join("fast.yaml");
    std::fs::write(&scenario_path, &text).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "mode: enforce\nevictionGracePeriodSeconds: 0\n").unwrap();
    let args = AgentArgs::sim()
        .scenario(&scenario_path)
        .node("gpu-node-1")
        .poll("250ms")
        .guard_config(&policy)
        .annotation_timing("200ms", "2s");
    let agent = Agent::start_with_env(&args.args(), &[("KUBECONFIG", kubeconfig.as_os_str())]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ann = server.node("gpu-node-1").unwrap()["metadata"]["annotations"].clone();
        if ann.get("gpu-warden.io/vram-free-mib").is_some() {
            let json: serde_json::Value =
                serde_json::from_str(ann["gpu-warden.io/vram"].as_str().unwrap()).unwrap();
            assert_eq!(json["v"], 1);
            assert_eq!(
                json["gpus"][0]["uuid"],
                "GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b"
            );
            assert!(ann.get("gpu-warden.io/vram-max-free-mib").is_some());
            assert!(ann.get("gpu-warden.io/vram-observed-at").is_some());
            assert_eq!(ann["team"], "ml", "foreign annotations survive");
            break;
        }
        assert!(Instant::now() < deadline, "no annotations: {ann}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The greedy job grows into the 24 GiB GPU: the guard evicts it (and only it) before the
    // GPU is full. The double's faithful kubelet has no process to signal here (the
    // simulated job lives in the agent), so this checks the decision and the eviction request.
    let deadline = Instant::now() + Duration::from_secs(40);
    while server.evictions().is_empty() {
        assert!(Instant::now() < deadline, "no eviction");
        std::thread::sleep(Duration::from_millis(200));
    }
    let ev = server.evictions();
    assert_eq!(
        ev[0].name, "runner-abc123-project-77-concurrent-2",
        "{ev:?}"
    );
    // /state is rendered per full poll; a decision from a fast tick shows at the next one.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let state: serde_json::Value =
            serde_json::from_str(&get(agent.port, "/state").unwrap().body).unwrap();
        if !state["guard"]["recentDecisions"]
            .as_array()
            .unwrap()
            .is_empty()
        {
            break;
        }
        assert!(Instant::now() < deadline, "{state}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, took, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let ann = server.node("gpu-node-1").unwrap()["metadata"]["annotations"].clone();
    assert!(ann.get("gpu-warden.io/vram-free-mib").is_none(), "{ann}");
    assert!(ann.get("gpu-warden.io/vram").is_none(), "{ann}");
    assert_eq!(ann["team"], "ml");
    assert!(
        server.node("gpu-node-1").unwrap()["metadata"]["labels"]["nvidia.com/gpu.present"]
            == "true"
    );
}
