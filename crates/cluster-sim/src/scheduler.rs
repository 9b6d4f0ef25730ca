//! kube-scheduler and NVIDIA's device plugin, as they decide:
//!
//! - **Filter**: a node fits when its allocatable CPU and memory hold the pod's requests
//!   and it has a free `nvidia.com/gpu` replica (NodeResourcesFit's filter counts extended
//!   resources); with the extender, its `filter_result` then removes nodes.
//! - **Score**: the default profile's NodeResourcesFit (`LeastAllocated`, resources `cpu`
//!   and `memory` at weight 1 each — it does not score `nvidia.com/gpu`) plus
//!   NodeResourcesBalancedAllocation (cpu and memory), each 0..100 at plugin weight 1
//!   (kubernetes pkg/scheduler/framework/plugins/noderesources: least_allocated.go,
//!   balanced_allocation.go; apis/config/v1/default_plugins.go). The other default plugins
//!   score these identical nodes alike. The extender's 0..10 is added × 10 × its weight
//!   (pkg/scheduler/schedule_one.go, prioritizeNodes). Ties go to a seeded random pick among
//!   the best (selectHost's reservoir sampling).
//! - **The device plugin** hands out a replica of the GPU with the fewest allocated, ties to
//!   the lower index (`model::replicas::Allocations::next_gpu`).
//! - **The queue**: FIFO; a pod no node takes waits kube-scheduler's backoff (1 s doubling
//!   to 10 s).

use crate::engine::{annotations_of, labels_of, pod_name, pod_uid, wall, Engine, Queued, Run};
use crate::outcome::EventKind;
use crate::scenario::{EXTENDER_WEIGHT, NAMESPACE};
use gpu_warden_extender::core::{
    evaluate, filter_result, prioritize_result, reservation_for, Candidates, Judged,
};
use gpu_warden_extender::need::NeedSource;
use gpu_warden_model::pod::{ContainerInfo, PodInfo};
use gpu_warden_model::replicas::{Allocations, GpuReplicas};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Where the scheduler put a pod, and what the extender judged it on.
struct Placed {
    node: usize,
    need_mib: Option<u64>,
    placed_as: (&'static str, &'static str),
}

