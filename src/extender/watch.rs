//! The Kubernetes shells: a watch of Nodes (their parsed annotations feed every verdict) and a
//! watch of the pods this scheduler profile places (their bindings fill the ledger).
//!
//! When the API server is lost the cache keeps its last view and retries with backoff;
//! the annotations in it age, and the staleness rule then decides (docs/scheduling.md), so losing
//! the API never stops the scheduler.

use super::core::{reservation_for, ExtenderPolicy};
use super::learned::LearnedNeeds;
use super::ledger::Ledger;
use super::metrics::ExtenderMetrics;
use super::nodes::{read_node, NodeState};
use super::wire::PodView;
use crate::kubeapi::{Nodes, Pods};
use crate::model::clock::Clock;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

/// Where verdicts read a node's figures.
pub trait NodeLookup: Send + Sync {
    /// What the node's annotations say; `None` when the node is not known.
    fn state(&self, node: &str) -> Option<Arc<NodeState>>;
    /// The node's annotations as they are; `None` when the node is not known.
    fn annotations(&self, node: &str) -> Option<BTreeMap<String, String>>;
    /// The same, shared: a cache hands out the one copy it holds, the same `Arc` until the
    /// Node changes (so a caller can tell a change by pointer).
    fn shared_annotations(&self, node: &str) -> Option<Arc<BTreeMap<String, String>>> {
        self.annotations(node).map(Arc::new)
    }
    /// `state` of each of `names`, in their order; a cache answers them under one lock.
    fn states(&self, names: &[String]) -> Vec<Option<Arc<NodeState>>> {
        names.iter().map(|n| self.state(n)).collect()
    }
    /// `shared_annotations` of each of `names`, in their order.
    fn shared_annotations_of(
        &self,
        names: &[String],
    ) -> Vec<Option<Arc<BTreeMap<String, String>>>> {
        names.iter().map(|n| self.shared_annotations(n)).collect()
    }
    /// Whether the view has synced once.
    fn ready(&self) -> bool;
    /// `annotations` of `node` (from a full Node object) as verdicts read them; the Lease
    /// lookup ([`super::lease_cache::LiveNodes`]) applies the node's Lease.
    fn through_lease(
        &self,
        _node: &str,
        annotations: BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        annotations
    }
}

/// One cached Node: its annotations and what they say, parsed once.
type Cached = (Arc<BTreeMap<String, String>>, Arc<NodeState>);

/// The Nodes' figures, parsed once per change of the Node (on the watch), not per call: a
/// verdict then costs a hash lookup, not a JSON parse (docs/performance.md, "Extender").
pub struct NodeCache {
    prefix: String,
    nodes: RwLock<HashMap<String, Cached>>,
    ready: AtomicBool,
}

impl NodeLookup for NodeCache {
    fn state(&self, node: &str) -> Option<Arc<NodeState>> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .map(|(_, s)| s.clone())
    }
    fn annotations(&self, node: &str) -> Option<BTreeMap<String, String>> {
        self.shared_annotations(node).map(|a| (*a).clone())
    }
    fn shared_annotations(&self, node: &str) -> Option<Arc<BTreeMap<String, String>>> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .map(|(a, _)| a.clone())
    }
    fn states(&self, names: &[String]) -> Vec<Option<Arc<NodeState>>> {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        names
            .iter()
            .map(|n| nodes.get(n).map(|(_, s)| s.clone()))
            .collect()
    }
    fn shared_annotations_of(
        &self,
        names: &[String],
    ) -> Vec<Option<Arc<BTreeMap<String, String>>>> {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        names
            .iter()
            .map(|n| nodes.get(n).map(|(a, _)| a.clone()))
            .collect()
    }
    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

impl NodeCache {
    /// An empty, unsynced cache for annotations under `prefix`.
    pub fn new(prefix: &str) -> NodeCache {
        NodeCache {
            prefix: prefix.to_string(),
            nodes: RwLock::new(HashMap::new()),
            ready: AtomicBool::new(false),
        }
    }

    fn parse(&self, node: Node) -> Option<(String, Cached)> {
        let name = node.metadata.name?;
        let ann = node.metadata.annotations.unwrap_or_default();
        let state = Arc::new(read_node(&ann, &self.prefix));
        Some((name, (Arc::new(ann), state)))
    }

