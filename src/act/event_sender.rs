//! Sends Events: `events.k8s.io/v1` first, and core/v1 from the first 404 on, for API
//! servers that do not serve the newer group. Best effort: the caller logs a failure and
//! carries on. Used by the enforcer (a decision's Events) and the agent (a CI job's VRAM
//! peak).

use super::events;
use crate::guard::notes::EventDraft;
use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

/// Why an Event was not created: the API group tried and the client's error.
#[derive(Debug, thiserror::Error)]
#[error("{api}: {source}")]
pub struct EventError {
    /// `events.k8s.io/v1` or `v1`.
    pub api: &'static str,
    #[source]
    pub source: kube::Error,
}

/// Creates Events for the agent on one node.
pub struct EventSender {
    client: kube::Client,
    node: String,
    /// Set once the API server answered 404 for `events.k8s.io` and a core/v1 Event went
    /// through instead: later Events skip the doomed first attempt.
    core_events_only: AtomicBool,
}

impl EventSender {
    /// A sender through `client` for Events reported by the agent on `node`.
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        EventSender {
            client,
            node: node.into(),
            core_events_only: AtomicBool::new(false),
        }
    }

    /// Creates the Event of `draft`, observed at `at`.
    pub async fn send(&self, draft: &EventDraft, at: SystemTime) -> Result<(), EventError> {
        let pp = PostParams::default();
        let mut fell_back = false;
        if !self.core_events_only.load(Ordering::Relaxed) {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &draft.namespace);
            match api
                .create(&pp, &events::events_v1(draft, &self.node, at))
                .await
            {
                // A 2xx whose body does not parse is still a created Event.
                Ok(_) | Err(kube::Error::SerdeError(_)) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    tracing::info!(
                        "events.k8s.io/v1 not served (404); sending a core/v1 Event instead"
                    );
                    fell_back = true;
                }
                Err(source) => {
                    return Err(EventError {
                        api: "events.k8s.io/v1",
                        source,
                    })
                }
            }
        }
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &draft.namespace);
        match api
            .create(&pp, &events::core_v1(draft, &self.node, at))
            .await
        {
            Ok(_) | Err(kube::Error::SerdeError(_)) => {
                if fell_back {
                    self.core_events_only.store(true, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(source) => Err(EventError { api: "v1", source }),
        }
    }
}
