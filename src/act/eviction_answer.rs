//! What an answer to `POST pods/{name}/eviction` says — about the pod, or about the server.
//! Pure: the enforcer hands it the HTTP status, the `Retry-After` header and the body, and
//! acts on the [`EvictionOutcome`] it returns. The table, with the upstream code each row
//! follows, is in docs/guard.md ("What each answer means").
//!
//! The rule behind every row: the walk moves on to the next candidate only on an answer
//! that is about *this pod* (its PodDisruptionBudget forbids it, it is gone). An answer
//! about the server (throttled, forbidden, an internal error) would be the same for every
//! pod, and an ambiguous one may still be carried out; walking on after either evicted the
//! protected trainer in issue 30.

use crate::guard::decision::EvictionOutcome;
use crate::guard::notes;
use serde::Deserialize;
use std::time::Duration;

/// Longest API-server message kept in an outcome: it lands in the guard's state, /state
/// and the Node Event.
pub const DETAIL_LIMIT: usize = 300;

/// `policyv1.DisruptionBudgetCause`, the cause the eviction handler attaches to every 429
/// that is about the pod's PodDisruptionBudget (`checkAndDecrement`,
/// `createTooManyRequestsError` in pkg/registry/core/pod/storage/eviction.go).
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";

/// Backoff after a 429 that names no `Retry-After`: the value max-in-flight's filter always
/// sends (`retryAfter = "1"` in apiserver's server/filters/maxinflight.go).
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The part of a `metav1.Status` body the classification reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct StatusBody {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<StatusDetails>,
}

/// `metav1.StatusDetails`: which object, and the causes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StatusDetails {
    pub name: String,
    pub group: String,
    pub kind: String,
    pub causes: Vec<StatusCause>,
    pub retry_after_seconds: Option<u64>,
}

/// `metav1.StatusCause`; its `Type` is written under the JSON key `reason`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct StatusCause {
    pub reason: String,
    pub message: String,
}

/// One answer as it came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status code.
    pub code: u16,
    /// `Retry-After`, in seconds, when the header is there and an integer.
    pub retry_after: Option<Duration>,
    /// The body read as a `Status`, when it is one (APF's 429 is plain text).
    pub status: Option<StatusBody>,
    /// The body as text (cut), for answers that are not a `Status`.
    pub text: String,
}

impl Answer {
    /// Reads an answer from its parts. `retry_after` is the header's raw value.
    pub fn new(code: u16, retry_after: Option<&str>, body: &[u8]) -> Answer {
        let status = serde_json::from_slice::<StatusBody>(body)
            .ok()
            .filter(|s| s.code != 0 || !s.reason.is_empty() || !s.message.is_empty());
        let text = String::from_utf8_lossy(body).trim().to_string();
        Answer {
            code,
            retry_after: retry_after
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
            status,
            text,
        }
    }

    fn message(&self) -> &str {
        match &self.status {
            Some(s) => &s.message,
            None => &self.text,
        }
    }

    fn reason(&self) -> &str {
        self.status.as_ref().map_or("", |s| s.reason.as_str())
    }

    fn has_cause(&self, cause: &str) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.details.as_ref())
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == cause))
    }

    fn details_kind(&self) -> &str {
        self.status
            .as_ref()
            .and_then(|s| s.details.as_ref())
            .map_or("", |d| d.kind.as_str())
    }

    /// `"<code> <reason>: <message>"`, cut, on one line.
    pub fn detail(&self) -> String {
        let reason = match self.reason() {
            "" => String::new(),
            r => format!(" {r}"),
        };
        notes::clean(
            &format!("{}{reason}: {}", self.code, self.message()),
            DETAIL_LIMIT,
        )
    }
}

