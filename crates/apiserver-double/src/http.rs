//! Request handling: recording, faults, routing and the handlers.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Map, Value};

use crate::fault::FaultAction;
use crate::patch::{json_patch, merge_patch, JsonPatchError};
use crate::record::{
    EventApi, EvictionOutcome, EvictionRecord, RecordedBody, RecordedRequest, StoredEvent,
};
use crate::selector::{FieldSelector, LabelSelector};
use crate::state::{Kind, Shared};
use crate::{status, util, watch};

pub(crate) type RespBody = BoxBody<Bytes, std::io::Error>;

/// Request bodies above this answer 413.
const MAX_BODY: usize = 16 << 20;

fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

fn json_response(code: u16, v: &Value) -> Response<RespBody> {
    let mut body = serde_json::to_vec(v).unwrap_or_default();
    body.push(b'\n');
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error(code: u16, message: &str) -> Response<RespBody> {
    json_response(code, &status::failure_code(code, message))
}

fn ok(v: &Value) -> Response<RespBody> {
    json_response(200, v)
}

/// A failure answer: a `Status` body and its HTTP code.
struct ApiError {
    code: u16,
    status: Value,
}

impl ApiError {
    fn new(code: u16, message: &str) -> Self {
        ApiError {
            code,
            status: status::failure_code(code, message),
        }
    }

    fn with_status(code: u16, status: Value) -> Self {
        ApiError { code, status }
    }

    fn into_response(self) -> Response<RespBody> {
        json_response(self.code, &self.status)
    }
}

/// One request, read and decoded.
struct Ctx {
    method: Method,
    path: String,
    params: Vec<(String, String)>,
    content_type: Option<String>,
    body: Bytes,
    drop_after: Option<usize>,
    /// How a watch misbehaves ([`FaultAction::StallWatch`] and the like).
    watch_fault: Option<watch::WatchFault>,
}

impl Ctx {
    fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        self.param(key).is_some_and(|v| v == "true" || v == "1")
    }

    fn dry_run(&self) -> bool {
        self.param("dryRun").is_some_and(|v| v == "All")
    }
}

/// The connection is to be broken without an answer ([`FaultAction::DropAfterBody`]).
#[derive(Debug)]
pub(crate) struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("injected fault: connection dropped after the request body")
    }
}

impl std::error::Error for DropConnection {}

/// Handles one request in a task of its own, as a real API server does: a request the
/// client gave up on (timeout, closed connection) is still carried out.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, DropConnection> {
    let mut shutdown = shared.shutdown.subscribe();
    let task = tokio::spawn(handle_inner(shared, req));
    tokio::select! {
        joined = task => joined.unwrap_or_else(|_| Ok(error(500, "apiserver-double: handler panicked"))),
        _ = shutdown.wait_for(|down| *down) => Err(DropConnection),
    }
}