    /// Applies one watch event; `staging` holds a relist until its end. Returns the node
    /// count after it.
    pub fn apply(&self, ev: Event<Node>, staging: &mut Option<HashMap<String, Cached>>) -> usize {
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        match ev {
            Event::Init => *staging = Some(HashMap::new()),
            Event::InitApply(n) => {
                if let (Some(st), Some((k, v))) = (staging.as_mut(), self.parse(n)) {
                    st.insert(k, v);
                }
            }
            Event::InitDone => {
                if let Some(st) = staging.take() {
                    *nodes = st;
                }
                if !self.ready.swap(true, Ordering::Relaxed) {
                    tracing::info!(nodes = nodes.len(), "node cache synced");
                }
            }
            Event::Apply(n) => {
                if let Some((k, v)) = self.parse(n) {
                    nodes.insert(k, v);
                }
            }
            Event::Delete(n) => {
                if let Some(name) = n.metadata.name.as_deref() {
                    nodes.remove(name);
                }
            }
        }
        nodes.len()
    }
}

/// Starts the Node watch; the cache is ready once the first list is in.
pub fn spawn_node_cache(
    client: kube::Client,
    selector: Option<&str>,
    prefix: &str,
    metrics: ExtenderMetrics,
) -> Arc<NodeCache> {
    let mut cfg = watcher::Config::default();
    if let Some(s) = selector {
        cfg = cfg.labels(s);
    }
    let cache = Arc::new(NodeCache::new(prefix));
    let c = cache.clone();
    let stream = Nodes::all(client).watched(cfg);
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        let mut failing = false;
        let mut staging = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    if failing {
                        tracing::info!("node watch restored");
                        failing = false;
                    }
                    let n = c.apply(ev, &mut staging);
                    if c.ready() {
                        metrics.ready.set(1.0);
                    }
                    metrics.nodes.set(n as i64);
                }
                Err(e) => {
                    metrics.watch_errors.inc();
                    if !failing {
                        tracing::warn!(error = %e, "node watch failing: verdicts use the last view (its annotations age into the staleness rule); retrying with backoff");
                        failing = true;
                    }
                }
            }
        }
    });
    cache
}

/// A pod of this scheduler, as the ledger sees it.
#[derive(Debug, Clone)]
pub enum PodChange {
    /// Bound to `node` at `bound_at` (its PodScheduled condition), not terminal.
    Bound {
        /// The pod.
        pod: PodView,
        /// Its node.
        node: String,
        /// When it was bound, when the condition says.
        bound_at: Option<SystemTime>,
    },
    /// Gone or finished: its reservation, if any, ends, and the pending ones on its node
    /// stop waiting for a total that counted it ([`Ledger::depart`]).
    Gone {
        /// `namespace/name`.
        key: String,
        /// The node it was bound to, when it was.
        node: Option<String>,
        /// When it was bound, when the condition says.
        bound_at: Option<SystemTime>,
    },
    /// Not bound yet: nothing to do.
    Unbound,
}

/// Reads a pod object (as the API serves it) into a ledger change.
pub fn pod_change(obj: &Value, deleted: bool) -> PodChange {
    let Ok(pod) = serde_json::from_value::<PodView>(obj.clone()) else {
        return PodChange::Unbound;
    };
    let phase = obj.pointer("/status/phase").and_then(Value::as_str);
    let node = obj.pointer("/spec/nodeName").and_then(Value::as_str);
    let bound_at = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"))
        })
        .and_then(|c| c.get("lastTransitionTime")?.as_str())
        .and_then(|t| humantime::parse_rfc3339(t).ok());
    if deleted || matches!(phase, Some("Succeeded" | "Failed")) {
        return PodChange::Gone {
            key: pod.key(),
            node: node.map(str::to_string),
            bound_at,
        };
    }
    let Some(node) = node else {
        return PodChange::Unbound;
    };
    PodChange::Bound {
        pod,
        node: node.to_string(),
        bound_at,
    }
}

/// What the ledger's feed shares with the HTTP handlers.
pub struct LedgerFeed {
    /// The policy (need rules, TTL, prefix).
    pub policy: ExtenderPolicy,
    /// The ledger.
    pub ledger: Arc<Mutex<Ledger>>,
    /// The nodes' figures.
    pub nodes: Arc<dyn NodeLookup>,
    /// Needs learned per GitLab project (swapped whole by the learning shell).
    pub learned: RwLock<Arc<LearnedNeeds>>,
    /// Whether the pod watch has listed once (until then bound pods may be missing from
    /// the ledger).
    pub pods_synced: AtomicBool,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// Metrics.
    pub metrics: ExtenderMetrics,
}

