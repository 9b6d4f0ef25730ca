//! Each CI job's VRAM peak: per pod and GPU, the most memory its processes held together
//! at one full poll over the pod's life, recorded once the processes are gone. Operators
//! size `replicas` and `vram-request-mib` from these (docs/sizing.md).
//!
//! Pure: the agent hands it every attributed full poll and the pod view; it returns the
//! peaks that ended, keeps the histogram `gpu_warden_ci_job_gpu_memory_peak_bytes` and
//! renders it.

use super::text::{Family, Kind, LabelTail};
use crate::model::event::{EventDraft, EventType, Regarding};
use crate::model::pod::PodMap;
use crate::model::snapshot::{Owner, Snapshot, MIB};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// The pod label GitLab Runner's Kubernetes executor sets to the CI project's ID.
pub const PROJECT_LABEL: &str = "project.runner.gitlab.com/id";
/// Label value for peaks past the series limit, and for pods with no project label.
pub const OTHER: &str = "_other";
/// Default most `(namespace, project)` series the histogram keeps.
pub const DEFAULT_MAX_SERIES: usize = 100;
/// How long a pod's processes must have been off a GPU before its peak there is recorded,
/// while the pod itself is still running: a job's script may start one CUDA process after
/// another.
pub const LINGER: Duration = Duration::from_secs(10);
/// Bucket bounds in bytes: powers of two from 256 MiB to 256 GiB, with the sizes between
/// that GPUs and replica shares come in (A10G 24 GiB, A100 40/80 GiB, H100 80, H200 141).
pub const BUCKETS_MIB: [u64; 17] = [
    256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 40960, 49152, 81920, 98304,
    147456, 262144,
];

const NAME: &str = "gpu_warden_ci_job_gpu_memory_peak_bytes";
const HELP: &str = "Peak GPU memory of a pod's processes on one GPU over the pod's life, recorded when they are gone (one observation per pod and GPU), by namespace and GitLab project.";

/// One pod's peak on one GPU, once its processes there are gone.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPeak {
    /// The pod's UID.
    pub uid: String,
    pub namespace: String,
    pub pod: String,
    /// The GitLab project ID from the pod's labels, if any.
    pub project: Option<String>,
    /// NVML index and marketing name of the GPU, and its total memory in bytes.
    pub gpu: u32,
    pub gpu_model: String,
    pub gpu_total: u64,
    /// The peak, in bytes.
    pub peak: u64,
    /// The pod's declared need (`<prefix>/vram-request-mib`) in bytes, if declared.
    pub declared: Option<u64>,
    /// Whether the pod was still in the pod view when its peak was recorded (running, or
    /// finished but not yet deleted, as a CI job's pod is until its runner cleans up): only
    /// then does an Event on it make sense.
    pub pod_exists: bool,
}

/// The Event reason of a pod's recorded VRAM peak.
pub const PEAK_REASON: &str = "GPUMemoryPeak";

impl JobPeak {
    /// The Normal Event on the pod whose peak this is; `annotation` is where its declared
    /// need is read (named in the note when it declares none).
    pub fn notice(&self, annotation: &str) -> EventDraft {
        EventDraft {
            namespace: self.namespace.clone(),
            regarding: Regarding::Pod {
                namespace: self.namespace.clone(),
                name: self.pod.clone(),
                uid: self.uid.clone(),
            },
            type_: EventType::Normal,
            reason: PEAK_REASON,
            action: "Observe",
            note: self.note(annotation),
        }
    }

    /// The Event note: "GPU peak 9.3 GiB on GPU 0 (NVIDIA A10G, 24 GiB); declared 8 GiB".
    pub fn note(&self, annotation: &str) -> String {
        let declared = match self.declared {
            Some(d) => format!("declared {}", gib(d)),
            None => format!("no declared need ({annotation})"),
        };
        format!(
            "GPU peak {} on GPU {} ({}, {}); {declared}",
            gib(self.peak),
            self.gpu,
            self.gpu_model,
            gib(self.gpu_total)
        )
    }
}

/// Bytes as GiB with one decimal, whole GiB without one ("24 GiB", "9.3 GiB").
fn gib(bytes: u64) -> String {
    let g = bytes as f64 / (1024.0 * MIB as f64);
    if (g - g.round()).abs() < 0.05 {
        format!("{} GiB", g.round())
    } else {
        format!("{g:.1} GiB")
    }
}

