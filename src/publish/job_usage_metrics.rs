//! The families of each CI job's held and used GPU time (`publish::job_usage`), bounded as
//! the VRAM-peak histogram is: per `(namespace, project)`, at most the same number of label
//! pairs, further jobs under `_other`. Counters grow when a job's record closes (at its end);
//! the node's idle replica time grows at every poll. Nothing is rendered before the first
//! record closes, nor the idle counter before the kubelet's view was first seen (absent,
//! not zero).

use super::job_peaks::{JobPeak, OTHER};
use super::text::{Family, Kind, LabelTail};
use std::collections::BTreeMap;
use std::time::Duration;

const HELD: &str = "gpu_warden_ci_job_gpu_replica_seconds_total";
const HELD_HELP: &str = "Seconds CI jobs held a replica of a GPU (per pod and GPU; from the kubelet's pod-resources view, else from the first to the last process), added when a job's record closes, by namespace and GitLab project.";
const BUSY: &str = "gpu_warden_ci_job_gpu_busy_seconds_total";
const BUSY_HELP: &str = "GPU time CI jobs' processes used: their per-process SM utilisation integrated over time (under time-slicing the replicas of one GPU sum to at most the GPU's busy time), added when a job's record closes, by namespace and GitLab project. Jobs without per-process utilisation are not counted.";
const SHARE: &str = "gpu_warden_ci_job_gpu_busy_share";
const SHARE_HELP: &str = "Each CI job's busy seconds over its held seconds on one GPU (one observation per pod and GPU, when its record closes), by namespace and GitLab project.";
const IDLE: &str = "gpu_warden_gpu_replica_idle_seconds_total";
const IDLE_HELP: &str = "Seconds pods held a replica of one of this node's GPUs with no process of theirs on it (per pod and GPU), from the kubelet's pod-resources view.";

/// The `(namespace, project)` label pair, borrowed: rendering allocates nothing.
fn pair<'a>(ns: &'a str, project: &'a str) -> impl FnOnce(&mut LabelTail<'_>) + 'a {
    move |t| {
        t.label("namespace", ns);
        t.label("project", project);
    }
}

/// Upper bounds of the busy-share histogram.
pub const SHARE_BUCKETS: [f64; 7] = [0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0];

