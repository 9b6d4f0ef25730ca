//! The `gpu-warden` binary: flags → backend → one event loop → clean shutdown.

use anyhow::Context;
use clap::Parser;
use gpu_warden::act::enforce::Enforcer;
use gpu_warden::act::node_annotations::{remove_annotations, spawn_annotator};
use gpu_warden::agent::pipeline::Pipeline;
use gpu_warden::agent::{self, AgentParts, GuardParts};
use gpu_warden::attribute::attributor::ProcAttributor;
use gpu_warden::attribute::podresources::feed::{self, FeedConfig};
use gpu_warden::attribute::pods::{self, StaticPods};
use gpu_warden::attribute::ports::PodSource;
use gpu_warden::attribute::procfs::ProcFs;
use gpu_warden::attribute::watch::WatchedPods;
use gpu_warden::config::{self, Backend, Cli, KubeMode, LogFormat, Switch};
use gpu_warden::guard::policy::{Mode, Policy};
use gpu_warden::guard::ports::DecisionExecutor;
use gpu_warden::guard::state::Guard;
use gpu_warden::model::clock::{Clock, SystemClock};
use gpu_warden::publish::annotations::AnnotationConfig;
use gpu_warden::publish::auth::Auth;
use gpu_warden::publish::http::{HttpLimits, HttpSecurity};
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
    if let Some(code) = extender_main() {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(msg) = cli.validate() {
        eprintln!("gpu-warden: error: {msg}");
        return ExitCode::from(2);
    }
    if let Err(e) = init_logging(&cli.log, cli.log_format) {
        eprintln!("gpu-warden: error: {e:#}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // One line on stderr, whatever the log format: the cause chain, each cause once.
        Err(e) => {
            eprintln!("gpu-warden: error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes joined with ": ", skipping a cause whose text the previous one
/// already ends with (thiserror messages often quote their source).
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        // Some causes (kube's YAML errors) span lines with a caret under the column.
        let text = cause
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.chars().all(|c| "|^ ".contains(c)))
            .collect::<Vec<_>>()
            .join(" ");
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// `gpu-warden extender …`: the scheduler extender (src/extender), or None for the agent.
fn extender_main() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    args.next()?;
    if args.next().as_deref() != Some(std::ffi::OsStr::new("extender")) {
        return None;
    }
    let cli = match gpu_warden::extender::config::ExtenderCli::try_parse_from(
        std::iter::once(std::ffi::OsString::from("gpu-warden extender")).chain(args),
    ) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(e) = init_logging(&cli.log, cli.log_format) {
        eprintln!("gpu-warden extender: error: {e:#}");
        return Some(ExitCode::from(2));
    }
    Some(match gpu_warden::extender::run(cli, shutdown_signal()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-warden extender: error: {}", chain(&e.into()));
            ExitCode::FAILURE
        }
    })
}

fn init_logging(log: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(log).with_context(|| {
        format!("--log {log:?} is not a valid filter (e.g. info, gpu_warden=debug)")
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
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
        source: Box::new(s.with_gpm_interval(cli.gpm_interval)),
        scenario: None,
        proc_root: cli
            .proc_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc")),
        temp_proc: None,
    }
}

fn open_source(cli: &Cli, clock: &dyn Clock) -> anyhow::Result<Opened> {
    match cli.backend {
        Backend::Sim => sim_source(cli),
        Backend::Nvml => Ok(nvml_source(
            cli,
            NvmlSource::open(clock, cli.gpm == Switch::On)?,
        )),
        // A scenario names the simulator: playing it is what was asked for.
        Backend::Auto if cli.scenario.is_some() => sim_source(cli),
        Backend::Auto => match NvmlSource::open(clock, cli.gpm == Switch::On) {
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

/// The guard policy: the file's, or the defaults, with `--guard-mode` on top; validated.
fn load_policy(cli: &Cli) -> anyhow::Result<Policy> {
    let mut policy = match &cli.guard_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --guard-config {}", path.display()))?;
            Policy::from_yaml_str(&text)
                .with_context(|| format!("--guard-config {}", path.display()))?
        }
        None => Policy::default(),
    };
    if let Some(mode) = cli.guard_mode {
        policy.mode = mode.into();
    }
    policy.validate().with_context(|| match &cli.guard_config {
        Some(p) => format!("--guard-config {}", p.display()),
        None => "guard policy".to_string(),
    })?;
    Ok(policy)
}

/// The guard: it always tracks pressure; it decides only with a cluster to act on.
fn guard_parts(
    mut policy: Policy,
    clients: Option<&gpu_warden::act::client::KubeClients>,
    pods: Arc<dyn PodSource>,
    node: &str,
    self_metrics: &SelfMetrics,
    clock: &Arc<dyn Clock>,
) -> GuardParts {
    let executor: Option<Arc<dyn DecisionExecutor>> = match clients {
        Some(c) if policy.mode != Mode::Off => {
            // The eviction walk and its Events must end well inside the cooldown, or a
            // second decision could evict for the same pressure.
            let budget = policy
                .cooldown_timeout
                .saturating_sub(Duration::from_secs(10))
                .max(Duration::from_secs(5));
            Some(Arc::new(
                Enforcer::new(
                    c,
                    node.to_string(),
                    self_metrics.clone(),
                    &policy,
                    clock.clone(),
                )
                .with_walk_budget(budget),
            ))
        }
        _ => None,
    };
    if executor.is_none() && policy.mode != Mode::Off {
        tracing::info!(
            mode = policy.mode.as_str(),
            "no Kubernetes API: the OOM guard only tracks pressure (mode off)"
        );
        policy.mode = Mode::Off;
    } else {
        tracing::info!(mode = policy.mode.as_str(), hard = ?policy.hard, soft = ?policy.soft, "OOM guard");
    }
    GuardParts {
        guard: Guard::new(policy),
        pods,
        executor,
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
    let policy = load_policy(&cli)?;
    let fast_interval = policy.fast_interval;
    let annotation_cfg = AnnotationConfig {
        prefix: cli.annotation_prefix.clone(),
        quantum_mib: cli.annotation_quantum_mib,
        heartbeat: cli.annotation_heartbeat,
        min_interval: cli.annotation_min_interval,
    };
    annotation_cfg.validate()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let opened = open_source(&cli, clock.as_ref())?;
    tracing::info!(backend = opened.source.name(), node = %node, listen = %cli.listen, poll_interval = ?cli.poll_interval, proc_root = %opened.proc_root.display(), "starting gpu-warden {}", env!("CARGO_PKG_VERSION"));
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
                tracing::info!("--kube=off: standalone, metrics only; pod attribution from the API, node annotations and the guard are off");
                None
            }
            KubeMode::Auto => match gpu_warden::act::client::connect().await? {
                Some(c) => {
                    tracing::info!(source = c.source, "Kubernetes API configured");
                    Some(c)
                }
                None => {
                    tracing::info!("no Kubernetes configuration (not in a cluster, no KUBECONFIG, no ~/.kube/config): standalone, metrics only; pod attribution from the API, node annotations and the guard are off");
                    None
                }
            },
        };
        let pods: Arc<dyn PodSource> = match (&clients, &opened.scenario) {
            (Some(c), _) => WatchedPods::spawn(c.direct.clone(), &node),
            (None, Some(sc)) => Arc::new(StaticPods(Arc::new(pods::index_json(
                sim::scenario_pods(sc, &node),
            )))),
            (None, None) => Arc::new(StaticPods::default()),
        };
        let attributor = ProcAttributor::new(
            ProcFs::new(&opened.proc_root),
            pods.clone(),
            Some(self_metrics.invisible_processes.clone()),
        );
        let request_key = policy.vram_request_annotation();
        let guard = guard_parts(policy, clients.as_ref(), pods.clone(), &node, &self_metrics, &clock);
        let replicas = match cli.pod_resources {
            Switch::On => {
                let cfg = FeedConfig {
                    socket: cli.pod_resources_socket.clone(),
                    interval: cli.pod_resources_interval,
                    request_key,
                };
                feed::start(cfg, pods.clone()).await
            }
            Switch::Off => {
                tracing::info!("--pod-resources=off: replica figures are not published");
                None
            }
        };
        let mut pipeline = Pipeline::new(
            MetricsConfig {
                hostname_label: cli.hostname_label.into(),
                hostname: node.clone(),
                per_process: cli.per_process_metrics,
            },
            self_metrics.clone(),
            clock.clone(),
        )
        .with_attributor(Box::new(attributor));
        if let Some(rx) = replicas {
            pipeline = pipeline.with_replicas(rx);
        }
        let mut companions: Vec<agent::Companion> = Vec::new();
        if let Some(c) = &clients {
            match cli.annotations {
                Switch::On => {
                    let (client, node, metrics, clock) =
                        (c.direct.clone(), node.clone(), self_metrics.clone(), clock.clone());
                    companions.push(Box::new(move |rx| {
                        let handle = spawn_annotator(client, node, annotation_cfg, rx, clock, metrics);
                        Box::new(move || {
                            Box::pin(async move {
                                if let Err(e) = handle.shutdown().await {
                                    tracing::warn!(error = %e, "the node annotations may remain");
                                }
                            })
                        })
                    }));
                }
                Switch::Off => {
                    // Clear what an earlier run may have left behind.
                    let (client, node, prefix) = (c.direct.clone(), node.clone(), annotation_cfg.prefix.clone());
                    tokio::spawn(async move {
                        let _ = remove_annotations(client, &node, &prefix, Duration::from_secs(3)).await;
                    });
                }
            }
        }
        let security = HttpSecurity::load(
            cli.web_tls_cert.as_deref(),
            cli.web_tls_key.as_deref(),
            cli.web_auth_bearer_file.as_deref(),
            cli.web_auth_basic_file.as_deref(),
        )
        .map_err(anyhow::Error::msg)?;
        tracing::info!(
            tls = security.tls.is_some(),
            auth = match &security.auth {
                None => "none",
                Some(Auth::Bearer(_)) => "bearer",
                Some(Auth::Basic(_)) => "basic",
            },
            "HTTP server security"
        );
        let listener = tokio::net::TcpListener::bind(cli.listen)
            .await
            .with_context(|| format!("cannot listen on {} (--listen)", cli.listen))?;
        let parts = AgentParts {
            source: opened.source,
            clock,
            cadence: Cadence {
                poll: cli.poll_interval,
                process_util: cli.process_util_interval,
                slow_counters: cli.slow_counter_interval,
                fast: fast_interval,
            },
            pipeline,
            listener,
            http_limits: HttpLimits {
                security,
                ..HttpLimits::default()
            },
            guard: Some(guard),
            companions,
        };
        agent::run(parts, shutdown_signal()).await?;
        anyhow::Ok(())
    });
    // A sampler stuck in an NVML call for good would hold the runtime's drop forever (its
    // join runs on a blocking thread); exit anyway, the thread dies with the process.
    runtime.shutdown_timeout(Duration::from_secs(1));
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
