//! Watch streams: newline-delimited JSON events over a chunked response.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::selector::{FieldSelector, LabelSelector};
use crate::state::{EventType, HistoryEntry, Kind, Shared};
use crate::status;

/// A response body fed from a channel; an `Err` item breaks the connection.
pub(crate) struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

/// What a watch asked for.
pub(crate) struct WatchRequest {
    pub(crate) kind: Kind,
    pub(crate) namespace: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    /// `None` or `Some(0)`: start with the current state (synthetic ADDED events).
    pub(crate) resource_version: Option<u64>,
    pub(crate) send_initial_events: bool,
    pub(crate) bookmarks: bool,
    pub(crate) timeout: Duration,
    /// Break the connection after this many events.
    pub(crate) drop_after: Option<usize>,
    /// How the watch misbehaves, if it does.
    pub(crate) fault: Option<WatchFault>,
}

/// The ways a watch can misbehave (from [`crate::FaultAction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchFault {
    /// Send nothing at all after the headers ([`crate::FaultAction::StallWatch`]).
    Stall,
    /// One `410 Expired` ERROR event, then the end ([`crate::FaultAction::ExpireWatch`]).
    Expire,
    /// Bookmarks only, no object events ([`crate::FaultAction::DropWatchEvents`]).
    DropEvents,
}

impl WatchRequest {
    fn matches(&self, obj: &Value) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|ns| {
            obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
        });
        ns_ok && self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// How a stored change looks to this watch, given its filters: an object entering the
    /// selection is ADDED, one leaving it DELETED.
    fn view(&self, e: &HistoryEntry) -> Option<(&'static str, Value)> {
        if e.kind != self.kind {
            return None;
        }
        let now = self.matches(&e.object);
        let before = e.prev.as_ref().is_some_and(|p| self.matches(p));
        let t = match e.etype {
            EventType::Added => now.then_some(EventType::Added),
            EventType::Modified => match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            },
            EventType::Deleted => before.then_some(EventType::Deleted),
        }?;
        Some((t.as_str(), e.object.clone()))
    }
}

/// Starts a watch task; returns the response body it feeds.
pub(crate) fn start(shared: Arc<Shared>, req: WatchRequest) -> ChannelBody {
    let (tx, rx) = mpsc::channel(256);
    match req.fault {
        // Keep the stream open and silent until the client goes away.
        Some(WatchFault::Stall) => {
            tokio::spawn(async move { tx.closed().await });
        }
        // kube-apiserver's errWatcher: the one event, then the end of the stream.
        Some(WatchFault::Expire) => {
            let mut out = Sender::new(&shared, &req, tx);
            tokio::spawn(async move {
                out.event(&json!({"type": "ERROR", "object": status::expired()}))
                    .await;
            });
        }
        _ => {
            tokio::spawn(run(shared, req, tx));
        }
    }
    ChannelBody { rx }
}

type Tx = mpsc::Sender<Result<Bytes, std::io::Error>>;

fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}

fn bookmark(kind: Kind, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"kind": kind.kind(), "apiVersion": "v1", "metadata": meta}})
}

/// Sends events, counting them against `drop_after`, and holding them while the server is
/// frozen.
struct Sender {
    tx: Tx,
    sent: usize,
    drop_after: Option<usize>,
    /// Object events are lost on the way ([`WatchFault::DropEvents`]); errors still go out.
    drop_events: bool,
    frozen: tokio::sync::watch::Receiver<bool>,
}

impl Sender {
    fn new(shared: &Shared, req: &WatchRequest, tx: Tx) -> Self {
        Sender {
            tx,
            sent: 0,
            drop_after: req.drop_after,
            drop_events: req.fault == Some(WatchFault::DropEvents),
            frozen: shared.frozen.subscribe(),
        }
    }

    async fn thawed(&mut self) {
        let _ = self.frozen.wait_for(|f| !*f).await;
    }

    /// `false` when the stream is over (client gone, or the fault broke it).
    async fn event(&mut self, v: &Value) -> bool {
        self.thawed().await;
        if self.drop_events && v.get("type").and_then(Value::as_str) != Some("ERROR") {
            return true;
        }
        if self.tx.send(Ok(line(v))).await.is_err() {
            return false;
        }
        self.sent += 1;
        self.check_drop().await
    }

    async fn bookmark(&mut self, v: &Value) -> bool {
        self.thawed().await;
        self.tx.send(Ok(line(v))).await.is_ok()
    }

    async fn check_drop(&mut self) -> bool {
        match self.drop_after {
            Some(n) if self.sent >= n => {
                // let the connection flush what was sent, then break it mid-stream
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = self
                    .tx
                    .send(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "injected fault: watch dropped",
                    )))
                    .await;
                false
            }
            _ => true,
        }
    }
}

async fn run(shared: Arc<Shared>, req: WatchRequest, tx: Tx) {
    let deadline = Instant::now() + req.timeout;
    let mut changed = shared.changed.subscribe();
    let mut out = Sender::new(&shared, &req, tx);
    // Where the stream starts: replay after the given RV, or the current state.
    let (mut cursor, initial, interval) = {
        let start = shared.read(|s| {
            changed.borrow_and_update();
            let interval = s.bookmark_interval;
            match req.resource_version {
                Some(rv) if rv != 0 => {
                    if rv < s.compacted_rv {
                        None
                    } else {
                        Some((rv, Vec::new(), interval))
                    }
                }
                _ => {
                    let objs: Vec<Value> = s
                        .list(req.kind, req.namespace.as_deref())
                        .filter(|(_, o)| req.matches(o))
                        .map(|(_, o)| o.clone())
                        .collect();
                    Some((s.rv, objs, interval))
                }
            }
        });
        match start {
            Some(s) => s,
            None => {
                out.event(&json!({"type": "ERROR", "object": status::expired()}))
                    .await;
                return;
            }
        }
    };
    if !out.check_drop().await {
        return;
    }
    for obj in initial {
        if !out.event(&json!({"type": "ADDED", "object": obj})).await {
            return;
        }
    }
    if req.send_initial_events && !out.bookmark(&bookmark(req.kind, cursor, true)).await {
        return;
    }
    let interval = interval.max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
    loop {
        // Catch up first: changes made before this task subscribed (or between two wake-ups)
        // are in the history, whatever the notification channel says.
        let batch = shared.read(|s| {
            changed.borrow_and_update();
            if cursor < s.compacted_rv {
                return None;
            }
            let events: Vec<Value> = s
                .history
                .iter()
                .filter(|e| e.rv > cursor)
                .filter_map(|e| req.view(e))
                .map(|(t, o)| json!({"type": t, "object": o}))
                .collect();
            cursor = s.rv;
            Some(events)
        });
        match batch {
            None => {
                out.event(&json!({"type": "ERROR", "object": status::expired()}))
                    .await;
                return;
            }
            Some(events) => {
                for e in events {
                    if !out.event(&e).await {
                        return;
                    }
                }
            }
        }
        // Then wait for a change, sending bookmarks meanwhile.
        loop {
            tokio::select! {
                res = changed.changed() => {
                    if res.is_err() {
                        return;
                    }
                    break;
                }
                _ = ticker.tick(), if req.bookmarks => {
                    if !out.bookmark(&bookmark(req.kind, cursor, false)).await {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    // A frozen server sends nothing, not even the end of a watch that timed
                    // out: the client sees the clean end only once it thaws.
                    out.thawed().await;
                    return;
                }
                _ = out.tx.closed() => return,
            }
        }
    }
}
