//! The pod-resources client against a fake kubelet (real parts over real sockets): the generated
//! `v1.PodResourcesLister` service over a real unix socket, with faults, a kubelet restart
//! that deletes and recreates the socket, terminal pods, time-slicing replica IDs and several
//! GPUs. The fake holds its answers behind a lock so each test can change them mid-run.

use crate::kubelet::{pod, replicas, serve, shared_node, FakeKubelet, Serving};
use gpu_warden::attribute::podresources::client::{
    PodResourcesClient, PodResourcesError, PodResourcesReply,
};
use gpu_warden::attribute::podresources::model::allocations;
use gpu_warden::model::replicas::PodKey;
use std::path::PathBuf;
use std::time::Duration;

const G0: &str = "GPU-11111111-2222-3333-4444-555555555555";
const G1: &str = "GPU-66666666-7777-8888-9999-000000000000";

/// The shared two-GPU node (`kubelet::shared_node`).
fn node(kubelet: &FakeKubelet) {
    shared_node(kubelet, G0, G1);
}

fn socket(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("kubelet.sock")
}

const TIMEOUT: Duration = Duration::from_millis(500);

/// A fake kubelet serving [`node`] on a fresh socket, and a client connected to it.
struct Node {
    _dir: tempfile::TempDir,
    path: PathBuf,
    kubelet: FakeKubelet,
    server: Serving,
    client: PodResourcesClient,
}

impl Node {
    async fn start() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let path = socket(&dir);
        let kubelet = FakeKubelet::default();
        node(&kubelet);
        let server = serve(&kubelet, &path);
        let client = PodResourcesClient::connect(&path, TIMEOUT).await.unwrap();
        Node {
            _dir: dir,
            path,
            kubelet,
            server,
            client,
        }
    }
}

/// Polls until a poll succeeds (a kubelet coming up), at most 2.5 s.
async fn poll_until_ok(client: &mut PodResourcesClient) -> Option<PodResourcesReply> {
    for _ in 0..50 {
        if let Ok(r) = client.poll().await {
            return Some(r);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test]
async fn replicas_of_several_gpus_terminal_pods_dropped_one_dial() {
    let Node {
        _dir,
        path,
        kubelet: _,
        server,
        mut client,
    } = Node::start().await;
    for _ in 0..10 {
        client.poll().await.unwrap();
    }
    assert_eq!(client.dials(), 1, "one channel, never a dial per poll");
    let reply = client.poll().await.unwrap();
    let a = allocations(&reply.list, &reply.allocatable, |ns, n| {
        (ns, n) == ("ci", "finished")
    });
    assert_eq!((a.gpus[G0].allocatable, a.gpus[G0].allocated), (4, 3));
    assert_eq!((a.gpus[G1].allocatable, a.gpus[G1].allocated), (4, 2));
    let g0_pods: Vec<&PodKey> = a.gpus[G0].pods.iter().collect();
    assert_eq!(
        g0_pods.len(),
        3,
        "every pod sharing the GPU is kept: {g0_pods:?}"
    );
    assert!(!a.gpus[G1].pods.iter().any(|p| p.1 == "finished"));
    // The device plugin's next replica goes to GPU 1 (fewest allocated).
    assert_eq!(a.next_gpu(|u| (u == G1).then_some(1).or(Some(0))), Some(G1));
    server.shut_down(&path).await;
}

#[tokio::test]
async fn kubelet_restart_recreates_the_socket_and_the_channel_redials() {
    let Node {
        _dir,
        path,
        kubelet,
        server,
        mut client,
    } = Node::start().await;
    client.poll().await.unwrap();
    assert_eq!(client.dials(), 1);

    server.shut_down(&path).await;
    let err = client.poll().await.unwrap_err();
    assert!(
        !err.disables(),
        "a restarting kubelet is a failed poll, not feature-off: {err}"
    );

    // The kubelet comes back with a new socket and new allocations.
    kubelet.set(|s| {
        s.list
            .pod_resources
            .push(pod("ci", "job-4", replicas(G0, 3..4)))
    });
    let server = serve(&kubelet, &path);
    let reply = poll_until_ok(&mut client)
        .await
        .expect("the client reconnects to the recreated socket");
    assert!(reply.list.pod_resources.iter().any(|p| p.name == "job-4"));
    let dials = client.dials();
    assert!(
        (2..=4).contains(&dials),
        "redials only while the socket was gone: {dials}"
    );
    for _ in 0..5 {
        client.poll().await.unwrap();
    }
    assert_eq!(client.dials(), dials, "and stays on the new connection");
    server.shut_down(&path).await;
}

#[tokio::test]
async fn faults_are_call_errors_and_the_next_poll_recovers() {
    let Node {
        _dir,
        path,
        kubelet,
        server,
        mut client,
    } = Node::start().await;

    kubelet.set(|s| s.fail = Some(tonic::Code::Unavailable));
    match client.poll().await {
        Err(PodResourcesError::Call { call, message }) => {
            assert_eq!(call, "List");
            assert!(message.contains("Unavailable"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // A hung kubelet: the call times out instead of stalling the agent.
    kubelet.set(|s| {
        s.fail = None;
        s.delay = Duration::from_secs(3);
    });
    let started = std::time::Instant::now();
    let err = client.poll().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");
    assert!(!err.disables());

    kubelet.set(|s| s.delay = Duration::ZERO);
    let reply = client.poll().await.unwrap();
    assert_eq!(reply.list.pod_resources.len(), 5);
    assert_eq!(reply.allocatable.devices.len(), 2);
    server.shut_down(&path).await;
}

#[tokio::test]
async fn a_socket_that_refuses_is_retried_not_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    // A stale socket file left by a dead kubelet: connecting is refused.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let mut client = PodResourcesClient::connect(&path, TIMEOUT).await.unwrap();
    assert!(client.poll().await.is_err());
    std::fs::remove_file(&path).unwrap();
    let kubelet = FakeKubelet::default();
    node(&kubelet);
    let server = serve(&kubelet, &path);
    let mut ok = false;
    for _ in 0..50 {
        if client.poll().await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ok,
        "the kubelet that came up is reached through the same channel"
    );
    server.shut_down(&path).await;
}

#[tokio::test]
async fn absent_socket_is_feature_off() {
    let dir = tempfile::tempdir().unwrap();
    let err = PodResourcesClient::connect(socket(&dir), TIMEOUT)
        .await
        .unwrap_err();
    assert!(err.disables(), "{err}");
}
