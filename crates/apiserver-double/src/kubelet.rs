//! The node's kubelet once an eviction is accepted, as a timeline of steps (pure: no clock,
//! no I/O). [`crate::kubelet_run`] carries the steps out, in real time or when a test's
//! harness steps its simulated clock.
//!
//! What a real node does, and where upstream does it (kubernetes/kubernetes):
//! - The API server marks the pod (`deletionTimestamp`, `deletionGracePeriodSeconds`); the
//!   grace is the eviction's `deleteOptions.gracePeriodSeconds`, else the pod's
//!   `spec.terminationGracePeriodSeconds`; an unscheduled or finished pod gets 0, a negative
//!   value becomes 1 (`podStrategy.CheckGracefulDelete`, pkg/registry/core/pod/strategy.go).
//!   With a grace of 0 the generic store deletes the object in the same request
//!   (`Store.updateForGracefulDeletionAndFinalizers`: `lastGraceful == 0` → delete now,
//!   staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go): DELETED reaches the
//!   watch at once, while the containers still run.
//! - The kubelet learns of it from its pod watch (a latency: [`KubeletOptions::watch_latency`]).
//!   Its pod worker takes `deletionGracePeriodSeconds` as the grace, raising anything below 1
//!   to 1 (`calculateEffectiveGracePeriod`, pkg/kubelet/pod_workers.go), and `killContainer`
//!   raises it to `minimumGracePeriodInSeconds = 2` before `StopContainer`
//!   (pkg/kubelet/kuberuntime/kuberuntime_container.go: "always give containers a minimal
//!   shutdown window to avoid unnecessary SIGKILLs").
//! - The runtime's `StopContainer(grace)` sends SIGTERM to the container's PID 1 only, and
//!   SIGKILL to what is left when the grace ends (containerd/runc: `kill(init, SIGTERM)`,
//!   then `SIGKILL` to the container's processes).
//! - In a GitLab Runner job pod PID 1 of the build container is a shell that neither handles
//!   nor forwards SIGTERM (gitlab-runner issues 28162, 37381). The kernel drops a signal sent
//!   from outside to a PID namespace's init unless the init installed a handler for it
//!   (pid_namespaces(7)), so the shell and everything under it run on until the SIGKILL:
//!   [`Pid1Mode::Shell`]. A PID 1 that dies on SIGTERM ([`Pid1Mode::Exits`]) takes the rest of
//!   the container with it: when a PID namespace's init exits the kernel SIGKILLs every other
//!   process in the namespace (pid_namespaces(7); `zap_pid_ns_processes` in kernel/pid_namespace.c).
//! - Once the containers are gone the kubelet's status manager deletes the pod object (a
//!   final delete with grace 0): DELETED on the watch.

use std::time::Duration;

/// The kubelet floors every grace period at this (`minimumGracePeriodInSeconds`).
pub const MIN_GRACE: Duration = Duration::from_secs(2);

/// The default time from an accepted eviction to the kubelet acting on it.
pub const DEFAULT_WATCH_LATENCY: Duration = Duration::from_millis(50);

/// How the double plays the kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletModel {
    /// A real node's kubelet: watch latency, SIGTERM to PID 1, SIGKILL after `max(grace, 2 s)`,
    /// then the pod object is deleted. The default.
    Faithful,
    /// The comparison the double used to be: every process of the pod is killed and the pod
    /// deleted when `grace × scale` has passed (at once with the scale 0). No real node does
    /// this.
    Instant,
}

impl KubeletModel {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeletModel::Faithful => "faithful",
            KubeletModel::Instant => "instant",
        }
    }
}

/// A `--kubelet` or `--pid1` value the double does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownMode {
    /// Not a [`KubeletModel`].
    #[error("unknown kubelet model {0:?}: expected faithful or instant")]
    Kubelet(String),
    /// Not a [`Pid1Mode`].
    #[error("unknown PID 1 mode {0:?}: expected shell or exits")]
    Pid1(String),
}

impl std::str::FromStr for KubeletModel {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, UnknownMode> {
        match s {
            "faithful" => Ok(KubeletModel::Faithful),
            "instant" => Ok(KubeletModel::Instant),
            other => Err(UnknownMode::Kubelet(other.to_string())),
        }
    }
}

/// What a container's PID 1 does with SIGTERM, where the double models the processes itself
/// (a test's simulated node; a real node's processes decide for themselves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid1Mode {
    /// A shell that neither handles nor forwards SIGTERM, as in GitLab Runner job pods: the
    /// signal is dropped and every process runs on until the SIGKILL. The default.
    Shell,
    /// A PID 1 that dies on SIGTERM; the kernel then kills the container's other processes.
    Exits,
}