/// Records the request, applies the down state, the freeze and faults, routes it.
async fn handle_inner(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, DropConnection> {
    let at = Instant::now();
    let time = SystemTime::now();
    let (parts, body) = req.into_parts();
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (bytes, too_large) = match Limited::new(body, MAX_BODY).collect().await {
        Ok(c) => (c.to_bytes(), false),
        Err(_) => (Bytes::new(), true),
    };
    let params = util::parse_query(&query);
    let is_watch = params
        .iter()
        .any(|(k, v)| k == "watch" && (v == "true" || v == "1"));

    let id = shared.mutate(|s| {
        let id = s.next_request_id;
        s.next_request_id += 1;
        s.requests.push(RecordedRequest {
            id,
            at,
            time,
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: RecordedBody::from_bytes(&bytes),
            status: None,
        });
        id
    });
    // A frozen server holds every request here; the gate is fair, so when it thaws the
    // held requests go on in the order they arrived.
    drop(shared.gate.clone().lock_owned().await);
    let (down, fault) = shared.mutate(|s| {
        let fault = if s.down {
            None
        } else {
            s.take_fault(&method, &path, is_watch)
        };
        (s.down, fault)
    });

    if down {
        return Ok(finish(
            &shared,
            id,
            error(503, "the API server is down (apiserver-double set_down)"),
        ));
    }
    if too_large {
        return Ok(finish(&shared, id, error(413, "request body too large")));
    }
    let mut drop_after = None;
    let mut watch_fault = None;
    let mut drop_connection = None;
    match fault {
        Some(FaultAction::Status(code)) => {
            let mut resp = error(code, &format!("injected fault: HTTP {code}"));
            if code == 429 {
                resp.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            return Ok(finish(&shared, id, resp));
        }
        Some(FaultAction::Delay(d) | FaultAction::SlowList(d)) => tokio::time::sleep(d).await,
        Some(FaultAction::Hang) => {
            notify(&shared, id);
            // never answer; the connection task drops us on shutdown or set_down
            return std::future::pending().await;
        }
        Some(FaultAction::DropWatchAfter(n)) => drop_after = Some(n),
        Some(FaultAction::StallWatch) => watch_fault = Some(watch::WatchFault::Stall),
        Some(FaultAction::ExpireWatch) => watch_fault = Some(watch::WatchFault::Expire),
        Some(FaultAction::DropWatchEvents) => watch_fault = Some(watch::WatchFault::DropEvents),
        Some(FaultAction::DropAfterBody { apply }) => drop_connection = Some(apply),
        None => {}
    }
    if drop_connection == Some(false) {
        notify(&shared, id);
        return Err(DropConnection);
    }
    let ctx = Ctx {
        method,
        path,
        params,
        content_type,
        body: bytes,
        drop_after,
        watch_fault,
    };
    let resp = route(&shared, &ctx);
    let resp = finish(&shared, id, resp);
    if drop_connection.is_some() {
        return Err(DropConnection);
    }
    Ok(resp)
}

/// Stores the answer's status in the request log and runs the request hook.
fn finish(shared: &Shared, id: u64, resp: Response<RespBody>) -> Response<RespBody> {
    let code = resp.status().as_u16();
    shared.mutate(|s| {
        if let Some(r) = s.requests.iter_mut().rev().find(|r| r.id == id) {
            r.status = Some(code);
        }
    });
    notify(shared, id);
    resp
}

fn notify(shared: &Shared, id: u64) {
    if let Some(hook) = shared.request_hook() {
        let rec = shared.read(|s| s.requests.iter().rev().find(|r| r.id == id).cloned());
        if let Some(rec) = rec {
            hook(&rec);
        }
    }
}

fn route(shared: &Arc<Shared>, ctx: &Ctx) -> Response<RespBody> {
    let segs: Vec<&str> = ctx
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let m = &ctx.method;
    let get = m == Method::GET;
    macro_rules! only {
        ($cond:expr, $e:expr) => {
            if $cond {
                $e
            } else {
                error(
                    405,
                    &format!(
                        "the server does not allow this method on the requested resource: {m}"
                    ),
                )
            }
        };
    }
    match segs.as_slice() {
        ["version"] => only!(get, ok(&version())),
        ["healthz"] | ["livez"] | ["readyz"] => only!(get, {
            let mut r = Response::new(full("ok"));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            r
        }),
        ["api"] => only!(get, ok(&api_versions(shared))),
        ["apis"] => only!(get, ok(&api_groups())),
        ["api", "v1"] => only!(get, ok(&core_resources())),
        ["apis", "events.k8s.io", "v1"] => only!(get, ok(&events_resources())),
        ["apis", "policy", "v1"] => only!(get, ok(&policy_resources())),
        ["api", "v1", "pods"] => only!(get, list_or_watch(shared, ctx, Kind::Pod, None)),
        ["api", "v1", "namespaces", ns, "pods"] => {
            only!(get, list_or_watch(shared, ctx, Kind::Pod, Some(ns)))
        }
        ["api", "v1", "namespaces", ns, "pods", name] => {
            only!(get, get_object(shared, Kind::Pod, ns, name))
        }
        ["api", "v1", "namespaces", ns, "pods", name, "eviction"] => {
            only!(m == Method::POST, evict(shared, ctx, ns, name))
        }
        ["api", "v1", "nodes"] => only!(get, list_or_watch(shared, ctx, Kind::Node, None)),
        ["api", "v1", "nodes", name] => match *m {
            Method::GET => get_object(shared, Kind::Node, "", name),
            Method::PATCH => patch_node(shared, ctx, name),
            _ => error(
                405,
                &format!("the server does not allow this method on the requested resource: {m}"),
            ),
        },
        ["api", "v1", "namespaces", ns, "events"] => {
            events_collection(shared, ctx, EventApi::CoreV1, ns)
        }
        ["api", "v1", "namespaces", ns, "events", name] => {
            event_item(shared, ctx, EventApi::CoreV1, ns, name)
        }
        ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"] => {
            events_collection(shared, ctx, EventApi::EventsV1, ns)
        }
        ["apis", "events.k8s.io", "v1", "namespaces", ns, "events", name] => {
            event_item(shared, ctx, EventApi::EventsV1, ns, name)
        }
        _ => error(404, "the server could not find the requested resource"),
    }
}

// ---- discovery ----

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn api_versions(shared: &Shared) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}]
    })
}

