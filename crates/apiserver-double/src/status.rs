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
