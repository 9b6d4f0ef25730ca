//! A simulated node on the real agent core: the simulator playing a scenario (with its
//! simulated `/proc`), the real attributor and guard inside the agent's [`Core`], and a manual
//! clock. Tests, the soak and the benches drive it poll by poll instead of wiring the agent
//! by hand; what they measure and assert is the core the binary runs.

use crate::agent::core::LatestReplicas;
use crate::agent::{Core, Dispatch, GuardParts};
use crate::attribute::attributor::ProcAttributor;
use crate::attribute::pods::{index_json, StaticPods};
use crate::attribute::ports::{Attributor, PodSource};
use crate::attribute::procfs::ProcFs;
use crate::guard::policy::Policy;
use crate::guard::ports::DecisionExecutor;
use crate::guard::state::Guard;
use crate::model::clock::{Clock, ManualClock};
use crate::model::snapshot::Snapshot;
use crate::publish::job_peaks::{JobPeaks, DEFAULT_MAX_SERIES};
use crate::publish::metrics::{HostnameLabel, MetricsConfig};
use crate::publish::self_metrics::SelfMetrics;
use crate::publish::state::Published;
use crate::sample::sampler::Stamper;
use crate::sample::scenario::Scenario;
use crate::sample::sim::{scenario_pods, SimHandle, SimSource};
use crate::sample::{GpuSource, MemoryReading, PollRequest};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How to build a [`Rig`]; every field has a default.
pub struct RigOptions {
    /// The node name (pods are bound to it, the hostname label carries it).
    pub node: String,
    /// The pod view; default: the scenario's own pods, fixed.
    pub pods: Option<Arc<dyn PodSource>>,
    /// The guard's policy; `None` runs without a guard.
    pub policy: Option<Policy>,
    /// What carries decisions out; default: nothing (decisions are only returned).
    pub executor: Option<Arc<dyn DecisionExecutor>>,
    /// The self-metrics registry; default: a fresh one.
    pub metrics: Option<SelfMetrics>,
    /// Per-process metric families.
    pub per_process: bool,
    /// Wall time at monotonic zero (when the rig makes its own clock).
    pub wall_origin: SystemTime,
    /// The clock, when the caller's other parts (an enforcer, a pod view) must share it;
    /// default: a new one at `wall_origin`.
    pub clock: Option<Arc<ManualClock>>,
    /// Where the simulated `/proc` is made (a directory of its own inside); default: the
    /// system's temporary directory. A soak puts it on tmpfs, as the real `/proc` is.
    pub proc_parent: Option<PathBuf>,
    /// Record each pod's VRAM peak (`--job-peaks on`); default off.
    pub job_peaks: bool,
    /// The hostname label's name (`--hostname-label`); default `Hostname`.
    pub hostname_label: HostnameLabel,
    /// Pod labels on the DCGM families (`--dcgm-pod-labels`); default off.
    pub pod_labels: crate::publish::dcgm_pod_labels::PodLabels,
    /// Who attributes processes; default: the real attributor over the simulated `/proc`.
    pub attributor: Option<Box<dyn Attributor>>,
    /// The kubelet's pod-resources view at each poll (`Core::with_replicas`); default none.
    pub replicas: Option<LatestReplicas>,
}

impl Default for RigOptions {
    fn default() -> Self {
        RigOptions {
            node: "node".into(),
            pods: None,
            policy: None,
            executor: None,
            metrics: None,
            per_process: false,
            wall_origin: UNIX_EPOCH + Duration::from_secs(1_790_000_000),
            clock: None,
            proc_parent: None,
            job_peaks: false,
            hostname_label: HostnameLabel::default(),
            pod_labels: Default::default(),
            attributor: None,
            replicas: None,
        }
    }
}

