//! Each node's agent, with gpu-warden's real code: one full poll (`Snapshot`, each job's
//! process attributed to its pod) into the real `guard::state::Guard`, whose decisions are
//! carried out as the enforcer does (candidates in rank order until `Decision::done`,
//! through [`crate::kubelet`]); then the real `AnnotationPlanner` decides whether this
//! poll is published (a change by a quantum at most every `--annotation-min-interval`, a
//! pressure rise at once, unchanged values every heartbeat), and the extender's cache
//! reads what was published with the extender's own reader.

use crate::engine::{wall, Engine};
use crate::scenario::{NAMESPACE, PREFIX};
use gpu_warden_extender::nodes::read_node;
use gpu_warden_guard::decision::EvictionOutcome;
use gpu_warden_model::pod::PodMap;
use gpu_warden_model::replicas::{GpuReplicas, ReplicaView};
use gpu_warden_model::snapshot::{
    GpuHealth, GpuIdentity, GpuSample, MemoryInfo, Owner, PodRef, ProcessSample, Snapshot, MIB,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

impl Engine<'_> {
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
            seq: t / self.sc.step_s.max(1) + 1,
            at: Duration::from_secs(t),
            wall: wall(t),
            driver_version: "570.172.08".into(),
            cuda_driver_version: None,
            gpus,
            processes,
            util_fresh: true,
            errors: vec![],
        }
    }

    /// What the kubelet's pod-resources API tells the agent: replicas handed out per GPU
    /// and the declared MiB of the pods holding them.
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

    /// One poll of every node's agent.
    pub(crate) fn agents(&mut self, t: u64) {
        if !self.policy.guard() && !self.policy.extender() {
            return;
        }
        let now = Duration::from_secs(t);
        for n in 0..self.nodes.len() {
            let snap = Arc::new(self.snapshot(n, t));
            let mut pressure = BTreeMap::new();
            if self.nodes[n].guard.is_some() {
                self.guard(n, &snap, now, t);
                if let Some(g) = self.nodes[n].guard.as_ref() {
                    for gpu in &self.nodes[n].gpus {
                        pressure.insert(gpu.index, g.pressure(gpu.index));
                    }
                }
            }
            if self.policy.extender() {
                let view = self.replica_view(n);
                let node = &mut self.nodes[n];
                if let Some(patch) =
                    node.planner
                        .plan_with_replicas(&snap, &pressure, Some(&view), now)
                {
                    // The patch lands (the API double's tests cover failures); the
                    // extender's watch sees it within the step.
                    let ann = patch.values.to_annotations(PREFIX);
                    node.state = Some(Arc::new(read_node(&ann, PREFIX)));
                    node.planner.patch_succeeded(now);
                }
            }
        }
    }

    fn guard(&mut self, n: usize, snap: &Arc<Snapshot>, now: Duration, t: u64) {
        let pods: PodMap = self.nodes[n]
            .gpus
            .iter()
            .flat_map(|g| g.runs.iter())
            .map(|i| (self.runs[i].info.uid.clone(), self.runs[i].info.clone()))
            .collect();
        let pods = Arc::new(pods);
        let decisions = match self.nodes[n].guard.as_mut() {
            Some(g) => g.observe(snap, &pods, now),
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
                        self.act_on_victim(id, t);
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
    }
}
