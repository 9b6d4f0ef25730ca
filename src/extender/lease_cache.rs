//! The shell behind [`super::liveness`]: a reflector of the agents' Leases (in their
//! namespace, by their label) and the node lookup that judges every node through its Lease.
//!
//! Losing the API keeps the last view, as the Node reflector does: the Leases then age into
//! the staleness rule, so a lost watch never makes figures look fresher than they are.

use super::liveness::{effective, lease_name, LeaseView};
use super::metrics::ExtenderMetrics;
use super::watch::NodeLookup;
use crate::act::lease::LEASE_LABEL;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Api;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// Node annotations as the verdicts should read them: through each node's Lease.
pub struct LiveNodes {
    nodes: Arc<dyn NodeLookup>,
    leases: Store<Lease>,
    namespace: String,
    prefix: String,
    synced: Arc<AtomicBool>,
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
    fn lease(&self, node: &str) -> Option<LeaseView> {
        let key = ObjectRef::new(lease_name(node)).within(&self.namespace);
        self.leases.get(&key).map(|l| view(&l))
    }
}

impl NodeLookup for LiveNodes {
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
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let cfg = watcher::Config::default().labels(&format!("{}={}", LEASE_LABEL.0, LEASE_LABEL.1));
    let (store, writer) = reflector::store();
    let synced = Arc::new(AtomicBool::new(false));
    let live = Arc::new(LiveNodes {
        nodes,
        leases: store.clone(),
        namespace: namespace.to_string(),
        prefix: prefix.to_string(),
        synced: synced.clone(),
    });
    let waiter = store.clone();
    let ns = namespace.to_string();
    tokio::spawn(async move {
        if waiter.wait_until_ready().await.is_ok() {
            synced.store(true, Ordering::Relaxed);
            tracing::info!(leases = waiter.state().len(), namespace = %ns, "lease cache synced");
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
