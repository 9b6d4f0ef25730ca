//! The handle tests hold, the builder, and the accept loop.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};

use crate::fault::Fault;
use crate::fixtures::Fixtures;
use crate::kubelet::KubeletOptions;
use crate::kubelet_run::{KubeletAction, PodRuntime, SteppedClock};
use crate::record::{EvictionOutcome, EvictionRecord, RecordedRequest, StoredEvent};
use crate::state::{lock, sanitize_scale, Kind, Shared, State};
use crate::{Error, Result};

/// A hook called with the pod object when the kubelet deletes an evicted pod (after its
/// grace period; not for a grace of 0, which the API server deletes at once).
pub type EvictHook = Box<dyn Fn(&Value) + Send + Sync>;
/// A hook called with each request once its answer is known (or, for a hanging request, when
/// it starts to hang).
pub type RequestHook = Box<dyn Fn(&RecordedRequest) + Send + Sync>;

/// Options for starting an [`ApiServer`]; get one from [`ApiServer::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    listen: SocketAddr,
    kubelet: KubeletOptions,
    stepped: Option<SteppedClock>,
    bookmark_interval: Duration,
    history_limit: usize,
    heartbeat: Option<Duration>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kubelet: KubeletOptions::default(),
            stepped: None,
            bookmark_interval: Duration::from_secs(1),
            history_limit: 10_000,
            heartbeat: Some(crate::storage::HEARTBEAT),
        }
    }
}

impl Builder {
    /// How often the cluster's resourceVersion moves on its own while storage is healthy
    /// (`crate::storage`; default [`crate::storage::HEARTBEAT`]); `None`: only when an object
    /// changes, as a cluster with no other writer.
    #[must_use]
    pub fn heartbeat(mut self, every: Option<Duration>) -> Self {
        self.heartbeat = every;
        self
    }

    /// The address to listen on (default `127.0.0.1:0`, an ephemeral port).
    #[must_use]
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// How the double plays the node's kubelet after an accepted eviction (default: the
    /// faithful kubelet of [`crate::kubelet`]: 50 ms watch latency, SIGTERM to PID 1, a PID 1
    /// that ignores it, SIGKILL after `max(grace, 2 s)`, then DELETED).
    #[must_use]
    pub fn kubelet(mut self, options: KubeletOptions) -> Self {
        self.kubelet = options;
        self
    }

    /// Runs the kubelet on a test's own clock: each accepted eviction is stamped with
    /// `clock`'s reading, and the kubelet acts only when the test calls
    /// [`ApiServer::kubelet_run_until`] — never on its own in real time.
    #[must_use]
    pub fn kubelet_stepped(mut self, clock: SteppedClock) -> Self {
        self.stepped = Some(clock);
        self
    }

    /// The instant comparison ([`KubeletOptions::instant`]): evicted pods are killed and
    /// deleted when `grace × scale` has passed (0: at once). Not a real node's behaviour;
    /// guard tests use the default faithful kubelet. Negative or non-finite values count as 0.
    #[must_use]
    pub fn eviction_grace_scale(mut self, scale: f64) -> Self {
        self.kubelet = KubeletOptions::instant(sanitize_scale(scale));
        self
    }

    /// How often watches that asked for bookmarks get one (default 1 s).
    #[must_use]
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// How many changes are kept for watches to replay (default 10 000); a watch from a
    /// resourceVersion older than that gets 410 Gone.
    #[must_use]
    pub fn history_limit(mut self, n: usize) -> Self {
        self.history_limit = n;
        self
    }

    /// Binds the socket and starts serving on the current Tokio runtime.
    pub async fn start(self) -> Result<ApiServer> {
        let listener = TcpListener::bind(self.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: self.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: self.listen,
            source,
        })?;
        let state = State::new(self.kubelet, self.bookmark_interval, self.history_limit);
        let shared = Arc::new(Shared::new(state, addr, self.stepped));
        tokio::spawn(accept_loop(listener, shared.clone()));
        if let Some(every) = self.heartbeat.filter(|d| !d.is_zero()) {
            tokio::spawn(crate::storage::heartbeat(shared.clone(), every));
        }
        tracing::debug!(%addr, "apiserver-double listening");
        Ok(ApiServer {
            guard: Arc::new(Guard(shared.clone())),
            shared,
        })
    }
}

