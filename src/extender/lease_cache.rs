//! The shell behind [`super::liveness`]: a reflector of the agents' Leases (in their
//! namespace, by their label) and the node lookup that judges every node through its Lease.
//!
//! Losing the API keeps the last view, as the Node reflector does: the Leases then age into
//! the staleness rule, so a lost watch never makes figures look fresher than they are.

use super::liveness::{effective, lease_name, LeaseView};
use super::metrics::ExtenderMetrics;
use super::nodes::{read_node, NodeState};
use super::watch::NodeLookup;
use crate::act::lease::LEASE_LABEL;
use crate::kubeapi::Leases;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// One node's figures read through its Lease, with the two objects they were read from (the
/// Node cache's and the Lease reflector's `Arc`s: each update replaces them, so pointer
/// equality says nothing changed; holding them keeps their addresses from being reused).
struct Memo {
    /// The Lease's key, kept so a lookup formats no name.
    lease_ref: ObjectRef<Lease>,
    node: Arc<BTreeMap<String, String>>,
    lease: Option<Arc<Lease>>,
    state: Arc<NodeState>,
}

/// Past this many nodes' entries the memo starts over.
const MEMO_MAX_NODES: usize = 65_536;

/// Node annotations as the verdicts should read them: through each node's Lease. What they
/// say is parsed once per update of the Node or its Lease (on the first call after it), not
/// per call.
pub struct LiveNodes {
    nodes: Arc<dyn NodeLookup>,
    leases: Store<Lease>,
    namespace: String,
    prefix: String,
    synced: Arc<AtomicBool>,
    memo: RwLock<HashMap<String, Memo>>,
}

fn view(l: &Lease) -> LeaseView {
    LeaseView {
        renew_time: l
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| SystemTime::from(t.0)),
        annotations: l.metadata.annotations.clone().unwrap_or_default(),
    }
}

impl LiveNodes {
    /// `nodes` read through the Leases of `leases` (the agents' namespace), annotations
    /// under `prefix`; `synced` turns true once the Lease reflector has listed.
    pub fn new(
        nodes: Arc<dyn NodeLookup>,
        leases: Store<Lease>,
        namespace: &str,
        prefix: &str,
        synced: Arc<AtomicBool>,
    ) -> LiveNodes {
        LiveNodes {
            nodes,
            leases,
            namespace: namespace.to_string(),
            prefix: prefix.to_string(),
            synced,
            memo: RwLock::new(HashMap::new()),
        }
    }

    fn lease_ref(&self, node: &str) -> ObjectRef<Lease> {
        ObjectRef::new(lease_name(node)).within(&self.namespace)
    }

    fn lease_object(&self, node: &str) -> Option<Arc<Lease>> {
        self.leases.get(&self.lease_ref(node))
    }

    /// The memo's state for `node` when neither its Node (`ann`) nor its Lease changed.
    fn memo_hit(
        &self,
        memo: &HashMap<String, Memo>,
        node: &str,
        ann: &Arc<BTreeMap<String, String>>,
    ) -> Option<Arc<NodeState>> {
        let m = memo.get(node)?;
        let lease = self.leases.get(&m.lease_ref);
        (Arc::ptr_eq(&m.node, ann) && same(m.lease.as_ref(), lease.as_ref()))
            .then(|| m.state.clone())
    }

    fn lease(&self, node: &str) -> Option<LeaseView> {
        self.lease_object(node).map(|l| view(&l))
    }
}

