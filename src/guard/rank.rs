//! Who may be evicted from a GPU, and in which order: the eligibility rules and the
//! kubelet-like ranking of docs/guard.md, as a pure function of the processes on the GPU,
//! the node's pods and the policy.

use super::growth::Growth;
use super::policy::Policy;
use crate::model::pod::PodInfo;
use crate::model::snapshot::{Owner, ProcessSample, MIB};
use crate::model::vram_request;
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::SystemTime;

pub use crate::model::pod::MIRROR_ANNOTATION;
/// GitLab Runner's CI job annotations, quoted in Events so the job's owner can be found.
pub const CI_JOB_ID_ANNOTATION: &str = "job.runner.gitlab.com/id";
/// See [`CI_JOB_ID_ANNOTATION`].
pub const CI_JOB_URL_ANNOTATION: &str = "job.runner.gitlab.com/url";

/// Why a pod with memory on the GPU is not a candidate. Only the first reason that
/// applies is reported, in the order of the variants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Exclusion {
    /// The process is attributed to a pod UID the pod view does not know (yet): without
    /// its priority and annotations the guard cannot judge it, so it is left alone.
    UnknownPod,
    /// The pod is already terminating: evicting it again reclaims nothing sooner.
    Terminating,
    /// The namespace is in `excludedNamespaces`.
    ExcludedNamespace,
    /// A static pod (mirror annotation, or owned by the Node): the Eviction API cannot
    /// remove it, the kubelet would restart it.
    StaticPod,
    /// A DaemonSet pod: its controller would put it straight back on this node.
    DaemonSet,
    /// `spec.priority` at or above `priorityCeiling` (system-critical).
    PriorityCeiling {
        /// The pod's priority.
        priority: i32,
        /// The configured ceiling.
        ceiling: i32,
    },
    /// Annotated `<prefix>/evict: "never"`.
    EvictNever,
    /// The policy has a selector and the pod's labels do not match it.
    SelectorMismatch,
    /// An eviction of this pod was refused (PDB 429) or failed recently; it is skipped
    /// until `cooldownTimeout` has passed.
    RecentlyRefused {
        /// What the API server answered.
        detail: String,
    },
    /// NVML reports no memory for the pod's processes: evicting it would reclaim nothing.
    NoMemoryUse,
    /// A decision taken while memory is on its way back (an earlier decision's victims,
    /// terminating pods) takes only the pods that kept growing: this one did not climb
    /// above its high-water mark and request (`guard::state::escalate`).
    NotGrowing,
    /// An early decision (trigger `early_trend`, before any pressure) takes only the pods
    /// that carry the climb: this one did not climb above its marks and request.
    NotClimbing,
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exclusion::UnknownPod => f.write_str("pod not in the node's pod view"),
            Exclusion::Terminating => f.write_str("already terminating"),
            Exclusion::ExcludedNamespace => f.write_str("namespace is excluded"),
            Exclusion::StaticPod => f.write_str("static (mirror) pod"),
            Exclusion::DaemonSet => f.write_str("DaemonSet pod"),
            Exclusion::PriorityCeiling { priority, ceiling } => {
                write!(
                    f,
                    "priority {priority} is at or above the ceiling {ceiling}"
                )
            }
            Exclusion::EvictNever => f.write_str("annotated evict: never"),
            Exclusion::SelectorMismatch => f.write_str("labels do not match the selector"),
            Exclusion::RecentlyRefused { detail } => {
                write!(f, "eviction recently refused: {detail}")
            }
            Exclusion::NoMemoryUse => f.write_str("no measured GPU memory use"),
            Exclusion::NotGrowing => f.write_str(
                "not growing while memory is on its way back (only the pods that kept growing are taken then)",
            ),
            Exclusion::NotClimbing => f.write_str(
                "not climbing (an early decision, before any pressure, takes only the pods that carry the climb)",
            ),
        }
    }
}

/// A pod with memory on the GPU that is not eligible, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Excluded {
    /// Pod UID.
    pub uid: String,
    /// Namespace as attribution reported it.
    pub namespace: String,
    /// Pod name as attribution reported it.
    pub name: String,
    /// Summed VRAM of its processes on this GPU, in bytes.
    pub use_bytes: u64,
    /// The first rule that excluded it.
    pub exclusion: Exclusion,
}

