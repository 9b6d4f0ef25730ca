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
//! score: pack               # pack (best fit) | spread
//! ledgerTtl: 180s           # how long a bound pod's reservation lives at most
//! resource: nvidia.com/gpu
//! unknownNeed: {rule: pass} # or {rule: reserve, mib: 4096}
//! defaults:                 # first match wins; a pod's own annotation beats them all
//!   - {namespace: gitlab-runner, selector: "project.runner.gitlab.com/id=42", mib: 12288}
//!   - {namespace: gitlab-runner, mib: 4096}
//! ```

use super::core::ExtenderPolicy;
use super::judge::{JudgePolicy, ScoreMode, UnknownNode};
use super::need::{DefaultNeed, NeedRules, UnknownNeed};
use crate::config::{parse_interval, IntervalError, LogArgs};
use clap::Parser;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// gpu-warden extender: kube-scheduler's HTTP extender (filter, prioritize) placing GPU pods
/// by the free VRAM gpu-warden's agents publish on their Nodes.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpu-warden extender",
    version,
    about = "kube-scheduler HTTP extender: places GPU pods by the free VRAM gpu-warden publishes on Nodes",
    long_about = None
)]
pub struct ExtenderCli {
    /// Address to serve /filter, /prioritize, /metrics, /healthz and /readyz on.
    #[arg(
        long,
        default_value = "0.0.0.0:8888",
        env = "GPU_WARDEN_EXTENDER_LISTEN"
    )]
    pub listen: SocketAddr,

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

    /// Serve HTTPS with this PEM certificate chain (leaf first); needs --web-tls-key.
    #[arg(long, value_name = "FILE", env = "GPU_WARDEN_EXTENDER_WEB_TLS_CERT")]
    pub web_tls_cert: Option<PathBuf>,

    /// PEM private key for --web-tls-cert.
    #[arg(long, value_name = "FILE", env = "GPU_WARDEN_EXTENDER_WEB_TLS_KEY")]
    pub web_tls_key: Option<PathBuf>,

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
    /// Reservation TTL.
    pub ledger_ttl: Option<String>,
    /// The GPU resource name.
    pub resource: Option<String>,
    /// Rule for pods without a need.
    pub unknown_need: Option<UnknownNeed>,
    /// Defaults by namespace / labels.
    #[serde(default)]
    pub defaults: Vec<DefaultNeed>,
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
        };
        if judge.stale_after.is_zero() {
            return Err(PolicyError::ZeroStaleAfter);
        }
        let ledger_ttl = duration(
            "ledgerTtl",
            self.ledger_ttl.as_deref(),
            Duration::from_secs(180),
        )?;
        if let Some(i) = self.defaults.iter().position(|d| d.mib == 0) {
            return Err(PolicyError::ZeroDefault(i));
        }
        Ok(ExtenderPolicy {
            needs: NeedRules {
                annotation: crate::model::vram_request::key(&prefix),
                defaults: self.defaults.clone(),
                unknown: self.unknown_need.unwrap_or(UnknownNeed::Pass),
            },
            prefix,
            judge,
            ledger_ttl,
            resource: self
                .resource
                .clone()
                .unwrap_or_else(|| "nvidia.com/gpu".to_string()),
        })
    }
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
        assert_eq!(p.needs.unknown, UnknownNeed::Pass);
        let f = PolicyFile::parse(
            "marginMiB: 1024\nstaleAfter: 90s\nunknownNode: fail\nscore: spread\nledgerTtl: 1m\n\
             unknownNeed: {rule: reserve, mib: 4096}\n\
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
    }

    #[test]
    fn bad_files_name_the_key() {
        for (text, want) in [
            ("marginMib: 5\n", "unknown field"),
            ("staleAfter: soon\n", "staleAfter"),
            ("unknownNode: maybe\n", "unknownNode"),
            ("defaults:\n  - {mib: 0}\n", "defaults[0].mib"),
            (
                "defaults:\n  - {selector: \"a in (b)\", mib: 1}\n",
                "selector",
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
