//! The kubelet's pod-resources data end to end: the real binary on the simulated
//! backend, the fake kubelet of `tests/e2e/kubelet.rs` over a real unix socket, and the API
//! double for the pod view and the Node. Two GPUs time-sliced four ways (`GPU-<uuid>::<n>`
//! replica IDs); a finished pod the kubelet still lists (kubernetes #119423); a pod whose
//! process runs on a GPU it holds no replica of. Short intervals keep it to a few seconds.

use crate::kubelet::{pod, replicas, serve, shared_node, FakeKubelet};
use crate::support::pod_resources::{
    double_with_pods, finished_pod, metrics, pod_resources_lines, shared_node_scenario, sim_args,
    wait_until,
};
use crate::support::*;
use apiserver_double::ApiServer;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;

const NODE: &str = "gpu-node-1";
const G0: &str = "GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b";
const G1: &str = "GPU-66666666-7777-8888-9999-000000000000";

/// Two A10Gs, the pods of `kubelet::shared_node`: `ci/job-3` holds a replica of GPU 0 but
/// runs on GPU 1.
fn scenario() -> String {
    shared_node_scenario(G0, G1)
}

fn replica_line(gpu: u32, uuid: &str, state: &str, n: u32) -> String {
    format!("gpu_warden_gpu_replicas{{gpu=\"{gpu}\",UUID=\"{uuid}\",state=\"{state}\"}} {n}\n")
}

fn vram_doc(server: &ApiServer) -> Option<Value> {
    let node = server.node(NODE)?;
    serde_json::from_str(node["metadata"]["annotations"]["gpu-warden.io/vram"].as_str()?).ok()
}

fn write_scenario(dir: &Path) -> String {
    crate::support::pod_resources::write_scenario(dir, "two-gpus", &scenario())
}

