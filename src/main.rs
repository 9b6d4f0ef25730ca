//! The `gpu-warden` binary: flags → backend → one event loop → clean shutdown.

use anyhow::{bail, Context};
use clap::Parser;
use gpu_warden::agent::{self, AgentParts};
use gpu_warden::clock::{Clock, SystemClock};
use gpu_warden::config::{self, Backend, Cli, LogFormat};
use gpu_warden::pipeline::Pipeline;
use gpu_warden::publish::http::HttpLimits;
use gpu_warden::publish::metrics::MetricsConfig;
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::sample::nvml::NvmlSource;
use gpu_warden::sample::sampler::Cadence;
use gpu_warden::sample::scenario::Scenario;
use gpu_warden::sample::sim::SimSource;
use gpu_warden::sample::GpuSource;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The demo scenario played when the simulator runs without `--scenario`.
const EMBEDDED_SCENARIO: &str = include_str!("../examples/a10g-timesliced.yaml");

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(msg) = cli.validate() {
        eprintln!("gpu-warden: error: {msg}");
        return ExitCode::from(2);
    }
    if let Err(e) = init_logging(&cli) {
        eprintln!("gpu-warden: error: {e:#}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("gpu-warden: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log).with_context(|| {
        format!(
            "--log {:?} is not a valid filter (e.g. info, gpu_warden=debug)",
            cli.log
        )
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cli.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}

fn sim_source(cli: &Cli) -> anyhow::Result<Box<dyn GpuSource>> {
    let scenario = match &cli.scenario {
        Some(path) => Scenario::load(path)?,
        None => Scenario::parse(EMBEDDED_SCENARIO, "built-in a10g-timesliced.yaml")?,
    };
    Ok(Box::new(SimSource::new(scenario)))
}

fn open_source(cli: &Cli) -> anyhow::Result<Box<dyn GpuSource>> {
    match cli.backend {
        Backend::Sim => sim_source(cli),
        Backend::Nvml => Ok(Box::new(NvmlSource::open()?)),
        Backend::Auto => match NvmlSource::open() {
            Ok(s) => {
                if cli.scenario.is_some() {
                    bail!("--scenario was given but NVML is available; pass --backend sim to play the scenario");
                }
                Ok(Box::new(s))
            }
            Err(e) => {
                // Inside a cluster a missing NVML is a deployment fault to surface, not a
                // reason to export invented figures.
                if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
                    return Err(
                        anyhow::Error::new(e).context("running in Kubernetes with --backend auto")
                    );
                }
                tracing::warn!(reason = %e, "NVML is not available: playing the simulated GPUs instead (--backend sim)");
                sim_source(cli)
            }
        },
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let source = open_source(&cli)?;
    let node = cli.node_name.clone().unwrap_or_else(config::host_name);
    tracing::info!(backend = source.name(), node = %node, listen = %cli.listen, poll_interval = ?cli.poll_interval, "starting gpu-warden {}", env!("CARGO_PKG_VERSION"));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let self_metrics =
        SelfMetrics::new(env!("CARGO_PKG_VERSION")).context("registering self metrics")?;
    let pipeline = Pipeline::new(
        MetricsConfig {
            hostname_label: cli.hostname_label.into(),
            hostname: node,
            per_process: cli.per_process_metrics,
        },
        self_metrics,
        clock.clone(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cli.listen)
            .await
            .with_context(|| format!("cannot listen on {} (--listen)", cli.listen))?;
        let parts = AgentParts {
            source,
            clock,
            cadence: Cadence {
                poll: cli.poll_interval,
                process_util: cli.process_util_interval,
                fast: Duration::from_millis(100),
            },
            pipeline,
            listener,
            http_limits: HttpLimits::default(),
        };
        agent::run(parts, shutdown_signal()).await?;
        Ok(())
    })
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (a terminal).
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
