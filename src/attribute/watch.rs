//! The pod watch shell: a list, then watches, of the pods on this node
//! (`fieldSelector=spec.nodeName=<node>`), folded into a [`PodMap`] and exposed as a
//! [`PodSource`].
//!
//! Health is proven, not assumed. The view is healthy from the moment a (re)list completes
//! for as long as the API server keeps showing life on the watch: an event, a bookmark, the
//! end of a watch (each asks for `timeoutSeconds` = [`WATCH_TIMEOUT_SECS`], so a healthy
//! server ends it and a new one starts at least that often) or a new watch's answer. After
//! [`STALL_BOUND`] without any of these the watch has stalled silently (an open connection
//! that carries nothing): the view is unproven, and relisted. The same happens on a watch
//! error, and at once when a fresh read elsewhere shows the view is behind
//! ([`PodSource::distrust`]). While unhealthy the guard takes no eviction decision on the
//! view (it may be missing a deletion or a priority change).
//!
//! This loop is written out rather than kube's `watcher`, which hides bookmarks and watch
//! restarts from its consumer: nothing would tell a quiet healthy node from a stalled one.

// Its deadlines bound real network I/O on tokio's timers: the API server's time, not a
// decision's (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::pods::pod_info;
use super::ports::PodSource;
use crate::model::backoff::Backoff;
use crate::model::pod::{PodMap, PodViewStatus};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client, ResourceExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{timeout_at, Instant};

/// Relist backoff after a watch error: doubling from 500 ms to at most 30 s, jittered so a
/// fleet of agents does not relist in lockstep after an API server outage (a 5-minute outage
/// costs each node at most ~25 LIST requests; see tests/e2e/outage_budget.rs).
pub const RELIST_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(30));
/// While a GPU is under memory pressure the relist backoff is capped at this: the guard
/// cannot act until the view is back, so it comes back sooner (one LIST per 2 s at most,
/// and only on nodes under pressure).
pub const URGENT_RELIST_CAP: Duration = Duration::from_secs(2);
/// `timeoutSeconds` of each watch request: a healthy API server ends the watch after this
/// and the agent starts the next one, so the stream shows life at least this often even on
/// a node where no pod changes.
pub const WATCH_TIMEOUT_SECS: u32 = 20;
/// Longest silence from the API server on the pod watch before the view counts as stalled:
/// the watch timeout plus 10 s of slack.
pub const STALL_BOUND: Duration = Duration::from_secs(WATCH_TIMEOUT_SECS as u64 + 10);
/// A watch that ends sooner than this after it started, with nothing on it, is not
/// restarted at once (a server that ends watches at once would otherwise be spun on).
const MIN_WATCH_LIFE: Duration = Duration::from_secs(1);

/// The watch's clock settings; [`WatchTiming::default`] is what the agent runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchTiming {
    /// `timeoutSeconds` of each watch request.
    pub watch_timeout_secs: u32,
    /// Longest silence before the view counts as stalled.
    pub stall_bound: Duration,
    /// Relist backoff: first pause, longest pause.
    pub relist_backoff: (Duration, Duration),
    /// Longest relist pause while a GPU is under pressure.
    pub urgent_relist_cap: Duration,
}

impl Default for WatchTiming {
    fn default() -> Self {
        WatchTiming {
            watch_timeout_secs: WATCH_TIMEOUT_SECS,
            stall_bound: STALL_BOUND,
            relist_backoff: RELIST_BACKOFF,
            urgent_relist_cap: URGENT_RELIST_CAP,
        }
    }
}

struct ViewState {
    pods: Arc<PodMap>,
    status: PodViewStatus,
}

/// What the rest of the agent tells the watch task.
#[derive(Default)]
struct Control {
    /// A reason to drop the view and relist (a fresh read disagreed with it).
    distrust: Mutex<Option<String>>,
    distrusted: Notify,
    /// A GPU is under pressure: relist sooner.
    urgent: AtomicBool,
    urgent_on: Notify,
}

impl Control {
    async fn distrusted(&self) -> String {
        loop {
            // `notify_one` stores a permit when nobody waits, so no request is lost.
            self.distrusted.notified().await;
            if let Some(r) = self
                .distrust
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                return r;
            }
        }
    }
}

/// A live view of this node's pods.
pub struct WatchedPods {
    state: Arc<Mutex<ViewState>>,
    control: Arc<Control>,
}

impl WatchedPods {
    /// Starts watching the pods bound to `node` on the current tokio runtime. Use a client
    /// without kube's built-in retry, so an outage surfaces here. The task ends when the
    /// runtime shuts down.
    pub fn spawn(client: Client, node: &str) -> Arc<WatchedPods> {
        Self::spawn_with(client, node, WatchTiming::default())
    }