#[test]
fn replicas_reach_the_annotation_and_metrics_and_come_back_after_a_kubelet_restart() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let node = json!({"metadata": {"name": NODE, "annotations": {"team": "ml"}}});
    let (server, kubeconfig) = double_with_pods(&rt, dir.path(), node, &scenario(), "two-gpus");
    // Finished, but still listed by the kubelet: its replica and its 9999 MiB must not count.
    server.add_pod(finished_pod(NODE)).unwrap();

    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    shared_node(&kubelet, G0, G1);
    let serving = rt.block_on(async { serve(&kubelet, &socket) });

    let args = sim_args(&scenario_path, &socket)
        .node(NODE)
        .set("--guard-mode", "off")
        .annotation_timing("100ms", "2s");
    let agent = Agent::start_with_env(&args.args(), &[("KUBECONFIG", kubeconfig.as_os_str())]);

    let expected = [
        replica_line(0, G0, "allocated", 3),
        replica_line(0, G0, "allocatable", 4),
        replica_line(1, G1, "allocated", 2),
        replica_line(1, G1, "allocatable", 4),
        format!("gpu_warden_processes_without_replica{{gpu=\"0\",UUID=\"{G0}\"}} 0\n"),
        format!("gpu_warden_processes_without_replica{{gpu=\"1\",UUID=\"{G1}\"}} 1\n"),
    ];
    wait_until("replica metrics", || {
        let m = metrics(agent.port);
        (expected.iter().all(|l| m.contains(l.as_str())), m)
    });

    wait_until("replica figures in the vram annotation", || {
        let doc = vram_doc(&server);
        let ok = doc.as_ref().is_some_and(|d| {
            d["gpus"][0]["replicasAllocated"] == 3
                && d["gpus"][1]["replicasAllocated"] == 2
                && d["gpus"][1]["declaredMiB"] == 8192
        });
        (ok, format!("{doc:?}"))
    });
    let doc = vram_doc(&server).unwrap();
    let g0 = &doc["gpus"][0];
    assert_eq!(
        (g0["index"].clone(), g0["uuid"].clone()),
        (json!(0), json!(G0))
    );
    assert_eq!(g0["replicasAllocatable"], 4);
    assert_eq!(
        g0["declaredMiB"],
        4096 + 2048,
        "job-3 declares nothing: {doc}"
    );
    assert_eq!(doc["gpus"][1]["replicasAllocatable"], 4);
    assert_eq!(
        doc["nextGpuUuid"], G1,
        "the device plugin hands out the GPU with fewer replicas out (2 < 3): {doc}"
    );
    // The document's other keys are the ones it always had.
    let keys: BTreeSet<&str> = g0.as_object().unwrap().keys().map(String::as_str).collect();
    let expected_keys: BTreeSet<&str> = [
        "index",
        "uuid",
        "totalMiB",
        "usedMiB",
        "freeMiB",
        "pressure",
        "replicasAllocated",
        "replicasAllocatable",
        "declaredMiB",
    ]
    .into();
    assert_eq!(keys, expected_keys);
    assert_eq!(doc["v"], 1);

    // The kubelet restarts: it deletes its socket; polls fail; after three intervals the
    // figures are withdrawn (absent, not zero), in metrics and annotation alike.
    rt.block_on(serving.shut_down(&socket));
    wait_until("replica metrics withdrawn", || {
        let m = metrics(agent.port);
        (
            !m.contains("gpu_warden_gpu_replicas") && m.contains("DCGM_FI_DEV_FB_FREE"),
            m,
        )
    });
    wait_until("replica keys withdrawn from the annotation", || {
        let doc = vram_doc(&server);
        let ok = doc.as_ref().is_some_and(|d| {
            d.get("nextGpuUuid").is_none() && d["gpus"][0].get("replicasAllocated").is_none()
        });
        (ok, format!("{doc:?}"))
    });

    // It comes back on a new socket at the same path, with one more pod on GPU 1: 3 and 3
    // replicas out, so the tie goes to the lower index.
    kubelet.set(|s| {
        s.list
            .pod_resources
            .push(pod("ml", "train-2", replicas(G1, 2..3)))
    });
    let serving = rt.block_on(async { serve(&kubelet, &socket) });
    wait_until("replica metrics back after the restart", || {
        let m = metrics(agent.port);
        (m.contains(&replica_line(1, G1, "allocated", 3)), m)
    });
    wait_until("replica figures back in the annotation", || {
        let doc = vram_doc(&server);
        let ok = doc
            .as_ref()
            .is_some_and(|d| d["gpus"][1]["replicasAllocated"] == 3 && d["nextGpuUuid"] == G0);
        (ok, format!("{doc:?}"))
    });

    let (status, _, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    let lines = pod_resources_lines(&stderr);
    assert!(
        lines.iter().any(|l| l.contains("pod-resources: on")),
        "{stderr}"
    );
    assert!(
        lines.iter().any(|l| l.contains("List answers again")),
        "{stderr}"
    );
    // Withdrawn by the third failed poll: shown for three intervals, as documented (before
    // issue 27 the age was taken from the answer's arrival with a strict `<`, a fourth). A
    // starved runtime whose tick came late may withdraw at the second; never later than the
    // third (`feed::tests` pins the rule exactly).
    assert!(
        lines.iter().any(|l| l.contains("withdrawn")
            && (l.contains("failed_polls=3") || l.contains("failed_polls=2"))),
        "{lines:#?}"
    );
    // Logged by transition, not per failed poll.
    assert!(lines.len() <= 5, "{lines:#?}");
    rt.block_on(serving.shut_down(&socket));
}

#[test]
fn absent_socket_is_one_log_line_and_nothing_else_changes() {
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let absent = dir.path().join("no-kubelet/kubelet.sock");
    let families = |flag: &str, value: &str| {
        let args = AgentArgs::sim()
            .scenario(&scenario_path)
            .kube_off()
            .poll("100ms")
            .set(flag, value);
        let agent = Agent::start(&args.args());
        let m = metrics(agent.port);
        let (status, _, stderr) = agent.terminate();
        assert!(status.success(), "{stderr}");
        let types: Vec<String> = m
            .lines()
            .filter(|l| l.starts_with("# TYPE"))
            .map(str::to_string)
            .collect();
        (types, stderr)
    };
    let (with_absent, stderr) = families("--pod-resources-socket", absent.to_str().unwrap());
    let lines = pod_resources_lines(&stderr);
    assert_eq!(lines.len(), 1, "exactly one line: {stderr}");
    assert!(
        lines[0].contains("pod-resources: off")
            && lines[0].contains("no kubelet pod-resources socket"),
        "{}",
        lines[0]
    );
    assert!(
        !with_absent.iter().any(|t| t.contains("replica")),
        "{with_absent:?}"
    );
    let (switched_off, _) = families("--pod-resources", "off");
    assert_eq!(
        with_absent, switched_off,
        "the same families as with the feature off"
    );
}

