//! `gpu-warden extender` against the API double: Nodes annotated by real agents playing the
//! simulator (two nodes, two A10Gs each), and by the agent's own annotation writer where a
//! figure the simulator cannot produce is needed (the kubelet's replica figures, an old
//! observation). Requests carry kube-scheduler's wire shapes; the fixtures are Go's
//! `encoding/json` output of `extenderv1` / `v1.Pod` values.

use crate::support::pod_resources::{
    double_with_pods, finished_pod, shared_node_scenario, write_scenario,
};
use crate::support::*;
use apiserver_double::ApiServer;
use gpu_warden::model::pressure::Pressure;
use gpu_warden::publish::annotations::{AnnotationValues, GpuFigures};
use gpu_warden_testkit::wait_for;
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime};

/// Verbatim from upstream's compatibility test of the wire types — Go's `json.Marshal` of an
/// `ExtenderArgs` (kubernetes/kubernetes, staging/src/k8s.io/kube-scheduler/extender/v1/
/// types_test.go, commit 9891f82d816be0f7ee3ff1eb080089737ad596c9, TestCompatibility). Its
/// pod asks for no GPU, so every node passes.
const UPSTREAM_ARGS: &str = r#"{"Pod":{"metadata":{"name":"podname","creationTimestamp":null},"spec":{"containers":null},"status":{}},"Nodes":{"metadata":{},"items":[{"metadata":{"name":"nodename","creationTimestamp":null},"spec":{},"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}}]},"NodeNames":["node1"]}"#;

