//! The `apiserver-double` binary, driven through a kubeconfig as gpu-warden would find it.
//! (This is the only test binary that sets `KUBECONFIG`.)

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use apiserver_double::ApiServer;
use common::eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Status;
use kube::{Client, Config, ResourceExt};

const UID: &str = "3f6c1a2b-0000-4111-8222-123456789abc";

const FIXTURES: &str = r#"
nodes:
  - apiVersion: v1
    kind: Node
    metadata:
      name: gpu-node-1
      labels: {nvidia.com/gpu.present: "true"}
pods:
  - apiVersion: v1
    kind: Pod
    metadata:
      name: job-1
      namespace: ci
      uid: 3f6c1a2b-0000-4111-8222-123456789abc
      labels: {workload-type: gpu-ci}
    spec:
      nodeName: gpu-node-1
      terminationGracePeriodSeconds: 30
      containers: [{name: main, image: "cuda:12"}]
  - apiVersion: v1
    kind: Pod
    metadata: {name: other, namespace: ci}
    spec: {nodeName: gpu-node-2, containers: [{name: main, image: busybox}]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_fixtures_plays_the_kubelet_on_real_processes_logs_and_exits_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = dir.path().join("fixtures.yaml");
    std::fs::write(&fixtures, FIXTURES).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let log = dir.path().join("requests.jsonl");
    let cgroot = dir.path().join("cgroup");
    let podcg = cgroot.join(format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        UID.replace('-', "_")
    ));
    let ctr = podcg.join("cri-containerd-0123.scope");
    std::fs::create_dir_all(&ctr).unwrap();
    std::fs::write(podcg.join("cgroup.kill"), "").unwrap();
    // The container's one process (its PID 1): a real process that dies on SIGTERM.
    let mut job = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(ctr.join("cgroup.procs"), format!("{}\n", job.id())).unwrap();
    let kubelet_log = dir.path().join("kubelet.jsonl");

    let mut child = Command::new(env!("CARGO_BIN_EXE_apiserver-double"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--kubelet-watch-latency",
            "20ms",
            "--bookmark-interval",
            "200ms",
        ])
        .arg("--kubelet-log")
        .arg(&kubelet_log)
        .arg("--fixtures")
        .arg(&fixtures)
        .arg("--kill-cgroups-under")
        .arg(&cgroot)
        .arg("--request-log")
        .arg(&log)
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let url = url.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    // KUBECONFIG=FILE makes Client::try_default() talk plain HTTP to the double
    std::env::set_var("KUBECONFIG", &kubeconfig);
    let client = Client::try_default().await.unwrap();
    assert_eq!(client.default_namespace(), "default");
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );

    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = pods
        .list(&ListParams::default().fields("spec.nodeName=gpu-node-1"))
        .await
        .unwrap();
    assert_eq!(
        on_node
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>(),
        ["job-1"]
    );
    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(
        nodes.get("gpu-node-1").await.unwrap().labels()["nvidia.com/gpu.present"],
        "true"
    );

    let ci: Api<Pod> = Api::namespaced(client.clone(), "ci");
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some("job-1".into()),
            namespace: Some("ci".into()),
            ..Default::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(5),
            ..Default::default()
        }),
    };
    let st: Status = ci
        .create_subresource("eviction", "job-1", &PostParams::default(), &eviction)
        .await
        .unwrap();
    assert_eq!(st.code, 201);
    // The faithful kubelet: SIGTERM to the container's PID 1, which dies of it...
    let t0 = Instant::now();
    let reaped = tokio::task::spawn_blocking(move || job.wait().unwrap())
        .await
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(reaped.signal(), Some(15), "{reaped:?}");
    // ...so the pod is deleted without waiting out its 5 s grace, and nothing is SIGKILLed.
    assert!(
        eventually(Duration::from_secs(3), || async {
            ci.get_opt("job-1").await.is_ok_and(|p| p.is_none())
        })
        .await
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(
        std::fs::read_to_string(podcg.join("cgroup.kill")).unwrap(),
        ""
    );
    let actions: Vec<serde_json::Value> = std::fs::read_to_string(&kubelet_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = actions
        .iter()
        .filter_map(|a| a["action"].as_str())
        .collect();
    assert_eq!(
        names,
        ["sigterm", "exited_on_sigterm", "deleted"],
        "{actions:#?}"
    );
    assert!(
        actions[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("cri-containerd-0123.scope: SIGTERM to pid")),
        "{actions:#?}"
    );
    assert!(actions
        .iter()
        .all(|a| a["pod"] == "job-1" && a["timeUnix"].is_f64()));

    // SIGTERM: clean exit
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let t0 = Instant::now();
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");

    // --request-log: one JSON object per request
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 5, "{lines:#?}");
    assert!(lines.iter().any(|l| l["method"] == "POST"
        && l["path"] == "/api/v1/namespaces/ci/pods/job-1/eviction"
        && l["status"] == 201
        && l["body"]["deleteOptions"]["gracePeriodSeconds"] == 5));
    assert!(lines
        .iter()
        .any(|l| l["path"] == "/version" && l["status"] == 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_kubeconfig_is_accepted_by_kube() {
    let server = ApiServer::start().await.unwrap();
    let kc = Kubeconfig::from_yaml(&server.kubeconfig_yaml()).unwrap();
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(cfg.cluster_url.to_string(), format!("{}/", server.url()));
    let client = Client::try_from(cfg).unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    assert!(pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    assert_eq!(server.requests()[0].path, "/api/v1/namespaces/default/pods");
}

/// `--slow-pod-reads`: a pod's GET answers only after the delay (the guard's fresh read, as
/// issue 38's H200 runs slow it); the cluster-wide LIST the pod view makes is outside the
/// rule's path and still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_pod_reads_delay_the_namespaced_get_only() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = dir.path().join("fixtures.yaml");
    std::fs::write(&fixtures, FIXTURES).unwrap();
    let log = dir.path().join("requests.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_apiserver-double"))
        .args(["--listen", "127.0.0.1:0", "--slow-pod-reads", "600ms"])
        .arg("--fixtures")
        .arg(&fixtures)
        .arg("--request-log")
        .arg(&log)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let client = Client::try_from(Config::new(url.trim().parse().unwrap())).unwrap();
    let ci: Api<Pod> = Api::namespaced(client.clone(), "ci");
    let t0 = Instant::now();
    let pod = ci.get("job-1").await.unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(pod.name_any(), "job-1");
    let all: Api<Pod> = Api::all(client);
    let listed = all.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 2);
    child.kill().unwrap();
    child.wait().unwrap();
    let lines = std::fs::read_to_string(&log).unwrap();
    assert!(
        lines.contains("/api/v1/namespaces/ci/pods/job-1"),
        "{lines}"
    );
}