/// An eligible pod, in rank order, with what the enforcer and the Event need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Victim {
    /// Pod UID (`metadata.uid`), the key for outcomes.
    pub uid: String,
    /// Namespace, for the Eviction API call.
    pub namespace: String,
    /// Pod name, for the Eviction API call.
    pub name: String,
    /// Containers whose processes hold memory on this GPU.
    pub containers: Vec<String>,
    /// PIDs of its processes on this GPU; the cooldown waits for them to leave.
    pub pids: Vec<u32>,
    /// Summed VRAM of its processes on this GPU, in bytes: what evicting it reclaims.
    pub use_bytes: u64,
    /// Declared request from `<prefix>/vram-request-mib`, in bytes (0 when unset or unparsable).
    pub request_bytes: u64,
    /// What its use grew by on this GPU over the last `horizon` of full polls, in bytes.
    pub grew_bytes: u64,
    /// Over how long, in milliseconds (0: no earlier poll to compare with).
    pub grew_over_ms: u64,
    /// What it would add over the next `horizon` at the rate it climbed since the previous
    /// full poll (at least `grew_bytes`; `guard::growth`'s `Growth::ahead`).
    pub growth_ahead_bytes: u64,
    /// `spec.priority`.
    pub priority: i32,
    /// `spec.priorityClassName`.
    pub priority_class: Option<String>,
    /// `metadata.creationTimestamp`, the "youngest first" tie-break.
    #[serde(skip)]
    pub created_at: Option<SystemTime>,
    /// GitLab CI job ID annotation, when present.
    pub ci_job_id: Option<String>,
    /// GitLab CI job URL annotation, when present.
    pub ci_job_url: Option<String>,
    /// Why it ranks where it does, for logs and the Event message.
    pub reason: String,
}

impl Victim {
    /// Whether its use exceeds its declared request (rank key 1).
    pub fn over_request(&self) -> bool {
        self.use_bytes > self.request_bytes
    }

    /// Use above the declared request.
    pub fn above_request(&self) -> u64 {
        self.use_bytes.saturating_sub(self.request_bytes)
    }

    /// Rank key 3: use above the declared request plus what it would add over the next
    /// `horizon` at the rate it grew lately — where it will be one horizon on if it keeps
    /// growing as it did. A pod that is growing ranks ahead of a steady one holding more:
    /// under a real kubelet a victim's memory comes back only at its SIGKILL, seconds later,
    /// so what a decision changes first is whose growth it stops.
    pub fn projected_above_request(&self) -> u64 {
        self.use_bytes
            .saturating_add(self.growth_ahead_bytes.max(self.grew_bytes))
            .saturating_sub(self.request_bytes)
    }

    /// The rate it grew at lately, bytes per second, from [`Victim::growth_ahead_bytes`]
    /// over `horizon`.
    fn recent_rate(&self, horizon: std::time::Duration) -> f64 {
        let h = horizon.as_secs_f64();
        if h > 0.0 {
            self.growth_ahead_bytes as f64 / h
        } else {
            0.0
        }
    }
}

/// The eligibility verdict for one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Ranking {
    /// Eligible pods, first to evict first.
    pub candidates: Vec<Victim>,
    /// Pods with memory on the GPU that may not be evicted.
    pub excluded: Vec<Excluded>,
    /// Memory of processes outside any known pod (host, unattributed, invisible): never
    /// evictable, but part of why the GPU is full.
    pub other_bytes: u64,
}

impl Ranking {
    /// Keeps the candidates `keep` says, in order; the others become excluded for `why`.
    pub fn keep_only(&mut self, keep: impl Fn(&Victim) -> bool, why: &Exclusion) {
        let (kept, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.candidates)
            .into_iter()
            .partition(|v| keep(v));
        self.candidates = kept;
        self.excluded.extend(others.into_iter().map(|v| Excluded {
            uid: v.uid,
            namespace: v.namespace,
            name: v.name,
            use_bytes: v.use_bytes,
            exclusion: why.clone(),
        }));
    }
}

