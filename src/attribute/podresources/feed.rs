//! The shell that polls the kubelet on its own cadence and publishes the latest
//! [`KubeletAnswer`]: a tokio task beside the agent loop, so a slow or restarting kubelet never
//! holds up the sampler thread or a poll. Each agent poll takes whatever was published last
//! and matches its device IDs with that poll's GPUs ([`ReplicaReceiver::latest`]).
//!
//! Logging is by transition, not by poll: one line when the feature is off (socket absent,
//! permission denied, not a socket), one when the kubelet first answers (`on`, saying what
//! `GetAllocatableResources` did), one when polls start failing, one when the data is
//! withdrawn, one when it comes back; one when `GetAllocatableResources` stops or starts
//! answering; one per new set of device IDs that name no GPU.

// Its staleness and poll timing bound real I/O to the kubelet on tokio's timers
// (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::client::{PodResourcesClient, MAX_MESSAGE};
use super::model::answer;
use crate::attribute::ports::PodSource;
use crate::model::replicas::{AllocatableError, PodResourcesError};
use crate::model::replicas::{KubeletAnswer, KubeletDevice, ReplicaView};
use crate::model::snapshot::Snapshot;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

/// A `List` answer at least this large is followed by a trim of the allocator: about 750
/// pods with a replica each (a trim costs a few ms; small answers never pay it).
const TRIM_AFTER_BYTES: usize = 256 * 1024;

/// How the feed reaches the kubelet and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedConfig {
    /// The kubelet's socket (`--pod-resources-socket`).
    pub socket: PathBuf,
    /// Time between polls (`--pod-resources-interval`).
    pub interval: Duration,
    /// The pod annotation holding a pod's declared VRAM (`<prefix>/vram-request-mib`).
    pub request_key: String,
}

impl FeedConfig {
    /// Bound on each dial and call: a hung kubelet costs at most this per poll, and never
    /// more than the interval, so polls do not pile up.
    pub fn call_timeout(&self) -> Duration {
        self.interval.min(Duration::from_secs(5))
    }

    /// How long the last good data is kept while polls fail (a kubelet restart takes
    /// seconds): three intervals, after which it is withdrawn rather than shown stale.
    pub fn stale_after(&self) -> Duration {
        self.interval.saturating_mul(3)
    }
}

/// When an answer stops being shown: data got by the poll that *started* at `t` is
/// withdrawn by the first failed poll starting at or after `t + stale_after`. With polls one
/// interval apart that is the third failed poll, whatever the calls' durations (measuring
/// from the answer's arrival, or comparing with `<`, kept it a fourth interval).
#[derive(Debug, Clone, Copy)]
struct Freshness {
    stale_after: Duration,
    last_ok: Option<Instant>,
}

impl Freshness {
    fn new(stale_after: Duration) -> Self {
        Freshness {
            stale_after,
            last_ok: None,
        }
    }

    fn answered(&mut self, poll_started: Instant) {
        self.last_ok = Some(poll_started);
    }

    /// Whether what the last good poll brought is still to be shown by a poll starting at
    /// `poll_started` that got nothing.
    fn still_fresh(&self, poll_started: Instant) -> bool {
        self.last_ok
            .is_some_and(|t| poll_started.saturating_duration_since(t) < self.stale_after)
    }
}

type Latest = Option<Arc<KubeletAnswer>>;

/// The latest pod-resources data, matched with each snapshot's GPUs: `None` while there is
/// none (not polled yet, or withdrawn after the kubelet failed to answer for
/// [`FeedConfig::stale_after`]).
pub struct ReplicaReceiver {
    rx: watch::Receiver<Latest>,
    /// The last answer matched, the GPUs it was matched with, and the result: an answer is
    /// matched again only when it or the GPUs change.
    resolved: Option<(Arc<KubeletAnswer>, Vec<GpuKey>, Arc<ReplicaView>)>,
    /// The unmatched device IDs last logged.
    logged_unmapped: Vec<String>,
}

