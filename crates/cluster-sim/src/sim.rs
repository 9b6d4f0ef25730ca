//! The engine: a fixed-step discrete-event loop over one node group. Each step, in order:
//! arrivals join the queue; finished jobs and evicted pods leave; running jobs grow (a GPU
//! that cannot hold a job's next allocation OOM-kills that job, the one allocating); each
//! node's agent polls — the real `guard::state::Guard` decides and its victims are evicted,
//! and the real annotation writer publishes what the extender reads; then the scheduler
//! places queued jobs, asking the real extender core when the policy has one.

use crate::workload::{draw, Job, WorkloadModel};
use gpu_warden::extender::config::PolicyFile;
use gpu_warden::extender::core::{
    evaluate, filter_result, prioritize_result, reservation_for, Candidates, ExtenderPolicy,
};
use gpu_warden::extender::ledger::Ledger;
use gpu_warden::extender::wire::PodView;
use gpu_warden::guard::decision::EvictionOutcome;
use gpu_warden::guard::policy::{Mode, Policy};
use gpu_warden::guard::state::Guard;
use gpu_warden::model::pod::{ContainerInfo, PodInfo, PodMap};
use gpu_warden::model::replicas::{Allocations, GpuReplicas, ReplicaView};
use gpu_warden::model::snapshot::{
    GpuHealth, GpuIdentity, GpuSample, MemoryInfo, Owner, PodRef, ProcessSample, Snapshot, MIB,
};
use gpu_warden::publish::annotations::annotation_values_with;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The namespace the runner creates job pods in.
pub const NAMESPACE: &str = "gitlab-runner";
/// The annotation prefix (agents, guard and extender agree on it).
pub const PREFIX: &str = "gpu-warden.io";
/// The extender policy of the default run: the documented defaults plus a per-runner
/// default need for jobs that declare nothing.
pub const EXTENDER_POLICY: &str = "defaults:\n  - {namespace: gitlab-runner, mib: 4096}\n";
/// The scheduler's extender weight in deploy/components/scheduler (the extender's 0..10
/// score is scaled by 10 and by this weight before it is added to the plugins' 0..100).
pub const EXTENDER_WEIGHT: i64 = 5;
/// Wall time of step 0.
const WALL_ORIGIN_S: u64 = 1_780_000_000;

/// Which components place and protect the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PolicyKind {
    /// kube-scheduler and NVIDIA's device plugin alone.
    DevicePlugin,
    /// Plus gpu-warden's guard (enforce mode).
    Guard,
    /// Plus the extender filtering and scoring nodes.
    ExtenderGuard,
}

impl PolicyKind {
    /// All three, in report order.
    pub const ALL: [PolicyKind; 3] = [
        PolicyKind::DevicePlugin,
        PolicyKind::Guard,
        PolicyKind::ExtenderGuard,
    ];

    /// Label in the report.
    pub fn label(self) -> &'static str {
        match self {
            PolicyKind::DevicePlugin => "device plugin",
            PolicyKind::Guard => "+ guard",
            PolicyKind::ExtenderGuard => "+ extender + guard",
        }
    }

    /// Short name for the CSV.
    pub fn key(self) -> &'static str {
        match self {
            PolicyKind::DevicePlugin => "device-plugin",
            PolicyKind::Guard => "guard",
            PolicyKind::ExtenderGuard => "extender-guard",
        }
    }

    fn guard(self) -> bool {
        self != PolicyKind::DevicePlugin
    }

    fn extender(self) -> bool {
        self == PolicyKind::ExtenderGuard
    }
}

/// The node group.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// Nodes with one GPU (g5.xlarge).
    pub small_nodes: usize,
    /// Nodes with `big_gpus` GPUs (g5.12xlarge).
    pub big_nodes: usize,
    /// GPUs per big node.
    pub big_gpus: u32,
    /// Framebuffer of one GPU, MiB (an A10G reports 23028).
    pub gpu_total_mib: u64,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            small_nodes: 50,
            big_nodes: 10,
            big_gpus: 4,
            gpu_total_mib: 23028,
        }
    }
}

