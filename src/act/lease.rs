//! The shell that keeps this agent's Lease (`coordination.k8s.io/v1`, in the agent's own
//! namespace, named after the node): the agent's liveness and its current free-VRAM figures,
//! renewed every `--lease-renew-interval` (docs/annotations.md, "Liveness").
//!
//! Follows the kubelet's node-lease controller (`component-helpers/apimachinery/lease/controller.go`):
//! renew with an optimistic update (PUT) of the copy last written; on a 409 Conflict or a
//! 404, read the Lease again (or create it) and retry once; back off on other errors. Unlike
//! the kubelet's it renews only with a snapshot newer than the last one written (the
//! [`AnnotationPlanner`]'s heartbeat rule), so a wedged sampler lets the Lease age and the
//! extender's staleness rule takes over. A change of the figures (a quantum, a pressure
//! level, the replicas) renews early, at most every [`LEASE_MIN_INTERVAL`] (a pressure rise
//! at once). The Lease carries the annotation values the Node would, so the Node
//! itself can be written only on a slow cadence. At shutdown the figures are taken off the
//! Lease (the agent's RBAC has no `delete`); the extender then reads the Node, whose keys the
//! annotator removes at the same time.

use crate::act::writer_loop::{jitter_seed, NotStopped, Running, Schedule, Writer, WriterLoop};
use crate::guard::carry::CARRY_KEY;
use crate::kubeapi::Leases;
use crate::model::backoff::Backoff;
use crate::model::clock::Clock;
use crate::publish::annotations::{AnnotationConfig, AnnotationPatch, AnnotationPlanner};
use crate::publish::state::Published;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::PostParams;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// A change of the figures renews the Lease early, but never more often than this (a
/// pressure rise excepted).
pub const LEASE_MIN_INTERVAL: Duration = Duration::from_secs(5);

/// Label every agent Lease carries, so an operator (and the extender's watch) can tell
/// them from other Leases in the namespace.
pub const LEASE_LABEL: (&str, &str) = ("app.kubernetes.io/component", "gpu-warden-liveness");

/// Field manager recorded in the Lease's `managedFields`.
pub const FIELD_MANAGER: &str = "gpu-warden";

/// Where the Lease lives and how often it is renewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The agent's namespace (`POD_NAMESPACE`, from the Downward API).
    pub namespace: String,
    /// The Lease's name: the node's (what the extender looks up).
    pub name: String,
    /// `spec.holderIdentity`: the agent's pod name, else the node's.
    pub holder: String,
    /// Renew at least this often.
    pub renew_interval: Duration,
    /// `spec.leaseDurationSeconds`.
    pub duration: Duration,
}

/// Why a Lease write did not go through.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The API server answered with an error or could not be reached.
    #[error("writing lease {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What kube reported.
        #[source]
        source: kube::Error,
    },
    /// No answer within the request timeout.
    #[error("writing lease {namespace}/{name}: no answer within {timeout:?}")]
    Timeout {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The limit that passed.
        timeout: Duration,
    },
}

/// The annotation planner's settings for the Lease: the Node's prefix and quantum, the
/// renewal interval as its heartbeat.
pub fn lease_planner_config(node: &AnnotationConfig, renew_interval: Duration) -> AnnotationConfig {
    AnnotationConfig {
        heartbeat: renew_interval,
        min_interval: LEASE_MIN_INTERVAL.min(renew_interval),
        pressure_rise_at_once: true,
        // The extender places pods on freed memory from the Lease within seconds.
        under_promise_at_heartbeat: false,
        // Every change goes within the Lease's 5 s already: the Node's early path and its
        // budget are the Node's alone.
        over_promise_burst: 0,
        ..node.clone()
    }
}

