//! The faithful kubelet behind an accepted eviction, through the real kube client: watch
//! latency, SIGTERM to PID 1 (ignored by a GitLab job's shell), SIGKILL after
//! `max(grace, 2 s)`, then DELETED — in real time and on a stepped (simulated) clock. The
//! timings follow kubelet's `killContainer` (`minimumGracePeriodInSeconds = 2`) and the API
//! server's `CheckGracefulDelete` and generic store (grace 0 deletes the object at once);
//! see `src/kubelet.rs` for the upstream code each rule follows.

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apiserver_double::{
    ApiServer, EndCause, KubeletOptions, Pid1Mode, PodRuntime, StepKind, SteppedClock,
};
use common::{eventually, no_retry_client, pod};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::core::Status;
use serde_json::json;

fn eviction(name: &str, grace: i64) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("ci".to_string()),
            ..Default::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(grace),
            ..Default::default()
        }),
    }
}

async fn evict(server: &ApiServer, name: &str, grace: i64) {
    let pods: Api<Pod> = Api::namespaced(no_retry_client(server), "ci");
    let st: Status = pods
        .create_subresource(
            "eviction",
            name,
            &PostParams::default(),
            &eviction(name, grace),
        )
        .await
        .unwrap();
    assert_eq!(st.code, 201);
}

/// A simulated clock in milliseconds.
fn sim_clock() -> (Arc<AtomicU64>, SteppedClock) {
    let ms = Arc::new(AtomicU64::new(10_000));
    let read = ms.clone();
    (
        ms,
        SteppedClock::new(move || Duration::from_millis(read.load(Ordering::SeqCst))),
    )
}

