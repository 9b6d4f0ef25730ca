//! The extender's HTTP handlers: `POST /filter`, `POST /prioritize`, `GET /metrics`,
//! `/healthz`, `/readyz`. Bodies are bounded (a larger one gets a 413 before it is read in
//! full), anything unreadable gets a 400 that says why; verdicts are computed from the cached
//! view, so an answer takes microseconds to milliseconds whatever the API server does.

use super::core::{evaluate, not_ready_result, parse_call, Evaluation, Judged};
use super::judge::Reason;
use super::reply::{filter_reply, prioritize_reply};
use super::watch::LedgerFeed;
use super::wire::PodView;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the handlers share.
pub struct ExtenderState {
    /// Policy, ledger, nodes, clock and metrics.
    pub feed: Arc<LedgerFeed>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Whether this listener serves `/filter` and `/prioritize` (the loopback one), or only
    /// the GETs (the probe listener).
    pub serve_verbs: bool,
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
    json_sized(status, v, 128)
}

/// `json` into a buffer of about the reply's size (a reply of thousands of nodes would
/// otherwise be copied a dozen times as the buffer grows).
fn json_sized(
    status: StatusCode,
    v: &impl serde::Serialize,
    capacity: usize,
) -> Response<Full<Bytes>> {
    let mut b = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut b, v) {
        Ok(()) => reply(status, "application/json", b),
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
        ("filter" | "prioritize", _) if !state.serve_verbs => {
            return text(
                StatusCode::NOT_FOUND,
                "not served here: the verbs are on the extender's loopback --listen\n".into(),
            )
        }
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
    let not_ready = state.feed.not_ready();
    match v {
        "metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state.feed.metrics.render(),
        ),
        "healthz" => text(StatusCode::OK, "ok\n".into()),
        "readyz" => match not_ready {
            None => text(StatusCode::OK, "ready\n".into()),
            Some(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
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
    let started = f.clock.mono();
    if call.pod.requests_resource(&f.policy.resource) {
        if let Some(why) = f.not_ready() {
            tracing::info!(pod = %call.pod.key(), verb = v, "not ready, the scheduler retries: {why}");
            f.metrics.not_ready.inc();
            return if v == "filter" {
                json(StatusCode::OK, &not_ready_result(why))
            } else {
                // Filter failed already, so this is not reached from kube-scheduler; an
                // error status is the honest answer for anyone else.
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {why}\n"),
                )
            };
        }
    }
    let prefix = &f.policy.prefix;
    let candidates: Vec<Judged<'_>> = match &call.candidates {
        super::core::Candidates::Names(_) => call
            .candidates
            .states(&|names: &[String]| f.nodes.states(names), prefix),
        // Full objects: their annotations, read through the node's Lease when there is one.
        super::core::Candidates::Objects(list) => list
            .items
            .iter()
            .map(|o| {
                let name = super::wire::node_name(o).unwrap_or_default();
                let a = f
                    .nodes
                    .through_lease(name, super::wire::node_annotations(o));
                (name, Some(Arc::new(super::nodes::read_node(&a, prefix))))
            })
            .collect(),
    };
    let learned = f.learned_needs();
    let eval = {
        let mut ledger = f.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let e = evaluate(
            &f.policy,
            &call.pod,
            &learned,
            &candidates,
            &mut ledger,
            f.clock.mono(),
            f.clock.wall(),
        );
        f.metrics.reservations.set(ledger.len() as i64);
        e
    };
    // About 40 bytes a node for the names, plus the refused nodes' reasons.
    let capacity = 256 + 40 * candidates.len();
    let resp = if v == "filter" {
        let refused = eval.verdicts.iter().filter(|v| !v.pass).count();
        let reply = filter_reply(&call.candidates, &eval);
        json_sized(StatusCode::OK, &reply, capacity + 160 * refused)
    } else {
        let names = candidates.iter().map(|(n, _)| *n);
        let reply = prioritize_reply(names, &eval, f.policy.judge.score);
        json_sized(StatusCode::OK, &reply, capacity)
    };
    let took = f.clock.mono().saturating_sub(started);
    record(state, v, &call.pod, &candidates, &eval, took);
    resp
}

/// Counts the verdicts (one increment per reason, not per node) and logs one summary line
/// per filter call at info — the pod, its need and where it came from, how many nodes
/// passed, how many were refused for each reason, one example reason; every node's verdict
/// at debug. Prioritize sees the same nodes again: its summary is at debug.
fn record(
    state: &ExtenderState,
    v: &'static str,
    pod: &PodView,
    candidates: &[Judged<'_>],
    e: &Evaluation,
    took: std::time::Duration,
) {
    let mut counts: BTreeMap<(bool, Reason), u64> = BTreeMap::new();
    for verdict in &e.verdicts {
        *counts.entry((verdict.pass, verdict.reason)).or_default() += 1;
    }
    let m = &state.feed.metrics;
    for ((pass, reason), n) in &counts {
        let result = if *pass { "pass" } else { "fail" };
        m.verdicts
            .with_label_values(&[v, result, reason.as_str()])
            .inc_by(*n as f64);
    }
    let key = pod.key();
    if tracing::enabled!(tracing::Level::DEBUG) {
        for ((node, _), verdict) in candidates.iter().zip(&e.verdicts) {
            let r = verdict.reason.as_str();
            let result = if verdict.pass { "pass" } else { "fail" };
            tracing::debug!(pod = %key, verb = v, node = %node, result, reason = r, "{}", verdict.why);
        }
    }
    let passed: u64 = counts.iter().filter(|((p, _), _)| *p).map(|(_, n)| n).sum();
    let summary = |pass: bool| {
        counts
            .iter()
            .filter(|((p, _), _)| *p == pass)
            .map(|((_, r), n)| format!("{}={n}", r.as_str()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let (need_mib, source) = match &e.need {
        // The whole-GPU figure is a placeholder until a node says its size: not a MiB count.
        Some(n) => (
            n.mib.filter(|m| *m != super::need::WHOLE_GPU_MIB),
            format!("{:?}", n.source),
        ),
        None => (None, "BadDeclaration".to_string()),
    };
    let example = e
        .verdicts
        .iter()
        .find(|v| !v.pass)
        .or_else(|| e.verdicts.iter().find(|v| v.reason != Reason::Fits))
        .map(|v| v.message())
        .unwrap_or_default();
    let took_us = took.as_micros() as u64;
    if v == "filter" {
        tracing::info!(pod = %key, gpus = e.gpus, need_mib, source = %source, nodes = e.verdicts.len(), passed, pass = %summary(true), fail = %summary(false), took_us, "filter: {example}");
    } else {
        tracing::debug!(pod = %key, nodes = e.verdicts.len(), took_us, "prioritize");
    }
}
