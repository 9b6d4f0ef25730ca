//! Request handling: recording, faults, routing, and the pod and node reads (the other
//! handlers have files of their own).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::fault::FaultAction;
use crate::record::{EventApi, RecordedBody, RecordedRequest};
use crate::selector::{FieldSelector, LabelSelector};
use crate::state::{Kind, Shared};
use crate::{discovery, events_api, evict, patch_request, status, util, watch};

mod leases;

pub(crate) type RespBody = BoxBody<Bytes, std::io::Error>;

/// Request bodies above this answer 413.
const MAX_BODY: usize = 16 << 20;

pub(crate) fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<RespBody> {
    let mut body = serde_json::to_vec(v).unwrap_or_default();
    body.push(b'\n');
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(crate) fn error(code: u16, message: &str) -> Response<RespBody> {
    json_response(code, &status::failure_code(code, message))
}

/// API Priority and Fairness's rejection ([`FaultAction::ApfReject`]).
fn apf_reject(retry_after_seconds: u32) -> Response<RespBody> {
    let mut resp = Response::new(full(status::APF_REJECT_BODY));
    *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&retry_after_seconds.to_string()) {
        h.insert(RETRY_AFTER, v);
    }
    resp
}

pub(crate) fn ok(v: &Value) -> Response<RespBody> {
    json_response(200, v)
}

/// A failure answer: a `Status` body and its HTTP code.
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) status: Value,
}

impl ApiError {
    pub(crate) fn new(code: u16, message: &str) -> Self {
        ApiError {
            code,
            status: status::failure_code(code, message),
        }
    }

    pub(crate) fn with_status(code: u16, status: Value) -> Self {
        ApiError { code, status }
    }

    pub(crate) fn into_response(self) -> Response<RespBody> {
        json_response(self.code, &self.status)
    }
}

/// One request, read and decoded.
pub(crate) struct Ctx {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) params: Vec<(String, String)>,
    pub(crate) content_type: Option<String>,
    pub(crate) body: Bytes,
    pub(crate) drop_after: Option<usize>,
    /// How a watch misbehaves ([`FaultAction::StallWatch`] and the like).
    pub(crate) watch_fault: Option<watch::WatchFault>,
}

impl Ctx {
    pub(crate) fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn flag(&self, key: &str) -> bool {
        self.param(key).is_some_and(|v| v == "true" || v == "1")
    }

    pub(crate) fn dry_run(&self) -> bool {
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
    let held = *shared.frozen.borrow();
    drop(shared.gate.clone().lock_owned().await);
    // …unless writes are to come back after the reads (`set_thaw_writes_after`): a server
    // whose watch cache answers reads at once while its storage works through the backlog.
    let is_write = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    let write_delay = shared.mutate(|s| s.thaw_writes_after);
    if held && is_write && !write_delay.is_zero() {
        tokio::time::sleep(write_delay).await;
    }
    // A stalled storage holds what needs it; watches are served from the watch cache.
    if !is_watch {
        crate::storage::storage_answers(&shared).await;
    }
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
    let mut etcd_timeout = None;
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
        Some(FaultAction::Freeze) => {
            shared.set_frozen(true);
            drop(shared.gate.clone().lock_owned().await);
            let delay = shared.mutate(|s| s.thaw_writes_after);
            if method != Method::GET && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
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
        Some(FaultAction::ApfReject {
            retry_after_seconds,
        }) => return Ok(finish(&shared, id, apf_reject(retry_after_seconds))),
        Some(FaultAction::Forbidden) => {
            let verb = if method == Method::POST {
                "create"
            } else {
                "get"
            };
            let body = status::rbac_forbidden(verb, &path);
            return Ok(finish(&shared, id, json_response(403, &body)));
        }
        Some(FaultAction::EtcdTimeout { apply }) => etcd_timeout = Some(apply),
        None => {}
    }
    if etcd_timeout == Some(false) {
        return Ok(finish(
            &shared,
            id,
            json_response(500, &status::etcd_timeout()),
        ));
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
    let resp = match etcd_timeout {
        // Carried out, then answered as if etcd had timed out.
        Some(true) => json_response(500, &status::etcd_timeout()),
        _ => resp,
    };
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
        ["version"] => only!(get, ok(&discovery::version())),
        ["healthz"] | ["livez"] | ["readyz"] => only!(get, {
            let mut r = Response::new(full("ok"));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            r
        }),
        ["api"] => only!(get, ok(&discovery::api_versions(shared))),
        ["apis"] => only!(get, ok(&discovery::api_groups())),
        ["api", "v1"] => only!(get, ok(&discovery::core_resources())),
        ["apis", "events.k8s.io", "v1"] => only!(get, ok(&discovery::events_resources())),
        ["apis", "policy", "v1"] => only!(get, ok(&discovery::policy_resources())),
        ["apis", "coordination.k8s.io", "v1", rest @ ..] => leases::route(shared, ctx, rest),
        ["api", "v1", "pods"] => only!(get, list_or_watch(shared, ctx, Kind::Pod, None)),
        ["api", "v1", "namespaces", ns, "pods"] => {
            only!(get, list_or_watch(shared, ctx, Kind::Pod, Some(ns)))
        }
        ["api", "v1", "namespaces", ns, "pods", name] => {
            only!(get, get_object(shared, Kind::Pod, ns, name))
        }
        ["api", "v1", "namespaces", ns, "pods", name, "eviction"] => {
            only!(m == Method::POST, evict::evict(shared, ctx, ns, name))
        }
        ["api", "v1", "nodes"] => only!(get, list_or_watch(shared, ctx, Kind::Node, None)),
        ["api", "v1", "nodes", name] => match *m {
            Method::GET => get_object(shared, Kind::Node, "", name),
            Method::PATCH => patch_request::patch_node(shared, ctx, name),
            _ => error(
                405,
                &format!("the server does not allow this method on the requested resource: {m}"),
            ),
        },
        ["api", "v1", "namespaces", ns, "events"] => {
            events_api::events_collection(shared, ctx, EventApi::CoreV1, ns)
        }
        ["api", "v1", "namespaces", ns, "events", name] => {
            events_api::event_item(shared, ctx, EventApi::CoreV1, ns, name)
        }
        ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"] => {
            events_api::events_collection(shared, ctx, EventApi::EventsV1, ns)
        }
        ["apis", "events.k8s.io", "v1", "namespaces", ns, "events", name] => {
            events_api::event_item(shared, ctx, EventApi::EventsV1, ns, name)
        }
        _ => error(404, "the server could not find the requested resource"),
    }
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
        Ok(json!({"kind": kind.list_kind(), "apiVersion": kind.api_version(), "metadata": meta, "items": items}))
    });
    match result {
        Ok(list) => ok(&list),
        Err(e) => e.into_response(),
    }
}