fn api_groups() -> Value {
    let group = |name: &str| {
        let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
        json!({"name": name, "versions": [gv.clone()], "preferredVersion": gv})
    };
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group("events.k8s.io"), group("policy")]})
}

fn resource(name: &str, singular: &str, kind: &str, verbs: &[&str]) -> Value {
    json!({"name": name, "singularName": singular, "namespaced": kind != "Node", "kind": kind, "verbs": verbs})
}

fn core_resources() -> Value {
    let mut eviction = resource("pods/eviction", "", "Eviction", &["create"]);
    eviction["group"] = json!("policy");
    eviction["version"] = json!("v1");
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            resource("pods", "pod", "Pod", &["get", "list", "watch"]),
            eviction,
            resource("nodes", "node", "Node", &["get", "list", "watch", "patch"]),
            resource("events", "event", "Event", &["create", "get", "list", "patch"]),
        ]
    })
}

fn events_resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "events.k8s.io/v1",
        "resources": [resource("events", "event", "Event", &["create", "get", "list", "patch"])]
    })
}

fn policy_resources() -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "policy/v1", "resources": []})
}

// ---- pods and nodes ----

fn get_object(shared: &Shared, kind: Kind, ns: &str, name: &str) -> Response<RespBody> {
    match shared.read(|s| s.get(kind, ns, name).cloned()) {
        Some(obj) => ok(&obj),
        None => json_response(404, &status::not_found(kind.resource(), "", name)),
    }
}

fn parse_rv(s: Option<&str>) -> Result<Option<u64>, ApiError> {
    match s {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::new(
                400,
                &format!("invalid resource version {v:?}: expected a number"),
            )
        }),
    }
}

fn list_or_watch(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    kind: Kind,
    ns: Option<&str>,
) -> Response<RespBody> {
    let labels = match LabelSelector::parse(ctx.param("labelSelector").unwrap_or("")) {
        Ok(l) => l,
        Err(e) => return error(400, &format!("invalid labelSelector: {e}")),
    };
    let fields = match FieldSelector::parse(ctx.param("fieldSelector").unwrap_or("")) {
        Ok(f) => f,
        Err(e) => return error(400, &format!("invalid fieldSelector: {e}")),
    };
    let rv = match parse_rv(ctx.param("resourceVersion")) {
        Ok(rv) => rv,
        Err(e) => return e.into_response(),
    };
    let rv_match = ctx.param("resourceVersionMatch").filter(|v| !v.is_empty());
    if rv_match.is_some() && rv.is_none() && !ctx.flag("sendInitialEvents") {
        return error(
            400,
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        );
    }
    if ctx.flag("watch") {
        let timeout = match ctx.param("timeoutSeconds") {
            None | Some("") => Duration::from_secs(1800),
            Some(t) => match t.parse::<u64>() {
                Ok(t) => Duration::from_secs(t),
                Err(_) => return error(400, &format!("invalid timeoutSeconds {t:?}")),
            },
        };
        let req = watch::WatchRequest {
            kind,
            namespace: ns.map(str::to_string),
            labels,
            fields,
            resource_version: rv,
            send_initial_events: ctx.flag("sendInitialEvents"),
            bookmarks: ctx.flag("allowWatchBookmarks"),
            timeout,
            drop_after: ctx.drop_after,
            fault: ctx.watch_fault,
        };
        let body = watch::start(shared.clone(), req);
        let mut resp = Response::new(body.boxed());
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return resp;
    }

    let limit = match ctx.param("limit") {
        None | Some("") => None,
        Some(l) => match l.parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => return error(400, &format!("invalid limit {l:?}")),
        },
    };
    let after: Option<(String, String)> = match ctx.param("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(c) => match util::hex_decode(c)
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| {
                s.split_once('\0')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            }) {
            Some(k) => Some(k),
            None => return error(400, "invalid continue token"),
        },
    };
    let result = shared.read(|s| {
        if rv_match == Some("Exact") && rv.is_some_and(|rv| rv < s.compacted_rv) {
            return Err(ApiError::with_status(410, status::expired()));
        }
        let all: Vec<_> = s
            .list(kind, ns)
            .filter(|(k, _)| after.as_ref().is_none_or(|a| (&k.1, &k.2) > (&a.0, &a.1)))
            .filter(|(_, o)| labels.matches(o) && fields.matches(o))
            .collect();
        let take = limit.unwrap_or(all.len()).min(all.len());
        let items: Vec<Value> = all[..take].iter().map(|(_, o)| (*o).clone()).collect();
        let remaining = all.len() - take;
        let mut meta = json!({"resourceVersion": s.rv.to_string()});
        if let (true, Some((k, _))) = (remaining > 0, take.checked_sub(1).and_then(|i| all.get(i)))
        {
            meta["continue"] = json!(util::hex_encode(format!("{}\0{}", k.1, k.2).as_bytes()));
            meta["remainingItemCount"] = json!(remaining);
        }
        Ok(json!({"kind": kind.list_kind(), "apiVersion": "v1", "metadata": meta, "items": items}))
    });
    match result {
        Ok(list) => ok(&list),
        Err(e) => e.into_response(),
    }
}