/// The socket's directory is mounted but the socket is not there when the agent starts (the
/// kubelet restarting at the same moment): one log line, no figures, and once the kubelet
/// creates the socket the figures appear without an agent restart.
#[test]
fn a_socket_that_appears_after_start_is_picked_up() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let socket = dir.path().join("kubelet.sock");
    let agent = Agent::start(&sim_args(&scenario_path, &socket).kube_off().args());
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert!(
        !metrics(agent.port).contains("gpu_warden_gpu_replicas"),
        "no figures before the kubelet is there"
    );
    let kubelet = FakeKubelet::default();
    shared_node(&kubelet, G0, G1);
    let serving = rt.block_on(async { serve(&kubelet, &socket) });
    let expected = replica_line(0, G0, "allocatable", 4);
    wait_until("replica metrics once the socket appears", || {
        let m = metrics(agent.port);
        (m.contains(expected.as_str()), m)
    });
    let (status, _, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    let lines = pod_resources_lines(&stderr);
    assert_eq!(lines.len(), 2, "one line waiting, one line on: {stderr}");
    assert!(
        lines[0].contains("waiting for the kubelet") && lines[1].contains("pod-resources: on"),
        "{lines:?}"
    );
    rt.block_on(serving.shut_down(&socket));
}

/// The agent's resident memory, kB (`VmRSS`), 0 if it cannot be read.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A large `List` answer does not leave the agent at its peak (issue 27): 1,900 pods with 40
/// replica IDs each (3.7 MB) raise RSS by tens of MB while they are decoded; once the kubelet
/// answers small again, RSS comes back down (glibc kept the freed memory — 92 MB for good —
/// until the feed trimmed the allocator after each large answer).
#[test]
fn resident_memory_comes_back_down_after_a_large_answer() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenario_path = write_scenario(dir.path());
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    shared_node(&kubelet, G0, G1);
    let serving = rt.block_on(async { serve(&kubelet, &socket) });
    // A debug build encodes the large answer slowly: a 1 s interval (and call timeout).
    let args = sim_args(&scenario_path, &socket)
        .set("--pod-resources-interval", "1s")
        .kube_off();
    let agent = Agent::start(&args.args());
    let pid = agent.child.id();
    wait_until("replica metrics", || {
        let m = metrics(agent.port);
        (m.contains("gpu_warden_gpu_replicas{"), m)
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    let base = rss_kb(pid);

    kubelet.set(|s| {
        s.list.pod_resources = (0..1900)
            .map(|i| pod("ci", &format!("job-{i:012}"), replicas(G0, 0..40)))
            .collect()
    });
    let served = |n: u64| {
        let from = kubelet.calls();
        move |k: &FakeKubelet| k.calls() >= from + n
    };
    let mut peak = base;
    let enough = served(8);
    wait_until("large answers served", || {
        peak = peak.max(rss_kb(pid));
        (enough(&kubelet), format!("{} calls", kubelet.calls()))
    });
    shared_node(&kubelet, G0, G1);
    let enough = served(6);
    wait_until("small answers again", || {
        (enough(&kubelet), format!("{} calls", kubelet.calls()))
    });
    let after = rss_kb(pid);
    assert!(
        peak >= base + 20_000,
        "the large answers must raise RSS for this test to show anything: {base} → {peak} kB"
    );
    assert!(
        after < base + (peak - base) / 3,
        "RSS stayed up after the large answers: {base} → peak {peak} → {after} kB"
    );
    drop(agent);
    rt.block_on(serving.shut_down(&socket));
}
