//! The engine: a fixed-step loop over one node group. Each step, in order: arrivals join the
//! queue; finished jobs and pods the kubelet has killed leave; running jobs progress (the
//! GPU's compute shared by time-slicing) and allocate (a GPU that cannot hold a job's next
//! allocation OOM-kills that job, the one allocating); each node's agent polls — the real
//! guard decides and its victims are stopped, killed or evicted (`kubelet`), and the real
//! annotation planner decides whether to publish (`agent`); then the scheduler places
//! queued jobs (`scheduler`).

use crate::outcome::{percentile, Event, EventKind, Outcome};
use crate::scenario::{PolicyKind, Scenario, SimError, NAMESPACE, PREFIX};
use crate::workload::{draw, Job};
use gpu_warden_extender::config::PolicyFile;
use gpu_warden_extender::core::ExtenderPolicy;
use gpu_warden_extender::learned::LearnedNeeds;
use gpu_warden_extender::ledger::Ledger;
use gpu_warden_extender::nodes::NodeState;
use gpu_warden_extender::wire::PodView;
use gpu_warden_guard::policy::Mode;
use gpu_warden_guard::state::Guard;
use gpu_warden_model::pod::PodInfo;
use gpu_warden_model::vram_request;
use gpu_warden_publish::annotations::{AnnotationConfig, AnnotationPlanner};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Wall time of step 0.
const WALL_ORIGIN_S: u64 = 1_780_000_000;

pub(crate) fn wall(t: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(WALL_ORIGIN_S + t)
}

pub(crate) struct Gpu {
    pub(crate) index: u32,
    pub(crate) uuid: String,
    /// Running attempts, in start order.
    pub(crate) runs: Vec<u64>,
}

pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) gpus: Vec<Gpu>,
    /// Allocatable CPU (millicores) and memory (MiB).
    pub(crate) allocatable: (u64, u64),
    pub(crate) guard: Option<Guard>,
    pub(crate) planner: AnnotationPlanner,
    /// What the extender's node cache holds for it (the last published annotations, read).
    pub(crate) state: Option<Arc<NodeState>>,
}

pub(crate) struct Run {
    pub(crate) job: usize,
    pub(crate) attempt: u32,
    pub(crate) node: usize,
    pub(crate) gpu: usize,
    /// Seconds of progress made (less than wall time when the GPU's compute is shared).
    pub(crate) progress_s: f64,
    pub(crate) used_mib: u64,
    /// The most it held.
    pub(crate) peak_mib: u64,
    /// When the guard decided to evict it.
    pub(crate) evicted_at_s: Option<u64>,
    /// SIGSTOPped or SIGKILLed: no more progress, no more allocations.
    pub(crate) stopped: bool,
    /// When the kubelet's SIGKILL gives its memory back.
    pub(crate) release_at_s: Option<u64>,
    pub(crate) pid: u32,
    pub(crate) info: PodInfo,
    /// The extender's need for it when it was placed (`None`: no extender, or unchecked).
    pub(crate) need_mib: Option<u64>,
    /// Where that need came from, and the placed node's verdict (for the kill causes).
    pub(crate) placed_as: (&'static str, &'static str),
}

pub(crate) struct Queued {
    pub(crate) job: usize,
    pub(crate) attempt: u32,
    pub(crate) queued_s: u64,
    pub(crate) not_before_s: u64,
    pub(crate) backoff_s: u64,
    pub(crate) pod: PodView,
}

pub(crate) fn pod_name(job: &Job, attempt: u32) -> String {
    format!("runner-gpu-job-{}-{attempt}", job.id)
}

pub(crate) fn pod_uid(job: &Job, attempt: u32) -> String {
    let h = gpu_warden_model::ids::fnv64(&["pod", &job.id.to_string(), &attempt.to_string()]);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xffff,
        job.id & 0xffff,
        attempt
    )
}

/// The pod annotation keys the real guard and extender read. The annotations themselves
/// stay string-keyed (they are the pod's Kubernetes metadata), so the keys are made once
/// instead of formatted again for every attempt queued and placed.
struct AnnotationKeys {
    /// `<prefix>/vram-request-mib`, by the library's one key function.
    vram_request: String,
    /// `<prefix>/evict`.
    evict: String,
}