/// The Lease as this agent writes it: `base` (the last copy read or written, for its
/// resourceVersion) with a new renewal time and `figures` as its annotations under the
/// prefix (others' annotations kept). `figures` empty: the figures are taken off.
pub fn lease_object(
    base: Option<&Lease>,
    cfg: &LeaseConfig,
    prefix: &str,
    figures: &BTreeMap<String, String>,
    wall: SystemTime,
) -> Lease {
    let mut lease = base.cloned().unwrap_or_default();
    let meta = &mut lease.metadata;
    meta.name = Some(cfg.name.clone());
    meta.namespace = Some(cfg.namespace.clone());
    meta.managed_fields = None;
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LEASE_LABEL.0.into(), LEASE_LABEL.1.into());
    let ann = meta.annotations.get_or_insert_with(BTreeMap::new);
    let ours = format!("{prefix}/");
    ann.retain(|k, _| !k.starts_with(&ours));
    ann.extend(figures.iter().map(|(k, v)| (k.clone(), v.clone())));
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let now = micro_time(wall);
    if spec.holder_identity.as_deref() != Some(cfg.holder.as_str()) {
        spec.holder_identity = Some(cfg.holder.clone());
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(i32::try_from(cfg.duration.as_secs()).unwrap_or(i32::MAX));
    spec.renew_time = Some(now);
    lease
}

fn micro_time(wall: SystemTime) -> MicroTime {
    // A host clock before 1970 or past jiff's range must not stop the renewals.
    MicroTime(
        k8s_openapi::jiff::Timestamp::try_from(wall)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// Runs the Lease task; [`shutdown`](Self::shutdown) takes the figures off.
pub struct LeaseHandle {
    running: Running<()>,
}

impl LeaseHandle {
    /// Stops renewing and takes the figures off the Lease, within `limit` (3 s) and a grace.
    pub fn shutdown(self) -> impl Future<Output = ()> + Send + 'static {
        let stopped = self.running.stop();
        async move {
            match stopped.await {
                Ok(()) => {}
                Err(NotStopped::Late(_)) => tracing::warn!("the lease task did not stop in time; its figures age into the extender's staleness rule"),
                Err(NotStopped::Failed(why)) => tracing::warn!(error = %why, "the lease task failed; its figures age into the extender's staleness rule"),
            }
        }
    }
}

/// Starts the Lease task. `node_cfg` is the Node annotations' configuration (its prefix and
/// quantum are the Lease's); `client` should have kube's retry off (the `direct` client).
/// With `carry`, it also keeps the guard's carried state (`guard::carry`) in the
/// Lease's `<prefix>/guard-doubts` annotation: written as soon as it changes (not held by
/// [`LEASE_MIN_INTERVAL`]: a doubt that begins must be on record before the agent can be
/// restarted), retried with the renewals' backoff, and kept when the figures are taken off
/// at shutdown (a restart is a shutdown and a start).
pub fn spawn_lease(
    client: kube::Client,
    cfg: LeaseConfig,
    node_cfg: &AnnotationConfig,
    published: watch::Receiver<Option<Arc<Published>>>,
    clock: Arc<dyn Clock>,
    carry: Option<watch::Receiver<Option<String>>>,
) -> LeaseHandle {
    let seed = jitter_seed(clock.as_ref(), &[&cfg.name, "lease"]);
    let carry_key = format!("{}/{CARRY_KEY}", node_cfg.prefix);
    let planner = AnnotationPlanner::new(lease_planner_config(node_cfg, cfg.renew_interval));
    let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30), seed);
    let schedule = Schedule::new(backoff, Some(cfg.renew_interval));
    let writer = LeaseWriter {
        api: Leases::namespaced(client, &cfg.namespace),
        carry,
        carry_key,
        carry_written: None,
        figures: BTreeMap::new(),
        prefix: node_cfg.prefix.clone(),
        cfg,
        clock: clock.clone(),
        last: None,
        timeout: Duration::from_secs(10),
    };
    let writer_loop = WriterLoop {
        writer,
        planner,
        published,
        clock,
        schedule,
    };
    LeaseHandle {
        running: Running::spawn(writer_loop, Duration::from_secs(3)),
    }
}

