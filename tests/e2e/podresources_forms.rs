//! The replica view a platform engineer sizes `replicas` with, end to end (issue 27): the real
//! binary on the simulated backend, the fake kubelet (`kubelet.rs`, upstream's proto over a
//! real unix socket) playing each kubelet generation with every device-ID form NVIDIA's
//! device plugin writes, and the API double for the pod view and the Node. A MIG GPU (NVML's
//! MIG device UUIDs in the scenario) beside a whole GPU the kubelet names by index; a pod
//! holding a replica it runs nothing on; a pod bypassing the device plugin; a Jetson ID that
//! names no NVML GPU. Short intervals keep each to a few seconds.

use crate::kubelet::{devices_of, pod_of, serve, FakeKubelet, Generation};
use crate::support::pod_resources::{
    double_with_pods, metrics, pod_resources_lines, sim_args, wait_until,
};
use crate::support::*;
use gpu_warden::attribute::podresources::generated::AllocatableResourcesResponse;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, SystemTime};

const NODE: &str = "gpu-node-1";
const G0: &str = "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f";
const G1: &str = "GPU-66666666-7777-8888-9999-000000000000";
const MIG_A: &str = "MIG-0e4a6c2f-63a3-5b43-9a2e-1b3c3d7e8f90";
const MIG_B: &str = "MIG-1e4a6c2f-63a3-5b43-9a2e-1b3c3d7e8f91";

