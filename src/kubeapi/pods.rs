//! Pods: the attribute room's view (list and watch of the node's pods), the enforcer's fresh
//! read, the extender's watch of its scheduler's pods.

use crate::{Call, WatchEvents, Watched};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, ObjectList, WatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

/// The Pods of all namespaces or of one.
#[derive(Clone)]
pub struct Pods(Api<Pod>);

impl Pods {
    /// Every namespace's.
    pub fn all(client: Client) -> Self {
        Self(Api::all(client))
    }

    /// One namespace's.
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Self(Api::namespaced(client, namespace))
    }

    /// LIST.
    pub fn list<'a>(&'a self, params: &'a ListParams) -> Call<'a, ObjectList<Pod>> {
        Box::pin(self.0.list(params))
    }

    /// WATCH from `version`.
    pub fn watch<'a>(
        &'a self,
        params: &'a WatchParams,
        version: &'a str,
    ) -> Call<'a, WatchEvents<Pod>> {
        Box::pin(async move { Ok(self.0.watch(params, version).await?.boxed()) })
    }

    /// GET one pod.
    pub fn get<'a>(&'a self, name: &'a str) -> Call<'a, Pod> {
        Box::pin(self.0.get(name))
    }

    /// kube-runtime's watcher with its default backoff.
    pub fn watched(self, config: watcher::Config) -> Watched<Pod> {
        watcher::watcher(self.0, config).default_backoff().boxed()
    }
}
