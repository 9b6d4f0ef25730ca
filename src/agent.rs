//! The agent's one event loop: sampler readings in, publications out, until shutdown.
//! Everything it runs is injected (source, clock, listener), so integration tests start
//! the same loop the binary does.

use crate::clock::Clock;
use crate::pipeline::Pipeline;
use crate::publish::http::{self, HttpLimits, HttpState};
use crate::publish::state::Published;
use crate::sample::sampler::{Cadence, Sampled, Sampler};
use crate::sample::GpuSource;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the loop needs.
pub struct AgentParts {
    pub source: Box<dyn GpuSource>,
    pub clock: Arc<dyn Clock>,
    pub cadence: Cadence,
    pub pipeline: Pipeline,
    pub listener: TcpListener,
    pub http_limits: HttpLimits,
}

/// Errors that end the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot start the sampler thread: {0}")]
    Sampler(std::io::Error),
}

/// Runs until `shutdown` resolves; then stops the sampler and lets HTTP requests in
/// flight finish (bounded at 5 s).
pub async fn run(parts: AgentParts, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let AgentParts {
        source,
        clock,
        cadence,
        mut pipeline,
        listener,
        http_limits,
    } = parts;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Sampled>(16);
    let sampler =
        Sampler::spawn(source, clock.clone(), cadence, tx).map_err(AgentError::Sampler)?;
    let (pub_tx, pub_rx) = watch::channel::<Option<Arc<Published>>>(None);
    let (stop_http_tx, mut stop_http_rx) = watch::channel(false);
    let http_state = HttpState {
        published: pub_rx,
        clock: clock.clone(),
        poll_interval: cadence.poll,
    };
    let http_task = tokio::spawn(http::serve(listener, http_state, http_limits, async move {
        let _ = stop_http_rx.wait_for(|stop| *stop).await;
    }));
    tokio::pin!(shutdown);
    let mut first = true;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Sampled::Full(snap, took)) => {
                    let snap = pipeline.prepare(snap, took);
                    let published = pipeline.publish(snap, Default::default(), serde_json::Value::Null);
                    if first {
                        tracing::info!(gpus = published.snapshot.gpus.len(), "first snapshot published; ready");
                        first = false;
                    }
                    pub_tx.send_replace(Some(Arc::new(published)));
                }
                Some(Sampled::Memory { .. }) => {}
                None => {
                    tracing::error!("sampler thread ended unexpectedly");
                    break;
                }
            },
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                break;
            }
        }
    }
    // Dropping the receiver first unblocks a sampler waiting to send.
    drop(rx);
    let stop = tokio::task::spawn_blocking(move || sampler.stop());
    let _ = stop_http_tx.send(true);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), stop).await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(6), http_task).await;
    Ok(())
}