impl LedgerFeed {
    /// Applies one change to the ledger.
    pub fn apply(&self, change: PodChange) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        match change {
            PodChange::Gone {
                key,
                node,
                bound_at,
            } => {
                if ledger.depart(&key, node.as_deref(), bound_at) {
                    tracing::debug!(pod = %key, "pod gone or finished: its reservation ended, or the pending ones on its node no longer wait for its replica");
                }
            }
            PodChange::Unbound => {}
            PodChange::Bound {
                pod,
                node,
                bound_at,
            } => {
                let wall = self.clock.wall();
                // After a restart the watch lists every bound pod again: only those bound
                // within the TTL may still be unseen by their node; the others are shown
                // already, and only their need beyond their declaration is counted.
                let old = bound_at.is_some_and(|t| {
                    wall.duration_since(t).unwrap_or_default() >= self.policy.ledger_ttl
                });
                let state = self.nodes.state(&node);
                let learned = self.learned_needs();
                let now = self.clock.mono();
                let r = reservation_for(
                    &self.policy,
                    &pod,
                    &learned,
                    state.as_deref(),
                    ledger.pending_settled(&node, state.as_deref(), now),
                    now,
                    wall,
                );
                if let Some(r) = r {
                    let (mib, gpu) = (r.mib, r.gpu.clone());
                    if old {
                        if ledger.commit(&node, r) {
                            tracing::debug!(pod = %pod.key(), node = %node, mib, gpu = ?gpu, "bound before this extender: its need beyond its declaration counted until it ends");
                        }
                    } else if ledger.reserve(&node, r) {
                        tracing::info!(pod = %pod.key(), node = %node, mib, gpu = ?gpu, "reserved until the node's annotations show the pod");
                    }
                }
            }
        }
        self.metrics.reservations.set(ledger.len() as i64);
    }

    /// Swaps in a new learned table and resolves again the needs the ledger holds for the
    /// projects it has ([`Ledger::relearn`]); returns how many reservations changed.
    pub fn set_learned(&self, table: LearnedNeeds) -> usize {
        let table = Arc::new(table);
        *self.learned.write().unwrap_or_else(|e| e.into_inner()) = table.clone();
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let changed = ledger.relearn(&table);
        self.metrics.reservations.set(ledger.len() as i64);
        changed
    }

    /// The learned needs now.
    pub fn learned_needs(&self) -> Arc<LearnedNeeds> {
        self.learned
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Why a GPU pod cannot be judged yet, if it cannot.
    pub fn not_ready(&self) -> Option<&'static str> {
        if !self.nodes.ready() {
            Some("the node cache has not synced with the API server yet")
        } else if !self.pods_synced.load(Ordering::Relaxed) {
            Some("the watch of this scheduler's pods has not listed yet")
        } else {
            None
        }
    }

    /// After a relist of the watched pods: ends the reservations of pods not in it (their
    /// deletion was missed while the watch was down).
    pub fn relisted(&self, pods: &std::collections::HashSet<String>) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let n = ledger.retain_pods(pods);
        if n > 0 {
            tracing::info!(ended = n, "reservations of pods gone during a relist ended");
        }
        self.metrics.reservations.set(ledger.len() as i64);
    }

    /// Ends reservations whose TTL ran out.
    pub fn expire(&self) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let n = ledger.expire(self.clock.mono());
        if n > 0 {
            tracing::info!(expired = n, "reservations ended by TTL");
        }
        self.metrics.reservations.set(ledger.len() as i64);
    }
}

/// Starts the watch of this scheduler's pods and the ledger's TTL sweep.
pub fn spawn_pod_feed(client: kube::Client, scheduler_name: &str, feed: Arc<LedgerFeed>) {
    let cfg = watcher::Config::default().fields(&format!("spec.schedulerName={scheduler_name}"));
    let stream = Pods::all(client).watched(cfg);
    let f = feed.clone();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        let mut listed: Option<std::collections::HashSet<String>> = None;
        while let Some(ev) = stream.next().await {
            let (pod, deleted) = match ev {
                Ok(Event::Apply(p)) => (p, false),
                Ok(Event::InitApply(p)) => {
                    if let Some(l) = listed.as_mut() {
                        let m = &p.metadata;
                        l.insert(format!(
                            "{}/{}",
                            m.namespace.as_deref().unwrap_or("default"),
                            m.name.as_deref().unwrap_or_default()
                        ));
                    }
                    (p, false)
                }
                Ok(Event::Delete(p)) => (p, true),
                Ok(Event::Init) => {
                    listed = Some(Default::default());
                    continue;
                }
                Ok(Event::InitDone) => {
                    if let Some(l) = listed.take() {
                        f.relisted(&l);
                    }
                    if !f.pods_synced.swap(true, Ordering::Relaxed) {
                        tracing::info!("pod watch listed: reservations are complete");
                    }
                    continue;
                }
                Err(e) => {
                    f.metrics.watch_errors.inc();
                    tracing::warn!(error = %e, "pod watch failing: reservations end by TTL meanwhile");
                    continue;
                }
            };
            match serde_json::to_value(&pod) {
                Ok(v) => f.apply(pod_change(&v, deleted)),
                Err(e) => tracing::warn!(error = %e, "cannot read a watched pod"),
            }
        }
    });
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            feed.expire();
        }
    });
}