/// Shuts the server down when the last handle goes away.
struct Guard(Arc<Shared>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.shut_down();
    }
}

/// A running API server double, and the handle to its state.
///
/// Cloning gives another handle to the same server; the server stops when
/// [`shutdown`](ApiServer::shutdown) is called or the last handle is dropped.
#[derive(Clone)]
pub struct ApiServer {
    pub(crate) shared: Arc<Shared>,
    #[allow(dead_code)] // held for its Drop
    guard: Arc<Guard>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("addr", &self.shared.addr)
            .finish()
    }
}

impl ApiServer {
    /// Starts a server on `127.0.0.1:0` with default options.
    pub async fn start() -> Result<ApiServer> {
        Builder::default().start().await
    }

    /// Starts a server on `addr` with default options.
    pub async fn start_on(addr: SocketAddr) -> Result<ApiServer> {
        Builder::default().listen(addr).start().await
    }

    /// Options for starting a server.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Stops accepting, drops every open connection (watches and hanging requests included).
    /// Idempotent.
    pub fn shutdown(&self) {
        self.shared.shut_down();
    }

    /// The last resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.shared.read(|s| s.rv)
    }

    // ---- pods ----

    /// Creates (ADDED) or replaces (MODIFIED) a pod. Fills in `kind`, `apiVersion`,
    /// `metadata.namespace` (`default`), `uid`, `creationTimestamp` and `resourceVersion`;
    /// returns the stored object. Fails without `metadata.name`.
    pub fn add_pod(&self, pod: Value) -> Result<Value> {
        self.shared
            .mutate(|s| s.upsert(Kind::Pod, pod))
            .map_err(Error::InvalidObject)
    }

    /// Changes a pod in place (a MODIFIED event); returns the new object, or `None` when there
    /// is no such pod. Name and namespace cannot be changed.
    pub fn update_pod(&self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Option<Value> {
        self.shared.mutate(|s| s.update(Kind::Pod, ns, name, f))
    }

    /// Deletes a pod at once (a DELETED event); returns its last state. Does not call the
    /// [`on_evict`](ApiServer::on_evict) hook.
    pub fn delete_pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.shared.mutate(|s| s.delete(Kind::Pod, ns, name))
    }

    /// One pod.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.shared.read(|s| s.get(Kind::Pod, ns, name).cloned())
    }

    /// All pods, in (namespace, name) order.
    pub fn pods(&self) -> Vec<Value> {
        self.shared
            .read(|s| s.list(Kind::Pod, None).map(|(_, v)| v.clone()).collect())
    }

    // ---- nodes ----

    /// Creates (ADDED) or replaces (MODIFIED) a node; see [`add_pod`](ApiServer::add_pod).
    pub fn add_node(&self, node: Value) -> Result<Value> {
        self.shared
            .mutate(|s| s.upsert(Kind::Node, node))
            .map_err(Error::InvalidObject)
    }

    /// One node.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.shared.read(|s| s.get(Kind::Node, "", name).cloned())
    }

    /// All nodes, by name.
    pub fn nodes(&self) -> Vec<Value> {
        self.shared
            .read(|s| s.list(Kind::Node, None).map(|(_, v)| v.clone()).collect())
    }

    /// Changes a node in place (a MODIFIED event); `None` when there is no such node.
    pub fn update_node(&self, name: &str, f: impl FnOnce(&mut Value)) -> Option<Value> {
        self.shared.mutate(|s| s.update(Kind::Node, "", name, f))
    }

    /// Sets one annotation on a node as a foreign writer would (bumps the resourceVersion).
    /// Returns `false` when there is no such node.
    pub fn set_node_annotation(&self, name: &str, key: &str, value: &str) -> bool {
        self.update_node(name, |n| {
            if !n["metadata"]["annotations"].is_object() {
                n["metadata"]["annotations"] = json!({});
            }
            n["metadata"]["annotations"][key] = json!(value);
        })
        .is_some()
    }

    /// Loads fixtures: every pod and node, in order.
    pub fn load_fixtures(&self, fixtures: &Fixtures) -> Result<()> {
        for n in &fixtures.nodes {
            self.add_node(n.clone())?;
        }
        for p in &fixtures.pods {
            self.add_pod(p.clone())?;
        }
        Ok(())
    }

    // ---- events and evictions ----

    /// Every event created through either Events API, in creation order, with later patches
    /// applied.
    pub fn events(&self) -> Vec<StoredEvent> {
        self.shared.read(|s| s.events.clone())
    }

    /// The accepted evictions (201), in order.
    pub fn evictions(&self) -> Vec<EvictionRecord> {
        self.shared.read(|s| {
            s.evictions
                .iter()
                .filter(|e| e.outcome == EvictionOutcome::Accepted)
                .cloned()
                .collect()
        })
    }

    /// Every eviction request that reached the eviction handler (accepted, blocked by the
    /// simulated PDB, or for a missing pod), in order. Faulted requests are not included.
    pub fn eviction_attempts(&self) -> Vec<EvictionRecord> {
        self.shared.read(|s| s.evictions.clone())
    }

    /// Makes evictions of this pod answer 429 as if a PodDisruptionBudget forbade them.
    pub fn protect_pod(&self, ns: &str, name: &str) {
        self.shared.mutate(|s| {
            s.protected.insert((ns.to_string(), name.to_string()));
        });
    }

    /// Undoes [`protect_pod`](ApiServer::protect_pod).
    pub fn unprotect_pod(&self, ns: &str, name: &str) {
        self.shared.mutate(|s| {
            s.protected.remove(&(ns.to_string(), name.to_string()));
        });
    }

    /// Sets the hook called with the pod when the kubelet deletes an evicted pod. It runs on
    /// the server's runtime: keep it short (no blocking waits).
    pub fn on_evict(&self, hook: impl Fn(&Value) + Send + Sync + 'static) {
        *lock(&self.shared.evict_hook) = Some(Arc::new(hook));
    }

    /// Switches to the instant comparison with this scale (see
    /// [`Builder::eviction_grace_scale`]), for evictions accepted from now on.
    pub fn set_eviction_grace_scale(&self, scale: f64) {
        self.set_kubelet(KubeletOptions::instant(sanitize_scale(scale)));
    }

    /// Changes how the kubelet treats evictions accepted from now on.
    pub fn set_kubelet(&self, options: KubeletOptions) {
        self.shared.mutate(|s| s.kubelet = options);
    }

    /// Lets a stepped kubelet ([`Builder::kubelet_stepped`]) run up to `until` on its clock:
    /// carries out every step due by then, in order — deleting pods (DELETED on the watch)
    /// — and returns them, so the caller ends its simulated processes where an action
    /// [`ends_processes`](KubeletAction::ends_processes), at the action's own instant. A
    /// real-time kubelet acts on its own: this returns nothing then.
    pub fn kubelet_run_until(&self, until: Duration) -> Vec<KubeletAction> {
        crate::kubelet_run::run_until(&self.shared, until)
    }

    /// Every step the kubelet has carried out, in order.
    pub fn kubelet_actions(&self) -> Vec<KubeletAction> {
        self.shared.read(|s| s.kubelet_log.clone())
    }

    /// Lets the kubelet signal real processes: SIGTERM to PID 1 and SIGKILL to the pod go
    /// through `runtime` (the binary's `--kill-cgroups-under`). Real-time kubelet only.
    pub fn set_pod_runtime(&self, runtime: impl PodRuntime + 'static) {
        *lock(&self.shared.pod_runtime) = Some(Arc::new(runtime));
    }

    /// Sets a hook called with each kubelet action as it is carried out (the binary's
    /// `--kubelet-log`). Keep it short.
    pub fn on_kubelet(&self, hook: impl Fn(&KubeletAction) + Send + Sync + 'static) {
        *lock(&self.shared.kubelet_hook) = Some(Arc::new(hook));
    }

    /// Changes the bookmark interval for watches started from now on.
    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.shared.mutate(|s| s.bookmark_interval = interval);
    }

    // ---- requests ----

    /// Every request that reached the server (watches and faulted ones included), in arrival
    /// order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.read(|s| s.requests.clone())
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.shared.mutate(|s| s.requests.clear());
    }

    /// Sets a hook called with each request once its answer is known (the binary's
    /// `--request-log` uses it). It runs on the server's runtime: keep it short.
    pub fn on_request(&self, hook: impl Fn(&RecordedRequest) + Send + Sync + 'static) {
        *lock(&self.shared.request_hook) = Some(Arc::new(hook));
    }

    // ---- faults ----

    /// Adds a fault-injection rule (after the existing ones).
    pub fn inject(&self, fault: Fault) {
        self.shared.mutate(|s| s.faults.push(fault));
    }

    /// Removes every fault-injection rule (requests already hanging keep hanging).
    pub fn clear_faults(&self) {
        self.shared.mutate(|s| s.faults.clear());
    }

    /// Takes the server down (`true`): every open connection is dropped at once and every
    /// request answers 503 `ServiceUnavailable` until it is brought back up (`false`).
    pub fn set_down(&self, down: bool) {
        self.shared.mutate(|s| s.down = down);
        if down {
            self.shared.kill_connections();
        }
    }

    /// Freezes the server (`true`): connections are still accepted and requests read, but
    /// nothing is answered and open watches send nothing — not even the end of a watch that
    /// timed out — as a kube-apiserver process that is stopped or wedged. (A stall of its
    /// storage alone looks different: [`ApiServer::set_storage_stalled`].) Thawing it (`false`) carries out every held request in the order it arrived
    /// — even those whose client gave up meanwhile, as a real server does — and watches
    /// resume.
    pub fn set_frozen(&self, frozen: bool) {
        self.shared.set_frozen(frozen);
    }

    /// Stalls the server's storage (`true`), as etcd stalling under a kube-apiserver
    /// (`crate::storage`): watches are still served from the watch cache — they start, send
    /// bookmarks whose resourceVersion no longer moves, and end cleanly at their timeout —
    /// while every other request (a LIST, a GET, every write) waits until storage answers
    /// again (`false`), and is then carried out.
    pub fn set_storage_stalled(&self, stalled: bool) {
        self.shared.storage_stalled.send_replace(stalled);
    }

    /// Whether the server is frozen (by [`ApiServer::set_frozen`] or a `Freeze` fault).
    pub fn is_frozen(&self) -> bool {
        *self.shared.frozen.borrow()
    }

    /// When the server thaws, the writes its freeze held (an eviction, a patch) are carried
    /// out `after` the thaw, while reads are answered at once — a kube-apiserver whose watch
    /// cache serves reads as soon as it answers again, before its storage has applied what
    /// was queued. Zero (the default): every held request in arrival order.
    pub fn set_thaw_writes_after(&self, after: Duration) {
        self.shared.mutate(|s| s.thaw_writes_after = after);
    }

    /// Simulates an API server restart: the resourceVersion jumps by 1000 and the watch
    /// history is forgotten, so every open watch gets an `ERROR` event with a 410 `Expired`
    /// Status and ends, and any watch resuming from an older resourceVersion gets the same.
    /// Lists keep working (clients relist, then watch from the new resourceVersion).
    pub fn restart_history(&self) {
        self.shared.mutate(|s| s.restart_history());
    }

    // ---- kubeconfig ----

    /// A kubeconfig (YAML) whose current context points at this server over plain HTTP with
    /// no credentials, default namespace `default`.
    pub fn kubeconfig_yaml(&self) -> String {
        crate::fixtures::kubeconfig_yaml(&self.url())
    }

    /// Writes [`kubeconfig_yaml`](ApiServer::kubeconfig_yaml) to a file.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(stream, shared.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = wait_until(&mut shutdown, |down| *down) => break,
        }
    }
    tracing::debug!(addr = %shared.addr, "apiserver-double stopped");
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    if shared.is_shut_down() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let mut kill = shared.kill.subscribe();
    let generation = *kill.borrow_and_update();
    let svc_shared = shared.clone();
    let svc = service_fn(move |req| {
        let shared = svc_shared.clone();
        async move { crate::http::handle(shared, req).await }
    });
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::select! {
        res = conn => {
            if let Err(e) = res {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        _ = wait_until(&mut kill, |g| *g != generation) => {
            tracing::debug!("connection dropped (server down or shut down)");
        }
    }
}

/// Waits until a watched value satisfies `pred` (forever if the sender is gone).
async fn wait_until<T>(rx: &mut tokio::sync::watch::Receiver<T>, pred: impl FnMut(&T) -> bool) {
    if rx.wait_for(pred).await.is_err() {
        std::future::pending::<()>().await;
    }
}