// ---- evictions ----

fn evict(shared: &Arc<Shared>, ctx: &Ctx, ns: &str, name: &str) -> Response<RespBody> {
    let body: Value = match serde_json::from_slice(&ctx.body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(other) => {
            return error(
                400,
                &format!(
                    "Eviction in version \"v1\" cannot be handled as a Eviction: expected a JSON object, got {}",
                    json_type(&other)
                ),
            )
        }
        Err(e) => return error(400, &format!("Eviction cannot be decoded: {e}")),
    };
    if let Some(k) = body.get("kind").and_then(Value::as_str) {
        if k != "Eviction" {
            return error(400, &format!("expected kind Eviction, got {k:?}"));
        }
    }
    if let Some(n) = body.pointer("/metadata/name").and_then(Value::as_str) {
        if n != name {
            return error(400, "name in URL does not match name in Eviction object");
        }
    }
    let grace = body
        .pointer("/deleteOptions/gracePeriodSeconds")
        .and_then(Value::as_i64);
    let dry_run = ctx.dry_run();

    let want_uid = body
        .pointer("/deleteOptions/preconditions/uid")
        .and_then(Value::as_str)
        .map(str::to_string);
    let outcome = shared.mutate(|s| {
        let pod = s.get(Kind::Pod, ns, name).cloned();
        let uid_of = |p: &Value| {
            p.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let outcome = match &pod {
            None => EvictionOutcome::NotFound,
            Some(p) if want_uid.as_ref().is_some_and(|u| *u != uid_of(p)) => {
                EvictionOutcome::UidMismatch
            }
            Some(_) if s.protected.contains(&(ns.to_string(), name.to_string())) => {
                EvictionOutcome::Blocked
            }
            Some(_) => EvictionOutcome::Accepted,
        };
        s.evictions.push(EvictionRecord {
            at: Instant::now(),
            namespace: ns.to_string(),
            name: name.to_string(),
            grace_period_seconds: grace,
            outcome,
            body: body.clone(),
        });
        let mut schedule = None;
        if let (EvictionOutcome::Accepted, Some(pod), false) = (outcome, &pod, dry_run) {
            if pod.pointer("/metadata/deletionTimestamp").is_none() {
                let secs = grace
                    .or_else(|| {
                        pod.pointer("/spec/terminationGracePeriodSeconds")
                            .and_then(Value::as_i64)
                    })
                    .unwrap_or(30)
                    .max(0);
                s.update(Kind::Pod, ns, name, |p| {
                    p["metadata"]["deletionTimestamp"] = json!(util::now_rfc3339());
                    p["metadata"]["deletionGracePeriodSeconds"] = json!(secs);
                });
                let uid = pod.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
                let delay = Duration::from_secs_f64(secs as f64 * s.grace_scale);
                schedule = Some((uid, delay));
            }
        }
        (outcome, schedule)
    });
    match outcome {
        (EvictionOutcome::NotFound, _) => json_response(404, &status::not_found("pods", "", name)),
        (EvictionOutcome::UidMismatch, _) => {
            let have = shared
                .read(|s| s.get(Kind::Pod, ns, name).cloned())
                .and_then(|p| {
                    p.pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .unwrap_or_default();
            json_response(
                409,
                &status::failure(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on pods \"{name}\": the UID in the precondition ({}) does not match the UID in record ({have}). The object might have been deleted and then recreated",
                        want_uid.as_deref().unwrap_or("")
                    ),
                ),
            )
        }
        (EvictionOutcome::Blocked, _) => json_response(429, &status::pdb_blocked()),
        (EvictionOutcome::Accepted, schedule) => {
            if let Some((uid, delay)) = schedule {
                tokio::spawn(delete_after_grace(
                    shared.clone(),
                    ns.to_string(),
                    name.to_string(),
                    uid,
                    delay,
                ));
            }
            json_response(201, &status::eviction_success())
        }
    }
}

/// Deletes an evicted pod once its (scaled) grace period is over, then runs the hook.
async fn delete_after_grace(
    shared: Arc<Shared>,
    ns: String,
    name: String,
    uid: Value,
    delay: Duration,
) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if shared.is_shut_down() {
        return;
    }
    let deleted = shared.mutate(|s| {
        let same = s
            .get(Kind::Pod, &ns, &name)
            .is_some_and(|p| p.pointer("/metadata/uid").unwrap_or(&Value::Null) == &uid);
        if same {
            s.delete(Kind::Pod, &ns, &name)
        } else {
            None
        }
    });
    if let Some(pod) = deleted {
        tracing::info!(namespace = %ns, pod = %name, "evicted pod deleted");
        if let Some(hook) = shared.evict_hook() {
            hook(&pod);
        }
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

// ---- patches ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum PatchType {
    Merge,
    Json,
}

fn patch_type(ctx: &Ctx) -> Result<PatchType, ApiError> {
    let ct = ctx
        .content_type
        .as_deref()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match ct.as_str() {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        _ => Err(ApiError::new(
            415,
            &format!(
                "the body of the request was in an unknown format ({ct:?}) - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
            ),
        )),
    }
}

/// Applies a patch to a copy of `current`; the error is the response to send.
fn apply_patch(current: &Value, ctx: &Ctx) -> Result<Value, ApiError> {
    let pt = patch_type(ctx)?;
    let patch: Value = serde_json::from_slice(&ctx.body)
        .map_err(|e| ApiError::new(400, &format!("the patch is not valid JSON: {e}")))?;
    let mut obj = current.clone();
    match pt {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(ApiError::new(400, "a merge patch must be a JSON object"));
            }
            if let Some(want) = patch
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
            {
                let have = current
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str);
                if have != Some(want) {
                    return Err(ApiError::with_status(
                        409,
                        status::failure(
                            409,
                            "Conflict",
                            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again",
                        ),
                    ));
                }
            }
            merge_patch(&mut obj, &patch);
        }
        PatchType::Json => json_patch(&mut obj, &patch).map_err(|e| match e {
            JsonPatchError::Malformed(m) => ApiError::new(400, &m),
            failed @ JsonPatchError::Failed { .. } => ApiError::new(422, &failed.to_string()),
        })?,
    }
    if !obj.is_object() {
        return Err(ApiError::new(
            422,
            "the patched object is not a JSON object",
        ));
    }
    Ok(obj)
}

