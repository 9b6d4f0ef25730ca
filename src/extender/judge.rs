//! Feasibility and score of one node for one pod: pure functions of the node's annotations,
//! the ledger's pending reservations, the pod's need, the policy and the time.
//!
//! Room on a GPU = free (annotated) − committed-but-unused (declared requests of pods
//! allocated there but not yet used, `declaredMiB − usedMiB`, plus the ledger's pending
//! reservations) − margin. On a node with the kubelet's replica figures the pod is judged on
//! the GPU NVIDIA's device plugin hands out next (its rule in `src/model/device_plugin.rs`,
//! with pending reservations counted as allocated); without them the pod may get any GPU, so
//! it is judged on the one with the least room.

use super::ledger::Reservation;
use super::nodes::{NodeState, NodeVram};
pub use super::why::{gib, Gib, Untrusted, Which, Why};
use super::wire::{HostPriority, MAX_EXTENDER_PRIORITY};
use crate::model::device_plugin::{self, Replicas};
use crate::model::pressure::Pressure;
use crate::publish::annotations::GpuFigures;
use serde::Deserialize;
use std::time::{Duration, SystemTime};

/// What to do with a node whose figures cannot be trusted (stale, missing or unreadable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UnknownNode {
    /// Fail open: let the pod through unchecked (the guard still protects the GPU).
    Pass,
    /// Fail closed: refuse the node.
    Fail,
}

/// How prioritize orders feasible nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ScoreMode {
    /// Best fit: least room left after the pod scores highest (keeps big GPUs free).
    Pack,
    /// Most room left after the pod scores highest.
    Spread,
}

/// The judging policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgePolicy {
    /// MiB kept free on a GPU beyond the pod's need.
    pub margin_mib: u64,
    /// Figures older than this are stale (default 120 s: 8 × the agents' Lease renewal,
    /// which carries their figures; src/extender/liveness.rs).
    pub stale_after: Duration,
    /// The rule for stale, missing or unreadable figures.
    pub unknown_node: UnknownNode,
    /// Prioritize's order.
    pub score: ScoreMode,
    /// How much of the memory promised on a GPU but not allocated yet is kept free, percent
    /// (`promisedPercent`, 0..=100; default [`DEFAULT_PROMISED_PERCENT`]). Pods still to be
    /// shown by their node (the ledger's pending ones) are always counted in full.
    pub promised_percent: u8,
}

/// `promisedPercent`'s default: what docs/scheduling.md's simulation chose. A need is a
/// p95 rounded up to its histogram bucket, about twice what a typical job of the project
/// holds; the pods on one GPU rarely reach theirs together, and when they do the guard
/// stops and evicts before the GPU runs out. Counting all of it (100) left replicas idle
/// while jobs waited and killed no fewer jobs at `replicas: 8` (table in the docs).
pub const DEFAULT_PROMISED_PERCENT: u8 = 75;

impl Default for JudgePolicy {
    fn default() -> Self {
        JudgePolicy {
            margin_mib: 512,
            stale_after: Duration::from_secs(120),
            unknown_node: UnknownNode::Pass,
            score: ScoreMode::Spread,
            promised_percent: DEFAULT_PROMISED_PERCENT,
        }
    }
}

/// Why a node passed or failed: the label of `gpu_warden_extender_verdicts_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// A GPU has room.
    Fits,
    /// The pod's need is unknown and the rule is pass.
    NoNeed,
    /// No GPU (the one judged) has room.
    NoRoom,
    /// Every GPU replica of the node is allocated or reserved.
    NoReplica,
    /// The judged GPU is under memory pressure.
    Pressure,
    /// The node reports no GPU with a memory reading.
    NoGpu,
    /// Figures too old.
    Stale,
    /// No gpu-warden annotations.
    Missing,
    /// Annotations present but unreadable.
    Malformed,
    /// The pod's declaration cannot be read.
    BadDeclaration,
    /// The node's driver supports an older CUDA than the pod's known need (docs/cuda.md).
    CudaTooOld,
}

impl Reason {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Fits => "fits",
            Reason::NoNeed => "no_need",
            Reason::NoRoom => "no_room",
            Reason::NoReplica => "no_replica",
            Reason::Pressure => "pressure",
            Reason::NoGpu => "no_gpu",
            Reason::Stale => "stale",
            Reason::Missing => "missing",
            Reason::Malformed => "malformed",
            Reason::BadDeclaration => "bad_declaration",
            Reason::CudaTooOld => "cuda_too_old",
        }
    }
}