impl Cluster {
    /// GPUs in the group.
    pub fn gpus(&self) -> usize {
        self.small_nodes + self.big_nodes * self.big_gpus as usize
    }
}

/// Everything one run depends on.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The seed of the job stream and of the scheduler's tie-breaks.
    pub seed: u64,
    /// The node group.
    pub cluster: Cluster,
    /// The job stream's shape.
    pub workload: WorkloadModel,
    /// Simulated time, seconds (jobs arrive throughout).
    pub horizon_s: u64,
    /// Step, seconds (also the agents' poll and publish interval).
    pub step_s: u64,
    /// Seconds an evicted pod keeps its memory (the eviction's grace period).
    pub eviction_grace_s: u64,
    /// Most pods the scheduler tries per step (kube-scheduler is not infinitely fast).
    pub attempts_per_step: usize,
    /// The extender's policy file (YAML, as `--config` reads it).
    pub extender_policy: String,
    /// The guard's policy (mode is forced to enforce).
    pub guard_policy: Policy,
    /// Jobs to serve instead of drawing them from `workload` (tests).
    pub jobs: Option<Vec<Job>>,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            seed: 1,
            cluster: Cluster::default(),
            workload: WorkloadModel::default(),
            horizon_s: 4 * 3600,
            step_s: 2,
            eviction_grace_s: 4,
            attempts_per_step: 64,
            extender_policy: EXTENDER_POLICY.to_string(),
            guard_policy: Policy::default(),
            jobs: None,
        }
    }
}

/// Why the simulation cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError(pub String);

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SimError {}

/// What happened to one job attempt (kept for tests and for tracing a run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Placed on (node, GPU index).
    Started(usize, u32),
    /// Ran to completion.
    Finished,
    /// Killed by a CUDA out-of-memory error.
    OomKilled,
    /// Evicted by the guard (it is queued again).
    Evicted,
}

/// One event of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Seconds since the start.
    pub at_s: u64,
    /// The job.
    pub job: u64,
    /// What happened.
    pub kind: EventKind,
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The policy.
    pub policy: PolicyKind,
    /// Time-slicing replicas per GPU.
    pub replicas: u32,
    /// Jobs submitted.
    pub jobs: usize,
    /// Jobs that ran to completion.
    pub finished: usize,
    /// Jobs killed by GPU OOM (each fails; it is not retried).
    pub oom_killed: usize,
    /// Of those, the jobs killed by their first allocation (no guard can act before it).
    pub oom_at_start: usize,
    /// Of those, the jobs whose declaration covered their peak (the extender could know).
    pub oom_declared_enough: usize,
    /// Evictions (each retried: the job is queued again).
    pub evictions: usize,
    /// Distinct jobs evicted at least once.
    pub jobs_evicted: usize,
    /// GiB-hours used / GiB-hours available.
    pub utilisation: f64,
    /// Queue wait of every attempt, seconds (attempts still queued at the end count with
    /// the wait so far), p50.
    pub wait_p50_s: f64,
    /// The same, p99.
    pub wait_p99_s: f64,
    /// Every event, in order.
    pub trace: Vec<Event>,
}

impl Outcome {
    /// OOM kills as a share of submitted jobs.
    pub fn oom_share(&self) -> f64 {
        self.oom_killed as f64 / (self.jobs.max(1)) as f64
    }
}

struct Gpu {
    index: u32,
    uuid: String,
    /// Running attempts, in start order.
    runs: Vec<u64>,
}

struct Node {
    name: String,
    gpus: Vec<Gpu>,
    guard: Option<Guard>,
    annotations: Option<BTreeMap<String, String>>,
}

struct Run {
    job: usize,
    attempt: u32,
    node: usize,
    gpu: usize,
    started_s: u64,
    used_mib: u64,
    evicted_at_s: Option<u64>,
    pid: u32,
    info: PodInfo,
}

struct Queued {
    job: usize,
    attempt: u32,
    queued_s: u64,
    not_before_s: u64,
    backoff_s: u64,
    pod: PodView,
}

