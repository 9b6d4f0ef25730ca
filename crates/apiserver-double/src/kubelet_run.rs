//! Carries out the kubelet's steps ([`crate::kubelet::plan`]) for each accepted eviction:
//! in real time (a task per pod, signalling real processes through a [`PodRuntime`] when one
//! is set), or — with a [`SteppedClock`] — only when a test's harness lets its simulated
//! clock run ([`crate::ApiServer::kubelet_run_until`]), so the harness can end its simulated
//! processes at the right simulated instants and the double never deletes on its own.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::kubelet::{plan, EndCause, Step, StepKind};
use crate::state::{Kind, Shared};

/// The clock of a test's harness (e.g. simulated time). With it the kubelet stamps each
/// accepted eviction with this clock's reading and acts only in
/// [`crate::ApiServer::kubelet_run_until`].
#[derive(Clone)]
pub struct SteppedClock(pub(crate) Arc<dyn Fn() -> Duration + Send + Sync>);

impl SteppedClock {
    /// A clock read by calling `now`.
    pub fn new(now: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        SteppedClock(Arc::new(now))
    }
}

impl std::fmt::Debug for SteppedClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SteppedClock")
    }
}

/// The processes of the node's pods, for a double that plays the kubelet on a test machine
/// (the binary's `--kill-cgroups-under`: [`crate::cgroups::CgroupRuntime`]).
pub trait PodRuntime: Send + Sync {
    /// Sends SIGTERM to the PID 1 of each of the pod's containers; says what was signalled.
    fn sigterm_pid1(&self, pod: &Value) -> String;
    /// Whether any process of the pod is left.
    fn has_processes(&self, pod: &Value) -> bool;
    /// SIGKILLs every process of the pod; says what was killed.
    fn kill_all(&self, pod: &Value) -> String;
}

/// What the kubelet did to one evicted pod (or, with a [`SteppedClock`], is due to do: the
/// harness carries out what concerns its processes).
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletAction {
    /// When, on the kubelet's clock (the [`SteppedClock`], or time since the server started).
    pub at: Duration,
    /// Wall time when it was carried out.
    pub time: SystemTime,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// What was done.
    pub kind: StepKind,
    /// What was signalled or found (a real node), or empty.
    pub detail: String,
}

impl KubeletAction {
    /// Whether every process of the pod is gone from [`at`](KubeletAction::at) on.
    pub fn ends_processes(&self) -> bool {
        matches!(self.kind, StepKind::ProcessesEnd(_))
    }

    /// One JSON object (the binary's `--kubelet-log`).
    pub fn to_json(&self) -> Value {
        let unix = self
            .time
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        serde_json::json!({
            "timeUnix": unix,
            "atSeconds": self.at.as_secs_f64(),
            "namespace": self.namespace,
            "pod": self.name,
            "uid": self.uid,
            "action": self.kind.as_str(),
            "detail": self.detail,
        })
    }
}

/// A step waiting for a stepped clock.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    seq: u64,
    step: Step,
    pod: Value,
}

/// A hook run with each action as it is carried out.
pub(crate) type KubeletHookArc = Arc<dyn Fn(&KubeletAction) + Send + Sync>;