/// Formats bytes for humans the way `nvidia-smi` readers think: GiB with one decimal from
/// 1 GiB up, whole MiB below.
pub fn fmt_bytes(bytes: u64) -> String {
    const GIB: u64 = 1024 * MIB;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{} MiB", (bytes + MIB / 2) / MIB)
    }
}

#[derive(Default)]
struct PodUse {
    namespace: String,
    name: String,
    use_bytes: u64,
    pids: BTreeSet<u32>,
    containers: BTreeSet<String>,
}

/// Ranks the pods on GPU `gpu` as [`rank_growing`] does, with no growth known.
pub fn rank(
    policy: &Policy,
    gpu: u32,
    processes: &[ProcessSample],
    pods: &HashMap<String, PodInfo>,
    refused: &HashMap<String, String>,
) -> Ranking {
    rank_growing(policy, gpu, processes, pods, refused, &HashMap::new())
}

/// Ranks the pods on GPU `gpu`. `refused` maps pod UIDs whose eviction was recently
/// refused or failed to the API server's answer; they are skipped. `growth` maps pod UIDs
/// to what their use on the GPU grew by lately (`guard::growth`); absent means none.
pub fn rank_growing(
    policy: &Policy,
    gpu: u32,
    processes: &[ProcessSample],
    pods: &HashMap<String, PodInfo>,
    refused: &HashMap<String, String>,
    growth: &HashMap<String, Growth>,
) -> Ranking {
    let mut by_pod: BTreeMap<&str, PodUse> = BTreeMap::new();
    let mut other_bytes = 0u64;
    for p in processes.iter().filter(|p| p.gpu == gpu) {
        let used = p.used_bytes.unwrap_or(0);
        match &p.owner {
            Owner::Pod(r) => {
                let e = by_pod.entry(r.uid.as_str()).or_default();
                e.namespace.clone_from(&r.namespace);
                e.name.clone_from(&r.pod);
                e.use_bytes = e.use_bytes.saturating_add(used);
                e.pids.insert(p.pid);
                e.containers.insert(r.container.clone());
            }
            Owner::Host | Owner::Unknown | Owner::Invisible => {
                other_bytes = other_bytes.saturating_add(used);
            }
        }
    }

    let evict_key = policy.evict_annotation();
    let request_key = policy.vram_request_annotation();
    let mut candidates = Vec::new();
    let mut excluded = Vec::new();
    for (uid, u) in by_pod {
        let info = pods.get(uid);
        let exclusion = match info {
            None => Some(Exclusion::UnknownPod),
            Some(info) => exclusion(policy, &evict_key, info, u.use_bytes, refused),
        };
        if let Some(exclusion) = exclusion {
            excluded.push(Excluded {
                uid: uid.to_string(),
                namespace: info.map_or(u.namespace, |i| i.namespace.clone()),
                name: info.map_or(u.name, |i| i.name.clone()),
                use_bytes: u.use_bytes,
                exclusion,
            });
            continue;
        }
        let Some(info) = info else { continue };
        let (request_bytes, request_note) = match info.annotations.get(&request_key) {
            None => (0, String::new()),
            Some(v) => match vram_request::parse_mib(v) {
                Some(mib) => (mib.saturating_mul(MIB), String::new()),
                None => (
                    0,
                    format!(" (annotation value {v:?} is not a whole number of MiB)"),
                ),
            },
        };
        let grew = growth.get(uid).copied().unwrap_or_default();
        candidates.push((
            Victim {
                uid: uid.to_string(),
                namespace: info.namespace.clone(),
                name: info.name.clone(),
                containers: u.containers.into_iter().collect(),
                pids: u.pids.into_iter().collect(),
                use_bytes: u.use_bytes,
                request_bytes,
                grew_bytes: grew.bytes,
                grew_over_ms: u64::try_from(grew.over.as_millis()).unwrap_or(u64::MAX),
                growth_ahead_bytes: grew.ahead,
                priority: info.priority,
                priority_class: info.priority_class.clone(),
                created_at: info.created_at,
                ci_job_id: info.annotations.get(CI_JOB_ID_ANNOTATION).cloned(),
                ci_job_url: info.annotations.get(CI_JOB_URL_ANNOTATION).cloned(),
                reason: String::new(),
            },
            request_note,
        ));
    }

    candidates.sort_by(|(a, _), (b, _)| compare(a, b));
    let lowest = candidates.iter().map(|(v, _)| v.priority).min();
    let n = candidates.len();
    let decided: Vec<String> = (0..n)
        .map(|i| match (candidates.get(i), candidates.get(i + 1)) {
            (Some((a, _)), Some((b, _))) => decider(a, b),
            _ if n == 1 => format!("the only eligible pod on GPU {gpu}"),
            _ => format!("last of {n} candidates"),
        })
        .collect();
    let candidates = candidates
        .into_iter()
        .zip(decided)
        .map(|((mut v, note), decided)| {
            let usage = if v.over_request() {
                format!(
                    "uses {}, {} over its request of {} MiB{note}",
                    fmt_bytes(v.use_bytes),
                    fmt_bytes(v.above_request()),
                    v.request_bytes / MIB
                )
            } else {
                format!(
                    "uses {}, within its request of {} MiB{note}",
                    fmt_bytes(v.use_bytes),
                    v.request_bytes / MIB
                )
            };
            let usage = if v.grew_bytes > 0 {
                format!(
                    "{usage}; grew {} in the last {:.1} s",
                    fmt_bytes(v.grew_bytes),
                    v.grew_over_ms as f64 / 1000.0
                )
            } else {
                usage
            };
            let usage = if v.growth_ahead_bytes > v.grew_bytes {
                format!(
                    "{usage}, {}/s since the previous poll",
                    fmt_bytes(v.recent_rate(policy.horizon) as u64)
                )
            } else {
                usage
            };
            let low = if n > 1 && Some(v.priority) == lowest {
                format!(" (lowest on GPU {gpu})")
            } else {
                String::new()
            };
            v.reason = format!("{usage}; priority {}{low}; {decided}", v.priority);
            v
        })
        .collect();
    Ranking {
        candidates,
        excluded,
        other_bytes,
    }
}

