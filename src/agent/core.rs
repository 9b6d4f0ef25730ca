//! One step of the agent per full poll: the sampler's snapshot in; its processes
//! attributed; the guard's observation and decisions; the exposition rendered and the
//! publication built. No I/O of its own: attribution and the pod view are injected, time
//! comes from the injected clock, so tests drive it poll by poll.

use crate::attribute::ports::{Attributor, PodSource};
use crate::guard::carry::Carried;
use crate::guard::decision::Decision;
use crate::guard::history::GuardView;
use crate::guard::ports::{ConfirmRequest, Confirmation, DecisionExecutor, Outcomes};
use crate::guard::session::GuardSession;
use crate::guard::state::{carried_key, Guard, RestoreReport};
use crate::model::clock::Clock;
use crate::model::event::EventDraft;
use crate::model::pod::PodMap;
use crate::model::pressure::Pressure;
use crate::model::replicas::ReplicaView;
use crate::model::snapshot::{MemoryInfo, Snapshot};
use crate::publish::annotations::{FiguresChannel, FiguresState};
use crate::publish::cuda_mismatch::CudaMismatches;
use crate::publish::job_peaks::JobPeaks;
use crate::publish::metrics::{self, MetricsConfig, Scratch};
use crate::publish::replica_metrics;
use crate::publish::self_metrics::SelfMetrics;
use crate::publish::state::{Published, StatePart};
use crate::sample::MemoryReading;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The guard and what it needs beside the snapshots.
pub struct GuardParts {
    pub guard: Guard,
    pub pods: Arc<dyn PodSource>,
    /// None when there is no cluster to act on: the guard then only tracks pressure
    /// (its mode is `off`, so it takes no decision).
    pub executor: Option<Arc<dyn DecisionExecutor>>,
}

/// The pod-resources feed's latest view matched with the poll's snapshot, read once per poll
/// (the shell hands in a read of its channel, so the core names no runtime type).
pub type LatestReplicas = Box<dyn FnMut(&Snapshot) -> Option<Arc<ReplicaView>> + Send>;

/// Where the guard's state that must survive a restart goes (`guard::carry`): called with
/// its new value each time its entries change (`None`: nothing left to carry). The shell
/// hands in a send on its channel, so the core names no runtime type.
pub type CarrySink = Box<dyn FnMut(Option<Carried>) + Send>;

/// A decision to execute, with the pod view it was taken on.
pub type Dispatch = (Decision, Arc<PodMap>);

/// The agent's state between events: one step per full poll (sample in, then attribute,
/// guard, publish). The event loop (and the scenario tests, on an injected clock) feed it
/// snapshots, memory ticks and eviction outcomes; it answers with publications and decisions
/// to execute. It does no I/O of its own beyond what the injected attributor and pod source
/// do.
pub struct Core {
    cfg: MetricsConfig,
    self_metrics: SelfMetrics,
    clock: Arc<dyn Clock>,
    attributor: Option<Box<dyn Attributor>>,
    replicas: Option<LatestReplicas>,
    /// The node's pod view, which the guard and every per-poll observer read.
    pods: Option<Arc<dyn PodSource>>,
    guard: Option<GuardSession>,
    /// The exposition is rendered here and copied out once per poll: after the first polls
    /// it has the node's size, so rendering itself allocates nothing.
    buf: Vec<u8>,
    scratch: Scratch,
    /// Each CI job's VRAM peak (`--job-peaks`), and the Events on pods it asks for.
    job_peaks: Option<JobPeaks>,
    /// GPU pods whose CUDA need the driver cannot meet, and the Events on them.
    cuda: Option<CudaMismatches>,
    notices: Vec<EventDraft>,
    /// Where the carried state goes, and the entries last sent there.
    carry: Option<(CarrySink, Vec<String>)>,
    /// Where the free-VRAM figures go, for `/state`.
    figures: Option<FiguresState>,
}

/// The Event reason of a pod's recorded VRAM peak.
pub use crate::publish::job_peaks::PEAK_REASON;

impl Core {
    /// A core rendering with `cfg` and recording into `self_metrics`, without an attributor
    /// or a guard until they are given.
    pub fn new(cfg: MetricsConfig, self_metrics: SelfMetrics, clock: Arc<dyn Clock>) -> Self {
        Core {
            cfg,
            self_metrics,
            clock,
            attributor: None,
            replicas: None,
            pods: None,
            guard: None,
            buf: Vec::new(),
            scratch: Scratch::default(),
            job_peaks: None,
            cuda: None,
            notices: Vec::new(),
            carry: None,
            figures: None,
        }
    }

    /// The free-VRAM figures are published as `figures` says: `/state` shows it and
    /// `gpu_warden_vram_figures_channel` is 1 for its channel, 0 for the other.
    pub fn with_figures(mut self, figures: FiguresState) -> Self {
        for ch in FiguresChannel::ALL {
            self.self_metrics
                .figures_channel
                .with_label_values(&[ch.as_str()])
                .set(i64::from(ch == figures.channel));
        }
        self.figures = Some(figures);
        self
    }

