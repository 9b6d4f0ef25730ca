//! The wiring: from the parsed command line to a running agent. It opens the GPU source,
//! connects to the cluster (or not), builds the pod view, the attributor, the guard and
//! its enforcer, the node annotator and the HTTP server, and hands them to the event loop
//! (`agent::run`). Every start-up failure is a [`StartError`] naming the flag or file.

use super::{AgentParts, Core, GuardParts};
use crate::act::client::KubeClients;
use crate::act::enforce::Enforcer;
use crate::act::event_sender::EventSender;
use crate::act::lease::{read_carried, spawn_lease, LeaseConfig};
use crate::act::node_annotations::{remove_annotations, spawn_annotator};
use crate::act::signal::ProcSignals;
use crate::act::stop::Stopper;
use crate::attribute::attributor::ProcAttributor;
use crate::attribute::podresources::feed::{self, FeedConfig};
use crate::attribute::pods::{self, StaticPods};
use crate::attribute::ports::PodSource;
use crate::attribute::procfs::ProcFs;
use crate::attribute::watch::WatchedPods;
use crate::config::{self, Backend, Cli, KubeMode, Switch};
use crate::guard::carry::Carried;
use crate::guard::policy::{Mode, Policy, PolicyError};
use crate::guard::ports::DecisionExecutor;
use crate::guard::state::Guard;
use crate::model::clock::{Clock, SystemClock};
use crate::publish::annotations::{AnnotationConfig, FiguresState};
use crate::publish::auth::Auth;
use crate::publish::cuda_mismatch::CudaMismatches;
use crate::publish::http::{AuthFile, Authn, HttpLimits, HttpSecurity};
use crate::publish::job_peaks::JobPeaks;
use crate::publish::job_usage::UnderusePolicy;
use crate::publish::metrics::MetricsConfig;
use crate::publish::process_metrics::ProcessSource;
use crate::publish::process_reader::SelfProcess;
use crate::publish::self_metrics::SelfMetrics;
use crate::sample::nvml::NvmlSource;
use crate::sample::sampler::Cadence;
use crate::sample::scenario::{Scenario, ScenarioError};
use crate::sample::sim::{self, SimSource};
use crate::sample::{GpuSource, SourceError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The demo scenario played when the simulator runs without `--scenario`.
const EMBEDDED_SCENARIO: &str = include_str!("../../examples/a10g-timesliced.yaml");

/// Why the agent could not start (or stopped on a fault of its own).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error("cannot read --guard-config {}: {source}", path.display())]
    ReadPolicy {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: {source}")]
    Policy { origin: String, source: PolicyError },
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("running in Kubernetes with --backend auto: {0}")]
    NvmlInCluster(SourceError),
    #[error("cannot write the simulated /proc under {}: {source}", path.display())]
    SimProc {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Kube(#[from] crate::act::client::KubeError),
    #[error("registering self metrics: {0}")]
    Metrics(prometheus::Error),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Http(#[from] crate::publish::auth::FlagFileError),
    #[error("cannot listen on {addr} (--listen): {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Agent(#[from] super::AgentError),
    #[error("cannot print the simulated pods: {0}")]
    PrintPods(#[from] serde_yaml_ng::Error),
}

fn load_scenario(cli: &Cli) -> Result<Scenario, StartError> {
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

fn sim_source(cli: &Cli) -> Result<Opened, StartError> {
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
        .map_err(|source| StartError::SimProc {
            path: proc_root.clone(),
            source,
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

fn open_source(cli: &Cli, clock: &dyn Clock) -> Result<Opened, StartError> {
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
                    return Err(StartError::NvmlInCluster(e));
                }
                tracing::warn!(reason = %e, "NVML is not available: playing the simulated GPUs instead (--backend sim)");
                sim_source(cli)
            }
        },
    }
}

/// The guard policy: the file's, or the defaults, with `--guard-mode` on top and the one
/// annotation prefix; validated.
fn load_policy(cli: &Cli) -> Result<Policy, StartError> {
    let mut policy = match &cli.guard_config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| StartError::ReadPolicy {
                path: path.clone(),
                source,
            })?;
            Policy::from_yaml_str(&text).map_err(|source| StartError::Policy {
                origin: format!("--guard-config {}", path.display()),
                source,
            })?
        }
        None => Policy::default(),
    };
    if let Some(mode) = cli.guard_mode {
        policy.mode = mode;
    }
    let origin = match &cli.guard_config {
        Some(p) => format!("--guard-config {}", p.display()),
        None => "guard policy".to_string(),
    };
    cli.unify_annotation_prefix(&mut policy, &origin)?;
    policy
        .validate()
        .map_err(|source| StartError::Policy { origin, source })?;
    Ok(policy)
}

/// The guard: it always tracks pressure; it decides only with a cluster to act on.
fn guard_parts(
    mut policy: Policy,
    clients: Option<&KubeClients>,
    pods: Arc<dyn PodSource>,
    node: &str,
    self_metrics: &SelfMetrics,
    clock: &Arc<dyn Clock>,
    proc: ProcFs,
) -> GuardParts {
    let executor: Option<Arc<dyn DecisionExecutor>> = match clients {
        Some(c) if policy.mode != Mode::Off => {
            let mut enforcer = Enforcer::new(
                c,
                node.to_string(),
                self_metrics.clone(),
                &policy,
                clock.clone(),
            );
            // Dry-run never signals: only an enforcing guard gets the stopper.
            if policy.mode == Mode::Enforce && policy.on_decision.signals() {
                enforcer = enforcer.with_stopper(Arc::new(Stopper::new(
                    policy.on_decision,
                    Arc::new(ProcSignals::new(proc)),
                    self_metrics.clone(),
                    clock.clone(),
                )));
            }
            Some(Arc::new(enforcer))
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
        tracing::info!(mode = policy.mode.as_str(), on_decision = policy.on_decision.as_str(), hard = ?policy.hard, soft = ?policy.soft, "OOM guard");
    }
    GuardParts {
        guard: Guard::new(policy),
        pods,
        executor,
    }
}

fn print_sim_pods(cli: &Cli, node: &str) -> Result<(), StartError> {
    let scenario = load_scenario(cli)?;
    let fixtures = serde_json::json!({
        "nodes": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"nvidia.com/gpu.present": "true"}, "annotations": {}}}],
        "pods": sim::scenario_pods(&scenario, node),
    });
    print!("{}", serde_yaml_ng::to_string(&fixtures)?);
    Ok(())
}

