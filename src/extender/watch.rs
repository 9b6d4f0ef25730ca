//! The Kubernetes shells: a reflector of Nodes (their annotations feed every verdict) and a
//! watch of the pods this scheduler profile places (their bindings fill the ledger).
//!
//! When the API server is lost the reflector keeps its last view and retries with backoff;
//! the annotations in it age, and the staleness rule then decides (docs/scheduling.md), so losing
//! the API never stops the scheduler.

use super::core::{reservation_for, ExtenderPolicy};
use super::ledger::Ledger;
use super::metrics::ExtenderMetrics;
use super::wire::PodView;
use crate::model::clock::Clock;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Where verdicts read a node's annotations.
pub trait NodeLookup: Send + Sync {
    /// The node's annotations; `None` when the node is not known.
    fn annotations(&self, node: &str) -> Option<BTreeMap<String, String>>;
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

/// The reflector's store.
pub struct NodeCache {
    store: Store<Node>,
    ready: Arc<AtomicBool>,
}

impl NodeLookup for NodeCache {
    fn annotations(&self, node: &str) -> Option<BTreeMap<String, String>> {
        let n = self.store.get(&ObjectRef::new(node))?;
        Some(n.metadata.annotations.clone().unwrap_or_default())
    }
    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// Starts the Node reflector; the cache is ready once the first list is in.
pub fn spawn_node_cache(
    client: kube::Client,
    selector: Option<&str>,
    metrics: ExtenderMetrics,
) -> Arc<NodeCache> {
    let api: Api<Node> = Api::all(client);
    let mut cfg = watcher::Config::default();
    if let Some(s) = selector {
        cfg = cfg.labels(s);
    }
    let (store, writer) = reflector::store();
    let ready = Arc::new(AtomicBool::new(false));
    let cache = Arc::new(NodeCache {
        store: store.clone(),
        ready: ready.clone(),
    });
    let waiter = store.clone();
    let (flag, gauge) = (ready.clone(), metrics.ready.clone());
    tokio::spawn(async move {
        if waiter.wait_until_ready().await.is_ok() {
            flag.store(true, Ordering::Relaxed);
            gauge.set(1.0);
            tracing::info!(nodes = waiter.state().len(), "node cache synced");
        }
    });
    let stream = reflector::reflector(writer, watcher::watcher(api, cfg)).default_backoff();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        let mut failing = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => {
                    if failing {
                        tracing::info!("node watch restored");
                        failing = false;
                    }
                    metrics.nodes.set(store.state().len() as i64);
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
    /// Gone or finished: its reservation, if any, ends.
    Gone(String),
    /// Not bound yet: nothing to do.
    Unbound,
}

/// Reads a pod object (as the API serves it) into a ledger change.
pub fn pod_change(obj: &Value, deleted: bool) -> PodChange {
    let Ok(pod) = serde_json::from_value::<PodView>(obj.clone()) else {
        return PodChange::Unbound;
    };
    let phase = obj.pointer("/status/phase").and_then(Value::as_str);
    if deleted || matches!(phase, Some("Succeeded" | "Failed")) {
        return PodChange::Gone(pod.key());
    }
    let Some(node) = obj.pointer("/spec/nodeName").and_then(Value::as_str) else {
        return PodChange::Unbound;
    };
    let bound_at = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"))
        })
        .and_then(|c| c.get("lastTransitionTime")?.as_str())
        .and_then(|t| humantime::parse_rfc3339(t).ok());
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
    /// The node annotations.
    pub nodes: Arc<dyn NodeLookup>,
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
            PodChange::Gone(key) => {
                if ledger.forget(&key) {
                    tracing::debug!(pod = %key, "reservation ended: pod gone or finished");
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
                // within the TTL may still be unseen by their node.
                if let Some(t) = bound_at {
                    if wall.duration_since(t).unwrap_or_default() >= self.policy.ledger_ttl {
                        return;
                    }
                }
                let ann = self.nodes.annotations(&node);
                let r = reservation_for(
                    &self.policy,
                    &pod,
                    ann.as_ref(),
                    ledger.pending(&node),
                    self.clock.mono(),
                    wall,
                );
                if let Some(r) = r {
                    let (mib, gpu) = (r.mib, r.gpu.clone());
                    if ledger.reserve(&node, r) {
                        tracing::info!(pod = %pod.key(), node = %node, mib, gpu = ?gpu, "reserved until the node's annotations show the pod");
                    }
                }
            }
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
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.schedulerName={scheduler_name}"));
    let stream = watcher::watcher(api, cfg).default_backoff();
    let f = feed.clone();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            let (pod, deleted) = match ev {
                Ok(Event::Apply(p) | Event::InitApply(p)) => (p, false),
                Ok(Event::Delete(p)) => (p, true),
                Ok(Event::Init | Event::InitDone) => continue,
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
