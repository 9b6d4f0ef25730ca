//! Nodes: the node annotator's merge patch, the extender's watch of the GPU nodes.

use crate::{Call, Watched};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

/// The cluster's Nodes.
#[derive(Clone)]
pub struct Nodes(Api<Node>);

impl Nodes {
    /// All of them (Nodes have no namespace).
    pub fn all(client: Client) -> Self {
        Self(Api::all(client))
    }

    /// PATCH one Node.
    pub fn patch<'a>(
        &'a self,
        name: &'a str,
        params: &'a PatchParams,
        patch: &'a Patch<&'a serde_json::Value>,
    ) -> Call<'a, Node> {
        Box::pin(self.0.patch(name, params, patch))
    }

    /// kube-runtime's watcher with its default backoff.
    pub fn watched(self, config: watcher::Config) -> Watched<Node> {
        watcher::watcher(self.0, config).default_backoff().boxed()
    }
}