/// The Lease's side of the writer loop (`src/act/writer_loop.rs`): the optimistic update,
/// the guard's carried state beside the figures, and the figures taken off at shutdown.
struct LeaseWriter {
    api: Leases,
    /// The guard's carried state (its JSON), when the Lease keeps it.
    carry: Option<watch::Receiver<Option<String>>>,
    /// Its annotation key.
    carry_key: String,
    /// What of it the Lease holds now (as last written).
    carry_written: Option<String>,
    /// The figures last written.
    figures: BTreeMap<String, String>,
    prefix: String,
    cfg: LeaseConfig,
    clock: Arc<dyn Clock>,
    /// The Lease as last read or written (its resourceVersion makes the next update safe).
    last: Option<Lease>,
    timeout: Duration,
}

impl Writer for LeaseWriter {
    type Error = LeaseError;
    type Done = ();

    /// Writes the planned figures, or the last ones again when only the carried state
    /// changed (written at once: a doubt that begins must be on record before the agent
    /// can be restarted).
    async fn write(&mut self, patch: Option<&AnnotationPatch>) -> Option<Result<(), LeaseError>> {
        let carry_wanted = self
            .carry
            .as_mut()
            .map(|c| c.borrow_and_update().clone())
            .unwrap_or_else(|| self.carry_written.clone());
        if patch.is_none() && carry_wanted == self.carry_written {
            return None;
        }
        let figures = match patch {
            Some(p) => p.values.to_annotations(&self.prefix),
            None => self.figures.clone(),
        };
        let body = with_carry(&figures, &self.carry_key, carry_wanted.as_deref());
        let result = self.put(&body).await;
        if result.is_ok() {
            if carry_wanted != self.carry_written {
                tracing::info!(lease = %self.cfg.name, carried = carry_wanted.as_deref().unwrap_or(""), "guard doubts and cooldowns recorded on the lease");
            }
            self.figures = figures;
            self.carry_written = carry_wanted;
        }
        Some(result)
    }

    fn succeeded(&mut self, patch: Option<&AnnotationPatch>, failures: u64) {
        if failures > 0 {
            tracing::info!(lease = %self.cfg.name, failures, "lease renewed again");
        }
        if let Some(patch) = patch {
            tracing::debug!(lease = %self.cfg.name, reason = patch.reason.as_str(), "lease renewed");
        }
    }

    fn failed(
        &mut self,
        patch: Option<&AnnotationPatch>,
        error: LeaseError,
        failures: u64,
        retry_in: Duration,
    ) {
        let forbidden =
            matches!(&error, LeaseError::Api { source: kube::Error::Api(s), .. } if s.code == 403);
        if forbidden {
            tracing::warn!(lease = %self.cfg.name, namespace = %self.cfg.namespace, error = %error, "writing the lease is forbidden: the extender reads this node's figures from its Node, at the Node's slower cadence (grant leases get/create/update in the agent's namespace, docs/deploy.md)");
        } else {
            let reason = patch.map_or("guard doubts", |p| p.reason.as_str());
            tracing::warn!(lease = %self.cfg.name, reason, failures, retry_in = ?retry_in, error = %error, "renewing the lease failed; will retry");
        }
    }

    /// Resolves when the carried state changes (never without one).
    async fn woken(&mut self) {
        match &mut self.carry {
            Some(c) => {
                if c.changed().await.is_err() {
                    self.carry = None;
                }
            }
            None => std::future::pending().await,
        }
    }

    async fn finish(self) {
        self.take_figures_off().await;
    }
}

