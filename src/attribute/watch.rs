//! The pod watch shell: a kube-rs reflector of the pods on this node
//! (`fieldSelector=spec.nodeName=<node>`), exposed as a [`PodSource`]. The watcher relists
//! after a dropped watch or an expired resourceVersion and backs off on errors; while it
//! is unhealthy the view reports so, and the guard takes no eviction decision on it.

use super::pods::{index, PodMap, PodSource, PodViewStatus};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A live view of this node's pods.
pub struct WatchedPods {
    store: Store<Pod>,
    status: Arc<Mutex<PodViewStatus>>,
    generation: Arc<AtomicU64>,
    cache: Mutex<(u64, Arc<PodMap>)>,
}

impl WatchedPods {
    /// Starts watching the pods bound to `node` on the current tokio runtime. The task
    /// ends when the runtime shuts down.
    pub fn spawn(client: Client, node: &str) -> Arc<WatchedPods> {
        let api: Api<Pod> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let status = Arc::new(Mutex::new(PodViewStatus {
            synced: false,
            healthy: false,
            last_error: None,
        }));
        let generation = Arc::new(AtomicU64::new(1));
        let (st, gen) = (status.clone(), generation.clone());
        let node = node.to_string();
        tokio::spawn(async move {
            let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    Ok(ev) => {
                        if matches!(ev, watcher::Event::InitDone) && !s.synced {
                            tracing::info!(node = %node, "pod view synced");
                        }
                        if matches!(ev, watcher::Event::InitDone) {
                            s.synced = true;
                        }
                        if !s.healthy && s.synced {
                            if s.last_error.is_some() {
                                tracing::info!(node = %node, "pod watch recovered");
                            }
                            s.healthy = true;
                            s.last_error = None;
                        }
                        gen.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        if s.healthy || s.last_error.is_none() {
                            tracing::warn!(node = %node, error = %e, "pod watch failed; retrying with backoff (evictions pause until it recovers)");
                        }
                        s.healthy = false;
                        s.last_error = Some(e.to_string());
                    }
                }
            }
        });
        Arc::new(WatchedPods {
            store,
            status,
            generation,
            cache: Mutex::new((0, Arc::new(PodMap::new()))),
        })
    }
}

impl PodSource for WatchedPods {
    fn pods(&self) -> Arc<PodMap> {
        let gen = self.generation.load(Ordering::Relaxed);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.0 != gen {
            let pods = self.store.state();
            *cache = (gen, Arc::new(index(pods.iter().map(|p| p.as_ref()))));
        }
        cache.1.clone()
    }

    fn status(&self) -> PodViewStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