/// What matching device IDs depends on, per GPU: index, UUID, MIG devices.
type GpuKey = (u32, String, Vec<String>);

impl ReplicaReceiver {
    /// A receiver of `rx` (the feed's, or a test's).
    pub fn new(rx: watch::Receiver<Option<Arc<KubeletAnswer>>>) -> Self {
        ReplicaReceiver {
            rx,
            resolved: None,
            logged_unmapped: Vec::new(),
        }
    }

    /// The latest data matched with `snap`'s GPUs (a clone of an `Arc` while neither has
    /// changed). Logs once per new set of device IDs that name no GPU NVML sees: those pods
    /// are left out of the processes-without-replica count.
    pub fn latest(&mut self, snap: &Snapshot) -> Option<Arc<ReplicaView>> {
        let Some(answer) = self.rx.borrow().clone() else {
            self.resolved = None;
            return None;
        };
        if let Some((a, gpus, view)) = &self.resolved {
            let same_gpus = gpus.len() == snap.gpus.len()
                && gpus.iter().zip(&snap.gpus).all(|((i, u, m), g)| {
                    *i == g.id.index && *u == g.id.uuid && *m == g.mig_devices
                });
            if Arc::ptr_eq(a, &answer) && same_gpus {
                return Some(view.clone());
            }
        }
        let view = Arc::new(answer.resolve(&snap.gpus));
        self.log_unmapped(&view);
        let gpus = snap
            .gpus
            .iter()
            .map(|g| (g.id.index, g.id.uuid.clone(), g.mig_devices.clone()))
            .collect();
        self.resolved = Some((answer, gpus, view.clone()));
        Some(view)
    }

    fn log_unmapped(&mut self, view: &ReplicaView) {
        let a = &view.allocations;
        let mut ids: Vec<String> = a
            .unmapped()
            .map(|(_, d)| d.id.clone())
            .chain(a.unmapped_allocatable.iter().cloned())
            .collect();
        ids.sort();
        ids.dedup();
        if ids == self.logged_unmapped {
            return;
        }
        if !ids.is_empty() {
            let pods: Vec<String> = a
                .unmapped()
                .map(|(p, _)| format!("{}/{}", p.0, p.1))
                .collect();
            tracing::warn!(
                ids = ?ids.iter().take(8).collect::<Vec<_>>(),
                count = ids.len(),
                pods = ?pods.iter().take(8).collect::<Vec<_>>(),
                "kubelet pod-resources: device IDs that name no GPU NVML sees (MIG devices not listed, an index out of range, tegra/all); they count on no GPU, and their pods are left out of gpu_warden_processes_without_replica"
            );
        } else {
            tracing::info!("kubelet pod-resources: every device ID names a GPU again");
        }
        self.logged_unmapped = ids;
    }
}

/// Connects to the kubelet and starts the polling task. Returns None, after exactly one
/// log line, when the socket's directory is not there (not a kubelet node, or not mounted),
/// the socket may not be connected to, or something else is at its path: the feature is
/// then off for the agent's lifetime and nothing else changes. When the directory is
/// mounted but the socket is not there yet (the kubelet restarting as the agent starts), it
/// waits for the socket, trying every interval, after one log line. Must be called inside a
/// tokio runtime. The task ends when every receiver is dropped.
/// Boxed: docs/architecture.md, "Crates".
pub fn start(
    cfg: FeedConfig,
    pods: Arc<dyn PodSource>,
) -> futures::future::BoxFuture<'static, Option<ReplicaReceiver>> {
    Box::pin(start_inner(cfg, pods))
}
async fn start_inner(cfg: FeedConfig, pods: Arc<dyn PodSource>) -> Option<ReplicaReceiver> {
    let client = match connect(&cfg).await {
        Ok(c) => Some(c),
        Err(e @ PodResourcesError::Absent { .. })
            if cfg.socket.parent().is_some_and(|d| d.is_dir()) =>
        {
            tracing::info!(reason = %e, "kubelet pod-resources: the directory is mounted but the socket is not there yet; waiting for the kubelet");
            None
        }
        Err(e) => {
            tracing::info!(reason = %e, "kubelet pod-resources: off (replica figures are not published)");
            return None;
        }
    };
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let client = match client {
            Some(c) => c,
            None => match wait_for_socket(&cfg, &tx).await {
                Some(c) => c,
                None => return,
            },
        };
        run(client, cfg, pods, tx).await;
    });
    Some(ReplicaReceiver::new(rx))
}

