//! The write discipline of docs/annotations.md: when the values are worth a PATCH.

use super::budget::WriteBudget;
use super::schema::{annotation_key, owned_keys, GpuFigures, PerKey, DEFAULT_PREFIX};
use super::values::{merge_patch, next_gpu, quantize, readings, AnnotationValues, Reading};
use crate::model::pressure::Pressure;
use crate::model::replicas::ReplicaView;
use crate::model::snapshot::Snapshot;
use crate::model::units::DnsNameError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// How early a poll may come and still carry a due heartbeat, at most: 1 % of the
/// heartbeat, capped at this (polls wobble by milliseconds around their schedule).
pub const HEARTBEAT_SLACK: Duration = Duration::from_millis(250);

/// The Node's default heartbeat and minimum interval: KEP-0009's 5-minute NodeStatus cadence
/// with a tenth to spare. The Lease carries liveness and the current figures (`act::lease`),
/// so the Node, watched by every Node watcher in the cluster, is written less often than the
/// kubelet writes it, at the p99 of 1-minute windows too (docs/annotations.md, "Write load").
pub const DEFAULT_NODE_CADENCE: Duration = Duration::from_secs(330);

/// The Node's heartbeat when it is the only channel (no Lease): 60 s, the cadence before
/// Leases, so readers' staleness rules (the extender's `staleAfter`, 120 s) hold.
pub const NODE_ONLY_HEARTBEAT: Duration = Duration::from_secs(60);

/// The Node's minimum interval when it is the only channel: every change within 5 s.
pub const NODE_ONLY_MIN_INTERVAL: Duration = Duration::from_secs(5);

/// How soon an over-promise may be corrected after the last write, by default: the
/// Lease's own pace for changes.
pub const DEFAULT_OVER_PROMISE_INTERVAL: Duration = Duration::from_secs(5);

/// Over-promise corrections that may come ahead of the Node's budget of one write per
/// minimum interval (the token bucket of [`WriteBudget`]).
pub const DEFAULT_OVER_PROMISE_BURST: u32 = 3;

/// A GPU's free memory may fall at least this many quanta below what the published figure
/// says before the figure counts as an over-promise: "a quantum or two" of noise is not
/// news, and the published figure is already rounded down by up to a quantum.
pub const OVER_PROMISE_QUANTA: u64 = 2;

/// …or this share of the GPU when that is more, by default none: every over-statement of
/// two quanta is worth a write while the budget lasts, and under churn the budget, not the
/// tolerance, sets the pace (docs/annotations.md, "Write load": a tenth of the GPU changed
/// the share of time a churning Node over-promised by a tenth of a GPU from 17.0 % to
/// 15.7 %, and left a 12 GiB job on a quiet H200 uncorrected for the whole interval).
pub const DEFAULT_OVER_PROMISE_TOLERANCE_PERCENT: u32 = 0;

/// How the annotations are named and how often they may be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationConfig {
    /// Key prefix, a DNS subdomain (`<prefix>/vram-free-mib`, …).
    pub prefix: String,
    /// Values move in steps of this many MiB.
    pub quantum_mib: u64,
    /// Re-publish at least this often, so consumers can judge staleness.
    pub heartbeat: Duration,
    /// Never patch more often than this, except for a pressure rise when
    /// `pressure_rise_at_once`.
    pub min_interval: Duration,
    /// A GPU's pressure rising is sent at once, whatever the minimum interval and the
    /// budget: the rule of the Lease, and of the Node when it is the only channel. Beside
    /// a Lease the Node has it off: a pressure rise is an over-promise there, corrected
    /// through the budget below.
    pub pressure_rise_at_once: bool,
    /// An over-promise (a GPU's free memory more than its tolerance below the published
    /// figure, a GPU's pressure above it, or a GPU gone) may be corrected this soon after the
    /// last write, ahead of the minimum interval, while the budget allows. Never later than
    /// the minimum interval.
    pub over_promise_interval: Duration,
    /// The tolerance, as a share of each GPU's memory (the floor is
    /// [`OVER_PROMISE_QUANTA`] quanta): see [`Self::over_promise_tolerance_mib`].
    pub over_promise_tolerance_percent: u32,
    /// Tokens of the write budget ([`WriteBudget`]: one comes back per minimum interval).
    /// 0: no early corrections; an over-promise waits for the minimum interval.
    pub over_promise_burst: u32,
    /// A change that only under-states what is free (memory freed, pressure eased) waits
    /// for the heartbeat (the Node's rule); off, it goes after the minimum interval like
    /// any change (the Lease's: the extender places pods on freed memory within seconds).
    pub under_promise_at_heartbeat: bool,
}

impl Default for AnnotationConfig {
    fn default() -> Self {
        AnnotationConfig {
            prefix: DEFAULT_PREFIX.to_string(),
            quantum_mib: 256,
            heartbeat: DEFAULT_NODE_CADENCE,
            min_interval: DEFAULT_NODE_CADENCE,
            pressure_rise_at_once: true,
            over_promise_interval: DEFAULT_OVER_PROMISE_INTERVAL,
            over_promise_tolerance_percent: DEFAULT_OVER_PROMISE_TOLERANCE_PERCENT,
            over_promise_burst: DEFAULT_OVER_PROMISE_BURST,
            under_promise_at_heartbeat: false,
        }
    }
}

