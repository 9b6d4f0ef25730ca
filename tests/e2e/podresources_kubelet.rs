//! The pod-resources client against a fake kubelet (real parts over real sockets): the generated
//! `v1.PodResourcesLister` service over a real unix socket, with faults, a kubelet restart
//! that deletes and recreates the socket, terminal pods, time-slicing replica IDs and several
//! GPUs, every device-ID form NVIDIA's device plugin writes, and each kubelet generation. The
//! fake holds its answers behind a lock so each test can change them mid-run.

use crate::kubelet::{
    devices_of, pod, pod_of, replicas, serve, shared_node, FakeKubelet, Generation, Serving,
};
use gpu_warden::attribute::podresources::client::{
    PodResourcesClient, PodResourcesReply, MAX_MESSAGE,
};
use gpu_warden::attribute::podresources::generated::AllocatableResourcesResponse;
use gpu_warden::attribute::podresources::model::reduce;
use gpu_warden::model::replicas::{AllocatableError, PodKey, PodResourcesError, ReplicaView};
use gpu_warden::model::snapshot::GpuSample;
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
        let client = PodResourcesClient::connect(&path, TIMEOUT, MAX_MESSAGE)
            .await
            .unwrap();
        Node {
            _dir: dir,
            path,
            kubelet,
            server,
            client,
        }
    }
}

/// The reply reduced and matched with `gpus`; `is_terminal` plays the pod view.
fn view(
    reply: &PodResourcesReply,
    gpus: &[GpuSample],
    is_terminal: impl Fn(&str, &str) -> bool,
) -> ReplicaView {
    reduce(
        &reply.list,
        reply.allocatable.as_ref(),
        is_terminal,
        |_, _| None,
    )
    .resolve(gpus)
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
    let a = view(&reply, &[], |ns, n| (ns, n) == ("ci", "finished")).allocations;
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
    assert_eq!(reply.allocatable.unwrap().devices.len(), 2);
    server.shut_down(&path).await;
}

#[tokio::test]
async fn a_socket_that_refuses_is_retried_not_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    // A stale socket file left by a dead kubelet: connecting is refused.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let mut client = PodResourcesClient::connect(&path, TIMEOUT, MAX_MESSAGE)
        .await
        .unwrap();
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
    let err = PodResourcesClient::connect(socket(&dir), TIMEOUT, MAX_MESSAGE)
        .await
        .unwrap_err();
    assert!(err.disables(), "{err}");
}

fn nvml_gpu(index: u32, uuid: &str, mig: &[&str]) -> GpuSample {
    use gpu_warden::model::snapshot::{GpuHealth, GpuIdentity};
    let mut g = GpuSample::empty(
        GpuIdentity {
            index,
            uuid: uuid.into(),
            pci_bus_id: format!("00000000:1{index}:00.0"),
            device: format!("nvidia{index}"),
            model: "NVIDIA H100 80GB HBM3".into(),
        },
        GpuHealth::Ok,
    );
    g.mig_devices = mig.iter().map(|m| m.to_string()).collect();
    g
}

const MIG_A: &str = "MIG-0e4a6c2f-63a3-5b43-9a2e-1b3c3d7e8f90";
const MIG_B: &str = "MIG-1e4a6c2f-63a3-5b43-9a2e-1b3c3d7e8f91";
const MIG_C: &str = "MIG-2e4a6c2f-63a3-5b43-9a2e-1b3c3d7e8f92";

/// Every device-ID form NVIDIA's device plugin writes, through the real client and a real
/// socket, matched with the GPUs NVML would report: MIG devices in the mixed strategy
/// (`nvidia.com/mig-<profile>`), the single strategy (`nvidia.com/gpu`) and time-sliced
/// (`MIG-<uuid>::<n>`, renamed `.shared`) to their parent; whole GPUs and renamed shared
/// replicas by UUID; index IDs through NVML's index (here NVML's index 0 is G1); Tegra's
/// `tegra`, which names no NVML GPU, counted nowhere. Before issue 27 the MIG and index
/// IDs were dropped, so those pods "held nothing".
#[tokio::test]
async fn every_device_id_form_is_counted_on_its_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let kubelet = FakeKubelet::default();
    // NVML: index 0 is G1 (whole, time-sliced), index 1 is G0 in MIG mode with three slices.
    let gpus = [
        nvml_gpu(0, G1, &[]),
        nvml_gpu(1, G0, &[MIG_A, MIG_B, MIG_C]),
    ];
    let mig = |n: u32| format!("{MIG_C}::{n}");
    kubelet.set(|s| {
        s.allocatable = AllocatableResourcesResponse {
            devices: [
                devices_of("nvidia.com/mig-1g.10gb", &[MIG_A.to_string()]),
                devices_of("nvidia.com/gpu", &[MIG_B.to_string()]),
                devices_of("nvidia.com/mig-3g.40gb.shared", &[mig(0), mig(1)]),
                devices_of("nvidia.com/gpu.shared", &replicas(G1, 0..2)),
                devices_of("nvidia.com/gpu", &["0::2".into(), "0::3".into()]),
                devices_of("example.com/fpga", &["0".into()]),
            ]
            .concat(),
            ..Default::default()
        };
        s.list.pod_resources = vec![
            pod_of("ml", "mixed", "nvidia.com/mig-1g.10gb", vec![MIG_A.into()]),
            pod_of("ml", "single", "nvidia.com/gpu", vec![MIG_B.into()]),
            pod_of(
                "ml",
                "mig-shared",
                "nvidia.com/mig-3g.40gb.shared",
                vec![mig(1)],
            ),
            pod_of("ci", "shared", "nvidia.com/gpu.shared", replicas(G1, 0..1)),
            pod_of("ci", "by-index", "nvidia.com/gpu", vec!["0::3".into()]),
            pod_of("ci", "jetson", "nvidia.com/gpu", vec!["tegra".into()]),
            pod_of("ci", "fpga", "example.com/fpga", vec!["0".into()]),
        ];
    });
    let server = serve(&kubelet, &path);
    let mut client = PodResourcesClient::connect(&path, TIMEOUT, MAX_MESSAGE)
        .await
        .unwrap();
    let reply = client.poll().await.unwrap();
    let v = view(&reply, &gpus, |_, _| false);
    assert_eq!(v.gpu(G0).0, 3, "three MIG devices held on G0: {v:?}");
    assert_eq!(v.allocatable(G0), Some(4));
    assert_eq!(v.gpu(G1).0, 2);
    assert_eq!(v.allocatable(G1), Some(4));
    let a = &v.allocations;
    for (ns, name, gpu) in [
        ("ml", "mixed", G0),
        ("ml", "single", G0),
        ("ml", "mig-shared", G0),
        ("ci", "shared", G1),
        ("ci", "by-index", G1),
    ] {
        assert!(a.holds(&(ns.into(), name.into()), gpu), "{name}");
    }
    let jetson: PodKey = ("ci".into(), "jetson".into());
    assert!(a.holds_unmapped(&jetson));
    assert!(
        !a.bypasses(&jetson, G1),
        "an unmatched ID is never a bypass"
    );
    assert!(!a.pod_devices.contains_key(&("ci".into(), "fpga".into())));
    assert!(
        a.bypasses(&("ci".into(), "fpga".into()), G1),
        "a listed pod holding no GPU device that runs on one bypasses the plugin"
    );
    server.shut_down(&path).await;
}

