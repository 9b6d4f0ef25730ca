//! `gpu_warden_extender_*` metrics: requests, latency, verdicts by reason, the ledger and the
//! node watch.

use prometheus::{
    CounterVec, Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntGauge, Opts, Registry,
    TextEncoder,
};

/// The extender's metrics.
#[derive(Clone)]
pub struct ExtenderMetrics {
    registry: Registry,
    /// Requests by verb and HTTP status code.
    pub requests: CounterVec,
    /// Request latency by verb, seconds.
    pub latency: HistogramVec,
    /// Per-node verdicts by verb, result (pass|fail) and reason.
    pub verdicts: CounterVec,
    /// Pending reservations.
    pub reservations: IntGauge,
    /// Nodes in the cache.
    pub nodes: IntGauge,
    /// Errors of the node and pod watches.
    pub watch_errors: IntCounter,
    /// 1 once the node cache has synced.
    pub ready: Gauge,
    /// GPU-pod calls answered "not ready, retry" (cache or pod watch not synced yet).
    pub not_ready: IntCounter,
    /// Projects with a learned need.
    pub learned_projects: IntGauge,
    /// Queries of the learned-needs source by result (ok|error).
    pub learned_queries: CounterVec,
}

impl ExtenderMetrics {
    /// Registers every family.
    pub fn new() -> Result<ExtenderMetrics, prometheus::Error> {
        let registry = Registry::new();
        let requests = CounterVec::new(
            Opts::new(
                "gpu_warden_extender_requests_total",
                "Extender HTTP requests by verb and status code.",
            ),
            &["verb", "code"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "gpu_warden_extender_request_duration_seconds",
                "Time to answer an extender request, from the whole body read to the reply.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0, 5.0,
            ]),
            &["verb"],
        )?;
        let verdicts = CounterVec::new(
            Opts::new(
                "gpu_warden_extender_verdicts_total",
                "Per-node verdicts by verb, result and reason.",
            ),
            &["verb", "result", "reason"],
        )?;
        let reservations = IntGauge::new(
            "gpu_warden_extender_reservations",
            "Pods bound by this scheduler whose memory the node's annotations do not show yet.",
        )?;
        let nodes = IntGauge::new(
            "gpu_warden_extender_nodes",
            "Nodes in the extender's cache.",
        )?;
        let watch_errors = IntCounter::new(
            "gpu_warden_extender_watch_errors_total",
            "Errors of the node and pod watches (each is retried with backoff).",
        )?;
        let ready = Gauge::new(
            "gpu_warden_extender_ready",
            "1 once the node cache has synced with the API server.",
        )?;
        let not_ready = IntCounter::new(
            "gpu_warden_extender_not_ready_total",
            "GPU-pod calls answered with an error so kube-scheduler retries: the node cache or the pod watch had not synced.",
        )?;
        let learned_projects = IntGauge::new(
            "gpu_warden_extender_learned_projects",
            "GitLab projects with a need learned from their job peaks.",
        )?;
        let learned_queries = CounterVec::new(
            Opts::new(
                "gpu_warden_extender_learned_queries_total",
                "Queries of the learned-needs source (Prometheus) by result.",
            ),
            &["result"],
        )?;
        registry.register(Box::new(not_ready.clone()))?;
        registry.register(Box::new(learned_projects.clone()))?;
        registry.register(Box::new(learned_queries.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(verdicts.clone()))?;
        registry.register(Box::new(reservations.clone()))?;
        registry.register(Box::new(nodes.clone()))?;
        registry.register(Box::new(watch_errors.clone()))?;
        registry.register(Box::new(ready.clone()))?;
        Ok(ExtenderMetrics {
            registry,
            requests,
            latency,
            verdicts,
            reservations,
            nodes,
            watch_errors,
            ready,
            not_ready,
            learned_projects,
            learned_queries,
        })
    }

    /// The text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec only fails on a malformed family, which registration rules out.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}