/// An unusable [`AnnotationConfig`]; messages name the command-line flag at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationConfigError {
    /// The prefix is not a DNS subdomain, so the API server would refuse every key.
    #[error("--annotation-prefix {prefix:?}: {reason}; it must be a DNS subdomain (lowercase letters, digits, '-' and '.', each part 1–63 characters starting and ending with a letter or digit, at most 253 characters), e.g. gpu-warden.io")]
    Prefix {
        /// The prefix given.
        prefix: String,
        /// What is wrong with it.
        reason: DnsNameError,
    },
    /// A zero quantum would make every MiB a reason to patch.
    #[error("--annotation-quantum-mib must be at least 1")]
    Quantum,
    /// A zero heartbeat would patch on every poll.
    #[error("--annotation-heartbeat must be longer than zero")]
    Heartbeat,
    /// The heartbeat could never be honoured.
    #[error("--annotation-heartbeat ({heartbeat}) must not be shorter than --annotation-min-interval ({min_interval})")]
    HeartbeatBelowMinInterval {
        /// The heartbeat given, human-readable.
        heartbeat: String,
        /// The minimum interval given, human-readable.
        min_interval: String,
    },
}

impl AnnotationConfig {
    /// Checks the configuration; the agent refuses to start on an error.
    pub fn validate(&self) -> Result<(), AnnotationConfigError> {
        if let Err(reason) = crate::model::units::check_dns_subdomain(&self.prefix) {
            return Err(AnnotationConfigError::Prefix {
                prefix: self.prefix.clone(),
                reason,
            });
        }
        if self.quantum_mib == 0 {
            return Err(AnnotationConfigError::Quantum);
        }
        if self.heartbeat.is_zero() {
            return Err(AnnotationConfigError::Heartbeat);
        }
        if self.heartbeat < self.min_interval {
            return Err(AnnotationConfigError::HeartbeatBelowMinInterval {
                heartbeat: humantime::format_duration(self.heartbeat).to_string(),
                min_interval: humantime::format_duration(self.min_interval).to_string(),
            });
        }
        Ok(())
    }

    /// The full key `<prefix>/<name>`.
    pub fn key(&self, name: &str) -> String {
        annotation_key(&self.prefix, name)
    }

    /// The keys this agent owns, by name.
    pub fn keys(&self) -> PerKey<String> {
        owned_keys(&self.prefix)
    }

    /// How far below the published figure the free memory of a GPU of `total_mib` may fall
    /// before it is an over-promise: [`OVER_PROMISE_QUANTA`] quanta, or the tolerance's
    /// share of the GPU when that is more.
    pub fn over_promise_tolerance_mib(&self, total_mib: u64) -> u64 {
        tolerance_mib(
            self.quantum_mib,
            self.over_promise_tolerance_percent,
            total_mib,
        )
    }

    /// The longest a change that over-states what is free stays on the Node, not counting
    /// the poll that sees it nor the API server's answer: the over-promise interval while
    /// the budget has a token, else the minimum interval (a token comes back per minimum
    /// interval, so a churning node still corrects at that pace).
    pub fn over_promise_bound(&self) -> (Duration, Duration) {
        let fast = if self.over_promise_burst == 0 {
            self.min_interval
        } else {
            self.over_promise_interval.min(self.min_interval)
        };
        (fast, self.min_interval)
    }
}

/// Why the planner asked for a patch (for logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchReason {
    /// Nothing has been published yet (or nothing successfully).
    Initial,
    /// A GPU's pressure rose: sent at once, regardless of the minimum interval.
    PressureRaised,
    /// A GPU's pressure fell.
    PressureEased,
    /// A GPU appeared, disappeared, or lost or regained its memory reading.
    GpusChanged,
    /// The kubelet's replica figures (or the next GPU) changed, or the data came or went.
    ReplicasChanged,
    /// A GPU's free memory moved by at least a quantum.
    FreeMoved,
    /// The published figures over-state what is free (see
    /// [`AnnotationConfig::over_promise_interval`]): corrected ahead of the minimum interval.
    OverPromise,
    /// Nothing moved, but the heartbeat is due.
    Heartbeat,
}

impl PatchReason {
    /// A short label for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            PatchReason::Initial => "initial",
            PatchReason::PressureRaised => "pressure-raised",
            PatchReason::PressureEased => "pressure-eased",
            PatchReason::GpusChanged => "gpus-changed",
            PatchReason::ReplicasChanged => "replicas-changed",
            PatchReason::FreeMoved => "free-moved",
            PatchReason::OverPromise => "over-promise",
            PatchReason::Heartbeat => "heartbeat",
        }
    }
}

/// One planned patch.
#[derive(Debug, Clone, PartialEq)]
pub struct AnnotationPatch {
    /// The JSON merge-patch body: `{"metadata":{"annotations":{…our keys…}}}`.
    pub body: Value,
    /// The values it carries.
    pub values: AnnotationValues,
    /// Why now.
    pub reason: PatchReason,
}

/// What a patch carried, kept until the API server confirms it.
#[derive(Debug, Clone)]
struct Sent {
    gpus: Vec<GpuFigures>,
    next_gpu: Option<Option<String>>,
    snapshot_at: Duration,
    planned_at: Duration,
}

