//! gpu-warden's own metrics: poll latency, NVML errors, build info, and the counters the
//! annotator and the guard add to. Atomic cells shared by handle (cloning `SelfMetrics`
//! shares them); [`SelfMetrics::write`] appends their families to each poll's exposition in
//! the text format, sorted by name as a `prometheus` registry gathers them, without building
//! family objects.

use super::text::{Family, Kind};
use crate::model::snapshot::{GpuHealth, Snapshot};
use prometheus::IntGauge;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Handles to the self metrics.
#[derive(Clone)]
pub struct SelfMetrics {
    version: Arc<str>,
    /// `gpu_warden_poll_duration_seconds`: wall time of one full poll of the GPU source.
    pub poll_duration: Histogram,
    /// `gpu_warden_nvml_errors_total{call}`.
    pub nvml_errors: Labelled<Counter>,
    /// `gpu_warden_evictions_total{namespace,result}`.
    pub evictions: Labelled<Counter>,
    /// `gpu_warden_guard_decisions_total{escalated,mode,trigger}`: `escalated` is `true` for
    /// a decision taken while an earlier one's victims or terminating pods still held memory
    /// (`guard::state::escalate`): a second pod for one episode.
    pub decisions: Labelled<Counter>,
    /// `gpu_warden_guard_decision_evictions`: how many pods each enforce-mode decision
    /// evicted (0 when none was).
    pub decision_evictions: Histogram,
    /// `gpu_warden_guard_stops_total{result}`: what stop-at-decision did to victims' GPU
    /// processes, one per process (docs/guard.md).
    pub guard_stops: Labelled<Counter>,
    /// `gpu_warden_guard_stop_permitted`: 1 when the agent may signal victims' processes
    /// (CAP_KILL), 0 when it evicts only.
    pub guard_stop_permitted: IntGauge,
    /// `gpu_warden_node_annotation_patches_total{result}`.
    pub annotation_patches: Labelled<Counter>,
    /// `gpu_warden_node_annotation_last_success_timestamp_seconds`.
    pub annotation_last_success: IntGauge,
    /// `gpu_warden_invisible_processes`: GPU processes whose `/proc` entry cannot be read
    /// (the agent lacks `hostPID: true`, or `--proc-root` points at the wrong place).
    pub invisible_processes: IntGauge,
    /// `gpu_warden_gpus{state}`: GPUs by health.
    pub gpus: Labelled<Gauge>,
    /// `gpu_warden_last_poll_timestamp_seconds`: wall time of the last full poll.
    pub last_poll: IntGauge,
    /// `gpu_warden_vram_figures_channel{channel="lease"|"node"}`: 1 for the object that
    /// carries the current free-VRAM figures (the Lease, or the Node alone without one);
    /// no series while the agent publishes none (standalone, `--annotations off`).
    pub figures_channel: Labelled<Gauge>,
}

/// Poll-latency buckets from 100 µs to 2.5 s: NVML polls of a healthy node sit in the
/// low milliseconds, a stuck driver in seconds.
const POLL_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Buckets of pods evicted by one decision: more than one means the plan needed several
/// pods for one pressure (or took a bystander).
pub const DECISION_EVICTION_BUCKETS: [f64; 5] = [0.0, 1.0, 2.0, 3.0, 5.0];

/// A counter cell (a handle: clones share the value).
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.inc_by(1);
    }

    /// Adds `n`.
    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A gauge cell (a handle: clones share the value).
#[derive(Debug, Clone, Default)]
pub struct Gauge(Arc<AtomicI64>);

impl Gauge {
    /// Sets the value.
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a labelled family's cells render as.
pub trait Cell: Clone + Default {
    /// The sample value.
    fn value(&self) -> f64;
}

impl Cell for Counter {
    fn value(&self) -> f64 {
        self.get() as f64
    }
}

impl Cell for Gauge {
    fn value(&self) -> f64 {
        self.get() as f64
    }
}

/// Cells with their label values, sorted by those values.
type Cells<C> = Vec<(Vec<String>, C)>;

/// A family of cells by label values (the label names are fixed at creation), kept sorted
/// by those values: the order a `prometheus` registry writes them in.
#[derive(Debug, Clone)]
pub struct Labelled<C> {
    names: &'static [&'static str],
    cells: Arc<Mutex<Cells<C>>>,
}

