//! Flags and environment (`GPU_WARDEN_*`), validated at start. A bad value ends the
//! program with a message naming the flag and what it accepts (clap's own errors), never
//! a panic.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
use gpu_warden_attribute as attribute;
use gpu_warden_guard as guard;
use gpu_warden_model as model;
use gpu_warden_publish as publish;

pub mod check;

use crate::guard::policy::{Mode, Policy};
use crate::publish::annotations::{AnnotationConfig, AnnotationConfigError, FiguresChannel};
use crate::publish::dcgm_pod_labels::PodLabels;
use crate::publish::metrics::HostnameLabel;
use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub mod flag_values;
pub mod lease;
pub mod tls;

pub use flag_values::{parse_interval, Choices, IntervalError, Switch};

/// Which GPU source to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// NVML when it loads; outside Kubernetes, fall back to the simulator.
    Auto,
    /// Real GPUs through NVML (`libnvidia-ml.so.1`).
    Nvml,
    /// The simulator playing `--scenario` (or the built-in A10G demo scenario).
    Sim,
}

// The domain's own enums are the flags' values (no mirrored copies): their spellings and
// help come from here.
const HOSTNAME_LABELS: Choices<HostnameLabel> = Choices(&[
    (
        HostnameLabel::Hostname,
        "Hostname",
        "`Hostname`, as dcgm-exporter up to 4.8.2 and dashboard 12239 use",
    ),
    (
        HostnameLabel::Lower,
        "hostname",
        "`hostname`, as dcgm-exporter 4.8.3 and later use",
    ),
    (HostnameLabel::Off, "none", "No hostname label"),
]);

const POD_LABELS: Choices<PodLabels> = Choices(&[
    (PodLabels::Off, "off", "No pod labels"),
    (
        PodLabels::On,
        "on",
        "container, namespace, pod of the GPU's largest user: one series per GPU, as dcgm-exporter's Kubernetes mode",
    ),
    (
        PodLabels::PerPod,
        "per-pod",
        "One series per container with a process on the GPU, each with the GPU's value, as dcgm-exporter's --kubernetes-virtual-gpus",
    ),
]);

const GUARD_MODES: Choices<Mode> = Choices(&[
    (
        Mode::Off,
        Mode::Off.as_str(),
        "Pressure only: metrics and annotations, no decisions",
    ),
    (
        Mode::DryRun,
        Mode::DryRun.as_str(),
        "Decide, log, emit Events and metrics; evict nothing",
    ),
    (
        Mode::Enforce,
        Mode::Enforce.as_str(),
        "Decide and evict through the Eviction API",
    ),
]);

/// Whether to use the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KubeMode {
    /// In-cluster config, else KUBECONFIG; standalone (metrics only) when neither exists.
    Auto,
    /// Never: metrics only; annotations and the guard are off.
    Off,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// gpu-warden: GPU metrics, free-VRAM node annotations and an OOM guard for Kubernetes nodes.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpu-warden",
    version,
    long_about = None,
    mut_arg("web_tls_cert", |a| a.env("GPU_WARDEN_WEB_TLS_CERT")),
    mut_arg("web_tls_key", |a| a.env("GPU_WARDEN_WEB_TLS_KEY"))
)]
pub struct Cli {
    /// GPU source.
    #[arg(long, value_enum, default_value = "auto", env = "GPU_WARDEN_BACKEND")]
    pub backend: Backend,

    /// Scenario file for the simulator (see docs/scenarios.md); implies the simulator under
    /// --backend auto. Without it the simulator plays the built-in examples/a10g-timesliced.yaml.
    #[arg(long, value_name = "FILE", env = "GPU_WARDEN_SCENARIO")]
    pub scenario: Option<PathBuf>,

    /// Address to serve /metrics, /healthz, /readyz and /state on.
    #[arg(long, default_value = "0.0.0.0:9400", env = "GPU_WARDEN_LISTEN")]
    pub listen: SocketAddr,

