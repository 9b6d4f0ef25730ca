//! The shell that writes the free-VRAM annotations ([`crate::publish::annotations`]) onto this
//! agent's Node.
//!
//! One tokio task. It wakes on every new publication (and when the planner or the
//! backoff says so), asks the [`AnnotationPlanner`], and sends the planned JSON merge patch
//! of `metadata.annotations`. It owns nothing the agent loop waits for: the publications
//! come through a `watch` channel that never blocks its sender, so metrics and the guard
//! keep working while the API server is slow or down; the task just keeps retrying with
//! exponential backoff in the background. On [`AnnotatorHandle::shutdown`] it removes
//! exactly its four keys, because a stale free figure is worse than none.

use crate::model::clock::Clock;
use crate::publish::annotations::{
    removal_patch, AnnotationConfig, AnnotationPatch, AnnotationPlanner,
};
use crate::publish::self_metrics::SelfMetrics;
use crate::publish::state::Published;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Field manager recorded in the Node's `managedFields`, so an operator can see who owns
/// the keys.
pub const FIELD_MANAGER: &str = "gpu-warden";

/// Timeouts and backoff of the shell. The defaults suit production; tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnotatorTiming {
    /// Limit for one PATCH; a hung API server must not hold back the retries.
    pub request_timeout: Duration,
    /// First pause after a failed patch.
    pub backoff_initial: Duration,
    /// Longest pause between failed patches.
    pub backoff_max: Duration,
    /// Everything the removal at shutdown may take, retries included.
    pub shutdown_timeout: Duration,
}

impl Default for AnnotatorTiming {
    fn default() -> Self {
        AnnotatorTiming {
            request_timeout: Duration::from_secs(10),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(3),
        }
    }
}

/// Why a patch or the shutdown did not go through.
#[derive(Debug, thiserror::Error)]
pub enum AnnotatorError {
    /// The API server answered with an error or could not be reached.
    #[error("patching node {node}: {source}")]
    Patch {
        /// The Node.
        node: String,
        /// What kube reported.
        #[source]
        source: kube::Error,
    },
    /// No answer within the request timeout.
    #[error("patching node {node}: no answer within {timeout:?}")]
    Timeout {
        /// The Node.
        node: String,
        /// The limit that passed.
        timeout: Duration,
    },
    /// The removal at shutdown did not finish within its time; the keys may remain
    /// (consumers then see `vram-observed-at` age).
    #[error("removing the annotations of node {node} did not finish within {timeout:?}")]
    ShutdownTimeout {
        /// The Node.
        node: String,
        /// The limit that passed.
        timeout: Duration,
    },
    /// The task ended abnormally (a panic).
    #[error("annotator task failed: {0}")]
    Task(String),
}

pub use crate::model::backoff::Backoff;

/// Runs the annotator; dropping it without [`shutdown`](Self::shutdown) also stops the
/// task and removes the keys, but nobody waits for that.
pub struct AnnotatorHandle {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), AnnotatorError>>,
    limit: Duration,
}

impl AnnotatorHandle {
    /// Stops the task and removes our four annotations from the Node. Bounded by the
    /// timing's `shutdown_timeout` (3 s by default) plus a small grace; a patch in flight is
    /// abandoned. Errors only say that the keys may still be there.
    pub fn shutdown(self) -> impl Future<Output = Result<(), AnnotatorError>> + Send + 'static {
        let AnnotatorHandle { stop, task, limit } = self;
        async move {
            let _ = stop.send(());
            let abort = task.abort_handle();
            match tokio::time::timeout(limit + Duration::from_millis(500), task).await {
                Ok(Ok(result)) => result,
                Ok(Err(join)) => Err(AnnotatorError::Task(join.to_string())),
                Err(_) => {
                    abort.abort();
                    Err(AnnotatorError::Task(format!(
                        "did not stop within {:?}",
                        limit + Duration::from_millis(500)
                    )))
                }
            }
        }
    }
}

/// Starts the annotator for `node` with the default [`AnnotatorTiming`].
///
/// `client` should have kube's `default_retry` off (the `direct` client of
/// [`crate::act::client::KubeClients`]): kube's built-in retry re-sends a 503 up to 15 times
/// within one call, which would defeat this task's own backoff during an outage.
/// `cfg` should have passed [`AnnotationConfig::validate`]. Must be called inside a tokio
/// runtime (it spawns the task there).
pub fn spawn_annotator(
    client: kube::Client,
    node: String,
    cfg: AnnotationConfig,
    published: watch::Receiver<Option<Arc<Published>>>,
    clock: Arc<dyn Clock>,
    metrics: SelfMetrics,
) -> AnnotatorHandle {
    spawn_annotator_with(
        client,
        node,
        cfg,
        published,
        clock,
        metrics,
        AnnotatorTiming::default(),
    )
}