impl Engine<'_> {
    fn allocated(&self, n: usize) -> usize {
        self.nodes[n].gpus.iter().map(|g| g.runs.len()).sum()
    }

    /// CPU (millicores) and memory (MiB) requested on node `n`.
    fn requested(&self, n: usize) -> (u64, u64) {
        let k = self.allocated(n) as u64;
        (k * self.sc.pod_request.0, k * self.sc.pod_request.1)
    }

    fn fits(&self, n: usize) -> bool {
        let (cpu, mem) = self.requested(n);
        let (c, m) = self.nodes[n].allocatable;
        let (pc, pm) = self.sc.pod_request;
        self.allocated(n) < self.nodes[n].gpus.len() * self.replicas as usize
            && cpu + pc <= c
            && mem + pm <= m
    }

    /// NodeResourcesFit (LeastAllocated) + NodeResourcesBalancedAllocation for the pod.
    fn default_score(&self, n: usize) -> i64 {
        let (cpu, mem) = self.requested(n);
        let (c, m) = self.nodes[n].allocatable;
        let (pc, pm) = self.sc.pod_request;
        let (cpu, mem) = (cpu + pc, mem + pm);
        // leastRequestedScore: (capacity - requested) * MaxNodeScore / capacity, integers.
        let least = |req: u64, cap: u64| ((cap.saturating_sub(req)) * 100 / cap.max(1)) as i64;
        let fit = (least(cpu, c) + least(mem, m)) / 2;
        // balancedResourceScorer with two resources: (1 - |f1 - f2| / 2) * MaxNodeScore.
        let (fc, fm) = (cpu as f64 / c as f64, mem as f64 / m as f64);
        let balanced = ((1.0 - (fc.min(1.0) - fm.min(1.0)).abs() / 2.0) * 100.0) as i64;
        fit + balanced
    }

    /// A seeded random number for the tie-break among equal scores.
    fn tie(&self, n: usize, q: &Queued) -> u64 {
        gpu_warden_model::ids::fnv64(&[
            &self.sc.seed.to_string(),
            &self.jobs[q.job].id.to_string(),
            &q.attempt.to_string(),
            &self.nodes[n].name,
        ])
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

    fn choose(&mut self, q: &Queued, t: u64) -> Option<Placed> {
        let mut placed_as: BTreeMap<usize, (Option<u64>, (&'static str, &'static str))> =
            BTreeMap::new();
        let fit: Vec<usize> = (0..self.nodes.len()).filter(|n| self.fits(*n)).collect();
        let mut ext: BTreeMap<usize, i64> = BTreeMap::new();
        let mut allowed: Vec<usize> = fit.clone();
        if self.policy.extender() {
            let names =
                Candidates::Names(fit.iter().map(|n| self.nodes[*n].name.clone()).collect());
            let judged: Vec<Judged<'_>> = fit
                .iter()
                .map(|n| (self.nodes[*n].name.as_str(), self.nodes[*n].state.clone()))
                .collect();
            let now = Duration::from_secs(t);
            let e = evaluate(
                &self.extender,
                &q.pod,
                &self.learned,
                &judged,
                &mut self.ledger,
                now,
                wall(t),
            );
            let passed: BTreeSet<String> = filter_result(&names, &e)
                .node_names
                .unwrap_or_default()
                .into_iter()
                .collect();
            let scores: BTreeMap<&str, i64> = prioritize_result(&self.extender, &judged, &e)
                .into_iter()
                .zip(&fit)
                .map(|(h, n)| (self.nodes[*n].name.as_str(), h.score))
                .collect();
            for n in &fit {
                ext.insert(
                    *n,
                    scores
                        .get(self.nodes[*n].name.as_str())
                        .copied()
                        .unwrap_or(0),
                );
            }
            let source = match e.need.as_ref().map(|n| &n.source) {
                Some(NeedSource::Declared) => "declared",
                Some(NeedSource::Learned(_)) => "learned",
                Some(NeedSource::Default(_)) => "default",
                Some(NeedSource::UnknownReserved) => "unknown-reserved",
                Some(NeedSource::UnknownWholeGpu) => "unknown-whole-gpu",
                Some(NeedSource::UnknownPassed) => "unknown-passed",
                None => "bad-declaration",
            };
            let mib = e.need.as_ref().and_then(|n| n.mib);
            for (n, v) in fit.iter().zip(&e.verdicts) {
                placed_as.insert(*n, (mib, (source, v.reason.as_str())));
            }
            allowed.retain(|n| passed.contains(&self.nodes[*n].name));
        }
        let total = |n: usize| {
            self.default_score(n) + ext.get(&n).copied().unwrap_or(0) * 10 * EXTENDER_WEIGHT
        };
        let pick = allowed
            .into_iter()
            .max_by_key(|n| (total(*n), self.tie(*n, q)))?;
        if self.policy.extender() {
            let name = self.nodes[pick].name.clone();
            let state = self.nodes[pick].state.as_deref();
            let now = Duration::from_secs(t);
            // As the extender's pod watch reserves a binding (`LedgerFeed::apply`).
            if let Some(r) = reservation_for(
                &self.extender,
                &q.pod,
                &self.learned,
                state,
                self.ledger.pending_settled(&name, state, now),
                now,
                wall(t),
            ) {
                self.ledger.reserve(&name, r);
            }
        }
        let (need_mib, placed_as) = placed_as.remove(&pick).unwrap_or((None, ("-", "-")));
        Some(Placed {
            node: pick,
            need_mib,
            placed_as,
        })
    }

    pub(crate) fn schedule(&mut self, t: u64) {
        let queue = std::mem::take(&mut self.queue);
        let mut attempts = 0;
        let mut kept = Vec::with_capacity(queue.len());
        let mut room = (0..self.nodes.len()).any(|n| self.fits(n));
        for mut q in queue {
            if q.not_before_s > t || attempts >= self.sc.attempts_per_step || !room {
                kept.push(q);
                continue;
            }
            attempts += 1;
            let placed = self
                .choose(&q, t)
                .and_then(|p| self.device_plugin_gpu(p.node).map(|g| (p, g)));
            let Some((p, g)) = placed else {
                q.not_before_s = t + q.backoff_s;
                q.backoff_s = (q.backoff_s * 2).min(10);
                kept.push(q);
                continue;
            };
            let n = p.node;
            let job = &self.jobs[q.job];
            let info = PodInfo {
                uid: pod_uid(job, q.attempt),
                namespace: NAMESPACE.into(),
                name: pod_name(job, q.attempt),
                priority: 0,
                priority_class: None,
                owner_kind: None,
                is_mirror: false,
                labels: labels_of(job),
                annotations: annotations_of(job),
                created_at: Some(wall(t)),
                terminating: false,
                phase: Some("Running".into()),
                containers: vec![ContainerInfo {
                    name: "build".into(),
                    container_id: Some(format!("{:064x}", self.next_run)),
                    image: None,
                    gpu: false,
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
                    progress_s: 0.0,
                    used_mib: 0,
                    peak_mib: 0,
                    evicted_at_s: None,
                    stopped: false,
                    release_at_s: None,
                    pid: 1000 + id as u32,
                    info,
                    need_mib: p.need_mib,
                    placed_as: p.placed_as,
                },
            );
            self.nodes[n].gpus[g].runs.push(id);
            self.record_wait(t - q.queued_s);
            let index = self.nodes[n].gpus[g].index;
            self.event(t, q.job, EventKind::Started(n, index));
            room = (0..self.nodes.len()).any(|n| self.fits(n));
        }
        self.queue = kept;
    }
}