    /// exporter-toolkit's web configuration file (`tls_server_config`, `basic_auth_users`
    /// with bcrypt hashes), as every Prometheus exporter takes it; re-read when it or its
    /// certificates change. Excludes the --web-tls-* and --web-auth-* flags.
    #[arg(
        long = "web.config.file",
        value_name = "FILE",
        env = "GPU_WARDEN_WEB_CONFIG_FILE"
    )]
    pub web_config_file: Option<PathBuf>,

    #[command(flatten)]
    pub tls: tls::TlsPairArgs,

    /// Require `Authorization: Bearer <token>` on /metrics, /state and /; the token is the
    /// file's content (one line). /healthz and /readyz stay open for the kubelet.
    #[arg(long, value_name = "FILE", env = "GPU_WARDEN_WEB_AUTH_BEARER_FILE")]
    pub web_auth_bearer_file: Option<PathBuf>,

    /// Deprecated: --web.config.file's `basic_auth_users` (bcrypt) replaces it. Require HTTP
    /// Basic auth on /metrics, /state and /; the file holds `user:<sha256 hex of the
    /// password>` lines. /healthz and /readyz stay open.
    #[arg(long, value_name = "FILE", env = "GPU_WARDEN_WEB_AUTH_BASIC_FILE")]
    pub web_auth_basic_file: Option<PathBuf>,

    /// Full poll interval.
    #[arg(long, default_value = "1s", value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_POLL_INTERVAL")]
    pub poll_interval: Duration,

    /// How often per-process SM utilization is read (about 1.8 ms per H200 per read).
    #[arg(long, default_value = "5s", value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_PROCESS_UTIL_INTERVAL")]
    pub process_util_interval: Duration,

    /// How often the slow counters are read: the energy counter (about 4 ms per read on an
    /// H200, driver 580) and the PCIe replay counter. Between reads the last value is exported.
    #[arg(long, default_value = "10s", value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_SLOW_COUNTER_INTERVAL")]
    pub slow_counter_interval: Duration,

    /// How often NVML GPM is sampled for the DCGM_FI_PROF_* families (Hopper and newer):
    /// each figure is the average over the window since the previous sample, and polls in
    /// between repeat it. Computing the metrics costs about 1.8 ms per H200 per sample.
    #[arg(long, default_value = "1s", value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_GPM_INTERVAL")]
    pub gpm_interval: Duration,

    /// Whether NVML GPM (the DCGM_FI_PROF_* families) is read at all; `off` leaves them
    /// absent (cost measurements, drivers that misbehave).
    #[arg(long, value_enum, default_value_t = Switch::On, value_name = "on|off", env = "GPU_WARDEN_GPM")]
    pub gpm: Switch,

    /// Worker threads of the async runtime (HTTP, the pod watch, the annotator, evictions).
    /// The event loop, the sampler and the XID watch have threads of their own. Two, because
    /// one was measured dearer on the H200, not cheaper (docs/performance.md).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64), value_name = "N", env = "GPU_WARDEN_RUNTIME_WORKERS")]
    pub runtime_workers: u16,

    /// Whether each pod's peak GPU memory per GPU is recorded when its processes end: the
    /// histogram gpu_warden_ci_job_gpu_memory_peak_bytes{namespace,project} and a Normal
    /// Event on the pod if it still exists (docs/sizing.md).
    #[arg(long, value_enum, default_value_t = Switch::On, value_name = "on|off", env = "GPU_WARDEN_JOB_PEAKS")]
    pub job_peaks: Switch,

    /// Most (namespace, project) series of the job-peak histogram; peaks of further pairs
    /// are counted under namespace="_other", project="_other".
    #[arg(long, default_value_t = crate::publish::job_peaks::DEFAULT_MAX_SERIES, value_parser = clap::value_parser!(usize), value_name = "N", env = "GPU_WARDEN_JOB_PEAKS_MAX_SERIES")]
    pub job_peaks_max_series: usize,

    /// A finished job that held a GPU replica at least this long and used less than
    /// --job-underused-max-share of it gets a Normal Event GPUUnderused (docs/sizing.md).
    #[arg(long, default_value = "10m", value_parser = crate::model::units::parse_duration, value_name = "DURATION", env = "GPU_WARDEN_JOB_UNDERUSED_MIN_HELD")]
    pub job_underused_min_held: Duration,

    /// The busy share (GPU time used over time held, 0..1) below which such a job is told.
    #[arg(long, default_value = "0.1", value_parser = crate::publish::job_usage::parse_share, value_name = "RATIO", env = "GPU_WARDEN_JOB_UNDERUSED_MAX_SHARE")]
    pub job_underused_max_share: f64,

    /// Name of the hostname label on DCGM families.
    #[arg(
        long,
        value_parser = HOSTNAME_LABELS,
        default_value = "Hostname",
        env = "GPU_WARDEN_HOSTNAME_LABEL"
    )]
    pub hostname_label: HostnameLabel,

    /// Pod labels (`container`, `namespace`, `pod`) on the DCGM families, as dcgm-exporter's
    /// Kubernetes mode adds them, for dashboards built on those; see README, "Pod labels on
    /// DCGM families" for what each means on a time-sliced GPU.
    #[arg(
        long,
        value_parser = POD_LABELS,
        default_value = "off",
        env = "GPU_WARDEN_DCGM_POD_LABELS"
    )]
    pub dcgm_pod_labels: PodLabels,

    /// This node's name (Downward API `spec.nodeName`); defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Also export gpu_warden_process_gpu_memory_used_bytes per process (one series per pid).
    #[arg(long, env = "GPU_WARDEN_PER_PROCESS_METRICS")]
    pub per_process_metrics: bool,

    /// Kubernetes use: pod attribution, node annotations and the guard need it.
    #[arg(long, value_enum, default_value = "auto", env = "GPU_WARDEN_KUBE")]
    pub kube: KubeMode,

    /// Where the host's /proc is (NVML reports host PIDs). The simulator writes its own
    /// simulated /proc here when given, else into a temporary directory.
    #[arg(long, value_name = "DIR", env = "GPU_WARDEN_PROC_ROOT")]
    pub proc_root: Option<PathBuf>,

    /// OOM guard mode; overrides `mode` in --guard-config. Default: the policy's (dry-run).
    #[arg(long, value_parser = GUARD_MODES, env = "GPU_WARDEN_GUARD_MODE")]
    pub guard_mode: Option<Mode>,

    /// Guard policy file (YAML; see docs/guard.md). Invalid policies stop the agent at start.
    #[arg(long, value_name = "FILE", env = "GPU_WARDEN_GUARD_CONFIG")]
    pub guard_config: Option<PathBuf>,

    /// Publish free VRAM as annotations on this node.
    #[arg(long, value_enum, default_value = "on", env = "GPU_WARDEN_ANNOTATIONS")]
    pub annotations: Switch,

    /// Prefix of every annotation key: those written on the node (`<prefix>/vram-free-mib`,
    /// …) and those read on pods (`<prefix>/evict`, `<prefix>/vram-request-mib`).
    #[arg(
        long,
        default_value = crate::model::units::DEFAULT_ANNOTATION_PREFIX,
        env = "GPU_WARDEN_ANNOTATION_PREFIX"
    )]
    pub annotation_prefix: String,

    /// Annotation values move in steps of this many MiB (hysteresis against churn).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_048_576), env = "GPU_WARDEN_ANNOTATION_QUANTUM_MIB")]
    pub annotation_quantum_mib: u64,

    /// Re-patch the Node's annotations at least this often [default: 5m30s with a Lease
    /// (it carries liveness), 60s without one (the Node is the only channel)].
    #[arg(long, value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_ANNOTATION_HEARTBEAT")]
    pub annotation_heartbeat: Option<Duration>,

    /// Patch the Node at most once per this interval on average, and a change that
    /// under-states what is free no sooner [default: 5m30s with a Lease (it carries changes
    /// within seconds), 5s without one].
    #[arg(long, value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_ANNOTATION_MIN_INTERVAL")]
    pub annotation_min_interval: Option<Duration>,

    /// Correct a Node figure that over-states what is free (free memory the tolerance below
    /// it, pressure above it) this soon after the last patch, while the burst lasts.
    #[arg(long, default_value = "5s", value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_ANNOTATION_OVER_PROMISE_INTERVAL")]
    pub annotation_over_promise_interval: Duration,

    /// A Node figure over-states what is free when a GPU's free memory is this share of the
    /// GPU (at least two quanta) below it; smaller gaps wait for the minimum interval.
    #[arg(long, default_value_t = crate::publish::annotations::DEFAULT_OVER_PROMISE_TOLERANCE_PERCENT, value_parser = clap::value_parser!(u32).range(0..=100), value_name = "PERCENT", env = "GPU_WARDEN_ANNOTATION_OVER_PROMISE_TOLERANCE_PERCENT")]
    pub annotation_over_promise_tolerance_percent: u32,

    /// Over-promise corrections the Node may get ahead of its budget of one patch per
    /// minimum interval (a token bucket); 0 makes them wait for the minimum interval.
    #[arg(long, default_value_t = crate::publish::annotations::DEFAULT_OVER_PROMISE_BURST, value_parser = clap::value_parser!(u32).range(0..=100), env = "GPU_WARDEN_ANNOTATION_OVER_PROMISE_BURST")]
    pub annotation_over_promise_burst: u32,

    /// Read the kubelet's pod-resources API (which pod holds which GPU replica). When the
    /// socket is absent or may not be connected to, the feature is off with one log line.
    #[arg(
        long,
        value_enum,
        default_value = "on",
        env = "GPU_WARDEN_POD_RESOURCES"
    )]
    pub pod_resources: Switch,

    /// The kubelet's pod-resources socket. Mount its directory, not the socket: the kubelet
    /// recreates the socket when it restarts.
    #[arg(long, value_name = "PATH", default_value = crate::attribute::podresources::client::DEFAULT_SOCKET, env = "GPU_WARDEN_POD_RESOURCES_SOCKET")]
    pub pod_resources_socket: PathBuf,

    /// How often the kubelet's pod-resources API is read (on its own task: polls never wait
    /// for it). Allocations change when pods start, so seconds are plenty.
    #[arg(long, default_value = "5s", value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_POD_RESOURCES_INTERVAL")]
    pub pod_resources_interval: Duration,

    /// Print the pods the scenario's processes run in, as fixtures for the API double
    /// (YAML), and exit.
    #[arg(long)]
    pub print_sim_pods: bool,

    #[command(flatten)]
    pub lease: lease::LeaseArgs,

    #[command(flatten)]
    pub logging: LogArgs,
}

