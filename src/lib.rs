//! gpu-warden: a per-node GPU agent.
//!
//! The data flows one way: [`sample`] produces a [`snapshot::Snapshot`] per poll,
//! [`attribute`] says which pod owns each GPU process, and [`publish`] (metrics,
//! annotations) and [`guard`] (eviction decisions) read it; [`extender`] is the scheduler
//! side, reading what the agents annotate. The pure modules
//! (`snapshot`, `clock`, `publish::metrics`, …) do no I/O; the shells live in
//! `sample::nvml`, `publish::http` and the binary's wiring.

pub mod act;
pub mod agent;
pub mod attribute;
pub mod config;
pub mod extender;
pub mod guard;
pub mod model;
pub mod publish;
pub mod sample;
pub mod testkit;
