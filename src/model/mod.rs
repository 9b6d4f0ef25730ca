//! The shared vocabulary every room uses, and nothing else: the snapshot of GPUs and
//! processes, pods, memory pressure, the injected clock, backoff, stable ids. No I/O, no
//! runtime; imports nothing from the rest of the crate.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
use crate as model;

pub mod backoff;
pub mod clock;
pub mod cuda;
pub mod cuda_images;
pub mod device_plugin;
pub mod event;
pub mod ids;
pub mod pod;
pub mod pressure;
pub mod proc_stat;
pub mod replicas;
pub mod snapshot;
pub mod units;
pub mod vram_request;
