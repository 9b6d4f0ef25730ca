//! What the suites that run the agent on a fake kubelet share (`podresources_e2e`,
//! `podresources_forms`, the extender's kubelet-fed test in `extender_e2e`): the two-GPU
//! scenario of `kubelet::shared_node`, the API double holding a scenario's pods, the
//! agent's command line, and the probes they wait on.

use super::{get, AgentArgs};
use apiserver_double::ApiServer;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Two A10Gs, `g0` and `g1`, and the pods of `kubelet::shared_node`: GPU 0 holds three
/// replicas (4 + 2 GiB declared, 4 GiB used), GPU 1 two (`ml/train-0`, 8 GiB declared, 6 GiB
/// used, plus the 0.5 GiB of `ci/job-3`, which holds a replica of GPU 0 but runs on GPU 1).
pub fn shared_node_scenario(g0: &str, g1: &str) -> String {
    format!(
        "
gpus:
  - {{model: NVIDIA A10G, uuid: {g0}, memory_mib: 23028, reserved_mib: 434}}
  - {{model: NVIDIA A10G, uuid: {g1}, pci_bus_id: \"00000000:00:1F.0\", memory_mib: 23028, reserved_mib: 434}}
processes:
  - {{pid: 100, gpu: 0, memory: {{constant: 3000}}, pod: {{namespace: ci, name: job-1, annotations: {{gpu-warden.io/vram-request-mib: \"4096\"}}}}}}
  - {{pid: 101, gpu: 0, memory: {{constant: 1000}}, pod: {{namespace: ci, name: job-2, annotations: {{gpu-warden.io/vram-request-mib: \"2048\"}}}}}}
  - {{pid: 102, gpu: 1, memory: {{constant: 500}}, pod: {{namespace: ci, name: job-3}}}}
  - {{pid: 200, gpu: 1, memory: {{constant: 6000}}, pod: {{namespace: ml, name: train-0, annotations: {{gpu-warden.io/vram-request-mib: \"8192\"}}}}}}
"
    )
}

/// `ci/finished` of `kubelet::shared_node` on `node`: Succeeded, declaring 9999 MiB, and
/// still listed by the kubelet (kubernetes #119423).
pub fn finished_pod(node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "finished", "namespace": "ci", "uid": "0d0e0000-0000-4000-8000-000000000001",
                     "annotations": {"gpu-warden.io/vram-request-mib": "9999"}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Succeeded"}
    })
}

/// Writes `text` as `<dir>/<name>.yaml`; returns the path.
pub fn write_scenario(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The API double with the Node `node` (its object) and the pods of the scenario `text`
/// (named `name`) bound to it, and its kubeconfig, written in `dir`.
pub fn double_with_pods(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    node: Value,
    text: &str,
    name: &str,
) -> (ApiServer, PathBuf) {
    let server = rt.block_on(ApiServer::start()).unwrap();
    let node_name = node["metadata"]["name"].as_str().unwrap_or("").to_string();
    server.add_node(node).unwrap();
    let sc = gpu_warden::sample::scenario::Scenario::parse(text, name).unwrap();
    for p in gpu_warden::sample::sim::scenario_pods(&sc, &node_name) {
        server.add_pod(p).unwrap();
    }
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    (server, kubeconfig)
}

/// The agent on the scenario at `scenario_path` reading the fake kubelet at `socket` every
/// 100 ms, polling every 100 ms.
pub fn sim_args(scenario_path: &str, socket: &Path) -> AgentArgs {
    AgentArgs::sim()
        .scenario(scenario_path)
        .poll("100ms")
        .set("--pod-resources-socket", socket)
        .set("--pod-resources-interval", "100ms")
}

/// The agent's `/metrics` text, empty when it does not answer.
pub fn metrics(port: u16) -> String {
    get(port, "/metrics").map(|r| r.body).unwrap_or_default()
}

/// Waits up to 8 s for `ok`, then fails with what was last seen.
pub fn wait_until(what: &str, mut probe: impl FnMut() -> (bool, String)) {
    gpu_warden_testkit::wait_for_seen(what, Duration::from_secs(8), || match probe() {
        (true, _) => Ok(()),
        (false, seen) => Err(seen),
    });
}

/// The agent's log lines about the pod-resources feature.
pub fn pod_resources_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("pod-resources"))
        .collect()
}
