//! The Kubernetes shells: the API clients, the enforcer that carries guard decisions out
//! (evictions and Events), the Event objects, and the two writers (the Node's annotations and
//! the agent's Lease) of what `publish::annotations` plans, around one writer loop.

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