impl std::str::FromStr for Pid1Mode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, UnknownMode> {
        match s {
            "shell" => Ok(Pid1Mode::Shell),
            "exits" => Ok(Pid1Mode::Exits),
            other => Err(UnknownMode::Pid1(other.to_string())),
        }
    }
}

/// The kubelet's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KubeletOptions {
    /// Faithful (default) or the instant comparison.
    pub model: KubeletModel,
    /// From the accepted eviction to the kubelet acting (default 50 ms).
    pub watch_latency: Duration,
    /// What PID 1 does with SIGTERM, where the double models the processes (default shell).
    pub pid1: Pid1Mode,
    /// [`KubeletModel::Instant`] only: the grace period is multiplied by this (0: at once).
    pub instant_grace_scale: f64,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            model: KubeletModel::Faithful,
            watch_latency: DEFAULT_WATCH_LATENCY,
            pid1: Pid1Mode::Shell,
            instant_grace_scale: 0.0,
        }
    }
}

impl KubeletOptions {
    /// The instant comparison, killing and deleting `grace × scale` after the eviction.
    pub fn instant(scale: f64) -> Self {
        KubeletOptions {
            model: KubeletModel::Instant,
            instant_grace_scale: scale,
            ..KubeletOptions::default()
        }
    }
}

/// Why a pod's processes ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// PID 1 died of the SIGTERM and the kernel killed the rest of its PID namespace.
    Pid1Exited,
    /// The SIGKILL at the end of the grace period.
    Sigkill,
}

/// One thing the kubelet does to an evicted pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// SIGTERM to each container's PID 1.
    Sigterm,
    /// SIGKILL to every process of the pod (`max(grace, 2 s)` after the kubelet saw it).
    Sigkill,
    /// Every process of the pod is gone from this instant on (modelled processes only).
    ProcessesEnd(EndCause),
    /// The pod object is deleted (DELETED on the watch).
    Delete,
}

impl StepKind {
    /// The name used in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Sigterm => "sigterm",
            StepKind::Sigkill => "sigkill",
            StepKind::ProcessesEnd(EndCause::Pid1Exited) => "exited_on_sigterm",
            StepKind::ProcessesEnd(EndCause::Sigkill) => "killed",
            StepKind::Delete => "deleted",
        }
    }
}

/// One step at an instant of the kubelet's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// When, on the clock the eviction was stamped with.
    pub at: Duration,
    /// What.
    pub kind: StepKind,
}