static KEYS: LazyLock<AnnotationKeys> = LazyLock::new(|| AnnotationKeys {
    vram_request: vram_request::key(PREFIX),
    evict: format!("{PREFIX}/evict"),
});

pub(crate) fn annotations_of(job: &Job) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    if let Some(d) = job.declared_mib {
        a.insert(KEYS.vram_request.clone(), d.to_string());
    }
    if job.protected {
        a.insert(KEYS.evict.clone(), "never".to_string());
    }
    a.insert("job.runner.gitlab.com/id".into(), job.id.to_string());
    a
}

pub(crate) fn labels_of(job: &Job) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app".to_string(), "gitlab-ci-job".to_string()),
        (
            "project.runner.gitlab.com/id".to_string(),
            job.project.to_string(),
        ),
    ])
}

/// The pod as kube-scheduler sends it to the extender.
fn pod_view(job: &Job, attempt: u32) -> Result<PodView, SimError> {
    let doc = serde_json::json!({
        "metadata": {
            "name": pod_name(job, attempt),
            "namespace": NAMESPACE,
            "uid": pod_uid(job, attempt),
            "labels": labels_of(job),
            "annotations": annotations_of(job),
        },
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    });
    serde_json::from_value(doc).map_err(|e| SimError(format!("pod view: {e}")))
}

pub(crate) struct Engine<'a> {
    pub(crate) sc: &'a Scenario,
    pub(crate) policy: PolicyKind,
    pub(crate) replicas: u32,
    pub(crate) jobs: Vec<Job>,
    pub(crate) nodes: Vec<Node>,
    pub(crate) runs: BTreeMap<u64, Run>,
    pub(crate) next_run: u64,
    pub(crate) queue: Vec<Queued>,
    pub(crate) ledger: Ledger,
    pub(crate) extender: ExtenderPolicy,
    /// Peaks per project, counted in the agents' histogram buckets (+Inf last).
    pub(crate) peaks: BTreeMap<u32, Vec<u64>>,
    /// What the extender has learned from them.
    pub(crate) learned: LearnedNeeds,
    pub(crate) next_learn_s: u64,
    waits: Vec<u64>,
    used_mib_s: f64,
    finished_after_warmup: usize,
    pub(crate) idle: crate::idle::IdleCount,
    pub(crate) out: Outcome,
}

impl<'a> Engine<'a> {
    pub(crate) fn new(
        sc: &'a Scenario,
        policy: PolicyKind,
        replicas: u32,
    ) -> Result<Self, SimError> {
        let extender = PolicyFile::parse(&sc.extender_policy)
            .and_then(|f| f.policy())
            .map_err(|e| SimError(format!("extender policy: {e}")))?;
        let mut guard_policy = sc.guard_policy.clone();
        guard_policy.mode = Mode::Enforce;
        guard_policy.eviction_grace_period_seconds = sc.eviction_grace_s as i64;
        guard_policy
            .validate()
            .map_err(|e| SimError(format!("guard policy: {e}")))?;
        let annotations = AnnotationConfig {
            prefix: PREFIX.to_string(),
            heartbeat: Duration::from_secs(sc.annotation_heartbeat_s),
            min_interval: Duration::from_secs(sc.annotation_min_interval_s),
            ..AnnotationConfig::default()
        };
        let c = &sc.cluster;
        let nodes = (0..c.small_nodes + c.big_nodes)
            .map(|n| {
                let (kind, count, allocatable) = if n < c.small_nodes {
                    ("g5-xlarge", 1, (3920, 14_800))
                } else {
                    ("g5-12xlarge", c.big_gpus, (47_810, 187_000))
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
                    allocatable,
                    guard: policy.guard().then(|| Guard::new(guard_policy.clone())),
                    planner: AnnotationPlanner::new(annotations.clone()),
                    state: None,
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
                on_decision: sc.on_decision,
                seed: sc.seed,
                replicas,
                jobs: jobs.len(),
                finished: 0,
                oom_killed: 0,
                oom_within_declared: 0,
                oom_undeclared: 0,
                evictions: 0,
                evicted_not_growing: 0,
                evicted_not_growing_within_declared: 0,
                victim_growth_mib: 0,
                oom_causes: BTreeMap::new(),
                jobs_per_gpu_hour: 0.0,
                evictions_per_hour: 0.0,
                wait_p95_s: 0.0,
                utilisation: 0.0,
                idle_replicas: 0.0,
                idle_short_of_room: 0.0,
                idle_counted_taken: 0.0,
                trace: Vec::new(),
            },
            jobs,
            nodes,
            peaks: BTreeMap::new(),
            learned: LearnedNeeds::default(),
            next_learn_s: 0,
            runs: BTreeMap::new(),
            next_run: 0,
            queue: Vec::new(),
            waits: Vec::new(),
            used_mib_s: 0.0,
            finished_after_warmup: 0,
            idle: Default::default(),
        })
    }

