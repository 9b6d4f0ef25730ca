//! gpu-warden's integration tests, one crate: the real binary and library against the
//! simulated GPU backend, the Kubernetes API server double and a fake kubelet, over real
//! HTTP, gRPC and unix sockets. One module per area; `support` is the shared kit (the
//! agent process, HTTP helpers). Run one area with `cargo test --test e2e <module>::`.

// Tests measure real elapsed time (timeouts, latencies); the core they drive reads the
// injected clock.
#![allow(clippy::disallowed_methods)]

mod kubelet;
mod support;

// Counts allocations per thread (for `alloc_budget`); every request goes on to the system
// allocator unchanged.
#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

mod agent_binary;
mod agent_kube_e2e;
mod alloc_budget;
mod annotations_e2e;
mod architecture;
mod attribution_e2e;
mod cuda_e2e;
mod enforce_e2e;
mod extender_e2e;
mod extender_wire;
mod golden_exposition;
mod guard_api_faults;
mod guard_refusals;
mod guard_scenarios;
mod guard_stop;
mod http_abuse;
mod http_tls_auth;
mod job_peaks_e2e;
mod job_usage_e2e;
mod lease_e2e;
mod node_freshness_e2e;
mod outage_budget;
mod pod_view_guard;
mod pod_watch_faults;
mod podresources_e2e;
mod podresources_forms;
mod podresources_kubelet;
mod process_metrics;
mod proptest_parsers;
mod reliability_faults;
mod soak;
mod web_config_file;
