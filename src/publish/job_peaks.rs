//! Each CI job's VRAM peak: per pod and GPU, the most memory its processes held together
//! at one full poll over the pod's life, recorded once the processes are gone. Operators
//! size `replicas` and `vram-request-mib` from these (docs/sizing.md).
//!
//! Pure: the agent hands it every attributed full poll, the pod view and the kubelet's
//! replica view; it returns the peaks that ended, keeps the histogram
//! `gpu_warden_ci_job_gpu_memory_peak_bytes` and renders it. The same records carry what
//! each job did with its GPU (`publish::job_usage`): a pod holding a replica of a GPU has a
//! record there before its first process and keeps it until it stops holding, so the held
//! and used times close with the peak.

use super::job_usage::{JobUsage, UnderusePolicy, UsageAcc, UsageStep};
use super::job_usage_metrics::UsageSeries;
use super::text::{Family, Kind, LabelTail};
use crate::model::event::{EventDraft, EventType, Regarding};
use crate::model::pod::PodMap;
use crate::model::replicas::ReplicaView;
use crate::model::snapshot::{Owner, Snapshot, MIB};
use std::collections::{BTreeMap, HashMap, HashSet};
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
    /// Whether a process of the pod with a memory reading was seen on the GPU: a pod that
    /// only held a replica has no peak to record.
    pub peak_known: bool,
    /// What the job did with the GPU.
    pub usage: JobUsage,
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
pub(crate) fn gib(bytes: u64) -> String {
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
    peak_known: bool,
    last_seen: Duration,
    usage: UsageAcc,
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
    usage: UsageSeries,
    underuse: UnderusePolicy,
    /// The previous full poll's instant: the interval each record's usage is credited for.
    last_poll: Option<Duration>,
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
            usage: UsageSeries::new(max_series),
            underuse: UnderusePolicy::default(),
            last_poll: None,
        }
    }

    /// Tells finished jobs they held a GPU they hardly used as `policy` says.
    pub fn with_underuse(mut self, policy: UnderusePolicy) -> Self {
        self.underuse = policy;
        self
    }

    /// The Events a closed record asks for on its pod (when it still exists): its peak,
    /// and that it held the GPU long and used little of it.
    pub fn notices(&self, peak: &JobPeak) -> Vec<EventDraft> {
        let mut out = Vec::new();
        if peak.pod_exists && peak.peak_known {
            out.push(peak.notice(&self.request_annotation));
        }
        out.extend(self.underuse.notice(peak));
        out
    }

    /// The annotation declared needs are read from.
    pub fn request_annotation(&self) -> &str {
        &self.request_annotation
    }

    /// Folds in a full poll and returns the peaks that ended with it: a pod whose
    /// processes left a GPU, and that holds no replica of it in `replicas` (the kubelet's
    /// view, when there is one), is recorded at once when the pod is gone from the view,
    /// terminating or finished, and after [`LINGER`] otherwise. GPUs the poll could not
    /// list processes for (lost, or no memory reading) keep their pods open.
    pub fn observe(
        &mut self,
        snap: &Snapshot,
        pods: &PodMap,
        replicas: Option<&ReplicaView>,
    ) -> Vec<JobPeak> {
        let now_used = pod_use(snap);
        let holding = holders(snap, pods, replicas);
        for (uid, gpu) in now_used.keys().chain(holding.iter()) {
            let info = pods.get(*uid);
            let live = self
                .live
                .entry(((*uid).to_string(), *gpu))
                .or_insert_with(|| Live {
                    namespace: info.map(|i| i.namespace.clone()).unwrap_or_default(),
                    pod: info.map(|i| i.name.clone()).unwrap_or_default(),
                    project: None,
                    declared: None,
                    peak: 0,
                    peak_known: false,
                    last_seen: snap.at,
                    usage: UsageAcc::default(),
                });
            if let Some(u) = now_used.get(&(*uid, *gpu)) {
                live.namespace = u.namespace.to_string();
                live.pod = u.pod.to_string();
                if u.memory_known {
                    live.peak = live.peak.max(u.used);
                    live.peak_known = true;
                }
            }
            live.last_seen = snap.at;
            if let Some(info) = info {
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
        let mut idle = std::time::Duration::ZERO;
        for ((uid, gpu), live) in &mut self.live {
            if !listed(*gpu) {
                live.usage.unknown();
                continue;
            }
            let u = now_used.get(&(uid.as_str(), *gpu));
            idle += live.usage.step(
                snap.at,
                self.last_poll,
                UsageStep {
                    held: holding.contains(&(uid.as_str(), *gpu)),
                    with_process: u.is_some(),
                    sm_util: u.and_then(|u| u.sm_util),
                    util_fresh: snap.util_fresh,
                },
            );
        }
        if replicas.is_some() {
            self.usage.add_idle(idle);
        }
        self.last_poll = Some(snap.at);
        let ended: Vec<(String, u32)> = self
            .live
            .iter()
            .filter(|((uid, gpu), live)| {
                let key = (uid.as_str(), *gpu);
                if now_used.contains_key(&key) || holding.contains(&key) || !listed(*gpu) {
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
                peak_known: live.peak_known,
                usage: live.usage.close(),
            };
            self.record(&peak);
            out.push(peak);
        }
        out.sort_by(|a, b| (&a.namespace, &a.pod, a.gpu).cmp(&(&b.namespace, &b.pod, b.gpu)));
        out
    }

    fn record(&mut self, peak: &JobPeak) {
        self.usage.record(peak);
        if !peak.peak_known {
            return;
        }
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
        self.usage.render(out);
    }
}

/// A pod's processes on one GPU at one poll.
struct PodUse<'a> {
    namespace: &'a str,
    pod: &'a str,
    /// Σ of the memory readings, and whether there was any.
    used: u64,
    memory_known: bool,
    /// Σ of the SM utilisation readings, when there was any.
    sm_util: Option<f64>,
}

/// The poll's pod processes by (pod UID, GPU).
fn pod_use(snap: &Snapshot) -> HashMap<(&str, u32), PodUse<'_>> {
    let mut out: HashMap<(&str, u32), PodUse<'_>> = HashMap::new();
    for p in &snap.processes {
        let Owner::Pod(r) = &p.owner else { continue };
        let e = out.entry((r.uid.as_str(), p.gpu)).or_insert(PodUse {
            namespace: r.namespace.as_str(),
            pod: r.pod.as_str(),
            used: 0,
            memory_known: false,
            sm_util: None,
        });
        if let Some(b) = p.used_bytes {
            e.used = e.used.saturating_add(b);
            e.memory_known = true;
        }
        if let Some(u) = p.sm_util {
            e.sm_util = Some(e.sm_util.unwrap_or(0.0) + u);
        }
    }
    out
}

