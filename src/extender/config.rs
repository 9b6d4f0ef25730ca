//! `gpu-warden extender`'s flags and policy file.
//!
//! Flags (environment fallbacks `GPU_WARDEN_EXTENDER_*`) say where to listen and whom to
//! watch; the YAML file (`--config`) holds the placement policy, with every key optional:
//!
//! ```yaml
//! annotationPrefix: gpu-warden.io
//! marginMiB: 512            # kept free beyond the pod's need
//! staleAfter: 120s          # 8 x the agents' Lease renewal; 2 x the Node heartbeat of agents without one
//! unknownNode: pass         # stale, missing or unreadable figures: pass (fail-open) | fail
//! score: spread             # spread (most room left) | pack (best fit)
//! promisedPercent: 75       # of memory promised on a GPU but not allocated yet, kept free
//! ledgerTtl: 180s           # how long a bound pod's reservation lives at most
//! resource: nvidia.com/gpu
//! cudaCheck: strict         # driver older than a pod's known CUDA need: strict | minorCompatible | off
//! unknownNeed: {rule: wholeGpu} # the default: a GPU to itself; or {rule: reserve, mib: N} | {rule: pass}
//! learned:                  # needs learned per GitLab project (off without a url)
//!   prometheusUrl: http://prometheus-operated.monitoring:9090
//!   window: 7d
//!   minJobs: 3
//!   refresh: 5m
//!   maxAge: 1h
//!   caFile: /etc/prometheus-ca/ca.crt      # https:// only; the system's roots without it
//!   bearerTokenFile: /var/run/secrets/prometheus/token   # or:
//!   # basicAuth: {username: extender, passwordFile: /etc/prometheus-auth/password}
//! defaults:                 # first match wins; a pod's own annotation and a learned need beat them
//!   - {namespace: gitlab-ci, selector: "project.runner.gitlab.com/id=42", mib: 12288}
//!   - {namespace: gitlab-ci, mib: 4096}
//! ```

