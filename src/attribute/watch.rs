//! The pod watch shell: a list, then watches, of the pods on this node
//! (`fieldSelector=spec.nodeName=<node>`), folded into a [`PodMap`] and exposed as a
//! [`PodSource`].
//!
//! Health is proven, not assumed ([`PodViewStatus`] says what proves the view). A LIST that
//! answers proves it as of when it was sent; then the watch proves it on every event and
//! every bookmark whose resourceVersion moved past the last one. The end of a watch (each
//! asks for `timeoutSeconds` = [`WATCH_TIMEOUT_SECS`]) and a bookmark that repeats the last
//! resourceVersion prove nothing: a kube-apiserver whose etcd stalls still sends both from
//! its watch cache. A watch that ends without having proven anything is followed by a
//! LIST, which needs storage, so a quiet cluster whose resourceVersion stands still stays
//! proven at the cost of one LIST per watch. A proof lasts [`view_bounds::proof_lifetime`]: the stall bound, stretched to the
//! request timeout while the server is slow. After [`STALL_BOUND`] without any sign of life
//! the watch has stalled silently (an open connection that carries nothing): the view is
//! unproven, and relisted. The same happens on a failure of the server, and at once when a
//! fresh read elsewhere shows the view is behind ([`PodSource::distrust`]). While unproven
//! the guard takes no eviction decision on the view (it may be missing a deletion or a
//! priority change).
//!
//! Three bounds keep a working but awkward server from switching the guard off or from
//! keeping a stale view proven (issue 30):
//! - a watch answered `410 Expired` relists with its own backoff ([`EXPIRED_BACKOFF_CAP`])
//!   that only a watch that works resets, and the view stays proven by each LIST meanwhile;
//! - LIST and watch requests wait [`view_bounds::RequestBounds::timeout`]: four times the
//!   slowest of the last few requests of the same kind, between the stall bound and
//!   [`REQUEST_TIMEOUT_MAX`];
//! - the view is relisted every [`RELIST_EVERY`] ([`URGENT_RELIST_EVERY`] while a GPU is
//!   under pressure), so a watch that keeps sending bookmarks but loses events keeps the
//!   view at most that far behind.
//!
//! This loop is written out rather than kube's `watcher`, which hides bookmarks and watch
//! restarts from its consumer: nothing would tell a quiet healthy node from a stalled one.

// Its deadlines bound real network I/O on tokio's timers: the API server's time, not a
// decision's (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::pods::pod_info;
use super::ports::PodSource;
use super::view_bounds::{self, ApiLatency, RequestBounds};
use crate::kubeapi::Pods;
use crate::model::backoff::Backoff;
use crate::model::pod::{PodMap, PodViewStatus};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{timeout_at, Instant};

/// Relist backoff after a failure of the server: doubling from 500 ms to at most 30 s,
/// jittered so a fleet of agents does not relist in lockstep after an API server outage (a
/// 5-minute outage costs each node at most ~25 LIST requests; see tests/e2e/outage_budget.rs).
/// Only a watch that works (an event, a bookmark, a watch that lived to its end) resets it:
/// a good LIST alone does not, or a server whose LISTs work and watches fail is spun on.
pub const RELIST_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(30));
/// Longest relist pause in a loop of watches answered `410 Expired` (the pause doubles from
/// [`RELIST_BACKOFF`]'s first one up to this). Short enough that each LIST proves the view
/// again well within the stall bound, so the guard can act on the listed view: a 410 loop
/// costs one LIST and one watch per 4–8 s, not the ~2.5 per second of a backoff that resets.
pub const EXPIRED_BACKOFF_CAP: Duration = Duration::from_secs(8);
/// While a GPU is under memory pressure the relist backoff is capped at this: the guard
/// cannot act until the view is back, so it comes back sooner (one LIST per 2 s at most,
/// and only on nodes under pressure).
pub const URGENT_RELIST_CAP: Duration = Duration::from_secs(2);
/// `timeoutSeconds` of each watch request: a healthy API server ends the watch after this
/// and the agent starts the next one, so the stream shows life at least this often even on
/// a node where no pod changes.
pub const WATCH_TIMEOUT_SECS: u32 = 20;
/// Longest silence from the API server on the pod watch before the view counts as stalled:
/// the watch timeout plus 10 s of slack. Also the shortest timeout of a LIST or watch request.
pub const STALL_BOUND: Duration = Duration::from_secs(WATCH_TIMEOUT_SECS as u64 + 10);
/// The longest a LIST or a watch request may take, however slow the server has been (and
/// what the first LIST, with nothing measured yet, waits): beyond kube-apiserver's default
/// `--request-timeout` of 60 s, so a server that gives up on a LIST says so (504) first.
pub const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(90);
/// The view is relisted at least this often (jittered down by up to a quarter), from the
/// last LIST's answer: a watch that shows life (bookmarks) but loses events cannot keep the
/// view further behind than this. One LIST of the node's pods per node per ~5 minutes: at
/// 5,000 nodes ~17 LISTs/s, each a field-selected LIST of one node's pods.
pub const RELIST_EVERY: Duration = Duration::from_secs(300);
/// [`RELIST_EVERY`] while a GPU is under memory pressure (only such nodes pay for it): the
/// view the guard decides on is never more than this behind a watch that loses events.
pub const URGENT_RELIST_EVERY: Duration = Duration::from_secs(30);
/// A watch that ends sooner than this after it started, with nothing on it, is not
/// restarted at once (a server that ends watches at once would otherwise be spun on).
const MIN_WATCH_LIFE: Duration = Duration::from_secs(1);