/// The grace period the API server gives an evicted pod, in seconds: the eviction's own,
/// else the pod's `terminationGracePeriodSeconds` (the API defaults it to 30 on creation);
/// 0 for a pod on no node or in a terminal phase; a negative value becomes 1
/// (`podStrategy.CheckGracefulDelete`).
pub fn api_grace_seconds(requested: Option<i64>, pod: &serde_json::Value) -> i64 {
    let spec = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(serde_json::Value::as_i64);
    let mut period = requested.or(spec).unwrap_or(30);
    let scheduled = pod
        .pointer("/spec/nodeName")
        .and_then(serde_json::Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !scheduled {
        period = 0;
    }
    let phase = pod
        .pointer("/status/phase")
        .and_then(serde_json::Value::as_str);
    if matches!(phase, Some("Failed" | "Succeeded")) {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    period
}

/// The grace the kubelet stops a container with: `max(grace, 2 s)`.
pub fn kill_grace(grace_seconds: i64) -> Duration {
    Duration::from_secs(u64::try_from(grace_seconds).unwrap_or(0)).max(MIN_GRACE)
}

/// The kubelet's steps for a pod whose eviction was accepted at `accepted_at` with the API's
/// grace `grace_seconds`, in order. `api_deleted` says the API server already deleted the
/// object (grace 0): then no Delete step follows.
pub fn plan(
    opts: &KubeletOptions,
    accepted_at: Duration,
    grace_seconds: i64,
    api_deleted: bool,
) -> Vec<Step> {
    let mut steps = Vec::with_capacity(4);
    let mut push = |at: Duration, kind: StepKind| steps.push(Step { at, kind });
    match opts.model {
        KubeletModel::Instant => {
            let secs = u64::try_from(grace_seconds).unwrap_or(0) as f64;
            let scale = if opts.instant_grace_scale.is_finite() {
                opts.instant_grace_scale.max(0.0)
            } else {
                0.0
            };
            let at = accepted_at + Duration::from_secs_f64(secs * scale);
            push(at, StepKind::Sigkill);
            push(at, StepKind::ProcessesEnd(EndCause::Sigkill));
            if !api_deleted {
                push(at, StepKind::Delete);
            }
        }
        KubeletModel::Faithful => {
            let seen = accepted_at + opts.watch_latency;
            push(seen, StepKind::Sigterm);
            let end = match opts.pid1 {
                Pid1Mode::Exits => {
                    push(seen, StepKind::ProcessesEnd(EndCause::Pid1Exited));
                    seen
                }
                Pid1Mode::Shell => {
                    let kill = seen + kill_grace(grace_seconds);
                    push(kill, StepKind::Sigkill);
                    push(kill, StepKind::ProcessesEnd(EndCause::Sigkill));
                    kill
                }
            };
            if !api_deleted {
                push(end, StepKind::Delete);
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn kinds(steps: &[Step]) -> Vec<(u64, &'static str)> {
        steps
            .iter()
            .map(|s| (s.at.as_millis() as u64, s.kind.as_str()))
            .collect()
    }

    #[test]
    fn a_shell_pid1_runs_on_until_the_sigkill_at_max_grace_2s() {
        let o = KubeletOptions::default();
        // grace 0: the API already deleted the object; the kubelet still waits 2 s.
        assert_eq!(
            kinds(&plan(&o, MS(1000), 0, true)),
            vec![(1050, "sigterm"), (3050, "sigkill"), (3050, "killed")]
        );
        // grace 1 is floored at 2 as well; grace 5 is kept.
        assert_eq!(
            kinds(&plan(&o, MS(0), 1, false)),
            vec![
                (50, "sigterm"),
                (2050, "sigkill"),
                (2050, "killed"),
                (2050, "deleted")
            ]
        );
        assert_eq!(
            kinds(&plan(&o, MS(0), 5, false)),
            vec![
                (50, "sigterm"),
                (5050, "sigkill"),
                (5050, "killed"),
                (5050, "deleted")
            ]
        );
    }

    #[test]
    fn a_pid1_that_exits_on_sigterm_ends_the_container_when_the_kubelet_acts() {
        let o = KubeletOptions {
            pid1: Pid1Mode::Exits,
            watch_latency: MS(20),
            ..KubeletOptions::default()
        };
        assert_eq!(
            kinds(&plan(&o, MS(100), 5, false)),
            vec![
                (120, "sigterm"),
                (120, "exited_on_sigterm"),
                (120, "deleted")
            ]
        );
    }

    #[test]
    fn the_instant_comparison_kills_at_grace_times_scale() {
        assert_eq!(
            kinds(&plan(&KubeletOptions::instant(0.0), MS(7), 5, false)),
            vec![(7, "sigkill"), (7, "killed"), (7, "deleted")]
        );
        assert_eq!(
            kinds(&plan(&KubeletOptions::instant(0.1), MS(0), 5, false)),
            vec![(500, "sigkill"), (500, "killed"), (500, "deleted")]
        );
    }

    #[test]
    fn the_api_grace_follows_check_graceful_delete() {
        let on_node = json!({"spec": {"nodeName": "n1"}});
        assert_eq!(api_grace_seconds(Some(5), &on_node), 5);
        assert_eq!(api_grace_seconds(Some(0), &on_node), 0);
        assert_eq!(api_grace_seconds(Some(-3), &on_node), 1);
        assert_eq!(api_grace_seconds(None, &on_node), 30);
        let spec = json!({"spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 12}});
        assert_eq!(api_grace_seconds(None, &spec), 12);
        assert_eq!(api_grace_seconds(Some(5), &json!({"spec": {}})), 0);
        let done = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}});
        assert_eq!(api_grace_seconds(Some(5), &done), 0);
        assert_eq!(kill_grace(0), MIN_GRACE);
        assert_eq!(kill_grace(7), Duration::from_secs(7));
    }

    #[test]
    fn names_parse() {
        assert_eq!("faithful".parse(), Ok(KubeletModel::Faithful));
        assert_eq!("instant".parse(), Ok(KubeletModel::Instant));
        assert!("fast".parse::<KubeletModel>().is_err());
        assert_eq!("exits".parse(), Ok(Pid1Mode::Exits));
        assert!("bash".parse::<Pid1Mode>().is_err());
    }
}