use super::core::ExtenderPolicy;
use super::judge::{JudgePolicy, ScoreMode, UnknownNode};
use super::need::{DefaultNeed, NeedRules, UnknownNeed};
use clap::Parser;
use gpu_warden_config::check::{check_prefix, CheckError};
use gpu_warden_config::tls::TlsPairArgs;
use gpu_warden_config::{parse_interval, IntervalError, LogArgs};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// gpu-warden extender: kube-scheduler's HTTP extender (filter, prioritize) placing GPU pods
/// by the free VRAM gpu-warden's agents publish on their Nodes.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpu-warden extender",
    // The usage line: without it clap names the binary from argv[0] ("gpu-warden").
    bin_name = "gpu-warden extender",
    version,
    about = "kube-scheduler HTTP extender: places GPU pods by the free VRAM gpu-warden publishes on Nodes",
    long_about = None,
    mut_arg("web_tls_cert", |a| a.env("GPU_WARDEN_EXTENDER_WEB_TLS_CERT")),
    mut_arg("web_tls_key", |a| a.env("GPU_WARDEN_EXTENDER_WEB_TLS_KEY"))
)]
pub struct ExtenderCli {
    /// Address to serve /filter, /prioritize, /metrics, /healthz and /readyz on. Loopback
    /// only: kube-scheduler reaches its sidecar there, and the verbs carry no credentials
    /// (kube-scheduler's extender client sends none).
    #[arg(
        long,
        default_value = "127.0.0.1:8888",
        env = "GPU_WARDEN_EXTENDER_LISTEN"
    )]
    pub listen: SocketAddr,

    /// Also serve GET /healthz, /readyz and /metrics (never the verbs) on this address, for
    /// the kubelet's probes and Prometheus, which reach the pod's IP, not its loopback.
    #[arg(long, value_name = "ADDR", env = "GPU_WARDEN_EXTENDER_PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,

    /// Placement policy file (YAML; see docs/scheduling.md). Defaults apply without it.
    #[arg(long, value_name = "FILE", env = "GPU_WARDEN_EXTENDER_CONFIG")]
    pub config: Option<PathBuf>,

    /// The scheduler profile whose bindings fill the reservation ledger: pods are watched
    /// with `spec.schedulerName=<this>`.
    #[arg(
        long,
        default_value = "gpu-warden-scheduler",
        env = "GPU_WARDEN_EXTENDER_SCHEDULER_NAME"
    )]
    pub scheduler_name: String,

    /// Watch only the Nodes matching this label selector (e.g. `nvidia.com/gpu.present=true`).
    #[arg(
        long,
        value_name = "SELECTOR",
        env = "GPU_WARDEN_EXTENDER_NODE_SELECTOR"
    )]
    pub node_selector: Option<String>,

    /// Namespace of the agents' Leases (their liveness and current figures; docs/annotations.md).
    /// Without it liveness comes from the Nodes' `vram-observed-at` alone.
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "GPU_WARDEN_EXTENDER_LEASE_NAMESPACE"
    )]
    pub lease_namespace: Option<String>,

    /// Largest request body accepted, bytes; larger ones get a 413.
    #[arg(
        long,
        default_value_t = 8 * 1024 * 1024,
        env = "GPU_WARDEN_EXTENDER_MAX_BODY_BYTES"
    )]
    pub max_body_bytes: usize,

    /// exporter-toolkit's web configuration file for the verbs' listener: `tls_server_config`
    /// (with `client_auth_type: RequireAndVerifyClientCert` and `client_ca_file` for
    /// kube-scheduler's extender `tlsConfig` client certificate); re-read when it or its
    /// certificates change. `basic_auth_users` are refused: kube-scheduler's extender client
    /// sends no credentials. Excludes --web-tls-cert/--web-tls-key.
    #[arg(
        long = "web.config.file",
        value_name = "FILE",
        env = "GPU_WARDEN_EXTENDER_WEB_CONFIG_FILE"
    )]
    pub web_config_file: Option<PathBuf>,

    #[command(flatten)]
    pub tls: TlsPairArgs,

    #[command(flatten)]
    pub logging: LogArgs,
}

/// The policy file, every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyFile {
    /// Annotation prefix.
    pub annotation_prefix: Option<String>,
    /// Margin, MiB.
    #[serde(rename = "marginMiB")]
    pub margin_mib: Option<u64>,
    /// Staleness limit (`120s`, `2m`).
    pub stale_after: Option<String>,
    /// Rule for untrusted figures.
    pub unknown_node: Option<UnknownNode>,
    /// Prioritize order.
    pub score: Option<ScoreMode>,
    /// Share of the memory promised but not allocated yet that is kept free, percent.
    pub promised_percent: Option<u8>,
    /// Reservation TTL.
    pub ledger_ttl: Option<String>,
    /// The GPU resource name.
    pub resource: Option<String>,
    /// The CUDA check's rule (docs/cuda.md).
    pub cuda_check: Option<crate::model::cuda::CudaPolicy>,
    /// Rule for pods without a need.
    pub unknown_need: Option<UnknownNeed>,
    /// Needs learned from Prometheus.
    pub learned: Option<LearnedFile>,
    /// Defaults by namespace / labels.
    #[serde(default)]
    pub defaults: Vec<DefaultNeed>,
}

/// `learned:` — where and how needs are learned per GitLab project.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LearnedFile {
    /// Prometheus's base URL (`http://host:9090`); empty or unset: learning is off.
    pub prometheus_url: Option<String>,
    /// The range of job peaks learned from (PromQL duration, default `7d`).
    pub window: Option<String>,
    /// Fewest job peaks in the window for a project to get a need (default 3).
    pub min_jobs: Option<u64>,
    /// How often the query runs (default `5m`).
    pub refresh: Option<String>,
    /// How long learned needs are used when Prometheus stops answering (default `1h`).
    pub max_age: Option<String>,
    /// The pod label naming the project (default GitLab Runner's
    /// `project.runner.gitlab.com/id`).
    pub project_label: Option<String>,
    /// PEM CA bundle for an `https://` URL (default: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// A file holding the bearer token sent with each query.
    pub bearer_token_file: Option<PathBuf>,
    /// HTTP Basic credentials sent with each query.
    pub basic_auth: Option<LearnedBasicAuth>,
}