/// The running pods the kubelet's view names as holding a replica of one of the poll's
/// GPUs, by (pod UID, GPU index). A pod that is finished or terminating does not hold on:
/// the kubelet's view lags behind the pod view.
fn holders<'a>(
    snap: &Snapshot,
    pods: &'a PodMap,
    replicas: Option<&ReplicaView>,
) -> HashSet<(&'a str, u32)> {
    let mut out = HashSet::new();
    let Some(view) = replicas else {
        return out;
    };
    let by_name: HashMap<(&str, &str), &crate::model::pod::PodInfo> = pods
        .values()
        .filter(|p| is_running(p))
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), p))
        .collect();
    for ((ns, name), gpus) in &view.allocations.pod_gpus {
        let Some(info) = by_name.get(&(ns.as_str(), name.as_str())) else {
            continue;
        };
        for g in snap.gpus.iter().filter(|g| gpus.contains(&g.id.uuid)) {
            out.insert((info.uid.as_str(), g.id.index));
        }
    }
    out
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
                &view,
                None
            )
            .is_empty());
        assert!(jp
            .observe(&at(1, 9000, vec![proc_in("job", 0, 9523)]), &view, None)
            .is_empty());
        assert!(jp
            .observe(&at(2, 4000, vec![proc_in("job", 0, 4000)]), &view, None)
            .is_empty());
        // Gone, but the pod still runs: not before LINGER.
        assert!(jp.observe(&at(3, 0, vec![]), &view, None).is_empty());
        let done = jp.observe(&at(12, 0, vec![]), &view, None);
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
        assert!(jp.observe(&at(30, 0, vec![]), &view, None).is_empty());
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
        jp.observe(&at(0, 2000, vec![proc_in("job", 0, 2000)]), &view, None);
        let done = jp.observe(&at(1, 0, vec![]), &PodMap::new(), None);
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
        jp.observe(&at(0, 2000, vec![proc_in("job", 0, 2000)]), &running, None);
        let mut done = pods([pod("job")]);
        if let Some(p) = done.get_mut("job") {
            p.phase = Some("Succeeded".into());
        }
        let out = jp.observe(&at(1, 0, vec![]), &done, None);
        assert_eq!(out.len(), 1);
        assert!(out[0].pod_exists);
        let terminating = pods([pod("job2").terminating()]);
        jp.observe(
            &at(2, 2000, vec![proc_in("job2", 0, 2000)]),
            &terminating,
            None,
        );
        assert_eq!(jp.observe(&at(3, 0, vec![]), &terminating, None).len(), 1);
    }

    #[test]
    fn a_pod_holding_a_replica_keeps_its_record_until_it_lets_go_or_stops_running() {
        let mut view = ReplicaView::default();
        view.allocations
            .pod_gpus
            .entry(("ci".to_string(), "job".to_string()))
            .or_default()
            .insert("GPU-00000000".to_string());
        let running = pods([pod("job")]);
        let mut jp = JobPeaks::new(ANN, DEFAULT_MAX_SERIES);
        jp.observe(
            &at(0, 2000, vec![proc_in("job", 0, 2000)]),
            &running,
            Some(&view),
        );
        // Its process is gone for longer than LINGER, but it still holds the replica.
        assert!(jp
            .observe(&at(30, 0, vec![]), &running, Some(&view))
            .is_empty());
        let done = jp.observe(&at(31, 0, vec![]), &running, Some(&ReplicaView::default()));
        assert!(
            done.is_empty(),
            "let go: LINGER counts from the last poll it held"
        );
        assert_eq!(jp.observe(&at(41, 0, vec![]), &running, None).len(), 1);
        // A finished pod the kubelet's view still names (it lags) is closed at once.
        let mut finished = pods([pod("job")]);
        if let Some(p) = finished.get_mut("job") {
            p.phase = Some("Succeeded".into());
        }
        jp.observe(&at(50, 0, vec![]), &running, Some(&view));
        let out = jp.observe(&at(51, 0, vec![]), &finished, Some(&view));
        assert_eq!(out.len(), 1);
        assert!(!out[0].peak_known, "it never ran a process: no peak");
        assert_eq!(out[0].usage.held, Duration::from_secs(0));
    }

    #[test]
    fn a_gpu_without_a_process_list_keeps_its_pods_open() {
        let mut jp = JobPeaks::new(ANN, DEFAULT_MAX_SERIES);
        let view = PodMap::new();
        jp.observe(&at(0, 2000, vec![proc_in("job", 0, 2000)]), &view, None);
        let mut lost = at(1, 0, vec![]);
        lost.gpus[0].memory = None;
        assert!(jp.observe(&lost, &view, None).is_empty());
        assert_eq!(jp.observe(&at(2, 0, vec![]), &view, None).len(), 1);
    }

    #[test]
    fn series_are_bounded_and_label_values_escaped() {
        let mut jp = JobPeaks::new(ANN, 2);
        for (i, project) in ["a\"b", "c", "d", "e"].iter().enumerate() {
            let name = format!("job{i}");
            let view = pods([pod(&name).label(PROJECT_LABEL, project)]);
            jp.observe(&at(0, 100, vec![proc_in(&name, 0, 100)]), &view, None);
            assert_eq!(jp.observe(&at(1, 0, vec![]), &PodMap::new(), None).len(), 1);
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