fn same<T>(a: Option<&Arc<T>>, b: Option<&Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl NodeLookup for LiveNodes {
    // Through a Lease the figures change with every renewal (15 s): parsed again on the
    // first call after a change of the Node or its Lease, a pointer comparison otherwise
    // (docs/performance.md, "The extender").
    fn state(&self, node: &str) -> Option<Arc<NodeState>> {
        let ann = self.nodes.shared_annotations(node)?;
        {
            let memo = self.memo.read().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = self.memo_hit(&memo, node, &ann) {
                return Some(s);
            }
        }
        let lease_ref = self.lease_ref(node);
        let lease = self.leases.get(&lease_ref);
        let effective_ann = effective(&ann, lease.as_deref().map(view).as_ref(), &self.prefix);
        let state = Arc::new(read_node(&effective_ann, &self.prefix));
        let mut memo = self.memo.write().unwrap_or_else(|e| e.into_inner());
        // Nodes that left the cluster leave their entries behind: start over past a bound
        // (13 x the 5,000 nodes docs/performance.md measures).
        if memo.len() >= MEMO_MAX_NODES {
            memo.clear();
        }
        memo.insert(
            node.to_string(),
            Memo {
                lease_ref,
                node: ann,
                lease,
                state: state.clone(),
            },
        );
        Some(state)
    }
    // One read of the Node cache and of the memo for the whole call; only the nodes whose
    // Node or Lease changed since the last call take the parse of `state`.
    fn states(&self, names: &[String]) -> Vec<Option<Arc<NodeState>>> {
        let anns = self.nodes.shared_annotations_of(names);
        let mut out = Vec::with_capacity(names.len());
        let mut changed = Vec::new();
        {
            let memo = self.memo.read().unwrap_or_else(|e| e.into_inner());
            for (i, (name, ann)) in names.iter().zip(&anns).enumerate() {
                let hit = ann.as_ref().and_then(|a| self.memo_hit(&memo, name, a));
                if hit.is_none() && ann.is_some() {
                    changed.push(i);
                }
                out.push(hit);
            }
        }
        for i in changed {
            out[i] = self.state(&names[i]);
        }
        out
    }
    fn annotations(&self, node: &str) -> Option<BTreeMap<String, String>> {
        let a = self.nodes.annotations(node)?;
        Some(self.through_lease(node, a))
    }
    fn ready(&self) -> bool {
        self.nodes.ready() && self.synced.load(Ordering::Relaxed)
    }
    fn through_lease(
        &self,
        node: &str,
        annotations: BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        effective(&annotations, self.lease(node).as_ref(), &self.prefix)
    }
}

/// Starts the Lease reflector over `namespace` and wraps `nodes` with it.
pub fn spawn_live_nodes(
    client: kube::Client,
    namespace: &str,
    prefix: &str,
    nodes: Arc<dyn NodeLookup>,
    metrics: ExtenderMetrics,
) -> Arc<LiveNodes> {
    let cfg = watcher::Config::default().labels(&format!("{}={}", LEASE_LABEL.0, LEASE_LABEL.1));
    let (store, writer) = reflector::store();
    let synced = Arc::new(AtomicBool::new(false));
    let live = Arc::new(LiveNodes::new(
        nodes,
        store.clone(),
        namespace,
        prefix,
        synced.clone(),
    ));
    let waiter = store.clone();
    let ns = namespace.to_string();
    tokio::spawn(async move {
        if waiter.wait_until_ready().await.is_ok() {
            synced.store(true, Ordering::Relaxed);
            tracing::info!(leases = waiter.state().len(), namespace = %ns, "lease cache synced");
        }
    });
    let stream = reflector::reflector(writer, Leases::namespaced(client, namespace).watched(cfg));
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        let mut failing = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => {
                    if failing {
                        tracing::info!("lease watch restored");
                        failing = false;
                    }
                }
                Err(e) => {
                    metrics.watch_errors.inc();
                    if !failing {
                        tracing::warn!(error = %e, "lease watch failing: verdicts use the last view (the Leases age into the staleness rule); retrying with backoff");
                        failing = true;
                    }
                }
            }
        }
    });
    live
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::watch::NodeCache;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use std::time::{Duration, UNIX_EPOCH};

    const P: &str = "gpu-warden.io";
    const T0: u64 = 1_780_000_000;

    fn figures(free: u64, t: u64) -> BTreeMap<String, String> {
        let ts =
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(T0 + t)).to_string();
        let vram = format!(
            r#"{{"v":1,"observedAt":"{ts}","gpus":[{{"index":0,"uuid":"GPU-0","totalMiB":24576,"usedMiB":{},"freeMiB":{free},"pressure":"none"}}]}}"#,
            24576 - free
        );
        BTreeMap::from([
            (format!("{P}/vram"), vram),
            (format!("{P}/vram-observed-at"), ts),
        ])
    }

    fn lease(free: u64, t: u64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                namespace: Some("gpu-warden".into()),
                annotations: Some(figures(free, t)),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::from_second((T0 + t) as i64).unwrap(),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    fn free_of(s: &NodeState) -> Option<u64> {
        match s {
            NodeState::Known(v) => Some(v.gpus[0].free_mib),
            _ => None,
        }
    }

    #[test]
    fn the_figures_are_parsed_once_per_update_of_the_node_or_its_lease() {
        let cache = Arc::new(NodeCache::new(P));
        let node = |free| Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                annotations: Some(figures(free, 0)),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        cache.apply(watcher::Event::Apply(node(1000)), &mut None);
        let (store, mut writer) = reflector::store::<Lease>();
        let live = LiveNodes::new(
            cache.clone(),
            store,
            "gpu-warden",
            P,
            Arc::new(AtomicBool::new(true)),
        );
        // No Lease: the Node's figures, parsed once.
        let a = live.state("n1").unwrap();
        assert_eq!(free_of(&a), Some(1000));
        assert!(
            Arc::ptr_eq(&a, &live.state("n1").unwrap()),
            "not parsed again"
        );
        // A Lease with newer figures: read through it, once.
        writer.apply_watcher_event(&watcher::Event::Apply(lease(2000, 15)));
        let b = live.state("n1").unwrap();
        assert_eq!(free_of(&b), Some(2000));
        assert!(Arc::ptr_eq(&b, &live.state("n1").unwrap()));
        // A renewal (same figures, a later renewTime) is an update: parsed again.
        writer.apply_watcher_event(&watcher::Event::Apply(lease(2000, 30)));
        let c = live.state("n1").unwrap();
        assert!(!Arc::ptr_eq(&b, &c));
        assert_eq!(free_of(&c), Some(2000));
        // So is a change of the Node.
        cache.apply(watcher::Event::Apply(node(3000)), &mut None);
        let d = live.state("n1").unwrap();
        assert!(!Arc::ptr_eq(&c, &d));
        assert!(Arc::ptr_eq(&d, &live.state("n1").unwrap()));
        assert!(live.state("n2").is_none(), "an unknown node");
    }
}