/// `learned.basicAuth`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LearnedBasicAuth {
    /// The user.
    pub username: String,
    /// A file holding the password.
    pub password_file: PathBuf,
}

impl LearnedFile {
    /// The transport keys, checked: a CA file only for `https://`, one kind of credentials.
    fn transport(&self, url: &str) -> Result<super::learned::LearnedTransport, PolicyError> {
        use super::learned::{LearnedAuth, LearnedTransport};
        let invalid = |m: &str| Err(PolicyError::Invalid(m.to_string()));
        if self.ca_file.is_some() && !url.starts_with("https://") {
            return invalid("learned.caFile is only used with an https:// prometheusUrl");
        }
        let auth = match (&self.bearer_token_file, &self.basic_auth) {
            (Some(_), Some(_)) => {
                return invalid(
                    "learned.bearerTokenFile and learned.basicAuth exclude each other; set one",
                )
            }
            (Some(f), None) => Some(LearnedAuth::BearerTokenFile(f.clone())),
            (None, Some(b)) => {
                if b.username.is_empty() || b.password_file.as_os_str().is_empty() {
                    return invalid("learned.basicAuth needs username and passwordFile");
                }
                Some(LearnedAuth::Basic {
                    username: b.username.clone(),
                    password_file: b.password_file.clone(),
                })
            }
            (None, None) => None,
        };
        Ok(LearnedTransport {
            ca_file: self.ca_file.clone(),
            auth,
        })
    }
}

pub use super::learned::LearnedSource;

/// Fewest job peaks for a project to get a learned need (`learned.minJobs`'s default): what
/// docs/scheduling.md's simulation chose. With fewer than 20 the p95 is the largest peak
/// seen, rounded up to its histogram bucket; waiting for 20 left a project's jobs on
/// `unknownNeed` for an hour of a cold start.
pub const DEFAULT_MIN_JOBS: u64 = 3;

/// The largest MiB figure a policy may hold (`marginMiB`, `defaults[].mib`,
/// `unknownNeed.mib`): 1 PiB, far past any GPU, and well inside the integers Helm renders
/// as written (past int64 it writes `1e+20`, which no parser here takes). The chart's
/// values.schema.json has the same maximum.
pub const MAX_MIB: u64 = 1 << 30;

/// Most job peaks `learned.minJobs` may ask for (values.schema.json's maximum too).
pub const MAX_MIN_JOBS: u64 = 1_000_000;

/// The shortest `learned.refresh`: the query reads a week of job peaks, and a query a
/// millisecond would be a load test of the Prometheus it asks.
pub const MIN_LEARNED_REFRESH: Duration = Duration::from_secs(10);

/// A PromQL duration (`7d`, `1d12h`, `90m`): terms of a whole number and one of PromQL's units,
/// not all zero. The chart's schema has the same pattern.
fn promql_duration(s: &str) -> bool {
    let mut rest = s;
    let mut nonzero = false;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        nonzero |= rest[..digits].bytes().any(|b| b != b'0');
        rest = &rest[digits..];
        let unit = if rest.starts_with("ms") { 2 } else { 1 };
        if !rest.starts_with(['s', 'm', 'h', 'd', 'w', 'y']) {
            return false;
        }
        rest = &rest[unit..];
    }
    nonzero
}

/// A policy that cannot be used; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("--config {path}: cannot read: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid policy.
    #[error("--config {path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: PolicyError,
    },
}