impl LeaseWriter {
    /// One renewal: update the copy last seen; on a conflict or a missing Lease read it
    /// again (or create it) and update once more.
    async fn put(&mut self, figures: &BTreeMap<String, String>) -> Result<(), LeaseError> {
        if self.last.is_some() {
            match self.replace(figures).await {
                Ok(()) => return Ok(()),
                Err(LeaseError::Api {
                    source: kube::Error::Api(s),
                    ..
                }) if s.code == 409 || s.code == 404 => self.last = None,
                Err(e) => return Err(e),
            }
        }
        match self.bounded(self.api.get_opt(&self.cfg.name)).await? {
            Some(current) => {
                self.last = Some(current);
                self.replace(figures).await
            }
            None => {
                let body = lease_object(None, &self.cfg, &self.prefix, figures, self.clock.wall());
                let created = self
                    .bounded(self.api.create(&self.post_params(), &body))
                    .await?;
                self.last = Some(created);
                Ok(())
            }
        }
    }

    async fn replace(&mut self, figures: &BTreeMap<String, String>) -> Result<(), LeaseError> {
        let body = lease_object(
            self.last.as_ref(),
            &self.cfg,
            &self.prefix,
            figures,
            self.clock.wall(),
        );
        let written = self
            .bounded(self.api.replace(&self.cfg.name, &self.post_params(), &body))
            .await?;
        self.last = Some(written);
        Ok(())
    }

    fn post_params(&self) -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        }
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaseError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(LeaseError::Api {
                namespace: self.cfg.namespace.clone(),
                name: self.cfg.name.clone(),
                source,
            }),
            Err(_) => Err(LeaseError::Timeout {
                namespace: self.cfg.namespace.clone(),
                name: self.cfg.name.clone(),
                timeout: self.timeout,
            }),
        }
    }

    /// At shutdown: the Lease stays (no `delete` in the RBAC) but without figures, so the
    /// extender sees no figures rather than the last ones. Only when a Lease was written.
    async fn take_figures_off(mut self) {
        if self.last.is_none() {
            return;
        }
        self.timeout = Duration::from_secs(2);
        // The guard's carried state stays: the next process of this agent reads it.
        let carried = self
            .carry
            .as_ref()
            .map(|c| c.borrow().clone())
            .unwrap_or_else(|| self.carry_written.clone());
        let left = with_carry(&BTreeMap::new(), &self.carry_key, carried.as_deref());
        let result = tokio::time::timeout(Duration::from_secs(3), self.put(&left)).await;
        match result {
            Ok(Ok(())) => tracing::info!(lease = %self.cfg.name, "lease figures removed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "removing the lease figures failed; they age into the extender's staleness rule"),
            Err(_) => tracing::warn!("removing the lease figures did not finish in time; they age into the extender's staleness rule"),
        }
    }
}

/// `figures` with the carried state's annotation, when there is one.
fn with_carry(
    figures: &BTreeMap<String, String>,
    key: &str,
    carried: Option<&str>,
) -> BTreeMap<String, String> {
    let mut all = figures.clone();
    if let Some(c) = carried {
        all.insert(key.to_string(), c.to_string());
    }
    all
}

