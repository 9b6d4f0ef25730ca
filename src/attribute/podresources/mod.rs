//! The kubelet's pod-resources API (`v1.PodResourcesLister`, docs/attribution.md): which pod holds
//! which GPU replica, before any CUDA process exists.
//!
//! [`model`] is pure: it turns the kubelet's `List` and `GetAllocatableResources` answers
//! (and the pod view's verdict on terminal pods) into per-GPU replica counts. [`client`] is
//! the shell: one gRPC channel over the kubelet's unix socket. [`feed`] polls it on its own
//! cadence and publishes the latest [`model::ReplicaView`] for the metrics and annotations.

pub mod client;
pub mod feed;
pub mod model;

/// Code generated from the kubelet's `api.proto` (see `tools/podresources-gen`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod generated;