fn steps(actions: &[apiserver_double::KubeletAction]) -> Vec<(u64, StepKind)> {
    actions
        .iter()
        .map(|a| (a.at.as_millis() as u64, a.kind))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stepped_kubelet_acts_only_when_the_harness_lets_its_clock_run() {
    let (ms, clock) = sim_clock();
    let server = ApiServer::builder()
        .kubelet_stepped(clock)
        .start()
        .await
        .unwrap();
    server.add_pod(pod("ci", "job", "n1", json!({}))).unwrap();
    evict(&server, "job", 5).await;
    let p = server.pod("ci", "job").expect("terminating, not gone");
    assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 5);
    assert!(p["metadata"]["deletionTimestamp"].is_string());
    // Real time passes, simulated time does not: the double deletes nothing on its own.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(server.pod("ci", "job").is_some());
    assert!(server
        .kubelet_run_until(Duration::from_millis(10_049))
        .is_empty());
    assert_eq!(
        steps(&server.kubelet_run_until(Duration::from_millis(10_100))),
        vec![(10_050, StepKind::Sigterm)]
    );
    // The shell ignores SIGTERM: the pod runs on through its grace.
    ms.store(15_000, Ordering::SeqCst);
    assert!(server
        .kubelet_run_until(Duration::from_millis(15_000))
        .is_empty());
    assert!(server.pod("ci", "job").is_some());
    let done = server.kubelet_run_until(Duration::from_millis(15_100));
    assert_eq!(
        steps(&done),
        vec![
            (15_050, StepKind::Sigkill),
            (15_050, StepKind::ProcessesEnd(EndCause::Sigkill)),
            (15_050, StepKind::Delete)
        ]
    );
    assert!(done[1].ends_processes() && !done[0].ends_processes());
    assert!(server.pod("ci", "job").is_none());
    assert_eq!(server.kubelet_actions().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_zero_is_deleted_by_the_api_at_once_and_killed_after_2s() {
    let (_ms, clock) = sim_clock();
    let server = ApiServer::builder()
        .kubelet_stepped(clock)
        .start()
        .await
        .unwrap();
    server.add_pod(pod("ci", "job", "n1", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(no_retry_client(&server), "ci");
    let mut watch = pods
        .watch(
            &WatchParams::default(),
            &server.resource_version().to_string(),
        )
        .await
        .unwrap()
        .boxed();
    evict(&server, "job", 0).await;
    assert!(server.pod("ci", "job").is_none(), "the API deletes at once");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(5), watch.next()).await {
            Ok(Some(Ok(WatchEvent::Modified(p)))) => {
                assert_eq!(p.metadata.deletion_grace_period_seconds, Some(0));
                seen.push("MODIFIED");
            }
            Ok(Some(Ok(WatchEvent::Deleted(_)))) => seen.push("DELETED"),
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["MODIFIED", "DELETED"]);
    // …but the node's processes live on until the kubelet's floor of 2 s.
    assert_eq!(
        steps(&server.kubelet_run_until(Duration::from_secs(20))),
        vec![
            (10_050, StepKind::Sigterm),
            (12_050, StepKind::Sigkill),
            (12_050, StepKind::ProcessesEnd(EndCause::Sigkill))
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid1_that_exits_on_sigterm_ends_the_pod_when_the_kubelet_sees_it() {
    let (_ms, clock) = sim_clock();
    let server = ApiServer::builder()
        .kubelet(KubeletOptions {
            pid1: Pid1Mode::Exits,
            watch_latency: Duration::from_millis(120),
            ..KubeletOptions::default()
        })
        .kubelet_stepped(clock)
        .start()
        .await
        .unwrap();
    server.add_pod(pod("ci", "job", "n1", json!({}))).unwrap();
    evict(&server, "job", 30).await;
    assert_eq!(
        steps(&server.kubelet_run_until(Duration::from_secs(11))),
        vec![
            (10_120, StepKind::Sigterm),
            (10_120, StepKind::ProcessesEnd(EndCause::Pid1Exited)),
            (10_120, StepKind::Delete)
        ]
    );
    assert!(server.pod("ci", "job").is_none());
}

/// A node's processes as a test double: records signals; the pod's processes exit on
/// SIGTERM or not.
#[derive(Default)]
struct FakeNode {
    dies_on_term: bool,
    alive: AtomicBool,
    log: Mutex<Vec<(&'static str, Instant)>>,
}

/// The double's handle on a [`FakeNode`].
struct Runtime(Arc<FakeNode>);

impl PodRuntime for Runtime {
    fn sigterm_pid1(&self, _pod: &serde_json::Value) -> String {
        self.0.log.lock().unwrap().push(("term", Instant::now()));
        if self.0.dies_on_term {
            self.0.alive.store(false, Ordering::SeqCst);
        }
        "pid 1".into()
    }
    fn has_processes(&self, _pod: &serde_json::Value) -> bool {
        self.0.alive.load(Ordering::SeqCst)
    }
    fn kill_all(&self, _pod: &serde_json::Value) -> String {
        self.0.log.lock().unwrap().push(("kill", Instant::now()));
        self.0.alive.store(false, Ordering::SeqCst);
        "all".into()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_time_kubelet_sigkills_a_shell_pod_at_the_floor_and_deletes_an_exited_one_early() {
    let server = ApiServer::start().await.unwrap();
    let shell = Arc::new(FakeNode {
        alive: AtomicBool::new(true),
        ..FakeNode::default()
    });
    server.set_pod_runtime(Runtime(shell.clone()));
    server.add_pod(pod("ci", "shell", "n1", json!({}))).unwrap();
    let t0 = Instant::now();
    evict(&server, "shell", 1).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            server.pod("ci", "shell").is_none()
        })
        .await
    );
    let took = t0.elapsed();
    let log = shell.log.lock().unwrap().clone();
    assert_eq!(
        log.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        ["term", "kill"]
    );
    let term = log[0].1 - t0;
    let kill = log[1].1 - t0;
    assert!(
        term >= Duration::from_millis(45) && term < Duration::from_millis(500),
        "{term:?}"
    );
    // grace 1 is floored at 2 s after the kubelet saw the eviction
    assert!(kill >= Duration::from_millis(2040), "{kill:?}");
    assert!(took >= kill, "deleted after the kill: {took:?}");

    let exits = Arc::new(FakeNode {
        dies_on_term: true,
        alive: AtomicBool::new(true),
        ..FakeNode::default()
    });
    server.set_pod_runtime(Runtime(exits.clone()));
    server.add_pod(pod("ci", "exits", "n1", json!({}))).unwrap();
    let t0 = Instant::now();
    evict(&server, "exits", 30).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            server.pod("ci", "exits").is_none()
        })
        .await
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let kinds: Vec<&str> = exits.log.lock().unwrap().iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, ["term"], "no SIGKILL once the container is gone");
    let actions: Vec<&str> = server
        .kubelet_actions()
        .iter()
        .filter(|a| a.name == "exits")
        .map(|a| a.kind.as_str())
        .collect();
    assert_eq!(actions, ["sigterm", "exited_on_sigterm", "deleted"]);
}
