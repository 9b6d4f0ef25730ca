//! Everything that leaves the agent: metric families and their exposition, the HTTP
//! server, and (later) the Node annotations.

pub mod annotations;
pub mod auth;
pub mod http;
pub mod job_peaks;
pub mod metrics;
pub mod replica_metrics;
pub mod self_metrics;
pub mod state;
pub mod tls;
