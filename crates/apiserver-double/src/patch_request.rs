//! Merge and JSON patches sent to the double (nodes and events).

use serde_json::Value;

use crate::http::{json_response, ok, ApiError, Ctx, RespBody};
use crate::patch::{json_patch, merge_patch, JsonPatchError};
use crate::state::{Kind, Shared};
use crate::status;
use hyper::Response;

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
pub(crate) fn apply_patch(current: &Value, ctx: &Ctx) -> Result<Value, ApiError> {
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

pub(crate) fn patch_node(shared: &Shared, ctx: &Ctx, name: &str) -> Response<RespBody> {
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