/// As [`spawn_annotator`], with explicit timeouts and backoff.
pub fn spawn_annotator_with(
    client: kube::Client,
    node: String,
    cfg: AnnotationConfig,
    published: watch::Receiver<Option<Arc<Published>>>,
    clock: Arc<dyn Clock>,
    metrics: SelfMetrics,
    timing: AnnotatorTiming,
) -> AnnotatorHandle {
    let seed = jitter_seed(clock.as_ref(), &node);
    let removal = removal_patch(&cfg.prefix);
    let task = Task {
        api: Api::all(client),
        params: PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        },
        node,
        planner: AnnotationPlanner::new(cfg),
        published,
        feed_open: true,
        clock,
        metrics,
        timing,
        backoff: Backoff::new(timing.backoff_initial, timing.backoff_max, seed),
        retry_at: None,
        failures: 0,
        removal,
    };
    let (stop_tx, stop_rx) = oneshot::channel();
    AnnotatorHandle {
        stop: stop_tx,
        task: tokio::spawn(task.run(stop_rx)),
        limit: timing.shutdown_timeout,
    }
}

/// Removes our four annotations from `node` with one merge patch, bounded by `timeout`.
///
/// For an agent started with annotations switched off: keys left by an earlier run (or by
/// a crashed one, which could not remove them) would otherwise look like a node that
/// stopped reporting, and a consumer that ignores the staleness rule would trust them.
pub async fn remove_annotations(
    client: kube::Client,
    node: &str,
    prefix: &str,
    timeout: Duration,
) -> Result<(), AnnotatorError> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    patch_node(
        &Api::all(client),
        node,
        &params,
        &removal_patch(prefix),
        timeout,
    )
    .await
}

/// One JSON merge patch of the Node, bounded by `timeout`.
async fn patch_node(
    api: &Api<Node>,
    node: &str,
    params: &PatchParams,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<(), AnnotatorError> {
    let patch = Patch::Merge(body);
    match tokio::time::timeout(timeout, api.patch(node, params, &patch)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(source)) => Err(AnnotatorError::Patch {
            node: node.to_string(),
            source,
        }),
        Err(_) => Err(AnnotatorError::Timeout {
            node: node.to_string(),
            timeout,
        }),
    }
}

/// Different per node and per start, so nodes restarted together do not retry together.
fn jitter_seed(clock: &dyn Clock, node: &str) -> u64 {
    let nanos = clock
        .wall()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ crate::model::ids::fnv64(&[node])
}

struct Task {
    api: Api<Node>,
    params: PatchParams,
    node: String,
    planner: AnnotationPlanner,
    published: watch::Receiver<Option<Arc<Published>>>,
    /// False once the agent loop dropped its sender: then only shutdown is left to do.
    feed_open: bool,
    clock: Arc<dyn Clock>,
    metrics: SelfMetrics,
    timing: AnnotatorTiming,
    backoff: Backoff,
    /// Monotonic (clock) time before which no patch is sent, after a failure.
    retry_at: Option<Duration>,
    failures: u64,
    removal: serde_json::Value,
}

