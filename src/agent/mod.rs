//! The agent's one event loop: sampler readings in, publications and guard decisions out,
//! until shutdown. Everything it runs is injected (source, clock, listener, pod view,
//! decision executor), so integration tests start the same loop the binary does.

pub mod build;
pub mod pipeline;

use crate::agent::pipeline::Pipeline;
use crate::attribute::ports::PodSource;
use crate::guard::decision::{Decision, EvictionOutcome};
use crate::guard::policy::Mode;
use crate::guard::ports::{DecisionExecutor, Outcomes};
use crate::guard::state::Guard;
use crate::guard::status::GuardStatus;
use crate::model::clock::Clock;
use crate::model::pod::PodMap;
use crate::model::snapshot::{MemoryInfo, Snapshot};
use crate::publish::http::{self, HttpLimits, HttpState};
use crate::publish::process_metrics::ProcessSource;
use crate::publish::state::Published;
use crate::sample::sampler::{Cadence, Sampled, Sampler};
use crate::sample::{GpuSource, MemoryReading};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// The guard and what it needs beside the snapshots.
pub struct GuardParts {
    pub guard: Guard,
    pub pods: Arc<dyn PodSource>,
    /// None when there is no cluster to act on: the guard then only tracks pressure
    /// (its mode is `off`, so it takes no decision).
    pub executor: Option<Arc<dyn DecisionExecutor>>,
}

/// A task started with the loop's publications and stopped (awaited) at shutdown, such
/// as the node annotator (whose stop removes its annotations).
pub type Companion =
    Box<dyn FnOnce(watch::Receiver<Option<Arc<Published>>>) -> CompanionStop + Send>;

/// Stops a companion task at shutdown.
pub type CompanionStop = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// What the loop needs.
pub struct AgentParts {
    pub source: Box<dyn GpuSource>,
    pub clock: Arc<dyn Clock>,
    pub cadence: Cadence,
    pub pipeline: Pipeline,
    pub listener: TcpListener,
    pub http_limits: HttpLimits,
    /// The agent's own process, read at each scrape for the `process_*` families.
    pub process: Option<Arc<dyn ProcessSource>>,
    pub guard: Option<GuardParts>,
    pub companions: Vec<Companion>,
}

/// Errors that end the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot start the sampler thread: {0}")]
    Sampler(std::io::Error),
}

/// How many recent decisions `/state` shows.
const RECENT_DECISIONS: usize = 16;

/// A decision to execute, with the pod view it was taken on.
pub type Dispatch = (Decision, Arc<PodMap>);

struct GuardCore {
    parts: GuardParts,
    recent: VecDeque<Recent>,
}

/// A recent decision and what became of each pod tried, as /state shows it.
struct Recent {
    decision: Decision,
    outcomes: BTreeMap<String, EvictionOutcome>,
}

/// One pod of a recent decision in /state: planned or tried, and its outcome.
#[derive(serde::Serialize)]
struct RecentVictim<'a> {
    namespace: &'a str,
    name: &'a str,
    reason: &'a str,
    /// An [`EvictionOutcome`] label, `pending` (planned, no outcome yet), `not_tried` (the
    /// walk ended first) or `dry_run`.
    result: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

/// The agent's state between events: the pipeline and the guard. The event loop (and the
/// scenario tests, on an injected clock) feed it snapshots, memory ticks and eviction
/// outcomes; it answers with publications and decisions to execute. It does no I/O of
/// its own beyond what the injected attributor and pod source do.
pub struct Core {
    pipeline: Pipeline,
    guard: Option<GuardCore>,
    clock: Arc<dyn Clock>,
}

impl Core {
    /// A core around `pipeline`, with the guard if one is given.
    pub fn new(pipeline: Pipeline, guard: Option<GuardParts>, clock: Arc<dyn Clock>) -> Core {
        Core {
            pipeline,
            guard: guard.map(|parts| GuardCore {
                parts,
                recent: VecDeque::new(),
            }),
            clock,
        }
    }

    /// A full poll: attribute, let the guard observe, render. Returns the publication and
    /// the decisions to execute.
    pub fn on_full(&mut self, mut snap: Snapshot, took: Duration) -> (Published, Vec<Dispatch>) {
        self.pipeline.prepare(&mut snap, took);
        // From here on the snapshot is shared and never changes.
        let snap = Arc::new(snap);
        let now = self.clock.mono();
        let mut out = Vec::new();
        let (pressure, guard_json) = match &mut self.guard {
            Some(g) => {
                g.refresh_hold();
                let pods = g.parts.pods.pods();
                let decisions = g.parts.guard.observe(&snap, &pods, now);
                g.note_resolutions();
                out = g.dispatch(decisions, pods);
                g.parts.pods.set_urgent(g.parts.guard.any_below_soft());
                let pressure = snap
                    .gpus
                    .iter()
                    .map(|gpu| (gpu.id.index, g.parts.guard.pressure(gpu.id.index)))
                    .collect();
                (pressure, g.status_json())
            }
            None => (Default::default(), serde_json::Value::Null),
        };
        (self.pipeline.publish(snap, pressure, guard_json), out)
    }