async fn connect(cfg: &FeedConfig) -> Result<PodResourcesClient, PodResourcesError> {
    PodResourcesClient::connect(&cfg.socket, cfg.call_timeout(), MAX_MESSAGE).await
}

/// Tries the socket every interval until it answers (None once nobody reads the figures,
/// or when it turns out to be forbidden).
async fn wait_for_socket(
    cfg: &FeedConfig,
    tx: &watch::Sender<Latest>,
) -> Option<PodResourcesClient> {
    let mut ticker = tokio::time::interval(cfg.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = tx.closed() => return None,
        }
        match connect(cfg).await {
            Ok(c) => return Some(c),
            Err(PodResourcesError::Absent { .. }) => continue,
            Err(e) => {
                tracing::info!(reason = %e, "kubelet pod-resources: off (replica figures are not published)");
                return None;
            }
        }
    }
}

/// What `GetAllocatableResources` last gave, for the transition logs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AllocatableState {
    Unasked,
    Answers,
    Unavailable(String),
    Failing,
}

async fn run(
    mut client: PodResourcesClient,
    cfg: FeedConfig,
    pods: Arc<dyn PodSource>,
    tx: watch::Sender<Latest>,
) {
    let mut ticker = tokio::time::interval(cfg.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut list_fresh = Freshness::new(cfg.stale_after());
    let mut allocatable_fresh = Freshness::new(cfg.stale_after());
    // The last good allocatable devices, kept while the call fails for a while.
    let mut last_allocatable: Option<Vec<KubeletDevice>> = None;
    let mut allocatable_state = AllocatableState::Unasked;
    let mut answered_once = false;
    let mut failing: Option<PodResourcesError> = None;
    let mut failed_polls = 0u32;
    let mut trims_left = 0u8;
    loop {
        let started = tokio::select! {
            t = ticker.tick() => t,
            () = tx.closed() => return,
        };
        match client.poll().await {
            Ok(reply) => {
                list_fresh.answered(started);
                let state = match &reply.allocatable {
                    Ok(_) => {
                        allocatable_fresh.answered(started);
                        AllocatableState::Answers
                    }
                    Err(AllocatableError::Unavailable(why)) => {
                        AllocatableState::Unavailable(why.clone())
                    }
                    Err(AllocatableError::Failed(_)) => AllocatableState::Failing,
                };
                let mut view = answer(
                    &reply.list,
                    reply.allocatable.as_ref(),
                    &pods.pods(),
                    &cfg.request_key,
                );
                // A passing failure: the last good figures stay for three intervals.
                if state == AllocatableState::Failing && allocatable_fresh.still_fresh(started) {
                    if let Some(last) = &last_allocatable {
                        view.allocatable = Ok(last.clone());
                    }
                }
                if let Ok(a) = &view.allocatable {
                    last_allocatable = Some(a.clone());
                }
                let size = prost::Message::encoded_len(&reply.list);
                drop(reply);
                failed_polls = 0;
                log_answer(
                    &mut answered_once,
                    failing.take(),
                    &allocatable_state,
                    &state,
                    &view,
                    &cfg,
                );
                allocatable_state = state;
                tx.send_replace(Some(Arc::new(view)));
                // After a large answer, give back what the allocator keeps (see `heap_trim`;
                // a 3.7 MB answer left RSS at 92 MB for good): the decoded answer is gone by
                // now, the view made from it once the next answer replaces it, and the
                // agent's copies of that view at its next full poll — so this poll and the
                // next two trim.
                if size >= TRIM_AFTER_BYTES {
                    trims_left = 3;
                }
                if trims_left > 0 {
                    trims_left -= 1;
                    let released = heap_trim::release_freed_memory();
                    tracing::debug!(
                        answer_bytes = size,
                        released,
                        "kubelet pod-resources: freed memory given back"
                    );
                }
            }
            Err(e) => {
                if failing.is_none() {
                    if tx.borrow().is_some() {
                        tracing::warn!(error = %e, keep_for = ?cfg.stale_after(), "kubelet pod-resources: List failed (kubelet restarting?); retrying every interval, keeping the last data meanwhile");
                    } else {
                        tracing::warn!(error = %e, "kubelet pod-resources: List failed; no replica figures until it answers; retrying every interval");
                    }
                }
                failing = Some(e);
                failed_polls += 1;
                if tx.borrow().is_some() && !list_fresh.still_fresh(started) {
                    tracing::warn!(stale_after = ?cfg.stale_after(), failed_polls, "kubelet pod-resources: no answer for three intervals; replica figures withdrawn until it answers");
                    tx.send_replace(None);
                }
            }
        }
    }
}

/// The transition lines of a poll whose `List` answered.
fn log_answer(
    answered_once: &mut bool,
    was_failing: Option<PodResourcesError>,
    before: &AllocatableState,
    now: &AllocatableState,
    view: &KubeletAnswer,
    cfg: &FeedConfig,
) {
    let allocatable = match now {
        AllocatableState::Answers => "answers".to_string(),
        AllocatableState::Unavailable(why) => format!(
            "not served ({why}): replicas allocated come from List alone, allocatable is absent"
        ),
        AllocatableState::Failing | AllocatableState::Unasked => {
            "failed: replicas allocated come from List alone".to_string()
        }
    };
    if !*answered_once {
        *answered_once = true;
        tracing::info!(socket = %cfg.socket.display(), interval = ?cfg.interval, pods = view.pods.len(), get_allocatable_resources = %allocatable, "kubelet pod-resources: on (List answers)");
        return;
    }
    if was_failing.is_some() {
        tracing::info!(get_allocatable_resources = %allocatable, "kubelet pod-resources: List answers again");
    } else if before != now {
        match now {
            AllocatableState::Answers => {
                tracing::info!("kubelet pod-resources: GetAllocatableResources answers again")
            }
            _ => {
                tracing::warn!(get_allocatable_resources = %allocatable, "kubelet pod-resources: GetAllocatableResources stopped answering")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_is_three_intervals_from_the_start_of_the_good_poll() {
        let i = Duration::from_millis(100);
        let t0 = Instant::now();
        let mut f = Freshness::new(i * 3);
        assert!(!f.still_fresh(t0), "nothing answered yet");
        // The good poll started at t0 and took 60 ms; the failing ones fail at once.
        f.answered(t0);
        assert!(f.still_fresh(t0 + i));
        assert!(f.still_fresh(t0 + i * 2));
        assert!(
            !f.still_fresh(t0 + i * 3),
            "the third failed poll withdraws it"
        );
        let cfg = FeedConfig {
            socket: "/x".into(),
            interval: Duration::from_secs(10),
            request_key: "k".into(),
        };
        assert_eq!(cfg.call_timeout(), Duration::from_secs(5));
        assert_eq!(cfg.stale_after(), Duration::from_secs(30));
        let fast = FeedConfig {
            interval: Duration::from_millis(200),
            ..cfg
        };
        assert_eq!(fast.call_timeout(), Duration::from_millis(200));
    }
}
