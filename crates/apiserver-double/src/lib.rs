//! A Kubernetes API server test double that speaks real HTTP/1.1 on loopback.
//!
//! It serves the small part of the Kubernetes API that gpu-warden uses (DESIGN §3.6): pods
//! (get, list, watch, eviction), nodes (get, list, watch, patch) and events (core/v1 and
//! events.k8s.io/v1: create, patch, and list through either API, one resource behind both as in
//! the API server), plus the discovery endpoints a client may touch. The real
//! `kube` client, its `watcher` and its `reflector` work against it.
//!
//! Objects are stored as [`serde_json::Value`], exactly as clients and tests send them. Every
//! mutation bumps one global resourceVersion and is kept in a bounded history that watches
//! replay from.
//!
//! An accepted eviction goes to a faithful kubelet ([`kubelet`]): after a watch latency the
//! container's PID 1 gets SIGTERM (which a GitLab job's shell ignores), every process of the
//! pod gets SIGKILL after `max(grace, 2 s)`, then the pod is deleted. It keeps real time, or
//! a test's simulated clock ([`Builder::kubelet_stepped`]); the instant kill of earlier
//! versions stays only as a named comparison ([`KubeletModel::Instant`]).
//!
//! Tests drive it through the [`ApiServer`] handle: seed objects, simulate foreign writers,
//! protect pods with a simulated PodDisruptionBudget, inject faults ([`Fault`]), take the server
//! down, simulate an API server restart ([`ApiServer::restart_history`]) and inspect every
//! request that reached it ([`ApiServer::requests`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), apiserver_double::Error> {
//! use apiserver_double::ApiServer;
//! use serde_json::json;
//!
//! let server = ApiServer::start().await?;
//! server.add_node(json!({"metadata": {"name": "gpu-node-1"}}))?;
//! server.add_pod(json!({
//!     "metadata": {"name": "job-1", "namespace": "ci"},
//!     "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "main", "image": "busybox"}]}
//! }))?;
//! // point kube at it: kube::Config::new(server.url().parse()?)
//! println!("{}", server.url());
//! # Ok(())
//! # }
//! ```

// A test double keeps real time: it answers, delays and expires like a real server.
#![allow(clippy::disallowed_methods)]
#![warn(missing_docs)]

pub mod cgroups;
mod discovery;
mod events_api;
mod evict;
mod fault;
mod fixtures;
mod http;
pub mod kubelet;
mod kubelet_run;
pub mod patch;
mod patch_request;
mod record;
pub mod selector;
mod server;
mod state;
mod status;
pub mod storage;
mod util;
mod watch;

pub use fault::{Fault, FaultAction};
pub use fixtures::Fixtures;
pub use hyper::Method;
pub use kubelet::{EndCause, KubeletModel, KubeletOptions, Pid1Mode, StepKind, UnknownMode};
pub use kubelet_run::{KubeletAction, PodRuntime, SteppedClock};
pub use record::{
    EventApi, EvictionOutcome, EvictionRecord, RecordedBody, RecordedRequest, StoredEvent,
};
pub use server::{ApiServer, Builder, EvictHook, RequestHook};

/// Errors from starting or feeding the API server double.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or serving the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address that was asked for.
        addr: std::net::SocketAddr,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// An object handed to the double lacks something it needs (e.g. `metadata.name`).
    #[error("invalid object: {0}")]
    InvalidObject(String),
    /// A fixtures file could not be read or parsed.
    #[error("fixtures: {0}")]
    Fixtures(String),
    /// A file (kubeconfig, request log) could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: std::path::PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