/// The GPU a verdict was judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPick {
    /// NVML index.
    pub index: u32,
    /// MiB left after the pod (negative when it does not fit).
    pub room_after_mib: i64,
    /// The GPU's framebuffer, MiB.
    pub total_mib: u64,
    /// Whether this is the GPU the device plugin hands out next (else the fullest).
    pub known_next: bool,
    /// The worst pressure among the GPUs the pod may get: prioritize never prefers a node
    /// where it is not `None`.
    pub pressure: Pressure,
}

/// One node's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the pod may go there.
    pub pass: bool,
    /// Why, as a metric label.
    pub reason: Reason,
    /// Why, in figures; [`Verdict::message`] writes it for a person.
    pub why: Why,
    /// The GPU judged, when one was.
    pub gpu: Option<GpuPick>,
}

impl Verdict {
    /// Why, for a person (the FailedNodes text, or the log line of a pass unchecked).
    pub fn message(&self) -> String {
        self.why.to_string()
    }
}

fn unknown(policy: &JudgePolicy, reason: Reason, what: Untrusted) -> Verdict {
    let passed = policy.unknown_node == UnknownNode::Pass;
    Verdict {
        pass: passed,
        reason,
        why: Why::Untrusted { what, passed },
        gpu: None,
    }
}

/// Pending reservations that count on `gpu`: those expected there, and those whose GPU is
/// not known (they may land anywhere, so each GPU counts them).
fn pending_on<'a>(
    pending: &'a [Reservation],
    gpu: &'a GpuFigures,
) -> impl Iterator<Item = &'a Reservation> + 'a {
    pending
        .iter()
        .filter(move |r| r.gpu.as_deref().is_none_or(|u| u == gpu.uuid))
}

/// MiB committed on `gpu` but not used yet: `promised_percent` of what the pods there are
/// promised (their declarations, `declaredMiB`, plus what the ledger's shown reservations
/// need beyond theirs) less what the GPU uses, and the pending reservations in full (the
/// node shows neither their replica nor their declaration yet), each at most the whole GPU
/// ([`Reservation::mib_on`]).
pub fn committed(gpu: &GpuFigures, pending: &[Reservation], policy: &JudgePolicy) -> u64 {
    let usable = (gpu.free_mib + gpu.used_mib).saturating_sub(policy.margin_mib);
    let (mut beyond, mut any_shown, mut waiting) = (0u64, false, 0u64);
    for r in pending_on(pending, gpu) {
        if r.shown {
            any_shown = true;
            beyond += r.mib_on(usable).saturating_sub(r.declared_mib);
        } else {
            waiting += r.mib_on(usable);
        }
    }
    let promised = gpu.declared_mib.unwrap_or(0) + beyond;
    let unused = if gpu.declared_mib.is_some() || any_shown {
        promised.saturating_sub(gpu.used_mib)
    } else {
        0
    };
    unused * u64::from(policy.promised_percent) / 100 + waiting
}

/// A GPU's replicas counting pending reservations as allocated; `None` without the figures.
fn with_pending<'a>(
    g: &'a GpuFigures,
    pending: &[Reservation],
) -> Option<(Replicas, &'a GpuFigures)> {
    let allocated =
        g.replicas_allocated? + pending_on(pending, g).filter(|r| !r.shown).count() as u32;
    let replicas = Replicas {
        allocated,
        allocatable: g.replicas_allocatable?,
        index: Some(g.index),
    };
    Some((replicas, g))
}

/// The GPU NVIDIA's device plugin hands out next (`src/model/device_plugin.rs`), counting
/// pending reservations. `None`: none has a replica left. Only meaningful when the node has
/// replica figures.
pub fn next_gpu<'a>(v: &'a NodeVram, pending: &[Reservation]) -> Option<&'a GpuFigures> {
    device_plugin::next(v.gpus.iter().filter_map(|g| with_pending(g, pending)))
}

/// The `count` GPUs NVIDIA's device plugin hands out next, counting pending reservations,
/// each GPU once. `None`: fewer than `count` have a replica left.
pub fn next_gpus<'a>(
    v: &'a NodeVram,
    pending: &[Reservation],
    count: usize,
) -> Option<Vec<&'a GpuFigures>> {
    device_plugin::next_n(
        v.gpus.iter().filter_map(|g| with_pending(g, pending)),
        count,
    )
}

