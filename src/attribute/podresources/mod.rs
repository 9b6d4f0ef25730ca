//! The kubelet's pod-resources API (`v1.PodResourcesLister`, docs/attribution.md): which pod holds
//! which GPU replica, before any CUDA process exists.
//!
//! [`model`] is pure: it reduces the kubelet's `List` and `GetAllocatableResources` answers
//! (and the pod view's verdict on terminal pods) to a `model::replicas::KubeletAnswer`.
//! [`client`] is the shell: one gRPC channel over the kubelet's unix socket. [`feed`] polls
//! it on its own cadence, publishes the latest answer, and matches it with each poll's GPUs
//! into the `model::replicas::ReplicaView` the metrics, the annotations and `/state` read.

pub mod client;
pub mod feed;
pub mod model;

/// Code generated from the kubelet's `api.proto` (see `tools/podresources-gen`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod generated;
