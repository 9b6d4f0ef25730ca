//! The stored world: objects, their history, and everything the double records.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper::Method;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::fault::{Fault, FaultAction};
use crate::kubelet::KubeletOptions;
use crate::kubelet_run::{KubeletAction, KubeletHookArc, Pending, PodRuntime, SteppedClock};
use crate::record::{EvictionRecord, RecordedRequest, StoredEvent};
use crate::util;

/// The watchable kinds the double stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    Pod,
    Node,
    Lease,
}

impl Kind {
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Node => "Node",
            Kind::Lease => "Lease",
        }
    }

    pub(crate) fn list_kind(self) -> &'static str {
        match self {
            Kind::Pod => "PodList",
            Kind::Node => "NodeList",
            Kind::Lease => "LeaseList",
        }
    }

    pub(crate) fn resource(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Node => "nodes",
            Kind::Lease => "leases",
        }
    }

    pub(crate) fn namespaced(self) -> bool {
        matches!(self, Kind::Pod | Kind::Lease)
    }

    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Kind::Lease => "coordination.k8s.io/v1",
            Kind::Pod | Kind::Node => "v1",
        }
    }
}

/// A watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, kept for watches to replay.
#[derive(Debug, Clone)]
pub(crate) struct HistoryEntry {
    pub(crate) rv: u64,
    pub(crate) kind: Kind,
    pub(crate) etype: EventType,
    /// The object after the change (for DELETED: the last state, with the deletion's RV).
    pub(crate) object: Value,
    /// The object before the change (None for ADDED).
    pub(crate) prev: Option<Value>,
}

/// (kind, namespace — empty for cluster-scoped —, name)
pub(crate) type ObjKey = (Kind, String, String);

/// Everything behind the lock.
pub(crate) struct State {
    /// The last resourceVersion handed out.
    pub(crate) rv: u64,
    /// Watches from a resourceVersion below this get 410 Gone.
    pub(crate) compacted_rv: u64,
    pub(crate) history: VecDeque<HistoryEntry>,
    pub(crate) history_limit: usize,
    pub(crate) objects: BTreeMap<ObjKey, Value>,
    pub(crate) events: Vec<StoredEvent>,
    pub(crate) evictions: Vec<EvictionRecord>,
    pub(crate) protected: HashSet<(String, String)>,
    pub(crate) requests: Vec<RecordedRequest>,
    pub(crate) next_request_id: u64,
    pub(crate) faults: Vec<Fault>,
    pub(crate) down: bool,
    /// Writes held by a freeze are carried out this long after the thaw (reads pass at
    /// once): `ApiServer::set_thaw_writes_after`.
    pub(crate) thaw_writes_after: Duration,
    pub(crate) kubelet: KubeletOptions,
    /// Kubelet steps waiting for a stepped clock, and what the kubelet has done.
    pub(crate) kubelet_pending: Vec<Pending>,
    pub(crate) kubelet_seq: u64,
    pub(crate) kubelet_log: Vec<KubeletAction>,
    pub(crate) bookmark_interval: Duration,
}

impl State {
    pub(crate) fn new(
        kubelet: KubeletOptions,
        bookmark_interval: Duration,
        history_limit: usize,
    ) -> Self {
        State {
            rv: 1,
            compacted_rv: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            objects: BTreeMap::new(),
            events: Vec::new(),
            evictions: Vec::new(),
            protected: HashSet::new(),
            requests: Vec::new(),
            next_request_id: 1,
            faults: Vec::new(),
            down: false,
            thaw_writes_after: Duration::ZERO,
            kubelet,
            kubelet_pending: Vec::new(),
            kubelet_seq: 0,
            kubelet_log: Vec::new(),
            bookmark_interval,
        }
    }

