//! The typed Kubernetes API calls of the agent and the extender: every read, write and watch
//! that decodes a Pod, Node, Lease or Event, through one handle per object kind (`Pods`,
//! `Nodes`, `Leases`, `Events`). Each call is a plain method over one concrete type that
//! returns a boxed future or stream, so kube's generic request code and the `k8s-openapi`
//! deserializer behind it are compiled here once, not again in every room that makes the
//! call (rustc compiles a generic function, and an `async` state machine, in the crate that
//! uses it; docs/architecture.md, "Crates", and docs/performance.md for what that cost). The
//! callers keep their own timeouts, retries and error wording: this room only makes the call.

pub mod decode;
mod events;
mod leases;
mod nodes;
mod pods;

pub use events::Events;
pub use leases::Leases;
pub use nodes::Nodes;
pub use pods::Pods;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kube::runtime::watcher;

/// One API call's answer, boxed.
pub type Call<'a, T> = BoxFuture<'a, kube::Result<T>>;

/// A watch request's events, boxed.
pub type WatchEvents<K> = BoxStream<'static, kube::Result<kube::api::WatchEvent<K>>>;

/// kube-runtime's watcher (list, then watch, relisting as it must) with its default backoff
/// on errors, boxed.
pub type Watched<K> = BoxStream<'static, watcher::Result<watcher::Event<K>>>;
