//! The Lease flags (`--lease-*`): where the agent keeps its liveness Lease and how often it
//! renews it (docs/annotations.md, "Liveness").

use super::flag_values::{parse_interval, Switch};
use std::time::Duration;

/// The agent's Lease.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseArgs {
    /// Keep a Lease (coordination.k8s.io/v1) with this agent's liveness and figures; the
    /// extender reads it. Needs the Lease RBAC in the agent's namespace.
    #[arg(
        long = "lease",
        value_enum,
        default_value = "on",
        env = "GPU_WARDEN_LEASE"
    )]
    pub lease: Switch,

    /// Namespace of the Lease: the agent's own (the Downward API's `metadata.namespace`).
    /// Without it there is no Lease, and the extender falls back to the Node's figures.
    #[arg(long, value_name = "NAMESPACE", env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// `spec.holderIdentity` of the Lease: the agent's pod name (default: the node's name).
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pub lease_holder: Option<String>,

    /// Renew the Lease at least this often (the kubelet renews its own every 10 s).
    #[arg(long, default_value = "15s", value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_LEASE_RENEW_INTERVAL")]
    pub lease_renew_interval: Duration,

    /// `spec.leaseDurationSeconds`: how long a renewal vouches for the agent.
    #[arg(long, default_value = "60s", value_parser = parse_interval, value_name = "DURATION", env = "GPU_WARDEN_LEASE_DURATION")]
    pub lease_duration: Duration,
}

/// Unusable Lease flags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseArgsError {
    /// A renewal faster than a second would cost the API server more than it tells.
    #[error("--lease-renew-interval ({0}) must be at least 1s")]
    RenewTooShort(String),
    /// A Lease that expires before its renewal would always look dead.
    #[error("--lease-duration ({duration}) must be longer than --lease-renew-interval ({renew}), and whole seconds")]
    Duration {
        /// The duration given.
        duration: String,
        /// The renewal interval given.
        renew: String,
    },
    /// The namespace is not a DNS label.
    #[error("--lease-namespace / POD_NAMESPACE {0:?} is not a namespace name (a DNS label: lowercase letters, digits and '-', at most 63 characters)")]
    Namespace(String),
}

impl LeaseArgs {
    /// Whether the agent keeps a Lease: on, and its namespace known.
    pub fn will_run(&self) -> bool {
        self.lease == Switch::On && self.lease_namespace.is_some()
    }

    /// Checks the flags; the agent refuses to start on an error.
    pub fn validate(&self) -> Result<(), LeaseArgsError> {
        let fmt = |d: Duration| humantime::format_duration(d).to_string();
        if self.lease_renew_interval < Duration::from_secs(1) {
            return Err(LeaseArgsError::RenewTooShort(
                fmt(self.lease_renew_interval),
            ));
        }
        if self.lease_duration <= self.lease_renew_interval
            || self.lease_duration.subsec_nanos() != 0
        {
            return Err(LeaseArgsError::Duration {
                duration: fmt(self.lease_duration),
                renew: fmt(self.lease_renew_interval),
            });
        }
        if let Some(ns) = &self.lease_namespace {
            let label = !ns.is_empty()
                && ns.len() <= 63
                && ns
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !ns.starts_with('-')
                && !ns.ends_with('-');
            if !label {
                return Err(LeaseArgsError::Namespace(ns.clone()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(renew: u64, duration: u64, ns: Option<&str>) -> LeaseArgs {
        LeaseArgs {
            lease: Switch::On,
            lease_namespace: ns.map(str::to_string),
            lease_holder: None,
            lease_renew_interval: Duration::from_secs(renew),
            lease_duration: Duration::from_secs(duration),
        }
    }

    #[test]
    fn lease_flags_are_checked() {
        assert_eq!(args(15, 60, Some("gpu-warden")).validate(), Ok(()));
        assert_eq!(args(15, 60, None).validate(), Ok(()));
        assert!(matches!(
            args(0, 60, None).validate(),
            Err(LeaseArgsError::RenewTooShort(_))
        ));
        assert!(matches!(
            args(15, 15, None).validate(),
            Err(LeaseArgsError::Duration { .. })
        ));
        for bad in ["", "Gpu", "-a", "a_b", &"x".repeat(64)] {
            assert!(
                matches!(
                    args(15, 60, Some(bad)).validate(),
                    Err(LeaseArgsError::Namespace(_))
                ),
                "{bad:?}"
            );
        }
        let msg = args(15, 10, None).validate().unwrap_err().to_string();
        assert!(
            msg.contains("--lease-duration (10s)") && msg.contains("--lease-renew-interval (15s)"),
            "{msg}"
        );
    }
}
