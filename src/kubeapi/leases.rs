//! Leases: the agent's Lease writer (read, create, replace) and the carried figures read at
//! start, the extender's watch of the agents' Leases.

use crate::{Call, Watched};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

/// The Leases of one namespace.
#[derive(Clone)]
pub struct Leases(Api<Lease>);

impl Leases {
    /// One namespace's.
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Self(Api::namespaced(client, namespace))
    }

    /// GET one Lease; `None` when it does not exist.
    pub fn get_opt<'a>(&'a self, name: &'a str) -> Call<'a, Option<Lease>> {
        Box::pin(self.0.get_opt(name))
    }

    /// POST a new Lease.
    pub fn create<'a>(&'a self, params: &'a PostParams, lease: &'a Lease) -> Call<'a, Lease> {
        Box::pin(self.0.create(params, lease))
    }

    /// PUT a Lease over the one of its `resourceVersion`.
    pub fn replace<'a>(
        &'a self,
        name: &'a str,
        params: &'a PostParams,
        lease: &'a Lease,
    ) -> Call<'a, Lease> {
        Box::pin(self.0.replace(name, params, lease))
    }

    /// kube-runtime's watcher with its default backoff.
    pub fn watched(self, config: watcher::Config) -> Watched<Lease> {
        watcher::watcher(self.0, config).default_backoff().boxed()
    }
}