    /// [`WatchedPods::spawn`] with other timing (tests shorten it).
    pub fn spawn_with(client: Client, node: &str, timing: WatchTiming) -> Arc<WatchedPods> {
        let state = Arc::new(Mutex::new(ViewState {
            pods: Arc::new(PodMap::new()),
            status: PodViewStatus {
                synced: false,
                healthy: false,
                last_error: None,
            },
        }));
        let control = Arc::new(Control::default());
        let (st, ctl) = (state.clone(), control.clone());
        let node = node.to_string();
        tokio::spawn(async move {
            let api: Api<Pod> = Api::all(client);
            let mut backoff = Backoff::new(
                timing.relist_backoff.0,
                timing.relist_backoff.1,
                crate::model::ids::fnv64(&[&node]),
            );
            loop {
                let error = watch_once(&api, &st, &node, &mut backoff, &ctl, timing).await;
                {
                    let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                    if s.status.healthy || s.status.last_error.is_none() {
                        tracing::warn!(node = %node, error = %error, "pod view unproven; relisting with backoff (evictions pause until it recovers)");
                    }
                    s.status.healthy = false;
                    s.status.last_error = Some(error);
                }
                let mut delay = backoff.next_delay();
                if ctl.urgent.load(Ordering::Relaxed) {
                    delay = delay.min(timing.urgent_relist_cap);
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = ctl.urgent_on.notified() => {}
                }
            }
        });
        Arc::new(WatchedPods { state, control })
    }
}

/// One list, then watches from its resourceVersion, until a failure, a stall or a
/// distrust; returns why the view is no longer proven.
async fn watch_once(
    api: &Api<Pod>,
    st: &Mutex<ViewState>,
    node: &str,
    backoff: &mut Backoff,
    ctl: &Control,
    timing: WatchTiming,
) -> String {
    let stall_bound = timing.stall_bound;
    let fields = format!("spec.nodeName={node}");
    let stalled = || {
        format!(
            "nothing heard from the API server on the pod watch for {} s (stalled)",
            stall_bound.as_secs_f64()
        )
    };
    // A fresh list supersedes a distrust raised while the view was already down; its
    // stored wake-up then finds no reason and is ignored.
    ctl.distrust
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let lp = ListParams::default().fields(&fields);
    let list = tokio::select! {
        r = timeout_at(Instant::now() + stall_bound, api.list(&lp)) => match r {
            Err(_) => return format!("the pod list got no answer within {} s", stall_bound.as_secs_f64()),
            Ok(Err(e)) => return format!("pod list failed: {e}"),
            Ok(Ok(list)) => list,
        },
        reason = ctl.distrusted() => return reason,
    };
    let mut rv = list.metadata.resource_version.clone().unwrap_or_default();
    let pods: PodMap = list
        .items
        .iter()
        .filter_map(pod_info)
        .map(|i| (i.uid.clone(), i))
        .collect();
    {
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
    }
    backoff.reset();
    let wp = WatchParams::default()
        .fields(&fields)
        .timeout(timing.watch_timeout_secs);
    loop {
        let started = Instant::now();
        let mut deadline = started + stall_bound;
        let stream = tokio::select! {
            r = timeout_at(deadline, api.watch(&wp, &rv)) => match r {
                Err(_) => return stalled(),
                Ok(Err(e)) => return format!("pod watch failed: {e}"),
                Ok(Ok(stream)) => stream,
            },
            reason = ctl.distrusted() => return reason,
        };
        futures::pin_mut!(stream);
        deadline = Instant::now() + stall_bound;
        let mut events = 0usize;
        loop {
            let item = tokio::select! {
                r = timeout_at(deadline, stream.next()) => match r {
                    Err(_) => return stalled(),
                    Ok(item) => item,
                },
                reason = ctl.distrusted() => return reason,
            };
            deadline = Instant::now() + stall_bound;
            events += 1;
            match item {
                // The server ended the watch (its timeout): watch again from `rv`.
                None => break,
                Some(Err(e)) => return format!("pod watch failed: {e}"),
                Some(Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod))) => {
                    if let Some(v) = pod.resource_version() {
                        rv = v;
                    }
                    if let Some(info) = pod_info(&pod) {
                        let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                        Arc::make_mut(&mut s.pods).insert(info.uid.clone(), info);
                    }
                }
                Some(Ok(WatchEvent::Deleted(pod))) => {
                    if let Some(v) = pod.resource_version() {
                        rv = v;
                    }
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                        Arc::make_mut(&mut s.pods).remove(uid);
                    }
                }
                Some(Ok(WatchEvent::Bookmark(b))) => rv = b.metadata.resource_version,
                // 410 Expired and the like: only a relist brings the view back.
                Some(Ok(WatchEvent::Error(e))) => {
                    return format!(
                        "the API server ended the pod watch: {} {}",
                        e.code, e.message
                    )
                }
            }
        }
        if events <= 1 && started.elapsed() < MIN_WATCH_LIFE {
            tokio::time::sleep(MIN_WATCH_LIFE).await;
        }
    }
}

impl PodSource for WatchedPods {
    fn distrust(&self, reason: &str) {
        *self
            .control
            .distrust
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
        self.control.distrusted.notify_one();
    }

    fn set_urgent(&self, urgent: bool) {
        let was = self.control.urgent.swap(urgent, Ordering::Relaxed);
        if urgent && !was {
            self.control.urgent_on.notify_one();
        }
    }

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