    /// Hands out the next resourceVersion.
    pub(crate) fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn push_history(&mut self, entry: HistoryEntry) {
        self.history.push_back(entry);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = self.compacted_rv.max(old.rv);
            }
        }
    }

    /// Creates or replaces an object (ADDED or MODIFIED). Fills in what the API server would:
    /// kind/apiVersion, namespace (pods: `default`), uid, creationTimestamp, resourceVersion.
    pub(crate) fn upsert(&mut self, kind: Kind, mut obj: Value) -> Result<Value, String> {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("a {} needs metadata.name", kind.kind()))?
            .to_string();
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| format!("a {} needs metadata", kind.kind()))?;
        let ns = if kind.namespaced() {
            let ns = meta
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or("default")
                .to_string();
            meta.insert("namespace".into(), json!(ns));
            ns
        } else {
            meta.remove("namespace");
            String::new()
        };
        let key = (kind, ns, name);
        let prev = self.objects.get(&key).cloned();
        if !meta.get("uid").is_some_and(Value::is_string) {
            let uid = prev
                .as_ref()
                .and_then(|p| p.pointer("/metadata/uid").cloned())
                .unwrap_or_else(|| json!(util::new_uid()));
            meta.insert("uid".into(), uid);
        }
        if !meta.contains_key("creationTimestamp") {
            meta.insert("creationTimestamp".into(), json!(util::now_rfc3339()));
        }
        let rv = self.bump();
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        if let Some(o) = obj.as_object_mut() {
            o.entry("apiVersion").or_insert(json!(kind.api_version()));
            o.entry("kind").or_insert(json!(kind.kind()));
        }
        self.objects.insert(key, obj.clone());
        let etype = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.push_history(HistoryEntry {
            rv,
            kind,
            etype,
            object: obj.clone(),
            prev,
        });
        Ok(obj)
    }

    /// Changes an object in place (MODIFIED); `f` may not rename it (name and namespace are
    /// restored). `None` when there is no such object.
    pub(crate) fn update(
        &mut self,
        kind: Kind,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let key = (kind, ns.to_string(), name.to_string());
        let prev = self.objects.get(&key)?.clone();
        let mut obj = prev.clone();
        f(&mut obj);
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        obj["metadata"]["name"] = json!(name);
        if kind.namespaced() {
            obj["metadata"]["namespace"] = json!(ns);
        }
        let rv = self.bump();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.insert(key, obj.clone());
        self.push_history(HistoryEntry {
            rv,
            kind,
            etype: EventType::Modified,
            object: obj.clone(),
            prev: Some(prev),
        });
        Some(obj)
    }

    /// Removes an object (DELETED); returns its last state.
    pub(crate) fn delete(&mut self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        let key = (kind, ns.to_string(), name.to_string());
        let prev = self.objects.remove(&key)?;
        let rv = self.bump();
        let mut obj = prev.clone();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.push_history(HistoryEntry {
            rv,
            kind,
            etype: EventType::Deleted,
            object: obj.clone(),
            prev: Some(prev),
        });
        Some(obj)
    }

    pub(crate) fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(kind, ns.to_string(), name.to_string()))
    }

    /// Objects of a kind (optionally in one namespace), in (namespace, name) order.
    pub(crate) fn list<'a>(
        &'a self,
        kind: Kind,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Value)> + 'a {
        self.objects
            .iter()
            .filter(move |(k, _)| k.0 == kind && ns.is_none_or(|n| k.1 == n))
    }

    /// Forgets all history and jumps the resourceVersion, as a restarted API server whose
    /// watch cache starts afresh: older resourceVersions become 410 Gone.
    pub(crate) fn restart_history(&mut self) {
        self.rv += 1000;
        self.compacted_rv = self.rv;
        self.history.clear();
    }

    /// Finds the first fault matching a request and consumes one use of it.
    pub(crate) fn take_fault(
        &mut self,
        method: &Method,
        path: &str,
        is_watch: bool,
    ) -> Option<FaultAction> {
        let idx = self
            .faults
            .iter()
            .position(|f| f.matches(method, path, is_watch))?;
        let fault = &mut self.faults[idx];
        let action = fault.action.clone();
        if let Some(n) = fault.times.as_mut() {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.faults.remove(idx);
            }
        }
        Some(action)
    }
}

/// A grace scale that is finite and non-negative.
pub(crate) fn sanitize_scale(scale: f64) -> f64 {
    if scale.is_finite() && scale > 0.0 {
        scale
    } else {
        0.0
    }
}