fn pod_str(pod: &Value, ptr: &str) -> String {
    pod.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// The kubelet's clock now.
pub(crate) fn now(shared: &Shared) -> Duration {
    match &shared.stepped {
        Some(clock) => (clock.0)(),
        None => shared.epoch.elapsed(),
    }
}

/// Starts the kubelet's work on `pod`, whose eviction was just accepted with the API's
/// `grace` (seconds); `api_deleted`: the API server already deleted the object.
pub(crate) fn begin(shared: &Arc<Shared>, pod: Value, grace: i64, api_deleted: bool) {
    let opts = shared.read(|s| s.kubelet);
    let steps = plan(&opts, now(shared), grace, api_deleted);
    if shared.stepped.is_some() {
        shared.mutate(|s| {
            for step in steps {
                s.kubelet_seq += 1;
                let seq = s.kubelet_seq;
                s.kubelet_pending.push(Pending {
                    seq,
                    step,
                    pod: pod.clone(),
                });
            }
        });
    } else {
        tokio::spawn(run_real_time(shared.clone(), pod, steps));
    }
}

/// Carries out, in order, every step due at or before `until` (stepped clock only).
pub(crate) fn run_until(shared: &Shared, until: Duration) -> Vec<KubeletAction> {
    let mut due = shared.mutate(|s| {
        let (due, keep): (Vec<Pending>, Vec<Pending>) = s
            .kubelet_pending
            .drain(..)
            .partition(|p| p.step.at <= until);
        s.kubelet_pending = keep;
        due
    });
    due.sort_by_key(|p| (p.step.at, p.seq));
    let mut done = Vec::with_capacity(due.len());
    for p in due {
        if p.step.kind == StepKind::Delete {
            if let Some(a) = delete(shared, &p.pod, p.step.at) {
                done.push(a);
            }
        } else {
            done.push(record(
                shared,
                &p.pod,
                p.step.at,
                p.step.kind,
                String::new(),
            ));
        }
    }
    done
}

/// Records an action and runs the hook.
fn record(
    shared: &Shared,
    pod: &Value,
    at: Duration,
    kind: StepKind,
    detail: String,
) -> KubeletAction {
    let action = KubeletAction {
        at,
        time: SystemTime::now(),
        namespace: pod_str(pod, "/metadata/namespace"),
        name: pod_str(pod, "/metadata/name"),
        uid: pod_str(pod, "/metadata/uid"),
        kind,
        detail,
    };
    tracing::info!(namespace = %action.namespace, pod = %action.name, action = kind.as_str(), detail = %action.detail, "kubelet");
    shared.mutate(|s| s.kubelet_log.push(action.clone()));
    if let Some(hook) = shared.kubelet_hook() {
        hook(&action);
    }
    action
}

/// Deletes the pod if it is still the same object (same UID); runs the evict hook.
fn delete(shared: &Shared, pod: &Value, at: Duration) -> Option<KubeletAction> {
    let ns = pod_str(pod, "/metadata/namespace");
    let name = pod_str(pod, "/metadata/name");
    let uid = pod.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
    let deleted = shared.mutate(|s| {
        let same = s
            .get(Kind::Pod, &ns, &name)
            .is_some_and(|p| p.pointer("/metadata/uid").unwrap_or(&Value::Null) == &uid);
        if same {
            s.delete(Kind::Pod, &ns, &name)
        } else {
            None
        }
    })?;
    let action = record(shared, pod, at, StepKind::Delete, String::new());
    if let Some(hook) = shared.evict_hook() {
        hook(&deleted);
    }
    Some(action)
}

async fn sleep_until(shared: &Shared, at: Duration) {
    let left = at.saturating_sub(now(shared));
    if !left.is_zero() {
        tokio::time::sleep(left).await;
    }
}

/// How often a real node's pod is looked at for processes left.
const POLL: Duration = Duration::from_millis(5);
/// How long the kubelet waits for a SIGKILLed pod's processes to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(2);

async fn run_real_time(shared: Arc<Shared>, pod: Value, steps: Vec<Step>) {
    let runtime = shared.pod_runtime();
    let mut i = 0;
    while i < steps.len() {
        let step = steps[i];
        sleep_until(&shared, step.at).await;
        if shared.is_shut_down() {
            return;
        }
        match (step.kind, &runtime) {
            (StepKind::Delete, _) => {
                delete(&shared, &pod, now(&shared));
            }
            (StepKind::Sigterm, Some(rt)) => {
                let detail = rt.sigterm_pid1(&pod);
                record(&shared, &pod, now(&shared), StepKind::Sigterm, detail);
                // Real processes decide for themselves: the kubelet's StopContainer returns
                // as soon as the container is gone, else SIGKILLs when the grace ends.
                let deadline = steps[i + 1..]
                    .iter()
                    .find(|s| s.kind == StepKind::Sigkill)
                    .map(|s| s.at);
                let mut ended = false;
                while deadline.is_some_and(|d| now(&shared) < d) {
                    if !rt.has_processes(&pod) {
                        ended = true;
                        break;
                    }
                    tokio::time::sleep(POLL).await;
                }
                if ended || deadline.is_none() {
                    let end = StepKind::ProcessesEnd(EndCause::Pid1Exited);
                    record(&shared, &pod, now(&shared), end, String::new());
                    // skip the SIGKILL; keep the Delete if there is one
                    if steps[i + 1..].iter().any(|s| s.kind == StepKind::Delete) {
                        delete(&shared, &pod, now(&shared));
                    }
                    return;
                }
            }
            (StepKind::Sigkill, Some(rt)) => {
                let detail = rt.kill_all(&pod);
                record(&shared, &pod, now(&shared), StepKind::Sigkill, detail);
                let give_up = now(&shared) + REAP_WAIT;
                while rt.has_processes(&pod) && now(&shared) < give_up {
                    tokio::time::sleep(POLL).await;
                }
                let end = StepKind::ProcessesEnd(EndCause::Sigkill);
                let left = if rt.has_processes(&pod) {
                    "processes still left after 2 s".to_string()
                } else {
                    String::new()
                };
                record(&shared, &pod, now(&shared), end, left);
            }
            // A real node's processes end on their own account (handled above).
            (StepKind::ProcessesEnd(_), Some(_)) => {}
            (kind, None) => {
                record(&shared, &pod, step.at, kind, String::new());
            }
        }
        i += 1;
    }
}