/// Why `info` may not be a victim (its processes use `use_bytes` on the GPU), if it may
/// not; `guard::recheck` asks the same question of a fresh read.
pub(super) fn exclusion(
    policy: &Policy,
    evict_key: &str,
    info: &PodInfo,
    use_bytes: u64,
    refused: &HashMap<String, String>,
) -> Option<Exclusion> {
    let owner = info.owner_kind.as_deref();
    if info.terminating {
        Some(Exclusion::Terminating)
    } else if policy.excluded_namespaces.contains(&info.namespace) {
        Some(Exclusion::ExcludedNamespace)
    } else if info.is_static() {
        Some(Exclusion::StaticPod)
    } else if owner == Some("DaemonSet") {
        Some(Exclusion::DaemonSet)
    } else if info.priority >= policy.priority_ceiling {
        Some(Exclusion::PriorityCeiling {
            priority: info.priority,
            ceiling: policy.priority_ceiling,
        })
    } else if info
        .annotations
        .get(evict_key)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("never"))
    {
        Some(Exclusion::EvictNever)
    } else if policy
        .selector
        .as_ref()
        .is_some_and(|s| !s.matches(&info.labels))
    {
        Some(Exclusion::SelectorMismatch)
    } else if let Some(detail) = refused.get(&info.uid) {
        Some(Exclusion::RecentlyRefused {
            detail: detail.clone(),
        })
    } else if use_bytes == 0 {
        Some(Exclusion::NoMemoryUse)
    } else {
        None
    }
}

/// One rank key: how it orders two candidates, and how an Event says it put the first ahead.
struct RankKey {
    order: fn(&Victim, &Victim) -> Ordering,
    why: fn(&Victim, &Victim) -> String,
}

fn among_equals(_: &Victim, _: &Victim) -> String {
    "first by namespace/name among equals".to_string()
}