/// What is wrong with a policy file; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Not YAML of the policy's shape (serde names the key).
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("{key}: {source}")]
    Duration {
        key: &'static str,
        source: IntervalError,
    },
    #[error("staleAfter must be more than 0")]
    ZeroStaleAfter,
    #[error("defaults[{0}].mib must be more than 0")]
    ZeroDefault(usize),
    /// A `learned` or `unknownNeed` value that cannot be used; the text names the key.
    #[error("{0}")]
    Invalid(String),
}

fn duration(
    key: &'static str,
    v: Option<&str>,
    default: Duration,
) -> Result<Duration, PolicyError> {
    match v {
        None => Ok(default),
        Some(s) => parse_interval(s).map_err(|source| PolicyError::Duration { key, source }),
    }
}

impl PolicyFile {
    /// Parses YAML text.
    pub fn parse(text: &str) -> Result<PolicyFile, PolicyError> {
        Ok(serde_yaml_ng::from_str(text)?)
    }

    /// The policy, defaults filled in and checked.
    pub fn policy(&self) -> Result<ExtenderPolicy, PolicyError> {
        let prefix = self
            .annotation_prefix
            .clone()
            .unwrap_or_else(|| crate::publish::annotations::DEFAULT_PREFIX.to_string());
        let d = JudgePolicy::default();
        let judge = JudgePolicy {
            margin_mib: self.margin_mib.unwrap_or(d.margin_mib),
            stale_after: duration("staleAfter", self.stale_after.as_deref(), d.stale_after)?,
            unknown_node: self.unknown_node.unwrap_or(d.unknown_node),
            score: self.score.unwrap_or(d.score),
            promised_percent: self.promised_percent.unwrap_or(d.promised_percent),
        };
        if judge.promised_percent > 100 {
            return Err(PolicyError::Invalid(format!(
                "promisedPercent must be 0..=100, got {}",
                judge.promised_percent
            )));
        }
        if judge.stale_after.is_zero() {
            return Err(PolicyError::ZeroStaleAfter);
        }
        let ledger_ttl = duration(
            "ledgerTtl",
            self.ledger_ttl.as_deref(),
            Duration::from_secs(180),
        )?;
        if judge.margin_mib > MAX_MIB {
            return Err(PolicyError::Invalid(format!(
                "marginMiB must be at most {MAX_MIB} (1 PiB), got {}",
                judge.margin_mib
            )));
        }
        if let Some(i) = self.defaults.iter().position(|d| d.mib == 0) {
            return Err(PolicyError::ZeroDefault(i));
        }
        for (i, d) in self.defaults.iter().enumerate() {
            if d.mib > MAX_MIB {
                return Err(PolicyError::Invalid(format!(
                    "defaults[{i}].mib must be at most {MAX_MIB} (1 PiB), got {}",
                    d.mib
                )));
            }
            if let Some(ns) = &d.namespace {
                if let Err(why) = crate::model::units::check_dns_label(ns) {
                    return Err(PolicyError::Invalid(format!(
                        "defaults[{i}].namespace {ns:?} is not a namespace name: {why} (omit the key for every namespace)"
                    )));
                }
            }
        }
        if let Some(r) = &self.resource {
            if let Err(why) = crate::guard::selector::check_key(r) {
                return Err(PolicyError::Invalid(format!(
                    "resource {r:?} is not a resource name like nvidia.com/gpu: {why}"
                )));
            }
        }
        let l = self.learned.clone().unwrap_or_default();
        // Every learned.* key is checked with or without a URL: a misspelt value is a
        // mistake whether learning is on yet or not (and the chart checks them all).
        let window = l.window.clone().unwrap_or_else(|| "7d".into());
        if !promql_duration(&window) {
            return Err(PolicyError::Invalid(format!(
                "learned.window {window:?}: a PromQL duration above zero like 7d, 12h or 1d12h"
            )));
        }
        let refresh = duration(
            "learned.refresh",
            l.refresh.as_deref(),
            Duration::from_secs(300),
        )?;
        let max_age = duration(
            "learned.maxAge",
            l.max_age.as_deref(),
            Duration::from_secs(3600),
        )?;
        if refresh < MIN_LEARNED_REFRESH {
            return Err(PolicyError::Invalid(format!(
                "learned.refresh must be at least {}, got {}",
                humantime::format_duration(MIN_LEARNED_REFRESH),
                humantime::format_duration(refresh)
            )));
        }
        let min_jobs = l.min_jobs.unwrap_or(DEFAULT_MIN_JOBS);
        if !(1..=MAX_MIN_JOBS).contains(&min_jobs) {
            return Err(PolicyError::Invalid(format!(
                "learned.minJobs must be from 1 to {MAX_MIN_JOBS}, got {min_jobs}"
            )));
        }
        if let Some(label) = &l.project_label {
            if let Err(why) = crate::guard::selector::check_key(label) {
                return Err(PolicyError::Invalid(format!(
                    "learned.projectLabel {label:?} is not a label name: {why}"
                )));
            }
        }
        let learned = match l.prometheus_url.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(url) => {
                if !url.starts_with("http://") && !url.starts_with("https://") {
                    return Err(PolicyError::Invalid(format!(
                        "learned.prometheusUrl {url:?}: an http:// or https:// URL"
                    )));
                }
                let transport = l.transport(url)?;
                Some(LearnedSource {
                    url: url.trim_end_matches('/').to_string(),
                    window,
                    min_jobs,
                    refresh,
                    max_age,
                    transport,
                })
            }
        };
        if let Some(UnknownNeed::Reserve { mib }) = self.unknown_need {
            if mib == 0 || mib > MAX_MIB {
                return Err(PolicyError::Invalid(format!(
                    "unknownNeed.mib must be from 1 to {MAX_MIB} (1 PiB), got {mib}"
                )));
            }
        }
        Ok(ExtenderPolicy {
            needs: NeedRules {
                annotation: crate::model::vram_request::key(&prefix),
                project_label: l
                    .project_label
                    .clone()
                    .unwrap_or_else(|| crate::publish::job_peaks::PROJECT_LABEL.to_string()),
                defaults: self.defaults.clone(),
                unknown: self.unknown_need.unwrap_or(UnknownNeed::WholeGpu),
            },
            learned,
            prefix,
            judge,
            ledger_ttl,
            resource: self
                .resource
                .clone()
                .unwrap_or_else(|| "nvidia.com/gpu".to_string()),
            cuda: self.cuda_check.unwrap_or_default(),
        })
    }
}

