//! One step of the agent per poll: take the sampler's snapshot, attribute its processes,
//! render the exposition and build the publication. No I/O of its own: attribution is
//! injected, time comes from the injected clock, so tests drive it poll by poll.

use crate::attribute::podresources::feed::ReplicaReceiver;
use crate::attribute::ports::Attributor;
use crate::model::clock::Clock;
use crate::model::pressure::Pressure;
use crate::model::snapshot::{GpuHealth, Snapshot};
use crate::publish::metrics::{self, MetricsConfig};
use crate::publish::replica_metrics;
use crate::publish::self_metrics::SelfMetrics;
use crate::publish::state::Published;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The per-poll core.
pub struct Pipeline {
    cfg: MetricsConfig,
    self_metrics: SelfMetrics,
    clock: Arc<dyn Clock>,
    attributor: Option<Box<dyn Attributor>>,
    replicas: Option<ReplicaReceiver>,
}

impl Pipeline {
    /// A pipeline rendering with `cfg` and recording into `self_metrics`.
    pub fn new(cfg: MetricsConfig, self_metrics: SelfMetrics, clock: Arc<dyn Clock>) -> Self {
        Pipeline {
            cfg,
            self_metrics,
            clock,
            attributor: None,
            replicas: None,
        }
    }

    /// Uses `a` to attribute processes from now on.
    pub fn with_attributor(mut self, a: Box<dyn Attributor>) -> Self {
        self.attributor = Some(a);
        self
    }

    /// Publishes the kubelet's pod-resources data from `rx` with every poll: each poll takes
    /// whatever the feed last published, never waiting for the kubelet.
    pub fn with_replicas(mut self, rx: ReplicaReceiver) -> Self {
        self.replicas = Some(rx);
        self
    }

    /// The self metrics handle (shared with the annotator and the enforcer).
    pub fn self_metrics(&self) -> &SelfMetrics {
        &self.self_metrics
    }

    /// Records the poll's metrics and attributes the fresh snapshot's processes in place (if
    /// an attributor is set); the caller then shares it, immutable, as an `Arc`.
    pub fn prepare(&mut self, snap: &mut Snapshot, took: Duration) {
        let m = &self.self_metrics;
        m.poll_duration.observe(took.as_secs_f64());
        for (call, n) in &snap.errors {
            m.nvml_errors.with_label_values(&[call]).inc_by(*n);
        }
        let (mut ok, mut degraded, mut lost) = (0, 0, 0);
        for g in &snap.gpus {
            match g.health {
                GpuHealth::Ok => ok += 1,
                GpuHealth::Degraded(_) => degraded += 1,
                GpuHealth::Lost(_) => lost += 1,
            }
        }
        m.gpus.with_label_values(&["ok"]).set(ok);
        m.gpus.with_label_values(&["degraded"]).set(degraded);
        m.gpus.with_label_values(&["lost"]).set(lost);
        let unix = snap
            .wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        m.last_poll.set(unix);
        if let Some(a) = &mut self.attributor {
            a.attribute(snap);
        }
    }

    /// Renders the exposition of `snap` (plus guard pressure and self metrics) and wraps
    /// it into a publication.
    pub fn publish(
        &self,
        snap: Arc<Snapshot>,
        pressure: BTreeMap<u32, Pressure>,
        guard: serde_json::Value,
    ) -> Published {
        let mut families = metrics::device_families(&snap, &self.cfg);
        families.extend(metrics::container_families(&snap, &self.cfg));
        families.extend(metrics::pressure_family(&snap, |i| {
            pressure.get(&i).map(|p| p.as_metric())
        }));
        // A clone of the Arc under the watch's lock, held for nanoseconds.
        let replicas = self.replicas.as_ref().and_then(|rx| rx.borrow().clone());
        families.extend(replica_metrics::replica_families(
            &snap,
            replicas.as_deref(),
        ));
        families.extend(self.self_metrics.gather());
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = metrics::encode(&families, &mut out) {
            // Only a malformed family can fail; keep serving what was encoded before it.
            tracing::error!(error = %e, "encoding metrics failed");
        }
        Published {
            snapshot: snap,
            metrics: Bytes::from(out),
            published_at: self.clock.mono(),
            guard,
            pressure,
            replicas,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::clock::ManualClock;
    use crate::model::snapshot::{Owner, PodRef};
    use crate::sample::sampler::Stamper;
    use crate::sample::scenario::Scenario;
    use crate::sample::sim::SimSource;
    use crate::sample::{GpuSource, PollRequest};

    struct Everyone;
    impl Attributor for Everyone {
        fn attribute(&mut self, snap: &mut Snapshot) {
            for p in &mut snap.processes {
                p.owner = Owner::Pod(PodRef {
                    namespace: "ns".into(),
                    pod: format!("pod-{}", p.pid),
                    container: "c".into(),
                    uid: "u".into(),
                });
            }
        }
    }

    #[test]
    fn publishes_device_container_and_self_families() {
        let clock = Arc::new(ManualClock::new(std::time::UNIX_EPOCH));
        let mut src = SimSource::new(
            Scenario::parse(
                "gpus:\n  - {model: X, memory_mib: 100, gpu_temp_c: 30}\nprocesses:\n  - {pid: 9, gpu: 0, memory: {constant: 10}}\nfaults:\n  - {kind: error, gpu: 0, field: power}\n",
                "t",
            )
            .unwrap(),
        );
        let mut stamper = Stamper::default();
        let raw = src.poll(
            Duration::ZERO,
            PollRequest {
                process_utilization: true,
                slow_counters: true,
            },
        );
        let snap = stamper.stamp(raw, Duration::ZERO, clock.wall());
        let sm = SelfMetrics::new("test").unwrap();
        let mut p = Pipeline::new(
            MetricsConfig {
                hostname: "n".into(),
                ..Default::default()
            },
            sm,
            clock.clone(),
        )
        .with_attributor(Box::new(Everyone));
        let mut snap = snap;
        p.prepare(&mut snap, Duration::from_millis(2));
        let snap = Arc::new(snap);
        clock.advance(Duration::from_secs(1));
        let pressure = [(0, Pressure::Soft)].into_iter().collect();
        let out = p.publish(snap, pressure, serde_json::Value::Null);
        let text = String::from_utf8(out.metrics.to_vec()).unwrap();
        assert!(text.contains("DCGM_FI_DEV_GPU_TEMP{"), "{text}");
        assert!(text.contains("pod=\"pod-9\""), "{text}");
        assert!(
            text.contains("gpu_warden_nvml_errors_total{call=\"power\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_warden_poll_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_warden_gpu_memory_pressure{gpu=\"0\""),
            "{text}"
        );
        assert!(
            text.contains("gpu_warden_build_info{version=\"test\"} 1"),
            "{text}"
        );
        assert_eq!(out.published_at, Duration::from_secs(1));
        let state: serde_json::Value = serde_json::from_slice(&out.state_json()).unwrap();
        assert_eq!(state["snapshot"]["processes"][0]["owner"]["pod"], "pod-9");
    }
}
