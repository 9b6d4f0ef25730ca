//! The agent's one event loop: sampler readings in, publications and guard decisions out,
//! until shutdown. Everything it runs is injected (source, clock, listener, pod view,
//! decision executor), so integration tests start the same loop the binary does.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
use gpu_warden_act as act;
use gpu_warden_attribute as attribute;
use gpu_warden_config as config;
use gpu_warden_guard as guard;
use gpu_warden_model as model;
use gpu_warden_publish as publish;
use gpu_warden_sample as sample;

pub mod build;
pub mod core;

pub use self::core::{Core, Dispatch, GuardParts};
use crate::act::event_sender::EventSender;
use crate::guard::notes::EventDraft;
use crate::guard::ports::{ConfirmRequest, Confirmation, Outcomes};
use crate::model::clock::Clock;
use crate::publish::http::{self, HttpLimits, HttpState};
use crate::publish::process_metrics::{ProcessSource, ScrapeBodies};
use crate::publish::state::Published;
use crate::sample::sampler::{Cadence, Sampled, Sampler};
use crate::sample::GpuSource;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

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
    /// The per-poll step, with its attributor and guard.
    pub core: Core,
    pub listener: TcpListener,
    pub http_limits: HttpLimits,
    /// The agent's own process, read by the first scrape of each poll for the `process_*`
    /// families.
    pub process: Option<Arc<dyn ProcessSource>>,
    /// Sends the Events the core asks for beside decisions (a job's VRAM peak); None
    /// without a cluster.
    pub events: Option<Arc<EventSender>>,
    pub companions: Vec<Companion>,
}

/// Errors that end the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot start the sampler thread: {0}")]
    Sampler(std::io::Error),
}

/// Sends the core's Events beside decisions (a job's VRAM peak), each on its own task:
/// best effort, a failure is logged and nothing else changes.
fn notify(events: Option<&Arc<EventSender>>, clock: &dyn Clock, drafts: Vec<EventDraft>) {
    let Some(sender) = events else {
        return;
    };
    let at = clock.wall();
    for draft in drafts {
        let sender = sender.clone();
        tokio::spawn(async move {
            if let Err(e) = sender.send(&draft, at).await {
                tracing::warn!(reason = draft.reason, namespace = %draft.namespace, error = %e, "cannot create Event (best effort)");
            }
        });
    }
}

/// Runs until `shutdown` resolves; then stops the sampler, the companions and lets HTTP
/// requests in flight finish (bounded at 5 s).
pub async fn run(parts: AgentParts, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let AgentParts {
        source,
        clock,
        cadence,
        mut core,
        listener,
        http_limits,
        process,
        events,
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
        bodies: Arc::new(ScrapeBodies::new(process, cadence.poll)),
    };
    let http_task = tokio::spawn(http::serve(
        listener,
        http_state,
        http_limits,
        Box::pin(async move {
            let _ = stop_http_rx.wait_for(|stop| *stop).await;
        }),
    ));
    let stops: Vec<CompanionStop> = companions
        .into_iter()
        .map(|start| start(pub_rx.clone()))
        .collect();
    let (out_tx, mut out_rx) = mpsc::channel::<(u64, Outcomes)>(64);
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
    let (conf_tx, mut conf_rx) = mpsc::channel::<(ConfirmRequest, Confirmation)>(16);
    let confirm = |requests: Vec<ConfirmRequest>| {
        let Some(exec) = executor.clone() else {
            return;
        };
        for r in requests {
            let (exec, tx) = (exec.clone(), conf_tx.clone());
            tokio::spawn(async move {
                let answer = exec.confirm(r.clone()).await;
                let _ = tx.send((r, answer)).await;
            });
        }
    };
    tokio::pin!(shutdown);
    let mut first = true;
    let mut fast: Option<Duration> = None;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Sampled::Full(snap, took)) => {
                    let (published, dispatches) = core.on_full(*snap, took);
                    execute(dispatches);
                    confirm(core.take_confirms());
                    notify(events.as_ref(), clock.as_ref(), core.take_notices());
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
            Some((request, answer)) = conf_rx.recv() => core.on_confirmation(&request, answer),
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                break;
            }
        }
        let want = core.fast_interval();
        if want != fast {
            if want.is_some() != fast.is_some() {
                tracing::info!(on = want.is_some(), "fast memory watch");
            }
            fast = want;
            sampler.set_fast(want);
        }
    }
    // Nothing will resolve a doubt after this: resume what is still stopped.
    if let Some(exec) = &executor {
        exec.shutdown();
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
