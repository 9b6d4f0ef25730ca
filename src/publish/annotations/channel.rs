//! Which object carries the agent's current free-VRAM figures, and the Node's cadence that
//! follows from it (docs/annotations.md, "Write discipline").
//!
//! With a Lease the figures are current there (a change within 5 s, a pressure rise at
//! once) and the Node, which every Node watcher receives whole, is written on the kubelet's
//! own cadence. Without one the Node is the only channel, so it gets the cadence readers'
//! staleness rules expect: the defaults switch by themselves rather than leaving figures
//! five minutes old behind a start-up warning.

use super::planner::{
    AnnotationConfig, DEFAULT_NODE_CADENCE, NODE_ONLY_HEARTBEAT, NODE_ONLY_MIN_INTERVAL,
};
use serde::Serialize;
use std::time::Duration;

/// The object a reader should take the current figures from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FiguresChannel {
    /// The agent's Lease (the extender reads it); the Node follows slowly.
    Lease,
    /// The Node's annotations alone (no Lease: `--lease off` or no `POD_NAMESPACE`).
    Node,
}

impl FiguresChannel {
    /// Both, in the order the metric lists them.
    pub const ALL: [FiguresChannel; 2] = [FiguresChannel::Lease, FiguresChannel::Node];

    /// The Lease when the agent keeps one, else the Node.
    pub fn of(lease_runs: bool) -> Self {
        if lease_runs {
            FiguresChannel::Lease
        } else {
            FiguresChannel::Node
        }
    }

    /// The Node's default heartbeat and minimum interval on this channel.
    pub fn node_cadence(self) -> (Duration, Duration) {
        match self {
            FiguresChannel::Lease => (DEFAULT_NODE_CADENCE, DEFAULT_NODE_CADENCE),
            FiguresChannel::Node => (NODE_ONLY_HEARTBEAT, NODE_ONLY_MIN_INTERVAL),
        }
    }

    /// The label value of `gpu_warden_vram_figures_channel` and the `/state` field.
    pub fn as_str(self) -> &'static str {
        match self {
            FiguresChannel::Lease => "lease",
            FiguresChannel::Node => "node",
        }
    }
}

/// `/state`'s `figures`: where the current figures are, and how the Node follows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FiguresState {
    /// The object that carries the current figures.
    pub channel: FiguresChannel,
    /// The Node is re-written at least this often (seconds).
    pub node_heartbeat_seconds: u64,
    /// The Node's budget: one write per this many seconds on average; a change that
    /// under-states what is free waits this long.
    pub node_min_interval_seconds: u64,
    /// An over-promise on the Node is corrected within this many seconds (plus a poll)
    /// while the budget lasts…
    pub node_over_promise_seconds: u64,
    /// …and within this many under sustained churn (the budget's refill).
    pub node_over_promise_churn_seconds: u64,
}

impl FiguresState {
    /// The state of an agent publishing on `channel` with the Node's `cfg`.
    pub fn new(channel: FiguresChannel, cfg: &AnnotationConfig) -> Self {
        let (fast, churn) = cfg.over_promise_bound();
        FiguresState {
            channel,
            node_heartbeat_seconds: cfg.heartbeat.as_secs(),
            node_min_interval_seconds: cfg.min_interval.as_secs(),
            node_over_promise_seconds: fast.as_secs(),
            node_over_promise_churn_seconds: churn.as_secs(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_lease_the_node_gets_the_node_only_cadence() {
        assert_eq!(FiguresChannel::of(true), FiguresChannel::Lease);
        assert_eq!(FiguresChannel::of(false), FiguresChannel::Node);
        let s = Duration::from_secs;
        assert_eq!(FiguresChannel::Lease.node_cadence(), (s(330), s(330)));
        assert_eq!(FiguresChannel::Node.node_cadence(), (s(60), s(5)));
        assert_eq!(
            serde_json::to_value(FiguresChannel::Node).unwrap(),
            serde_json::json!("node")
        );
        assert_eq!(FiguresChannel::Lease.as_str(), "lease");
        let beside = AnnotationConfig {
            pressure_rise_at_once: false,
            ..AnnotationConfig::default()
        };
        assert_eq!(
            serde_json::to_value(FiguresState::new(FiguresChannel::Lease, &beside)).unwrap(),
            serde_json::json!({"channel": "lease", "nodeHeartbeatSeconds": 330,
                "nodeMinIntervalSeconds": 330, "nodeOverPromiseSeconds": 5,
                "nodeOverPromiseChurnSeconds": 330})
        );
        let alone = AnnotationConfig {
            heartbeat: s(60),
            min_interval: s(5),
            over_promise_burst: 0,
            ..AnnotationConfig::default()
        };
        let st = FiguresState::new(FiguresChannel::Node, &alone);
        assert_eq!(
            (
                st.node_over_promise_seconds,
                st.node_over_promise_churn_seconds
            ),
            (5, 5)
        );
    }
}