fn patch_node(shared: &Shared, ctx: &Ctx, name: &str) -> Response<RespBody> {
    let dry_run = ctx.dry_run();
    shared.mutate(|s| {
        let Some(current) = s.get(Kind::Node, "", name).cloned() else {
            return json_response(404, &status::not_found("nodes", "", name));
        };
        let patched = match apply_patch(&current, ctx) {
            Ok(p) => p,
            Err(e) => return e.into_response(),
        };
        if dry_run {
            return ok(&patched);
        }
        match s.update(Kind::Node, "", name, |n| *n = patched) {
            Some(n) => ok(&n),
            None => json_response(404, &status::not_found("nodes", "", name)),
        }
    })
}

// ---- events ----

fn event_group(api: EventApi) -> &'static str {
    match api {
        EventApi::CoreV1 => "",
        EventApi::EventsV1 => "events.k8s.io",
    }
}

fn events_collection(shared: &Shared, ctx: &Ctx, api: EventApi, ns: &str) -> Response<RespBody> {
    match ctx.method {
        Method::GET => shared.read(|s| {
            let items: Vec<&Value> = s
                .events
                .iter()
                .filter(|e| e.api == api && e.namespace == ns)
                .map(|e| &e.object)
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

fn dotted(group: &str) -> String {
    if group.is_empty() {
        String::new()
    } else {
        format!(".{group}")
    }
}

fn event_item(
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