/// A hook run when an evicted pod is finally deleted.
pub(crate) type EvictHookArc = Arc<dyn Fn(&Value) + Send + Sync>;
/// A hook run when a request's answer is known.
pub(crate) type RequestHookArc = Arc<dyn Fn(&RecordedRequest) + Send + Sync>;

/// State shared by the handle, the accept loop and every connection.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Carries the latest resourceVersion; watches wake on changes.
    pub(crate) changed: watch::Sender<u64>,
    /// A generation counter; bumping it drops every open connection.
    pub(crate) kill: watch::Sender<u64>,
    /// Set once the server shuts down.
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) evict_hook: Mutex<Option<EvictHookArc>>,
    pub(crate) request_hook: Mutex<Option<RequestHookArc>>,
    pub(crate) kubelet_hook: Mutex<Option<KubeletHookArc>>,
    pub(crate) pod_runtime: Mutex<Option<Arc<dyn PodRuntime>>>,
    /// The harness's clock, when the kubelet is stepped; else it keeps real time from `epoch`.
    pub(crate) stepped: Option<SteppedClock>,
    pub(crate) epoch: std::time::Instant,
    pub(crate) addr: std::net::SocketAddr,
    /// Every request passes this fair lock; a frozen server holds it (`frozen_guard`).
    pub(crate) gate: Arc<tokio::sync::Mutex<()>>,
    pub(crate) frozen_guard: Mutex<Option<tokio::sync::OwnedMutexGuard<()>>>,
    /// Whether the server is frozen: open watches wait while it is.
    pub(crate) frozen: watch::Sender<bool>,
    /// Whether storage is stalled (`crate::storage`): requests but watches wait.
    pub(crate) storage_stalled: watch::Sender<bool>,
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(crate) fn new(
        state: State,
        addr: std::net::SocketAddr,
        stepped: Option<SteppedClock>,
    ) -> Self {
        let rv = state.rv;
        Shared {
            state: Mutex::new(state),
            changed: watch::Sender::new(rv),
            kill: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            evict_hook: Mutex::new(None),
            request_hook: Mutex::new(None),
            kubelet_hook: Mutex::new(None),
            pod_runtime: Mutex::new(None),
            stepped,
            epoch: std::time::Instant::now(),
            addr,
            gate: Arc::new(tokio::sync::Mutex::new(())),
            frozen_guard: Mutex::new(None),
            frozen: watch::Sender::new(false),
            storage_stalled: watch::Sender::new(false),
        }
    }

    /// Reads the state.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&lock(&self.state))
    }

    /// Changes the state, then wakes watches if the resourceVersion moved.
    pub(crate) fn mutate<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (r, rv) = {
            let mut st = lock(&self.state);
            let r = f(&mut st);
            (r, st.rv)
        };
        self.changed.send_if_modified(|cur| {
            if *cur != rv {
                *cur = rv;
                true
            } else {
                false
            }
        });
        r
    }

    /// Drops every open connection (watches included).
    /// Freezes (`true`) or thaws the server: see `ApiServer::set_frozen`.
    pub(crate) fn set_frozen(&self, frozen: bool) {
        let mut held = lock(&self.frozen_guard);
        if frozen && held.is_none() {
            // Uncontended unless a request is passing the gate this very instant.
            *held = Some(loop {
                if let Ok(g) = self.gate.clone().try_lock_owned() {
                    break g;
                }
                std::thread::yield_now();
            });
        } else if !frozen {
            *held = None;
        }
        self.frozen.send_replace(frozen);
    }

    pub(crate) fn kill_connections(&self) {
        self.kill.send_modify(|g| *g += 1);
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    pub(crate) fn shut_down(&self) {
        self.shutdown.send_replace(true);
        self.kill_connections();
    }

    pub(crate) fn evict_hook(&self) -> Option<EvictHookArc> {
        lock(&self.evict_hook).clone()
    }

    pub(crate) fn request_hook(&self) -> Option<RequestHookArc> {
        lock(&self.request_hook).clone()
    }

    pub(crate) fn kubelet_hook(&self) -> Option<KubeletHookArc> {
        lock(&self.kubelet_hook).clone()
    }

    pub(crate) fn pod_runtime(&self) -> Option<Arc<dyn PodRuntime>> {
        lock(&self.pod_runtime).clone()
    }
}