/// Each kubelet generation, as the fake plays it from the kubelet's and grpc-go's sources:
/// `List` stands on its own when `GetAllocatableResources` is not served (before issue 27
/// a failing `GetAllocatableResources` discarded a `List` that had answered), the reason
/// names the generation, and a call the kubelet does not serve is not asked again on the
/// same connection.
#[tokio::test]
async fn each_kubelet_generation() {
    for (generation, want) in [
        (Generation::Current, None),
        (Generation::GateOff, Some("feature gate off")),
        (Generation::ListOnly, Some("before 1.21")),
    ] {
        let Node {
            _dir,
            path,
            kubelet,
            server,
            mut client,
        } = Node::start().await;
        kubelet.set(|s| s.generation = generation);
        for _ in 0..3 {
            let reply = client.poll().await.unwrap();
            assert_eq!(reply.list.pod_resources.len(), 5, "{generation:?}");
            match (&reply.allocatable, want) {
                (Ok(a), None) => assert_eq!(a.devices.len(), 2),
                (Err(AllocatableError::Unavailable(why)), Some(w)) => {
                    assert!(why.contains(w), "{generation:?}: {why}")
                }
                other => panic!("{generation:?}: {other:?}"),
            }
            let v = view(&reply, &[], |ns, n| (ns, n) == ("ci", "finished"));
            assert_eq!(v.gpu(G0).0, 3, "{generation:?}");
        }
        let asked = kubelet
            .allocatable_calls
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(asked, if want.is_some() { 1 } else { 3 }, "{generation:?}");
        server.shut_down(&path).await;
    }
    // Before 1.20 there is no v1 service: List fails, and says why.
    let Node {
        _dir,
        path,
        kubelet,
        server,
        mut client,
    } = Node::start().await;
    kubelet.set(|s| s.generation = Generation::AlphaOnly);
    let err = client.poll().await.unwrap_err().to_string();
    assert!(err.contains("List") && err.contains("before 1.20"), "{err}");
    server.shut_down(&path).await;
}

/// A kubelet restart (a new connection) asks `GetAllocatableResources` again: an upgraded
/// kubelet serves it.
#[tokio::test]
async fn an_upgraded_kubelet_is_asked_again() {
    let Node {
        _dir,
        path,
        kubelet,
        server,
        mut client,
    } = Node::start().await;
    kubelet.set(|s| s.generation = Generation::GateOff);
    assert!(client.poll().await.unwrap().allocatable.is_err());
    server.shut_down(&path).await;
    kubelet.set(|s| s.generation = Generation::Current);
    let server = serve(&kubelet, &path);
    let reply = poll_until_ok(&mut client).await.expect("reconnects");
    assert!(reply.allocatable.is_ok(), "{:?}", reply.allocatable);
    server.shut_down(&path).await;
}

/// An answer larger than the cap is refused with a message that says so, not decoded.
#[tokio::test]
async fn an_answer_over_the_cap_is_refused_and_says_so() {
    let Node {
        _dir,
        path,
        kubelet,
        server,
        client: _,
    } = Node::start().await;
    // 40 replica IDs of ~46 bytes per pod: about 2 KB each.
    let big = MAX_MESSAGE / 1800;
    kubelet.set(|s| {
        s.list.pod_resources = (0..big)
            .map(|i| pod("ci", &format!("job-{i:012}"), replicas(G0, 0..40)))
            .collect()
    });
    // A debug build takes a while to encode it: a longer timeout than the other tests'.
    let mut client = PodResourcesClient::connect(&path, Duration::from_secs(10), MAX_MESSAGE)
        .await
        .unwrap();
    let err = client.poll().await.unwrap_err().to_string();
    assert!(err.contains("larger than the agent accepts"), "{err}");
    server.shut_down(&path).await;
}