/// The watch's clock settings; [`WatchTiming::default`] is what the agent runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchTiming {
    /// `timeoutSeconds` of each watch request.
    pub watch_timeout_secs: u32,
    /// Longest silence before the view counts as stalled; the shortest request timeout.
    pub stall_bound: Duration,
    /// Relist backoff after a failure: first pause, longest pause.
    pub relist_backoff: (Duration, Duration),
    /// Longest relist pause after watches answered 410 Expired.
    pub expired_backoff_cap: Duration,
    /// Longest relist pause while a GPU is under pressure.
    pub urgent_relist_cap: Duration,
    /// Longest LIST or watch request timeout.
    pub request_timeout_max: Duration,
    /// Period of the relist that bounds a watch losing events.
    pub relist_every: Duration,
    /// That period while a GPU is under pressure.
    pub urgent_relist_every: Duration,
}

impl Default for WatchTiming {
    fn default() -> Self {
        WatchTiming {
            watch_timeout_secs: WATCH_TIMEOUT_SECS,
            stall_bound: STALL_BOUND,
            relist_backoff: RELIST_BACKOFF,
            expired_backoff_cap: EXPIRED_BACKOFF_CAP,
            urgent_relist_cap: URGENT_RELIST_CAP,
            request_timeout_max: REQUEST_TIMEOUT_MAX,
            relist_every: RELIST_EVERY,
            urgent_relist_every: URGENT_RELIST_EVERY,
        }
    }
}

impl WatchTiming {
    fn request_bounds(&self) -> RequestBounds {
        RequestBounds {
            floor: self.stall_bound,
            ceiling: self.request_timeout_max,
        }
    }
}

struct ViewState {
    pods: Arc<PodMap>,
    synced: bool,
    /// When the server last proved the view current; `None` once a failure or a distrust
    /// dropped the proof.
    proven_at: Option<Instant>,
    /// How long a proof lasts now (it follows the server's latency).
    proof_lifetime: Duration,
    /// When the last proof arrived (see `PodViewStatus::heard_ago`).
    heard_at: Option<Instant>,
    resource_version: Option<String>,
    last_error: Option<String>,
    latency: Option<Duration>,
}

impl ViewState {
    fn status(&self) -> PodViewStatus {
        let proven_ago = self.proven_at.map(|t| t.elapsed());
        PodViewStatus {
            synced: self.synced,
            healthy: self.synced && proven_ago.is_some_and(|a| a <= self.proof_lifetime),
            last_error: self.last_error.clone(),
            proven_ago,
            heard_ago: self.heard_at.map(|t| t.elapsed()),
            resource_version: self.resource_version.clone(),
            api_latency: self.latency,
        }
    }
}