/// The write discipline of docs/annotations.md as a state machine over monotonic time.
///
/// Protocol: call [`plan`](Self::plan) with each new snapshot (and when
/// [`next_due`](Self::next_due) passes); when it returns a patch, send it and report
/// [`patch_succeeded`](Self::patch_succeeded) or [`patch_failed`](Self::patch_failed).
/// Only confirmed values count as published, so a failed patch is planned again (with the
/// then-current values) instead of being lost; backing off between attempts is the
/// caller's job.
#[derive(Debug, Clone)]
pub struct AnnotationPlanner {
    cfg: AnnotationConfig,
    /// What the API server holds, as far as we know.
    applied: Option<Sent>,
    in_flight: Option<Sent>,
    last_attempt: Option<Duration>,
    last_success: Option<Duration>,
    gated_until: Option<Duration>,
    budget: WriteBudget,
}

impl AnnotationPlanner {
    /// A planner that has published nothing yet.
    pub fn new(cfg: AnnotationConfig) -> Self {
        let budget = WriteBudget::new(cfg.min_interval, cfg.over_promise_burst);
        AnnotationPlanner {
            budget,
            cfg,
            applied: None,
            in_flight: None,
            last_attempt: None,
            last_success: None,
            gated_until: None,
        }
    }

    /// The configuration it plans with.
    pub fn config(&self) -> &AnnotationConfig {
        &self.cfg
    }

    /// Monotonic time of the last confirmed patch.
    pub fn last_success(&self) -> Option<Duration> {
        self.last_success
    }

    /// When a change held back by the minimum interval may go: the caller should call
    /// [`plan`](Self::plan) again then, even if no new snapshot arrived.
    pub fn next_due(&self) -> Option<Duration> {
        self.gated_until
    }

    /// Decides whether `snap` (with the guard's `pressure`) is worth a patch at monotonic
    /// time `now`. Returns `None` while a planned patch awaits its outcome.
    pub fn plan(
        &mut self,
        snap: &Snapshot,
        pressure: &BTreeMap<u32, Pressure>,
        now: Duration,
    ) -> Option<AnnotationPatch> {
        self.plan_with_replicas(snap, pressure, None, now)
    }

    /// As [`plan`](Self::plan), with the kubelet's pod-resources figures when there are any.
    pub fn plan_with_replicas(
        &mut self,
        snap: &Snapshot,
        pressure: &BTreeMap<u32, Pressure>,
        replicas: Option<&ReplicaView>,
        now: Duration,
    ) -> Option<AnnotationPatch> {
        if self.in_flight.is_some() {
            return None;
        }
        let current = readings(snap, pressure, replicas);
        let next = next_gpu(snap, replicas);
        let reason = self.reason(&current, &next, snap.at, now);
        let Some(reason) = reason else {
            self.gated_until = None;
            return None;
        };
        let mut reason = reason;
        let urgent = reason == PatchReason::PressureRaised && self.cfg.pressure_rise_at_once;
        if let (false, Some(last)) = (urgent, self.last_attempt) {
            let free_at = last.saturating_add(self.cfg.min_interval);
            if now < free_at {
                match self.over_promise_at(&current, last, now) {
                    Some(t) if t <= now => reason = PatchReason::OverPromise,
                    early => {
                        self.gated_until = Some(early.map_or(free_at, |t| t.min(free_at)));
                        return None;
                    }
                }
            }
        }
        self.gated_until = None;
        self.budget.spend(now);
        let values = quantize(&current, self.cfg.quantum_mib, snap.wall, next);
        let body = merge_patch(values.to_annotations(&self.cfg.prefix));
        self.in_flight = Some(Sent {
            gpus: values.gpus.clone(),
            next_gpu: values.next_gpu.clone(),
            snapshot_at: snap.at,
            planned_at: now,
        });
        self.last_attempt = Some(now);
        Some(AnnotationPatch {
            body,
            values,
            reason,
        })
    }

    /// When an over-promise in `current` may be corrected ahead of the minimum interval
    /// (the last write at `last`); `None` when there is none or no early correction.
    fn over_promise_at(
        &self,
        current: &[Reading],
        last: Duration,
        now: Duration,
    ) -> Option<Duration> {
        let applied = self.applied.as_ref()?;
        let percent = self.cfg.over_promise_tolerance_percent;
        if !over_promises(current, &applied.gpus, self.cfg.quantum_mib, percent) {
            return None;
        }
        let token = self.budget.token_at(now)?;
        Some(token.max(last.saturating_add(self.cfg.over_promise_interval)))
    }

