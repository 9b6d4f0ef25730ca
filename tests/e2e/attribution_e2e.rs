//! Attribution end to end (the double over real HTTP): the simulator writes a /proc tree, the API
//! double serves the scenario's pods, and the real binary with the real kube client maps
//! every GPU process to its pod and container — checked over HTTP in /metrics and /state.

use crate::support::*;
use apiserver_double::ApiServer;
use serde_json::Value;
use std::time::Duration;

const SCENARIO: &str = "tests/prometheus/scenario.yaml";

fn sim_pods(node: &str) -> Vec<Value> {
    let scenario = gpu_warden::sample::scenario::Scenario::load(&root().join(SCENARIO)).unwrap();
    gpu_warden::sample::sim::scenario_pods(&scenario, node)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    gpu_warden_testkit::wait_for(what, Duration::from_secs(15), || f().then_some(()));
}

/// The scenario on node `gpu-node-1`, with the simulated `/proc` at `proc_root`.
fn sim_args(proc_root: &std::path::Path) -> AgentArgs {
    AgentArgs::sim()
        .scenario(SCENARIO)
        .node("gpu-node-1")
        .set("--proc-root", proc_root)
}

fn start_agent(server: &ApiServer, dir: &std::path::Path) -> Agent {
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let proc_root = dir.join("proc");
    let args = sim_args(&proc_root)
        .set("--process-util-interval", "200ms")
        .switch("--per-process-metrics");
    Agent::start_with_env(&args.args(), &[("KUBECONFIG", kubeconfig.as_os_str())])
}

#[test]
fn processes_are_attributed_through_the_real_kube_client() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    // A pod of another node must not be watched.
    server.add_pod(serde_json::json!({"metadata": {"name": "elsewhere", "namespace": "ci", "uid": "aaaaaaaa-0000-4000-8000-000000000000"}, "spec": {"nodeName": "other-node", "containers": [{"name": "c"}]}})).unwrap();
    for pod in sim_pods("gpu-node-1") {
        server.add_pod(pod).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&server, dir.path());

    wait_until("pod labels in /metrics", || {
        get(agent.port, "/metrics")
            .map(|r| r.body.contains("pod=\"job-1\""))
            .unwrap_or(false)
    });
    let m = get(agent.port, "/metrics").unwrap().body;
    assert!(m.contains("gpu_warden_container_gpu_memory_used_bytes{gpu=\"0\",UUID=\"GPU-11111111-2222-3333-4444-555555555555\",namespace=\"ci\",pod=\"job-1\",container=\"build\"} 6442450944\n"), "{m}");
    assert!(m.contains("gpu_warden_container_gpu_memory_used_bytes{gpu=\"1\",UUID=\"GPU-66666666-7777-8888-9999-000000000000\",namespace=\"ml\",pod=\"train-0\",container=\"trainer\"} 8589934592\n"), "{m}");
    assert!(
        m.contains("namespace=\"\",pod=\"\",container=\"\"} 1073741824\n"),
        "host process with empty labels: {m}"
    );
    assert!(m.contains("gpu_warden_container_gpu_sm_utilization_ratio{gpu=\"0\",UUID=\"GPU-11111111-2222-3333-4444-555555555555\",namespace=\"ci\",pod=\"job-1\",container=\"build\"} 0.5\n"), "{m}");
    assert!(m.contains("gpu_warden_invisible_processes 0\n"), "{m}");

    let state: Value = serde_json::from_str(&get(agent.port, "/state").unwrap().body).unwrap();
    let procs = state["snapshot"]["processes"].as_array().unwrap();
    let owner = |pid: u64| procs.iter().find(|p| p["pid"] == pid).unwrap()["owner"].clone();
    assert_eq!(owner(100)["kind"], "pod");
    assert_eq!(owner(100)["pod"], "job-1");
    assert_eq!(owner(100)["container"], "build");
    assert_eq!(owner(102)["kind"], "host");

    // The watch asked for this node's pods only. The labels come from the initial list; the
    // watch request follows it, later on a loaded machine (CI once asserted before it came).
    let watched = |r: &apiserver_double::RecordedRequest| {
        r.path == "/api/v1/pods"
            && r.query.contains("watch=true")
            && r.query.contains("fieldSelector=spec.nodeName%3Dgpu-node-1")
    };
    wait_until("the pod watch's request", || {
        server.requests().iter().any(watched)
    });
    let reqs = server.requests();
    assert!(
        reqs.iter()
            .filter(|r| r.path == "/api/v1/pods")
            .all(|r| r.query.contains("fieldSelector=spec.nodeName%3Dgpu-node-1")),
        "{:?}",
        reqs.iter()
            .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
            .collect::<Vec<_>>()
    );
    assert!(!m.contains("elsewhere"));

    // A deleted pod's series disappear at the next poll: its still-running process is
    // reported without pod labels.
    server.delete_pod("ml", "train-0").unwrap();
    wait_until("train-0 series gone", || {
        get(agent.port, "/metrics")
            .map(|r| !r.body.contains("pod=\"train-0\""))
            .unwrap_or(false)
    });
    let m = get(agent.port, "/metrics").unwrap().body;
    assert!(m.contains("gpu_warden_container_gpu_memory_used_bytes{gpu=\"1\",UUID=\"GPU-66666666-7777-8888-9999-000000000000\",namespace=\"\",pod=\"\",container=\"\"} 8589934592\n"), "{m}");

    // Re-created with the same UID (as a test stand-in for a restarted watch), it is found again.
    for pod in sim_pods("gpu-node-1") {
        if pod["metadata"]["name"] == "train-0" {
            server.add_pod(pod).unwrap();
        }
    }
    wait_until("train-0 back", || {
        get(agent.port, "/metrics")
            .map(|r| r.body.contains("pod=\"train-0\""))
            .unwrap_or(false)
    });

    // A container restart (new container ID in the pod's status) leaves the pod known but
    // the old process's container unnamed until the process itself is replaced.
    server.update_pod("ci", "job-1", |p| {
        p["status"]["containerStatuses"][0]["containerID"] =
            Value::from(format!("containerd://{}", "f".repeat(64)));
    });
    wait_until("container name cleared after restart", || {
        get(agent.port, "/metrics")
            .map(|r| {
                r.body
                    .contains("namespace=\"ci\",pod=\"job-1\",container=\"\"}")
            })
            .unwrap_or(false)
    });
    drop(agent);
}

#[test]
fn missing_proc_entries_are_loud_not_silent() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let proc_root = dir.path().join("proc");
    let agent = Agent::start_with_env(
        &sim_args(&proc_root).args(),
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    // Remove pid 100's entry behind the simulator's back: the process is still on the GPU.
    std::fs::remove_dir_all(proc_root.join("100")).unwrap();
    wait_until("invisible process counted", || {
        get(agent.port, "/metrics")
            .map(|r| r.body.contains("gpu_warden_invisible_processes 1\n"))
            .unwrap_or(false)
    });
    let (status, _, stderr) = agent.terminate();
    assert!(status.success());
    assert!(stderr.contains("hostPID: true"), "{stderr}");
    assert_eq!(
        stderr.matches("cannot see").count(),
        1,
        "one warning, not one per poll: {stderr}"
    );
}
