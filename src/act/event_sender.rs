//! Sends Events, through `events.k8s.io/v1` only: every Kubernetes version the chart supports
//! serves it (GA since 1.19), and one path means one RBAC rule and one shape to test. The
//! core/v1 fallback of earlier releases is gone (issue 39). Readers of the core/v1 API
//! (`kubectl describe`, GitLab Runner's `print_pod_warning_events`) still see these Events:
//! the API server stores one Event resource and converts `note` to `message` and
//! `regarding` to `involvedObject`. Best effort: the caller logs a failure and carries on.
//! Used by the enforcer (a decision's Events) and the agent (a CI job's VRAM peak).

use super::events;
use crate::guard::notes::EventDraft;
use crate::kubeapi::Events;
use kube::api::PostParams;
use std::time::SystemTime;

/// Why an Event was not created: the API group tried and the client's error.
#[derive(Debug, thiserror::Error)]
#[error("{api}: {source}")]
pub struct EventError {
    /// Always `events.k8s.io/v1`; kept in the error so the log line names the API.
    pub api: &'static str,
    #[source]
    pub source: kube::Error,
}

/// Creates Events for the agent on one node.
pub struct EventSender {
    client: kube::Client,
    node: String,
}

impl EventSender {
    /// A sender through `client` for Events reported by the agent on `node`.
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        EventSender {
            client,
            node: node.into(),
        }
    }

    /// Creates the Event of `draft`, observed at `at`.
    /// Boxed: docs/architecture.md, "Crates".
    pub fn send<'a>(
        &'a self,
        draft: &'a EventDraft,
        at: SystemTime,
    ) -> futures::future::BoxFuture<'a, Result<(), EventError>> {
        Box::pin(self.send_inner(draft, at))
    }
    async fn send_inner(&self, draft: &EventDraft, at: SystemTime) -> Result<(), EventError> {
        let api = Events::namespaced(self.client.clone(), &draft.namespace);
        let event = events::events_v1(draft, &self.node, at);
        match api.create(&PostParams::default(), &event).await {
            // A 2xx whose body does not parse is still a created Event.
            Ok(_) | Err(kube::Error::SerdeError(_)) => Ok(()),
            Err(source) => Err(EventError {
                api: "events.k8s.io/v1",
                source,
            }),
        }
    }
}