    fn reason(
        &self,
        current: &[Reading],
        next_gpu: &Option<Option<String>>,
        snapshot_at: Duration,
        now: Duration,
    ) -> Option<PatchReason> {
        let Some(applied) = &self.applied else {
            return Some(PatchReason::Initial);
        };
        let same_gpus = current.len() == applied.gpus.len()
            && current
                .iter()
                .zip(&applied.gpus)
                .all(|(c, a)| c.index == a.index && c.uuid == a.uuid && c.total_mib == a.total_mib);
        if !same_gpus {
            return Some(PatchReason::GpusChanged);
        }
        let pairs = || current.iter().zip(&applied.gpus);
        if pairs().any(|(c, a)| c.pressure > a.pressure) {
            return Some(PatchReason::PressureRaised);
        }
        // An eased pressure or freed memory only under-states what is free: news, but news
        // that costs at most a placement, so on the Node it waits for the heartbeat.
        let news = !self.cfg.under_promise_at_heartbeat;
        if news && pairs().any(|(c, a)| c.pressure != a.pressure) {
            return Some(PatchReason::PressureEased);
        }
        if pairs().any(|(c, a)| c.replicas != a.replicas()) || *next_gpu != applied.next_gpu {
            return Some(PatchReason::ReplicasChanged);
        }
        let q = self.cfg.quantum_mib.max(1);
        let rise = q.saturating_add(q / 2);
        if pairs().any(|(c, a)| {
            c.free_mib < a.free_mib || (news && c.free_mib >= a.free_mib.saturating_add(rise))
        }) {
            return Some(PatchReason::FreeMoved);
        }
        // A heartbeat can only go out with a poll, and polls come a few ms early or late
        // against the last one: without slack, a 60 s heartbeat on 1 s polls went out at
        // 61 s about every other time.
        let slack = HEARTBEAT_SLACK.min(self.cfg.heartbeat / 100);
        let heartbeat_due = self
            .last_success
            .is_none_or(|t| now.saturating_add(slack).saturating_sub(t) >= self.cfg.heartbeat);
        if heartbeat_due && snapshot_at > applied.snapshot_at {
            return Some(PatchReason::Heartbeat);
        }
        None
    }

    /// Whether the figures the API server holds over-state what `snap` shows, by the rule
    /// with a tolerance of `percent` % of each GPU (its floor two quanta): a GPU's free
    /// memory more than that below its figure, its pressure above it, or a GPU gone. For
    /// measuring a write discipline (`crates/write-load`) under any definition.
    pub fn over_promises_by(
        &self,
        snap: &Snapshot,
        pressure: &BTreeMap<u32, Pressure>,
        percent: u32,
    ) -> bool {
        self.applied.as_ref().is_some_and(|a| {
            over_promises(
                &readings(snap, pressure, None),
                &a.gpus,
                self.cfg.quantum_mib,
                percent,
            )
        })
    }

    /// The patch last planned was applied; its values are now what consumers see.
    pub fn patch_succeeded(&mut self, _now: Duration) {
        if let Some(sent) = self.in_flight.take() {
            // The heartbeat counts from when the values were taken, not from when the
            // API server answered, so a slow server does not stretch the cadence.
            self.last_success = Some(sent.planned_at);
            self.applied = Some(sent);
        }
    }

    /// The patch last planned was not applied; whatever it carried is still owed.
    pub fn patch_failed(&mut self, _now: Duration) {
        self.in_flight = None;
    }
}

/// The over-promise rule: some published GPU claims more than `tolerance_mib` more free
/// than `current` shows, a lower pressure, or is gone (its free memory is no longer there).
/// A GPU that appeared is news but no over-promise: the published sums under-state.
fn over_promises(
    current: &[Reading],
    published: &[GpuFigures],
    quantum: u64,
    percent: u32,
) -> bool {
    published.iter().any(|p| {
        current.iter().find(|c| c.uuid == p.uuid).is_none_or(|c| {
            let tolerance = tolerance_mib(quantum, percent, p.total_mib);
            p.free_mib > c.free_mib.saturating_add(tolerance) || c.pressure > p.pressure
        })
    })
}

