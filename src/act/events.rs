//! The Kubernetes Event objects (events.k8s.io/v1, the one API they are sent through) of a guard decision, built
//! from the drafts `guard::notes` writes. Pure construction; `act::enforce` sends them.

use crate::guard::notes::{
    event_name_prefix, regarding_name, reporting_instance, truncate_note, EventDraft, Regarding,
    NOTE_LIMIT, REPORTING_CONTROLLER,
};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use std::time::{SystemTime, UNIX_EPOCH};

fn object_reference(regarding: &Regarding) -> ObjectReference {
    match regarding {
        Regarding::Pod {
            namespace,
            name,
            uid,
        } => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.clone()),
            name: Some(name.clone()),
            uid: Some(uid.clone()),
            ..ObjectReference::default()
        },
        // The kubelet puts the node name in `uid` of its Node Events, and `kubectl describe
        // node` selects Events by that: doing the same makes ours show up there.
        Regarding::Node { name } => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.clone()),
            uid: Some(name.clone()),
            ..ObjectReference::default()
        },
    }
}

fn timestamp(at: SystemTime) -> Timestamp {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    // Sub-microsecond digits are dropped by MicroTime anyway.
    let nanos = i32::try_from(since.subsec_micros() * 1000).unwrap_or(0);
    Timestamp::new(secs, nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The `events.k8s.io/v1` Event for `draft`, observed at `at` by the agent on `node`.
pub fn events_v1(draft: &EventDraft, node: &str, at: SystemTime) -> Event {
    Event {
        metadata: ObjectMeta {
            generate_name: Some(event_name_prefix(regarding_name(&draft.regarding))),
            namespace: Some(draft.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(timestamp(at))),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(reporting_instance(node)),
        action: Some(draft.action.into()),
        reason: Some(draft.reason.into()),
        note: Some(truncate_note(draft.note.clone(), NOTE_LIMIT)),
        type_: Some(draft.type_.as_str().into()),
        regarding: Some(object_reference(&draft.regarding)),
        ..Event::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::notes::*;

    #[test]
    fn api_objects_carry_every_required_field() {
        let draft = EventDraft {
            namespace: "ci".into(),
            regarding: Regarding::Pod {
                namespace: "ci".into(),
                name: "job-1".into(),
                uid: "u-1".into(),
            },
            type_: EventType::Warning,
            reason: REASON_PRESSURE,
            action: ACTION_EVICT,
            note: "x".repeat(2000),
        };
        let at = UNIX_EPOCH + std::time::Duration::from_nanos(1_700_000_000_123_456_789);
        let v = serde_json::to_value(events_v1(&draft, "gpu-1", at)).unwrap();
        assert_eq!(v["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v["kind"], "Event");
        assert_eq!(v["metadata"]["generateName"], "job-1.");
        assert_eq!(v["metadata"]["namespace"], "ci");
        assert_eq!(v["eventTime"], "2023-11-14T22:13:20.123456Z");
        assert_eq!(v["reportingController"], REPORTING_CONTROLLER);
        assert_eq!(v["reportingInstance"], "gpu-warden-gpu-1");
        assert_eq!(v["action"], "Evict");
        assert_eq!(v["reason"], "GPUMemoryPressure");
        assert_eq!(v["type"], "Warning");
        assert_eq!(v["note"].as_str().unwrap().len(), NOTE_LIMIT);
        assert_eq!(
            v["regarding"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "namespace": "ci", "name": "job-1", "uid": "u-1"})
        );

        let node = EventDraft {
            namespace: NODE_EVENT_NAMESPACE.into(),
            regarding: Regarding::Node {
                name: "gpu-1".into(),
            },
            note: "n".into(),
            ..draft
        };
        let n = serde_json::to_value(events_v1(&node, "gpu-1", at)).unwrap();
        assert_eq!(n["metadata"]["namespace"], "default");
        assert_eq!(
            n["regarding"],
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "gpu-1"})
        );
        assert_eq!(n["note"], "n");
    }
}