/// The kubelet's node-pressure order, applied to VRAM: the keys in order, each written once,
/// so the order and the reason an Event gives for it cannot disagree.
const RANK_KEYS: [RankKey; 7] = [
    RankKey {
        order: |a, b| b.over_request().cmp(&a.over_request()),
        why: |_, _| "over its request, ahead of pods within theirs".to_string(),
    },
    RankKey {
        order: |a, b| a.priority.cmp(&b.priority),
        why: |_, b| format!("lower priority than the next candidate ({})", b.priority),
    },
    RankKey {
        order: |a, b| {
            b.projected_above_request()
                .cmp(&a.projected_above_request())
        },
        why: |a, b| {
            if a.grew_bytes > b.grew_bytes || a.growth_ahead_bytes > b.growth_ahead_bytes {
                "most use above request, counting its growth, among equals".to_string()
            } else {
                "most use above request among equals".to_string()
            }
        },
    },
    // Youngest first; `None < Some`, so an unknown creation time counts as oldest.
    RankKey {
        order: |a, b| b.created_at.cmp(&a.created_at),
        why: |_, _| "youngest of equals".to_string(),
    },
    RankKey {
        order: |a, b| a.namespace.cmp(&b.namespace),
        why: among_equals,
    },
    RankKey {
        order: |a, b| a.name.cmp(&b.name),
        why: among_equals,
    },
    RankKey {
        order: |a, b| a.uid.cmp(&b.uid),
        why: among_equals,
    },
];