/// A GitLab Runner CI job pod in the shape Go's encoding/json gives a `v1.Pod` (field order
/// of the Go structs, `creationTimestamp` as RFC 3339, quantities as strings, `status` with
/// the phase only, as kube-scheduler sees a pending pod). Written for this test after the
/// upstream fixture above and the runner's labels/annotations (GitLab Runner's pod labels and annotations); not captured
/// from a cluster.
fn ci_pod(name: &str, need_mib: Option<u64>) -> Value {
    let mut ann = json!({
        "job.runner.gitlab.com/id": "4242",
        "job.runner.gitlab.com/url": "https://gitlab.example.com/ml/train/-/jobs/4242"
    });
    if let Some(n) = need_mib {
        ann["gpu-warden.io/vram-request-mib"] = json!(n.to_string());
    }
    json!({
        "metadata": {"name": name, "namespace": "gitlab-runner", "uid": format!("uid-{name}"),
            "resourceVersion": "81234", "creationTimestamp": "2026-05-28T20:26:40Z",
            "labels": {"project.runner.gitlab.com/id": "7", "pod": name},
            "annotations": ann},
        "spec": {"containers": [{"name": "build", "image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}],
            "restartPolicy": "Never", "schedulerName": "gpu-warden-scheduler"},
        "status": {"phase": "Pending", "qosClass": "BestEffort"}
    })
}

fn args(pod: Value, nodes: &[&str]) -> String {
    json!({"Pod": pod, "Nodes": null, "NodeNames": nodes}).to_string()
}

fn post(port: u16, path: &str, body: &str) -> Reply {
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw_request(port, raw.as_bytes()).unwrap()
}

fn json_of(r: &Reply) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

/// A scenario of two A10Gs with one steady process each.
fn two_a10g(mib0: u64, mib1: u64) -> String {
    format!(
        "gpus:\n  - {{model: NVIDIA A10G, count: 2, memory_mib: 23028, reserved_mib: 434}}\n\
         processes:\n  - {{pid: 100, gpu: 0, memory: {{constant: {mib0}}}}}\n  - {{pid: 200, gpu: 1, memory: {{constant: {mib1}}}}}\n"
    )
}

fn fig(index: u32, free: u64, used: u64, allocated: u32, declared: u64) -> GpuFigures {
    GpuFigures {
        index,
        uuid: format!("GPU-c-{index}"),
        total_mib: 23028,
        used_mib: used,
        free_mib: free,
        pressure: Pressure::None,
        replicas_allocated: Some(allocated),
        replicas_allocatable: Some(4),
        declared_mib: Some(declared),
    }
}

/// Annotations in the agent's exact format, from the agent's own writer.
fn written(gpus: Vec<GpuFigures>, next: Option<Option<String>>, observed_at: SystemTime) -> Value {
    let v = AnnotationValues {
        observed_at,
        free_mib: gpus.iter().map(|g| g.free_mib).sum(),
        max_free_mib: gpus.iter().map(|g| g.free_mib).max().unwrap_or(0),
        gpus,
        next_gpu: next,
        cuda_driver_version: None,
    };
    json!(v.to_annotations("gpu-warden.io"))
}

fn metric(port: u16, line_prefix: &str) -> Option<f64> {
    let text = get(port, "/metrics").ok()?.body;
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn extender_against_agents_on_the_double() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let now = SystemTime::now();
    for name in ["gpu-a", "gpu-b"] {
        server
            .add_node(
                json!({"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}}),
            )
            .unwrap();
    }
    // gpu-c: the kubelet's figures say GPU 1 is handed out next (1 replica out vs 3), and
    // GPU 1 is the tight one, though GPU 0 has plenty.
    server
        .add_node(json!({"metadata": {"name": "gpu-c", "annotations": written(
            vec![fig(0, 20480, 2048, 3, 0), fig(1, 6144, 10240, 1, 12288)],
            Some(Some("GPU-c-1".into())), now)}}))
        .unwrap();
    server
        .add_node(
            json!({"metadata": {"name": "gpu-stale", "annotations": written(
            vec![fig(0, 256, 22000, 4, 0)], Some(None), now - Duration::from_secs(600))}}),
        )
        .unwrap();
    server
        .add_node(json!({"metadata": {"name": "cpu-1"}}))
        .unwrap();

    // Real agents: gpu-a has 18 GiB in use on GPU 1, gpu-b is nearly idle.
    let mut agents = Vec::new();
    for (node, scenario) in [
        ("gpu-a", two_a10g(4096, 18000)),
        ("gpu-b", two_a10g(1000, 1000)),
    ] {
        let path = dir.path().join(format!("{node}.yaml"));
        std::fs::write(&path, scenario).unwrap();
        agents.push(Agent::start_with_env(
            &[
                "--scenario",
                path.to_str().unwrap(),
                "--node-name",
                node,
                "--poll-interval",
                "250ms",
                "--annotation-min-interval",
                "200ms",
                "--annotation-heartbeat",
                "2s",
                "--pod-resources",
                "off",
            ],
            &[("KUBECONFIG", kubeconfig.as_os_str())],
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while ["gpu-a", "gpu-b"].iter().any(|n| {
        server.node(n).unwrap()["metadata"]["annotations"]
            .get("gpu-warden.io/vram")
            .is_none()
    }) {
        assert!(
            Instant::now() < deadline,
            "the agents did not annotate their nodes"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let policy = dir.path().join("extender.yaml");
    std::fs::write(
        &policy,
        // Every promised MiB counted: the reasons below name the committed memory in full.
        "marginMiB: 512\nstaleAfter: 120s\nledgerTtl: 60s\npromisedPercent: 100\n",
    )
    .unwrap();
    let ext = Agent::start_with_env(
        &[
            "extender",
            "--config",
            policy.to_str().unwrap(),
            "--max-body-bytes",
            "65536",
        ],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    let port = ext.port;
    let all = ["gpu-a", "gpu-b", "gpu-c", "gpu-stale", "cpu-1"];

    // Upstream's own fixture: no GPU asked for, so every node (the full-object form) passes.
    let r = post(port, "/filter", UPSTREAM_ARGS);
    assert_eq!(r.status, 200, "{}", r.body);
    let j = json_of(&r);
    assert_eq!(j["NodeNames"], json!(["node1"]));
    assert_eq!(j["Error"], "");

    // An 8 GiB job.
    let t0 = Instant::now();
    let r = post(port, "/filter", &args(ci_pod("job-1", Some(8192)), &all));
    let took = t0.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    let j = json_of(&r);
    assert!(took < Duration::from_millis(500), "answered in {took:?}");
    // gpu-b fits; gpu-stale (fail-open) and cpu-1 (no annotations, fail-open) pass unchecked.
    assert_eq!(
        j["NodeNames"],
        json!(["gpu-b", "gpu-stale", "cpu-1"]),
        "{j}"
    );
    let failed = &j["FailedAndUnresolvableNodes"];
    let a = failed["gpu-a"].as_str().unwrap();
    assert!(
        a.starts_with(
            "GPU 1 (the fullest; which GPU the pod gets is not known) has too little VRAM: 4"
        ),
        "{a}"
    );
    assert!(
        a.contains("has too little VRAM")
            && a.contains("the pod needs 8 GiB plus a 0.5 GiB margin ("),
        "{a}"
    );
    let c = failed["gpu-c"].as_str().unwrap();
    assert_eq!(c, "GPU 1 (the one the device plugin hands out next) has too little VRAM: 6 GiB free, 2 GiB committed; the pod needs 8 GiB plus a 0.5 GiB margin (4608 MiB short)");
    assert_eq!(j["FailedNodes"], json!({}));

    // Prioritize: only gpu-b has a GPU judged with room.
    let r = post(
        port,
        "/prioritize",
        &args(ci_pod("job-1", Some(8192)), &all),
    );
    assert_eq!(r.status, 200);
    let scores: Vec<(String, i64)> = json_of(&r)
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["Host"].as_str().unwrap().to_string(),
                h["Score"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(scores.len(), all.len());
    for (host, score) in &scores {
        assert!((0..=10).contains(score));
        assert_eq!(*score > 0, host == "gpu-b", "{scores:?}");
    }

    // The ledger: a 16 GiB job this scheduler bound to gpu-b, which the node has not shown.
    let mut bound = ci_pod("job-big", Some(16384));
    bound["spec"]["nodeName"] = json!("gpu-b");
    bound["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True",
        "lastTransitionTime": humantime::format_rfc3339_seconds(SystemTime::now()).to_string()}]);
    server.add_pod(bound).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(port, "gpu_warden_extender_reservations ") != Some(1.0) {
        assert!(Instant::now() < deadline, "no reservation");
        std::thread::sleep(Duration::from_millis(50));
    }
    let j = json_of(&post(
        port,
        "/filter",
        &args(ci_pod("job-2", Some(8192)), &["gpu-b"]),
    ));
    assert_eq!(j["NodeNames"], json!([]), "{j}");
    let b = j["FailedAndUnresolvableNodes"]["gpu-b"].as_str().unwrap();
    assert!(b.contains("16 GiB committed"), "{b}");
    // The pod is deleted: its reservation ends and gpu-b takes the job again.
    server.delete_pod("gitlab-runner", "job-big");
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(port, "gpu_warden_extender_reservations ") != Some(0.0) {
        assert!(Instant::now() < deadline, "reservation not released");
        std::thread::sleep(Duration::from_millis(50));
    }
    let j = json_of(&post(
        port,
        "/filter",
        &args(ci_pod("job-2", Some(8192)), &["gpu-b"]),
    ));
    assert_eq!(j["NodeNames"], json!(["gpu-b"]));

    // Bad input: clear 4xx answers, never a crash.
    let r = post(port, "/filter", "{not json");
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("not kube-scheduler ExtenderArgs JSON"),
        "{}",
        r.body
    );
    let r = post(port, "/filter", r#"{"NodeNames":["gpu-a"]}"#);
    assert_eq!((r.status, r.body.trim()), (400, "ExtenderArgs has no Pod"));
    let r = post(port, "/filter", r#"{"Pod":{"metadata":{"name":"x"}}}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    let r = post(port, "/filter", &"x".repeat(70_000));
    assert_eq!(r.status, 413, "{}", r.body);
    // Declared length small, body larger than the limit streamed chunked.
    let chunk = "a".repeat(40_000);
    let raw = format!("POST /filter HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n", chunk.len(), chunk.len());
    let r = raw_request(port, raw.as_bytes()).unwrap();
    assert_eq!(r.status, 413, "{}", r.body);
    let r = post(
        port,
        "/filter",
        &args(
            ci_pod("job-3", None).tap_ann("gpu-warden.io/vram-request-mib", "8Gi"),
            &["gpu-b"],
        ),
    );
    let j = json_of(&r);
    assert_eq!(j["NodeNames"], json!([]));
    assert!(j["FailedAndUnresolvableNodes"]["gpu-b"]
        .as_str()
        .unwrap()
        .contains("is not a whole number of MiB"));
    let r = raw_request(
        port,
        b"GET /filter HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(get(port, "/healthz").unwrap().status, 200);

    // The API server goes away: the extender answers from its cache, as fast.
    server.set_down(true);
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let r = post(port, "/filter", &args(ci_pod("job-4", Some(8192)), &all));
    assert!(t0.elapsed() < Duration::from_millis(500));
    assert_eq!(r.status, 200);
    assert_eq!(
        json_of(&r)["NodeNames"],
        json!(["gpu-b", "gpu-stale", "cpu-1"])
    );
    assert_eq!(
        get(port, "/readyz").unwrap().status,
        200,
        "a synced cache stays usable"
    );
    server.set_down(false);

    let m = get(port, "/metrics").unwrap().body;
    for family in [
        "gpu_warden_extender_requests_total{code=\"200\",verb=\"filter\"}",
        "gpu_warden_extender_requests_total{code=\"413\",verb=\"filter\"}",
        "gpu_warden_extender_request_duration_seconds_bucket{verb=\"filter\"",
        "gpu_warden_extender_verdicts_total{reason=\"no_room\",result=\"fail\",verb=\"filter\"}",
        "gpu_warden_extender_verdicts_total{reason=\"stale\",result=\"pass\",verb=\"filter\"}",
    ] {
        assert!(m.contains(family), "{family} missing:\n{m}");
    }
    let (status, _, stderr) = ext.terminate();
    assert!(status.success(), "{stderr}");
    // One summary line per filter call at info, counting the stale pass by its reason.
    let filter_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("filter:") && l.contains("job-1"))
        .collect();
    assert_eq!(filter_lines.len(), 1, "one line per call:\n{stderr}");
    assert!(filter_lines[0].contains("stale=1"), "{}", filter_lines[0]);
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("verb=") && l.contains("node=")),
        "no per-node verdict lines at info:\n{stderr}"
    );
    drop(agents);
}

/// Before its caches sync the extender answers a GPU pod with a whole-call `Error`, which
/// kube-scheduler's HTTPExtender.Filter turns into an error; with `ignorable: false`
/// findNodesThatPassExtenders returns it and the pod is retried with backoff
/// (kubernetes/kubernetes pkg/scheduler/extender.go, schedule_one.go). Never a blind pass.
#[test]
fn not_synced_answers_an_error_the_scheduler_retries_never_a_pass() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    server
        .add_node(json!({"metadata": {"name": "gpu-a", "annotations": written(
            vec![fig(0, 20480, 2048, 0, 0)], Some(Some("GPU-c-0".into())), SystemTime::now())}}))
        .unwrap();
    server.set_down(true);
    let probe = free_port();
    let probe_listen = format!("127.0.0.1:{probe}");
    let ext = Agent::spawn(
        &["extender", "--probe-listen", &probe_listen],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    let port = ext.port;
    let deadline = Instant::now() + Duration::from_secs(15);
    while get(port, "/healthz").map(|r| r.status).unwrap_or(0) != 200 {
        assert!(Instant::now() < deadline, "the extender did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(port, "/readyz").unwrap().status, 503);
    let r = post(
        port,
        "/filter",
        &args(ci_pod("job-1", Some(1024)), &["gpu-a"]),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let j = json_of(&r);
    assert!(j["Error"].as_str().unwrap().contains("not ready"), "{j}");
    assert_eq!(j["NodeNames"], Value::Null, "nothing passed: {j}");
    // A pod asking for no GPU is none of the extender's business: it passes.
    let r = post(port, "/filter", UPSTREAM_ARGS);
    assert_eq!(json_of(&r)["Error"], "");
    // The probe listener serves the GETs, never the verbs.
    assert_eq!(get(probe, "/healthz").unwrap().status, 200);
    assert_eq!(
        post(
            probe,
            "/filter",
            &args(ci_pod("job-1", Some(1024)), &["gpu-a"])
        )
        .status,
        404
    );
    server.set_down(false);
    let deadline = Instant::now() + Duration::from_secs(15);
    while get(probe, "/readyz").map(|r| r.status).unwrap_or(0) != 200 {
        assert!(
            Instant::now() < deadline,
            "not ready after the API came back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let j = json_of(&post(
        port,
        "/filter",
        &args(ci_pod("job-1", Some(1024)), &["gpu-a"]),
    ));
    assert_eq!(
        (j["Error"].as_str(), &j["NodeNames"]),
        (Some(""), &json!(["gpu-a"])),
        "{j}"
    );
    let (status, _, stderr) = ext.terminate();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("not ready, the scheduler retries"),
        "{stderr}"
    );
}

#[test]
fn the_verbs_never_listen_beyond_loopback() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-warden"))
        .args(["extender", "--listen", "0.0.0.0:0"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a loopback address"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

/// The extender takes the agent's certificate pair (src/config/tls.rs) under its own
/// environment variables, with the same both-or-neither rule and message.
#[test]
fn a_certificate_without_its_key_is_refused_as_the_agent_refuses_it() {
    for flag in ["--web-tls-cert", "--web-tls-key"] {
        let (code, err) = run_to_exit(&["extender", flag, "tls.pem"]);
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(
            err.trim(),
            "gpu-warden extender: error: --web-tls-cert and --web-tls-key must be given together"
        );
    }
    // The key from the extender's variable completes the pair: the files are read.
    let (code, err) = run_to_exit_with_env(
        &["extender", "--web-tls-cert", "/nonexistent/tls.crt"],
        &[("GPU_WARDEN_EXTENDER_WEB_TLS_KEY", "/nonexistent/tls.key")],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--web-tls-cert /nonexistent/tls.crt"), "{err}");
}

/// Sets one annotation on a pod fixture.
trait TapAnn {
    fn tap_ann(self, key: &str, value: &str) -> Self;
}

impl TapAnn for Value {
    fn tap_ann(mut self, key: &str, value: &str) -> Self {
        self["metadata"]["annotations"][key] = json!(value);
        self
    }
}

/// A CA and a `localhost` certificate it signed, written into `dir`: (cert path, key path,
/// the CA's DER for the client's root store).
fn ca_signed_cert(
    dir: &std::path::Path,
) -> (
    String,
    String,
    tokio_rustls::rustls::pki_types::CertificateDer<'static>,
) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gpu-warden test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let mut leaf_params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gpu-warden-extender");
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
    (
        cert.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
        ca.der().clone(),
    )
}

/// One HTTP/1.1 request over TLS, the server verified against `ca` for `localhost`.
fn tls_request(
    ca: &tokio_rustls::rustls::pki_types::CertificateDer<'static>,
    port: u16,
    raw: &str,
) -> std::io::Result<Reply> {
    tls_request_as(ca, None, port, raw)
}

/// A client certificate chain and its key, as kube-scheduler's extender `tlsConfig`
/// (`certFile`, `keyFile`) presents them.
type ClientCert = (
    Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>,
    tokio_rustls::rustls::pki_types::PrivateKeyDer<'static>,
);

fn tls_request_as(
    ca: &tokio_rustls::rustls::pki_types::CertificateDer<'static>,
    client: Option<ClientCert>,
    port: u16,
    raw: &str,
) -> std::io::Result<Reply> {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).map_err(std::io::Error::other)?;
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_root_certificates(roots);
    let cfg = match client {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(std::io::Error::other)?,
        None => builder.with_no_client_auth(),
    };
    tls_exchange(&std::sync::Arc::new(cfg), port, raw)
}

fn post_raw(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn extender_over_https_verified_against_the_ca() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let now = SystemTime::now();
    server
        .add_node(
            json!({"metadata": {"name": "gpu-roomy", "annotations": written(
            vec![fig(0, 20480, 2048, 1, 0)], Some(Some("GPU-c-0".into())), now)}}),
        )
        .unwrap();
    server
        .add_node(
            json!({"metadata": {"name": "gpu-full", "annotations": written(
            vec![fig(0, 2048, 20480, 1, 0)], Some(Some("GPU-c-0".into())), now)}}),
        )
        .unwrap();
    let (cert, key, ca) = ca_signed_cert(dir.path());

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-warden"))
        .args(["extender", "--listen", &listen])
        .args(["--web-tls-cert", &cert, "--web-tls-key", &key])
        .current_dir(root())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start gpu-warden extender");
    let get_raw =
        |path: &str| format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let deadline = Instant::now() + Duration::from_secs(15);
    while tls_request(&ca, port, &get_raw("/readyz"))
        .map(|r| r.status)
        .ok()
        != Some(200)
    {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the extender did not become ready over HTTPS");
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // The scheduler's filter call with enableHTTPS and the CA in tlsConfig.
    let body = args(ci_pod("job-tls", Some(8192)), &["gpu-roomy", "gpu-full"]);
    let r = tls_request(&ca, port, &post_raw("/filter", &body)).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let j = json_of(&r);
    assert_eq!(j["NodeNames"], json!(["gpu-roomy"]), "{j}");
    assert!(j["FailedAndUnresolvableNodes"]["gpu-full"]
        .as_str()
        .unwrap()
        .contains("the pod needs 8 GiB"));
    let r = tls_request(&ca, port, &post_raw("/prioritize", &body)).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);

    // Plain HTTP to the HTTPS port gets no HTTP reply; a client trusting another CA is
    // refused at the handshake; the server keeps serving.
    assert!(raw_request(port, post_raw("/filter", &body).as_bytes()).is_err());
    let other = ca_signed_cert(&dir.path().join("other").tap_mkdir()).2;
    assert!(tls_request(&other, port, &get_raw("/healthz")).is_err());
    let r = tls_request(&ca, port, &get_raw("/healthz")).unwrap();
    assert_eq!(r.status, 200);
    let _ = child.kill();
    let _ = child.wait();
}

/// A client CA (PEM) and a client certificate it signs for kube-scheduler.
fn client_ca_and_cert() -> (String, ClientCert) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec!["kube-scheduler".to_string()]).unwrap();
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
    let der = tokio_rustls::rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
    (ca_cert.pem(), (vec![cert.der().clone()], der.into()))
}

/// `gpu-warden extender` with exporter-toolkit's web config file from its environment
/// variable: HTTPS, and only a client certificate signed by the configured CA (as
/// kube-scheduler's extender `tlsConfig` presents one) gets to `/filter`.
#[test]
fn the_extender_verifies_the_schedulers_client_certificate_from_its_web_config_file() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    server
        .add_node(
            json!({"metadata": {"name": "gpu-roomy", "annotations": written(
            vec![fig(0, 20480, 2048, 1, 0)], Some(Some("GPU-c-0".into())), SystemTime::now())}}),
        )
        .unwrap();
    let (_cert, _key, ca) = ca_signed_cert(dir.path());
    let (client_ca, scheduler) = client_ca_and_cert();
    std::fs::write(dir.path().join("client-ca.crt"), client_ca).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.crt\n",
    )
    .unwrap();
    let port = free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-warden"))
        .args(["extender", "--listen", &format!("127.0.0.1:{port}")])
        .current_dir(root())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", &kubeconfig)
        .env("GPU_WARDEN_EXTENDER_WEB_CONFIG_FILE", &web)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start gpu-warden extender");
    let get = "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let as_scheduler = || (scheduler.0.clone(), scheduler.1.clone_key());
    let deadline = Instant::now() + Duration::from_secs(15);
    while tls_request_as(&ca, Some(as_scheduler()), port, get)
        .map(|r| r.status)
        .ok()
        != Some(200)
    {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the extender did not become ready over HTTPS with a client certificate");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = args(ci_pod("job-mtls", Some(8192)), &["gpu-roomy"]);
    let r = tls_request_as(&ca, Some(as_scheduler()), port, &post_raw("/filter", &body)).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json_of(&r)["NodeNames"], json!(["gpu-roomy"]));
    // No client certificate, or one another CA signed: refused at the handshake.
    assert!(tls_request(&ca, port, &post_raw("/filter", &body)).is_err());
    let (_, stranger) = client_ca_and_cert();
    assert!(tls_request_as(&ca, Some(stranger), port, get).is_err());
    let _ = child.kill();
    let _ = child.wait();
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}

impl TapMkdir for std::path::PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

const PR_NODE: &str = "gpu-pr-1";
const PR_G0: &str = "GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b";
const PR_G1: &str = "GPU-66666666-7777-8888-9999-000000000000";

#[test]
fn extender_judges_the_next_gpu_and_committed_memory_from_kubelet_fed_agents() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Two A10Gs and the pods of `kubelet::shared_node`: GPU 0 holds three replicas, GPU 1 two.
    let text = shared_node_scenario(PR_G0, PR_G1);
    let scenario = write_scenario(dir.path(), "two-gpus", &text);
    let node = json!({"metadata": {"name": PR_NODE}});
    let (server, kubeconfig) = double_with_pods(&rt, dir.path(), node, &text, "two-gpus");
    // Finished, but still listed by the kubelet with a replica of GPU 1: the agent must not
    // count it, or the two GPUs would tie and the device plugin would hand out GPU 0.
    server.add_pod(finished_pod(PR_NODE)).unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = crate::kubelet::FakeKubelet::default();
    crate::kubelet::shared_node(&kubelet, PR_G0, PR_G1);
    let _serving = rt.block_on(async { crate::kubelet::serve(&kubelet, &socket) });
    let _agent = Agent::start_with_env(
        &[
            "--scenario",
            &scenario,
            "--node-name",
            PR_NODE,
            "--guard-mode",
            "off",
            "--poll-interval",
            "100ms",
            "--pod-resources-socket",
            socket.to_str().unwrap(),
            "--pod-resources-interval",
            "100ms",
            "--annotation-min-interval",
            "100ms",
            "--annotation-heartbeat",
            "2s",
        ],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );

    // The agent's vram document with the kubelet's figures (replicas of both GPUs, the next
    // GPU handed out: GPU 1, with 2 replicas out against GPU 0's 3).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = None;
    let doc = loop {
        let doc: Option<Value> = server
            .node(PR_NODE)
            .and_then(|n| {
                n["metadata"]["annotations"]["gpu-warden.io/vram"]
                    .as_str()
                    .map(String::from)
            })
            .and_then(|s| serde_json::from_str(&s).ok());
        if let Some(d) = doc.filter(|d| {
            d["nextGpuUuid"] == json!(PR_G1)
                && d["gpus"][1]["replicasAllocated"] == json!(2)
                && d["gpus"][0]["replicasAllocated"] == json!(3)
        }) {
            break d;
        }
        assert!(
            Instant::now() < deadline,
            "no kubelet figures in the annotation: {last:?}"
        );
        last = server
            .node(PR_NODE)
            .map(|n| n["metadata"]["annotations"].clone());
        std::thread::sleep(Duration::from_millis(50));
    };
    let g1 = &doc["gpus"][1];
    let free = g1["freeMiB"].as_u64().unwrap();
    let used = g1["usedMiB"].as_u64().unwrap();
    let declared = g1["declaredMiB"].as_u64().unwrap();
    assert_eq!(declared, 8192, "{doc}");
    let committed = declared - used;
    assert!(
        committed >= 1024,
        "train-0 has declared more than it uses: {doc}"
    );
    let free0 = doc["gpus"][0]["freeMiB"].as_u64().unwrap();
    assert!(free0 > free, "GPU 0 is the roomier one: {doc}");

    // Every promised MiB counted (`promisedPercent: 100`): the test is the committed memory's
    // arithmetic; the shipped share is tested in extender::judge.
    let strict = strict_policy(dir.path());
    let ext = Agent::start_with_env(
        &["extender", "--config", strict.to_str().unwrap()],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    let margin = 512;
    // Fits GPU 1's free memory, not once its committed memory is counted.
    let tight = free - margin - committed / 2;
    let j = json_of(&post(
        ext.port,
        "/filter",
        &args(ci_pod("job-tight", Some(tight)), &[PR_NODE]),
    ));
    assert_eq!(j["NodeNames"], json!([]), "{j}");
    let why = j["FailedAndUnresolvableNodes"][PR_NODE].as_str().unwrap();
    use gpu_warden::extender::judge::gib;
    assert_eq!(
        why,
        format!(
            "GPU 1 (the one the device plugin hands out next) has too little VRAM: {} free, {} committed; the pod needs {} plus a 0.5 GiB margin ({} MiB short)",
            gib(free as i64),
            gib(committed as i64),
            gib(tight as i64),
            tight + margin + committed - free
        )
    );
    // Exactly what is left after the committed memory and the margin: passes.
    let fits = free - margin - committed;
    let j = json_of(&post(
        ext.port,
        "/filter",
        &args(ci_pod("job-fits", Some(fits)), &[PR_NODE]),
    ));
    assert_eq!(j["NodeNames"], json!([PR_NODE]), "{j}");
    // GPU 0 has the free memory for this one; the device plugin hands out GPU 1, and that is
    // the GPU judged.
    let roomy_elsewhere = free + 1024;
    assert!(roomy_elsewhere + margin <= free0, "{doc}");
    let j = json_of(&post(
        ext.port,
        "/filter",
        &args(ci_pod("job-big", Some(roomy_elsewhere)), &[PR_NODE]),
    ));
    let why = j["FailedAndUnresolvableNodes"][PR_NODE].as_str().unwrap();
    assert!(
        why.starts_with("GPU 1 (the one the device plugin hands out next)"),
        "{why}"
    );
    assert!(
        metric(ext.port, "gpu_warden_extender_verdicts_total{reason=\"no_room\",result=\"fail\",verb=\"filter\"}")
            == Some(2.0)
    );
}

/// A pod of this scheduler's profile, bound to `node` at `at` (the PodScheduled condition's
/// time, which tells the extender whether its node may not show it yet).
fn bound_pod(name: &str, node: &str, at: SystemTime) -> Value {
    let mut p = ci_pod(name, None);
    p["spec"]["nodeName"] = json!(node);
    p["status"] = json!({"phase": "Running", "conditions": [{"type": "PodScheduled",
        "status": "True", "lastTransitionTime": humantime::format_rfc3339_seconds(at).to_string()}]});
    p
}

/// The extender's verdict for a 4 GiB job on `nodes`: `None` while it says it is not ready
/// (or does not listen yet), else the nodes passed and the reasons of those refused.
/// A policy file counting all of the memory promised on a GPU (`promisedPercent: 100`).
fn strict_policy(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("strict-extender.yaml");
    std::fs::write(&p, "promisedPercent: 100\n").unwrap();
    p
}

fn verdict_for_4g(port: u16, nodes: &[&str]) -> Option<(Value, Value)> {
    let raw = format!(
        "POST /filter HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{body}",
        body = args(ci_pod("job-next", Some(4096)), nodes),
        len = args(ci_pod("job-next", Some(4096)), nodes).len()
    );
    let r = raw_request(port, raw.as_bytes()).ok()?;
    assert_eq!(r.status, 200, "{}", r.body);
    let j = json_of(&r);
    let error = j["Error"].as_str().unwrap_or_default();
    if !error.is_empty() {
        assert!(error.contains("not ready"), "{j}");
        return None;
    }
    Some((
        j["NodeNames"].clone(),
        j["FailedAndUnresolvableNodes"].clone(),
    ))
}

/// A restarted extender has no ledger: it must count the needs of the pods this profile bound
/// before it answers — the need beyond its declaration of a pod bound long ago (its node shows
/// its replica, not its `unknownNeed`), and the whole need of one bound just before the
/// restart — or say "not ready" until it has. Answering from the Nodes' figures alone would
/// pass a 4 GiB job onto GPUs whose room the two pods are still to allocate.
#[test]
fn a_restarted_extender_counts_the_bound_pods_needs_before_it_answers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let env = [("KUBECONFIG", kubeconfig.as_os_str())];
    let now = SystemTime::now();
    // gpu-old: an hour ago the profile bound a job that declares nothing; it uses 2 GiB so
    // far, and the agent shows its replica (declaredMiB counts declarations only: 0).
    server
        .add_node(
            json!({"metadata": {"name": "gpu-old", "annotations": written(
            vec![fig(0, 20480, 2048, 1, 0)], Some(Some("GPU-c-0".into())), now)}}),
        )
        .unwrap();
    server
        .add_pod(bound_pod(
            "job-old",
            "gpu-old",
            now - Duration::from_secs(3600),
        ))
        .unwrap();
    // gpu-new: idle.
    server
        .add_node(
            json!({"metadata": {"name": "gpu-new", "annotations": written(
            vec![fig(0, 22528, 0, 0, 0)], Some(Some("GPU-c-0".into())), now)}}),
        )
        .unwrap();
    let nodes = ["gpu-old", "gpu-new"];
    // Every promised MiB counted, so the committed figure below is the need in full.
    let strict = strict_policy(dir.path());
    let ext = Agent::start_with_env(&["extender", "--config", strict.to_str().unwrap()], &env);
    let (passed, refused) = verdict_for_4g(ext.port, &nodes).expect("ready");
    assert_eq!(passed, json!(["gpu-new"]), "{refused}");
    let why = refused["gpu-old"].as_str().unwrap_or_default();
    assert!(why.contains("19.5 GiB committed"), "{refused}");

    // The scheduler binds a job that declares nothing to gpu-new; once the extender's watch
    // has it, gpu-new is refused too.
    server
        .add_pod(bound_pod("job-new", "gpu-new", SystemTime::now()))
        .unwrap();
    wait_for(
        "the extender counts the pod bound to gpu-new",
        Duration::from_secs(10),
        || {
            let (passed, _) = verdict_for_4g(ext.port, &nodes)?;
            (passed == json!([])).then_some(())
        },
    );
    let (status, _, stderr) = ext.terminate();
    assert!(status.success(), "{stderr}");

    // Restarted: every answer is "not ready" or a refusal of both, never a pass.
    let ext = Agent::spawn(&["extender", "--config", strict.to_str().unwrap()], &env);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut not_ready = 0;
    let (passed, refused) = loop {
        assert!(
            Instant::now() < deadline,
            "the restarted extender never answered"
        );
        match verdict_for_4g(ext.port, &nodes) {
            Some(v) => break v,
            None => {
                not_ready += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    assert_eq!(
        passed,
        json!([]),
        "after the restart: {refused} ({not_ready} not ready)"
    );
    for n in nodes {
        let why = refused[n].as_str().unwrap_or_default();
        assert!(why.contains("committed"), "{n}: {refused}");
    }
}

/// A job that finishes on a node before the agent's next patch must not hide the pod bound
/// there meanwhile: the next figures count the same replicas out as before (one gone, one
/// come), and a ledger waiting for the total to grow would hold the new pod's replica and
/// whole need on top of them until `ledgerTtl`. The pod watch's "finished" lowers the
/// pending pod's baseline (`Ledger::depart`), so the next figures show it.
#[test]
fn a_job_finishing_before_the_next_patch_does_not_hide_the_pod_that_arrived() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let env = [("KUBECONFIG", kubeconfig.as_os_str())];
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    // Three jobs bound an hour ago, 4 GiB declared and used each: 3 of the GPU's 4
    // replicas out.
    server
        .add_node(json!({"metadata": {"name": "gpu-a", "annotations": written(
            vec![fig(0, 10240, 12288, 3, 12288)], Some(Some("GPU-c-0".into())),
            SystemTime::now())}}))
        .unwrap();
    for i in 0..3 {
        let mut p = bound_pod(&format!("job-old-{i}"), "gpu-a", hour_ago);
        p["metadata"]["annotations"]["gpu-warden.io/vram-request-mib"] = json!("4096");
        server.add_pod(p).unwrap();
    }
    let strict = strict_policy(dir.path());
    let ext = Agent::start_with_env(&["extender", "--config", strict.to_str().unwrap()], &env);
    let nodes = ["gpu-a"];
    let (passed, _) = verdict_for_4g(ext.port, &nodes).expect("ready");
    assert_eq!(passed, json!(["gpu-a"]));

    // The scheduler binds job-new (4 GiB declared): the last replica is taken.
    let mut p = bound_pod("job-new", "gpu-a", SystemTime::now());
    p["metadata"]["annotations"]["gpu-warden.io/vram-request-mib"] = json!("4096");
    server.add_pod(p).unwrap();
    wait_for(
        "the extender counts job-new's replica",
        Duration::from_secs(10),
        || {
            let (passed, refused) = verdict_for_4g(ext.port, &nodes)?;
            (passed == json!([])).then_some(refused)
        },
    );
    // job-old-0 finishes; the agent's next figures (after the binding) show job-new
    // allocated in its place: still 3 out, 12 GiB declared, 9 GiB used.
    std::thread::sleep(Duration::from_millis(1100));
    server.update_pod("gitlab-runner", "job-old-0", |p| {
        p["status"]["phase"] = json!("Succeeded");
    });
    server.update_node("gpu-a", |n| {
        n["metadata"]["annotations"] = written(
            vec![fig(0, 13312, 9216, 3, 12288)],
            Some(Some("GPU-c-0".into())),
            SystemTime::now(),
        );
    });
    // 13312 free - (12288 declared - 9216 used) - 512 margin = 9728 MiB of room, a
    // replica left: the 4 GiB job fits. A ledger still holding job-new pending would see
    // no replica left and 4 GiB more committed.
    wait_for(
        "the extender sees job-new in the node's figures",
        Duration::from_secs(10),
        || {
            let (passed, _) = verdict_for_4g(ext.port, &nodes)?;
            (passed == json!(["gpu-a"])).then_some(())
        },
    );
    let (status, _, stderr) = ext.terminate();
    assert!(status.success(), "{stderr}");
}