#[derive(Debug, Clone)]
struct Live {
    namespace: String,
    pod: String,
    /// Read from the pod view while the pod is in it, so a pod deleted before its peak is
    /// recorded keeps its project and declaration.
    project: Option<String>,
    declared: Option<u64>,
    peak: u64,
    last_seen: Duration,
}

#[derive(Debug, Clone, Default)]
struct Series {
    buckets: [u64; BUCKETS_MIB.len()],
    count: u64,
    sum: u64,
}

/// The tracker and its histogram.
#[derive(Debug, Clone)]
pub struct JobPeaks {
    /// `<prefix>/vram-request-mib`: the annotation read for the declared need.
    request_annotation: String,
    max_series: usize,
    live: HashMap<(String, u32), Live>,
    series: BTreeMap<(String, String), Series>,
}

impl JobPeaks {
    /// A tracker reading declared needs from `request_annotation`, keeping at most
    /// `max_series` label pairs (the rest are counted under `_other`).
    pub fn new(request_annotation: impl Into<String>, max_series: usize) -> Self {
        JobPeaks {
            request_annotation: request_annotation.into(),
            max_series: max_series.max(1),
            live: HashMap::new(),
            series: BTreeMap::new(),
        }
    }

    /// The annotation declared needs are read from.
    pub fn request_annotation(&self) -> &str {
        &self.request_annotation
    }