/// Why a rig could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    #[error(transparent)]
    Scenario(#[from] crate::sample::scenario::ScenarioError),
    #[error("cannot write the simulated /proc under {}: {source}", path.display())]
    Proc {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot register self metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// A simulated node on the real [`Core`].
pub struct Rig {
    /// The clock every part reads; move it with [`Rig::set`].
    pub clock: Arc<ManualClock>,
    /// Controls the simulated processes (kill one, change its growth).
    pub sim: SimHandle,
    /// The agent core under test.
    pub core: Core,
    /// The pod view the core sees.
    pub pods: Arc<dyn PodSource>,
    /// The self-metrics registry the core records into.
    pub metrics: SelfMetrics,
    source: SimSource,
    stamper: Stamper,
    proc_root: PathBuf,
}

impl Rig {
    /// A rig playing `scenario_yaml` with `options`.
    pub fn new(scenario_yaml: &str, options: RigOptions) -> Result<Rig, RigError> {
        let scenario = Scenario::parse(scenario_yaml, "rig")?;
        Self::from_scenario(scenario, options)
    }

    /// A rig playing `scenario` with `options`.
    pub fn from_scenario(scenario: Scenario, options: RigOptions) -> Result<Rig, RigError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let proc_root = options
            .proc_parent
            .unwrap_or_else(std::env::temp_dir)
            .join(format!(
                "gpu-warden-rig-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
        let pods = options.pods.unwrap_or_else(|| {
            Arc::new(StaticPods(Arc::new(index_json(&scenario_pods(
                &scenario,
                &options.node,
            )))))
        });
        let source = SimSource::new(scenario)
            .with_proc_root(&proc_root)
            .map_err(|source| RigError::Proc {
                path: proc_root.clone(),
                source,
            })?;
        let clock = options
            .clock
            .unwrap_or_else(|| Arc::new(ManualClock::new(options.wall_origin)));
        let metrics = match options.metrics {
            Some(m) => m,
            None => SelfMetrics::new("rig")?,
        };
        let attributor = options.attributor.unwrap_or_else(|| {
            Box::new(ProcAttributor::new(
                ProcFs::new(&proc_root),
                pods.clone(),
                None,
            ))
        });
        let core = Core::new(
            MetricsConfig {
                hostname_label: options.hostname_label,
                hostname: options.node.clone(),
                per_process: options.per_process,
                pod_labels: options.pod_labels,
            },
            metrics.clone(),
            clock.clone(),
        )
        .with_attributor(attributor);
        let core = if options.job_peaks {
            let key = options
                .policy
                .as_ref()
                .map(Policy::vram_request_annotation)
                .unwrap_or_else(|| Policy::default().vram_request_annotation());
            core.with_job_peaks(JobPeaks::new(key, DEFAULT_MAX_SERIES))
        } else {
            core
        };
        let core = match options.replicas {
            Some(latest) => core.with_replicas(latest),
            None => core,
        };
        let core = match options.policy {
            Some(policy) => core.with_guard(GuardParts {
                guard: Guard::new(policy),
                pods: pods.clone(),
                executor: options.executor,
            }),
            None => core,
        };
        Ok(Rig {
            sim: source.handle(),
            clock,
            core,
            pods,
            metrics,
            source,
            stamper: Stamper::default(),
            proc_root,
        })
    }

    /// Moves the clock to `t` after its origin.
    pub fn set(&self, t: Duration) {
        self.clock.set(t);
    }

    /// A full poll of the simulator now (every field, process utilization and slow
    /// counters included), stamped as the sampler stamps it; not yet given to the core.
    pub fn sample(&mut self) -> Snapshot {
        self.sample_with(PollRequest {
            process_utilization: true,
            slow_counters: true,
        })
    }

    /// As [`Rig::sample`], with the expensive calls the sampler's cadences ask for.
    pub fn sample_with(&mut self, req: PollRequest) -> Snapshot {
        let now = self.clock.mono();
        let raw = self.source.poll(now, req);
        self.stamper.stamp(raw, now, self.clock.wall())
    }

    /// The simulated `/proc` the attributor reads.
    pub fn proc_root(&self) -> &std::path::Path {
        &self.proc_root
    }

    /// A full poll now, handed to the core as the sampler would: the publication and the
    /// decisions to run.
    pub fn full(&mut self) -> (Published, Vec<Dispatch>) {
        let snap = self.sample();
        self.core.on_full(snap, Duration::ZERO)
    }

    /// A memory-only reading now (the fast watch), handed to the core: what was read, and
    /// whether the guard wants a full poll at once.
    pub fn memory(&mut self) -> (Vec<MemoryReading>, bool) {
        let now = self.clock.mono();
        let readings = self.source.memory(now);
        let refresh = self.core.on_memory(now, readings.clone());
        (readings, refresh)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.proc_root);
    }
}