fn pod_name(job: &Job, attempt: u32) -> String {
    format!("runner-gpu-job-{}-{attempt}", job.id)
}

fn pod_uid(job: &Job, attempt: u32) -> String {
    let h = gpu_warden::model::ids::fnv64(&["pod", &job.id.to_string(), &attempt.to_string()]);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xffff,
        job.id & 0xffff,
        attempt
    )
}

fn annotations_of(job: &Job) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    if let Some(d) = job.declared_mib {
        a.insert(format!("{PREFIX}/vram-request-mib"), d.to_string());
    }
    if job.protected {
        a.insert(format!("{PREFIX}/evict"), "never".to_string());
    }
    a.insert("job.runner.gitlab.com/id".into(), job.id.to_string());
    a
}

/// The pod as kube-scheduler sends it to the extender.
fn pod_view(job: &Job, attempt: u32) -> Result<PodView, SimError> {
    let doc = serde_json::json!({
        "metadata": {
            "name": pod_name(job, attempt),
            "namespace": NAMESPACE,
            "uid": pod_uid(job, attempt),
            "labels": {"app": "gitlab-ci-job"},
            "annotations": annotations_of(job),
        },
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    });
    serde_json::from_value(doc).map_err(|e| SimError(format!("pod view: {e}")))
}

fn wall(t: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(WALL_ORIGIN_S + t)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

struct Engine<'a> {
    sc: &'a Scenario,
    policy: PolicyKind,
    replicas: u32,
    jobs: Vec<Job>,
    nodes: Vec<Node>,
    runs: BTreeMap<u64, Run>,
    next_run: u64,
    queue: Vec<Queued>,
    ledger: Ledger,
    extender: ExtenderPolicy,
    waits: Vec<u64>,
    used_mib_s: f64,
    out: Outcome,
}

impl<'a> Engine<'a> {
    fn new(sc: &'a Scenario, policy: PolicyKind, replicas: u32) -> Result<Self, SimError> {
        let extender = PolicyFile::parse(&sc.extender_policy)
            .and_then(|f| f.policy())
            .map_err(|e| SimError(format!("extender policy: {e}")))?;
        let mut guard_policy = sc.guard_policy.clone();
        guard_policy.mode = Mode::Enforce;
        guard_policy
            .validate()
            .map_err(|e| SimError(format!("guard policy: {e}")))?;
        let c = &sc.cluster;
        let nodes = (0..c.small_nodes + c.big_nodes)
            .map(|n| {
                let (kind, count) = if n < c.small_nodes {
                    ("g5-xlarge", 1)
                } else {
                    ("g5-12xlarge", c.big_gpus)
                };
                Node {
                    name: format!("ip-10-0-{}-{}.{kind}", n / 250, n % 250),
                    gpus: (0..count)
                        .map(|i| Gpu {
                            index: i,
                            uuid: format!("GPU-{:08x}-0000-4000-8000-{:012x}", n, i),
                            runs: Vec::new(),
                        })
                        .collect(),
                    guard: policy.guard().then(|| Guard::new(guard_policy.clone())),
                    annotations: None,
                }
            })
            .collect();
        let jobs = match &sc.jobs {
            Some(j) => j.clone(),
            None => draw(&sc.workload, sc.seed, sc.horizon_s as f64),
        };
        Ok(Engine {
            sc,
            policy,
            replicas,
            ledger: Ledger::new(extender.ledger_ttl),
            extender,
            out: Outcome {
                policy,
                replicas,
                jobs: jobs.len(),
                finished: 0,
                oom_killed: 0,
                oom_at_start: 0,
                oom_declared_enough: 0,
                evictions: 0,
                jobs_evicted: 0,
                utilisation: 0.0,
                wait_p50_s: 0.0,
                wait_p99_s: 0.0,
                trace: Vec::new(),
            },
            jobs,
            nodes,
            runs: BTreeMap::new(),
            next_run: 0,
            queue: Vec::new(),
            waits: Vec::new(),
            used_mib_s: 0.0,
        })
    }

