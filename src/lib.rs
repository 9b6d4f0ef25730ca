//! gpu-warden: a per-node GPU agent.
//!
//! The data flows one way (docs/architecture.md): [`sample`] produces a
//! [`model::snapshot::Snapshot`] per poll, [`attribute`] says which pod owns each GPU process,
//! [`guard`] decides evictions and [`publish`] renders metrics, annotations and `/state` from
//! it; [`act`] carries decisions and patches to the Kubernetes API; [`agent`] runs one step
//! per poll and the event loop around it, wired by [`agent::build`] from [`config`]; [`model`]
//! is the vocabulary below them all. [`extender`] is the scheduler side, reading what the
//! agents annotate.
//!
//! Each room is its own crate (`src/<room>/Cargo.toml`), whose manifest names the rooms it may
//! use, so the compiler keeps the walls; this facade re-exports them under their room names
//! for the binary and the end-to-end tests. The test kit is the `gpu-warden-testkit` crate,
//! a dev-dependency only.

pub use gpu_warden_act as act;
pub use gpu_warden_agent as agent;
pub use gpu_warden_attribute as attribute;
pub use gpu_warden_config as config;
pub use gpu_warden_extender as extender;
pub use gpu_warden_guard as guard;
pub use gpu_warden_kubeapi as kubeapi;
pub use gpu_warden_model as model;
pub use gpu_warden_publish as publish;
pub use gpu_warden_sample as sample;