/// `gpu-warden check-config --extender-config`: the text through the parser and the checks
/// the extender starts with, then the one-prefix rule.
pub fn check_policy(text: &str, agents_prefix: &str) -> Result<(), CheckError> {
    let refused = |e: PolicyError| CheckError::Extender(e.to_string());
    let file = PolicyFile::parse(text).map_err(refused)?;
    file.policy().map_err(refused)?;
    check_prefix(
        "extender policy",
        file.annotation_prefix.as_deref(),
        agents_prefix,
    )
}

/// Loads `--config`, or the defaults without it.
pub fn load_policy(path: Option<&std::path::Path>) -> Result<ExtenderPolicy, ConfigError> {
    let Some(path) = path else {
        return PolicyFile::default()
            .policy()
            .map_err(|reason| ConfigError::Invalid {
                path: "(defaults)".into(),
                reason,
            });
    };
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    PolicyFile::parse(&text)
        .and_then(|f| f.policy())
        .map_err(|reason| ConfigError::Invalid {
            path: shown,
            reason,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_a_full_file() {
        let p = PolicyFile::default().policy().unwrap();
        assert_eq!(p.prefix, "gpu-warden.io");
        assert_eq!(p.needs.annotation, "gpu-warden.io/vram-request-mib");
        assert_eq!(p.judge, JudgePolicy::default());
        // What docs/scheduling.md's simulation chose: a job nothing is known of yet (no
        // declaration, its project not learned) gets a GPU to itself, whatever the model;
        // 8 GiB let the jobs of heavy projects die in the first hour.
        assert_eq!(
            p.needs.unknown,
            UnknownNeed::WholeGpu,
            "a pod that declares nothing is never passed blind by default"
        );
        assert_eq!(p.learned, None);
        assert_eq!(p.judge.promised_percent, 75);
        let f = PolicyFile::parse(
            "marginMiB: 1024\nstaleAfter: 90s\nunknownNode: fail\nscore: spread\nledgerTtl: 1m\n\
             unknownNeed: {rule: reserve, mib: 4096}\n\
             learned: {prometheusUrl: \"http://prom:9090/\", window: 3d, minJobs: 5}\n\
             defaults:\n  - {namespace: gitlab-runner, selector: \"a=b\", mib: 8192}\n",
        )
        .unwrap();
        let p = f.policy().unwrap();
        assert_eq!(p.judge.margin_mib, 1024);
        assert_eq!(p.judge.stale_after, Duration::from_secs(90));
        assert_eq!(p.judge.unknown_node, UnknownNode::Fail);
        assert_eq!(p.judge.score, ScoreMode::Spread);
        assert_eq!(p.ledger_ttl, Duration::from_secs(60));
        assert_eq!(p.needs.unknown, UnknownNeed::Reserve { mib: 4096 });
        assert_eq!(p.needs.defaults.len(), 1);
        let l = p.learned.unwrap();
        assert_eq!(
            (l.url.as_str(), l.window.as_str(), l.min_jobs, l.refresh),
            ("http://prom:9090", "3d", 5, Duration::from_secs(300))
        );
    }

    #[test]
    fn the_learned_source_over_https_with_credentials() {
        use crate::extender::learned::LearnedAuth;
        let p = PolicyFile::parse(
            "learned:\n  prometheusUrl: https://prom.example.com/\n  caFile: /ca.crt\n  \
             basicAuth: {username: extender, passwordFile: /pw}\n",
        )
        .and_then(|f| f.policy())
        .unwrap();
        let l = p.learned.unwrap();
        assert_eq!(l.url, "https://prom.example.com");
        assert_eq!(l.transport.ca_file, Some(PathBuf::from("/ca.crt")));
        assert_eq!(
            l.transport.auth,
            Some(LearnedAuth::Basic {
                username: "extender".into(),
                password_file: PathBuf::from("/pw")
            })
        );
        let p = PolicyFile::parse("learned: {prometheusUrl: \"http://p\", bearerTokenFile: /t}\n")
            .and_then(|f| f.policy())
            .unwrap();
        assert_eq!(
            p.learned.unwrap().transport.auth,
            Some(LearnedAuth::BearerTokenFile(PathBuf::from("/t")))
        );
    }

    #[test]
    fn the_usage_line_names_the_subcommand() {
        use clap::CommandFactory;
        let help = ExtenderCli::command().render_help().to_string();
        assert!(
            help.contains("Usage: gpu-warden extender [OPTIONS]"),
            "{help}"
        );
        // As main parses it: argv[0] is the binary's own name.
        let err = ExtenderCli::try_parse_from(["gpu-warden", "--help"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("Usage: gpu-warden extender [OPTIONS]"),
            "{err}"
        );
        let cli = ExtenderCli::try_parse_from(["gpu-warden"]).unwrap();
        assert!(
            cli.listen.ip().is_loopback(),
            "the verbs listen on loopback by default"
        );
    }

    #[test]
    fn the_certificate_pair_is_the_agents_under_the_extenders_variables() {
        use clap::CommandFactory;
        let env = |cmd: &clap::Command, id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        let (agent, extender) = (gpu_warden_config::Cli::command(), ExtenderCli::command());
        for (id, agents, extenders) in [
            (
                "web_tls_cert",
                "GPU_WARDEN_WEB_TLS_CERT",
                "GPU_WARDEN_EXTENDER_WEB_TLS_CERT",
            ),
            (
                "web_tls_key",
                "GPU_WARDEN_WEB_TLS_KEY",
                "GPU_WARDEN_EXTENDER_WEB_TLS_KEY",
            ),
        ] {
            assert_eq!(env(&agent, id).as_deref(), Some(agents));
            assert_eq!(env(&extender, id).as_deref(), Some(extenders));
        }
        let cli = ExtenderCli::try_parse_from(["gpu-warden", "--web-tls-key", "k.pem"]).unwrap();
        assert_eq!(
            cli.tls.pair().unwrap_err().to_string(),
            "--web-tls-cert and --web-tls-key must be given together"
        );
    }

    #[test]
    fn bad_files_name_the_key() {
        for (text, want) in [
            ("marginMib: 5\n", "unknown field"),
            ("promisedPercent: 101\n", "promisedPercent must be 0..=100"),
            ("promisedPercent: 300\n", "promisedPercent"),
            ("staleAfter: soon\n", "staleAfter"),
            ("unknownNode: maybe\n", "unknownNode"),
            ("defaults:\n  - {mib: 0}\n", "defaults[0].mib"),
            ("unknownNeed: {rule: reserve, mib: 0}\n", "unknownNeed.mib"),
            (
                "learned: {prometheusUrl: \"ftp://p\"}\n",
                "learned.prometheusUrl",
            ),
            (
                "learned: {prometheusUrl: \"http://p\", caFile: /ca.crt}\n",
                "learned.caFile is only used with an https://",
            ),
            (
                "learned: {prometheusUrl: \"https://p\", bearerTokenFile: /t, basicAuth: {username: u, passwordFile: /p}}\n",
                "exclude each other",
            ),
            (
                "learned: {prometheusUrl: \"https://p\", basicAuth: {username: u}}\n",
                "passwordFile",
            ),
            (
                "learned: {prometheusUrl: \"http://p\", window: \"7d)\"}\n",
                "learned.window",
            ),
            (
                "defaults:\n  - {selector: \"a in (b)\", mib: 1}\n",
                "selector",
            ),
            // Issue 39: what the chart refused and the extender took, or both took.
            ("defaults:\n  - {selector: \"\", mib: 1}\n", "selector"),
            (
                "defaults:\n  - {namespace: GitLab, mib: 1}\n",
                "defaults[0].namespace",
            ),
            ("defaults:\n  - {mib: 1073741825}\n", "defaults[0].mib"),
            ("marginMiB: 1073741825\n", "marginMiB"),
            ("resource: \"\"\n", "resource"),
            ("resource: \"nvidia com/gpu\"\n", "resource"),
            ("unknownNeed: {rule: pass, mib: 4096}\n", "unknownNeed.mib"),
            ("unknownNeed: {rule: wholeGpu, mib: 1}\n", "unknownNeed.mib"),
            ("unknownNeed: {rule: reserve}\n", "unknownNeed.mib"),
            ("unknownNeed: {rule: maybe}\n", "unknownNeed.rule"),
            ("staleAfter: 1.5s\n", "staleAfter"),
            (
                "learned: {prometheusUrl: \"http://p\", minJobs: 0}\n",
                "learned.minJobs",
            ),
            (
                "learned: {prometheusUrl: \"http://p\", refresh: 1ms}\n",
                "learned.refresh",
            ),
            (
                "learned: {prometheusUrl: \"http://p\", window: 0s}\n",
                "learned.window",
            ),
            (
                "learned: {prometheusUrl: \"http://p\", window: 7days}\n",
                "learned.window",
            ),
            (
                "learned: {prometheusUrl: \"http://p\", projectLabel: \"a b\"}\n",
                "learned.projectLabel",
            ),
        ] {
            let err = PolicyFile::parse(text)
                .and_then(|f| f.policy())
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
