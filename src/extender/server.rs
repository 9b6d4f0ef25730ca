//! The extender's HTTP handlers: `POST /filter`, `POST /prioritize`, `GET /metrics`,
//! `/healthz`, `/readyz`. Bodies are bounded (a larger one gets a 413 before it is read in
//! full), anything unreadable gets a 400 that says why; verdicts are computed from the cached
//! view, so an answer takes microseconds to milliseconds whatever the API server does.

use super::core::{evaluate, filter_result, parse_call, prioritize_result, Evaluation};
use super::watch::LedgerFeed;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::sync::Arc;

/// What the handlers share.
pub struct ExtenderState {
    /// Policy, ledger, nodes, clock and metrics.
    pub feed: Arc<LedgerFeed>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
}

fn reply(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", msg.into_bytes())
}

fn json(status: StatusCode, v: &impl serde::Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(v) {
        Ok(b) => reply(status, "application/json", b),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the reply: {e}\n"),
        ),
    }
}

/// The verb a path names, for metrics (`other` for anything else, so hostile paths cannot
/// grow the label set).
fn verb(path: &str) -> &'static str {
    match path {
        "/filter" => "filter",
        "/prioritize" => "prioritize",
        "/metrics" => "metrics",
        "/healthz" => "healthz",
        "/readyz" => "readyz",
        _ => "other",
    }
}

/// Answers one request.
pub async fn handle<B>(state: Arc<ExtenderState>, req: Request<B>) -> Response<Full<Bytes>>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().path().to_string();
    let v = verb(&path);
    let started = state.feed.clock.mono();
    let resp = route(&state, req, v).await;
    let m = &state.feed.metrics;
    m.requests
        .with_label_values(&[v, resp.status().as_str()])
        .inc();
    if matches!(v, "filter" | "prioritize") {
        let took = state.feed.clock.mono().saturating_sub(started);
        m.latency
            .with_label_values(&[v])
            .observe(took.as_secs_f64());
    }
    resp
}

async fn route<B>(state: &ExtenderState, req: Request<B>, v: &'static str) -> Response<Full<Bytes>>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let method = req.method().clone();
    match (v, &method) {
        ("filter" | "prioritize", &Method::POST) => {}
        ("filter" | "prioritize", _) => {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only POST\n".into());
            r.headers_mut()
                .insert("allow", HeaderValue::from_static("POST"));
            return r;
        }
        (_, &Method::GET) => return get(state, v),
        _ if req.uri().path() == "/" && method == Method::GET => return get(state, v),
        ("other", _) => return text(StatusCode::NOT_FOUND, "not found\n".into()),
        _ => return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into()),
    }
    let limit = state.max_body_bytes;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|h| h.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit);
    }
    let body = match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(limit),
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}\n"),
            )
        }
    };
    answer(state, v, &body)
}

fn too_large(limit: usize) -> Response<Full<Bytes>> {
    text(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body larger than {limit} bytes (--max-body-bytes)\n"),
    )
}

fn get(state: &ExtenderState, v: &'static str) -> Response<Full<Bytes>> {
    let ready = state.feed.nodes.ready();
    match v {
        "metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state.feed.metrics.render(),
        ),
        "healthz" => text(StatusCode::OK, "ok\n".into()),
        "readyz" if ready => text(StatusCode::OK, "ready\n".into()),
        "readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the node cache has not synced with the API server yet\n".into(),
        ),
        _ => text(
            StatusCode::OK,
            "gpu-warden extender: POST /filter /prioritize; GET /metrics /healthz /readyz\n".into(),
        ),
    }
}

/// Answers a `filter` or `prioritize` body; public so tests and benches need no socket.
pub fn answer(state: &ExtenderState, v: &'static str, body: &[u8]) -> Response<Full<Bytes>> {
    let call = match parse_call(body) {
        Ok(c) => c,
        Err(e) => {
            return text(StatusCode::BAD_REQUEST, format!("{e}\n"));
        }
    };
    let f = &state.feed;
    let mut candidates = call.candidates.annotated(&|n: &str| f.nodes.annotations(n));
    if matches!(call.candidates, super::core::Candidates::Objects(_)) {
        for (name, ann) in &mut candidates {
            *ann = ann.take().map(|a| f.nodes.through_lease(name, a));
        }
    }
    let eval = {
        let mut ledger = f.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let e = evaluate(
            &f.policy,
            &call.pod,
            &candidates,
            &mut ledger,
            f.clock.mono(),
            f.clock.wall(),
        );
        f.metrics.reservations.set(ledger.len() as i64);
        e
    };
    record(state, v, &call.pod.key(), &eval);
    if v == "filter" {
        json(StatusCode::OK, &filter_result(&call.candidates, &eval))
    } else {
        json(StatusCode::OK, &prioritize_result(&f.policy, &eval))
    }
}

/// Counts the verdicts and logs every node passed unchecked or refused, with its reason
/// (filter only: prioritize sees the same nodes again).
fn record(state: &ExtenderState, v: &'static str, pod: &str, e: &Evaluation) {
    use super::judge::Reason;
    for (node, verdict) in &e.verdicts {
        let result = if verdict.pass { "pass" } else { "fail" };
        state
            .feed
            .metrics
            .verdicts
            .with_label_values(&[v, result, verdict.reason.as_str()])
            .inc();
        if v != "filter" {
            continue;
        }
        match (verdict.pass, verdict.reason) {
            (true, Reason::Fits) => {
                tracing::debug!(pod, node = %node, gpu = ?verdict.gpu.as_ref().map(|g| g.index), "fits: {}", verdict.message)
            }
            (true, reason) => {
                tracing::info!(pod, node = %node, reason = reason.as_str(), "passed: {}", verdict.message)
            }
            (false, reason) => {
                tracing::info!(pod, node = %node, reason = reason.as_str(), "refused: {}", verdict.message)
            }
        }
    }
}