fn tolerance_mib(quantum: u64, percent: u32, total_mib: u64) -> u64 {
    let share = total_mib.saturating_mul(u64::from(percent)) / 100;
    quantum.saturating_mul(OVER_PROMISE_QUANTA).max(share)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;

    #[test]
    fn config_validation() {
        let d = AnnotationConfig::default();
        assert_eq!(d.validate(), Ok(()));
        assert_eq!(
            (d.heartbeat, d.min_interval),
            (DEFAULT_NODE_CADENCE, DEFAULT_NODE_CADENCE)
        );
        assert_eq!(cfg().validate(), Ok(()));
        assert_eq!(cfg().prefix, "gpu-warden.io");
        assert_eq!(cfg().quantum_mib, 256);
        let good = ["gpu-warden.io", "a", "example.com", "x1.y-2.z3", "gpu"];
        for p in good {
            let c = AnnotationConfig {
                prefix: p.into(),
                ..cfg()
            };
            assert_eq!(c.validate(), Ok(()), "{p}");
        }
        let long = format!("{}.io", "a".repeat(251));
        let bad = [
            ("", "empty"),
            ("GPU-warden.io", "character"),
            ("gpu_warden.io", "character"),
            ("gpu-warden.io/", "character"),
            ("-gpu.io", "starts or ends"),
            ("gpu-.io", "starts or ends"),
            ("gpu..io", "empty part"),
            (".gpu.io", "empty part"),
            (long.as_str(), "253"),
        ];
        for (p, needle) in bad {
            let c = AnnotationConfig {
                prefix: p.into(),
                ..cfg()
            };
            let e = c.validate().unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("--annotation-prefix") && msg.contains(needle),
                "{p}: {msg}"
            );
        }
        let e = AnnotationConfig {
            quantum_mib: 0,
            ..cfg()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e, AnnotationConfigError::Quantum);
        let e = AnnotationConfig {
            heartbeat: Duration::ZERO,
            min_interval: Duration::ZERO,
            ..cfg()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e, AnnotationConfigError::Heartbeat);
        let e = AnnotationConfig {
            heartbeat: secs(4.0),
            ..cfg()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--annotation-heartbeat (4s) must not be shorter than --annotation-min-interval (5s)"
        );
        // Equal is fine; a zero minimum interval is allowed (no rate limit).
        for (hb, mi) in [(5.0, 5.0), (1.0, 0.0)] {
            let c = AnnotationConfig {
                heartbeat: secs(hb),
                min_interval: secs(mi),
                ..cfg()
            };
            assert_eq!(c.validate(), Ok(()));
        }
        assert_eq!(
            cfg().keys().into_array(),
            [
                "gpu-warden.io/vram-free-mib",
                "gpu-warden.io/vram-max-free-mib",
                "gpu-warden.io/vram",
                "gpu-warden.io/vram-observed-at",
                "gpu-warden.io/cuda-driver-version"
            ]
        );
    }

    #[test]
    fn replica_changes_are_a_reason_to_patch_within_the_min_interval() {
        let mut p = AnnotationPlanner::new(cfg());
        let gpus = || vec![gpu(0, 10_340, 2048), gpu(1, 10_340, 0)];
        let r = |s: &Snapshot, p: &mut AnnotationPlanner, v: Option<&ReplicaView>| {
            let out = p.plan_with_replicas(s, &none(), v, s.at)?;
            p.patch_succeeded(s.at);
            Some(out.reason)
        };
        let v1 = replica_view(1);
        assert_eq!(
            r(&snap_at(0.0, gpus()), &mut p, None),
            Some(PatchReason::Initial)
        );
        // The data arrives: held back by the minimum interval, then sent.
        assert_eq!(r(&snap_at(1.0, gpus()), &mut p, Some(&v1)), None);
        assert_eq!(
            r(&snap_at(5.0, gpus()), &mut p, Some(&v1)),
            Some(PatchReason::ReplicasChanged)
        );
        assert_eq!(
            r(&snap_at(11.0, gpus()), &mut p, Some(&v1)),
            None,
            "unchanged"
        );
        let v2 = replica_view(2);
        assert_eq!(
            r(&snap_at(12.0, gpus()), &mut p, Some(&v2)),
            Some(PatchReason::ReplicasChanged)
        );
        // Withdrawn: the keys go.
        assert_eq!(
            r(&snap_at(20.0, gpus()), &mut p, None),
            Some(PatchReason::ReplicasChanged)
        );
    }

    /// (total, used) MiB per GPU → (used, free) quantized per GPU, sum, max. Free is
    /// total − 100 reserved − used.

    #[test]
    fn first_plan_patches_and_an_unchanged_snapshot_does_not() {
        let mut p = AnnotationPlanner::new(cfg());
        let g = || vec![gpu(0, 10_340, 2048)];
        assert_eq!(
            step(&mut p, &snap_at(0.0, g()), &none()),
            Some(PatchReason::Initial)
        );
        // Only observedAt moves: no reason to patch, for the whole heartbeat.
        for t in 1..60 {
            assert_eq!(
                step(&mut p, &snap_at(f64::from(t), g()), &none()),
                None,
                "t={t}"
            );
        }
        assert_eq!(
            step(&mut p, &snap_at(60.0, g()), &none()),
            Some(PatchReason::Heartbeat)
        );
        assert_eq!(p.last_success(), Some(secs(60.0)));
    }

    /// Free MiB on one GPU over time (1 s apart, min interval 0 so only hysteresis
    /// matters) → whether each poll patches. Published free starts at 8192 (from 8240).
    #[test]
    fn hysteresis_table() {
        type Row = (&'static str, &'static [u64], &'static [bool]);
        let rows: &[Row] = &[
            (
                "small moves absorbed",
                &[8200, 8300, 8447, 8192],
                &[false, false, false, false],
            ),
            ("dropping below the claim patches at once", &[8191], &[true]),
            (
                "each quantum crossed downward patches",
                &[8000, 7950, 7936, 7935],
                &[true, false, false, true],
            ),
            (
                "rising needs 1.5 quanta",
                &[8447, 8575, 8576],
                &[false, false, true],
            ),
            // After the rise to 8576 (published 8448) noise of ±100 never flaps.
            (
                "noise around a boundary never flaps",
                &[8576, 8448, 8540, 8460, 8575, 8450],
                &[true, false, false, false, false, false],
            ),
        ];
        for (name, frees, want) in rows {
            let mut p = AnnotationPlanner::new(AnnotationConfig {
                min_interval: Duration::ZERO,
                ..cfg()
            });
            let total = 10_340;
            let at = |t: f64, free: u64| snap_at(t, vec![gpu(0, total, total - 100 - free)]);
            assert!(step(&mut p, &at(0.0, 8240), &none()).is_some());
            let got: Vec<bool> = frees
                .iter()
                .enumerate()
                .map(|(i, &f)| step(&mut p, &at(1.0 + i as f64, f), &none()).is_some())
                .collect();
            assert_eq!(&got, want, "{name}");
        }
    }

    /// 60 s heartbeats on 1 s polls whose stamps wobble by a few ms go out every 60 polls,
    /// never 61.
    #[test]
    fn the_heartbeat_keeps_its_period_on_jittery_polls() {
        let mut p = AnnotationPlanner::new(cfg());
        let mut sent = Vec::new();
        for k in 0..400u32 {
            let jitter = [0.004, -0.003, 0.001, -0.004, 0.002, -0.001, 0.0][k as usize % 7];
            let s = snap_at(f64::from(k) + jitter, vec![gpu(0, 10_340, 0)]);
            if step(&mut p, &s, &none()).is_some() {
                sent.push(k);
            }
        }
        let gaps: Vec<u32> = sent.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            !gaps.is_empty() && gaps.iter().all(|g| *g == 60),
            "{sent:?}"
        );
    }

    #[test]
    fn heartbeat_needs_a_new_snapshot() {
        let mut p = AnnotationPlanner::new(cfg());
        let s = snap_at(0.0, vec![gpu(0, 10_340, 0)]);
        assert!(step(&mut p, &s, &none()).is_some());
        // The sampler stopped: the same snapshot, long after the heartbeat, is not re-sent;
        // observedAt ages so consumers can see it.
        assert!(p.plan(&s, &none(), secs(600.0)).is_none());
        assert_eq!(p.next_due(), None);
    }

    #[test]
    fn min_interval_holds_a_change_back_and_says_when() {
        let mut p = AnnotationPlanner::new(cfg());
        let at = |t: f64, used: u64| snap_at(t, vec![gpu(0, 10_340, used)]);
        assert!(step(&mut p, &at(0.0, 0), &none()).is_some());
        assert_eq!(step(&mut p, &at(1.0, 1000), &none()), None);
        assert_eq!(p.next_due(), Some(secs(5.0)));
        assert_eq!(step(&mut p, &at(4.9, 1000), &none()), None);
        assert_eq!(
            step(&mut p, &at(5.0, 1000), &none()),
            Some(PatchReason::FreeMoved)
        );
        assert_eq!(p.next_due(), None);
        // A change that reverts before the interval ends costs nothing.
        assert_eq!(step(&mut p, &at(6.0, 3000), &none()), None);
        assert_eq!(p.next_due(), Some(secs(10.0)));
        assert_eq!(step(&mut p, &at(7.0, 1000), &none()), None);
        assert_eq!(p.next_due(), None);
    }

    #[test]
    fn pressure_rise_goes_at_once_and_a_fall_waits_for_the_interval() {
        let mut p = AnnotationPlanner::new(cfg());
        let s = |t: f64| snap_at(t, vec![gpu(0, 10_340, 0), gpu(1, 10_340, 0)]);
        let pr = |a: Pressure, b: Pressure| BTreeMap::from([(0, a), (1, b)]);
        use Pressure::{Hard, None as Calm, Soft};
        assert!(step(&mut p, &s(0.0), &pr(Calm, Calm)).is_some());
        let rows = [
            (0.1, Soft, Calm, Some(PatchReason::PressureRaised)),
            (0.2, Hard, Calm, Some(PatchReason::PressureRaised)),
            (0.3, Hard, Soft, Some(PatchReason::PressureRaised)),
            // A fall inside the minimum interval waits…
            (1.0, Soft, Soft, None),
            // …unless something rises at the same time.
            (1.5, Calm, Hard, Some(PatchReason::PressureRaised)),
            (2.0, Calm, Soft, None),
            (6.4, Calm, Soft, None),
            (6.5, Calm, Soft, Some(PatchReason::PressureEased)),
            (6.6, Calm, Calm, None),
            (11.5, Calm, Calm, Some(PatchReason::PressureEased)),
        ];
        for (t, a, b, want) in rows {
            assert_eq!(step(&mut p, &s(t), &pr(a, b)), want, "t={t}");
        }
        // A GPU missing from the map is `none` (the guard is off or has no verdict).
        assert_eq!(step(&mut p, &s(12.0), &none()), None);
    }

    #[test]
    fn without_urgent_rises_a_pressure_rise_waits_for_the_interval_too() {
        // The Node beside a Lease: the Lease carries the rise at once, the Node keeps its pace.
        let mut p = AnnotationPlanner::new(AnnotationConfig {
            pressure_rise_at_once: false,
            ..cfg()
        });
        let s = |t: f64| snap_at(t, vec![gpu(0, 10_340, 0)]);
        let pr = |a: Pressure| BTreeMap::from([(0, a)]);
        assert!(step(&mut p, &s(0.0), &pr(Pressure::None)).is_some());
        assert_eq!(step(&mut p, &s(1.0), &pr(Pressure::Hard)), None);
        assert_eq!(
            p.next_due(),
            Some(secs(5.0)),
            "held back until the interval ends"
        );
        assert_eq!(
            step(&mut p, &s(5.0), &pr(Pressure::Hard)),
            Some(PatchReason::PressureRaised)
        );
    }

    #[test]
    fn a_gpu_dropping_out_is_a_change() {
        let mut p = AnnotationPlanner::new(cfg());
        let both = |t| snap_at(t, vec![gpu(0, 10_340, 0), gpu(1, 10_340, 0)]);
        assert!(step(&mut p, &both(0.0), &none()).is_some());
        let mut lost = gpu(1, 10_340, 0);
        lost.memory = None;
        lost.health = GpuHealth::Lost("fell off the bus".into());
        let one = snap_at(1.0, vec![gpu(0, 10_340, 0), lost]);
        assert_eq!(step(&mut p, &one, &none()), None, "min interval");
        let one = snap_at(5.0, one.gpus.clone());
        assert_eq!(step(&mut p, &one, &none()), Some(PatchReason::GpusChanged));
    }

    #[test]
    fn a_failed_patch_is_planned_again_without_losing_the_change() {
        let mut p = AnnotationPlanner::new(cfg());
        let at = |t: f64, used: u64| snap_at(t, vec![gpu(0, 10_340, used)]);
        // The very first patch fails: still owed.
        let first = p.plan(&at(0.0, 0), &none(), secs(0.0)).unwrap();
        assert_eq!(first.reason, PatchReason::Initial);
        // Nothing more is planned while it is in flight.
        assert!(p.plan(&at(0.5, 0), &none(), secs(0.5)).is_none());
        p.patch_failed(secs(0.6));
        assert_eq!(p.last_success(), None);
        // The retry respects the minimum interval since the failed attempt…
        assert!(p.plan(&at(1.0, 0), &none(), secs(1.0)).is_none());
        assert_eq!(p.next_due(), Some(secs(5.0)));
        let retry = p.plan(&at(5.0, 0), &none(), secs(5.0)).unwrap();
        assert_eq!(retry.reason, PatchReason::Initial);
        p.patch_succeeded(secs(5.1));
        // A change whose patch fails is carried with the then-current values.
        let c = p.plan(&at(10.0, 2000), &none(), secs(10.0)).unwrap();
        assert_eq!(c.values.gpus[0].free_mib, 8192);
        p.patch_failed(secs(10.1));
        let c = p.plan(&at(15.0, 2600), &none(), secs(15.0)).unwrap();
        assert_eq!(c.reason, PatchReason::FreeMoved);
        assert_eq!(c.values.gpus[0].free_mib, 7640 / Q * Q);
        p.patch_succeeded(secs(15.1));
        // A pressure rise whose patch fails is retried at once (the caller's backoff
        // is the only brake), and a failed heartbeat stays due.
        let soft = BTreeMap::from([(0, Pressure::Soft)]);
        assert!(p.plan(&at(16.0, 2600), &soft, secs(16.0)).is_some());
        p.patch_failed(secs(16.0));
        let r = p.plan(&at(16.5, 2600), &soft, secs(16.5)).unwrap();
        assert_eq!(r.reason, PatchReason::PressureRaised);
        p.patch_succeeded(secs(16.5));
        let hb = p.plan(&at(76.5, 2600), &soft, secs(76.5)).unwrap();
        assert_eq!(hb.reason, PatchReason::Heartbeat);
        p.patch_failed(secs(76.6));
        assert_eq!(
            p.plan(&at(81.5, 2600), &soft, secs(81.5)).map(|x| x.reason),
            Some(PatchReason::Heartbeat)
        );
    }

    /// The Node beside a Lease (issue 42): 330 s cadence, over-promises corrected 5 s after
    /// the last write while the budget of 3 lasts, freed memory at the heartbeat.
    fn beside_lease() -> AnnotationConfig {
        AnnotationConfig {
            heartbeat: secs(330.0),
            min_interval: secs(330.0),
            pressure_rise_at_once: false,
            under_promise_at_heartbeat: true,
            ..AnnotationConfig::default()
        }
    }

    #[test]
    fn an_over_promise_is_corrected_at_once_while_the_budget_lasts_then_one_per_interval() {
        let mut p = AnnotationPlanner::new(beside_lease());
        let at = |t: f64, used: u64| snap_at(t, vec![gpu(0, 23_028, used)]);
        assert_eq!(
            step(&mut p, &at(0.0, 0), &none()),
            Some(PatchReason::Initial)
        );
        // A job takes 1 GiB: over-promise (more than two quanta), corrected at once, as the
        // last write is 5 s old.
        assert_eq!(
            step(&mut p, &at(10.0, 1024), &none()),
            Some(PatchReason::OverPromise)
        );
        // Another GiB a second later: held until 5 s after that write…
        assert_eq!(step(&mut p, &at(11.0, 2048), &none()), None);
        assert_eq!(p.next_due(), Some(secs(15.0)));
        assert_eq!(
            step(&mut p, &at(15.0, 2048), &none()),
            Some(PatchReason::OverPromise)
        );
        // …and the bucket (3, the initial patch took one) is empty: the next over-promise
        // waits for a token (one per 330 s), before the interval since the last write ends.
        assert_eq!(step(&mut p, &at(20.0, 3072), &none()), None);
        // (330 s of credit came back over the 330 s since the start, less the 15 s spent).
        assert_eq!(p.next_due(), Some(secs(330.0)));
        assert_eq!(step(&mut p, &at(329.0, 3072), &none()), None);
        assert_eq!(
            step(&mut p, &at(330.0, 3072), &none()),
            Some(PatchReason::OverPromise)
        );
        // A drop within the tolerance (two quanta) is no over-promise: it waits for the
        // interval, as the cadence's change.
        assert_eq!(step(&mut p, &at(400.0, 3072 + 400), &none()), None);
        assert_eq!(p.next_due(), Some(secs(660.0)));
        assert_eq!(
            step(&mut p, &at(660.0, 3072 + 400), &none()),
            Some(PatchReason::FreeMoved)
        );
    }

    #[test]
    fn beside_a_lease_a_pressure_rise_or_a_lost_gpu_is_an_over_promise() {
        let mut p = AnnotationPlanner::new(beside_lease());
        let two = |t: f64| snap_at(t, vec![gpu(0, 23_028, 0), gpu(1, 23_028, 0)]);
        assert!(step(&mut p, &two(0.0), &none()).is_some());
        let soft = BTreeMap::from([(0, Pressure::Soft)]);
        assert_eq!(
            step(&mut p, &two(1.0), &soft),
            None,
            "5 s after the last write"
        );
        assert_eq!(p.next_due(), Some(secs(5.0)));
        assert_eq!(
            step(&mut p, &two(5.0), &soft),
            Some(PatchReason::OverPromise)
        );
        let mut lost = gpu(1, 23_028, 0);
        lost.memory = None;
        lost.health = GpuHealth::Lost("fell off the bus".into());
        let one = snap_at(10.0, vec![gpu(0, 23_028, 0), lost]);
        assert_eq!(step(&mut p, &one, &soft), Some(PatchReason::OverPromise));
    }

    #[test]
    fn on_the_node_freed_memory_and_eased_pressure_wait_for_the_heartbeat() {
        let mut p = AnnotationPlanner::new(AnnotationConfig {
            under_promise_at_heartbeat: true,
            ..cfg()
        });
        let at = |t: f64, used: u64| snap_at(t, vec![gpu(0, 23_028, used)]);
        let soft = BTreeMap::from([(0, Pressure::Soft)]);
        assert!(step(&mut p, &at(0.0, 8192), &soft).is_some());
        // 8 GiB freed and the pressure eased: under-statements only, for the whole
        // heartbeat (60 s) though the minimum interval (5 s) passed long ago.
        for t in 1..60 {
            assert_eq!(step(&mut p, &at(f64::from(t), 0), &none()), None, "t={t}");
            assert_eq!(p.next_due(), None);
        }
        let hb = p.plan(&at(60.0, 0), &none(), secs(60.0)).unwrap();
        assert_eq!(hb.reason, PatchReason::Heartbeat);
        assert_eq!(hb.values.gpus[0].pressure, Pressure::None);
        assert_eq!(hb.values.gpus[0].free_mib, (23_028 - 100) / Q * Q);
        p.patch_succeeded(secs(60.0));
        // A drop below the claim still goes after the minimum interval.
        assert_eq!(
            step(&mut p, &at(65.0, 300), &none()),
            Some(PatchReason::FreeMoved)
        );
    }

    #[test]
    fn the_tolerance_is_two_quanta_or_the_share_of_the_gpu() {
        let c = AnnotationConfig::default();
        assert_eq!(c.over_promise_tolerance_mib(143_771), 512);
        let tenth = AnnotationConfig {
            over_promise_tolerance_percent: 10,
            ..c
        };
        assert_eq!(tenth.over_promise_tolerance_mib(143_771), 14_377);
        assert_eq!(tenth.over_promise_tolerance_mib(4_000), 512);
        assert_eq!(
            beside_lease().over_promise_bound(),
            (secs(5.0), secs(330.0))
        );
        let no_burst = AnnotationConfig {
            over_promise_burst: 0,
            ..beside_lease()
        };
        assert_eq!(no_burst.over_promise_bound(), (secs(330.0), secs(330.0)));
    }

    /// The "Done when" figure: 10 minutes of 1 s polls of a steady node patch at most 11
    /// times, each patch touching only our four keys.
    #[test]
    fn ten_minute_steady_run_patches_at_most_eleven_times() {
        let mut p = AnnotationPlanner::new(cfg());
        let pr = BTreeMap::from([(0, Pressure::None), (1, Pressure::None)]);
        // Every key but the CUDA version's, which these snapshots do not know.
        let keys: std::collections::BTreeSet<String> = p
            .config()
            .keys()
            .into_array()
            .into_iter()
            .filter(|k| *k != p.config().keys().cuda_driver_version)
            .collect();
        let mut patches = Vec::new();
        for t in 0..=600 {
            let s = snap_at(
                f64::from(t),
                vec![gpu(0, 81_559, 20_000), gpu(1, 81_559, 3_000)],
            );
            if let Some(out) = p.plan(&s, &pr, s.at) {
                let touched: std::collections::BTreeSet<String> = out.body["metadata"]
                    ["annotations"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect();
                assert_eq!(touched, keys);
                assert_eq!(out.body.as_object().unwrap().len(), 1);
                patches.push(t);
                p.patch_succeeded(s.at);
            }
        }
        assert!(patches.len() <= 11, "{patches:?}");
        assert_eq!(patches, (0..=600).step_by(60).collect::<Vec<_>>());
    }

    /// A process growing 100 MiB/s crosses a quantum every ~2.6 s; with a 5 s minimum
    /// interval patches come every 5 s, each with the then-current figures.
    #[test]
    fn growing_process_patches_as_it_crosses_quanta_but_not_faster_than_min_interval() {
        let mut p = AnnotationPlanner::new(cfg());
        let mut times = Vec::new();
        let mut last_free = u64::MAX;
        for tenth in 0..=600 {
            let t = f64::from(tenth) / 10.0;
            let used = 1000 + (100.0 * t) as u64;
            let s = snap_at(t, vec![gpu(0, 81_559, used)]);
            if let Some(out) = p.plan(&s, &none(), s.at) {
                let free = out.values.gpus[0].free_mib;
                assert!(free < last_free, "t={t}");
                assert!(free <= 81_559 - 100 - used, "never over-promises");
                last_free = free;
                times.push(s.at);
                p.patch_succeeded(s.at);
            }
        }
        assert!(
            times.windows(2).all(|w| w[1] - w[0] >= secs(5.0)),
            "{times:?}"
        );
        assert_eq!(times.len(), 13, "{times:?}");
    }
}