fn lock(st: &Mutex<ViewState>) -> MutexGuard<'_, ViewState> {
    st.lock().unwrap_or_else(|e| e.into_inner())
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

    fn is_urgent(&self) -> bool {
        self.urgent.load(Ordering::Relaxed)
    }

    /// Returns when the periodic relist is due: `jittered` of the current period after the
    /// last LIST answered (the period shortens as soon as a GPU comes under pressure).
    async fn relist_due(&self, timing: &WatchTiming, listed_at: Instant, jitter: (u64, u64)) {
        loop {
            let period = if self.is_urgent() {
                timing.urgent_relist_every
            } else {
                timing.relist_every
            };
            let at = listed_at + view_bounds::jittered(period, jitter.0, jitter.1);
            tokio::select! {
                () = tokio::time::sleep_until(at) => return,
                () = self.urgent_on.notified() => {}
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
        let bounds = timing.request_bounds();
        let state = Arc::new(Mutex::new(ViewState {
            pods: Arc::new(PodMap::new()),
            synced: false,
            proven_at: None,
            heard_at: None,
            proof_lifetime: view_bounds::proof_lifetime(
                timing.stall_bound,
                bounds.timeout(&ApiLatency::default()),
            ),
            resource_version: None,
            last_error: None,
            latency: None,
        }));
        let control = Arc::new(Control::default());
        let seed = crate::model::ids::fnv64(&[node]);
        let watcher = Watcher {
            api: Pods::all(client),
            st: state.clone(),
            ctl: control.clone(),
            node: node.to_string(),
            timing,
            bounds,
            list_latency: ApiLatency::default(),
            watch_latency: ApiLatency::default(),
            failures: Backoff::new(timing.relist_backoff.0, timing.relist_backoff.1, seed),
            expiries: Backoff::new(
                timing.relist_backoff.0,
                timing.expired_backoff_cap,
                seed.rotate_left(17),
            ),
            lists: 0,
            seed,
        };
        tokio::spawn(watcher.run());
        Arc::new(WatchedPods { state, control })
    }
}

/// Why a list-and-watch ended.
enum Ended {
    /// The periodic relist is due, or a watch ended without proving anything; the view
    /// stays as proven as its last proof meanwhile.
    Refresh,
    /// The server answered that it cannot resume the watch (410 Expired): relist after the
    /// expiry backoff; the view stays as proven as its last proof.
    Expired(String),
    /// The server failed or stalled: unproven at once, relisted after the failure backoff.
    Failed(String),
    /// A fresh read elsewhere disagreed with the view: unproven at once, relisted after the
    /// shortest pause (the server works; the guard's fresh reads, one per decision, bound
    /// how often this happens).
    Distrusted(String),
}

/// The watch task's own state.
struct Watcher {
    api: Pods,
    st: Arc<Mutex<ViewState>>,
    ctl: Arc<Control>,
    node: String,
    timing: WatchTiming,
    bounds: RequestBounds,
    /// How long LISTs take, and watch requests take to be answered: apart, as a LIST of
    /// many pods can be slow where starting a watch is not.
    list_latency: ApiLatency,
    watch_latency: ApiLatency,
    /// Backoff after failures of the server.
    failures: Backoff,
    /// Backoff after watches answered 410.
    expiries: Backoff,
    /// LISTs answered so far (draws each relist period's jitter).
    lists: u64,
    seed: u64,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A watch that did not start: 410 is an expiry, anything else a failure.
fn watch_refused(e: kube::Error) -> Ended {
    match &e {
        kube::Error::Api(ae) if ae.code == 410 => Ended::Expired(format!(
            "the API server ended the pod watch: {} {}",
            ae.code, ae.message
        )),
        _ => Ended::Failed(format!("pod watch failed: {e}")),
    }
}

impl Watcher {
    async fn run(mut self) {
        loop {
            let delay = match self.list_and_watch().await {
                Ended::Refresh => continue,
                Ended::Expired(why) => {
                    let mut s = lock(&self.st);
                    if s.last_error.is_none() {
                        tracing::warn!(node = %self.node, error = %why, "pod watch expired; relisting with backoff (the view stays proven by each LIST)");
                    }
                    s.last_error = Some(why);
                    drop(s);
                    self.expiries.next_delay()
                }
                Ended::Failed(why) => {
                    self.unprove(why, "pod view unproven; relisting with backoff (evictions pause until it recovers)");
                    self.failures.next_delay()
                }
                Ended::Distrusted(why) => {
                    self.unprove(why, "pod view distrusted; relisting");
                    self.timing.relist_backoff.0 / 2
                }
            };
            let delay = if self.ctl.is_urgent() {
                delay.min(self.timing.urgent_relist_cap)
            } else {
                delay
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.ctl.urgent_on.notified() => {}
            }
        }
    }

    /// Drops the proof, saying `what` (once per spell) and why.
    fn unprove(&self, why: String, what: &str) {
        let mut s = lock(&self.st);
        if s.proven_at.is_some() || s.last_error.is_none() {
            tracing::warn!(node = %self.node, error = %why, "{what}");
        }
        s.proven_at = None;
        s.last_error = Some(why);
    }

    /// Records how long the server took to answer a LIST (`list`) or a watch request (or
    /// how long one was waited for in vain).
    fn measured(&mut self, list: bool, took: Duration) {
        if list {
            self.list_latency.observe(took);
        } else {
            self.watch_latency.observe(took);
        }
        // A proof lasts as long as the slowest kind of request may take, once measured.
        let slowest = [&self.list_latency, &self.watch_latency]
            .into_iter()
            .filter(|l| l.slowest().is_some())
            .map(|l| self.bounds.timeout(l))
            .max()
            .unwrap_or(self.timing.stall_bound);
        let lifetime = view_bounds::proof_lifetime(self.timing.stall_bound, slowest);
        let mut s = lock(&self.st);
        s.latency = self
            .list_latency
            .slowest()
            .max(self.watch_latency.slowest());
        s.proof_lifetime = lifetime;
    }

    /// The server showed the view current at `rv` now.
    fn prove(&self, rv: &str) {
        let mut s = lock(&self.st);
        let now = Instant::now();
        s.proven_at = Some(now);
        s.heard_at = Some(now);
        s.resource_version = Some(rv.to_string());
    }

    /// A watch delivered something: the server works, its failures are forgotten.
    fn watch_worked(&mut self) {
        self.failures.reset();
        self.expiries.reset();
        let mut s = lock(&self.st);
        if let Some(was) = s.last_error.take() {
            tracing::info!(node = %self.node, was = %was, "pod watch working again");
        }
    }

    /// One list, then watches from its resourceVersion, until a failure, a stall, a
    /// distrust, an expiry or the periodic relist.
    async fn list_and_watch(&mut self) -> Ended {
        let (api, ctl, timing) = (self.api.clone(), self.ctl.clone(), self.timing);
        let fields = format!("spec.nodeName={}", self.node);
        // A fresh list supersedes a distrust raised while the view was already down; its
        // stored wake-up then finds no reason and is ignored.
        ctl.distrust
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let lp = ListParams::default().fields(&fields);
        let timeout = self.bounds.timeout(&self.list_latency);
        let sent = Instant::now();
        let answer = tokio::select! {
            r = timeout_at(sent + timeout, api.list(&lp)) => r,
            reason = ctl.distrusted() => return Ended::Distrusted(reason),
        };
        let list = match answer {
            Err(_) => {
                self.measured(true, timeout);
                return Ended::Failed(format!(
                    "the pod list got no answer within {} s",
                    secs(timeout)
                ));
            }
            Ok(Err(e)) => return Ended::Failed(format!("pod list failed: {e}")),
            Ok(Ok(list)) => list,
        };
        let listed_at = Instant::now();
        self.measured(true, listed_at - sent);
        let mut rv = list.metadata.resource_version.clone().unwrap_or_default();
        let pods: PodMap = list
            .items
            .iter()
            .filter_map(pod_info)
            .map(|i| (i.uid.clone(), i))
            .collect();
        {
            let mut s = lock(&self.st);
            if !s.synced {
                tracing::info!(node = %self.node, pods = pods.len(), took_s = secs(listed_at - sent), "pod view synced");
            } else if s.proven_at.is_none() {
                tracing::info!(node = %self.node, pods = pods.len(), "pod view proven again by a LIST");
            }
            s.pods = Arc::new(pods);
            s.synced = true;
            // The LIST shows the pods as they were at some moment after it was sent.
            s.proven_at = Some(sent);
            s.heard_at = Some(listed_at);
            s.resource_version = Some(rv.clone());
        }
        self.lists += 1;
        let jitter = (self.seed, self.lists);
        let wp = WatchParams::default()
            .fields(&fields)
            .timeout(timing.watch_timeout_secs);
        let stalled = || {
            Ended::Failed(format!(
                "nothing heard from the API server on the pod watch for {} s (stalled)",
                secs(timing.stall_bound)
            ))
        };
        loop {
            let timeout = self.bounds.timeout(&self.watch_latency);
            let started = Instant::now();
            let opened = tokio::select! {
                r = timeout_at(started + timeout, api.watch(&wp, &rv)) => r,
                reason = ctl.distrusted() => return Ended::Distrusted(reason),
                () = ctl.relist_due(&timing, listed_at, jitter) => return Ended::Refresh,
            };
            let stream = match opened {
                Err(_) => {
                    self.measured(false, timeout);
                    return Ended::Failed(format!(
                        "the pod watch request got no answer within {} s",
                        secs(timeout)
                    ));
                }
                Ok(Err(e)) => return watch_refused(e),
                Ok(Ok(stream)) => stream,
            };
            self.measured(false, started.elapsed());
            futures::pin_mut!(stream);
            let mut deadline = Instant::now() + timing.stall_bound;
            let mut worked = false;
            // Whether this watch proved the view (an event, or a bookmark that moved the
            // resourceVersion on).
            let mut proved = false;
            loop {
                let next = tokio::select! {
                    r = timeout_at(deadline, stream.next()) => r,
                    reason = ctl.distrusted() => return Ended::Distrusted(reason),
                    () = ctl.relist_due(&timing, listed_at, jitter) => return Ended::Refresh,
                };
                let Ok(item) = next else {
                    return stalled();
                };
                deadline = Instant::now() + timing.stall_bound;
                let event = match item {
                    // The server ended the watch (its timeout): watch again from `rv`. The
                    // end proves nothing: a kube-apiserver whose etcd stalls still ends
                    // watches at their timeout from its watch cache (`storage/cacher`).
                    None => {
                        if !worked && started.elapsed() >= MIN_WATCH_LIFE {
                            worked = true;
                            self.watch_worked();
                        }
                        break;
                    }
                    Some(Err(e)) => return Ended::Failed(format!("pod watch failed: {e}")),
                    // 410 Expired: only a relist brings the view back; the server works.
                    Some(Ok(WatchEvent::Error(e))) => {
                        let why = format!(
                            "the API server ended the pod watch: {} {}",
                            e.code, e.message
                        );
                        return if e.code == 410 {
                            Ended::Expired(why)
                        } else {
                            Ended::Failed(why)
                        };
                    }
                    Some(Ok(event)) => event,
                };
                // A bookmark proves the view only if its resourceVersion moved on: one
                // that repeats the last is what a watch cache over a stalled etcd sends.
                let bookmark = matches!(event, WatchEvent::Bookmark(_));
                let before = bookmark.then(|| rv.clone());
                self.apply(event, &mut rv);
                if before.as_ref() != Some(&rv) {
                    self.prove(&rv);
                    proved = true;
                }
                if !worked {
                    worked = true;
                    self.watch_worked();
                }
            }
            if !worked && started.elapsed() < MIN_WATCH_LIFE {
                tokio::time::sleep(MIN_WATCH_LIFE).await;
            }
            if !proved {
                // A whole watch without a proof: a cluster so quiet that its
                // resourceVersion did not move, or a stalled storage. A LIST tells them
                // apart (it needs storage): at most one per watch timeout, and only while
                // the resourceVersion stands still.
                return Ended::Refresh;
            }
        }
    }

    /// Folds one watch event into the view and moves `rv` on.
    fn apply(&self, event: WatchEvent<Pod>, rv: &mut String) {
        match event {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                if let Some(v) = pod.resource_version() {
                    *rv = v;
                }
                if let Some(info) = pod_info(&pod) {
                    let mut s = lock(&self.st);
                    Arc::make_mut(&mut s.pods).insert(info.uid.clone(), info);
                }
            }
            WatchEvent::Deleted(pod) => {
                if let Some(v) = pod.resource_version() {
                    *rv = v;
                }
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    let mut s = lock(&self.st);
                    Arc::make_mut(&mut s.pods).remove(uid);
                }
            }
            WatchEvent::Bookmark(b) => *rv = b.metadata.resource_version,
            WatchEvent::Error(_) => {}
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
        lock(&self.state).pods.clone()
    }

    fn status(&self) -> PodViewStatus {
        lock(&self.state).status()
    }
}
