//! Events (`events.k8s.io/v1`): the guard's decisions and the agent's notices.

use crate::Call;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use kube::Client;

/// The Events of one namespace.
#[derive(Clone)]
pub struct Events(Api<Event>);

impl Events {
    /// One namespace's.
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Self(Api::namespaced(client, namespace))
    }

    /// POST one Event.
    pub fn create<'a>(&'a self, params: &'a PostParams, event: &'a Event) -> Call<'a, Event> {
        Box::pin(self.0.create(params, event))
    }
}
