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