    /// Folds in a full poll and returns the peaks that ended with it: a pod whose
    /// processes left a GPU is recorded at once when the pod is gone from the view,
    /// terminating or finished, and after [`LINGER`] otherwise. GPUs the poll could not
    /// list processes for (lost, or no memory reading) keep their pods open.
    pub fn observe(&mut self, snap: &Snapshot, pods: &PodMap) -> Vec<JobPeak> {
        let mut now_used: HashMap<(&str, u32), (u64, &str, &str)> = HashMap::new();
        for p in &snap.processes {
            if let (Owner::Pod(r), Some(b)) = (&p.owner, p.used_bytes) {
                let e = now_used.entry((r.uid.as_str(), p.gpu)).or_insert((
                    0,
                    r.namespace.as_str(),
                    r.pod.as_str(),
                ));
                e.0 = e.0.saturating_add(b);
            }
        }
        for ((uid, gpu), (used, ns, pod)) in &now_used {
            let live = self
                .live
                .entry(((*uid).to_string(), *gpu))
                .or_insert_with(|| Live {
                    namespace: (*ns).to_string(),
                    pod: (*pod).to_string(),
                    project: None,
                    declared: None,
                    peak: 0,
                    last_seen: snap.at,
                });
            live.peak = live.peak.max(*used);
            live.last_seen = snap.at;
            if let Some(info) = pods.get(*uid) {
                live.project = info.labels.get(PROJECT_LABEL).cloned();
                live.declared = info
                    .vram_request_mib(&self.request_annotation)
                    .map(|mib| mib.saturating_mul(MIB));
            }
        }
        let listed = |gpu: u32| {
            snap.gpus
                .iter()
                .any(|g| g.id.index == gpu && g.memory.is_some())
        };
        let ended: Vec<(String, u32)> = self
            .live
            .iter()
            .filter(|((uid, gpu), live)| {
                if now_used.contains_key(&(uid.as_str(), *gpu)) || !listed(*gpu) {
                    return false;
                }
                let running = pods.get(uid).is_some_and(is_running);
                !running || snap.at.saturating_sub(live.last_seen) >= LINGER
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::with_capacity(ended.len());
        for key in ended {
            let Some(live) = self.live.remove(&key) else {
                continue;
            };
            let (uid, gpu) = key;
            let pod = pods.get(&uid);
            let (model, total) = snap
                .gpus
                .iter()
                .find(|g| g.id.index == gpu)
                .map(|g| (g.id.model.clone(), g.memory.map_or(0, |m| m.total)))
                .unwrap_or_default();
            let peak = JobPeak {
                project: live.project,
                declared: live.declared,
                pod_exists: pod.is_some(),
                uid,
                namespace: live.namespace,
                pod: live.pod,
                gpu,
                gpu_model: model,
                gpu_total: total,
                peak: live.peak,
            };
            self.record(&peak);
            out.push(peak);
        }
        out.sort_by(|a, b| (&a.namespace, &a.pod, a.gpu).cmp(&(&b.namespace, &b.pod, b.gpu)));
        out
    }

    fn record(&mut self, peak: &JobPeak) {
        let mut key = (
            peak.namespace.clone(),
            peak.project.clone().unwrap_or_default(),
        );
        if !self.series.contains_key(&key) && self.series.len() >= self.max_series {
            key = (OTHER.to_string(), OTHER.to_string());
        }
        let s = self.series.entry(key).or_default();
        for (i, bound) in BUCKETS_MIB.iter().enumerate() {
            if peak.peak <= bound * MIB {
                s.buckets[i] += 1;
            }
        }
        s.count += 1;
        s.sum = s.sum.saturating_add(peak.peak);
    }

    /// Appends the histogram in the text exposition format (nothing before the first peak),
    /// through the same writer as every other family (`publish::text`).
    pub fn render(&self, out: &mut Vec<u8>) {
        let mut family = Family::open(out, NAME, HELP, Kind::Histogram);
        for ((ns, project), s) in &self.series {
            let labels = |t: &mut LabelTail<'_>| {
                t.label("namespace", ns);
                t.label("project", project);
            };
            for (i, bound) in BUCKETS_MIB.iter().enumerate() {
                family.sample_with(
                    Some("_bucket"),
                    b"",
                    |t| {
                        labels(t);
                        t.label_u64("le", bound * MIB);
                    },
                    s.buckets[i] as f64,
                );
            }
            family.sample_with(
                Some("_bucket"),
                b"",
                |t| {
                    labels(t);
                    t.label("le", "+Inf");
                },
                s.count as f64,
            );
            family.sample_with(Some("_sum"), b"", labels, s.sum as f64);
            family.sample_with(Some("_count"), b"", labels, s.count as f64);
        }
        family.close();
    }
}

fn is_running(p: &crate::model::pod::PodInfo) -> bool {
    !p.terminating && !p.is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::fixtures::*;

    const GIB: u64 = 1024 * MIB;

    const ANN: &str = "gpu-warden.io/vram-request-mib";

    fn at(s: u64, gpus_used: u64, procs: Vec<crate::model::snapshot::ProcessSample>) -> Snapshot {
        let mut snap = snap(vec![gpu(0, 24 * 1024, gpus_used)], procs);
        snap.at = Duration::from_secs(s);
        snap
    }

    #[test]
    fn a_pod_peak_is_recorded_once_when_its_processes_are_gone() {
        let job = pod("job")
            .label(PROJECT_LABEL, "4711")
            .annotation(ANN, "8192");
        let view = pods([job]);
        let mut jp = JobPeaks::new(ANN, DEFAULT_MAX_SERIES);
        // Two processes of the pod; their sum is the pod's use.
        assert!(jp
            .observe(
                &at(
                    0,
                    5000,
                    vec![proc_pid(7, "job", 0, 3000), proc_pid(8, "job", 0, 1000)]
                ),
                &view
            )
            .is_empty());
        assert!(jp
            .observe(&at(1, 9000, vec![proc_in("job", 0, 9523)]), &view)
            .is_empty());
        assert!(jp
            .observe(&at(2, 4000, vec![proc_in("job", 0, 4000)]), &view)
            .is_empty());
        // Gone, but the pod still runs: not before LINGER.
        assert!(jp.observe(&at(3, 0, vec![]), &view).is_empty());
        let done = jp.observe(&at(12, 0, vec![]), &view);
        assert_eq!(done.len(), 1, "{done:?}");
        let p = &done[0];
        assert_eq!(p.peak, 9523 * MIB);
        assert_eq!(p.project.as_deref(), Some("4711"));
        assert_eq!(p.declared, Some(8 * GIB));
        assert!(p.pod_exists);
        assert_eq!(
            p.note(ANN),
            "GPU peak 9.3 GiB on GPU 0 (NVIDIA A10G, 24 GiB); declared 8 GiB"
        );
        // Once only.
        assert!(jp.observe(&at(30, 0, vec![]), &view).is_empty());
        let mut text = Vec::new();
        jp.render(&mut text);
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(
            "gpu_warden_ci_job_gpu_memory_peak_bytes_bucket{namespace=\"ci\",project=\"4711\",le=\"8589934592\"} 0\n"
        ), "{text}");
        assert!(text.contains(
            "gpu_warden_ci_job_gpu_memory_peak_bytes_bucket{namespace=\"ci\",project=\"4711\",le=\"12884901888\"} 1\n"
        ), "{text}");
        assert!(text.contains(
            "gpu_warden_ci_job_gpu_memory_peak_bytes_count{namespace=\"ci\",project=\"4711\"} 1\n"
        ));
        assert!(text.contains(&format!(
            "gpu_warden_ci_job_gpu_memory_peak_bytes_sum{{namespace=\"ci\",project=\"4711\"}} {}\n",
            9523 * MIB
        )));
    }