/// The GPUs a pod gets: one (the common case, judged without allocating) or several.
enum Handed<'a> {
    One(&'a GpuFigures),
    Many(Vec<&'a GpuFigures>),
}

impl<'a> Handed<'a> {
    fn get(v: &'a NodeVram, pending: &[Reservation], count: u32) -> Option<Handed<'a>> {
        if count == 1 {
            next_gpu(v, pending).map(Handed::One)
        } else {
            next_gpus(v, pending, count as usize).map(Handed::Many)
        }
    }

    fn gpus(&self) -> &[&'a GpuFigures] {
        match self {
            Handed::One(g) => std::slice::from_ref(g),
            Handed::Many(v) => v,
        }
    }
}

/// Judges `state` for a pod needing `need` MiB on each of `count` GPUs (`None`: unknown,
/// pass unchecked) at `now`. Allocates nothing for a one-GPU pod on a node it can read; the
/// prose waits in [`Why`] until something reads it.
pub fn judge(
    state: &NodeState,
    pending: &[Reservation],
    need: Option<u64>,
    count: u32,
    policy: &JudgePolicy,
    now: SystemTime,
) -> Verdict {
    let v = match state {
        NodeState::Missing => return unknown(policy, Reason::Missing, Untrusted::Missing),
        NodeState::Malformed(why) => {
            return unknown(policy, Reason::Malformed, Untrusted::Malformed(why.clone()))
        }
        NodeState::Known(v) => v,
    };
    // A clock ahead of the agent's counts as fresh: skew is not staleness.
    let age = now.duration_since(v.observed_at).unwrap_or_default();
    if age > policy.stale_after {
        let what = Untrusted::Stale {
            age_s: age.as_secs(),
            observed_at: v.observed_at,
            trusted_s: policy.stale_after.as_secs(),
        };
        return unknown(policy, Reason::Stale, what);
    }
    let count = count.max(1);
    let room = |g: &GpuFigures| -> i64 {
        g.free_mib as i64 - committed(g, pending, policy) as i64 - policy.margin_mib as i64
    };
    let refuse_unless_unknown = |reason: Reason, why: Why| Verdict {
        pass: need.is_none(),
        reason: if need.is_none() {
            Reason::NoNeed
        } else {
            reason
        },
        why,
        gpu: None,
    };
    // The GPUs the pod gets, and of those the one with the least room: it decides.
    let handed;
    let (gpu, known_next, hot) = if v.has_replicas() {
        let Some(h) = Handed::get(v, pending, count) else {
            return refuse_unless_unknown(Reason::NoReplica, Why::NoReplica { count });
        };
        handed = h;
        let picked = handed.gpus();
        let hot = picked
            .iter()
            .copied()
            .find(|g| g.pressure != Pressure::None);
        match picked.iter().copied().min_by_key(|g| (room(g), g.index)) {
            Some(g) => (g, true, hot),
            None => return refuse_unless_unknown(Reason::NoGpu, Why::NoGpuJudged),
        }
    } else {
        if v.gpus.len() < (count as usize) {
            let why = Why::TooFewGpus {
                has: v.gpus.len(),
                asks: count,
            };
            return refuse_unless_unknown(Reason::NoGpu, why);
        }
        // Which GPUs the pod gets is not known: any of them may be among its GPUs.
        let hot = v.gpus.iter().find(|g| g.pressure != Pressure::None);
        match v.gpus.iter().min_by_key(|g| (room(g), g.index)) {
            Some(g) => (g, false, hot),
            None => return refuse_unless_unknown(Reason::NoGpu, Why::NoGpuReading),
        }
    };
    let room_before = room(gpu);
    let which = Which {
        index: gpu.index,
        known_next,
        count,
        node_gpus: v.gpus.len(),
    };
    let pick = |g: &GpuFigures, room_after_mib| GpuPick {
        index: g.index,
        room_after_mib,
        total_mib: g.total_mib,
        known_next,
        pressure: hot.map(|h| h.pressure).unwrap_or(Pressure::None),
    };
    let Some(need) = need else {
        return Verdict {
            pass: true,
            reason: Reason::NoNeed,
            why: Why::Unchecked(which),
            gpu: Some(pick(gpu, room_before)),
        };
    };
    if let Some(h) = hot {
        return Verdict {
            pass: false,
            reason: Reason::Pressure,
            why: Why::Pressure {
                index: h.index,
                pressure: h.pressure,
            },
            gpu: Some(pick(h, room(h) - need as i64)),
        };
    }
    let after = room_before - need as i64;
    if after >= 0 {
        return Verdict {
            pass: true,
            reason: Reason::Fits,
            why: Why::Fits {
                which,
                after_mib: after,
            },
            gpu: Some(pick(gpu, after)),
        };
    }
    Verdict {
        pass: false,
        reason: Reason::NoRoom,
        why: Why::Short {
            which,
            free_mib: gpu.free_mib,
            committed_mib: committed(gpu, pending, policy),
            need_mib: need,
            margin_mib: policy.margin_mib,
            short_mib: -after,
        },
        gpu: Some(pick(gpu, after)),
    }
}

/// The prioritize score of a verdict: 0..=10, by room left after the pod on the judged GPU
/// as a share of its framebuffer. Nodes not passed, passed without a GPU, or with a GPU the
/// pod may get under memory pressure score 0: a GPU under pressure is never preferred.
pub fn score(v: &Verdict, mode: ScoreMode) -> i64 {
    let Some(g) = v.gpu.as_ref().filter(|_| v.pass) else {
        return 0;
    };
    if g.total_mib == 0 || g.pressure != Pressure::None {
        return 0;
    }
    let share = (g.room_after_mib.max(0) as f64 / g.total_mib as f64).clamp(0.0, 1.0);
    let share = match mode {
        ScoreMode::Pack => 1.0 - share,
        ScoreMode::Spread => share,
    };
    (share * MAX_EXTENDER_PRIORITY as f64).round() as i64
}

/// The prioritize reply for `(node, verdict)` pairs, in their order.
pub fn priorities<'a>(
    verdicts: impl IntoIterator<Item = (&'a str, &'a Verdict)>,
    mode: ScoreMode,
) -> Vec<HostPriority> {
    verdicts
        .into_iter()
        .map(|(n, v)| HostPriority {
            host: n.to_string(),
            score: score(v, mode),
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::extender::nodes::read_node;
    use crate::publish::annotations::AnnotationValues;
    use std::time::UNIX_EPOCH;

    pub(crate) const T0: u64 = 1_780_000_000;

    /// A GPU entry; `replicas`: (allocated, allocatable, declared MiB).
    pub(crate) fn gpu(
        index: u32,
        free: u64,
        used: u64,
        replicas: Option<(u32, u32, u64)>,
    ) -> GpuFigures {
        GpuFigures {
            index,
            uuid: format!("GPU-{index}"),
            total_mib: 23028,
            used_mib: used,
            free_mib: free,
            pressure: Pressure::None,
            replicas_allocated: replicas.map(|r| r.0),
            replicas_allocatable: replicas.map(|r| r.1),
            declared_mib: replicas.map(|r| r.2),
        }
    }

    /// The node state the agent's own writer produces for these GPUs, read back.
    pub(crate) fn node(gpus: Vec<GpuFigures>, next: Option<Option<String>>) -> NodeState {
        let v = AnnotationValues {
            observed_at: UNIX_EPOCH + Duration::from_secs(T0),
            free_mib: gpus.iter().map(|g| g.free_mib).sum(),
            max_free_mib: gpus.iter().map(|g| g.free_mib).max().unwrap_or(0),
            gpus,
            next_gpu: next,
            cuda_driver_version: None,
        };
        read_node(&v.to_annotations("gpu-warden.io"), "gpu-warden.io")
    }

    pub(crate) fn at(secs_after: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(T0 + secs_after)
    }

    /// Every promised MiB counted (`promisedPercent: 100`): these tests are about the
    /// room's arithmetic and wording; the share has its own test.
    fn policy(margin: u64, unknown: UnknownNode) -> JudgePolicy {
        JudgePolicy {
            margin_mib: margin,
            unknown_node: unknown,
            stale_after: Duration::from_secs(120),
            promised_percent: 100,
            ..JudgePolicy::default()
        }
    }

    #[test]
    fn promised_percent_keeps_that_share_of_the_unallocated_promises_free_pending_pods_in_full() {
        // 8 GiB declared on the GPU, 2 GiB of it allocated: 6 GiB promised, unallocated.
        let g = gpu(0, 20000, 2048, Some((1, 4, 8192)));
        let share = |pct: u8| JudgePolicy {
            promised_percent: pct,
            ..policy(512, UnknownNode::Pass)
        };
        assert_eq!(committed(&g, &[], &share(100)), 6144);
        assert_eq!(committed(&g, &[], &share(75)), 4608);
        assert_eq!(committed(&g, &[], &share(0)), 0);
        // A pod bound but not yet shown by the node: its need in full, whatever the share.
        let waiting = [res(Some("GPU-0"), 4096)];
        assert_eq!(committed(&g, &waiting, &share(75)), 4608 + 4096);
        // The verdict follows: 20000 free - 4608 - 512 = 14880 of room at 75 %.
        let state = node(vec![g], None);
        let at = |pct: u8, need: u64| {
            let p = JudgePolicy {
                promised_percent: pct,
                ..policy(512, UnknownNode::Pass)
            };
            judge(&state, &[], Some(need), 1, &p, super::tests::at(0)).pass
        };
        assert!(at(75, 14880));
        assert!(!at(75, 14881));
        assert!(!at(100, 14000), "20000 - 6144 - 512 = 13344 at 100 %");
        assert!(at(100, 13344));
    }

    #[test]
    fn a_reservation_counts_at_most_the_whole_gpu() {
        // A pod bound while its node could not be read keeps the whole-GPU placeholder
        // (its GPU unknown then): on each GPU it counts as that GPU, less the margin.
        let g = gpu(0, 20480, 2048, Some((1, 4, 0)));
        let p = JudgePolicy {
            promised_percent: 100,
            ..policy(512, UnknownNode::Pass)
        };
        let whole = [res(None, crate::extender::need::WHOLE_GPU_MIB)];
        assert_eq!(committed(&g, &whole, &p), 22528 - 512);
        let mut shown = whole.clone();
        shown[0].shown = true;
        assert_eq!(
            committed(&g, &shown, &p),
            22528 - 512 - 2048,
            "less what it uses"
        );
        // A need that fits is counted as it is.
        assert_eq!(committed(&g, &[res(None, 4096)], &p), 4096);
        let state = node(vec![g], None);
        let v = judge(&state, &whole, Some(4096), 1, &p, super::tests::at(0));
        assert!(!v.pass);
        assert!(
            v.why.to_string().contains("21.5 GiB committed"),
            "{}",
            v.why
        );
    }

    fn res(gpu: Option<&str>, mib: u64) -> Reservation {
        Reservation {
            pod: format!("ci/r-{mib}"),
            mib,
            gpu: gpu.map(String::from),
            at: Duration::ZERO,
            at_wall: at(0),
            baseline: None,
            baseline_at: None,
            bumped: Vec::new(),
            declared_mib: 0,
            shown: false,
            project: None,
        }
    }

    #[test]
    fn a_shown_pods_need_beyond_its_declaration_is_still_committed() {
        // One pod on the GPU, declared nothing, judged on 12 GiB, using 4 GiB: the node's
        // figures say 18.5 GiB free and nothing declared.
        let n = node(
            vec![gpu(0, 18932, 4096, Some((1, 8, 0)))],
            Some(Some("GPU-0".into())),
        );
        let p = policy(512, UnknownNode::Pass);
        let alone = judge(&n, &[], Some(10240), 1, &p, at(5));
        assert!(alone.pass, "{}", alone.message());
        let mut shown = res(Some("GPU-0"), 12288);
        shown.shown = true;
        let v = judge(&n, std::slice::from_ref(&shown), Some(10240), 1, &p, at(5));
        assert_eq!(
            (v.pass, v.reason),
            (false, Reason::NoRoom),
            "{}",
            v.message()
        );
        assert!(v.message().contains("8 GiB committed"), "{}", v.message());
        // Shown, it no longer waits for a replica: the next GPU counts it once, in the
        // node's replicas-allocated figure.
        let two = node(
            vec![
                gpu(0, 18932, 4096, Some((1, 8, 0))),
                gpu(1, 23028, 0, Some((1, 8, 0))),
            ],
            None,
        );
        let NodeState::Known(v2) = &two else {
            panic!("known")
        };
        assert_eq!(
            next_gpu(v2, std::slice::from_ref(&shown)).map(|g| g.index),
            Some(0)
        );
        let mut waiting = shown.clone();
        waiting.shown = false;
        assert_eq!(
            next_gpu(v2, std::slice::from_ref(&waiting)).map(|g| g.index),
            Some(1)
        );
        // Once the pod uses more than its need, what it uses is what counts.
        let grown = node(
            vec![gpu(0, 8692, 14336, Some((1, 8, 0)))],
            Some(Some("GPU-0".into())),
        );
        let v = judge(
            &grown,
            std::slice::from_ref(&shown),
            Some(4096),
            1,
            &p,
            at(5),
        );
        assert!(v.pass, "{}", v.message());
    }

    #[test]
    fn the_issues_reason_reads_as_written() {
        // 3.2 GiB free, 4 GiB declared and unused (declared 4096 + 1024 used → 4096 unused).
        let n = node(
            vec![gpu(0, 3276, 1024, Some((2, 4, 5120)))],
            Some(Some("GPU-0".into())),
        );
        let v = judge(&n, &[], Some(8192), 1, &policy(0, UnknownNode::Pass), at(5));
        assert!(!v.pass);
        assert_eq!(v.reason, Reason::NoRoom);
        assert_eq!(
            v.message(),
            "GPU 0 (the one the device plugin hands out next) has too little VRAM: 3.2 GiB free, 4 GiB committed; the pod needs 8 GiB (9012 MiB short)"
        );
        // (2 GiB used: a GPU big enough to hold the 4 GiB pending pod, whose need counts in
        // full only up to the whole GPU.)
        let single = node(vec![gpu(0, 3276, 2048, None)], None);
        let v = judge(
            &single,
            &[res(None, 4096)],
            Some(8192),
            1,
            &policy(512, UnknownNode::Pass),
            at(5),
        );
        assert_eq!(
            v.message(),
            "GPU 0 has too little VRAM: 3.2 GiB free, 4 GiB committed; the pod needs 8 GiB plus a 0.5 GiB margin (9524 MiB short)"
        );
        // The issue's case: 8.5 GiB free for 8 GiB plus a 0.5 GiB margin, 52 MiB short,
        // read as a refusal, not as a fit.
        let v = judge(
            &node(vec![gpu(0, 8652, 0, None)], None),
            &[],
            Some(8192),
            1,
            &policy(512, UnknownNode::Pass),
            at(5),
        );
        assert_eq!(
            v.message(),
            "GPU 0 has too little VRAM: 8.4 GiB free; the pod needs 8 GiB plus a 0.5 GiB margin (52 MiB short)"
        );
    }

    /// name, node, pending, need, policy, now → pass, reason, GPU judged.
    type Case<'a> = (
        &'a str,
        NodeState,
        Vec<Reservation>,
        Option<u64>,
        &'a JudgePolicy,
        SystemTime,
        bool,
        Reason,
        Option<u32>,
    );

    #[test]
    fn table() {
        let p = policy(512, UnknownNode::Pass);
        let fail_closed = policy(512, UnknownNode::Fail);
        let two_known = || {
            // GPU 0 roomy but 3 replicas out; GPU 1 tight with 1 out: the device plugin
            // hands out GPU 1, so that is the one judged.
            node(
                vec![
                    gpu(0, 20000, 2000, Some((3, 4, 0))),
                    gpu(1, 6000, 10000, Some((1, 4, 12000))),
                ],
                Some(Some("GPU-1".into())),
            )
        };
        let mut hot = gpu(0, 20000, 2000, None);
        hot.pressure = Pressure::Soft;
        let cases: Vec<Case> = vec![
            (
                "fits",
                node(vec![gpu(0, 10240, 0, None)], None),
                vec![],
                Some(8192),
                &p,
                at(1),
                true,
                Reason::Fits,
                Some(0),
            ),
            (
                "margin tips it",
                node(vec![gpu(0, 8400, 0, None)], None),
                vec![],
                Some(8192),
                &p,
                at(1),
                false,
                Reason::NoRoom,
                Some(0),
            ),
            (
                "reservation counts",
                node(vec![gpu(0, 12288, 0, None)], None),
                vec![res(None, 4096)],
                Some(8192),
                &p,
                at(1),
                false,
                Reason::NoRoom,
                Some(0),
            ),
            (
                "next GPU judged, not the roomiest",
                two_known(),
                vec![],
                Some(8192),
                &p,
                at(1),
                false,
                Reason::NoRoom,
                Some(1),
            ),
            (
                "reservations shift the next GPU",
                two_known(),
                vec![
                    res(Some("GPU-1"), 0),
                    res(Some("GPU-1"), 0),
                    res(Some("GPU-1"), 0),
                ],
                Some(8192),
                &p,
                at(1),
                true,
                Reason::Fits,
                Some(0),
            ),
            (
                "ties go to the lower index",
                node(
                    vec![
                        gpu(0, 9000, 0, Some((1, 4, 0))),
                        gpu(1, 20000, 0, Some((1, 4, 0))),
                    ],
                    Some(Some("GPU-0".into())),
                ),
                vec![],
                Some(8192),
                &p,
                at(1),
                true,
                Reason::Fits,
                Some(0),
            ),
            (
                "no replica left",
                node(vec![gpu(0, 20000, 0, Some((4, 4, 0)))], Some(None)),
                vec![],
                Some(1024),
                &p,
                at(1),
                false,
                Reason::NoReplica,
                None,
            ),
            (
                "unknown placement: the fullest GPU",
                node(vec![gpu(0, 20000, 0, None), gpu(1, 6000, 0, None)], None),
                vec![],
                Some(8192),
                &p,
                at(1),
                false,
                Reason::NoRoom,
                Some(1),
            ),
            (
                "pressure",
                node(vec![hot], None),
                vec![],
                Some(1024),
                &p,
                at(1),
                false,
                Reason::Pressure,
                Some(0),
            ),
            (
                "no need: passes, still scored",
                node(vec![gpu(0, 100, 0, None)], None),
                vec![],
                None,
                &p,
                at(1),
                true,
                Reason::NoNeed,
                Some(0),
            ),
            (
                "stale, fail-open",
                node(vec![gpu(0, 100, 0, None)], None),
                vec![],
                Some(8192),
                &p,
                at(121),
                true,
                Reason::Stale,
                None,
            ),
            (
                "stale, fail-closed",
                node(vec![gpu(0, 100, 0, None)], None),
                vec![],
                Some(8192),
                &fail_closed,
                at(121),
                false,
                Reason::Stale,
                None,
            ),
            (
                "at the limit is fresh",
                node(vec![gpu(0, 100, 0, None)], None),
                vec![],
                Some(8192),
                &p,
                at(120),
                false,
                Reason::NoRoom,
                Some(0),
            ),
            (
                "agent's clock ahead",
                node(vec![gpu(0, 10240, 0, None)], None),
                vec![],
                Some(8192),
                &p,
                UNIX_EPOCH + Duration::from_secs(T0 - 30),
                true,
                Reason::Fits,
                Some(0),
            ),
            (
                "missing, fail-open",
                NodeState::Missing,
                vec![],
                Some(8192),
                &p,
                at(1),
                true,
                Reason::Missing,
                None,
            ),
            (
                "malformed, fail-closed",
                NodeState::Malformed("x".into()),
                vec![],
                Some(8192),
                &fail_closed,
                at(1),
                false,
                Reason::Malformed,
                None,
            ),
            (
                "no GPU reading",
                node(vec![], None),
                vec![],
                Some(1),
                &p,
                at(1),
                false,
                Reason::NoGpu,
                None,
            ),
        ];
        for (name, state, pending, need, pol, now, pass, reason, gpu_index) in cases {
            let v = judge(&state, &pending, need, 1, pol, now);
            assert_eq!(
                (v.pass, v.reason),
                (pass, reason),
                "{name}: {}",
                v.message()
            );
            assert_eq!(v.gpu.as_ref().map(|g| g.index), gpu_index, "{name}");
            assert!(!v.message().is_empty(), "{name}: every verdict says why");
        }
    }

    #[test]
    fn next_gpu_agrees_with_the_agents_choice() {
        // The agent's own nextGpuUuid for these figures is GPU-1 (fewest allocated).
        let NodeState::Known(v) = node(
            vec![gpu(0, 1, 1, Some((2, 4, 0))), gpu(1, 1, 1, Some((1, 4, 0)))],
            Some(Some("GPU-1".into())),
        ) else {
            panic!("readable")
        };
        assert_eq!(
            next_gpu(&v, &[]).map(|g| g.uuid.clone()),
            Some("GPU-1".to_string())
        );
        assert_eq!(v.next_gpu, Some(Some("GPU-1".to_string())));
    }

    #[test]
    fn scores_pack_and_spread() {
        let p = policy(0, UnknownNode::Pass);
        let one = |free| {
            judge(
                &node(vec![gpu(0, free, 0, None)], None),
                &[],
                Some(8192),
                1,
                &p,
                at(1),
            )
        };
        let (tight, roomy, failed) = (one(9000), one(23000), one(100));
        assert!(score(&tight, ScoreMode::Pack) > score(&roomy, ScoreMode::Pack));
        assert!(score(&tight, ScoreMode::Spread) < score(&roomy, ScoreMode::Spread));
        assert_eq!(score(&tight, ScoreMode::Pack), 10);
        assert_eq!(score(&failed, ScoreMode::Pack), 0);
        for v in [&tight, &roomy, &failed] {
            for m in [ScoreMode::Pack, ScoreMode::Spread] {
                assert!((0..=MAX_EXTENDER_PRIORITY).contains(&score(v, m)));
            }
        }
    }

    #[test]
    fn two_gpus_each_must_fit_chosen_as_the_device_plugin_would() {
        let p = policy(512, UnknownNode::Pass);
        // Allocated 0, 2, 1: the device plugin hands out GPU 0 and GPU 2 (fewest first).
        let three = |free2| {
            node(
                vec![
                    gpu(0, 20000, 0, Some((0, 4, 0))),
                    gpu(1, 20000, 0, Some((2, 4, 0))),
                    gpu(2, free2, 0, Some((1, 4, 0))),
                ],
                Some(Some("GPU-0".into())),
            )
        };
        let v = judge(&three(20000), &[], Some(8192), 2, &p, at(1));
        assert!(v.pass, "{}", v.message());
        // GPU 2 is tight: one of the two does not fit, though GPU 1 has room.
        let v = judge(&three(6000), &[], Some(8192), 2, &p, at(1));
        assert_eq!(
            (v.pass, v.reason),
            (false, Reason::NoRoom),
            "{}",
            v.message()
        );
        assert_eq!(v.gpu.as_ref().map(|g| g.index), Some(2));
        assert!(v.message().contains("on each GPU"), "{}", v.message());
        // One GPU has replicas left: two cannot be had.
        let full = node(
            vec![
                gpu(0, 20000, 0, Some((4, 4, 0))),
                gpu(1, 20000, 0, Some((0, 4, 0))),
            ],
            Some(Some("GPU-1".into())),
        );
        let v = judge(&full, &[], Some(1024), 2, &p, at(1));
        assert_eq!((v.pass, v.reason), (false, Reason::NoReplica));
        let v = judge(&full, &[], Some(1024), 1, &p, at(1));
        assert!(v.pass);
        // Without replica figures: the node must have the GPUs, and its fullest must fit.
        let plain = node(vec![gpu(0, 20000, 0, None), gpu(1, 9000, 0, None)], None);
        assert!(judge(&plain, &[], Some(8192), 2, &p, at(1)).pass);
        let v = judge(&plain, &[], Some(8192), 3, &p, at(1));
        assert_eq!((v.pass, v.reason), (false, Reason::NoGpu));
    }

    #[test]
    fn a_gpu_under_pressure_is_never_preferred() {
        let p = policy(0, UnknownNode::Pass);
        let mut hot = gpu(0, 1024, 22000, None);
        hot.pressure = Pressure::Hard;
        let cool = gpu(0, 20480, 2000, None);
        for mode in [ScoreMode::Pack, ScoreMode::Spread] {
            // A pod whose need is unknown passes both, but only the cool one scores.
            let h = judge(&node(vec![hot.clone()], None), &[], None, 1, &p, at(1));
            let c = judge(&node(vec![cool.clone()], None), &[], None, 1, &p, at(1));
            assert!(h.pass && c.pass);
            assert_eq!(score(&h, mode), 0, "{mode:?}");
            assert!(score(&c, mode) > 0, "{mode:?}");
        }
        // On a multi-GPU node without replica figures any GPU may be the pod's.
        let two = node(
            vec![cool.clone(), {
                let mut g = hot.clone();
                g.index = 1;
                g.uuid = "GPU-1".into();
                g
            }],
            None,
        );
        let v = judge(&two, &[], Some(1024), 1, &p, at(1));
        assert_eq!(
            (v.pass, v.reason),
            (false, Reason::Pressure),
            "{}",
            v.message()
        );
    }
}