    /// Records each pod's VRAM peak per GPU from now on (docs/sizing.md).
    pub fn with_job_peaks(mut self, peaks: JobPeaks) -> Self {
        self.job_peaks = Some(peaks);
        self
    }

    /// Tells GPU pods whose CUDA need is newer than the driver supports (docs/cuda.md).
    pub fn with_cuda_check(mut self, check: CudaMismatches) -> Self {
        self.cuda = Some(check);
        self
    }

    /// The Events the last polls asked for (a recorded peak on a pod that still exists),
    /// oldest first; the caller sends them, best effort.
    pub fn take_notices(&mut self) -> Vec<EventDraft> {
        std::mem::take(&mut self.notices)
    }

    /// The fresh reads of pods in doubt the guard wants now; the caller reads each through
    /// the executor and reports with [`Core::on_confirmation`].
    pub fn take_confirms(&mut self) -> Vec<ConfirmRequest> {
        self.guard
            .as_mut()
            .map(GuardSession::take_confirms)
            .unwrap_or_default()
    }

    /// What the fresh read of a pod in doubt showed.
    pub fn on_confirmation(&mut self, request: &ConfirmRequest, answer: Confirmation) {
        if let Some(g) = &mut self.guard {
            g.on_confirmation(request, answer, self.clock.mono());
        }
        self.note_carry();
    }

    /// Sends the guard's doubts and cooldowns to `sink` whenever they change (a doubt or a
    /// cooldown begins or ends), so they survive a restart of the agent.
    pub fn set_carry(&mut self, sink: CarrySink) {
        let key = self.carried().map(|c| carried_key(&c)).unwrap_or_default();
        self.carry = Some((sink, key));
    }

    /// What the guard would carry over a restart now, if anything.
    pub fn carried(&self) -> Option<Carried> {
        let g = self.guard.as_ref()?;
        let c = g.guard().carried(self.clock.mono(), self.clock.wall());
        (!c.is_empty()).then_some(c)
    }

    /// Hands the guard what an earlier process of this agent carried (read at start).
    pub fn restore(&mut self, carried: Carried) -> Option<RestoreReport> {
        let g = self.guard.as_mut()?;
        let report = g
            .guard_mut()
            .restore(carried, self.clock.mono(), self.clock.wall());
        Some(report)
    }

    /// Sends the carried state on if its entries changed since the last send.
    fn note_carry(&mut self) {
        let (Some(g), Some((sink, last))) = (&self.guard, &mut self.carry) else {
            return;
        };
        let carried = g.guard().carried(self.clock.mono(), self.clock.wall());
        let key = carried_key(&carried);
        if key != *last {
            *last = key;
            sink((!carried.is_empty()).then_some(carried));
        }
    }

    /// Runs the guard on every full poll from now on.
    pub fn with_guard(mut self, parts: GuardParts) -> Self {
        self.pods = Some(parts.pods);
        self.guard = Some(GuardSession::new(parts.guard, parts.executor));
        self
    }

    /// Uses `a` to attribute processes from now on.
    pub fn with_attributor(mut self, a: Box<dyn Attributor>) -> Self {
        self.attributor = Some(a);
        self
    }

    /// Publishes the kubelet's pod-resources data from `latest` with every poll: each poll
    /// takes whatever the feed last published, never waiting for the kubelet.
    pub fn with_replicas(
        mut self,
        latest: impl FnMut(&Snapshot) -> Option<Arc<ReplicaView>> + Send + 'static,
    ) -> Self {
        self.replicas = Some(Box::new(latest));
        self
    }

    /// The self metrics handle (shared with the annotator and the enforcer).
    pub fn self_metrics(&self) -> &SelfMetrics {
        &self.self_metrics
    }

    /// Records the poll's metrics and attributes the fresh snapshot's processes in place (if
    /// an attributor is set); the caller then shares it, immutable, as an `Arc`.
    pub fn prepare(&mut self, snap: &mut Snapshot, took: Duration) {
        self.self_metrics.record_poll(snap, took);
        if let Some(a) = &mut self.attributor {
            a.attribute(snap);
        }
    }

    /// Renders the exposition of `snap` (plus guard pressure and self metrics) and wraps
    /// it into a publication.
    pub fn publish(
        &mut self,
        snap: Arc<Snapshot>,
        pressure: BTreeMap<u32, Pressure>,
        guard: Option<Arc<dyn StatePart>>,
    ) -> Published {
        let replicas = self.replicas.as_mut().and_then(|latest| latest(&snap));
        let out = &mut self.buf;
        out.clear();
        metrics::write_device_families(out, &mut self.scratch, &snap, &self.cfg);
        metrics::write_container_families(out, &mut self.scratch, &snap, &self.cfg);
        metrics::write_pressure_family(out, &snap, |i| pressure.get(&i).map(|p| p.as_metric()));
        replica_metrics::write_replica_families(out, &snap, replicas.as_deref());
        if let Some(jp) = &self.job_peaks {
            jp.render(out);
        }
        if let Some(c) = &self.cuda {
            c.render(out);
        }
        self.self_metrics.write(out);
        Published {
            snapshot: snap,
            // One allocation of exactly the exposition's size: readers keep it for as long
            // as a scrape takes, while the next poll renders into `buf` again.
            metrics: Bytes::copy_from_slice(out),
            published_at: self.clock.mono(),
            guard,
            pressure,
            replicas,
            figures: self.figures,
        }
    }

