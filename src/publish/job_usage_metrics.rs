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
        let mut key = (job.namespace.clone(), job.project.clone().unwrap_or_default());
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
