//! The shell that polls the kubelet on its own cadence and publishes the latest
//! [`ReplicaView`]: a tokio task beside the agent loop, so a slow or restarting kubelet never
//! holds up the sampler thread or a poll (each poll reads whatever was published last).
//!
//! Logging is by transition, not by poll: one line when the feature is off (socket absent
//! or permission denied), one when polls start failing, one when the data is withdrawn,
//! one when it comes back.

// Its staleness and poll timing bound real I/O to the kubelet on tokio's timers
// (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::client::{PodResourcesClient, PodResourcesError};
use super::model::replica_view;
use crate::attribute::ports::PodSource;
use crate::model::replicas::ReplicaView;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

/// The latest pod-resources data: `None` while there is none (not polled yet, or withdrawn
/// after the kubelet failed to answer for [`FeedConfig::stale_after`]).
pub type ReplicaReceiver = watch::Receiver<Option<Arc<ReplicaView>>>;

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

/// Whether data last refreshed at `last_ok` is still to be shown at `now`.
fn still_fresh(last_ok: Option<Instant>, now: Instant, stale_after: Duration) -> bool {
    last_ok.is_some_and(|t| now.saturating_duration_since(t) < stale_after)
}

/// Connects to the kubelet and starts the polling task. Returns None, after exactly one
/// log line, when the socket's directory is not there (not a kubelet node, or not mounted)
/// or the socket may not be connected to: the feature is then off for the agent's
/// lifetime and nothing else changes. When the directory is mounted but the socket is not
/// there yet (the kubelet restarting as the agent starts), it waits for the socket, trying
/// every interval, after one log line. Must be called inside a tokio runtime. The task ends
/// when every receiver is dropped.
pub async fn start(cfg: FeedConfig, pods: Arc<dyn PodSource>) -> Option<ReplicaReceiver> {
    let client = match PodResourcesClient::connect(&cfg.socket, cfg.call_timeout()).await {
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
        tracing::info!(socket = %cfg.socket.display(), interval = ?cfg.interval, "kubelet pod-resources: on");
        run(client, cfg, pods, tx).await;
    });
    Some(rx)
}

/// Tries the socket every interval until it answers (None once nobody reads the figures,
/// or when it turns out to be forbidden).
async fn wait_for_socket(
    cfg: &FeedConfig,
    tx: &watch::Sender<Option<Arc<ReplicaView>>>,
) -> Option<PodResourcesClient> {
    let mut ticker = tokio::time::interval(cfg.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = tx.closed() => return None,
        }
        match PodResourcesClient::connect(&cfg.socket, cfg.call_timeout()).await {
            Ok(c) => return Some(c),
            Err(PodResourcesError::Absent { .. }) => continue,
            Err(e) => {
                tracing::info!(reason = %e, "kubelet pod-resources: off (replica figures are not published)");
                return None;
            }
        }
    }
}

async fn run(
    mut client: PodResourcesClient,
    cfg: FeedConfig,
    pods: Arc<dyn PodSource>,
    tx: watch::Sender<Option<Arc<ReplicaView>>>,
) {
    let mut ticker = tokio::time::interval(cfg.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let stale_after = cfg.stale_after();
    let mut last_ok: Option<Instant> = None;
    let mut failing: Option<PodResourcesError> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = tx.closed() => return,
        }
        match client.poll().await {
            Ok(reply) => {
                let view = replica_view(
                    &reply.list,
                    &reply.allocatable,
                    &pods.pods(),
                    &cfg.request_key,
                );
                if failing.take().is_some() {
                    tracing::info!("kubelet pod-resources: answering again");
                }
                last_ok = Some(Instant::now());
                tx.send_replace(Some(Arc::new(view)));
            }
            Err(e) => {
                if failing.is_none() {
                    tracing::warn!(error = %e, keep_for = ?stale_after, "kubelet pod-resources: poll failed (kubelet restarting?); retrying every interval, keeping the last data meanwhile");
                }
                failing = Some(e);
                if tx.borrow().is_some() && !still_fresh(last_ok, Instant::now(), stale_after) {
                    tracing::warn!("kubelet pod-resources: no answer for too long; replica figures withdrawn until it answers");
                    tx.send_replace(None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_and_bounds() {
        let t0 = Instant::now();
        let s = Duration::from_secs(3);
        assert!(!still_fresh(None, t0, s));
        assert!(still_fresh(Some(t0), t0 + Duration::from_secs(2), s));
        assert!(!still_fresh(Some(t0), t0 + s, s));
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
