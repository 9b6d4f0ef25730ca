//! A fake kubelet pod-resources server (real parts over real sockets): the generated
//! `v1.PodResourcesLister` service (upstream's `api.proto`) over a real unix socket, with
//! injected faults and delays, each kubelet generation's answers ([`Generation`]), and a
//! shutdown that deletes the socket as a stopping kubelet does. It holds its answers behind a
//! lock so a test can change them mid-run. Shared by the client's tests and the agent's
//! end-to-end tests: the `kubelet` module of the e2e crate.
#![allow(dead_code)]

use gpu_warden::attribute::podresources::generated::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpu_warden::attribute::podresources::generated::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Which kubelet the fake plays, after the kubelet's `pkg/kubelet/apis/podresources` and
/// grpc-go's answers for what a server does not serve (`server.go`: `unknown service %v`,
/// `unknown method %v for service %v`, both `codes.Unimplemented`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Generation {
    /// 1.23 and later: `List` and `GetAllocatableResources` (beta, on by default).
    #[default]
    Current,
    /// 1.21–1.22 with the `KubeletPodResourcesGetAllocatable` gate off (its default):
    /// `server_v1.go` returns `fmt.Errorf("Pod Resources API GetAllocatableResources
    /// disabled")`, which grpc-go sends as `Unknown`.
    GateOff,
    /// 1.20: the v1 service has `List` only.
    ListOnly,
    /// Before 1.20: only `v1alpha1` is served; every v1 call is an unknown service.
    AlphaOnly,
}

/// What the fake answers.
#[derive(Default)]
pub struct State {
    pub generation: Generation,
    pub list: ListPodResourcesResponse,
    pub allocatable: AllocatableResourcesResponse,
    /// Answer every call with this status instead.
    pub fail: Option<tonic::Code>,
    /// Sleep this long before answering.
    pub delay: Duration,
}

/// The fake kubelet's service; clones share their state.
#[derive(Clone, Default)]
pub struct FakeKubelet {
    pub state: Arc<Mutex<State>>,
    pub calls: Arc<AtomicU64>,
    /// `GetAllocatableResources` calls alone.
    pub allocatable_calls: Arc<AtomicU64>,
}

impl FakeKubelet {
    /// Changes the answers.
    pub fn set(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().unwrap());
    }

    /// How many calls it has answered (or failed).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    async fn answer<T>(
        &self,
        method: &str,
        f: impl FnOnce(&State) -> T,
    ) -> Result<Response<T>, Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let (fail, delay, generation) = {
            let s = self.state.lock().unwrap();
            (s.fail, s.delay, s.generation)
        };
        tokio::time::sleep(delay).await;
        if let Some(code) = fail {
            return Err(Status::new(code, "injected"));
        }
        let allocatable = method == "GetAllocatableResources";
        match generation {
            Generation::AlphaOnly => {
                return Err(Status::unimplemented(
                    "unknown service v1.PodResourcesLister",
                ))
            }
            Generation::ListOnly if allocatable => {
                return Err(Status::unimplemented(format!(
                    "unknown method {method} for service v1.PodResourcesLister"
                )))
            }
            Generation::GateOff if allocatable => {
                return Err(Status::unknown(
                    "Pod Resources API GetAllocatableResources disabled",
                ))
            }
            _ => {}
        }
        let s = self.state.lock().unwrap();
        Ok(Response::new(f(&s)))
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.answer("List", |s| s.list.clone()).await
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.allocatable_calls.fetch_add(1, Ordering::Relaxed);
        self.answer("GetAllocatableResources", |s| s.allocatable.clone())
            .await
    }
    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used by gpu-warden"))
    }
}

/// A running fake kubelet.
pub struct Serving {
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

impl Serving {
    /// Stops serving and deletes the socket, as a stopping kubelet does.
    pub async fn shut_down(mut self, path: &Path) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = self.done.await;
        let _ = std::fs::remove_file(path);
    }
}

/// Serves `kubelet` on a new socket at `path` (inside a tokio runtime).
pub fn serve(kubelet: &FakeKubelet, path: &Path) -> Serving {
    let listener = UnixListener::bind(path).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = PodResourcesListerServer::new(kubelet.clone());
    let done = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await;
    });
    Serving {
        stop: Some(stop),
        done,
    }
}

/// NVIDIA's device plugin's resource holding these device IDs.
pub fn devices(ids: &[String]) -> Vec<ContainerDevices> {
    devices_of("nvidia.com/gpu", ids)
}

/// The resource `resource` holding these device IDs.
pub fn devices_of(resource: &str, ids: &[String]) -> Vec<ContainerDevices> {
    vec![ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.to_vec(),
        topology: None,
    }]
}

/// Time-slicing replica IDs `GPU-<uuid>::<n>` for `n` in the range.
pub fn replicas(gpu: &str, n: std::ops::Range<u32>) -> Vec<String> {
    n.map(|i| format!("{gpu}::{i}")).collect()
}

/// Sets the kubelet's answers: every GPU of `gpus` time-sliced `per_gpu` ways
/// (`GPU-<uuid>::0..per_gpu` allocatable), and `pods` as the `List` answer.
pub fn time_sliced(kubelet: &FakeKubelet, gpus: &[&str], per_gpu: u32, pods: Vec<PodResources>) {
    kubelet.set(|s| {
        s.allocatable = AllocatableResourcesResponse {
            devices: gpus
                .iter()
                .flat_map(|g| devices(&replicas(g, 0..per_gpu)))
                .collect(),
            ..Default::default()
        };
        s.list = ListPodResourcesResponse {
            pod_resources: pods,
        };
    });
}

/// The node both pod-resources suites play: GPUs `g0` and `g1` time-sliced 4 ways; three
/// pods share `g0` (where dcgm-exporter would label one), `ml/train-0` holds two replicas of
/// `g1`, and the finished `ci/finished` is still listed with one (kubernetes #119423).
pub fn shared_node(kubelet: &FakeKubelet, g0: &str, g1: &str) {
    let pods = vec![
        pod("ci", "job-1", replicas(g0, 0..1)),
        pod("ci", "job-2", replicas(g0, 1..2)),
        pod("ci", "job-3", replicas(g0, 2..3)),
        pod("ml", "train-0", replicas(g1, 0..2)),
        pod("ci", "finished", replicas(g1, 3..4)),
    ];
    time_sliced(kubelet, &[g0, g1], 4, pods);
}

/// A pod whose one container holds these device IDs.
pub fn pod(ns: &str, name: &str, ids: Vec<String>) -> PodResources {
    pod_of(ns, name, "nvidia.com/gpu", ids)
}

/// A pod whose one container holds these device IDs of `resource`.
pub fn pod_of(ns: &str, name: &str, resource: &str, ids: Vec<String>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: if ids.is_empty() {
                vec![]
            } else {
                devices_of(resource, &ids)
            },
            ..Default::default()
        }],
        ..Default::default()
    }
}