/// GPU 0 is an H100 in MIG mode with two slices; GPU 1 a whole H100.
fn scenario() -> String {
    format!(
        "
gpus:
  - {{model: NVIDIA H100 80GB HBM3, uuid: {G0}, memory_mib: 81559, mig_devices: [{MIG_A}, {MIG_B}]}}
  - {{model: NVIDIA H100 80GB HBM3, uuid: {G1}, pci_bus_id: \"00000000:00:1F.0\", memory_mib: 81559}}
processes:
  - {{pid: 100, gpu: 0, memory: {{constant: 5000}}, pod: {{namespace: ml, name: mig-a, annotations: {{gpu-warden.io/vram-request-mib: \"10240\"}}}}}}
  - {{pid: 101, gpu: 0, memory: {{constant: 3000}}, pod: {{namespace: ml, name: mig-b, annotations: {{gpu-warden.io/vram-request-mib: \"2048\"}}}}}}
  - {{pid: 200, gpu: 1, memory: {{constant: 1000}}, pod: {{namespace: ci, name: by-index}}}}
  - {{pid: 201, gpu: 1, memory: {{constant: 500}}, pod: {{namespace: ci, name: stray}}}}
  - {{pid: 202, gpu: 1, memory: {{constant: 700}}, pod: {{namespace: ci, name: jetson}}}}
"
    )
}

/// The kubelet's view of that node: the MIG slices under the mixed strategy's resource (one
/// time-sliced and renamed `.shared`), GPU 1 under the index form, `ci/idle` holding a
/// replica of GPU 1 with nothing running, `ci/stray` holding nothing, `ci/jetson` a device
/// that names no NVML GPU.
fn kubelet(generation: Generation) -> FakeKubelet {
    let k = FakeKubelet::default();
    k.set(|s| {
        s.generation = generation;
        s.allocatable = AllocatableResourcesResponse {
            devices: [
                devices_of("nvidia.com/mig-3g.40gb", &[MIG_A.into()]),
                devices_of(
                    "nvidia.com/mig-3g.40gb.shared",
                    &[format!("{MIG_B}::0"), format!("{MIG_B}::1")],
                ),
                devices_of(
                    "nvidia.com/gpu",
                    &["1::0".into(), "1::1".into(), "1::2".into()],
                ),
            ]
            .concat(),
            ..Default::default()
        };
        s.list.pod_resources = vec![
            pod_of("ml", "mig-a", "nvidia.com/mig-3g.40gb", vec![MIG_A.into()]),
            pod_of(
                "ml",
                "mig-b",
                "nvidia.com/mig-3g.40gb.shared",
                vec![format!("{MIG_B}::1")],
            ),
            pod_of("ci", "by-index", "nvidia.com/gpu", vec!["1::0".into()]),
            pod_of("ci", "idle", "nvidia.com/gpu", vec!["1::1".into()]),
            pod_of("ci", "stray", "nvidia.com/gpu", vec![]),
            pod_of("ci", "jetson", "nvidia.com/gpu", vec!["tegra".into()]),
        ];
    });
    k
}

fn state(port: u16) -> Value {
    get(port, "/state")
        .ok()
        .and_then(|r| serde_json::from_str(&r.body).ok())
        .unwrap_or(Value::Null)
}

fn write_scenario(dir: &Path) -> String {
    crate::support::pod_resources::write_scenario(dir, "mig-node", &scenario())
}

/// A MIG node behind a 1.22 kubelet with the `GetAllocatableResources` gate off, the plugin
/// writing MIG, time-sliced MIG, index and Tegra IDs. Before issue 27 every figure here was
/// wrong: the failing `GetAllocatableResources` discarded the `List` (no figures at all,
/// "kubelet restarting?"); with it served, the MIG and index IDs were dropped, so `mig-a`,
/// `mig-b` and `by-index` counted as bypassing the device plugin.
#[test]
fn a_mig_node_on_a_kubelet_without_get_allocatable_resources() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let node = json!({"metadata": {"name": NODE, "annotations": {}}});
    let (server, kubeconfig) = double_with_pods(&rt, dir.path(), node, &scenario(), "mig-node");
    let socket = dir.path().join("kubelet.sock");
    let kubelet = kubelet(Generation::GateOff);
    let serving = rt.block_on(async { serve(&kubelet, &socket) });
    let args = sim_args(&scenario_path, &socket)
        .node(NODE)
        .set("--guard-mode", "off")
        .annotation_timing("100ms", "2s");
    let agent = Agent::start_with_env(&args.args(), &[("KUBECONFIG", kubeconfig.as_os_str())]);

    let line = |family: &str, gpu: u32, uuid: &str, more: &str, v: u64| {
        format!("{family}{{gpu=\"{gpu}\",UUID=\"{uuid}\"{more}}} {v}\n")
    };
    let mib = 1024 * 1024;
    let expected = [
        line("gpu_warden_gpu_replicas", 0, G0, ",state=\"allocated\"", 2),
        line("gpu_warden_gpu_replicas", 1, G1, ",state=\"allocated\"", 2),
        line("gpu_warden_processes_without_replica", 0, G0, "", 0),
        line("gpu_warden_processes_without_replica", 1, G1, "", 1),
        line(
            "gpu_warden_pod_processes_without_replica",
            1,
            G1,
            ",namespace=\"ci\",pod=\"stray\"",
            1,
        ),
        line("gpu_warden_gpu_replicas_idle", 0, G0, "", 0),
        line("gpu_warden_gpu_replicas_idle", 1, G1, "", 1),
        line(
            "gpu_warden_gpu_memory_declared_bytes",
            0,
            G0,
            "",
            (10240 + 2048) * mib,
        ),
        // mig-a: max(10240, 5000); mig-b: max(2048, 3000).
        line(
            "gpu_warden_gpu_memory_committed_bytes",
            0,
            G0,
            "",
            (10240 + 3000) * mib,
        ),
        "gpu_warden_pod_resources_unmapped_devices 1\n".to_string(),
    ];
    wait_until("replica metrics from List alone", || {
        let m = metrics(agent.port);
        (expected.iter().all(|l| m.contains(l.as_str())), m)
    });
    let m = metrics(agent.port);
    assert!(
        !m.contains("state=\"allocatable\""),
        "allocatable absent: {m}"
    );
    assert!(
        !m.lines().any(
            |l| l.starts_with("gpu_warden_pod_processes_without_replica{")
                && l.contains("pod=\"jetson\"")
        ),
        "an unmatched ID is no bypass: {m}"
    );

    // The annotation: allocated per GPU, allocatable and the next GPU absent (not 0, not
    // null: the extender then judges the node without replica figures).
    wait_until("replicasAllocated in the annotation", || {
        let doc: Option<Value> = server.node(NODE).and_then(|n| {
            serde_json::from_str(n["metadata"]["annotations"]["gpu-warden.io/vram"].as_str()?).ok()
        });
        let ok = doc.as_ref().is_some_and(|d| {
            d["gpus"][0]["replicasAllocated"] == 2
                && d["gpus"][0].get("replicasAllocatable").is_none()
                && d["gpus"][0]["declaredMiB"] == 10240 + 2048
                && d.get("nextGpuUuid").is_none()
        });
        (ok, format!("{doc:?}"))
    });

    // /state: the pod → replica map, the idle hold and the bypassing process named.
    let s = state(agent.port);
    let r = &s["replicas"];
    assert!(
        r["allocatableUnknown"]
            .as_str()
            .is_some_and(|w| w.contains("feature gate off")),
        "{r:#}"
    );
    let pods = r["pods"].as_array().unwrap();
    let held = |name: &str| -> Vec<(Value, Value)> {
        pods.iter()
            .find(|p| p["name"] == name)
            .map(|p| {
                p["devices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| (d["id"].clone(), d["gpu"].clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(held("mig-a"), vec![(json!(MIG_A), json!(G0))], "{r:#}");
    assert_eq!(
        held("mig-b"),
        vec![(json!(format!("{MIG_B}::1")), json!(G0))]
    );
    assert_eq!(held("by-index"), vec![(json!("1::0"), json!(G1))]);
    assert_eq!(held("jetson"), vec![(json!("tegra"), Value::Null)]);
    let g1 = &r["gpus"][1];
    assert_eq!(g1["uuid"], G1);
    assert_eq!(
        g1["idleHolds"],
        json!([{"namespace": "ci", "name": "idle", "replicas": 1}])
    );
    assert_eq!(
        g1["bypassing"],
        json!([{"pid": 201, "namespace": "ci", "pod": "stray", "container": "main"}]),
        "{g1:#}"
    );
    assert!(g1.get("replicasAllocatable").is_none());

    let (status, _, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    let lines = pod_resources_lines(&stderr);
    let on: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("on (List answers)"))
        .collect();
    assert_eq!(on.len(), 1, "{lines:#?}");
    assert!(
        on[0].contains("not served") && on[0].contains("feature gate off"),
        "the on line says which call and why: {}",
        on[0]
    );
    assert!(!stderr.contains("kubelet restarting"), "{lines:#?}");
    let unmatched: Vec<&&str> = lines.iter().filter(|l| l.contains("name no GPU")).collect();
    assert_eq!(
        unmatched.len(),
        1,
        "one line for the unmatched IDs: {lines:#?}"
    );
    assert!(unmatched[0].contains("tegra") && unmatched[0].contains("ci/jetson"));
    rt.block_on(serving.shut_down(&socket));
}

/// The same node behind a current kubelet: allocatable per GPU (MIG slices on their
/// parent), and the next GPU the device plugin hands out.
#[test]
fn a_mig_node_on_a_current_kubelet() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let socket = dir.path().join("kubelet.sock");
    let kubelet = kubelet(Generation::Current);
    let serving = rt.block_on(async { serve(&kubelet, &socket) });
    let agent = Agent::start(&sim_args(&scenario_path, &socket).kube_off().args());
    let expected = [
        format!("gpu_warden_gpu_replicas{{gpu=\"0\",UUID=\"{G0}\",state=\"allocatable\"}} 3\n"),
        format!("gpu_warden_gpu_replicas{{gpu=\"1\",UUID=\"{G1}\",state=\"allocatable\"}} 3\n"),
        format!("gpu_warden_processes_without_replica{{gpu=\"0\",UUID=\"{G0}\"}} 0\n"),
    ];
    wait_until("allocatable replicas", || {
        let m = metrics(agent.port);
        (expected.iter().all(|l| m.contains(l.as_str())), m)
    });
    let s = state(agent.port);
    assert_eq!(s["replicas"]["allocatableUnknown"], Value::Null, "{s:#}");
    assert_eq!(s["replicas"]["gpus"][0]["replicasAllocatable"], 3);
    let (status, _, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("on (List answers)")
            && stderr.contains("get_allocatable_resources=answers"),
        "{stderr}"
    );
    rt.block_on(serving.shut_down(&socket));
}

/// "on" only once the kubelet answers: a stale socket that refuses connections is said as
/// such, and `on` comes when the kubelet is up (before issue 27 `on` was printed for the
/// refusing socket at start).
#[test]
fn on_is_said_only_for_a_socket_that_answers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let socket = dir.path().join("kubelet.sock");
    // A socket file left by a dead kubelet: connecting is refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let agent = Agent::start(&sim_args(&scenario_path, &socket).kube_off().args());
    std::thread::sleep(Duration::from_millis(400));
    assert!(!metrics(agent.port).contains("gpu_warden_gpu_replicas"));
    std::fs::remove_file(&socket).unwrap();
    let up = SystemTime::now();
    let kubelet = kubelet(Generation::Current);
    let serving = rt.block_on(async { serve(&kubelet, &socket) });
    wait_until("figures once the kubelet is up", || {
        let m = metrics(agent.port);
        (m.contains("gpu_warden_gpu_replicas{"), m)
    });
    let (status, _, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    let lines = pod_resources_lines(&stderr);
    assert!(
        lines[0].contains("refuses connections"),
        "the first line names the state: {lines:#?}"
    );
    let on: Vec<&&str> = lines.iter().filter(|l| l.contains(": on")).collect();
    assert_eq!(on.len(), 1, "{lines:#?}");
    let at = humantime::parse_rfc3339(on[0].split_whitespace().next().unwrap()).unwrap();
    assert!(
        at >= up,
        "on was said before the kubelet answered: {}",
        on[0]
    );
    rt.block_on(serving.shut_down(&socket));
}

/// A directory at the socket path — what a hostPath mount of the socket file leaves when the
/// socket is missing — is said as such in the one `off` line (before issue 27: "Connection
/// refused", retried forever).
#[test]
fn a_directory_at_the_socket_path_is_said_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let socket = dir.path().join("kubelet.sock");
    std::fs::create_dir(&socket).unwrap();
    let agent = Agent::start(&sim_args(&scenario_path, &socket).kube_off().args());
    std::thread::sleep(Duration::from_millis(300));
    let (status, _, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    let lines = pod_resources_lines(&stderr);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("pod-resources: off")
            && lines[0].contains("a directory, not a socket")
            && lines[0].contains("mount the directory"),
        "{}",
        lines[0]
    );
}

/// A kubelet before 1.20 serves no v1 API: `List` fails with a reason that says so, and no
/// `on` line is printed.
#[test]
fn a_kubelet_without_the_v1_api_is_named() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let socket = dir.path().join("kubelet.sock");
    let kubelet = kubelet(Generation::AlphaOnly);
    let serving = rt.block_on(async { serve(&kubelet, &socket) });
    let agent = Agent::start(&sim_args(&scenario_path, &socket).kube_off().args());
    wait_until("a few List calls", || {
        (kubelet.calls() >= 3, kubelet.calls().to_string())
    });
    let (status, _, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    let lines = pod_resources_lines(&stderr);
    assert_eq!(lines.len(), 1, "logged once, not per poll: {lines:#?}");
    assert!(
        lines[0].contains("List failed") && lines[0].contains("before 1.20"),
        "{}",
        lines[0]
    );
    rt.block_on(serving.shut_down(&socket));
}
