//! The pod watch shell: a kube-rs watcher of the pods on this node
//! (`fieldSelector=spec.nodeName=<node>`), folded into a [`PodMap`] and exposed as a
//! [`PodSource`].
//!
//! Health is exact: the view is healthy from the moment a (re)list completes until the next
//! watch error. After an error the watcher stream is dropped and, after a jittered backoff,
//! a fresh one relists — kube's own watcher would silently resume from the last
//! resourceVersion and yield nothing to say it is connected again. While unhealthy the
//! guard takes no eviction decision on the view (it may be missing a deletion or a
//! priority change).

use super::pods::{pod_info, PodMap, PodSource, PodViewStatus};
use crate::backoff::Backoff;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Relist backoff after a watch error: doubling from 500 ms to at most 30 s, jittered so a
/// fleet of agents does not relist in lockstep after an API server outage (a 5-minute outage
/// costs each node at most ~25 LIST requests; see tests/outage_budget.rs).
pub const RELIST_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(30));

struct ViewState {
    pods: Arc<PodMap>,
    status: PodViewStatus,
}

/// A live view of this node's pods.
pub struct WatchedPods {
    state: Arc<Mutex<ViewState>>,
}

impl WatchedPods {
    /// Starts watching the pods bound to `node` on the current tokio runtime. Use a client
    /// without kube's built-in retry, so an outage surfaces here. The task ends when the
    /// runtime shuts down.
    pub fn spawn(client: Client, node: &str) -> Arc<WatchedPods> {
        let state = Arc::new(Mutex::new(ViewState {
            pods: Arc::new(PodMap::new()),
            status: PodViewStatus {
                synced: false,
                healthy: false,
                last_error: None,
            },
        }));
        let st = state.clone();
        let node = node.to_string();
        tokio::spawn(async move {
            let api: Api<Pod> = Api::all(client);
            let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
            let mut backoff = Backoff::new(
                RELIST_BACKOFF.0,
                RELIST_BACKOFF.1,
                crate::sample::sim::fnv64(&[&node]),
            );
            loop {
                let error = watch_once(&api, &config, &st, &node, &mut backoff).await;
                {
                    let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                    if s.status.healthy || s.status.last_error.is_none() {
                        tracing::warn!(node = %node, error = %error, "pod watch failed; relisting with backoff (evictions pause until it recovers)");
                    }
                    s.status.healthy = false;
                    s.status.last_error = Some(error);
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        });
        Arc::new(WatchedPods { state })
    }
}

/// Runs one watcher stream (list, then watch) until it fails; returns the error.
async fn watch_once(
    api: &Api<Pod>,
    config: &watcher::Config,
    st: &Mutex<ViewState>,
    node: &str,
    backoff: &mut Backoff,
) -> String {
    let stream = watcher(api.clone(), config.clone());
    futures::pin_mut!(stream);
    let mut buffer: Option<PodMap> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => buffer = Some(PodMap::new()),
            Ok(watcher::Event::InitApply(pod)) => {
                if let (Some(b), Some(info)) = (buffer.as_mut(), pod_info(&pod)) {
                    b.insert(info.uid.clone(), info);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let pods = buffer.take().unwrap_or_default();
                let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                if !s.status.synced {
                    tracing::info!(node = %node, pods = pods.len(), "pod view synced");
                } else if !s.status.healthy {
                    tracing::info!(node = %node, pods = pods.len(), "pod watch recovered");
                }
                s.pods = Arc::new(pods);
                s.status = PodViewStatus {
                    synced: true,
                    healthy: true,
                    last_error: None,
                };
                backoff.reset();
            }
            Ok(watcher::Event::Apply(pod)) => {
                if let Some(info) = pod_info(&pod) {
                    let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                    Arc::make_mut(&mut s.pods).insert(info.uid.clone(), info);
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                    Arc::make_mut(&mut s.pods).remove(uid);
                }
            }
            Err(e) => return e.to_string(),
        }
    }
    "the watch stream ended".to_string()
}

impl PodSource for WatchedPods {
    fn pods(&self) -> Arc<PodMap> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .clone()
    }

    fn status(&self) -> PodViewStatus {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .status
            .clone()
    }
}
