//! The `gpu-warden` binary: flags → backend → one event loop → clean shutdown.

use anyhow::Context;
use clap::Parser;
use gpu_warden::agent::{self, AgentParts};
use gpu_warden::attribute::attributor::ProcAttributor;
use gpu_warden::attribute::pods::{self, PodSource, StaticPods};
use gpu_warden::attribute::procfs::ProcFs;
use gpu_warden::attribute::watch::WatchedPods;
use gpu_warden::clock::{Clock, SystemClock};
use gpu_warden::config::{self, Backend, Cli, KubeMode, LogFormat};
use gpu_warden::pipeline::Pipeline;
use gpu_warden::publish::http::HttpLimits;
use gpu_warden::publish::metrics::MetricsConfig;
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::sample::nvml::NvmlSource;
use gpu_warden::sample::sampler::Cadence;
use gpu_warden::sample::scenario::Scenario;
use gpu_warden::sample::sim::{self, SimSource};
use gpu_warden::sample::GpuSource;
use std::path::PathBuf;
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

fn load_scenario(cli: &Cli) -> anyhow::Result<Scenario> {
    Ok(match &cli.scenario {
        Some(path) => Scenario::load(path)?,
        None => Scenario::parse(EMBEDDED_SCENARIO, "built-in a10g-timesliced.yaml")?,
    })
}

/// The GPU source, and for the simulator its scenario and the simulated /proc it writes.
struct Opened {
    source: Box<dyn GpuSource>,
    scenario: Option<Scenario>,
    proc_root: PathBuf,
    temp_proc: Option<PathBuf>,
}

fn sim_source(cli: &Cli) -> anyhow::Result<Opened> {
    let scenario = load_scenario(cli)?;
    let (proc_root, temp_proc) = match &cli.proc_root {
        Some(p) => (p.clone(), None),
        None => {
            let p =
                std::env::temp_dir().join(format!("gpu-warden-sim-proc-{}", std::process::id()));
            (p.clone(), Some(p))
        }
    };
    let source = SimSource::new(scenario.clone())
        .with_proc_root(&proc_root)
        .with_context(|| {
            format!(
                "cannot write the simulated /proc under {}",
                proc_root.display()
            )
        })?;
    Ok(Opened {
        source: Box::new(source),
        scenario: Some(scenario),
        proc_root,
        temp_proc,
    })
}

fn nvml_source(cli: &Cli, s: NvmlSource) -> Opened {
    Opened {
        source: Box::new(s),
        scenario: None,
        proc_root: cli
            .proc_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc")),
        temp_proc: None,
    }
}

fn open_source(cli: &Cli) -> anyhow::Result<Opened> {
    match cli.backend {
        Backend::Sim => sim_source(cli),
        Backend::Nvml => Ok(nvml_source(cli, NvmlSource::open()?)),
        // A scenario names the simulator: playing it is what was asked for.
        Backend::Auto if cli.scenario.is_some() => sim_source(cli),
        Backend::Auto => match NvmlSource::open() {
            Ok(s) => Ok(nvml_source(cli, s)),
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

fn print_sim_pods(cli: &Cli, node: &str) -> anyhow::Result<()> {
    let scenario = load_scenario(cli)?;
    let fixtures = serde_json::json!({
        "nodes": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"nvidia.com/gpu.present": "true"}, "annotations": {}}}],
        "pods": sim::scenario_pods(&scenario, node),
    });
    print!("{}", serde_yaml_ng::to_string(&fixtures)?);
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let node = cli.node_name.clone().unwrap_or_else(config::host_name);
    if cli.print_sim_pods {
        return print_sim_pods(&cli, &node);
    }
    let opened = open_source(&cli)?;
    tracing::info!(backend = opened.source.name(), node = %node, listen = %cli.listen, poll_interval = ?cli.poll_interval, proc_root = %opened.proc_root.display(), "starting gpu-warden {}", env!("CARGO_PKG_VERSION"));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let self_metrics =
        SelfMetrics::new(env!("CARGO_PKG_VERSION")).context("registering self metrics")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let temp_proc = opened.temp_proc.clone();
    let result = runtime.block_on(async move {
        let clients = match cli.kube {
            KubeMode::Off => {
                tracing::info!("--kube=off: standalone, metrics only; pod attribution, node annotations and the guard are off");
                None
            }
            KubeMode::Auto => match gpu_warden::kube::connect().await {
                Ok(c) => {
                    tracing::info!(source = c.source, "Kubernetes API configured");
                    Some(c)
                }
                Err(e) => {
                    tracing::info!(reason = %e, "no Kubernetes cluster found: standalone, metrics only; pod attribution from the API, node annotations and the guard are off");
                    None
                }
            },
        };
        let pods: Arc<dyn PodSource> = match (&clients, &opened.scenario) {
            (Some(c), _) => WatchedPods::spawn(c.main.clone(), &node),
            (None, Some(sc)) => {
                let objects = sim::scenario_pods(sc, &node);
                let parsed: Vec<k8s_openapi::api::core::v1::Pod> = objects
                    .into_iter()
                    .filter_map(|o| serde_json::from_value(o).ok())
                    .collect();
                Arc::new(StaticPods(Arc::new(pods::index(parsed.iter()))))
            }
            (None, None) => Arc::new(StaticPods::default()),
        };
        let attributor = ProcAttributor::new(
            ProcFs::new(&opened.proc_root),
            pods,
            Some(self_metrics.invisible_processes.clone()),
        );
        let pipeline = Pipeline::new(
            MetricsConfig {
                hostname_label: cli.hostname_label.into(),
                hostname: node.clone(),
                per_process: cli.per_process_metrics,
            },
            self_metrics,
            clock.clone(),
        )
        .with_attributor(Box::new(attributor));
        let listener = tokio::net::TcpListener::bind(cli.listen)
            .await
            .with_context(|| format!("cannot listen on {} (--listen)", cli.listen))?;
        let parts = AgentParts {
            source: opened.source,
            clock,
            cadence: Cadence {
                poll: cli.poll_interval,
                process_util: cli.process_util_interval,
                fast: Duration::from_millis(100),
            },
            pipeline,
            listener,
            http_limits: HttpLimits::default(),
            guard: None,
            companions: Vec::new(),
        };
        agent::run(parts, shutdown_signal()).await?;
        anyhow::Ok(())
    });
    if let Some(dir) = temp_proc {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
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