    #[test]
    fn a_deleted_pod_is_recorded_at_once_and_gets_no_event() {
        let mut jp = JobPeaks::new(ANN, DEFAULT_MAX_SERIES);
        let view = pods([pod("job").label(PROJECT_LABEL, "42")]);
        jp.observe(&at(0, 2000, vec![proc_in("job", 0, 2000)]), &view);
        let done = jp.observe(&at(1, 0, vec![]), &PodMap::new());
        assert_eq!(done.len(), 1);
        assert!(!done[0].pod_exists);
        assert_eq!(done[0].project.as_deref(), Some("42"), "kept from the view");
        assert_eq!(
            done[0].note(ANN),
            format!("GPU peak 2 GiB on GPU 0 (NVIDIA A10G, 24 GiB); no declared need ({ANN})")
        );
    }

    #[test]
    fn a_finished_pod_is_recorded_at_once_and_still_exists() {
        let mut jp = JobPeaks::new(ANN, DEFAULT_MAX_SERIES);
        let running = pods([pod("job")]);
        jp.observe(&at(0, 2000, vec![proc_in("job", 0, 2000)]), &running);
        let mut done = pods([pod("job")]);
        if let Some(p) = done.get_mut("job") {
            p.phase = Some("Succeeded".into());
        }
        let out = jp.observe(&at(1, 0, vec![]), &done);
        assert_eq!(out.len(), 1);
        assert!(out[0].pod_exists);
        let terminating = pods([pod("job2").terminating()]);
        jp.observe(&at(2, 2000, vec![proc_in("job2", 0, 2000)]), &terminating);
        assert_eq!(jp.observe(&at(3, 0, vec![]), &terminating).len(), 1);
    }

    #[test]
    fn a_gpu_without_a_process_list_keeps_its_pods_open() {
        let mut jp = JobPeaks::new(ANN, DEFAULT_MAX_SERIES);
        let view = PodMap::new();
        jp.observe(&at(0, 2000, vec![proc_in("job", 0, 2000)]), &view);
        let mut lost = at(1, 0, vec![]);
        lost.gpus[0].memory = None;
        assert!(jp.observe(&lost, &view).is_empty());
        assert_eq!(jp.observe(&at(2, 0, vec![]), &view).len(), 1);
    }

    #[test]
    fn series_are_bounded_and_label_values_escaped() {
        let mut jp = JobPeaks::new(ANN, 2);
        for (i, project) in ["a\"b", "c", "d", "e"].iter().enumerate() {
            let name = format!("job{i}");
            let view = pods([pod(&name).label(PROJECT_LABEL, project)]);
            jp.observe(&at(0, 100, vec![proc_in(&name, 0, 100)]), &view);
            assert_eq!(jp.observe(&at(1, 0, vec![]), &PodMap::new()).len(), 1);
        }
        let mut text = Vec::new();
        jp.render(&mut text);
        let text = String::from_utf8(text).unwrap();
        let counts: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpu_warden_ci_job_gpu_memory_peak_bytes_count"))
            .collect();
        assert_eq!(counts.len(), 3, "{counts:?}");
        assert!(text.contains("project=\"a\\\"b\""), "{text}");
        assert!(
            text.contains("_count{namespace=\"_other\",project=\"_other\"} 2"),
            "{text}"
        );
    }
}