fn compare(a: &Victim, b: &Victim) -> Ordering {
    RANK_KEYS
        .iter()
        .map(|k| (k.order)(a, b))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// Names the rank key that put `a` ahead of `b`, its successor.
fn decider(a: &Victim, b: &Victim) -> String {
    RANK_KEYS
        .iter()
        .find(|k| (k.order)(a, b).is_ne())
        .map_or_else(|| among_equals(a, b), |k| (k.why)(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::selector::Selector;
    use crate::testkit::fixtures::*;

    fn uids(r: &Ranking) -> Vec<&str> {
        r.candidates.iter().map(|v| v.uid.as_str()).collect()
    }

    fn excluded(r: &Ranking) -> Vec<(&str, &Exclusion)> {
        r.excluded
            .iter()
            .map(|e| (e.uid.as_str(), &e.exclusion))
            .collect()
    }

    /// One pod per exclusion rule, plus one eligible pod; each is reported with its rule.
    #[test]
    fn every_exclusion_is_reported() {
        let policy = Policy {
            selector: Some(Selector::parse("workload-type=gpu-ci").unwrap()),
            ..Policy::default()
        };
        let ci = |uid: &str| pod(uid).label("workload-type", "gpu-ci");
        let pods = pods([
            ci("ok"),
            ci("sys").ns("kube-system"),
            ci("crit").priority(2_000_000_000),
            ci("node-crit").priority(2_000_001_000),
            ci("ds").owner("DaemonSet"),
            ci("mirror").mirror(),
            ci("mirror-ann").annotation("kubernetes.io/config.mirror", "abc"),
            ci("node-owned").owner("Node"),
            ci("never").annotation("gpu-warden.io/evict", "never"),
            ci("never-caps").annotation("gpu-warden.io/evict", " Never "),
            ci("evict-yes").annotation("gpu-warden.io/evict", "always"),
            pod("unlabelled"),
            ci("dying").terminating(),
            ci("refused"),
            ci("no-use"),
        ]);
        let mut procs: Vec<_> = pods
            .keys()
            .filter(|u| *u != "no-use")
            .map(|u| proc_in(u, 0, 100))
            .collect();
        procs.push(proc_unknown_mem("no-use", 0));
        procs.push(proc_in("ghost", 0, 100));
        procs.push(host_proc(1, 0, 300));
        procs.push(proc_in("ok", 1, 999)); // another GPU: ignored
        let refused = HashMap::from([("refused".to_string(), "429 PDB".to_string())]);
        let r = rank(&policy, 0, &procs, &pods, &refused);
        assert_eq!(uids(&r), vec!["evict-yes", "ok"]);
        assert_eq!(r.other_bytes, 300 * MIB);
        let mut got = excluded(&r);
        got.sort_by_key(|(u, _)| *u);
        let pc = |p| Exclusion::PriorityCeiling {
            priority: p,
            ceiling: 2_000_000_000,
        };
        let want: Vec<(&str, Exclusion)> = vec![
            ("crit", pc(2_000_000_000)),
            ("ds", Exclusion::DaemonSet),
            ("dying", Exclusion::Terminating),
            ("ghost", Exclusion::UnknownPod),
            ("mirror", Exclusion::StaticPod),
            ("mirror-ann", Exclusion::StaticPod),
            ("never", Exclusion::EvictNever),
            ("never-caps", Exclusion::EvictNever),
            ("no-use", Exclusion::NoMemoryUse),
            ("node-crit", pc(2_000_001_000)),
            ("node-owned", Exclusion::StaticPod),
            (
                "refused",
                Exclusion::RecentlyRefused {
                    detail: "429 PDB".into(),
                },
            ),
            ("sys", Exclusion::ExcludedNamespace),
            ("unlabelled", Exclusion::SelectorMismatch),
        ];
        let want: Vec<(&str, &Exclusion)> = want.iter().map(|(u, e)| (*u, e)).collect();
        assert_eq!(got, want);
        // Each reason has words for /state and logs.
        for e in &r.excluded {
            assert!(!e.exclusion.to_string().is_empty());
        }
        let json = serde_json::to_value(&r.excluded[0]).unwrap();
        assert!(json["exclusion"]["reason"].is_string());
    }

    #[test]
    fn without_a_selector_unlabelled_pods_are_eligible() {
        let pods = pods([pod("a")]);
        let r = rank(
            &Policy::default(),
            0,
            &[proc_in("a", 0, 10)],
            &pods,
            &HashMap::new(),
        );
        assert_eq!(uids(&r), vec!["a"]);
        assert!(r.candidates[0]
            .reason
            .contains("the only eligible pod on GPU 0"));
    }

    #[test]
    fn use_sums_a_pods_processes_on_this_gpu_only() {
        let pods = pods([pod("a")]);
        let procs = [
            proc_pid(10, "a", 0, 100),
            proc_pid(11, "a", 0, 250),
            proc_pid(12, "a", 1, 4000),
        ];
        let r = rank(&Policy::default(), 0, &procs, &pods, &HashMap::new());
        assert_eq!(r.candidates[0].use_bytes, 350 * MIB);
        assert_eq!(r.candidates[0].pids, vec![10, 11]);
        assert_eq!(r.candidates[0].containers, vec!["main".to_string()]);
    }

    /// Each rank key, and each tie-break, decides on its own.
    #[test]
    fn ranking_keys_table() {
        struct Row {
            name: &'static str,
            pods: Vec<PodBuilder>,
            procs: Vec<(&'static str, u64)>,
            want: Vec<&'static str>,
            reason_of_first: &'static str,
        }
        let rows = vec![
            Row {
                name: "1. over request beats lower priority",
                pods: vec![
                    pod("within").priority(-10).request_mib(8000),
                    pod("over").priority(100).request_mib(1000),
                ],
                procs: vec![("within", 4000), ("over", 2000)],
                want: vec!["over", "within"],
                reason_of_first: "over its request, ahead of pods within theirs",
            },
            Row {
                name: "unset request counts as 0",
                pods: vec![pod("declared").request_mib(4000), pod("undeclared")],
                procs: vec![("declared", 3000), ("undeclared", 1)],
                want: vec!["undeclared", "declared"],
                reason_of_first: "uses 1 MiB, 1 MiB over its request of 0 MiB",
            },
            Row {
                name: "unparsable request counts as 0",
                pods: vec![
                    pod("declared").request_mib(4000),
                    pod("garbled").annotation("gpu-warden.io/vram-request-mib", "4Gi"),
                ],
                procs: vec![("declared", 3000), ("garbled", 3000)],
                want: vec!["garbled", "declared"],
                reason_of_first: "not a whole number of MiB",
            },
            Row {
                name: "2. lower priority first",
                pods: vec![pod("p10").priority(10), pod("p0").priority(0)],
                procs: vec![("p10", 9000), ("p0", 100)],
                want: vec!["p0", "p10"],
                reason_of_first:
                    "priority 0 (lowest on GPU 0); lower priority than the next candidate (10)",
            },
            Row {
                name: "3. larger use above request first",
                pods: vec![
                    pod("small").request_mib(100),
                    pod("big").request_mib(5000),
                    pod("mid"),
                ],
                procs: vec![("small", 2000), ("big", 9000), ("mid", 3000)],
                want: vec!["big", "mid", "small"],
                reason_of_first: "most use above request among equals",
            },
            Row {
                name: "tie: youngest first, unknown age oldest",
                pods: vec![
                    pod("old").created(100),
                    pod("unknown"),
                    pod("young").created(300),
                    pod("middle").created(200),
                ],
                procs: vec![
                    ("old", 500),
                    ("unknown", 500),
                    ("young", 500),
                    ("middle", 500),
                ],
                want: vec!["young", "middle", "old", "unknown"],
                reason_of_first: "youngest of equals",
            },
            Row {
                name: "tie: namespace then name",
                pods: vec![
                    pod("u1").ns("b").name("a"),
                    pod("u2").ns("a").name("z"),
                    pod("u3").ns("a").name("y"),
                ],
                procs: vec![("u1", 500), ("u2", 500), ("u3", 500)],
                want: vec!["u3", "u2", "u1"],
                reason_of_first: "first by namespace/name among equals",
            },
            Row {
                name: "within request: priority still orders",
                pods: vec![
                    pod("a").priority(5).request_mib(9999),
                    pod("b").priority(1).request_mib(9999),
                ],
                procs: vec![("a", 100), ("b", 100)],
                want: vec!["b", "a"],
                reason_of_first: "uses 100 MiB, within its request of 9999 MiB; priority 1",
            },
        ];
        for row in rows {
            let pods = pods(row.pods);
            let procs: Vec<_> = row.procs.iter().map(|(u, m)| proc_in(u, 0, *m)).collect();
            let r = rank(&Policy::default(), 0, &procs, &pods, &HashMap::new());
            assert_eq!(uids(&r), row.want, "{}", row.name);
            let reason = &r.candidates[0].reason;
            assert!(
                reason.contains(row.reason_of_first),
                "{}: {reason:?} lacks {:?}",
                row.name,
                row.reason_of_first
            );
            assert!(
                r.candidates.last().unwrap().reason.contains("last of"),
                "{}",
                row.name
            );
        }
    }

    /// Growth counts in rank key 3 only: a grower goes ahead of a steady pod of the same
    /// class and priority that holds more, never ahead of a lower priority or of a pod over
    /// its request when it is within its own.
    #[test]
    fn growth_orders_equals_and_nothing_else() {
        use crate::guard::growth::Growth;
        use std::time::Duration;
        let grew = |mib: u64| Growth {
            bytes: mib * MIB,
            over: Duration::from_millis(1000),
            ahead: mib * MIB,
            ..Growth::default()
        };
        let growth = HashMap::from([("greedy".to_string(), grew(3300))]);
        let cases: &[(&str, Vec<PodBuilder>, Vec<&str>)] = &[
            (
                "same priority: the grower first",
                vec![pod("greedy"), pod("small")],
                vec!["greedy", "small"],
            ),
            (
                "a lower priority still first",
                vec![pod("greedy").priority(5), pod("small").priority(1)],
                vec!["small", "greedy"],
            ),
            (
                "over its request still first",
                vec![pod("greedy").request_mib(8000), pod("small")],
                vec!["small", "greedy"],
            ),
        ];
        for (what, pods_, want) in cases {
            let pods = pods(pods_.clone());
            let procs = [proc_in("greedy", 0, 3300), proc_in("small", 0, 3500)];
            let r = rank_growing(
                &Policy::default(),
                0,
                &procs,
                &pods,
                &HashMap::new(),
                &growth,
            );
            assert_eq!(uids(&r), *want, "{what}");
            let g = r.candidates.iter().find(|v| v.uid == "greedy").unwrap();
            assert_eq!((g.grew_bytes, g.grew_over_ms), (3300 * MIB, 1000), "{what}");
            assert!(
                g.reason.contains("grew 3.2 GiB in the last 1.0 s"),
                "{what}: {}",
                g.reason
            );
        }
        // Without growth the steady pod, holding more, is first (as before).
        let pods = pods([pod("greedy"), pod("small")]);
        let procs = [proc_in("greedy", 0, 3300), proc_in("small", 0, 3500)];
        let r = rank(&Policy::default(), 0, &procs, &pods, &HashMap::new());
        assert_eq!(uids(&r), ["small", "greedy"]);
    }

    /// A job caught a fraction of a second into its climb has grown less than a steady pod
    /// holds; its rate since the previous poll, over `horizon`, puts it first, and the
    /// Event says so.
    #[test]
    fn a_young_climb_ranks_by_its_rate() {
        use crate::guard::growth::Growth;
        use std::time::Duration;
        let pods = pods([pod("greedy"), pod("small")]);
        let procs = [proc_in("greedy", 0, 1100), proc_in("small", 0, 24_000)];
        // The greedy pod grew 800 MiB over 1.1 s; `ahead_mib` is what its rate adds.
        let ranked = |ahead_mib: u64| {
            let growth = HashMap::from([(
                "greedy".to_string(),
                Growth {
                    bytes: 800 * MIB,
                    over: Duration::from_millis(1100),
                    ahead: ahead_mib * MIB,
                    ..Growth::default()
                },
            )]);
            rank_growing(
                &Policy::default(),
                0,
                &procs,
                &pods,
                &HashMap::new(),
                &growth,
            )
        };
        let r = ranked(40_000);
        assert_eq!(uids(&r), ["greedy", "small"]);
        let g = &r.candidates[0];
        assert!(
            g.reason
                .contains("grew 800 MiB in the last 1.1 s, 7.8 GiB/s since the previous poll"),
            "{}",
            g.reason
        );
        // The same growth with no rate behind it (it stopped climbing): the steady pod,
        // holding far more, is first.
        let r = ranked(800);
        assert_eq!(uids(&r), ["small", "greedy"]);
        assert!(!r.candidates[1].reason.contains("since the previous poll"));
    }

    #[test]
    fn reason_reads_like_the_design_example() {
        let pods = pods([
            pod("a").priority(0).created(200),
            pod("b").priority(0).created(100),
            pod("c").priority(7),
        ]);
        let procs = [
            proc_in("a", 0, 9728),
            proc_in("b", 0, 9728),
            proc_in("c", 0, 9728),
        ];
        let r = rank(&Policy::default(), 0, &procs, &pods, &HashMap::new());
        assert_eq!(
            r.candidates[0].reason,
            "uses 9.5 GiB, 9.5 GiB over its request of 0 MiB; priority 0 (lowest on GPU 0); youngest of equals"
        );
        assert_eq!(uids(&r), vec!["a", "b", "c"]);
    }

    #[test]
    fn ci_job_annotations_are_carried() {
        let pods = pods([pod("a")
            .annotation(CI_JOB_ID_ANNOTATION, "4242")
            .annotation(
                CI_JOB_URL_ANNOTATION,
                "https://gitlab.example/p/-/jobs/4242",
            )]);
        let r = rank(
            &Policy::default(),
            0,
            &[proc_in("a", 0, 10)],
            &pods,
            &HashMap::new(),
        );
        assert_eq!(r.candidates[0].ci_job_id.as_deref(), Some("4242"));
        assert!(r.candidates[0].ci_job_url.is_some());
    }

    #[test]
    fn bytes_format() {
        assert_eq!(fmt_bytes(0), "0 MiB");
        assert_eq!(fmt_bytes(1023 * MIB), "1023 MiB");
        assert_eq!(fmt_bytes(1024 * MIB), "1.0 GiB");
        assert_eq!(fmt_bytes(9728 * MIB), "9.5 GiB");
    }
}