    /// A memory-only reading between full polls (the guard's fast watch). Returns whether a
    /// full poll is wanted at once: a trigger fired, and victims are ranked only on a
    /// process list read together with the memory.
    pub fn on_memory(&mut self, at: Duration, readings: Vec<MemoryReading>) -> bool {
        let Some(g) = &mut self.guard else {
            return false;
        };
        let ok: Vec<(u32, MemoryInfo)> = readings
            .into_iter()
            .filter_map(|(i, r)| r.ok().map(|m| (i, m)))
            .collect();
        let decisions = g.parts.guard.observe_memory(&ok, at);
        debug_assert!(
            decisions.is_empty(),
            "fast readings never decide on their own"
        );
        g.parts.guard.take_refresh_request()
    }

    /// What the executor got for decision `id`. A pod skipped because its fresh read
    /// disagreed with the pod view makes the view relist.
    pub fn on_outcomes(&mut self, id: u64, results: Outcomes) {
        if let Some(g) = &mut self.guard {
            let now = self.clock.mono();
            for (uid, outcome) in results {
                if let EvictionOutcome::Skipped(why) = &outcome {
                    g.parts.pods.distrust(&format!(
                        "a fresh read of pod {uid} disagrees with the pod view ({why})"
                    ));
                }
                g.record(id, &uid, &outcome);
                g.parts.guard.record_outcome(id, &uid, outcome, now);
            }
        }
    }

    /// Whether the sampler should read memory at the fast interval now: always while the
    /// guard can act, and otherwise while any GPU is below soft (for the pressure metric).
    ///
    /// docs/guard.md turns the fast watch on only below soft. Measured on the H200, that lets
    /// the first soft (or even hard) crossing wait for the next full poll — up to a whole
    /// poll interval — and a 16 GiB/s job filled the GPU in that time. A memory-only read
    /// costs microseconds per GPU, so the watch runs whenever the guard may decide.
    pub fn wants_fast(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| {
            // Whether the guard may act is decided once, at wiring (`agent::build`): no
            // cluster means mode off.
            g.parts.guard.policy().mode != Mode::Off || g.parts.guard.any_below_soft()
        })
    }

    /// The executor decisions go to, if the guard acts.
    pub fn executor(&self) -> Option<Arc<dyn DecisionExecutor>> {
        self.guard.as_ref().and_then(|g| g.parts.executor.clone())
    }

    /// The guard's status as /state shows it (None without a guard).
    pub fn guard_json(&self) -> Option<serde_json::Value> {
        self.guard.as_ref().map(|g| g.status_json())
    }
}

impl GuardCore {
    fn refresh_hold(&mut self) {
        let st = self.parts.pods.status();
        let reason = if !st.synced {
            Some("the pod view has not synced yet".to_string())
        } else if !st.healthy {
            Some(format!(
                "the pod watch is failing: {}",
                st.last_error.unwrap_or_default()
            ))
        } else {
            None
        };
        if reason.as_deref() != self.parts.guard.held() {
            match &reason {
                Some(r) => tracing::warn!(reason = %r, "guard decisions paused"),
                None => tracing::info!("guard decisions resumed: pod view is current"),
            }
        }
        self.parts.guard.hold_decisions(reason);
    }

    /// Keeps `outcome` of pod `uid` with its recent decision, for /state.
    fn record(&mut self, id: u64, uid: &str, outcome: &EvictionOutcome) {
        if let Some(r) = self.recent.iter_mut().find(|r| r.decision.id == id) {
            r.outcomes.insert(uid.to_string(), outcome.clone());
        }
    }

    /// Logs what the guard learned of evictions that were in doubt.
    fn note_resolutions(&mut self) {
        for r in self.parts.guard.take_resolutions() {
            match &r.outcome {
                EvictionOutcome::Evicted => tracing::warn!(
                    decision = r.decision_id,
                    uid = %r.uid,
                    "eviction that was in doubt was carried out: the pod is gone or terminating"
                ),
                other => tracing::warn!(
                    decision = r.decision_id,
                    uid = %r.uid,
                    detail = other.detail().unwrap_or(""),
                    "eviction that was in doubt was not carried out"
                ),
            }
            self.record(r.decision_id, &r.uid, &r.outcome);
        }
    }

    fn dispatch(&mut self, decisions: Vec<Decision>, pods: Arc<PodMap>) -> Vec<Dispatch> {
        let mut out = Vec::new();
        for d in decisions {
            tracing::warn!(
                gpu = d.gpu,
                uuid = %d.uuid,
                decision = d.id,
                mode = d.mode.as_str(),
                trigger = d.trigger.as_str(),
                "{}",
                d.summary()
            );
            self.recent.push_back(Recent {
                decision: d.clone(),
                outcomes: BTreeMap::new(),
            });
            while self.recent.len() > RECENT_DECISIONS {
                self.recent.pop_front();
            }
            if self.parts.executor.is_some() {
                out.push((d, pods.clone()));
            }
        }
        out
    }

