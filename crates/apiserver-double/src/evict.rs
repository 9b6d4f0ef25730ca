//! `POST pods/{name}/eviction` (policy/v1): PodDisruptionBudget refusals, the UID
//! precondition, the API server's grace period rules, and the hand-over to the kubelet
//! ([`crate::kubelet`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hyper::Response;
use serde_json::{json, Value};

use crate::http::{error, json_response, Ctx, RespBody};
use crate::record::{EvictionOutcome, EvictionRecord};
use crate::state::{Kind, Shared};
use crate::{kubelet, kubelet_run, status, util};

pub(crate) fn evict(shared: &Arc<Shared>, ctx: &Ctx, ns: &str, name: &str) -> Response<RespBody> {
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
            // A pod already terminating keeps its grace (upstream may only shorten it).
            if pod.pointer("/metadata/deletionTimestamp").is_none() {
                let secs = kubelet::api_grace_seconds(grace, pod);
                let when = SystemTime::now() + Duration::from_secs(secs.unsigned_abs());
                let marked = s.update(Kind::Pod, ns, name, |p| {
                    p["metadata"]["deletionTimestamp"] = json!(util::rfc3339(when));
                    p["metadata"]["deletionGracePeriodSeconds"] = json!(secs);
                });
                // Grace 0: the generic store deletes the object in the same request.
                let api_deleted = secs == 0 && s.delete(Kind::Pod, ns, name).is_some();
                if let Some(marked) = marked {
                    schedule = Some((marked, secs, api_deleted));
                }
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
            if let Some((pod, secs, api_deleted)) = schedule {
                kubelet_run::begin(shared, pod, secs, api_deleted);
            }
            json_response(201, &status::eviction_success())
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