#[derive(Debug, Clone, Default)]
struct Series {
    held_secs: f64,
    busy_secs: f64,
    /// Whether any job of the pair had a known busy time (else no busy series).
    busy_known: bool,
    buckets: [u64; SHARE_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// The counters and the histogram.
#[derive(Debug, Clone, Default)]
pub struct UsageSeries {
    max_series: usize,
    series: BTreeMap<(String, String), Series>,
    idle_secs: Option<f64>,
}

impl UsageSeries {
    /// Keeps at most `max_series` label pairs.
    pub fn new(max_series: usize) -> Self {
        UsageSeries {
            max_series: max_series.max(1),
            ..UsageSeries::default()
        }
    }

    /// Adds a poll's idle replica time; called with zero on every poll the kubelet's view
    /// is there, so the counter appears with the view.
    pub fn add_idle(&mut self, d: Duration) {
        *self.idle_secs.get_or_insert(0.0) += d.as_secs_f64();
    }

    /// Counts a closed record.
    pub fn record(&mut self, job: &JobPeak) {
        let mut key = (
            job.namespace.clone(),
            job.project.clone().unwrap_or_default(),
        );
        if !self.series.contains_key(&key) && self.series.len() >= self.max_series {
            key = (OTHER.to_string(), OTHER.to_string());
        }
        let s = self.series.entry(key).or_default();
        s.held_secs += job.usage.held.as_secs_f64();
        if let Some(b) = job.usage.busy {
            s.busy_known = true;
            s.busy_secs += b.as_secs_f64();
        }
        if let Some(share) = job.usage.share() {
            for (i, bound) in SHARE_BUCKETS.iter().enumerate() {
                if share <= *bound {
                    s.buckets[i] += 1;
                }
            }
            s.count += 1;
            s.sum += share;
        }
    }

    /// Appends the families.
    pub fn render(&self, out: &mut Vec<u8>) {
        let mut f = Family::open(out, HELD, HELD_HELP, Kind::Counter);
        for ((ns, project), s) in &self.series {
            f.sample_with(None, b"", pair(ns, project), s.held_secs);
        }
        f.close();
        let mut f = Family::open(out, BUSY, BUSY_HELP, Kind::Counter);
        for ((ns, project), s) in self.series.iter().filter(|(_, s)| s.busy_known) {
            f.sample_with(None, b"", pair(ns, project), s.busy_secs);
        }
        f.close();
        let mut f = Family::open(out, SHARE, SHARE_HELP, Kind::Histogram);
        for ((ns, project), s) in self.series.iter().filter(|(_, s)| s.count > 0) {
            for (i, bound) in SHARE_BUCKETS.iter().enumerate() {
                f.sample_with(
                    Some("_bucket"),
                    b"",
                    |t| {
                        pair(ns, project)(t);
                        t.label_f64("le", *bound);
                    },
                    s.buckets[i] as f64,
                );
            }
            f.sample_with(
                Some("_bucket"),
                b"",
                |t| {
                    pair(ns, project)(t);
                    t.label("le", "+Inf");
                },
                s.count as f64,
            );
            f.sample_with(Some("_sum"), b"", pair(ns, project), s.sum);
            f.sample_with(Some("_count"), b"", pair(ns, project), s.count as f64);
        }
        f.close();
        if let Some(idle) = self.idle_secs {
            let mut f = Family::open(out, IDLE, IDLE_HELP, Kind::Counter);
            f.sample(b"", idle);
            f.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::model::pod::PodMap;
    use crate::model::replicas::ReplicaView;
    use crate::publish::job_peaks::{JobPeaks, PROJECT_LABEL};
    use crate::publish::job_usage::{UnderusePolicy, UNDERUSED_REASON};
    use crate::testkit::fixtures::*;

    const ANN: &str = "gpu-warden.io/vram-request-mib";

    /// A view in which each (pod, GPU index) holds one replica.
    fn view(holds: &[(&str, u32)]) -> ReplicaView {
        let mut v = ReplicaView::default();
        for (pod, gpu) in holds {
            v.allocations
                .pod_gpus
                .entry(("ci".to_string(), pod.to_string()))
                .or_default()
                .insert(format!("GPU-{gpu:08}"));
        }
        v
    }

    fn util(
        mut p: crate::model::snapshot::ProcessSample,
        u: f64,
    ) -> crate::model::snapshot::ProcessSample {
        p.sm_util = Some(u);
        p
    }

    fn text(jp: &JobPeaks) -> String {
        let mut out = Vec::new();
        jp.render(&mut out);
        String::from_utf8(out).unwrap()
    }

    /// Four jobs on a two-GPU node, polled every second for 20 minutes: `idle` holds a
    /// replica of GPU 0 and never runs a process; `half` computes at 50 % all along; `mid`
    /// holds GPU 1, computes at full speed for 100 s and leaves at 300 s (gone from both
    /// views); `two` holds both GPUs and computes on GPU 1 only, from 600 s to 660 s.
    #[test]
    fn jobs_of_known_shapes_on_two_gpus() {
        let all = [
            pod("idle").label(PROJECT_LABEL, "1"),
            pod("half").label(PROJECT_LABEL, "1"),
            pod("mid").label(PROJECT_LABEL, "2"),
            pod("two").label(PROJECT_LABEL, "2"),
        ];
        let mut jp = JobPeaks::new(ANN, 100).with_underuse(UnderusePolicy::default());
        let mut closed = Vec::new();
        let mut notices = Vec::new();
        for t in 0..=1200u64 {
            let mut holds = vec![("idle", 0), ("half", 0), ("two", 0), ("two", 1)];
            let mut procs = vec![util(proc_in("half", 0, 2000), 0.5)];
            let mut present: Vec<_> = all.iter().filter(|p| p.0.uid != "mid").cloned().collect();
            if t <= 300 {
                holds.push(("mid", 1));
                present.push(all[2].clone());
                if (100..200).contains(&t) {
                    procs.push(util(proc_in("mid", 1, 4000), 1.0));
                }
            }
            if (600..660).contains(&t) {
                procs.push(util(proc_in("two", 1, 1000), 0.8));
            }
            if t == 1200 {
                // The jobs end: finished pods hold nothing and run nothing.
                holds.clear();
                procs.clear();
                for p in &mut present {
                    p.0.phase = Some("Succeeded".into());
                }
            }
            let view_now = view(&holds);
            let pods_now: PodMap = pods(present);
            let mut s = snap(vec![gpu(0, 24576, 0), gpu(1, 24576, 0)], procs);
            s.at = secs(t as f64);
            for p in jp.observe(&s, &pods_now, Some(&view_now)) {
                notices.extend(jp.notices(&p));
                closed.push(p);
            }
        }
        let find = |pod: &str, gpu: u32| {
            closed
                .iter()
                .find(|p| p.pod == pod && p.gpu == gpu)
                .unwrap_or_else(|| panic!("{pod} on GPU {gpu} not closed: {closed:?}"))
        };
        let idle = find("idle", 0);
        assert_eq!(idle.usage.held, secs(1199.0));
        assert_eq!(idle.usage.with_process, secs(0.0));
        assert_eq!(idle.usage.busy, Some(secs(0.0)), "no process: no GPU time");
        assert!(!idle.peak_known);
        let half = find("half", 0);
        assert_eq!(half.usage.held, secs(1199.0));
        assert_eq!(half.usage.busy.map(|b| b.as_secs()), Some(599));
        assert!(half.peak_known);
        let mid = find("mid", 1);
        // Live at polls 0..=300, closed at 301 once the pod is gone from the pod view.
        assert_eq!(mid.usage.held, secs(300.0));
        assert_eq!(mid.usage.with_process, secs(100.0));
        assert_eq!(mid.usage.busy, Some(secs(100.0)));
        assert!(!mid.pod_exists);
        let two0 = find("two", 0);
        assert_eq!(two0.usage.held, secs(1199.0));
        assert_eq!(two0.usage.busy, Some(secs(0.0)));
        let two1 = find("two", 1);
        assert_eq!(two1.usage.held, secs(1199.0));
        assert_eq!(two1.usage.with_process, secs(60.0));
        assert!((two1.usage.busy.unwrap().as_secs_f64() - 48.0).abs() < 1e-6);
        // The jobs that held a replica 20 minutes and used under 10 % of it: the idle
        // holder, and "two" on both GPUs; "half" used half, "mid" is gone.
        let underused: Vec<_> = notices
            .iter()
            .filter(|n| n.reason == UNDERUSED_REASON)
            .map(|n| match &n.regarding {
                crate::model::event::Regarding::Pod { name, .. } => name.as_str(),
                crate::model::event::Regarding::Node { name } => name.as_str(),
            })
            .collect();
        assert_eq!(underused, ["idle", "two", "two"], "{notices:?}");
        let n = notices
            .iter()
            .rfind(|n| n.reason == UNDERUSED_REASON)
            .unwrap();
        assert_eq!(
            n.note,
            "Held GPU 1 (NVIDIA A10G) 19m 59s, used 48s (4.0 %), processes on it 1m 0s, VRAM peak 1 GiB: move the steps that need no GPU (setup, lint, uploads) into a CPU job"
        );
        let t = text(&jp);
        let held1 = 1199.0 * 2.0;
        let held2 = 300.0 + 1199.0 * 2.0;
        assert!(t.contains(&format!("gpu_warden_ci_job_gpu_replica_seconds_total{{namespace=\"ci\",project=\"1\"}} {held1}\n")), "{t}");
        assert!(t.contains(&format!("gpu_warden_ci_job_gpu_replica_seconds_total{{namespace=\"ci\",project=\"2\"}} {held2}\n")), "{t}");
        assert!(t.contains("gpu_warden_ci_job_gpu_busy_share_bucket{namespace=\"ci\",project=\"1\",le=\"0.5\"} 2\n"), "{t}");
        assert!(t.contains("gpu_warden_ci_job_gpu_busy_share_bucket{namespace=\"ci\",project=\"2\",le=\"0.05\"} 2\n"), "{t}");
        assert!(
            t.contains(
                "gpu_warden_ci_job_gpu_busy_share_count{namespace=\"ci\",project=\"2\"} 3\n"
            ),
            "{t}"
        );
        // Idle replica time: idle 1199 + two on GPU 0 1199 + two on GPU 1 (1199 - 60)
        // + mid (300 - 100).
        let idle_total = 1199.0 * 2.0 + 1139.0 + 200.0;
        assert!(
            t.contains(&format!(
                "gpu_warden_gpu_replica_idle_seconds_total {idle_total}\n"
            )),
            "{t}"
        );
    }

    #[test]
    fn nothing_is_rendered_before_a_record_closes_nor_the_idle_counter_without_a_view() {
        let mut jp = JobPeaks::new(ANN, 100);
        let view_pods = pods([pod("a")]);
        let mut s = snap(vec![gpu(0, 24576, 0)], vec![proc_in("a", 0, 10)]);
        jp.observe(&s, &view_pods, None);
        assert_eq!(text(&jp), "");
        s.at = secs(1.0);
        s.processes.clear();
        let done = jp.observe(&s, &PodMap::new(), None);
        assert_eq!(done.len(), 1);
        let t = text(&jp);
        assert!(
            t.contains(
                "gpu_warden_ci_job_gpu_replica_seconds_total{namespace=\"ci\",project=\"\"} 0\n"
            ),
            "{t}"
        );
        assert!(
            !t.contains("busy_seconds_total"),
            "no utilisation read: {t}"
        );
        assert!(!t.contains("replica_idle_seconds_total"), "{t}");
    }

    #[test]
    fn series_are_capped_like_the_peaks() {
        let mut jp = JobPeaks::new(ANN, 2);
        for (i, project) in ["a", "b", "c"].iter().enumerate() {
            let name = format!("job{i}");
            let view_pods = pods([pod(&name).label(PROJECT_LABEL, project)]);
            let mut s = snap(vec![gpu(0, 24576, 0)], vec![proc_in(&name, 0, 10)]);
            s.at = secs(2.0 * i as f64);
            jp.observe(&s, &view_pods, None);
            s.at = secs(2.0 * i as f64 + 1.0);
            s.processes.clear();
            assert_eq!(jp.observe(&s, &PodMap::new(), None).len(), 1);
        }
        let t = text(&jp);
        let held: Vec<_> = t
            .lines()
            .filter(|l| l.starts_with("gpu_warden_ci_job_gpu_replica_seconds_total{"))
            .collect();
        assert_eq!(held.len(), 3, "{t}");
        assert!(
            t.contains("replica_seconds_total{namespace=\"_other\",project=\"_other\"} 0\n"),
            "{t}"
        );
    }
}