    /// A full poll: attribute, let the guard observe, render. Returns the publication and
    /// the decisions to execute.
    pub fn on_full(&mut self, mut snap: Snapshot, took: Duration) -> (Published, Vec<Dispatch>) {
        self.prepare(&mut snap, took);
        // From here on the snapshot is shared and never changes.
        let snap = Arc::new(snap);
        let now = self.clock.mono();
        let mut out = Vec::new();
        // The view's status before the view itself: the pods read are then at least as
        // recent as what the status vouches for.
        let status = self.pods.as_ref().map(|p| p.status());
        let pods = self.pods.as_ref().map(|p| p.pods()).unwrap_or_default();
        let (pressure, guard_view) = match (&mut self.guard, &self.pods, status) {
            (Some(g), Some(source), Some(status)) => {
                let decisions = g.on_full(&snap, &pods, &status, now);
                out = decisions.into_iter().map(|d| (d, pods.clone())).collect();
                source.set_urgent(g.guard().any_below_soft());
                let pressure = snap
                    .gpus
                    .iter()
                    .map(|gpu| (gpu.id.index, g.pressure(gpu.id.index)))
                    .collect();
                (
                    pressure,
                    Some(Arc::new(GuardPart(g.view())) as Arc<dyn StatePart>),
                )
            }
            _ => (Default::default(), None),
        };
        if let Some(jp) = &mut self.job_peaks {
            // The feed's latest view (an Arc clone while it has not changed): pods holding a
            // replica keep their records open, idle or not.
            let replicas = self.replicas.as_mut().and_then(|latest| latest(&snap));
            let ended = jp.observe(&snap, &pods, replicas.as_deref());
            self.notices
                .extend(ended.iter().flat_map(|p| jp.notices(p)));
        }
        if let (Some(c), Some(_)) = (&mut self.cuda, &self.pods) {
            self.notices.extend(c.observe(&snap, &pods));
        }
        self.note_carry();
        (self.publish(snap, pressure, guard_view), out)
    }

    /// A memory-only reading between full polls (the guard's fast watch). Returns whether a
    /// full poll is wanted at once: a trigger fired, and victims are ranked only on a
    /// process list read together with the memory.
    pub fn on_memory(&mut self, at: Duration, readings: Vec<MemoryReading>) -> bool {
        let Some(g) = &mut self.guard else {
            return false;
        };
        let ok: Vec<(u32, MemoryInfo)> = readings
            .into_iter()
            .filter_map(|(i, r)| r.ok().map(|m| (i, m)))
            .collect();
        g.on_memory(&ok, at)
    }

    /// What the executor got for decision `id`. A pod skipped because its fresh read
    /// disagreed with the pod view makes the view relist.
    pub fn on_outcomes(&mut self, id: u64, results: Outcomes) {
        if let Some(g) = &mut self.guard {
            for why in g.on_outcomes(id, results, self.clock.mono()) {
                if let Some(p) = &self.pods {
                    p.distrust(&why);
                }
            }
        }
        self.note_carry();
    }

    /// How often the sampler should read memory alone now, if at all: while the guard can
    /// act, at the interval its risk rule wants (`guard::read_cadence`: `fastInterval` when calm,
    /// down to `fastIntervalMin` near hard, under pressure or while memory grows); otherwise
    /// only while a GPU is below soft, for the pressure metric.
    ///
    /// docs/guard.md once turned the fast watch on only below soft. Measured on the H200,
    /// that let the first soft (or even hard) crossing wait for the next full poll — up to a
    /// whole poll interval — and a 16 GiB/s job filled the GPU in that time.
    pub fn fast_interval(&self) -> Option<Duration> {
        // Whether the guard may act is decided once, at wiring (`agent::build`): no
        // cluster means mode off.
        self.guard.as_ref().and_then(|g| g.guard().watch_interval())
    }

    /// The executor decisions go to, if the guard acts.
    pub fn executor(&self) -> Option<Arc<dyn DecisionExecutor>> {
        self.guard.as_ref().and_then(GuardSession::executor)
    }

    /// The guard's status as /state shows it (None without a guard).
    pub fn guard_json(&self) -> Option<serde_json::Value> {
        self.guard.as_ref().map(|g| g.view().to_json())
    }
}

/// `/state` reads the guard's view through publish's port. A wrapper of the agent's own,
/// because neither the port (publish) nor the view (guard) is the agent's: the impl stays
/// legal when the rooms become crates (the orphan rule).
#[derive(Debug)]
struct GuardPart(GuardView);

impl StatePart for GuardPart {
    fn to_json(&self) -> serde_json::Value {
        self.0.to_json()
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
        let mut p = Core::new(
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
        let out = p.publish(snap, pressure, None);
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