    pub(crate) fn event(&mut self, at_s: u64, job: usize, kind: EventKind) {
        let job = self.jobs[job].id;
        self.out.trace.push(Event { at_s, job, kind });
    }

    pub(crate) fn enqueue(&mut self, job: usize, attempt: u32, t: u64) -> Result<(), SimError> {
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

    pub(crate) fn remove_run(&mut self, id: u64) -> Option<Run> {
        let r = self.runs.remove(&id)?;
        self.nodes[r.node].gpus[r.gpu].runs.retain(|x| *x != id);
        let project = self.jobs[r.job].project;
        self.record_peak(project, r.peak_mib);
        // As the extender's pod watch reports a finished or deleted pod (`LedgerFeed::apply`).
        let node = self.nodes[r.node].name.clone();
        self.ledger.depart(
            &format!("{NAMESPACE}/{}", r.info.name.as_str()),
            Some(&node),
            r.info.created_at,
        );
        Some(r)
    }

    /// Finished jobs leave; so do evicted pods once the kubelet's SIGKILL has given their
    /// memory back (their jobs are queued again: GitLab's `retry`).
    fn depart(&mut self, t: u64) -> Result<(), SimError> {
        let ids: Vec<u64> = self.runs.keys().copied().collect();
        for id in ids {
            let Some(r) = self.runs.get(&id) else {
                continue;
            };
            let (job, attempt) = (r.job, r.attempt);
            if let Some(at) = r.release_at_s {
                if t >= at {
                    self.remove_run(id);
                    self.enqueue(job, attempt + 1, t)?;
                }
            } else if r.progress_s >= self.jobs[job].duration_s {
                self.remove_run(id);
                self.out.finished += 1;
                if t >= self.sc.warmup_s {
                    self.finished_after_warmup += 1;
                }
                self.event(t, job, EventKind::Finished);
            }
        }
        Ok(())
    }

    /// Jobs progress at their GPU's shared pace and allocate toward their peak (a workspace
    /// that comes and goes is freed and allocated again); an
    /// allocation the GPU cannot hold kills the job making it (CUDA's out-of-memory error
    /// reaches the allocating process, not the largest one), in start order within the
    /// step. An evicted job still running (the kubelet's grace) allocates too; if its own
    /// allocation fails it dies early, already counted as evicted.
    fn grow(&mut self, t: u64) -> Result<(), SimError> {
        let capacity = self.sc.cluster.gpu_total_mib;
        let step = self.sc.step_s as f64;
        for n in 0..self.nodes.len() {
            for g in 0..self.nodes[n].gpus.len() {
                let ids = self.nodes[n].gpus[g].runs.clone();
                let busy: f64 = ids
                    .iter()
                    .filter(|i| !self.runs[i].stopped)
                    .map(|i| self.jobs[self.runs[i].job].busy)
                    .sum();
                let pace = if busy > 1.0 { 1.0 / busy } else { 1.0 };
                let mut used: u64 = ids.iter().map(|i| self.runs[i].used_mib).sum();
                for &id in &ids {
                    let Some(r) = self.runs.get_mut(&id) else {
                        continue;
                    };
                    if r.stopped {
                        continue;
                    }
                    r.progress_s += step * pace;
                    let job = &self.jobs[r.job];
                    let want = job.used_mib_at(r.progress_s).min(job.peak_mib);
                    if want <= r.used_mib {
                        // A workspace freed: the room is the neighbours' until it comes back.
                        used -= r.used_mib - want;
                        r.used_mib = want;
                        continue;
                    }
                    let delta = want - r.used_mib;
                    if used + delta <= capacity {
                        used += delta;
                        r.used_mib = want;
                        r.peak_mib = r.peak_mib.max(want);
                        if r.evicted_at_s.is_some() {
                            self.out.victim_growth_mib += delta;
                        }
                        continue;
                    }
                    used -= r.used_mib;
                    let (j, attempt, evicted) = (r.job, r.attempt, r.evicted_at_s.is_some());
                    if !evicted {
                        let cause =
                            format!("{}, hour {}", self.kill_cause(id, want, &ids), t / 3600 + 1);
                        *self.out.oom_causes.entry(cause).or_default() += 1;
                    }
                    self.remove_run(id);
                    if evicted {
                        self.enqueue(j, attempt + 1, t)?;
                        continue;
                    }
                    let job = &self.jobs[j];
                    if job.declared_mib.is_some_and(|d| d >= job.peak_mib) {
                        self.out.oom_within_declared += 1;
                    }
                    if job.declared_mib.is_none() {
                        self.out.oom_undeclared += 1;
                    }
                    self.out.oom_killed += 1;
                    self.event(t, j, EventKind::OomKilled);
                }
            }
        }
        Ok(())
    }

    /// Why run `id`'s allocation to `want` MiB found no room, for the kill causes: it grew
    /// past the need it was placed on; a neighbour on the GPU had; or every pod there was
    /// within the need it was placed on and the needs together passed the GPU.
    fn kill_cause(&self, id: u64, want: u64, on_gpu: &[u64]) -> String {
        let r = &self.runs[&id];
        let (source, verdict) = r.placed_as;
        match r.need_mib {
            None => return format!("unchecked ({source}, {verdict})"),
            Some(n) if want > n => return format!("grew past its need ({source})"),
            _ => {}
        }
        let over: Vec<&Run> = on_gpu
            .iter()
            .filter(|i| **i != id)
            .filter_map(|i| self.runs.get(i))
            .filter(|o| o.need_mib.is_none_or(|n| o.used_mib > n))
            .collect();
        if let Some(o) = over.first() {
            let stopped = if o.stopped { ", stopped" } else { "" };
            return format!("a neighbour past its need ({}{stopped})", o.placed_as.0);
        }
        let needs: u64 = on_gpu
            .iter()
            .filter_map(|i| self.runs.get(i))
            .map(|o| o.need_mib.unwrap_or(0).max(o.used_mib))
            .sum();
        if needs > self.sc.cluster.gpu_total_mib {
            format!("within needs, needs past the GPU (placed: {verdict})")
        } else {
            format!("within needs, needs fit (placed: {verdict})")
        }
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
            self.grow(t)?;
            self.agents(t);
            self.learn(t);
            self.schedule(t);
            self.count_idle(t);
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
        self.out.wait_p95_s = percentile(&self.waits, 0.95);
        let gpus = self.sc.cluster.gpus() as f64;
        let measured_h = (t.saturating_sub(self.sc.warmup_s)) as f64 / 3600.0;
        self.out.jobs_per_gpu_hour =
            self.finished_after_warmup as f64 / (gpus * measured_h).max(1e-9);
        self.out.evictions_per_hour = self.out.evictions as f64 / (t as f64 / 3600.0).max(1e-9);
        let available = (self.sc.cluster.gpus() as u64 * self.sc.cluster.gpu_total_mib * t) as f64;
        self.out.utilisation = self.used_mib_s / available.max(1.0);
        self.out.idle_replicas = self.idle.share();
        self.out.idle_short_of_room = self.idle.short_of_room_share();
        self.out.idle_counted_taken = self.idle.counted_taken_share();
        Ok(self.out)
    }

    pub(crate) fn record_wait(&mut self, w: u64) {
        self.waits.push(w);
    }
}

/// Distinct jobs evicted at least once.
pub fn jobs_evicted(o: &Outcome) -> usize {
    o.trace
        .iter()
        .filter(|e| e.kind == EventKind::Evicted)
        .map(|e| e.job)
        .collect::<BTreeSet<u64>>()
        .len()
}

/// Runs one policy at one `replicas` setting.
pub fn simulate(sc: &Scenario, policy: PolicyKind, replicas: u32) -> Result<Outcome, SimError> {
    if replicas == 0 {
        return Err(SimError("replicas must be at least 1".into()));
    }
    Engine::new(sc, policy, replicas)?.run()
}
