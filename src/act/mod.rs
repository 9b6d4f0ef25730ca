//! The Kubernetes shells: the API clients, the enforcer that carries guard decisions out
//! (evictions and Events), the Event objects, and the node annotator that writes what
//! `publish::annotations` plans.

pub mod client;
pub mod enforce;
pub mod event_sender;
pub mod events;
pub mod eviction_answer;
pub mod lease;
pub mod node_annotations;
pub mod signal;
pub mod stop;
