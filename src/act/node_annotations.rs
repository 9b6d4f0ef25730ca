//! The shell that writes the free-VRAM annotations ([`crate::publish::annotations`]) onto this
//! agent's Node.
//!
//! One tokio task, the writer loop of `src/act/writer_loop.rs` (shared with the Lease): it
//! wakes on every new publication (and when the planner or the backoff says so), asks the
//! [`AnnotationPlanner`], and this file sends the planned JSON merge patch of
//! `metadata.annotations`. On [`AnnotatorHandle::shutdown`] it removes exactly its keys,
//! because a stale free figure is worse than none.

use crate::act::writer_loop::{jitter_seed, NotStopped, Running, Schedule, Writer, WriterLoop};
use crate::kubeapi::Nodes;
use crate::model::clock::Clock;
use crate::publish::annotations::{
    removal_patch, AnnotationConfig, AnnotationPatch, AnnotationPlanner,
};
use crate::publish::self_metrics::SelfMetrics;
use crate::publish::state::Published;
use kube::api::{Patch, PatchParams};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::watch;

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
    running: Running<Result<(), AnnotatorError>>,
}

impl AnnotatorHandle {
    /// Stops the task and removes our annotations from the Node. Bounded by the timing's
    /// `shutdown_timeout` (3 s by default) plus a small grace; a patch in flight is
    /// abandoned. Errors only say that the keys may still be there.
    pub fn shutdown(self) -> impl Future<Output = Result<(), AnnotatorError>> + Send + 'static {
        let stopped = self.running.stop();
        async move {
            match stopped.await {
                Ok(result) => result,
                Err(NotStopped::Failed(why)) => Err(AnnotatorError::Task(why)),
                Err(NotStopped::Late(limit)) => Err(AnnotatorError::Task(format!(
                    "did not stop within {limit:?}"
                ))),
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
    let seed = jitter_seed(clock.as_ref(), &[&node]);
    let removal = removal_patch(&cfg.prefix);
    let writer = NodeWriter {
        api: Nodes::all(client),
        params: PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        },
        node,
        clock: clock.clone(),
        metrics,
        timing,
        removal,
    };
    let writer_loop = WriterLoop {
        writer,
        planner: AnnotationPlanner::new(cfg),
        published,
        clock,
        schedule: Schedule::new(
            Backoff::new(timing.backoff_initial, timing.backoff_max, seed),
            None,
        ),
    };
    AnnotatorHandle {
        running: Running::spawn(writer_loop, timing.shutdown_timeout),
    }
}

/// Removes our annotations from `node` with one merge patch, bounded by `timeout`.
///
/// For an agent started with annotations switched off: keys left by an earlier run (or by
/// a crashed one, which could not remove them) would otherwise look like a node that
/// stopped reporting, and a consumer that ignores the staleness rule would trust them.
/// Boxed: docs/architecture.md, "Crates".
pub fn remove_annotations<'a>(
    client: kube::Client,
    node: &'a str,
    prefix: &'a str,
    timeout: Duration,
) -> futures::future::BoxFuture<'a, Result<(), AnnotatorError>> {
    Box::pin(remove_annotations_inner(client, node, prefix, timeout))
}
async fn remove_annotations_inner(
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
        &Nodes::all(client),
        node,
        &params,
        &removal_patch(prefix),
        timeout,
    )
    .await
}

/// One JSON merge patch of the Node, bounded by `timeout`.
async fn patch_node(
    api: &Nodes,
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

/// The Node's side of the writer loop (`src/act/writer_loop.rs`): one merge patch per
/// planned patch, the patch counters, and the keys' removal at shutdown.
struct NodeWriter {
    api: Nodes,
    params: PatchParams,
    node: String,
    clock: Arc<dyn Clock>,
    metrics: SelfMetrics,
    timing: AnnotatorTiming,
    removal: serde_json::Value,
}

impl Writer for NodeWriter {
    type Error = AnnotatorError;
    type Done = Result<(), AnnotatorError>;

    async fn write(
        &mut self,
        patch: Option<&AnnotationPatch>,
    ) -> Option<Result<(), AnnotatorError>> {
        let patch = patch?;
        Some(self.send(&patch.body).await)
    }

    fn succeeded(&mut self, patch: Option<&AnnotationPatch>, failures: u64) {
        self.count("success");
        self.metrics
            .annotation_last_success
            .set(unix_seconds(self.clock.as_ref()));
        if failures > 0 {
            tracing::info!(node = %self.node, failures, "node annotations patched again");
        }
        if let Some(patch) = patch {
            tracing::debug!(
                node = %self.node,
                reason = patch.reason.as_str(),
                free_mib = patch.values.free_mib,
                max_free_mib = patch.values.max_free_mib,
                "node annotations patched"
            );
        }
    }

    fn failed(
        &mut self,
        patch: Option<&AnnotationPatch>,
        error: AnnotatorError,
        failures: u64,
        retry_in: Duration,
    ) {
        self.count("error");
        tracing::warn!(
            node = %self.node,
            reason = patch.map_or("", |p| p.reason.as_str()),
            failures,
            retry_in = ?retry_in,
            error = %error,
            "patching node annotations failed; will retry"
        );
    }

    async fn finish(self) -> Result<(), AnnotatorError> {
        self.remove().await
    }
}

impl NodeWriter {
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
