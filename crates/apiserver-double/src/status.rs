//! `metav1.Status` bodies, as the API server writes them.

use serde_json::{json, Value};

/// The `reason` the API server gives for an HTTP status code.
pub(crate) fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// A failure `Status` with an explicit reason.
pub(crate) fn failure(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// A failure `Status` whose reason follows from the code.
pub(crate) fn failure_code(code: u16, message: &str) -> Value {
    failure(code, reason_for(code), message)
}

/// `404 NotFound` for a named object, with `details` as the API server fills them.
pub(crate) fn not_found(resource: &str, group: &str, name: &str) -> Value {
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    let mut s = failure(
        404,
        "NotFound",
        &format!("{qualified} \"{name}\" not found"),
    );
    s["details"] = json!({"name": name, "group": group, "kind": resource});
    s
}

/// The `429` an eviction gets when a PodDisruptionBudget forbids it.
pub(crate) fn pdb_blocked() -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "code": 429,
        "details": {
            "causes": [{
                "reason": "DisruptionBudget",
                "message": "The disruption budget my-pdb needs 1 healthy pods and has 1 currently"
            }]
        }
    })
}

/// The `201` body of an accepted eviction.
pub(crate) fn eviction_success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// The `410 Gone` a watch gets for a compacted resourceVersion (sent as an `ERROR` event).
pub(crate) fn expired() -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version",
        "reason": "Expired",
        "code": 410,
    })
}

/// The plain-text body API Priority and Fairness rejects a request with (`http.Error`
/// appends the newline).
pub(crate) const APF_REJECT_BODY: &str = "Too many requests, please try again later.\n";

/// The `500` an etcd timeout becomes (`errors.NewInternalError(err)`).
pub(crate) fn etcd_timeout() -> Value {
    let mut s = failure(
        500,
        "InternalError",
        "Internal error occurred: etcdserver: request timed out",
    );
    s["details"] = json!({"causes": [{"message": "etcdserver: request timed out"}]});
    s
}

/// The `403` RBAC answers for `verb` on `path` (`responsewriters.Forbidden`, whose message
/// `authorizer` builds from the request's attributes).
pub(crate) fn rbac_forbidden(verb: &str, path: &str) -> Value {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/namespaces/<ns>/<resource>/<name>[/<subresource>]
    let (ns, resource, name, sub) = match segs.as_slice() {
        ["api", "v1", "namespaces", ns, resource, name, sub, ..] => {
            (*ns, *resource, *name, Some(*sub))
        }
        ["api", "v1", "namespaces", ns, resource, name] => (*ns, *resource, *name, None),
        ["api", "v1", "namespaces", ns, resource] => (*ns, *resource, "", None),
        _ => ("", "", "", None),
    };
    let full = match sub {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    let user = "system:serviceaccount:gpu-warden:gpu-warden";
    let mut s = failure(
        403,
        "Forbidden",
        &format!(
            "{resource} \"{name}\" is forbidden: User \"{user}\" cannot {verb} resource \"{full}\" in API group \"\" in the namespace \"{ns}\""
        ),
    );
    s["details"] = json!({"name": name, "kind": resource});
    s
}