impl Task {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) -> Result<(), AnnotatorError> {
        // A publication made before the task started is not "changed" for the receiver.
        tokio::select! {
            biased;
            _ = &mut stop => return self.remove().await,
            _ = self.step() => {}
        }
        loop {
            let wake = self.next_wake();
            tokio::select! {
                biased;
                _ = &mut stop => break,
                changed = self.published.changed(), if self.feed_open => {
                    if changed.is_err() {
                        tracing::debug!("publications ended; annotator waits for shutdown");
                        self.feed_open = false;
                        continue;
                    }
                }
                _ = sleep_for(wake), if wake.is_some() => {}
            }
            // A patch in flight is abandoned at shutdown: the removal supersedes it.
            tokio::select! {
                biased;
                _ = &mut stop => break,
                _ = self.step() => {}
            }
        }
        self.remove().await
    }

    /// How long to sleep before asking the planner again without a new publication.
    fn next_wake(&self) -> Option<Duration> {
        let now = self.clock.mono();
        [self.retry_at, self.planner.next_due()]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min()
            .map(|t| t - now)
    }

    async fn step(&mut self) {
        let now = self.clock.mono();
        match self.retry_at {
            Some(t) if now < t => return,
            _ => self.retry_at = None,
        }
        let latest = self.published.borrow_and_update().clone();
        let Some(published) = latest else { return };
        let Some(patch) = self.planner.plan_with_replicas(
            &published.snapshot,
            &published.pressure,
            published.replicas.as_deref(),
            now,
        ) else {
            return;
        };
        match self.send(&patch.body).await {
            Ok(()) => self.succeeded(&patch),
            Err(e) => self.failed(&patch, e),
        }
    }

    fn succeeded(&mut self, patch: &AnnotationPatch) {
        self.planner.patch_succeeded(self.clock.mono());
        self.count("success");
        self.metrics
            .annotation_last_success
            .set(unix_seconds(self.clock.as_ref()));
        self.backoff.reset();
        if self.failures > 0 {
            tracing::info!(node = %self.node, failures = self.failures, "node annotations patched again");
            self.failures = 0;
        }
        tracing::debug!(
            node = %self.node,
            reason = patch.reason.as_str(),
            free_mib = patch.values.free_mib,
            max_free_mib = patch.values.max_free_mib,
            "node annotations patched"
        );
    }

    fn failed(&mut self, patch: &AnnotationPatch, error: AnnotatorError) {
        self.planner.patch_failed(self.clock.mono());
        self.count("error");
        self.failures += 1;
        let delay = self.backoff.next_delay();
        self.retry_at = Some(self.clock.mono() + delay);
        tracing::warn!(
            node = %self.node,
            reason = patch.reason.as_str(),
            failures = self.failures,
            retry_in = ?delay,
            error = %error,
            "patching node annotations failed; will retry"
        );
    }

    fn count(&self, result: &str) {
        self.metrics
            .annotation_patches
            .with_label_values(&[result])
            .inc();
    }

    async fn send(&self, body: &serde_json::Value) -> Result<(), AnnotatorError> {
        patch_node(
            &self.api,
            &self.node,
            &self.params,
            body,
            self.timing.request_timeout,
        )
        .await
    }

    /// Deletes our keys, retrying quickly until the shutdown budget runs out: at shutdown
    /// there is no later to back off to.
    async fn remove(mut self) -> Result<(), AnnotatorError> {
        let limit = self.timing.shutdown_timeout;
        // The per-request timeout must not outlast the whole budget.
        self.timing.request_timeout = self.timing.request_timeout.min(limit);
        let removal = self.removal.clone();
        let node = self.node.clone();
        let attempts = async {
            let mut pause = Duration::from_millis(100);
            loop {
                match self.send(&removal).await {
                    Ok(()) => {
                        self.count("success");
                        tracing::info!(node = %self.node, "node annotations removed");
                        return;
                    }
                    Err(e) => {
                        self.count("error");
                        tracing::warn!(node = %self.node, error = %e, "removing node annotations failed");
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        };
        match tokio::time::timeout(limit, attempts).await {
            Ok(()) => Ok(()),
            Err(_) => Err(AnnotatorError::ShutdownTimeout {
                node,
                timeout: limit,
            }),
        }
    }
}

async fn sleep_for(d: Option<Duration>) {
    if let Some(d) = d {
        tokio::time::sleep(d).await;
    }
}

fn unix_seconds(clock: &dyn Clock) -> i64 {
    clock
        .wall()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter_in_the_upper_half() {
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1), s(60), 42);
        let bases = [1, 2, 4, 8, 16, 32, 60, 60, 60];
        for want in bases {
            let d = b.next_delay();
            assert!(d >= s(want) / 2 && d <= s(want), "{d:?} for base {want}s");
            assert_eq!(b.current_base(), Some(s(want)));
        }
        b.reset();
        assert!(b.next_delay() <= s(1));
    }

    #[test]
    fn jitter_differs_between_seeds_and_is_never_stuck() {
        let s = Duration::from_secs;
        let delays = |seed| {
            let mut b = Backoff::new(s(1), s(60), seed);
            (0..8).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_ne!(delays(1), delays(2));
        // Seed 0 would be xorshift's fixed point.
        let d = delays(0);
        assert!(d.windows(2).any(|w| w[0] != w[1] / 2), "{d:?}");
    }

    #[test]
    fn zero_backoff_does_not_divide_by_zero() {
        let mut b = Backoff::new(Duration::ZERO, Duration::ZERO, 7);
        assert_eq!(b.next_delay(), Duration::ZERO);
    }
}
