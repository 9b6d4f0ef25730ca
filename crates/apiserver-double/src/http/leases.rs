//! `coordination.k8s.io/v1` Leases: create, get, update, patch, delete, list and watch.
//!
//! Follows the API server's generic registry with the Lease strategy
//! (`pkg/registry/coordination/lease/strategy.go`, `staging/.../registry/generic/registry/store.go`):
//! - create (POST) of a name that exists answers 409 `AlreadyExists`;
//! - update (PUT) is optimistic: a body whose `metadata.resourceVersion` differs from the
//!   stored one answers 409 `Conflict` ("the object has been modified"); a body without one
//!   is an unconditional update (`AllowUnconditionalUpdate`: true); updating a Lease that
//!   does not exist answers 404 (`AllowCreateOnUpdate`: false);
//! - the name (and namespace) in the body must match the URL's (400);
//! - `uid` and `creationTimestamp` are the server's, whatever the body says;
//! - `spec.leaseDurationSeconds`, when set, must be positive (422, as `ValidateLeaseSpec`).

use super::{error, json_response, list_or_watch, ok, ApiError, Ctx, RespBody};
use crate::patch_request::apply_patch;
use crate::server::ApiServer;
use crate::state::{Kind, Shared, State};
use crate::{status, Error, Result};
use hyper::{Method, Response};
use serde_json::{json, Value};
use std::sync::Arc;

/// The API group, as it appears in `Status` details.
const GROUP: &str = "coordination.k8s.io";

/// Routes `/apis/coordination.k8s.io/v1/<rest…>`.
pub(super) fn route(shared: &Arc<Shared>, ctx: &Ctx, rest: &[&str]) -> Response<RespBody> {
    let m = &ctx.method;
    match rest {
        [] => match *m {
            Method::GET => ok(&resources()),
            _ => not_allowed(m),
        },
        ["leases"] => match *m {
            Method::GET => list_or_watch(shared, ctx, Kind::Lease, None),
            _ => not_allowed(m),
        },
        ["namespaces", ns, "leases"] => match *m {
            Method::GET => list_or_watch(shared, ctx, Kind::Lease, Some(ns)),
            Method::POST => create(shared, ctx, ns),
            _ => not_allowed(m),
        },
        ["namespaces", ns, "leases", name] => match *m {
            Method::GET => match shared.read(|s| s.get(Kind::Lease, ns, name).cloned()) {
                Some(l) => ok(&l),
                None => not_found(name),
            },
            Method::PUT => update(shared, ctx, ns, name),
            Method::PATCH => patch(shared, ctx, ns, name),
            Method::DELETE => match shared.mutate(|s| s.delete(Kind::Lease, ns, name)) {
                Some(l) => ok(&l),
                None => not_found(name),
            },
            _ => not_allowed(m),
        },
        _ => error(404, "the server could not find the requested resource"),
    }
}

fn resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "coordination.k8s.io/v1",
        "resources": [{"name": "leases", "singularName": "lease", "namespaced": true, "kind": "Lease",
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]
    })
}

fn not_allowed(m: &Method) -> Response<RespBody> {
    error(
        405,
        &format!("the server does not allow this method on the requested resource: {m}"),
    )
}

fn not_found(name: &str) -> Response<RespBody> {
    json_response(404, &status::not_found("leases", GROUP, name))
}

fn conflict(reason: &str, name: &str, message: String) -> Response<RespBody> {
    let mut s = status::failure(409, reason, &message);
    s["details"] = json!({"name": name, "group": GROUP, "kind": "leases"});
    json_response(409, &s)
}

/// The body as a Lease for `ns`, or the answer refusing it.
fn read_body(ctx: &Ctx, ns: &str) -> std::result::Result<Value, ApiError> {
    let mut body: Value = match serde_json::from_slice(&ctx.body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return Err(ApiError::new(400, "a Lease must be a JSON object")),
        Err(e) => return Err(ApiError::new(400, &format!("Lease cannot be decoded: {e}"))),
    };
    if let Some(v) = body.get("apiVersion").and_then(Value::as_str) {
        if v != "coordination.k8s.io/v1" {
            return Err(ApiError::new(
                400,
                &format!("apiVersion {v:?} does not match coordination.k8s.io/v1"),
            ));
        }
    }
    match body.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n != ns => return Err(ApiError::new(
            400,
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {}
    }
    if let Some(d) = body
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_i64)
    {
        if d <= 0 {
            return Err(ApiError::with_status(
                422,
                status::failure(
                    422,
                    "Invalid",
                    &format!("Lease.coordination.k8s.io is invalid: spec.leaseDurationSeconds: Invalid value: {d}: must be greater than 0"),
                ),
            ));
        }
    }
    if !body.get("metadata").is_some_and(Value::is_object) {
        body["metadata"] = json!({});
    }
    body["metadata"]["namespace"] = json!(ns);
    body["apiVersion"] = json!("coordination.k8s.io/v1");
    body["kind"] = json!("Lease");
    Ok(body)
}

