//! The Kubernetes shells: the API clients, the enforcer that carries guard decisions out
//! (evictions and Events), the Event objects, and the two writers (the Node's annotations and
//! the agent's Lease) of what `publish::annotations` plans, around one writer loop.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
use crate as act;
use gpu_warden_attribute as attribute;
use gpu_warden_guard as guard;
use gpu_warden_kubeapi as kubeapi;
use gpu_warden_model as model;
use gpu_warden_publish as publish;
#[cfg(test)]
mod testkit {
    pub use gpu_warden_fixtures as fixtures;
}

pub mod client;
pub mod enforce;
pub mod event_sender;
pub mod events;
pub mod eviction_answer;
pub mod lease;
pub mod node_annotations;
pub mod read_timeout;
pub mod signal;
pub mod stop;
pub(crate) mod writer_loop;
