//! The CUDA check end to end (docs/cuda.md) on the API double: a real agent whose simulated
//! driver supports CUDA 12.4 publishes the version (metric, Node annotation), tells the job
//! pod whose image needs CUDA 12.8 with one Warning Event and counts it; then the real
//! extender, reading that Node, refuses it for such a pod with the reason, while a node with a
//! newer driver, a node whose agent publishes no version, and a pod whose need is unknown
//! pass.

use crate::support::*;
use apiserver_double::ApiServer;
use gpu_warden::model::cuda::CudaVersion;
use gpu_warden::model::pressure::Pressure;
use gpu_warden::publish::annotations::{AnnotationValues, GpuFigures};
use gpu_warden_testkit::fixtures::pod;
use gpu_warden_testkit::{wait_for, wait_for_seen};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime};

const SCENARIO: &str = "driver_version: 550.54.15\ncuda_driver_version: \"12.4\"\n\
    gpus:\n  - {model: NVIDIA A10G, memory_mib: 23028, reserved_mib: 434}\n";

const NEEDS_12_8: &str = "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04";

/// A Node annotated by the agent's own writer, with or without a CUDA version.
fn written_node(name: &str, cuda: Option<CudaVersion>) -> Value {
    let gpu = GpuFigures {
        index: 0,
        uuid: format!("GPU-{name}"),
        total_mib: 23028,
        used_mib: 0,
        free_mib: 22528,
        pressure: Pressure::None,
        replicas_allocated: None,
        replicas_allocatable: None,
        declared_mib: None,
    };
    let v = AnnotationValues {
        observed_at: SystemTime::now(),
        free_mib: gpu.free_mib,
        max_free_mib: gpu.free_mib,
        gpus: vec![gpu],
        next_gpu: None,
        cuda_driver_version: cuda,
    };
    json!({"metadata": {"name": name, "annotations": v.to_annotations("gpu-warden.io")}})
}

fn filter(port: u16, image: &str, nodes: &[&str]) -> Value {
    let pod = json!({
        "metadata": {"name": "job-9", "namespace": "ci", "uid": "uid-job-9",
            "annotations": {"gpu-warden.io/vram-request-mib": "2048"}},
        "spec": {"containers": [{"name": "build", "image": image,
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}
    });
    let body = json!({"Pod": pod, "Nodes": null, "NodeNames": nodes}).to_string();
    let raw = format!(
        "POST /filter HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let r = raw_request(port, raw.as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

fn mismatch_events(server: &ApiServer) -> Vec<Value> {
    server
        .events()
        .into_iter()
        .map(|e| e.object)
        .filter(|o| o["reason"] == "CUDADriverTooOld")
        .collect()
}

fn polls(port: u16) -> Option<u64> {
    let text = get(port, "/metrics").ok()?.body;
    text.lines()
        .find(|l| l.starts_with("gpu_warden_poll_duration_seconds_count"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_job_needing_a_newer_cuda_is_told_once_and_kept_off_the_old_driver() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    server
        .add_node(json!({"metadata": {"name": "gpu-old"}}))
        .unwrap();
    let project = "project.runner.gitlab.com/id";
    for p in [
        pod("uid-new")
            .name("job-new")
            .label(project, "4711")
            .container("build", NEEDS_12_8, true)
            .container(
                "helper",
                "gitlab/gitlab-runner-helper:x86_64-v17.0.0",
                false,
            ),
        pod("uid-ok").name("job-ok").container(
            "build",
            "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
            true,
        ),
        pod("uid-unknown")
            .name("job-unknown")
            .container("build", "myorg/cuda-tools:12.8", true),
    ] {
        server.add_pod(p.api_object("gpu-old")).unwrap();
    }
    let scenario = dir.path().join("old.yaml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let agent = Agent::start_with_env(
        &[
            "--scenario",
            scenario.to_str().unwrap(),
            "--node-name",
            "gpu-old",
            "--poll-interval",
            "250ms",
            "--annotation-min-interval",
            "200ms",
            "--pod-resources",
            "off",
        ],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );

    // Said to the job: one Warning on the pod whose image needs more, at once.
    let events = wait_for("the CUDA Warning", Duration::from_secs(20), || {
        Some(mismatch_events(&server)).filter(|e| !e.is_empty())
    });
    let e = &events[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["regarding"]["name"], "job-new");
    assert_eq!(e["regarding"]["uid"], "uid-new");
    let note = e["note"].as_str().or(e["message"].as_str()).unwrap();
    assert_eq!(
        note,
        "This pod needs CUDA 12.8 (read from the image nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 \
         (the nvidia/cuda tag X.Y.Z-<flavor>)) but the node's driver supports CUDA 12.4 (CUDA \
         minor-version compatibility may run some 12.x code on it, not PTX JIT or newer APIs, and \
         the NVIDIA container toolkit's cuda>=12.8 check refuses it): use an image built for CUDA \
         <= 12.4, or a node group with a newer driver"
    );
    // Once per pod: four more polls add nothing.
    let seen = wait_for("a poll", Duration::from_secs(10), || polls(agent.port));
    wait_for("four more polls", Duration::from_secs(20), || {
        polls(agent.port).filter(|n| *n >= seen + 4)
    });
    assert_eq!(mismatch_events(&server).len(), 1);
    let text = get(agent.port, "/metrics").unwrap().body;
    assert!(
        text.contains("gpu_warden_cuda_mismatches_total{namespace=\"ci\",project=\"4711\"} 1\n"),
        "{text}"
    );
    let cuda_line = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_CUDA_DRIVER_VERSION{"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(cuda_line.ends_with("} 12040"), "{cuda_line}");

    // Published with the figures.
    let published = wait_for_seen("the CUDA annotation", Duration::from_secs(20), || {
        let node = server.node("gpu-old").unwrap_or_default();
        let ann = &node["metadata"]["annotations"];
        ann["gpu-warden.io/cuda-driver-version"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ann.to_string())
    });
    assert_eq!(published, "12.4");

    // Kept off the nodes that cannot run it.
    server
        .add_node(written_node(
            "gpu-new",
            Some(CudaVersion {
                major: 13,
                minor: 0,
            }),
        ))
        .unwrap();
    server.add_node(written_node("gpu-legacy", None)).unwrap();
    let policy = dir.path().join("extender.yaml");
    std::fs::write(&policy, "staleAfter: 120s\n").unwrap();
    let ext = Agent::start_with_env(
        &["extender", "--config", policy.to_str().unwrap()],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    let all = ["gpu-old", "gpu-new", "gpu-legacy"];
    let j = wait_for("the node cache", Duration::from_secs(20), || {
        let j = filter(ext.port, NEEDS_12_8, &all);
        j["FailedAndUnresolvableNodes"]
            .get("gpu-old")
            .is_some()
            .then_some(j)
    });
    assert_eq!(j["NodeNames"], json!(["gpu-new", "gpu-legacy"]), "{j}");
    assert_eq!(
        j["FailedAndUnresolvableNodes"]["gpu-old"],
        "the pod needs CUDA 12.8 (read from the image nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 \
         (the nvidia/cuda tag X.Y.Z-<flavor>)) but the node's driver supports CUDA 12.4 (CUDA \
         minor-version compatibility may run some 12.x code on it, not PTX JIT or newer APIs, and \
         the NVIDIA container toolkit's cuda>=12.8 check refuses it): use an image built for CUDA \
         <= 12.4, or a node group with a newer driver"
    );
    // An unknown need is not refused anywhere.
    let j = filter(ext.port, "myorg/cuda-tools:12.8", &all);
    assert_eq!(j["NodeNames"], json!(all), "{j}");
}
