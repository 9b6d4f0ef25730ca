//! gpu-warden: a per-node GPU agent.
//!
//! The data flows one way (docs/architecture.md): [`sample`] produces a
//! [`model::snapshot::Snapshot`] per poll, [`attribute`] says which pod owns each GPU process,
//! [`guard`] decides evictions and [`publish`] renders metrics, annotations and `/state` from
//! it; [`act`] carries decisions and patches to the Kubernetes API; [`agent`] runs one step
//! per poll and the event loop around it, wired by [`agent::build`] from [`config`]; [`model`]
//! is the vocabulary below them all. [`extender`] is the scheduler side, reading what the
//! agents annotate. Pure rooms do no I/O; the shells are listed in docs/architecture.md and
//! the architecture test holds both to it.

pub mod act;
pub mod agent;
pub mod attribute;
pub mod config;
pub mod extender;
pub mod guard;
pub mod model;
pub mod publish;
pub mod sample;
/// Tests', the soak's and the benches' kit: compiled for them only (feature `testkit`).
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
