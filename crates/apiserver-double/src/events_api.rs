//! Events through core/v1 and events.k8s.io/v1: create, patch, get, list. A list shows the
//! Events created through either API in the listed API's shape, with its field selector.

use hyper::{Method, Response};
use serde_json::{json, Map, Value};

use crate::http::{error, json_response, ok, Ctx, RespBody};
use crate::patch_request::apply_patch;
use crate::record::{EventApi, StoredEvent};
use crate::selector::FieldSelector;
use crate::state::Shared;
use crate::{status, util};

fn event_group(api: EventApi) -> &'static str {
    match api {
        EventApi::CoreV1 => "",
        EventApi::EventsV1 => "events.k8s.io",
    }
}

pub(crate) fn events_collection(
    shared: &Shared,
    ctx: &Ctx,
    api: EventApi,
    ns: &str,
) -> Response<RespBody> {
    match ctx.method {
        Method::GET => shared.read(|s| {
            let fields = match FieldSelector::parse(ctx.param("fieldSelector").unwrap_or("")) {
                Ok(f) => f,
                Err(e) => return error(400, &format!("invalid fieldSelector: {e}")),
            };
            // One Event resource behind both APIs, as in the API server: an Event created
            // through one is listed through the other in that API's shape (GitLab Runner
            // lists the core/v1 view of the agent's events.k8s.io/v1 Events).
            let items: Vec<Value> = s
                .events
                .iter()
                .filter(|e| e.namespace == ns)
                .map(|e| match (e.api, api) {
                    (a, b) if a == b => e.object.clone(),
                    (EventApi::EventsV1, EventApi::CoreV1) => core_view(&e.object),
                    _ => events_view(&e.object),
                })
                .filter(|o| fields.matches(o))
                .collect();
            ok(&json!({
                "kind": "EventList",
                "apiVersion": api.api_version(),
                "metadata": {"resourceVersion": s.rv.to_string()},
                "items": items
            }))
        }),
        Method::POST => create_event(shared, ctx, api, ns),
        _ => error(
            405,
            "the server does not allow this method on the requested resource",
        ),
    }
}

fn create_event(shared: &Shared, ctx: &Ctx, api: EventApi, ns: &str) -> Response<RespBody> {
    let mut obj: Value = match serde_json::from_slice(&ctx.body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return error(400, "an Event must be a JSON object"),
        Err(e) => return error(400, &format!("the Event is not valid JSON: {e}")),
    };
    if let Some(k) = obj.get("kind").and_then(Value::as_str) {
        if k != "Event" {
            return error(400, &format!("expected kind Event, got {k:?}"));
        }
    }
    if let Some(v) = obj.get("apiVersion").and_then(Value::as_str) {
        if v != api.api_version() {
            return error(
                400,
                &format!(
                    "apiVersion {v:?} does not match the request's {:?}",
                    api.api_version()
                ),
            );
        }
    }
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Map::new());
    }
    if let Some(body_ns) = obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        if !body_ns.is_empty() && body_ns != ns {
            return error(
                400,
                "the namespace of the provided object does not match the namespace sent on the request",
            );
        }
    }
    let given = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let generate = obj
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let name = match (given, generate) {
        (Some(n), _) => n,
        (None, Some(prefix)) => format!("{prefix}{}", util::name_suffix()),
        (None, None) => return json_response(
            422,
            &status::failure(
                422,
                "Invalid",
                "Event is invalid: metadata.name: Required value: name or generateName is required",
            ),
        ),
    };
    let dry_run = ctx.dry_run();
    shared.mutate(|s| {
        if s.events
            .iter()
            .any(|e| e.api == api && e.namespace == ns && e.name == name)
        {
            let mut st = status::failure(
                409,
                "AlreadyExists",
                &format!(
                    "events{} \"{name}\" already exists",
                    dotted(event_group(api))
                ),
            );
            st["details"] = json!({"name": name, "group": event_group(api), "kind": "events"});
            return json_response(409, &st);
        }
        let rv = s.bump();
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        meta["namespace"] = json!(ns);
        meta["uid"] = json!(util::new_uid());
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!(util::now_rfc3339());
        if let Some(o) = obj.as_object_mut() {
            o.entry("kind").or_insert(json!("Event"));
            o.entry("apiVersion").or_insert(json!(api.api_version()));
        }
        if !dry_run {
            s.events.push(StoredEvent {
                api,
                namespace: ns.to_string(),
                name: name.clone(),
                object: obj.clone(),
            });
        }
        json_response(201, &obj)
    })
}

/// (events.k8s.io/v1 field, core/v1 field) of one Event resource, as kubernetes converts
/// between the two (pkg/apis/events/v1/conversion.go, `Convert_v1_Event_To_core_Event` and
/// back).
const RENAMES: [(&str, &str); 15] = [
    ("metadata", "metadata"),
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("related", "related"),
    ("series", "series"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("eventTime", "eventTime"),
    ("action", "action"),
    ("reason", "reason"),
    ("type", "type"),
];

/// The core/v1 view of an events.k8s.io/v1 Event.
fn core_view(e: &Value) -> Value {
    let mut out = json!({"kind": "Event", "apiVersion": "v1"});
    for (from, to) in RENAMES {
        if let Some(v) = e.get(from) {
            out[to] = v.clone();
        }
    }
    out
}

/// The events.k8s.io/v1 view of a core/v1 Event.
fn events_view(e: &Value) -> Value {
    let mut out = json!({"kind": "Event", "apiVersion": "events.k8s.io/v1"});
    for (to, from) in RENAMES {
        if let Some(v) = e.get(from) {
            out[to] = v.clone();
        }
    }
    out
}

fn dotted(group: &str) -> String {
    if group.is_empty() {
        String::new()
    } else {
        format!(".{group}")
    }
}

pub(crate) fn event_item(
    shared: &Shared,
    ctx: &Ctx,
    api: EventApi,
    ns: &str,
    name: &str,
) -> Response<RespBody> {
    let not_found = || json_response(404, &status::not_found("events", event_group(api), name));
    let dry_run = ctx.dry_run();
    shared.mutate(|s| {
        let Some(idx) = s
            .events
            .iter()
            .position(|e| e.api == api && e.namespace == ns && e.name == name)
        else {
            return not_found();
        };
        match ctx.method {
            Method::GET => ok(&s.events[idx].object),
            Method::PATCH => {
                let mut patched = match apply_patch(&s.events[idx].object, ctx) {
                    Ok(p) => p,
                    Err(e) => return e.into_response(),
                };
                let rv = s.bump();
                patched["metadata"]["name"] = json!(name);
                patched["metadata"]["namespace"] = json!(ns);
                patched["metadata"]["resourceVersion"] = json!(rv.to_string());
                if !dry_run {
                    s.events[idx].object = patched.clone();
                }
                ok(&patched)
            }
            _ => error(
                405,
                "the server does not allow this method on the requested resource",
            ),
        }
    })
}