/// Runs the agent the command line describes until SIGTERM or SIGINT.
pub fn run(cli: Cli) -> Result<(), StartError> {
    let node = cli.node_name.clone().unwrap_or_else(config::host_name);
    if cli.print_sim_pods {
        return print_sim_pods(&cli, &node);
    }
    let policy = load_policy(&cli)?;
    // Validated with the other flags (`Cli::validate`).
    let annotation_cfg = cli.annotation_config();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let opened = open_source(&cli, clock.as_ref())?;
    tracing::info!(backend = opened.source.name(), node = %node, listen = %cli.listen, poll_interval = ?cli.poll_interval, proc_root = %opened.proc_root.display(), "starting gpu-warden {}", env!("CARGO_PKG_VERSION"));
    let metrics = SelfMetrics::new(env!("CARGO_PKG_VERSION")).map_err(StartError::Metrics)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(cli.runtime_workers))
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    let temp_proc = opened.temp_proc.clone();
    let wiring = Wiring {
        cli,
        node,
        policy,
        annotation_cfg,
        clock,
        metrics,
    };
    let result = runtime.block_on(wiring.run(opened));
    // A sampler stuck in an NVML call for good would hold the runtime's drop forever (its
    // join runs on a blocking thread); exit anyway, the thread dies with the process.
    runtime.shutdown_timeout(Duration::from_secs(1));
    if let Some(dir) = temp_proc {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

/// How long the start waits for the Lease holding the guard's carried state.
const CARRY_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What the async half of the start-up needs.
struct Wiring {
    cli: Cli,
    node: String,
    policy: Policy,
    annotation_cfg: AnnotationConfig,
    clock: Arc<dyn Clock>,
    metrics: SelfMetrics,
}

impl Wiring {
    async fn run(self, opened: Opened) -> Result<(), StartError> {
        let clients = self.connect().await?;
        let pods = self.pod_view(clients.as_ref(), opened.scenario.as_ref());
        let attributor = ProcAttributor::new(
            ProcFs::new(&opened.proc_root),
            pods.clone(),
            Some(self.metrics.invisible_processes.clone()),
        );
        let request_key = self.policy.vram_request_annotation();
        let fast_interval = self.policy.fast_interval;
        let guard = guard_parts(
            self.policy.clone(),
            clients.as_ref(),
            pods.clone(),
            &self.node,
            &self.metrics,
            &self.clock,
            ProcFs::new(&opened.proc_root),
        );
        let mut core = Core::new(
            MetricsConfig {
                hostname_label: self.cli.hostname_label,
                hostname: self.node.clone(),
                per_process: self.cli.per_process_metrics,
                pod_labels: self.cli.dcgm_pod_labels,
            },
            self.metrics.clone(),
            self.clock.clone(),
        )
        .with_attributor(Box::new(attributor))
        .with_guard(guard);
        if clients.is_some() && self.cli.annotations == Switch::On {
            let channel = self.cli.figures_channel();
            core = core.with_figures(FiguresState::new(channel, &self.annotation_cfg));
        }
        if self.cli.job_peaks == Switch::On {
            core = core.with_job_peaks(
                JobPeaks::new(request_key.clone(), self.cli.job_peaks_max_series).with_underuse(
                    UnderusePolicy {
                        min_held: self.cli.job_underused_min_held,
                        max_share: self.cli.job_underused_max_share,
                    },
                ),
            );
        }
        // Always on: it speaks only of a need known and newer than the driver (docs/cuda.md).
        core = core.with_cuda_check(CudaMismatches::new(
            self.policy.annotation_prefix(),
            crate::publish::job_peaks::DEFAULT_MAX_SERIES,
        ));
        if let Some(mut rx) = self.replicas(pods.clone(), request_key).await {
            // The feed's latest answer matched with the poll's GPUs: an Arc clone while
            // neither changed.
            core = core.with_replicas(move |snap| rx.latest(snap));
        }
        let events = clients
            .as_ref()
            .map(|c| Arc::new(EventSender::new(c.main.clone(), self.node.clone())));
        let carry = self.carry(clients.as_ref(), &mut core).await;
        let companions = self.companions(clients.as_ref(), carry);
        let security = self.http_security()?;
        let listener = tokio::net::TcpListener::bind(self.cli.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: self.cli.listen,
                source,
            })?;
        let parts = AgentParts {
            source: opened.source,
            clock: self.clock.clone(),
            cadence: Cadence {
                poll: self.cli.poll_interval,
                process_util: self.cli.process_util_interval,
                slow_counters: self.cli.slow_counter_interval,
                fast: fast_interval,
            },
            core,
            listener,
            http_limits: HttpLimits {
                security,
                ..HttpLimits::default()
            },
            process: SelfProcess::new().map(|p| Arc::new(p) as Arc<dyn ProcessSource>),
            events,
            companions,
        };
        super::run(parts, shutdown_signal()).await?;
        Ok(())
    }

    /// The cluster's clients: none with `--kube off` or without any configuration.
    async fn connect(&self) -> Result<Option<KubeClients>, StartError> {
        match self.cli.kube {
            KubeMode::Off => {
                tracing::info!("--kube=off: standalone, metrics only; pod attribution from the API, node annotations and the guard are off");
                Ok(None)
            }
            KubeMode::Auto => match crate::act::client::connect().await? {
                Some(c) => {
                    tracing::info!(source = c.source, "Kubernetes API configured");
                    Ok(Some(c))
                }
                None => {
                    tracing::info!("no Kubernetes configuration (not in a cluster, no KUBECONFIG, no ~/.kube/config): standalone, metrics only; pod attribution from the API, node annotations and the guard are off");
                    Ok(None)
                }
            },
        }
    }

    /// The node's pods: watched from the API, or the scenario's own without a cluster.
    fn pod_view(
        &self,
        clients: Option<&KubeClients>,
        scenario: Option<&Scenario>,
    ) -> Arc<dyn PodSource> {
        match (clients, scenario) {
            (Some(c), _) => WatchedPods::spawn(c.direct.clone(), &self.node),
            (None, Some(sc)) => Arc::new(StaticPods(Arc::new(pods::index_json(
                &sim::scenario_pods(sc, &self.node),
            )))),
            (None, None) => Arc::new(StaticPods::default()),
        }
    }

    /// The kubelet's replica figures, when `--pod-resources on` and the socket answers.
    async fn replicas(
        &self,
        pods: Arc<dyn PodSource>,
        request_key: String,
    ) -> Option<feed::ReplicaReceiver> {
        match self.cli.pod_resources {
            Switch::On => {
                let cfg = FeedConfig {
                    socket: self.cli.pod_resources_socket.clone(),
                    interval: self.cli.pod_resources_interval,
                    request_key,
                };
                feed::start(cfg, pods).await
            }
            Switch::Off => {
                tracing::info!("--pod-resources=off: replica figures are not published");
                None
            }
        }
    }

    /// The node annotator (stopped, and its keys removed, at shutdown); with
    /// `--annotations off`, a one-off removal of what an earlier run may have left.
    fn companions(
        &self,
        clients: Option<&KubeClients>,
        carry: Option<watch::Receiver<Option<String>>>,
    ) -> Vec<super::Companion> {
        let Some(c) = clients else {
            return Vec::new();
        };
        let (client, node) = (c.direct.clone(), self.node.clone());
        match self.cli.annotations {
            Switch::On => {
                let (cfg, metrics, clock) = (
                    self.annotation_cfg.clone(),
                    self.metrics.clone(),
                    self.clock.clone(),
                );
                let lease = self.lease_companion(c, &cfg, carry);
                let annotator: super::Companion = Box::new(move |rx| {
                    let handle = spawn_annotator(client, node, cfg, rx, clock, metrics);
                    Box::new(move || {
                        Box::pin(async move {
                            if let Err(e) = handle.shutdown().await {
                                tracing::warn!(error = %e, "the node annotations may remain");
                            }
                        })
                    })
                });
                std::iter::once(annotator).chain(lease).collect()
            }
            Switch::Off => {
                let prefix = self.annotation_cfg.prefix.clone();
                tokio::spawn(async move {
                    let _ =
                        remove_annotations(client, &node, &prefix, Duration::from_secs(3)).await;
                });
                Vec::new()
            }
        }
    }

    /// The Lease task (liveness and figures for the extender; the guard's carried state
    /// when `carry` is given), when `--lease on` and the agent knows its namespace.
    fn lease_companion(
        &self,
        c: &KubeClients,
        node_cfg: &AnnotationConfig,
        carry: Option<watch::Receiver<Option<String>>>,
    ) -> Option<super::Companion> {
        let args = &self.cli.lease;
        if args.lease == Switch::Off {
            tracing::info!(heartbeat = ?node_cfg.heartbeat, min_interval = ?node_cfg.min_interval, "--lease=off: no Lease; the Node carries the figures alone, on the Node-only cadence unless --annotation-heartbeat / --annotation-min-interval say otherwise");
            return None;
        }
        let Some(cfg) = self.lease_config() else {
            tracing::warn!(heartbeat = ?node_cfg.heartbeat, min_interval = ?node_cfg.min_interval, "no --lease-namespace / POD_NAMESPACE: no Lease; the Node carries the figures alone, on the Node-only cadence unless --annotation-heartbeat / --annotation-min-interval say otherwise (set POD_NAMESPACE from the Downward API for the Lease)");
            return None;
        };
        let (client, node_cfg, clock) = (c.direct.clone(), node_cfg.clone(), self.clock.clone());
        Some(Box::new(move |rx| {
            let handle = spawn_lease(client, cfg, &node_cfg, rx, clock, carry);
            Box::new(move || Box::pin(handle.shutdown()))
        }))
    }

    /// Where the agent's Lease is, when it keeps one.
    fn lease_config(&self) -> Option<LeaseConfig> {
        let args = &self.cli.lease;
        let on = args.lease == Switch::On && self.cli.annotations == Switch::On;
        let namespace = args.lease_namespace.clone().filter(|_| on)?;
        Some(LeaseConfig {
            namespace,
            name: self.node.clone(),
            holder: args
                .lease_holder
                .clone()
                .unwrap_or_else(|| self.node.clone()),
            renew_interval: args.lease_renew_interval,
            duration: args.lease_duration,
        })
    }

    /// An enforcing guard's doubts and cooldowns outlive the process in its Lease
    /// (docs/guard.md, "What survives a restart"): what an earlier process left there is
    /// read once and handed to the guard, and the channel the Lease task writes from is
    /// wired to the core. Without a Lease they do not survive a restart, and the log says so.
    async fn carry(
        &self,
        clients: Option<&KubeClients>,
        core: &mut Core,
    ) -> Option<watch::Receiver<Option<String>>> {
        let c = clients.filter(|_| self.policy.mode == Mode::Enforce)?;
        let Some(cfg) = self.lease_config() else {
            tracing::warn!("no Lease (--lease, --annotations or POD_NAMESPACE): an eviction in doubt or a cooldown does not survive a restart of the agent");
            return None;
        };
        let prefix = &self.annotation_cfg.prefix;
        match read_carried(c.direct.clone(), &cfg, prefix, CARRY_READ_TIMEOUT).await {
            Ok(None) => {}
            Ok(Some(text)) => match Carried::parse(&text) {
                Ok(carried) => {
                    if let Some(r) = core.restore(carried) {
                        tracing::warn!(doubts = r.doubts, cooldowns = r.cooldowns, dropped = ?r.dropped, "guard state carried over a restart of the agent: no decision on those GPUs until it is resolved");
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %cfg.name, namespace = %cfg.namespace, error = %e, "the guard's carried state on the lease ({prefix}/{}) is unusable; ignored", crate::guard::carry::CARRY_KEY)
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the guard's carried state from the lease; starting without it")
            }
        }
        let (tx, rx) = watch::channel(core.carried().map(|c| c.to_json()));
        core.set_carry(Box::new(move |c| {
            tx.send_replace(c.map(|c| c.to_json()));
        }));
        Some(rx)
    }

    /// TLS and authentication for the HTTP server, from their flags.
    fn http_security(&self) -> Result<HttpSecurity, StartError> {
        let cli = &self.cli;
        // `Cli::validate` has refused two auth files.
        let tls = cli.tls.pair().map_err(config::ConfigError::from)?;
        let auth = match (&cli.web_auth_bearer_file, &cli.web_auth_basic_file) {
            (Some(p), _) => Some(AuthFile::Bearer(p)),
            (None, Some(p)) => Some(AuthFile::Basic(p)),
            (None, None) => None,
        };
        let security = HttpSecurity::load(cli.web_config_file.as_deref(), tls, auth)?;
        if cli.web_auth_basic_file.is_some() {
            tracing::warn!("--web-auth-basic-file (unsalted SHA-256 lines) is deprecated: use --web.config.file with basic_auth_users (bcrypt), exporter-toolkit's format (docs/reliability.md, \"Securing /metrics\")");
        }
        tracing::info!(
            tls = security.tls.is_some(),
            auth = match &security.auth {
                None => "none",
                Some(Authn::Fixed(Auth::Bearer(_))) => "bearer",
                Some(Authn::Fixed(Auth::Basic(_))) => "basic (sha256 file)",
                Some(Authn::Web(..)) => "web config file (basic_auth_users)",
            },
            "HTTP server security"
        );
        Ok(security)
    }
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (a terminal).
pub async fn shutdown_signal() {
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