fn create(shared: &Shared, ctx: &Ctx, ns: &str) -> Response<RespBody> {
    let mut body = match read_body(ctx, ns) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let Some(name) = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
    else {
        return json_response(
            422,
            &status::failure(
                422,
                "Invalid",
                "Lease.coordination.k8s.io is invalid: metadata.name: Required value: name or generateName is required",
            ),
        );
    };
    // The server assigns these on create.
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["uid", "resourceVersion", "creationTimestamp"] {
            meta.remove(k);
        }
    }
    if ctx.dry_run() {
        return json_response(201, &body);
    }
    shared.mutate(|s| {
        if s.get(Kind::Lease, ns, &name).is_some() {
            return conflict(
                "AlreadyExists",
                &name,
                format!("leases.{GROUP} \"{name}\" already exists"),
            );
        }
        match s.upsert(Kind::Lease, body) {
            Ok(l) => json_response(201, &l),
            Err(e) => error(422, &e),
        }
    })
}

/// Replaces a stored Lease with `new` when `new` carries its resourceVersion (or none).
fn replace(s: &mut State, ns: &str, name: &str, mut new: Value) -> Response<RespBody> {
    let Some(current) = s.get(Kind::Lease, ns, name).cloned() else {
        return not_found(name);
    };
    let have = current
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    let want = new
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty());
    if want.is_some_and(|w| Some(w) != have) {
        return conflict(
            "Conflict",
            name,
            format!("Operation cannot be fulfilled on leases.{GROUP} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
        );
    }
    for k in ["uid", "creationTimestamp"] {
        new["metadata"][k] = current["metadata"][k].clone();
    }
    match s.update(Kind::Lease, ns, name, |l| *l = new) {
        Some(l) => ok(&l),
        None => not_found(name),
    }
}

fn update(shared: &Shared, ctx: &Ctx, ns: &str, name: &str) -> Response<RespBody> {
    let body = match read_body(ctx, ns) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    if let Some(n) = body.pointer("/metadata/name").and_then(Value::as_str) {
        if n != name {
            return error(
                400,
                &format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                ),
            );
        }
    }
    if ctx.dry_run() {
        return match shared.read(|s| s.get(Kind::Lease, ns, name).is_some()) {
            true => ok(&body),
            false => not_found(name),
        };
    }
    shared.mutate(|s| replace(s, ns, name, body))
}

fn patch(shared: &Shared, ctx: &Ctx, ns: &str, name: &str) -> Response<RespBody> {
    shared.mutate(|s| {
        let Some(current) = s.get(Kind::Lease, ns, name).cloned() else {
            return not_found(name);
        };
        let patched = match apply_patch(&current, ctx) {
            Ok(p) => p,
            Err(e) => return e.into_response(),
        };
        if ctx.dry_run() {
            return ok(&patched);
        }
        match s.update(Kind::Lease, ns, name, |l| *l = patched) {
            Some(l) => ok(&l),
            None => not_found(name),
        }
    })
}

impl ApiServer {
    /// Creates (ADDED) or replaces (MODIFIED) a Lease, as another writer would; fills in what
    /// the API server does. Its namespace is `metadata.namespace` (`default` when absent).
    pub fn add_lease(&self, mut lease: Value) -> Result<Value> {
        if let Some(o) = lease.as_object_mut() {
            o.insert("apiVersion".into(), json!("coordination.k8s.io/v1"));
            o.insert("kind".into(), json!("Lease"));
        }
        self.shared
            .mutate(|s| s.upsert(Kind::Lease, lease))
            .map_err(Error::InvalidObject)
    }

    /// One Lease.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .read(|s| s.get(Kind::Lease, namespace, name).cloned())
    }

    /// Every Lease, by namespace and name.
    pub fn leases(&self) -> Vec<Value> {
        self.shared
            .read(|s| s.list(Kind::Lease, None).map(|(_, v)| v.clone()).collect())
    }

    /// Changes a Lease in place (a MODIFIED event); `None` when there is no such Lease.
    pub fn update_lease(
        &self,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        self.shared
            .mutate(|s| s.update(Kind::Lease, namespace, name, f))
    }
}