/// The logging flags, shared by the agent and `gpu-warden extender`.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "GPU_WARDEN_LOG_FORMAT"
    )]
    pub log_format: LogFormat,

    /// Log filter (tracing EnvFilter syntax, e.g. `info` or `gpu_warden=debug`).
    #[arg(long, default_value = "info", env = "GPU_WARDEN_LOG")]
    pub log: String,
}

/// A combination of flags that cannot work; the message names the flags.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--scenario only applies to --backend sim or auto")]
    ScenarioNeedsSim,
    #[error("{flag} ({value}) must not be shorter than --poll-interval ({poll})")]
    ShorterThanPoll {
        flag: &'static str,
        value: String,
        poll: String,
    },
    #[error(transparent)]
    Annotations(#[from] AnnotationConfigError),
    #[error(transparent)]
    Lease(#[from] lease::LeaseArgsError),
    #[error(transparent)]
    TlsPair(#[from] tls::TlsPairError),
    #[error("--web-auth-bearer-file and --web-auth-basic-file exclude each other; pick one")]
    TwoAuthFiles,
    #[error("--web.config.file excludes {0}: put TLS and users in the web config file (tls_server_config, basic_auth_users)")]
    WebConfigAndFlag(&'static str),
    #[error("--node-name / NODE_NAME must be 1..253 characters")]
    NodeName,
    #[error("{origin}: annotationPrefix {policy:?} differs from --annotation-prefix {flag:?}; node and pod annotations share one prefix: set --annotation-prefix (GPU_WARDEN_ANNOTATION_PREFIX) and drop the key")]
    PrefixConflict {
        origin: String,
        policy: String,
        flag: String,
    },
}

impl Cli {
    /// Cross-flag checks clap cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.scenario.is_some() && self.backend == Backend::Nvml {
            return Err(ConfigError::ScenarioNeedsSim);
        }
        for (flag, value) in [
            ("--process-util-interval", self.process_util_interval),
            ("--slow-counter-interval", self.slow_counter_interval),
        ] {
            if value < self.poll_interval {
                return Err(ConfigError::ShorterThanPoll {
                    flag,
                    value: humantime::format_duration(value).to_string(),
                    poll: humantime::format_duration(self.poll_interval).to_string(),
                });
            }
        }
        self.annotation_config().validate()?;
        self.lease.validate()?;
        if self.web_config_file.is_some() {
            let old = [
                ("--web-tls-cert", self.tls.web_tls_cert.is_some()),
                ("--web-tls-key", self.tls.web_tls_key.is_some()),
                (
                    "--web-auth-bearer-file",
                    self.web_auth_bearer_file.is_some(),
                ),
                ("--web-auth-basic-file", self.web_auth_basic_file.is_some()),
            ];
            if let Some((flag, _)) = old.iter().find(|(_, set)| *set) {
                return Err(ConfigError::WebConfigAndFlag(flag));
            }
        }
        self.tls.pair()?;
        if self.web_auth_bearer_file.is_some() && self.web_auth_basic_file.is_some() {
            return Err(ConfigError::TwoAuthFiles);
        }
        if let Some(n) = &self.node_name {
            if n.is_empty() || n.len() > 253 {
                return Err(ConfigError::NodeName);
            }
        }
        Ok(())
    }

    /// Gives `policy` (read from `origin`) the one annotation prefix, `--annotation-prefix`:
    /// the guard reads `<prefix>/evict` and `<prefix>/vram-request-mib` on pods under the
    /// prefix the node's keys are written with, as the scheduler extender reads both with
    /// one prefix. A policy that names another prefix is refused rather than half applied.
    pub fn unify_annotation_prefix(
        &self,
        policy: &mut Policy,
        origin: &str,
    ) -> Result<(), ConfigError> {
        match &policy.annotation_prefix {
            Some(p) if *p != self.annotation_prefix => Err(ConfigError::PrefixConflict {
                origin: origin.to_string(),
                policy: p.clone(),
                flag: self.annotation_prefix.clone(),
            }),
            _ => {
                policy.annotation_prefix = Some(self.annotation_prefix.clone());
                Ok(())
            }
        }
    }

    /// Which channel carries the current figures: the Lease when the agent keeps one,
    /// else the Node alone.
    pub fn figures_channel(&self) -> FiguresChannel {
        FiguresChannel::of(self.lease.will_run())
    }

    /// The node annotations' settings, from their flags; the cadence flags not given take
    /// the defaults of the channel ([`FiguresChannel::node_cadence`]).
    pub fn annotation_config(&self) -> AnnotationConfig {
        let channel = self.figures_channel();
        let (heartbeat, min_interval) = channel.node_cadence();
        AnnotationConfig {
            prefix: self.annotation_prefix.clone(),
            quantum_mib: self.annotation_quantum_mib,
            heartbeat: self.annotation_heartbeat.unwrap_or(heartbeat),
            min_interval: self.annotation_min_interval.unwrap_or(min_interval),
            // With a Lease the extender learns of a pressure rise there, within a poll; on
            // the Node a rise is an over-promise, corrected through its write budget
            // (docs/annotations.md, "Write discipline").
            pressure_rise_at_once: channel == FiguresChannel::Node,
            over_promise_interval: self.annotation_over_promise_interval,
            over_promise_burst: self.annotation_over_promise_burst,
            over_promise_tolerance_percent: self.annotation_over_promise_tolerance_percent,
            under_promise_at_heartbeat: true,
        }
    }
}

/// The host's name, for when no node name is given.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gpu-warden").chain(args.iter().copied()))
    }

    /// Each variant of the other rooms' enums has exactly one spelling in its `Choices`
    /// table, and the flag parses that spelling back to it: the table replaced `ValueEnum`,
    /// whose match the compiler held exhaustive. The matches below keep that: a new variant
    /// fails to compile here until it is listed, and then this test asks for its row.
    #[test]
    fn every_variant_of_the_domain_enums_is_a_flag_value() {
        fn listed_h(h: HostnameLabel) {
            match h {
                HostnameLabel::Hostname | HostnameLabel::Lower | HostnameLabel::Off => {}
            }
        }
        fn listed_p(p: PodLabels) {
            match p {
                PodLabels::Off | PodLabels::On | PodLabels::PerPod => {}
            }
        }
        fn listed_m(m: Mode) {
            match m {
                Mode::Off | Mode::DryRun | Mode::Enforce => {}
            }
        }
        fn check<T: PartialEq + Copy + std::fmt::Debug>(
            flag: &str,
            table: Choices<T>,
            all: &[T],
            listed: fn(T),
            read: fn(&Cli) -> T,
        ) {
            for v in all {
                listed(*v);
                let rows: Vec<_> = table.0.iter().filter(|(t, _, _)| t == v).collect();
                assert_eq!(rows.len(), 1, "{flag}: {v:?} has {} rows", rows.len());
                let cli = parse(&[flag, rows[0].1]).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(read(&cli), *v, "{flag} {}", rows[0].1);
            }
            assert_eq!(table.0.len(), all.len(), "{flag}: a row for no variant");
        }
        use HostnameLabel as H;
        check(
            "--hostname-label",
            HOSTNAME_LABELS,
            &[H::Hostname, H::Lower, H::Off],
            listed_h,
            |c| c.hostname_label,
        );
        check(
            "--dcgm-pod-labels",
            POD_LABELS,
            &[PodLabels::Off, PodLabels::On, PodLabels::PerPod],
            listed_p,
            |c| c.dcgm_pod_labels,
        );
        check(
            "--guard-mode",
            GUARD_MODES,
            &[Mode::Off, Mode::DryRun, Mode::Enforce],
            listed_m,
            |c| c.guard_mode.unwrap_or_default(),
        );
        let e = parse(&["--guard-mode", "evict"]).unwrap_err().to_string();
        assert!(e.contains("dry-run") && e.contains("enforce"), "{e}");
    }

    #[test]
    fn the_job_usage_flags_default_to_the_policy_and_refuse_bad_values_in_one_line() {
        use crate::publish::job_usage::{DEFAULT_MAX_SHARE, DEFAULT_MIN_HELD};
        let c = parse(&[]).unwrap();
        assert_eq!(c.job_underused_min_held, DEFAULT_MIN_HELD);
        assert_eq!(c.job_underused_max_share, DEFAULT_MAX_SHARE);
        let c = parse(&[
            "--job-underused-min-held",
            "30m",
            "--job-underused-max-share",
            "0.25",
        ])
        .unwrap();
        assert_eq!(c.job_underused_min_held, Duration::from_secs(1800));
        assert_eq!(c.job_underused_max_share, 0.25);
        for (flag, bad) in [
            ("--job-underused-max-share", "15%"),
            ("--job-underused-min-held", "soon"),
        ] {
            let e = parse(&[flag, bad]).unwrap_err().to_string();
            let first = e.lines().next().unwrap_or_default();
            assert!(first.contains(flag) && first.contains(bad), "{e}");
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.backend, Backend::Auto);
        assert_eq!(c.listen.to_string(), "0.0.0.0:9400");
        assert_eq!(c.poll_interval, Duration::from_secs(1));
        assert_eq!(
            c.gpm_interval,
            Duration::from_secs(1),
            "GPM every full poll"
        );
        assert_eq!(c.hostname_label, HostnameLabel::Hostname);
        assert_eq!(c.pod_resources, Switch::On);
        assert_eq!(
            c.pod_resources_socket,
            PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(c.pod_resources_interval, Duration::from_secs(5));
        assert_eq!(
            c.dcgm_pod_labels,
            PodLabels::Off,
            "dcgm-exporter without Kubernetes mode"
        );
        c.validate().unwrap();
        let c = parse(&["--dcgm-pod-labels", "per-pod"]).unwrap();
        assert_eq!(c.dcgm_pod_labels, PodLabels::PerPod);
        let e = parse(&["--dcgm-pod-labels", "all"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--dcgm-pod-labels") && e.contains("per-pod"),
            "{e}"
        );
    }

    #[test]
    fn without_a_lease_the_node_cadence_switches_to_node_only_by_itself() {
        let s = Duration::from_secs;
        let lease = parse(&["--lease-namespace", "gpu-warden"]).unwrap();
        let c = lease.annotation_config();
        assert_eq!(lease.figures_channel(), FiguresChannel::Lease);
        assert_eq!((c.heartbeat, c.min_interval), (s(330), s(330)));
        assert!(!c.pressure_rise_at_once && c.under_promise_at_heartbeat);
        assert_eq!((c.over_promise_interval, c.over_promise_burst), (s(5), 3));
        assert_eq!(c.over_promise_tolerance_percent, 0);
        let alone = parse(&["--lease", "off", "--lease-namespace", "gpu-warden"]).unwrap();
        let c = alone.annotation_config();
        assert_eq!(alone.figures_channel(), FiguresChannel::Node);
        assert_eq!((c.heartbeat, c.min_interval), (s(60), s(5)));
        assert!(c.pressure_rise_at_once && c.under_promise_at_heartbeat);
        alone.validate().unwrap();
        // Flags given win over either channel's defaults.
        let set = parse(&[
            "--lease",
            "off",
            "--annotation-heartbeat",
            "2m",
            "--annotation-min-interval",
            "30s",
            "--annotation-over-promise-interval",
            "2s",
            "--annotation-over-promise-burst",
            "0",
            "--annotation-over-promise-tolerance-percent",
            "10",
        ])
        .unwrap();
        let c = set.annotation_config();
        assert_eq!((c.heartbeat, c.min_interval), (s(120), s(30)));
        assert_eq!((c.over_promise_interval, c.over_promise_burst), (s(2), 0));
        assert_eq!(c.over_promise_tolerance_percent, 10);
        let e = parse(&["--annotation-over-promise-burst", "101"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--annotation-over-promise-burst"), "{e}");
        let e = parse(&["--annotation-over-promise-tolerance-percent", "101"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--annotation-over-promise-tolerance-percent"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_the_flag_and_allowed_values() {
        let e = parse(&["--backend", "cuda"]).unwrap_err().to_string();
        assert!(
            e.contains("--backend") && e.contains("nvml") && e.contains("sim"),
            "{e}"
        );
        let e = parse(&["--poll-interval", "fast"]).unwrap_err().to_string();
        assert!(e.contains("--poll-interval"), "{e}");
        let e = parse(&["--poll-interval", "0s"]).unwrap_err().to_string();
        assert!(e.contains("at least 1ms"), "{e}");
        let e = parse(&["--gpm-interval", "2h"]).unwrap_err().to_string();
        assert!(
            e.contains("--gpm-interval") && e.contains("at most 1h"),
            "{e}"
        );
        assert_eq!(
            parse(&["--gpm-interval", "10s"]).unwrap().gpm_interval,
            Duration::from_secs(10)
        );
        let e = parse(&["--hostname-label", "host"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Hostname") && e.contains("none"), "{e}");
        let e = parse(&["--listen", "nowhere"]).unwrap_err().to_string();
        assert!(e.contains("--listen"), "{e}");
    }

    #[test]
    fn cross_flag_checks() {
        let c = parse(&["--backend", "nvml", "--scenario", "x.yaml"]).unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("--scenario"));
        let c = parse(&["--poll-interval", "10s", "--process-util-interval", "1s"]).unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--process-util-interval"));
        let c = parse(&["--web-tls-cert", "c.pem"]).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("--web-tls-cert") && e.contains("--web-tls-key"),
            "{e}"
        );
        let c = parse(&["--web-auth-bearer-file", "t", "--web-auth-basic-file", "b"]).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("--web-auth-bearer-file") && e.contains("--web-auth-basic-file"),
            "{e}"
        );
        for old in [
            "--web-tls-cert",
            "--web-auth-bearer-file",
            "--web-auth-basic-file",
        ] {
            let c = parse(&["--web.config.file", "web.yml", old, "f"]).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert_eq!(
                e,
                format!("--web.config.file excludes {old}: put TLS and users in the web config file (tls_server_config, basic_auth_users)")
            );
        }
        parse(&["--web.config.file", "web.yml"])
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn one_annotation_prefix_for_node_and_pod_keys() {
        // No key in the policy: the flag's prefix (default or given) is the pods' too.
        for (args, want) in [
            (&[][..], "gpu-warden.io"),
            (&["--annotation-prefix", "example.com"][..], "example.com"),
        ] {
            let c = parse(args).unwrap();
            let mut p = Policy::default();
            c.unify_annotation_prefix(&mut p, "guard policy").unwrap();
            assert_eq!(p.evict_annotation(), format!("{want}/evict"));
            assert_eq!(
                p.vram_request_annotation(),
                format!("{want}/vram-request-mib")
            );
            assert_eq!(c.annotation_config().prefix, want);
        }
        // A key that agrees is accepted.
        let c = parse(&["--annotation-prefix", "example.com"]).unwrap();
        let mut p = Policy::from_yaml_str("annotationPrefix: example.com\n").unwrap();
        c.unify_annotation_prefix(&mut p, "--guard-config p.yaml")
            .unwrap();
        assert_eq!(p.annotation_prefix(), "example.com");
        // One that does not is refused in one line naming both.
        let c = parse(&[]).unwrap();
        let mut p = Policy::from_yaml_str("annotationPrefix: example.com\n").unwrap();
        let e = c
            .unify_annotation_prefix(&mut p, "--guard-config p.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--guard-config p.yaml: annotationPrefix \"example.com\" differs from --annotation-prefix \"gpu-warden.io\"; node and pod annotations share one prefix: set --annotation-prefix (GPU_WARDEN_ANNOTATION_PREFIX) and drop the key"
        );
    }
}