    fn event(&mut self, at_s: u64, job: usize, kind: EventKind) {
        let job = self.jobs[job].id;
        self.out.trace.push(Event { at_s, job, kind });
    }

    fn enqueue(&mut self, job: usize, attempt: u32, t: u64) -> Result<(), SimError> {
        let pod = pod_view(&self.jobs[job], attempt)?;
        self.queue.push(Queued {
            job,
            attempt,
            queued_s: t,
            not_before_s: t,
            backoff_s: 1,
            pod,
        });
        Ok(())
    }

    fn remove_run(&mut self, id: u64) -> Option<Run> {
        let r = self.runs.remove(&id)?;
        self.nodes[r.node].gpus[r.gpu].runs.retain(|x| *x != id);
        self.ledger
            .forget(&format!("{NAMESPACE}/{}", r.info.name.as_str()));
        Some(r)
    }

    fn depart(&mut self, t: u64) -> Result<(), SimError> {
        let ids: Vec<u64> = self.runs.keys().copied().collect();
        for id in ids {
            let Some(r) = self.runs.get(&id) else {
                continue;
            };
            let (job, attempt) = (r.job, r.attempt);
            if let Some(at) = r.evicted_at_s {
                if t >= at + self.sc.eviction_grace_s {
                    self.remove_run(id);
                    self.enqueue(job, attempt + 1, t)?;
                }
            } else if t as f64 >= r.started_s as f64 + self.jobs[job].duration_s {
                self.remove_run(id);
                self.out.finished += 1;
                self.event(t, job, EventKind::Finished);
            }
        }
        Ok(())
    }

    /// Jobs allocate toward their peak; an allocation the GPU cannot hold kills the job
    /// making it (CUDA's out-of-memory error reaches the allocating process, not the
    /// largest one), in start order within the step.
    fn grow(&mut self, t: u64) {
        let capacity = self.sc.cluster.gpu_total_mib;
        for n in 0..self.nodes.len() {
            for g in 0..self.nodes[n].gpus.len() {
                let ids = self.nodes[n].gpus[g].runs.clone();
                let mut used: u64 = ids.iter().map(|i| self.runs[i].used_mib).sum();
                for id in ids {
                    let r = &self.runs[&id];
                    if r.evicted_at_s.is_some() {
                        continue;
                    }
                    let job = &self.jobs[r.job];
                    let want = job.used_mib_at((t - r.started_s) as f64, &self.sc.workload);
                    if want <= r.used_mib {
                        continue;
                    }
                    let delta = want - r.used_mib;
                    if used + delta > capacity {
                        used -= r.used_mib;
                        if r.used_mib == 0 {
                            self.out.oom_at_start += 1;
                        }
                        if job.declared_mib.is_some_and(|d| d >= job.peak_mib) {
                            self.out.oom_declared_enough += 1;
                        }
                        let job = r.job;
                        self.remove_run(id);
                        self.out.oom_killed += 1;
                        self.event(t, job, EventKind::OomKilled);
                    } else {
                        used += delta;
                        if let Some(r) = self.runs.get_mut(&id) {
                            r.used_mib = want;
                        }
                    }
                }
            }
        }
    }

