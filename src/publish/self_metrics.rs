//! gpu-warden's own metrics: poll latency, NVML errors, build info, and the counters the
//! annotator and the guard add to. Plain `prometheus` types in a private registry; their
//! families are appended to each rendered exposition.

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Handles to the self metrics.
#[derive(Clone)]
pub struct SelfMetrics {
    registry: Registry,
    /// `gpu_warden_poll_duration_seconds`: wall time of one full poll of the GPU source.
    pub poll_duration: Histogram,
    /// `gpu_warden_nvml_errors_total{call}`.
    pub nvml_errors: IntCounterVec,
    /// `gpu_warden_evictions_total{namespace,result}`.
    pub evictions: IntCounterVec,
    /// `gpu_warden_guard_decisions_total{mode,trigger}`.
    pub decisions: IntCounterVec,
    /// `gpu_warden_node_annotation_patches_total{result}`.
    pub annotation_patches: IntCounterVec,
    /// `gpu_warden_node_annotation_last_success_timestamp_seconds`.
    pub annotation_last_success: IntGauge,
    /// `gpu_warden_invisible_processes`: GPU processes whose `/proc` entry cannot be read
    /// (the agent lacks `hostPID: true`, or `--proc-root` points at the wrong place).
    pub invisible_processes: IntGauge,
    /// `gpu_warden_gpus{state}`: GPUs by health.
    pub gpus: IntGaugeVec,
    /// `gpu_warden_last_poll_timestamp_seconds`: wall time of the last full poll.
    pub last_poll: IntGauge,
}

/// Poll-latency buckets from 100 µs to 2.5 s: NVML polls of a healthy node sit in the
/// low milliseconds, a stuck driver in seconds.
const POLL_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

impl SelfMetrics {
    /// Registers every self metric; `version` goes into `gpu_warden_build_info`.
    pub fn new(version: &str) -> Result<SelfMetrics, prometheus::Error> {
        let registry = Registry::new();
        let poll_duration = Histogram::with_opts(
            HistogramOpts::new(
                "gpu_warden_poll_duration_seconds",
                "Wall time of one full poll of every GPU, in seconds.",
            )
            .buckets(POLL_BUCKETS.to_vec()),
        )?;
        let nvml_errors = IntCounterVec::new(
            Opts::new(
                "gpu_warden_nvml_errors_total",
                "NVML calls that failed, by call.",
            ),
            &["call"],
        )?;
        let evictions = IntCounterVec::new(
            Opts::new(
                "gpu_warden_evictions_total",
                "Eviction requests by the OOM guard, by pod namespace and result.",
            ),
            &["namespace", "result"],
        )?;
        let decisions = IntCounterVec::new(
            Opts::new(
                "gpu_warden_guard_decisions_total",
                "Decisions the OOM guard took, by mode and trigger.",
            ),
            &["mode", "trigger"],
        )?;
        let annotation_patches = IntCounterVec::new(
            Opts::new(
                "gpu_warden_node_annotation_patches_total",
                "PATCH requests of the Node's free-VRAM annotations, by result.",
            ),
            &["result"],
        )?;
        let annotation_last_success = IntGauge::new(
            "gpu_warden_node_annotation_last_success_timestamp_seconds",
            "Unix time of the last successful annotation patch.",
        )?;
        let invisible_processes = IntGauge::new(
            "gpu_warden_invisible_processes",
            "GPU processes whose /proc entry the agent cannot read (missing hostPID: true?).",
        )?;
        let gpus = IntGaugeVec::new(
            Opts::new(
                "gpu_warden_gpus",
                "GPUs seen by the agent, by health state.",
            ),
            &["state"],
        )?;
        let last_poll = IntGauge::new(
            "gpu_warden_last_poll_timestamp_seconds",
            "Unix time of the last full poll.",
        )?;
        let build_info = IntGaugeVec::new(
            Opts::new("gpu_warden_build_info", "Build information; always 1."),
            &["version"],
        )?;
        build_info.with_label_values(&[version]).set(1);
        // Series that exist from the start, so `increase()` sees the first error too (a
        // labelled counter otherwise appears at 1 and its first increment is invisible).
        for result in ["success", "error"] {
            annotation_patches.with_label_values(&[result]);
        }
        registry.register(Box::new(poll_duration.clone()))?;
        registry.register(Box::new(nvml_errors.clone()))?;
        registry.register(Box::new(evictions.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(annotation_patches.clone()))?;
        registry.register(Box::new(annotation_last_success.clone()))?;
        registry.register(Box::new(invisible_processes.clone()))?;
        registry.register(Box::new(gpus.clone()))?;
        registry.register(Box::new(last_poll.clone()))?;
        registry.register(Box::new(build_info))?;
        Ok(SelfMetrics {
            registry,
            poll_duration,
            nvml_errors,
            evictions,
            decisions,
            annotation_patches,
            annotation_last_success,
            invisible_processes,
            gpus,
            last_poll,
        })
    }

    /// The current families, sorted by name.
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }
}