/// Reads the guard's carried state from this agent's Lease once, at start (`None`: no
/// Lease, or nothing carried). Bounded by `timeout`: an agent whose API server does not
/// answer starts without it, and says so.
/// Boxed: docs/architecture.md, "Crates".
pub fn read_carried<'a>(
    client: kube::Client,
    cfg: &'a LeaseConfig,
    prefix: &'a str,
    timeout: Duration,
) -> futures::future::BoxFuture<'a, Result<Option<String>, LeaseError>> {
    Box::pin(read_carried_inner(client, cfg, prefix, timeout))
}
async fn read_carried_inner(
    client: kube::Client,
    cfg: &LeaseConfig,
    prefix: &str,
    timeout: Duration,
) -> Result<Option<String>, LeaseError> {
    let api = Leases::namespaced(client, &cfg.namespace);
    let lease = match tokio::time::timeout(timeout, api.get_opt(&cfg.name)).await {
        Ok(Ok(l)) => l,
        Ok(Err(source)) => {
            return Err(LeaseError::Api {
                namespace: cfg.namespace.clone(),
                name: cfg.name.clone(),
                source,
            })
        }
        Err(_) => {
            return Err(LeaseError::Timeout {
                namespace: cfg.namespace.clone(),
                name: cfg.name.clone(),
                timeout,
            })
        }
    };
    let key = format!("{prefix}/{CARRY_KEY}");
    Ok(lease
        .and_then(|l| l.metadata.annotations)
        .and_then(|mut a| a.remove(&key)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn cfg() -> LeaseConfig {
        LeaseConfig {
            namespace: "gpu-warden".into(),
            name: "gpu-1".into(),
            holder: "gpu-warden-abcde".into(),
            renew_interval: Duration::from_secs(15),
            duration: Duration::from_secs(60),
        }
    }

    #[test]
    fn the_lease_carries_the_figures_and_keeps_others_annotations() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let figures = BTreeMap::from([(
            "gpu-warden.io/vram-free-mib".to_string(),
            "1024".to_string(),
        )]);
        let first = lease_object(None, &cfg(), "gpu-warden.io", &figures, t0);
        let spec = first.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("gpu-warden-abcde"));
        assert_eq!(spec.lease_duration_seconds, Some(60));
        assert_eq!(spec.lease_transitions, Some(1));
        assert_eq!(spec.renew_time, spec.acquire_time);
        assert_eq!(
            first.metadata.labels.as_ref().unwrap()[LEASE_LABEL.0],
            LEASE_LABEL.1
        );

        let mut stored = first.clone();
        stored.metadata.resource_version = Some("42".into());
        stored
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("example.com/note".into(), "x".into());
        let t1 = t0 + Duration::from_secs(15);
        let off = lease_object(Some(&stored), &cfg(), "gpu-warden.io", &BTreeMap::new(), t1);
        let ann = off.metadata.annotations.unwrap();
        assert_eq!(ann.len(), 1, "our keys are gone, others' stay: {ann:?}");
        assert_eq!(ann["example.com/note"], "x");
        assert_eq!(
            off.metadata.resource_version.as_deref(),
            Some("42"),
            "an optimistic update"
        );
        let spec = off.spec.unwrap();
        assert_eq!(
            spec.lease_transitions,
            Some(1),
            "same holder: no transition"
        );
        assert!(spec.renew_time > spec.acquire_time);
    }

    /// The Lease carries every key of the set the agent owns (`PerKey`), as its writer
    /// builds them from the planned values.
    #[test]
    fn the_lease_carries_every_owned_key() {
        use crate::publish::annotations::{owned_keys, AnnotationValues};
        let t0 = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let values = AnnotationValues {
            observed_at: t0,
            gpus: vec![],
            free_mib: 0,
            max_free_mib: 0,
            next_gpu: None,
            cuda_driver_version: Some(crate::model::cuda::CudaVersion {
                major: 12,
                minor: 8,
            }),
        };
        let figures = values.to_annotations("gpu-warden.io");
        let lease = lease_object(None, &cfg(), "gpu-warden.io", &figures, t0);
        let ann = lease.metadata.annotations.unwrap_or_default();
        for key in owned_keys("gpu-warden.io").iter() {
            assert!(ann.contains_key(key), "{key} is not on the Lease: {ann:?}");
        }
    }

    #[test]
    fn the_planner_renews_on_the_interval_and_changes_early() {
        let node = AnnotationConfig::default();
        let c = lease_planner_config(&node, Duration::from_secs(15));
        assert_eq!(c.heartbeat, Duration::from_secs(15));
        assert_eq!(c.min_interval, LEASE_MIN_INTERVAL);
        assert_eq!(
            (c.prefix.as_str(), c.quantum_mib),
            (node.prefix.as_str(), node.quantum_mib)
        );
        assert_eq!(c.validate(), Ok(()));
        let short = lease_planner_config(&node, Duration::from_secs(2));
        assert_eq!(
            short.min_interval,
            Duration::from_secs(2),
            "never above the renewal"
        );
    }
}
