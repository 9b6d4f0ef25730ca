//! CUDA mismatches said to the job: a GPU pod on this node whose known CUDA need
//! (`<prefix>/cuda-min`, else its GPU containers' images, `model::cuda`) is newer than what
//! the driver supports gets one Warning Event at once — before its CUDA runtime fails with
//! "CUDA driver version is insufficient for CUDA runtime version" — and is counted in
//! `gpu_warden_cuda_mismatches_total{namespace,project}` (docs/cuda.md).
//!
//! Pure: the agent hands it every full poll and the pod view. A pod is judged once, when it
//! first shows a GPU container (one asking for an `nvidia.com/` resource, or one with a
//! process on a GPU); its UID is forgotten when it leaves the view. The agent follows the
//! container toolkit's `cuda>=X.Y` rule ([`CudaPolicy::Strict`]): the note says when CUDA's
//! minor-version compatibility might still run the job.

use super::job_peaks::{OTHER, PROJECT_LABEL};
use super::text::{Family, Kind};
use crate::model::cuda::{self, judge, pod_need, CudaPolicy, CudaVerdict, Need};
use crate::model::event::{EventDraft, EventType, Regarding};
use crate::model::pod::{PodInfo, PodMap};
use crate::model::snapshot::{Owner, Snapshot};
use std::collections::{BTreeMap, HashSet};

/// The Event reason of a pod whose CUDA need is newer than the node's driver supports.
pub const MISMATCH_REASON: &str = "CUDADriverTooOld";
/// The Event reason of a pod whose `cuda-min` annotation cannot be read.
pub const BAD_DECLARATION_REASON: &str = "CUDAMinInvalid";

const NAME: &str = "gpu_warden_cuda_mismatches_total";
const HELP: &str = "GPU pods whose known CUDA need is newer than the CUDA version the node's driver supports (one per pod), by namespace and GitLab project.";

/// The tracker and its counter.
#[derive(Debug, Clone)]
pub struct CudaMismatches {
    /// `<prefix>/cuda-min`.
    key: String,
    max_series: usize,
    judged: HashSet<String>,
    counts: BTreeMap<(String, String), u64>,
}

impl CudaMismatches {
    /// A tracker reading declarations from `<prefix>/cuda-min`, keeping at most `max_series`
    /// `(namespace, project)` pairs (the rest are counted under `_other`).
    pub fn new(prefix: &str, max_series: usize) -> Self {
        CudaMismatches {
            key: cuda::key(prefix),
            max_series: max_series.max(1),
            judged: HashSet::new(),
            counts: BTreeMap::new(),
        }
    }

