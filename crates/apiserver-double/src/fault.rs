//! Fault injection: rules that make matching requests fail, stall or break.

use std::time::Duration;

use hyper::Method;

/// A fault-injection rule. The first rule (in insertion order) that matches a request applies.
///
/// A rule matches a request when its [`method`](Fault::method) (if any) equals the request's,
/// and the request path (without query) starts with [`path_prefix`](Fault::path_prefix).
/// [`FaultAction::DropWatchAfter`] rules only match watch requests. Each application consumes
/// one of [`times`](Fault::times); a rule is removed once used up.
///
/// ```
/// use apiserver_double::{Fault, FaultAction, Method};
/// // the next two evictions answer 500, then evictions work again
/// let f = Fault::new("/api/v1/namespaces/ci/pods/", FaultAction::Status(500))
///     .method(Method::POST)
///     .times(2);
/// # let _ = f;
/// ```
#[derive(Debug, Clone)]
pub struct Fault {
    /// Only requests with this method match; `None` matches any method.
    pub method: Option<Method>,
    /// Only requests whose path starts with this match (`""` or `"/"` matches everything).
    pub path_prefix: String,
    /// How many requests the rule applies to; `None` means forever.
    pub times: Option<usize>,
    /// What happens to a matching request.
    pub action: FaultAction,
}

impl Fault {
    /// A rule for any method, applied forever, on paths starting with `path_prefix`.
    pub fn new(path_prefix: impl Into<String>, action: FaultAction) -> Self {
        Fault {
            method: None,
            path_prefix: path_prefix.into(),
            times: None,
            action,
        }
    }

    /// Restricts the rule to one HTTP method.
    #[must_use]
    pub fn method(mut self, method: Method) -> Self {
        self.method = Some(method);
        self
    }

    /// Applies the rule to the next `n` matching requests only.
    #[must_use]
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }

    pub(crate) fn matches(&self, method: &Method, path: &str, is_watch: bool) -> bool {
        if matches!(
            self.action,
            FaultAction::DropWatchAfter(_)
                | FaultAction::StallWatch
                | FaultAction::ExpireWatch
                | FaultAction::DropWatchEvents
        ) && !is_watch
        {
            return false;
        }
        if matches!(self.action, FaultAction::SlowList(_)) && is_watch {
            return false;
        }
        if self.times == Some(0) {
            return false;
        }
        self.method.as_ref().is_none_or(|m| m == method) && path.starts_with(&self.path_prefix)
    }
}

/// What a matching [`Fault`] does to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer at once with a failure `Status` carrying this HTTP code (reason derived from the
    /// code, e.g. 500 `InternalError`, 503 `ServiceUnavailable`). A 429 also carries
    /// `Retry-After: 1`, as the API server's priority-and-fairness rejections do.
    Status(u16),
    /// Wait this long, then serve the request normally (lets a client's read timeout fire).
    Delay(Duration),
    /// Never answer; the connection stays open until the server shuts down or goes down.
    Hang,
    /// For watch requests only: serve the watch, but break the connection (no terminating
    /// chunk) after this many `ADDED`/`MODIFIED`/`DELETED`/`ERROR` events (bookmarks are not
    /// counted). `0` breaks it right after the response headers.
    DropWatchAfter(usize),
    /// For watch requests only: answer `200` with the response headers, then send nothing
    /// more (no events, no bookmarks, no end) while the connection stays open: a watch that
    /// stalls silently, as behind a proxy that lost its upstream.
    StallWatch,
    /// Answer as API Priority and Fairness does when it rejects a request
    /// (`tooManyRequests` in apiserver's server/filters/priority-and-fairness.go): `429`,
    /// `Retry-After: <seconds>`, and a plain-text body (`http.Error`), not a `Status` — so
    /// no `DisruptionBudget` cause. The request is not carried out.
    ApfReject {
        /// The `Retry-After` header, in seconds.
        retry_after_seconds: u32,
    },
    /// Answer `500 InternalError` "Internal error occurred: etcdserver: request timed out",
    /// as the API server wraps an etcd timeout (`errors.NewInternalError`). With
    /// `apply: true` the request is carried out first — etcd may commit a write it timed
    /// out on — so the client cannot tell from the answer whether it happened.
    EtcdTimeout {
        /// Whether the request takes effect before the 500.
        apply: bool,
    },
    /// Answer `403 Forbidden` as RBAC denies a request its authorizer does not allow
    /// (`responsewriters.Forbidden`): `<resource> "<name>" is forbidden: User "…" cannot
    /// <verb> resource "<resource>" …`, with `details.kind` the resource.
    Forbidden,
    /// For watch requests only: answer `200`, then one `ERROR` event carrying `410 Expired`,
    /// then end the watch — as kube-apiserver answers a watch from a resourceVersion its
    /// watch cache no longer holds (`cacher.Watch` returns `newErrWatcher` with the
    /// `ResourceExpired` error), whatever LISTs answer meanwhile.
    ExpireWatch,
    /// For watch requests only: serve the watch, but never send its `ADDED`/`MODIFIED`/
    /// `DELETED` events; bookmarks still flow and carry the resourceVersion past the lost
    /// events (a server that shows life but loses changes; only a relist sees them).
    DropWatchEvents,
    /// For requests other than watches (a LIST, a GET): wait this long, then serve the
    /// request normally, while watches on the same path answer at once.
    SlowList(Duration),
    /// Freeze the whole server as this request arrives (as `ApiServer::set_frozen(true)`),
    /// holding this request with the rest: it is carried out when the test thaws the server
    /// (after `set_thaw_writes_after`'s delay, for a write). For a freeze that begins
    /// between the guard's fresh read of a pod and its eviction.
    Freeze,
    /// Read the whole request body, then break the connection without an answer. With
    /// `apply: true` the request is carried out first (the client cannot know it was);
    /// with `apply: false` it is not.
    DropAfterBody {
        /// Whether the request takes effect before the connection breaks.
        apply: bool,
    },
}
