//! The families fed by the kubelet's pod-resources data (docs/attribution.md). Pure: the snapshot
//! and the latest [`ReplicaView`] in, families out. Without the data (the feature is off, or
//! the kubelet has not answered for too long) no family is emitted at all: absent, not zero,
//! so a dashboard can tell "no replica allocated" from "not known".

use super::text::{Family, Kind};
use crate::model::replicas::{PodKey, ReplicaView};
use crate::model::snapshot::{Owner, Snapshot};

/// `gpu_warden_gpu_replicas{gpu,UUID,state="allocated"|"allocatable"}` and
/// `gpu_warden_processes_without_replica{gpu,UUID}` for every GPU of `snap`, appended to
/// `out`; nothing when `view` is None. GPUs the kubelet names but NVML does not see have no
/// series (no index to label them with).
pub fn write_replica_families(out: &mut Vec<u8>, snap: &Snapshot, view: Option<&ReplicaView>) {
    let Some(view) = view else {
        return;
    };
    // Host processes have no pod and so no replica to hold: they are not counted.
    let pod_processes: Vec<(PodKey, &str)> = snap
        .processes
        .iter()
        .filter_map(|p| match &p.owner {
            Owner::Pod(r) => {
                let uuid = snap.gpu(p.gpu)?.id.uuid.as_str();
                Some(((r.namespace.clone(), r.pod.clone()), uuid))
            }
            _ => None,
        })
        .collect();
    let counts = view
        .allocations
        .processes_without_replica(pod_processes.iter().map(|(k, u)| (k, *u)));
    let mut f = Family::open(
        out,
        "gpu_warden_gpu_replicas",
        "Replicas of the GPU (time-slicing replicas, or 1 for a whole GPU) as the kubelet's pod-resources API reports them: state=allocatable can be handed out, state=allocated are held by pods not in a terminal phase.",
        Kind::Gauge,
    );
    for g in &snap.gpus {
        let (allocated, allocatable, _) = view.gpu(&g.id.uuid);
        for (state, n) in [("allocated", allocated), ("allocatable", allocatable)] {
            f.sample_with(
                None,
                b"",
                |t| {
                    t.label_u64("gpu", u64::from(g.id.index));
                    t.label("UUID", &g.id.uuid);
                    t.label("state", state);
                },
                f64::from(n),
            );
        }
    }
    f.close();
    let mut f = Family::open(
        out,
        "gpu_warden_processes_without_replica",
        "Processes running on the GPU whose pod holds no replica of it (e.g. a container that set NVIDIA_VISIBLE_DEVICES=all and bypasses the device plugin).",
        Kind::Gauge,
    );
    for g in &snap.gpus {
        let n = counts.get(&g.id.uuid).copied().unwrap_or(0);
        f.sample_with(
            None,
            b"",
            |t| {
                t.label_u64("gpu", u64::from(g.id.index));
                t.label("UUID", &g.id.uuid);
            },
            f64::from(n),
        );
    }
    f.close();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::replicas::{Allocations, GpuReplicas};
    use crate::model::snapshot::{PodRef, ProcessSample};
    use crate::publish::metrics::tests::{gpu, snap, text};

    fn proc(pid: u32, gpu: u32, owner: Owner) -> ProcessSample {
        ProcessSample {
            pid,
            gpu,
            used_bytes: None,
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

    #[test]
    fn replicas_and_processes_without_a_replica_per_gpu() {
        let snap = snap(
            vec![gpu(0), gpu(1)],
            vec![
                proc(1, 0, in_pod("holder")),
                // Holds GPU 0 only, but also runs on GPU 1.
                proc(2, 1, in_pod("holder")),
                // Asked for no GPU at all.
                proc(3, 1, in_pod("stray")),
                proc(4, 1, Owner::Host),
            ],
        );
        let key = ("ci".to_string(), "holder".to_string());
        let mut a = Allocations::default();
        a.gpus.insert(
            "GPU-0".into(),
            GpuReplicas {
                allocatable: 4,
                allocated: 1,
                pods: [key.clone()].into(),
            },
        );
        a.pod_gpus.insert(key, ["GPU-0".to_string()].into());
        let view = ReplicaView {
            allocations: a,
            declared_mib: Default::default(),
        };
        let t = text(|out| write_replica_families(out, &snap, Some(&view)));
        for line in [
            "gpu_warden_gpu_replicas{gpu=\"0\",UUID=\"GPU-0\",state=\"allocated\"} 1\n",
            "gpu_warden_gpu_replicas{gpu=\"0\",UUID=\"GPU-0\",state=\"allocatable\"} 4\n",
            // A GPU the kubelet does not name: nothing to hand out.
            "gpu_warden_gpu_replicas{gpu=\"1\",UUID=\"GPU-1\",state=\"allocatable\"} 0\n",
            "gpu_warden_processes_without_replica{gpu=\"0\",UUID=\"GPU-0\"} 0\n",
            "gpu_warden_processes_without_replica{gpu=\"1\",UUID=\"GPU-1\"} 2\n",
        ] {
            assert!(t.contains(line), "{line}\n{t}");
        }
    }

    #[test]
    fn absent_without_data() {
        let snap = snap(vec![gpu(0)], vec![proc(1, 0, in_pod("x"))]);
        assert!(text(|out| write_replica_families(out, &snap, None)).is_empty());
    }
}
