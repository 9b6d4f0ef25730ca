//! What the double records: requests, events and evictions.

use std::time::{Instant, SystemTime};

use hyper::Method;
use serde_json::{json, Value};

use crate::util;

/// One HTTP request that reached the double, in arrival order.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// A sequence number, unique for the server's lifetime.
    pub id: u64,
    /// When the request's head arrived (monotonic clock).
    pub at: Instant,
    /// When the request's head arrived (wall clock, for logs).
    pub time: SystemTime,
    /// The HTTP method.
    pub method: Method,
    /// The path, without the query string.
    pub path: String,
    /// The raw (still percent-encoded) query string; empty when there is none.
    pub query: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The request body.
    pub body: RecordedBody,
    /// The HTTP status answered; `None` while no answer has been sent (a hanging request, or
    /// one still being delayed).
    pub status: Option<u16>,
}

impl RecordedRequest {
    /// The decoded value of the first query parameter named `key`.
    pub fn query_param(&self, key: &str) -> Option<String> {
        util::parse_query(&self.query)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// All decoded query parameters, in order.
    pub fn query_params(&self) -> Vec<(String, String)> {
        util::parse_query(&self.query)
    }

    /// Whether this was a watch request (`watch=true` or `watch=1`).
    pub fn is_watch(&self) -> bool {
        self.query_param("watch")
            .is_some_and(|v| v == "true" || v == "1")
    }

    /// A JSON rendering, one object per request, as the binary's `--request-log` writes it.
    pub fn to_json(&self) -> Value {
        let body = match &self.body {
            RecordedBody::Empty => Value::Null,
            RecordedBody::Json(v) => v.clone(),
            RecordedBody::Bytes(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        };
        json!({
            "id": self.id,
            "time": util::rfc3339(self.time),
            // Sub-second precision for timing measurements (reaction times on real GPUs).
            "timeUnix": self
                .time
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            "method": self.method.as_str(),
            "path": self.path,
            "query": self.query,
            "contentType": self.content_type,
            "body": body,
            "status": self.status,
        })
    }
}

/// A recorded request body.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordedBody {
    /// No body.
    Empty,
    /// A body that parsed as JSON.
    Json(Value),
    /// A body that is not JSON.
    Bytes(Vec<u8>),
}

impl RecordedBody {
    /// The JSON body, if the body was JSON.
    pub fn json(&self) -> Option<&Value> {
        match self {
            RecordedBody::Json(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn from_bytes(b: &[u8]) -> Self {
        if b.is_empty() {
            RecordedBody::Empty
        } else {
            match serde_json::from_slice(b) {
                Ok(v) => RecordedBody::Json(v),
                Err(_) => RecordedBody::Bytes(b.to_vec()),
            }
        }
    }
}

/// Which Events API an event came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventApi {
    /// `/api/v1/namespaces/{ns}/events` (core/v1 `Event`).
    CoreV1,
    /// `/apis/events.k8s.io/v1/namespaces/{ns}/events`.
    EventsV1,
}

impl EventApi {
    /// The apiVersion of the group: `v1` or `events.k8s.io/v1`.
    pub fn api_version(self) -> &'static str {
        match self {
            EventApi::CoreV1 => "v1",
            EventApi::EventsV1 => "events.k8s.io/v1",
        }
    }
}

/// An event stored by the double (as created, then patched).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// The API the event was created through.
    pub api: EventApi,
    /// Its namespace (from the request path).
    pub namespace: String,
    /// Its name (given or generated).
    pub name: String,
    /// The object as stored (what the client sent, plus uid, resourceVersion,
    /// creationTimestamp, and any later patches).
    pub object: Value,
}

/// How the double answered an eviction request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// 201: the pod was marked for deletion and is deleted after its grace period.
    Accepted,
    /// 429: the pod is protected by the simulated PodDisruptionBudget.
    Blocked,
    /// 404: no such pod.
    NotFound,
    /// 409: `deleteOptions.preconditions.uid` names another pod than the one under that name.
    UidMismatch,
}

/// One eviction request.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionRecord {
    /// When it was answered.
    pub at: Instant,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// `deleteOptions.gracePeriodSeconds` from the Eviction body, if given.
    pub grace_period_seconds: Option<i64>,
    /// How it was answered.
    pub outcome: EvictionOutcome,
    /// The Eviction body as sent.
    pub body: Value,
}