    /// Judges the GPU pods not judged yet against the snapshot's CUDA version and returns
    /// the Events to send. Nothing is judged while the driver's version is unknown.
    pub fn observe(&mut self, snap: &Snapshot, pods: &PodMap) -> Vec<EventDraft> {
        self.judged.retain(|uid| pods.contains_key(uid));
        let Some(node) = snap.cuda_driver_version else {
            return Vec::new();
        };
        // Containers with a process on a GPU count even without a device request.
        let on_gpu: HashSet<(&str, &str)> = snap
            .processes
            .iter()
            .filter_map(|p| match &p.owner {
                Owner::Pod(r) => Some((r.uid.as_str(), r.container.as_str())),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        let mut uids: Vec<&String> = pods.keys().collect();
        uids.sort();
        for uid in uids {
            let pod = &pods[uid];
            if self.judged.contains(uid) || pod.is_terminal() {
                continue;
            }
            let images: Vec<&str> = pod
                .containers
                .iter()
                .filter(|c| c.gpu || on_gpu.contains(&(uid.as_str(), c.name.as_str())))
                .filter_map(|c| c.image.as_deref())
                .collect();
            if images.is_empty() {
                continue;
            }
            self.judged.insert(uid.clone());
            let need = pod_need(&pod.annotations, &self.key, images);
            if let Need::Unknown { bad: Some(why) } = &need {
                out.push(draft(
                    pod,
                    BAD_DECLARATION_REASON,
                    format!("{why}; the pod's CUDA need is not checked"),
                ));
                continue;
            }
            if let CudaVerdict::TooOld {
                need: version,
                node,
                minor_compatible,
            } = judge(Some(node), &need, CudaPolicy::Strict)
            {
                let line =
                    cuda::too_old_line(version, node, minor_compatible, &need.how(&self.key));
                out.push(draft(pod, MISMATCH_REASON, format!("This pod {line}")));
                self.count(pod);
            }
        }
        out
    }

    fn count(&mut self, pod: &PodInfo) {
        let project = pod.labels.get(PROJECT_LABEL).cloned().unwrap_or_default();
        let mut key = (pod.namespace.clone(), project);
        if !self.counts.contains_key(&key) && self.counts.len() >= self.max_series {
            key = (OTHER.to_string(), OTHER.to_string());
        }
        *self.counts.entry(key).or_default() += 1;
    }

    /// Appends the counter (nothing before the first mismatch).
    pub fn render(&self, out: &mut Vec<u8>) {
        let mut family = Family::open(out, NAME, HELP, Kind::Counter);
        for ((ns, project), n) in &self.counts {
            family.sample_with(
                None,
                b"",
                |t| {
                    t.label("namespace", ns);
                    t.label("project", project);
                },
                *n as f64,
            );
        }
        family.close();
    }
}

fn draft(pod: &PodInfo, reason: &'static str, note: String) -> EventDraft {
    EventDraft {
        namespace: pod.namespace.clone(),
        regarding: Regarding::Pod {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        },
        type_: EventType::Warning,
        reason,
        action: "Check",
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cuda::CudaVersion;
    use crate::testkit::fixtures::{pod, pods, snap, PodBuilder};

    fn gpu_pod(uid: &str, image: &str) -> PodBuilder {
        pod(uid)
            .label(PROJECT_LABEL, "42")
            .container("build", image, true)
            .container("helper", "nvidia/cuda:13.0.0-base-ubuntu24.04", false)
    }

    fn node(major: u32, minor: u32) -> Snapshot {
        let mut s = snap(vec![], vec![]);
        s.cuda_driver_version = Some(CudaVersion { major, minor });
        s
    }

    fn text(m: &CudaMismatches) -> String {
        let mut out = Vec::new();
        m.render(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn one_warning_per_pod_whose_known_need_is_newer_and_a_bounded_count() {
        let mut m = CudaMismatches::new("gpu-warden.io", 1);
        let view = pods([
            gpu_pod("a", "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04"),
            gpu_pod("b", "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"),
            gpu_pod("c", "myorg/cuda-tools:12.8"),
            gpu_pod("d", "nvidia/cuda:12.9.0-base-ubi8").ns("other"),
        ]);
        assert!(text(&m).is_empty(), "no family before the first mismatch");
        let events = m.observe(&node(12, 4), &view);
        let reasons: Vec<(&str, &str)> = events
            .iter()
            .map(|e| match &e.regarding {
                Regarding::Pod { name, .. } => (name.as_str(), e.reason),
                Regarding::Node { .. } => unreachable!(),
            })
            .collect();
        assert_eq!(reasons, [("a", MISMATCH_REASON), ("d", MISMATCH_REASON)]);
        assert_eq!(events[0].type_, EventType::Warning);
        assert_eq!(
            events[0].note,
            "This pod needs CUDA 12.8 (read from the image nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 (the nvidia/cuda tag X.Y.Z-<flavor>)) but the node's driver supports CUDA 12.4 (CUDA minor-version compatibility may run some 12.x code on it, not PTX JIT or newer APIs, and the NVIDIA container toolkit's cuda>=12.8 check refuses it): use an image built for CUDA <= 12.4, or a node group with a newer driver"
        );
        assert!(m.observe(&node(12, 4), &view).is_empty(), "once per pod");
        assert_eq!(
            text(&m),
            "# HELP gpu_warden_cuda_mismatches_total GPU pods whose known CUDA need is newer than the CUDA version the node's driver supports (one per pod), by namespace and GitLab project.\n# TYPE gpu_warden_cuda_mismatches_total counter\ngpu_warden_cuda_mismatches_total{namespace=\"_other\",project=\"_other\"} 1\ngpu_warden_cuda_mismatches_total{namespace=\"ci\",project=\"42\"} 1\n"
        );
    }

    #[test]
    fn declarations_win_bad_ones_are_said_and_unknown_drivers_judge_nothing() {
        let mut m = CudaMismatches::new("gpu-warden.io", 10);
        let declared = gpu_pod("a", "myorg/trainer:1").annotation("gpu-warden.io/cuda-min", "13.0");
        let bad = gpu_pod("b", "nvidia/cuda:12.8.1-base-ubuntu22.04")
            .annotation("gpu-warden.io/cuda-min", "13");
        let cpu = pod("c").container("x", "nvidia/cuda:13.0.0-base-ubuntu24.04", false);
        let view = pods([declared, bad, cpu]);
        assert!(
            m.observe(&snap(vec![], vec![]), &view).is_empty(),
            "driver unknown"
        );
        let events = m.observe(&node(12, 8), &view);
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0].reason, MISMATCH_REASON);
        assert!(events[0].note.starts_with("This pod needs CUDA 13.0 (declared in gpu-warden.io/cuda-min) but the node's driver supports CUDA 12.8: "), "{}", events[0].note);
        assert_eq!(events[1].reason, BAD_DECLARATION_REASON);
        assert_eq!(
            events[1].note,
            "gpu-warden.io/cuda-min: \"13\" is not a CUDA version major.minor such as \"12.8\"; the pod's CUDA need is not checked"
        );
        // A pod that leaves the view and comes back (a new UID would too) is judged again.
        m.observe(&node(12, 8), &pods([]));
        assert_eq!(m.observe(&node(12, 8), &view).len(), 2);
    }
}