    fn snapshot(&self, n: usize, t: u64) -> Snapshot {
        let node = &self.nodes[n];
        let total = self.sc.cluster.gpu_total_mib;
        let mut processes = Vec::new();
        let gpus = node
            .gpus
            .iter()
            .map(|g| {
                let used: u64 = g.runs.iter().map(|i| self.runs[i].used_mib).sum();
                for i in &g.runs {
                    let r = &self.runs[i];
                    processes.push(ProcessSample {
                        pid: r.pid,
                        gpu: g.index,
                        used_bytes: Some(r.used_mib * MIB),
                        sm_util: None,
                        name: "python3".into(),
                        owner: Owner::Pod(PodRef {
                            namespace: NAMESPACE.into(),
                            pod: r.info.name.clone(),
                            container: "build".into(),
                            uid: r.info.uid.clone(),
                        }),
                    });
                }
                let mut s = GpuSample::empty(
                    GpuIdentity {
                        index: g.index,
                        uuid: g.uuid.clone(),
                        pci_bus_id: format!("00000000:{:02x}:00.0", g.index + 0x1e),
                        device: format!("nvidia{}", g.index),
                        model: "NVIDIA A10G".into(),
                    },
                    GpuHealth::Ok,
                );
                s.memory = Some(MemoryInfo {
                    total: total * MIB,
                    used: used.min(total) * MIB,
                    free: total.saturating_sub(used) * MIB,
                    reserved: 0,
                });
                s
            })
            .collect();
        Snapshot {
            seq: t / self.sc.step_s + 1,
            at: Duration::from_secs(t),
            wall: wall(t),
            driver_version: "570.172.08".into(),
            gpus,
            processes,
            errors: vec![],
        }
    }

    fn replica_view(&self, n: usize) -> ReplicaView {
        let mut v = ReplicaView::default();
        for g in &self.nodes[n].gpus {
            let mut pods = BTreeSet::new();
            let mut declared = 0;
            for i in &g.runs {
                let r = &self.runs[i];
                let key = (NAMESPACE.to_string(), r.info.name.clone());
                v.allocations
                    .pod_gpus
                    .entry(key.clone())
                    .or_default()
                    .insert(g.uuid.clone());
                pods.insert(key);
                declared += self.jobs[r.job].declared_mib.unwrap_or(0);
            }
            v.allocations.gpus.insert(
                g.uuid.clone(),
                GpuReplicas {
                    allocatable: self.replicas,
                    allocated: g.runs.len() as u32,
                    pods,
                },
            );
            v.declared_mib.insert(g.uuid.clone(), declared);
        }
        v
    }

    /// Each node's agent: one full poll into the real guard (its decisions carried out as
    /// the enforcer does: candidates in order until the decision is done), then the real
    /// annotation values from the same poll, the guard's pressure and the kubelet's figures.
    fn agents(&mut self, t: u64) {
        if !self.policy.guard() && !self.policy.extender() {
            return;
        }
        let now = Duration::from_secs(t);
        for n in 0..self.nodes.len() {
            let snap = Arc::new(self.snapshot(n, t));
            let mut pressure = BTreeMap::new();
            if self.nodes[n].guard.is_some() {
                let pods: PodMap = self.nodes[n]
                    .gpus
                    .iter()
                    .flat_map(|g| g.runs.iter())
                    .map(|i| (self.runs[i].info.uid.clone(), self.runs[i].info.clone()))
                    .collect();
                let pods = Arc::new(pods);
                let decisions = match self.nodes[n].guard.as_mut() {
                    Some(g) => g.observe(&snap, &pods, now),
                    None => Vec::new(),
                };
                for d in decisions {
                    let mut evicted: Vec<String> = Vec::new();
                    for v in &d.candidates {
                        let done = {
                            let uids: Vec<&str> = evicted.iter().map(String::as_str).collect();
                            d.done(&uids)
                        };
                        if done {
                            break;
                        }
                        let found = self
                            .runs
                            .iter()
                            .find(|(_, r)| r.info.uid == v.uid && r.node == n)
                            .map(|(id, _)| *id);
                        let outcome = match found {
                            Some(id) => {
                                let Some(r) = self.runs.get_mut(&id) else {
                                    continue;
                                };
                                r.evicted_at_s = Some(t);
                                r.info.terminating = true;
                                let job = r.job;
                                self.out.evictions += 1;
                                self.event(t, job, EventKind::Evicted);
                                EvictionOutcome::Evicted
                            }
                            None => EvictionOutcome::AlreadyGone,
                        };
                        evicted.push(v.uid.clone());
                        if let Some(g) = self.nodes[n].guard.as_mut() {
                            g.record_outcome(d.id, &v.uid, outcome, now);
                        }
                    }
                }
                if let Some(g) = self.nodes[n].guard.as_ref() {
                    for gpu in &self.nodes[n].gpus {
                        pressure.insert(gpu.index, g.pressure(gpu.index));
                    }
                }
            }
            if self.policy.extender() {
                let view = self.replica_view(n);
                let values = annotation_values_with(&snap, &pressure, Some(&view), 256);
                self.nodes[n].annotations = Some(values.to_annotations(PREFIX));
            }
        }
    }