impl<C: Cell> Labelled<C> {
    fn new(names: &'static [&'static str]) -> Self {
        Labelled {
            names,
            cells: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Cells<C>> {
        // A panic elsewhere while holding the lock leaves the cells consistent (each
        // change is one push or one atomic add), so a poisoned lock is still usable.
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cell for these label values (in the family's label order), created at zero on
    /// first use. Values beyond the family's labels are ignored, missing ones are empty.
    pub fn with_label_values(&self, values: &[&str]) -> C {
        let mut cells = self.lock();
        let key = |i: usize| values.get(i).copied().unwrap_or("");
        let found = cells.binary_search_by(|(k, _)| {
            (0..self.names.len())
                .map(|i| k[i].as_str())
                .cmp((0..self.names.len()).map(key))
        });
        match found {
            Ok(i) => cells[i].1.clone(),
            Err(i) => {
                let cell = C::default();
                let k = (0..self.names.len()).map(|i| key(i).to_string()).collect();
                cells.insert(i, (k, cell.clone()));
                cell
            }
        }
    }

    fn write(&self, out: &mut Vec<u8>, name: &str, help: &str, kind: Kind) {
        let cells = self.lock();
        let mut f = Family::open(out, name, help, kind);
        for (values, cell) in cells.iter() {
            f.sample_with(
                None,
                b"",
                |t| {
                    for (n, v) in self.names.iter().zip(values) {
                        t.label(n, v);
                    }
                },
                cell.value(),
            );
        }
        f.close();
    }
}

/// A histogram over fixed buckets: observations per bucket (not cumulative), their sum and
/// their count (a handle: clones share the value).
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    state: Arc<Mutex<HistogramState>>,
}

#[derive(Debug, Default)]
struct HistogramState {
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            state: Arc::new(Mutex::new(HistogramState {
                buckets: vec![0; bounds.len()],
                ..HistogramState::default()
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HistogramState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one observation.
    pub fn observe(&self, v: f64) {
        let mut s = self.lock();
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            s.buckets[i] += 1;
        }
        s.sum += v;
        s.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.lock().count
    }

    /// Observations so far at or below `bound` (a bucket's cumulative count).
    pub fn count_at_most(&self, bound: f64) -> u64 {
        let s = self.lock();
        self.bounds
            .iter()
            .zip(&s.buckets)
            .filter(|(b, _)| **b <= bound)
            .map(|(_, n)| n)
            .sum()
    }

    fn write(&self, out: &mut Vec<u8>, name: &str, help: &str) {
        let s = self.lock();
        let mut f = Family::open(out, name, help, Kind::Histogram);
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&s.buckets) {
            cumulative += n;
            f.sample_with(
                Some("_bucket"),
                b"",
                |t| t.label_f64("le", *bound),
                cumulative as f64,
            );
        }
        f.sample_with(
            Some("_bucket"),
            b"",
            |t| t.label("le", "+Inf"),
            s.count as f64,
        );
        f.sample_with(Some("_sum"), b"", |_| {}, s.sum);
        f.sample_with(Some("_count"), b"", |_| {}, s.count as f64);
        f.close();
    }
}

fn write_gauge(out: &mut Vec<u8>, name: &str, help: &str, g: &IntGauge) {
    let mut f = Family::open(out, name, help, Kind::Gauge);
    f.sample(b"", g.get() as f64);
    f.close();
}

impl SelfMetrics {
    /// Records a full poll of `snap` that took `took`: its latency, its NVML errors, the GPUs
    /// by health and the poll's wall time.
    pub fn record_poll(&self, snap: &Snapshot, took: Duration) {
        self.poll_duration.observe(took.as_secs_f64());
        for (call, n) in &snap.errors {
            self.nvml_errors.with_label_values(&[call]).inc_by(*n);
        }
        let (mut ok, mut degraded, mut lost) = (0, 0, 0);
        for g in &snap.gpus {
            match g.health {
                GpuHealth::Ok => ok += 1,
                GpuHealth::Degraded(_) => degraded += 1,
                GpuHealth::Lost(_) => lost += 1,
            }
        }
        self.gpus.with_label_values(&["ok"]).set(ok);
        self.gpus.with_label_values(&["degraded"]).set(degraded);
        self.gpus.with_label_values(&["lost"]).set(lost);
        let unix = snap
            .wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.last_poll.set(unix);
    }

    /// Every self metric at zero; `version` goes into `gpu_warden_build_info`. Fails only
    /// if a metric's name were invalid.
    pub fn new(version: &str) -> Result<SelfMetrics, prometheus::Error> {
        let annotation_patches = Labelled::new(&["result"]);
        // Series that exist from the start, so `increase()` sees the first error too (a
        // labelled counter otherwise appears at 1 and its first increment is invisible).
        for result in ["success", "error"] {
            annotation_patches.with_label_values(&[result]);
        }
        Ok(SelfMetrics {
            version: Arc::from(version),
            poll_duration: Histogram::new(&POLL_BUCKETS),
            nvml_errors: Labelled::new(&["call"]),
            evictions: Labelled::new(&["namespace", "result"]),
            decisions: Labelled::new(&["escalated", "mode", "trigger"]),
            decision_evictions: Histogram::new(&DECISION_EVICTION_BUCKETS),
            guard_stops: Labelled::new(&["result"]),
            guard_stop_permitted: IntGauge::new(
                "gpu_warden_guard_stop_permitted",
                "1 when the agent may stop or kill a victim's GPU processes (CAP_KILL), 0 when it evicts only.",
            )?,
            annotation_patches,
            annotation_last_success: IntGauge::new(
                "gpu_warden_node_annotation_last_success_timestamp_seconds",
                "Unix time of the last successful annotation patch.",
            )?,
            invisible_processes: IntGauge::new(
                "gpu_warden_invisible_processes",
                "GPU processes whose /proc entry the agent cannot read (missing hostPID: true?).",
            )?,
            gpus: Labelled::new(&["state"]),
            last_poll: IntGauge::new(
                "gpu_warden_last_poll_timestamp_seconds",
                "Unix time of the last full poll.",
            )?,
            figures_channel: Labelled::new(&["channel"]),
        })
    }

    /// Appends every self family to `out`, sorted by name; a labelled family with no
    /// series yet is left out, as a registry leaves it out.
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut f = Family::open(
            out,
            "gpu_warden_build_info",
            "Build information; always 1.",
            Kind::Gauge,
        );
        f.sample_with(None, b"", |t| t.label("version", &self.version), 1.0);
        f.close();
        self.evictions.write(
            out,
            "gpu_warden_evictions_total",
            "Eviction requests by the OOM guard, by pod namespace and result.",
            Kind::Counter,
        );
        self.gpus.write(
            out,
            "gpu_warden_gpus",
            "GPUs seen by the agent, by health state.",
            Kind::Gauge,
        );
        self.decision_evictions.write(
            out,
            "gpu_warden_guard_decision_evictions",
            "Pods each enforce-mode decision of the OOM guard evicted.",
        );
        self.decisions.write(
            out,
            "gpu_warden_guard_decisions_total",
            "Decisions the OOM guard took, by mode, trigger and whether one was taken while memory was on its way back (escalated).",
            Kind::Counter,
        );
        write_gauge(
            out,
            "gpu_warden_guard_stop_permitted",
            "1 when the agent may stop or kill a victim's GPU processes (CAP_KILL), 0 when it evicts only.",
            &self.guard_stop_permitted,
        );
        self.guard_stops.write(
            out,
            "gpu_warden_guard_stops_total",
            "GPU processes of eviction victims the OOM guard stopped, killed or resumed (or could not), by result.",
            Kind::Counter,
        );
        write_gauge(
            out,
            "gpu_warden_invisible_processes",
            "GPU processes whose /proc entry the agent cannot read (missing hostPID: true?).",
            &self.invisible_processes,
        );
        write_gauge(
            out,
            "gpu_warden_last_poll_timestamp_seconds",
            "Unix time of the last full poll.",
            &self.last_poll,
        );
        write_gauge(
            out,
            "gpu_warden_node_annotation_last_success_timestamp_seconds",
            "Unix time of the last successful annotation patch.",
            &self.annotation_last_success,
        );
        self.annotation_patches.write(
            out,
            "gpu_warden_node_annotation_patches_total",
            "PATCH requests of the Node's free-VRAM annotations, by result.",
            Kind::Counter,
        );
        self.nvml_errors.write(
            out,
            "gpu_warden_nvml_errors_total",
            "NVML calls that failed, by call.",
            Kind::Counter,
        );
        self.poll_duration.write(
            out,
            "gpu_warden_poll_duration_seconds",
            "Wall time of one full poll of every GPU, in seconds.",
        );
        self.figures_channel.write(
            out,
            "gpu_warden_vram_figures_channel",
            "1 for the object that carries the current free-VRAM figures: the agent's Lease, or the Node alone when there is no Lease.",
            Kind::Gauge,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{
        Histogram as PromHistogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry,
    };

    /// The registry the cells replaced, built as before: the oracle for the bytes.
    struct Oracle {
        registry: Registry,
        poll: PromHistogram,
        decision_evictions: PromHistogram,
        errors: IntCounterVec,
        evictions: IntCounterVec,
        decisions: IntCounterVec,
        stops: IntCounterVec,
        patches: IntCounterVec,
        gpus: IntGaugeVec,
        gauges: [IntGauge; 4],
    }

    fn oracle(version: &str) -> Oracle {
        let registry = Registry::new();
        let poll = PromHistogram::with_opts(
            HistogramOpts::new(
                "gpu_warden_poll_duration_seconds",
                "Wall time of one full poll of every GPU, in seconds.",
            )
            .buckets(POLL_BUCKETS.to_vec()),
        )
        .unwrap();
        let vec = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).unwrap()
        };
        let errors = vec(
            "gpu_warden_nvml_errors_total",
            "NVML calls that failed, by call.",
            &["call"],
        );
        let evictions = vec(
            "gpu_warden_evictions_total",
            "Eviction requests by the OOM guard, by pod namespace and result.",
            &["namespace", "result"],
        );
        let decisions = vec(
            "gpu_warden_guard_decisions_total",
            "Decisions the OOM guard took, by mode, trigger and whether one was taken while memory was on its way back (escalated).",
            &["escalated", "mode", "trigger"],
        );
        let decision_evictions = PromHistogram::with_opts(
            HistogramOpts::new(
                "gpu_warden_guard_decision_evictions",
                "Pods each enforce-mode decision of the OOM guard evicted.",
            )
            .buckets(DECISION_EVICTION_BUCKETS.to_vec()),
        )
        .unwrap();
        let stops = vec(
            "gpu_warden_guard_stops_total",
            "GPU processes of eviction victims the OOM guard stopped, killed or resumed (or could not), by result.",
            &["result"],
        );
        let patches = vec(
            "gpu_warden_node_annotation_patches_total",
            "PATCH requests of the Node's free-VRAM annotations, by result.",
            &["result"],
        );
        let gpus = IntGaugeVec::new(
            Opts::new(
                "gpu_warden_gpus",
                "GPUs seen by the agent, by health state.",
            ),
            &["state"],
        )
        .unwrap();
        let gauges = [
            IntGauge::new(
                "gpu_warden_node_annotation_last_success_timestamp_seconds",
                "Unix time of the last successful annotation patch.",
            )
            .unwrap(),
            IntGauge::new(
                "gpu_warden_invisible_processes",
                "GPU processes whose /proc entry the agent cannot read (missing hostPID: true?).",
            )
            .unwrap(),
            IntGauge::new(
                "gpu_warden_last_poll_timestamp_seconds",
                "Unix time of the last full poll.",
            )
            .unwrap(),
            IntGauge::new(
                "gpu_warden_guard_stop_permitted",
                "1 when the agent may stop or kill a victim's GPU processes (CAP_KILL), 0 when it evicts only.",
            )
            .unwrap(),
        ];
        let build_info = IntGaugeVec::new(
            Opts::new("gpu_warden_build_info", "Build information; always 1."),
            &["version"],
        )
        .unwrap();
        build_info.with_label_values(&[version]).set(1);
        for result in ["success", "error"] {
            patches.with_label_values(&[result]);
        }
        registry.register(Box::new(poll.clone())).unwrap();
        registry
            .register(Box::new(decision_evictions.clone()))
            .unwrap();
        for c in [&errors, &evictions, &decisions, &stops, &patches] {
            registry.register(Box::new(c.clone())).unwrap();
        }
        for g in &gauges {
            registry.register(Box::new(g.clone())).unwrap();
        }
        registry.register(Box::new(gpus.clone())).unwrap();
        registry.register(Box::new(build_info)).unwrap();
        Oracle {
            registry,
            poll,
            decision_evictions,
            errors,
            evictions,
            decisions,
            stops,
            patches,
            gpus,
            gauges,
        }
    }

    fn text(m: &SelfMetrics) -> String {
        let mut out = Vec::new();
        m.write(&mut out);
        String::from_utf8(out).unwrap()
    }

    fn oracle_text(o: &Oracle) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&o.registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn renders_byte_for_byte_as_the_registry_did() {
        let version = "1.2.3-\"dev\"\\\n";
        let (m, o) = (SelfMetrics::new(version).unwrap(), oracle(version));
        assert_eq!(text(&m), oracle_text(&o), "fresh");
        for (i, took) in [0.00005, 0.0001, 0.00085, 0.003, 0.3, 7.0, 0.1 + 0.2]
            .into_iter()
            .enumerate()
        {
            m.poll_duration.observe(took);
            o.poll.observe(took);
            let call = ["power", "memory", "a\"b\\c\nd"][i % 3];
            m.nvml_errors
                .with_label_values(&[call])
                .inc_by(i as u64 + 1);
            o.errors.with_label_values(&[call]).inc_by(i as u64 + 1);
            let (ns, result) = (["ci", "batch", "ci"][i % 3], ["evicted", "refused"][i % 2]);
            m.evictions.with_label_values(&[ns, result]).inc();
            o.evictions.with_label_values(&[ns, result]).inc();
            let trigger = ["soft", "hard", "trend"][i % 3];
            let escalated = ["false", "true"][i % 2];
            m.decisions
                .with_label_values(&[escalated, "enforce", trigger])
                .inc();
            o.decisions
                .with_label_values(&[escalated, "enforce", trigger])
                .inc();
            m.decision_evictions.observe((i % 4) as f64);
            o.decision_evictions.observe((i % 4) as f64);
            m.annotation_patches.with_label_values(&["success"]).inc();
            o.patches.with_label_values(&["success"]).inc();
            let stop = ["stopped", "resumed", "refused"][i % 3];
            m.guard_stops.with_label_values(&[stop]).inc_by(2);
            o.stops.with_label_values(&[stop]).inc_by(2);
            for (state, n) in [("ok", 8 - i as i64), ("lost", i as i64), ("degraded", 0)] {
                m.gpus.with_label_values(&[state]).set(n);
                o.gpus.with_label_values(&[state]).set(n);
            }
            let mine = [
                &m.annotation_last_success,
                &m.invisible_processes,
                &m.last_poll,
                &m.guard_stop_permitted,
            ];
            for (k, (a, b)) in mine.into_iter().zip(&o.gauges).enumerate() {
                let v = 1_780_000_000 * (k as i64 % 2) + i as i64 - 3;
                a.set(v);
                b.set(v);
            }
            assert_eq!(text(&m), oracle_text(&o), "after observation {i}");
        }
        assert_eq!(m.poll_duration.count(), 7);
        assert_eq!(m.decision_evictions.count_at_most(1.0), 4);
        assert_eq!(m.evictions.with_label_values(&["ci", "evicted"]).get(), 3);
    }

    #[test]
    fn clones_share_cells() {
        let m = SelfMetrics::new("v").unwrap();
        let c = m.clone();
        c.decisions
            .with_label_values(&["false", "dry-run", "soft"])
            .inc();
        c.gpus.with_label_values(&["ok"]).set(3);
        assert_eq!(
            m.decisions
                .with_label_values(&["false", "dry-run", "soft"])
                .get(),
            1
        );
        assert_eq!(m.gpus.with_label_values(&["ok"]).get(), 3);
        let t = text(&m);
        assert!(
            t.contains("gpu_warden_guard_decisions_total{escalated=\"false\",mode=\"dry-run\",trigger=\"soft\"} 1\n"),
            "{t}"
        );
        assert!(!t.contains("gpu_warden_evictions_total"), "{t}");
    }
}
