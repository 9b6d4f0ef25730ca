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
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Backoff after a watch error: doubling from 500 ms to at most 10 s, each wait drawn from
/// [base/2, base] so that a fleet of agents does not relist in lockstep after an outage.
#[derive(Debug, Clone)]
pub struct RelistBackoff {
    base: Duration,
    seed: u64,
}

impl RelistBackoff {
    const START: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(10);

    /// A backoff whose jitter is seeded by `seed` (e.g. the node name's hash).
    pub fn new(seed: u64) -> Self {
        RelistBackoff {
            base: Self::START,
            // xorshift's only fixed point is zero.
            seed: if seed == 0 {
                0x9e37_79b9_7f4a_7c15
            } else {
                seed
            },
        }
    }

    /// The next wait.
    pub fn next_wait(&mut self) -> Duration {
        // xorshift64: jitter needs no cryptographic randomness and no extra dependency.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let base = self.base;
        self.base = (self.base * 2).min(Self::MAX);
        let half = base / 2;
        half + Duration::from_nanos(self.seed % (half.as_nanos() as u64 + 1))
    }

    /// Back to the start after a success.
    pub fn reset(&mut self) {
        self.base = Self::START;
    }
}

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
            let mut backoff = RelistBackoff::new(crate::sample::sim::fnv64(&[&node]));
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
                tokio::time::sleep(backoff.next_wait()).await;
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
    backoff: &mut RelistBackoff,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_resets() {
        let mut b = RelistBackoff::new(42);
        let waits: Vec<Duration> = (0..8).map(|_| b.next_wait()).collect();
        assert!(waits[0] >= Duration::from_millis(250) && waits[0] <= Duration::from_millis(500));
        assert!(waits[7] >= Duration::from_secs(5) && waits[7] <= Duration::from_secs(10));
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(500));
        let mut other = RelistBackoff::new(43);
        let theirs: Vec<Duration> = (0..8).map(|_| other.next_wait()).collect();
        assert_ne!(waits, theirs, "jitter differs between agents");
    }
}
