//! `--dcgm-pod-labels`: the pod labels dcgm-exporter's Kubernetes mode puts on its DCGM
//! series (NVIDIA/dcgm-exporter, internal/pkg/transformation/kubernetes.go, `PodMapper.Process`),
//! for dashboards and alerts built on them. Label names and order as it renders them:
//! `container`, `namespace`, `pod`, after `DCGM_FI_DRIVER_VERSION` (its attributes, which its
//! template writes sorted by name after the device labels).
//!
//! Which pod: dcgm-exporter asks the kubelet which pod holds the device; gpu-warden names the
//! pods with a process on the GPU (attribution), so a GPU a pod holds but does not use yet keeps
//! its unlabelled series. Under time-slicing several pods share one GPU:
//! - `on` keeps **one series per GPU**, as dcgm-exporter's default mode does (it keeps one
//!   pod per device, whichever its map kept last): gpu-warden names the container using the
//!   most memory on the GPU (ties: namespace, pod, container). Sums over GPUs stay right
//!   (`sum(DCGM_FI_DEV_FB_USED)` counts each GPU once) and the series count does not grow.
//! - `per-pod` is dcgm-exporter's `--kubernetes-virtual-gpus` mode: **one series per
//!   container with a process on the GPU**, each carrying the whole GPU's value (a GPU
//!   figure cannot be split), so a per-pod dashboard finds every pod. Sums over those series
//!   count a shared GPU once per pod: aggregate with `max by (UUID)`. Bounded: at most
//!   [`MAX_PER_GPU`] series per GPU and family (the largest users), about the time-slicing
//!   replicas a GPU has.
//!
//! What each pod used of a shared GPU is in `gpu_warden_container_*`, which dcgm-exporter cannot
//! give. Pure: a function of the snapshot.

use crate::model::snapshot::{Owner, PodRef, Snapshot};

/// How the DCGM families name pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodLabels {
    /// No pod labels (dcgm-exporter without Kubernetes mode).
    #[default]
    Off,
    /// One series per GPU, labelled with its largest user.
    On,
    /// One series per container with a process on the GPU.
    PerPod,
}

/// Most containers named on one GPU in [`PodLabels::PerPod`]: time-slicing setups run 2 to 16
/// replicas a GPU; the largest users are kept past that.
pub const MAX_PER_GPU: usize = 16;

/// The containers GPU `gpu`'s DCGM series are labelled with under `mode`, appended to `out`
/// in series order (by namespace, pod, container); none means one series without pod labels.
pub fn pods_on<'a>(snap: &'a Snapshot, gpu: u32, mode: PodLabels, out: &mut Vec<&'a PodRef>) {
    if mode == PodLabels::Off {
        return;
    }
    // (container, MiB-free byte sum on this GPU), one entry per container.
    let mut users: Vec<(&PodRef, u64)> = Vec::new();
    for p in snap.processes.iter().filter(|p| p.gpu == gpu) {
        let Owner::Pod(r) = &p.owner else { continue };
        let used = p.used_bytes.unwrap_or(0);
        match users.iter_mut().find(|(u, _)| same(u, r)) {
            Some(e) => e.1 = e.1.saturating_add(used),
            None => users.push((r, used)),
        }
    }
    let by_name = |a: &PodRef, b: &PodRef| {
        (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
    };
    // Largest first, ties by name: the one `on` names, the ones `per-pod` keeps.
    users.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| by_name(a.0, b.0)));
    let keep = if mode == PodLabels::On {
        1
    } else {
        MAX_PER_GPU
    };
    users.truncate(keep);
    let start = out.len();
    out.extend(users.into_iter().map(|(r, _)| r));
    out[start..].sort_by(|a, b| by_name(a, b));
}

fn same(a: &PodRef, b: &PodRef) -> bool {
    a.namespace == b.namespace && a.pod == b.pod && a.container == b.container
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::{ProcessSample, MIB};

    fn proc(gpu: u32, ns: &str, pod: &str, ctr: &str, mib: u64) -> ProcessSample {
        ProcessSample {
            pid: 1,
            gpu,
            used_bytes: Some(mib * MIB),
            sm_util: None,
            name: "p".into(),
            owner: Owner::Pod(PodRef {
                namespace: ns.into(),
                pod: pod.into(),
                container: ctr.into(),
                uid: format!("{ns}/{pod}"),
            }),
        }
    }

    fn names(snap: &Snapshot, gpu: u32, mode: PodLabels) -> Vec<String> {
        let mut out = Vec::new();
        pods_on(snap, gpu, mode, &mut out);
        out.iter()
            .map(|r| format!("{}/{}/{}", r.namespace, r.pod, r.container))
            .collect()
    }

    #[test]
    fn one_series_names_the_largest_user_per_pod_names_each() {
        let mut snap = crate::publish::metrics::tests::snap(vec![], vec![]);
        snap.processes = vec![
            proc(0, "ci", "b", "build", 3000),
            proc(0, "ci", "a", "build", 1000),
            proc(0, "ci", "a", "build", 2500), // two processes of one container: 3500
            proc(1, "ml", "t", "train", 9000),
        ];
        snap.processes.push(ProcessSample {
            owner: Owner::Host,
            ..proc(0, "", "", "", 50_000)
        });
        assert!(names(&snap, 0, PodLabels::Off).is_empty());
        assert_eq!(
            names(&snap, 0, PodLabels::On),
            ["ci/a/build"],
            "3500 MiB beats 3000"
        );
        assert_eq!(
            names(&snap, 0, PodLabels::PerPod),
            ["ci/a/build", "ci/b/build"]
        );
        assert_eq!(names(&snap, 1, PodLabels::On), ["ml/t/train"]);
        assert!(
            names(&snap, 2, PodLabels::PerPod).is_empty(),
            "no pod: no labels"
        );
        // Ties: by name.
        snap.processes = vec![proc(0, "ci", "z", "c", 10), proc(0, "ci", "y", "c", 10)];
        assert_eq!(names(&snap, 0, PodLabels::On), ["ci/y/c"]);
        // Bounded: the largest MAX_PER_GPU.
        snap.processes = (0..40)
            .map(|i| proc(0, "ci", &format!("p{i:02}"), "c", i))
            .collect();
        let kept = names(&snap, 0, PodLabels::PerPod);
        assert_eq!(kept.len(), MAX_PER_GPU);
        assert_eq!(kept[0], "ci/p24/c");
    }
}