    fn allocated(&self, n: usize) -> usize {
        self.nodes[n].gpus.iter().map(|g| g.runs.len()).sum()
    }

    fn has_replica(&self, n: usize) -> bool {
        self.allocated(n) < self.nodes[n].gpus.len() * self.replicas as usize
    }

    /// kube-scheduler's own score for a node (0..100): least allocated, by the share of
    /// replicas free, plus a seeded tie-break below one point.
    fn base_score(&self, n: usize, q: &Queued) -> f64 {
        let cap = (self.nodes[n].gpus.len() * self.replicas as usize) as f64;
        let free = cap - self.allocated(n) as f64;
        let h = gpu_warden::model::ids::fnv64(&[
            &self.sc.seed.to_string(),
            &self.jobs[q.job].id.to_string(),
            &q.attempt.to_string(),
            &self.nodes[n].name,
        ]);
        (100.0 * free / cap).floor() + (h >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The GPU the device plugin hands out, by its own rule (fewest allocated, lowest index).
    fn device_plugin_gpu(&self, n: usize) -> Option<usize> {
        let mut a = Allocations::default();
        for g in &self.nodes[n].gpus {
            a.gpus.insert(
                g.uuid.clone(),
                GpuReplicas {
                    allocatable: self.replicas,
                    allocated: g.runs.len() as u32,
                    pods: BTreeSet::new(),
                },
            );
        }
        let gpus = &self.nodes[n].gpus;
        let uuid = a.next_gpu(|u| gpus.iter().find(|g| g.uuid == u).map(|g| g.index))?;
        gpus.iter().position(|g| g.uuid == uuid)
    }

    fn choose(&mut self, q: &Queued, t: u64) -> Option<usize> {
        let fit: Vec<usize> = (0..self.nodes.len())
            .filter(|n| self.has_replica(*n))
            .collect();
        if !self.policy.extender() {
            return fit.into_iter().max_by(|a, b| {
                self.base_score(*a, q)
                    .total_cmp(&self.base_score(*b, q))
                    .then(b.cmp(a))
            });
        }
        let candidates: Vec<(String, Option<BTreeMap<String, String>>)> = fit
            .iter()
            .map(|n| {
                (
                    self.nodes[*n].name.clone(),
                    self.nodes[*n].annotations.clone(),
                )
            })
            .collect();
        let names = Candidates::Names(candidates.iter().map(|(n, _)| n.clone()).collect());
        let now = Duration::from_secs(t);
        let e = evaluate(
            &self.extender,
            &q.pod,
            &candidates,
            &mut self.ledger,
            now,
            wall(t),
        );
        let passed: BTreeSet<String> = filter_result(&names, &e)
            .node_names
            .unwrap_or_default()
            .into_iter()
            .collect();
        let scores: BTreeMap<String, i64> = prioritize_result(&self.extender, &e)
            .into_iter()
            .map(|h| (h.host, h.score))
            .collect();
        let total = |n: usize| {
            let ext = scores.get(&self.nodes[n].name).copied().unwrap_or(0);
            self.base_score(n, q) + (ext * 10 * EXTENDER_WEIGHT) as f64
        };
        let pick = fit
            .into_iter()
            .filter(|n| passed.contains(&self.nodes[*n].name))
            .max_by(|a, b| total(*a).total_cmp(&total(*b)).then(b.cmp(a)))?;
        let name = self.nodes[pick].name.clone();
        if let Some(r) = reservation_for(
            &self.extender,
            &q.pod,
            self.nodes[pick].annotations.as_ref(),
            self.ledger.pending(&name),
            now,
            wall(t),
        ) {
            self.ledger.reserve(&name, r);
        }
        Some(pick)
    }

    fn schedule(&mut self, t: u64) {
        let queue = std::mem::take(&mut self.queue);
        let mut attempts = 0;
        let mut kept = Vec::with_capacity(queue.len());
        for mut q in queue {
            let room = (0..self.nodes.len()).any(|n| self.has_replica(n));
            if q.not_before_s > t || attempts >= self.sc.attempts_per_step || !room {
                kept.push(q);
                continue;
            }
            attempts += 1;
            let placed = self
                .choose(&q, t)
                .and_then(|n| self.device_plugin_gpu(n).map(|g| (n, g)));
            let Some((n, g)) = placed else {
                // kube-scheduler's unschedulable backoff: 1 s doubling to 10 s.
                q.not_before_s = t + q.backoff_s;
                q.backoff_s = (q.backoff_s * 2).min(10);
                kept.push(q);
                continue;
            };
            let job = &self.jobs[q.job];
            let info = PodInfo {
                uid: pod_uid(job, q.attempt),
                namespace: NAMESPACE.into(),
                name: pod_name(job, q.attempt),
                priority: 0,
                priority_class: None,
                owner_kind: None,
                is_mirror: false,
                labels: BTreeMap::from([("app".to_string(), "gitlab-ci-job".to_string())]),
                annotations: annotations_of(job),
                created_at: Some(wall(t)),
                terminating: false,
                phase: Some("Running".into()),
                containers: vec![ContainerInfo {
                    name: "build".into(),
                    container_id: Some(format!("{:064x}", self.next_run)),
                }],
            };
            let id = self.next_run;
            self.next_run += 1;
            self.runs.insert(
                id,
                Run {
                    job: q.job,
                    attempt: q.attempt,
                    node: n,
                    gpu: g,
                    started_s: t,
                    used_mib: 0,
                    evicted_at_s: None,
                    pid: 1000 + id as u32,
                    info,
                },
            );
            self.nodes[n].gpus[g].runs.push(id);
            self.waits.push(t - q.queued_s);
            let index = self.nodes[n].gpus[g].index;
            self.event(t, q.job, EventKind::Started(n, index));
        }
        self.queue = kept;
    }

    fn run(mut self) -> Result<Outcome, SimError> {
        let step = self.sc.step_s.max(1);
        let mut next_job = 0;
        let mut t = 0;
        while t < self.sc.horizon_s {
            while next_job < self.jobs.len() && self.jobs[next_job].arrive_s <= t as f64 {
                self.enqueue(next_job, 0, t)?;
                next_job += 1;
            }
            self.depart(t)?;
            self.grow(t);
            self.agents(t);
            self.schedule(t);
            self.ledger.expire(Duration::from_secs(t));
            let used: u64 = self.runs.values().map(|r| r.used_mib).sum();
            self.used_mib_s += (used * step) as f64;
            t += step;
        }
        self.out.jobs = next_job;
        for q in &self.queue {
            self.waits.push(t - q.queued_s);
        }
        self.waits.sort_unstable();
        self.out.wait_p50_s = percentile(&self.waits, 0.50);
        self.out.wait_p99_s = percentile(&self.waits, 0.99);
        let available = (self.sc.cluster.gpus() as u64 * self.sc.cluster.gpu_total_mib * t) as f64;
        self.out.utilisation = self.used_mib_s / available.max(1.0);
        let evicted: BTreeSet<u64> = self
            .out
            .trace
            .iter()
            .filter(|e| e.kind == EventKind::Evicted)
            .map(|e| e.job)
            .collect();
        self.out.jobs_evicted = evicted.len();
        Ok(self.out)
    }
}

/// Runs one policy at one `replicas` setting.
pub fn simulate(sc: &Scenario, policy: PolicyKind, replicas: u32) -> Result<Outcome, SimError> {
    if replicas == 0 {
        return Err(SimError("replicas must be at least 1".into()));
    }
    Engine::new(sc, policy, replicas)?.run()
}