    fn status_json(&self) -> serde_json::Value {
        let view = GuardView {
            status: self.parts.guard.status(),
            held: self.parts.guard.held(),
            recent_decisions: self
                .recent
                .iter()
                .map(|r| RecentView {
                    id: r.decision.id,
                    gpu: r.decision.gpu,
                    uuid: &r.decision.uuid,
                    mode: r.decision.mode,
                    trigger: r.decision.trigger.as_str(),
                    summary: r.decision.summary(),
                    victims: recent_victims(r),
                })
                .collect(),
        };
        // Through a JSON value, whose objects keep their keys sorted: /state's layout.
        serde_json::to_value(&view).unwrap_or_default()
    }
}

/// The guard's part of `/state`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct GuardView<'a> {
    status: GuardStatus,
    held: Option<&'a str>,
    recent_decisions: Vec<RecentView<'a>>,
}

/// One recent decision in `/state`.
#[derive(serde::Serialize)]
struct RecentView<'a> {
    id: u64,
    gpu: u32,
    uuid: &'a str,
    mode: Mode,
    trigger: &'static str,
    summary: String,
    victims: Vec<RecentVictim<'a>>,
}

/// The planned victims and every other pod tried, in rank order, with what became of each.
fn recent_victims(r: &Recent) -> Vec<RecentVictim<'_>> {
    let d = &r.decision;
    let walked = !r.outcomes.is_empty();
    d.candidates
        .iter()
        .enumerate()
        .filter(|(i, v)| *i < d.planned || r.outcomes.contains_key(&v.uid))
        .map(|(_, v)| {
            let outcome = r.outcomes.get(&v.uid);
            let result = match (outcome, d.mode) {
                (Some(o), _) => o.as_str(),
                (None, Mode::DryRun) => "dry_run",
                (None, _) if walked => "not_tried",
                (None, _) => "pending",
            };
            RecentVictim {
                namespace: &v.namespace,
                name: &v.name,
                reason: &v.reason,
                result,
                detail: outcome.and_then(EvictionOutcome::detail),
            }
        })
        .collect()
}

/// Runs until `shutdown` resolves; then stops the sampler, the companions and lets HTTP
/// requests in flight finish (bounded at 5 s).
pub async fn run(parts: AgentParts, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let AgentParts {
        source,
        clock,
        cadence,
        pipeline,
        listener,
        http_limits,
        process,
        guard,
        companions,
    } = parts;
    let (tx, mut rx) = mpsc::channel::<Sampled>(16);
    let sampler =
        Sampler::spawn(source, clock.clone(), cadence, tx).map_err(AgentError::Sampler)?;
    let (pub_tx, pub_rx) = watch::channel::<Option<Arc<Published>>>(None);
    let (stop_http_tx, mut stop_http_rx) = watch::channel(false);
    let http_state = HttpState {
        published: pub_rx.clone(),
        clock: clock.clone(),
        poll_interval: cadence.poll,
        process,
    };
    let http_task = tokio::spawn(http::serve(listener, http_state, http_limits, async move {
        let _ = stop_http_rx.wait_for(|stop| *stop).await;
    }));
    let stops: Vec<CompanionStop> = companions
        .into_iter()
        .map(|start| start(pub_rx.clone()))
        .collect();
    let (out_tx, mut out_rx) = mpsc::channel::<(u64, Outcomes)>(64);
    let mut core = Core::new(pipeline, guard, clock.clone());
    let executor = core.executor();
    let execute = |dispatches: Vec<Dispatch>| {
        let Some(exec) = executor.clone() else {
            return;
        };
        for (d, pods) in dispatches {
            let (exec, tx) = (exec.clone(), out_tx.clone());
            tokio::spawn(async move {
                let id = d.id;
                let results = exec.execute(d, pods).await;
                let _ = tx.send((id, results)).await;
            });
        }
    };
    tokio::pin!(shutdown);
    let mut first = true;
    let mut fast = false;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Sampled::Full(snap, took)) => {
                    let (published, dispatches) = core.on_full(*snap, took);
                    execute(dispatches);
                    if first {
                        tracing::info!(gpus = published.snapshot.gpus.len(), "first snapshot published; ready");
                        first = false;
                    }
                    pub_tx.send_replace(Some(Arc::new(published)));
                }
                Some(Sampled::Memory { at, readings }) => {
                    if core.on_memory(at, readings) {
                        sampler.poll_now();
                    }
                }
                None => {
                    tracing::error!("sampler thread ended unexpectedly");
                    break;
                }
            },
            Some((id, results)) = out_rx.recv() => core.on_outcomes(id, results),
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                break;
            }
        }
        let want = core.wants_fast();
        if want != fast {
            fast = want;
            sampler.set_fast(want);
            tracing::info!(on = want, "fast memory watch");
        }
    }
    // Dropping the receiver first unblocks a sampler waiting to send.
    drop(rx);
    let stop = tokio::task::spawn_blocking(move || sampler.stop());
    let _ = stop_http_tx.send(true);
    for s in stops {
        let _ = tokio::time::timeout(Duration::from_secs(4), s()).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), stop).await;
    let _ = tokio::time::timeout(Duration::from_secs(6), http_task).await;
    Ok(())
}
