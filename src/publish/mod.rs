//! Everything that leaves the agent: metric families and their exposition, the HTTP
//! server with the agent's own process families, the Node annotations' values and plan, and
//! the `/state` document.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
use crate as publish;
use gpu_warden_model as model;
#[cfg(test)]
mod testkit {
    pub use gpu_warden_fixtures as fixtures;
}

pub mod annotations;
pub mod auth;
pub mod basic_auth;
pub mod cuda_mismatch;
pub mod dcgm_pod_labels;
pub mod http;
pub mod job_peaks;
pub mod job_usage;
pub mod job_usage_metrics;
pub mod metrics;
pub mod process_metrics;
pub mod process_reader;
pub mod replica_metrics;
pub mod replica_state;
pub mod self_metrics;
pub mod state;
pub mod text;
pub mod web_config;
