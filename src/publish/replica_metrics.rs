//! The families fed by the kubelet's pod-resources data (docs/attribution.md, docs/sizing.md).
//! Pure: the snapshot and the latest [`ReplicaView`] in, families out. Without the data (the
//! feature is off, or the kubelet has not answered for too long) no family is emitted at
//! all: absent, not zero, so a dashboard can tell "no replica allocated" from "not known".

use super::text::{Family, Kind};
use crate::model::replicas::ReplicaView;
use crate::model::snapshot::{GpuSample, Snapshot, MIB};
use std::collections::BTreeMap;

/// At most this many `gpu_warden_pod_processes_without_replica` series per agent; further
/// pods are summed under `namespace="_other",pod="_other"` (pod names are unbounded).
pub const MAX_BYPASS_SERIES: usize = 20;

fn gpu_labels(g: &GpuSample) -> impl FnOnce(&mut super::text::LabelTail<'_>) + '_ {
    move |t| {
        t.label_u64("gpu", u64::from(g.id.index));
        t.label("UUID", &g.id.uuid);
    }
}

/// Every pod-resources family for the GPUs of `snap`, appended to `out`; nothing when
/// `view` is None. GPUs the kubelet names but NVML does not see have no series (no index to
/// label them with).
pub fn write_replica_families(out: &mut Vec<u8>, snap: &Snapshot, view: Option<&ReplicaView>) {
    let Some(view) = view else {
        return;
    };
    let usage = view.usage(snap);
    let mut f = Family::open(
        out,
        "gpu_warden_gpu_replicas",
        "Replicas of the GPU (time-slicing replicas, MIG devices on it, or 1 for a whole GPU) as the kubelet's pod-resources API reports them: state=allocatable can be handed out (absent when the kubelet does not serve GetAllocatableResources), state=allocated are held by pods not in a terminal phase.",
        Kind::Gauge,
    );
    for g in &snap.gpus {
        let (allocated, _, _) = view.gpu(&g.id.uuid);
        let allocatable = view.allocatable(&g.id.uuid);
        for (state, n) in [("allocated", Some(allocated)), ("allocatable", allocatable)] {
            let Some(n) = n else { continue };
            f.sample_with(
                None,
                b"",
                |t| {
                    gpu_labels(g)(t);
                    t.label("state", state);
                },
                f64::from(n),
            );
        }
    }
    f.close();
    let per_gpu = |out: &mut Vec<u8>, name: &str, help: &str, v: &dyn Fn(usize) -> f64| {
        let mut f = Family::open(out, name, help, Kind::Gauge);
        for (i, (g, _)) in usage.iter().enumerate() {
            f.sample_with(None, b"", gpu_labels(g), v(i));
        }
        f.close();
    };
    per_gpu(
        out,
        "gpu_warden_gpu_replicas_idle",
        "Replicas of the GPU held by pods that have no process on it at this poll: handed out, keeping other jobs off the GPU, unused. /state names the pods (replicas.idleHolds).",
        &|i| f64::from(usage[i].1.idle_holds.iter().map(|(_, n)| n).sum::<u32>()),
    );
    per_gpu(
        out,
        "gpu_warden_gpu_memory_declared_bytes",
        "Sum of the declared VRAM (vram-request-mib annotation) of the pods holding replicas of the GPU, in bytes.",
        &|i| (usage[i].1.declared_mib.saturating_mul(MIB)) as f64,
    );
    per_gpu(
        out,
        "gpu_warden_gpu_memory_committed_bytes",
        "Sum over the pods holding replicas of the GPU of the larger of their declared VRAM and what their processes use on it, in bytes: what the GPU has promised, in use yet or not.",
        &|i| (usage[i].1.committed_mib.saturating_mul(MIB)) as f64,
    );
    per_gpu(
        out,
        "gpu_warden_processes_without_replica",
        "Processes running on the GPU whose pod holds no replica of it (e.g. a container that set NVIDIA_VISIBLE_DEVICES=all and bypasses the device plugin). Pods the kubelet's last List did not name, and pods holding a device ID that names no GPU, are not counted.",
        &|i| usage[i].1.bypassing.len() as f64,
    );
    // The pods behind them, bounded: the first MAX_BYPASS_SERIES (GPU, namespace, pod)
    // in order, the rest per GPU under _other.
    let mut by_pod: BTreeMap<(u32, &str, &str), u32> = BTreeMap::new();
    for (g, u) in &usage {
        for (_, r) in &u.bypassing {
            *by_pod
                .entry((g.id.index, r.namespace.as_str(), r.pod.as_str()))
                .or_insert(0) += 1;
        }
    }
    let mut f = Family::open(
        out,
        "gpu_warden_pod_processes_without_replica",
        "Processes without a replica (gpu_warden_processes_without_replica) by pod; at most 20 series per agent, further pods summed under namespace=\"_other\",pod=\"_other\". /state lists every such process (replicas.bypassing).",
        Kind::Gauge,
    );
    let mut other: BTreeMap<u32, u32> = BTreeMap::new();
    for (n, ((index, ns, pod), count)) in by_pod.iter().enumerate() {
        let Some((g, _)) = usage.iter().find(|(g, _)| g.id.index == *index) else {
            continue;
        };
        if n >= MAX_BYPASS_SERIES {
            *other.entry(*index).or_insert(0) += count;
            continue;
        }
        f.sample_with(
            None,
            b"",
            |t| {
                gpu_labels(g)(t);
                t.label("namespace", ns);
                t.label("pod", pod);
            },
            f64::from(*count),
        );
    }
    for (index, count) in other {
        if let Some((g, _)) = usage.iter().find(|(g, _)| g.id.index == index) {
            f.sample_with(
                None,
                b"",
                |t| {
                    gpu_labels(g)(t);
                    t.label("namespace", "_other");
                    t.label("pod", "_other");
                },
                f64::from(count),
            );
        }
    }
    f.close();
    let mut f = Family::open(
        out,
        "gpu_warden_pod_resources_unmapped_devices",
        "NVIDIA device IDs the kubelet lists as held that name no GPU NVML sees (a MIG device NVML does not list, an index out of range, tegra or all); their pods are left out of gpu_warden_processes_without_replica.",
        Kind::Gauge,
    );
    f.sample(b"", view.allocations.unmapped().count() as f64);
    f.close();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::replicas::{AllocatableError, KubeletAnswer, KubeletDevice, ListedPod};
    use crate::model::snapshot::{Owner, PodRef, ProcessSample};
    use crate::publish::metrics::tests::{gpu, snap, text};

    fn proc(pid: u32, gpu: u32, owner: Owner) -> ProcessSample {
        ProcessSample {
            pid,
            gpu,
            used_bytes: Some(300 * MIB),
            sm_util: None,
            name: "python".into(),
            owner,
        }
    }

    fn in_pod(name: &str) -> Owner {
        Owner::Pod(PodRef {
            namespace: "ci".into(),
            pod: name.into(),
            container: "build".into(),
            uid: format!("uid-{name}"),
        })
    }

    fn listed(name: &str, ids: &[&str], declared_mib: u64) -> ListedPod {
        ListedPod {
            key: ("ci".into(), name.into()),
            devices: ids
                .iter()
                .map(|id| KubeletDevice {
                    resource: "nvidia.com/gpu".into(),
                    id: id.to_string(),
                })
                .collect(),
            declared_mib,
        }
    }

    fn view(snap: &Snapshot, allocatable: bool) -> ReplicaView {
        KubeletAnswer {
            pods: vec![
                listed("holder", &["GPU-0::0"], 1000),
                listed("idle", &["GPU-0::1", "GPU-0::2"], 200),
                listed("stray", &[], 0),
                // A MIG device NVML does not list: no GPU, no bypass.
                listed("mig", &["MIG-0000"], 0),
            ],
            allocatable: if allocatable {
                Ok((0..4)
                    .map(|n| KubeletDevice {
                        resource: "nvidia.com/gpu".into(),
                        id: format!("GPU-0::{n}"),
                    })
                    .collect())
            } else {
                Err(AllocatableError::Unavailable("Unimplemented".into()))
            },
        }
        .resolve(&snap.gpus)
    }

    #[test]
    fn replicas_idle_holds_declared_committed_and_bypass_per_gpu() {
        let snap = snap(
            vec![gpu(0), gpu(1)],
            vec![
                proc(1, 0, in_pod("holder")),
                // Holds GPU 0 only, but also runs on GPU 1.
                proc(2, 1, in_pod("holder")),
                // Asked for no GPU at all.
                proc(3, 1, in_pod("stray")),
                proc(4, 1, Owner::Host),
                proc(5, 1, in_pod("mig")),
            ],
        );
        let v = view(&snap, true);
        let t = text(|out| write_replica_families(out, &snap, Some(&v)));
        for line in [
            "gpu_warden_gpu_replicas{gpu=\"0\",UUID=\"GPU-0\",state=\"allocated\"} 3\n",
            "gpu_warden_gpu_replicas{gpu=\"0\",UUID=\"GPU-0\",state=\"allocatable\"} 4\n",
            // A GPU the kubelet does not name: nothing to hand out.
            "gpu_warden_gpu_replicas{gpu=\"1\",UUID=\"GPU-1\",state=\"allocatable\"} 0\n",
            "gpu_warden_gpu_replicas_idle{gpu=\"0\",UUID=\"GPU-0\"} 2\n",
            "gpu_warden_gpu_replicas_idle{gpu=\"1\",UUID=\"GPU-1\"} 0\n",
            "gpu_warden_gpu_memory_declared_bytes{gpu=\"0\",UUID=\"GPU-0\"} 1258291200\n",
            // holder: max(1000, 300) + idle: max(200, 0).
            "gpu_warden_gpu_memory_committed_bytes{gpu=\"0\",UUID=\"GPU-0\"} 1258291200\n",
            "gpu_warden_processes_without_replica{gpu=\"0\",UUID=\"GPU-0\"} 0\n",
            "gpu_warden_processes_without_replica{gpu=\"1\",UUID=\"GPU-1\"} 2\n",
            "gpu_warden_pod_processes_without_replica{gpu=\"1\",UUID=\"GPU-1\",namespace=\"ci\",pod=\"holder\"} 1\n",
            "gpu_warden_pod_processes_without_replica{gpu=\"1\",UUID=\"GPU-1\",namespace=\"ci\",pod=\"stray\"} 1\n",
            "gpu_warden_pod_resources_unmapped_devices 1\n",
        ] {
            assert!(t.contains(line), "{line}\n{t}");
        }
        assert!(!t.contains("pod=\"mig\""), "{t}");
    }

    #[test]
    fn allocatable_absent_when_the_kubelet_does_not_serve_it() {
        let snap = snap(vec![gpu(0)], vec![]);
        let t = text(|out| write_replica_families(out, &snap, Some(&view(&snap, false))));
        assert!(
            t.contains("gpu_warden_gpu_replicas{gpu=\"0\",UUID=\"GPU-0\",state=\"allocated\"} 3\n"),
            "{t}"
        );
        assert!(!t.contains("state=\"allocatable\""), "{t}");
    }

    #[test]
    fn bypass_series_are_bounded() {
        let n = MAX_BYPASS_SERIES as u32 + 5;
        let pods: Vec<ListedPod> = (0..n)
            .map(|i| listed(&format!("p{i:02}"), &[], 0))
            .collect();
        let procs = (0..n)
            .map(|i| proc(i + 1, 0, in_pod(&format!("p{i:02}"))))
            .collect();
        let snap = snap(vec![gpu(0)], procs);
        let v = KubeletAnswer {
            pods,
            allocatable: Ok(vec![]),
        }
        .resolve(&snap.gpus);
        let t = text(|out| write_replica_families(out, &snap, Some(&v)));
        let series = t
            .lines()
            .filter(|l| l.starts_with("gpu_warden_pod_processes_without_replica{"))
            .count();
        assert_eq!(series, MAX_BYPASS_SERIES + 1, "{t}");
        assert!(
            t.contains("namespace=\"_other\",pod=\"_other\"} 5\n"),
            "{t}"
        );
    }

    #[test]
    fn absent_without_data() {
        let snap = snap(vec![gpu(0)], vec![proc(1, 0, in_pod("x"))]);
        assert!(text(|out| write_replica_families(out, &snap, None)).is_empty());
    }
}