/// What the answer means for the guard (docs/guard.md, "What each answer means").
pub fn classify(a: &Answer) -> EvictionOutcome {
    let message = a.message().to_ascii_lowercase();
    match a.code {
        200..=299 => EvictionOutcome::Evicted,
        404 => EvictionOutcome::AlreadyGone,
        // The UID precondition failed: the pod we chose is gone (re-created under its name).
        409 if message.contains("precondition") => EvictionOutcome::AlreadyGone,
        // Any other 409 comes from the PodDisruptionBudget's status update losing its race
        // (`RetryOnConflict` in eviction.go gave up): nothing was deleted, and it is about
        // this pod's budget, which others are spending right now.
        409 => EvictionOutcome::Blocked(a.detail()),
        429 if a.has_cause(DISRUPTION_BUDGET_CAUSE) => EvictionOutcome::Blocked(a.detail()),
        // API Priority and Fairness (or max-in-flight) rejected the request before any
        // handler ran: the server is busy, nothing was done, and another pod would get the
        // same answer. Back off as told and try the same pod again.
        429 => EvictionOutcome::Throttled {
            detail: a.detail(),
            retry_after_ms: a.retry_after.unwrap_or(DEFAULT_RETRY_AFTER).as_millis() as u64,
        },
        // `checkAndDecrement`: a budget whose status is broken refuses this pod's eviction
        // with a 403 about the poddisruptionbudget, not about the agent.
        403 if a.details_kind() == "poddisruptionbudget" => EvictionOutcome::Blocked(a.detail()),
        // RBAC or an admission webhook: the agent may not evict; every pod would get it.
        401 | 403 => EvictionOutcome::Forbidden(a.detail()),
        // eviction.go answers a pod under two budgets with a 500 before deleting anything.
        500 if message.contains("more than one poddisruptionbudget") => {
            EvictionOutcome::Blocked(a.detail())
        }
        // eviction.go's own timeout after PDB conflicts (`NewTimeoutError(... due to
        // conflicts)`): nothing was deleted.
        504 if message.contains("couldn't update poddisruptionbudget") => {
            EvictionOutcome::Blocked(a.detail())
        }
        // An internal error may come after the write reached etcd (`etcdserver: request
        // timed out` is a write etcd may still commit); a gateway's 502/503/504 may have
        // passed the request on. The eviction may still be carried out.
        500..=599 => EvictionOutcome::InDoubt(a.detail()),
        // 400, 405, 415, 422: the request itself is wrong; it would be for every pod.
        _ => EvictionOutcome::Failed(a.detail()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(code: u16, v: serde_json::Value) -> Answer {
        Answer::new(code, None, &serde_json::to_vec(&v).unwrap())
    }

    fn result(o: &EvictionOutcome) -> &'static str {
        o.as_str()
    }

    /// One row per answer shape; each body is the one upstream writes (see docs/guard.md).
    #[test]
    fn every_answer_is_classified_by_what_it_says_about_the_pod() {
        let pdb_429 = json!({"kind":"Status","apiVersion":"v1","status":"Failure",
            "message":"Cannot evict pod as it would violate the pod's disruption budget.",
            "reason":"TooManyRequests","code":429,
            "details":{"causes":[{"reason":"DisruptionBudget","message":"The disruption budget ci-pdb needs 1 healthy pods and has 1 currently"}]}});
        let pdb_processing = json!({"kind":"Status","status":"Failure","code":429,"reason":"TooManyRequests",
            "message":"Cannot evict pod as it would violate the pod's disruption budget.",
            "details":{"retryAfterSeconds":10,"causes":[{"reason":"DisruptionBudget","message":"The disruption budget ci-pdb is still being processed by the server."}]}});
        let json_429 = json!({"kind":"Status","status":"Failure","code":429,"reason":"TooManyRequests",
            "message":"the server has received too many requests and has asked us to try again later",
            "details":{"retryAfterSeconds":2}});
        let etcd_500 = json!({"kind":"Status","status":"Failure","code":500,"reason":"InternalError",
            "message":"Internal error occurred: etcdserver: request timed out",
            "details":{"causes":[{"message":"etcdserver: request timed out"}]}});
        let two_pdbs = json!({"kind":"Status","status":"Failure","code":500,
            "message":"This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."});
        let rbac_403 = json!({"kind":"Status","status":"Failure","code":403,"reason":"Forbidden",
            "message":"pods \"ci-a\" is forbidden: User \"system:serviceaccount:gpu-warden:gpu-warden\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"ci\"",
            "details":{"name":"ci-a","kind":"pods"}});
        let pdb_403 = json!({"kind":"Status","status":"Failure","code":403,"reason":"Forbidden",
            "message":"poddisruptionbudgets.policy \"ci-pdb\" is forbidden: pdb disruptions allowed is negative",
            "details":{"name":"ci-pdb","group":"policy","kind":"poddisruptionbudget"}});
        let uid_409 = json!({"kind":"Status","status":"Failure","code":409,"reason":"Conflict",
            "message":"Operation cannot be fulfilled on pods \"ci-a\": the UID in the precondition (1) does not match the UID in record (2). The object might have been deleted and then recreated"});
        let pdb_409 = json!({"kind":"Status","status":"Failure","code":409,"reason":"Conflict",
            "message":"Operation cannot be fulfilled on poddisruptionbudgets.policy \"ci-pdb\": the object has been modified; please apply your changes to the latest version and try again"});
        let pdb_504 = json!({"kind":"Status","status":"Failure","code":504,"reason":"Timeout",
            "message":"couldn't update PodDisruptionBudget \"ci-pdb\" due to conflicts","details":{"retryAfterSeconds":10}});
        let rows: Vec<(&str, Answer, &str)> = vec![
            (
                "201",
                status(201, json!({"kind":"Status","status":"Success","code":201})),
                "evicted",
            ),
            ("200, not a Status", Answer::new(200, None, b"{"), "evicted"),
            (
                "404",
                status(
                    404,
                    json!({"code":404,"reason":"NotFound","message":"pods \"ci-a\" not found"}),
                ),
                "already_gone",
            ),
            ("409 UID precondition", status(409, uid_409), "already_gone"),
            ("409 PDB status race", status(409, pdb_409), "blocked"),
            ("429 PDB", status(429, pdb_429), "blocked"),
            (
                "429 PDB still processing",
                status(429, pdb_processing),
                "blocked",
            ),
            (
                "429 APF, plain text",
                Answer::new(
                    429,
                    Some("3"),
                    b"Too many requests, please try again later.\n",
                ),
                "throttled",
            ),
            (
                "429 Status without a cause",
                status(429, json_429),
                "throttled",
            ),
            ("403 RBAC", status(403, rbac_403), "forbidden"),
            (
                "401",
                status(
                    401,
                    json!({"code":401,"reason":"Unauthorized","message":"Unauthorized"}),
                ),
                "forbidden",
            ),
            ("403 PDB broken", status(403, pdb_403), "blocked"),
            ("500 etcd timeout", status(500, etcd_500), "in_doubt"),
            ("500 two PDBs", status(500, two_pdbs), "blocked"),
            (
                "503",
                status(
                    503,
                    json!({"code":503,"reason":"ServiceUnavailable","message":"down"}),
                ),
                "in_doubt",
            ),
            (
                "502 from a proxy, HTML",
                Answer::new(502, None, b"<html>Bad Gateway</html>"),
                "in_doubt",
            ),
            (
                "504 gateway",
                Answer::new(504, None, b"upstream timed out"),
                "in_doubt",
            ),
            ("504 PDB conflicts", status(504, pdb_504), "blocked"),
            (
                "400",
                status(
                    400,
                    json!({"code":400,"reason":"BadRequest","message":"name in URL does not match name in Eviction object"}),
                ),
                "failed",
            ),
            (
                "422",
                status(422, json!({"code":422,"reason":"Invalid","message":"x"})),
                "failed",
            ),
        ];
        for (name, answer, want) in rows {
            assert_eq!(result(&classify(&answer)), want, "{name}: {answer:?}");
        }
    }

    #[test]
    fn throttling_carries_the_servers_retry_after() {
        let apf = Answer::new(
            429,
            Some("3"),
            b"Too many requests, please try again later.",
        );
        assert_eq!(
            classify(&apf),
            EvictionOutcome::Throttled {
                detail: "429: Too many requests, please try again later.".into(),
                retry_after_ms: 3000
            }
        );
        let none = Answer::new(429, None, b"Too many requests");
        assert!(matches!(
            classify(&none),
            EvictionOutcome::Throttled {
                retry_after_ms: 1000,
                ..
            }
        ));
        let junk = Answer::new(429, Some("Wed, 21 Oct 2015 07:28:00 GMT"), b"");
        assert_eq!(junk.retry_after, None, "an HTTP date is not trusted");
    }

    #[test]
    fn details_are_cut_and_on_one_line() {
        let long = status(500, json!({"code":500,"message":"y\n".repeat(1000)}));
        let d = long.detail();
        assert!(d.len() <= DETAIL_LIMIT && !d.contains('\n'), "{d}");
        let plain = Answer::new(429, None, b"Too many requests, please try again later.\n");
        assert_eq!(
            plain.detail(),
            "429: Too many requests, please try again later."
        );
        let pdb = status(
            429,
            json!({"code":429,"reason":"TooManyRequests","message":"Cannot evict pod","details":{"causes":[{"reason":"DisruptionBudget"}]}}),
        );
        assert_eq!(pdb.detail(), "429 TooManyRequests: Cannot evict pod");
    }
}
