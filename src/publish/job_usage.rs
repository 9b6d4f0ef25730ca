//! What each CI job did with its GPU, per pod and GPU: how long it held a replica, how long
//! a process of it was on the GPU, and how much GPU time its processes used. Kept beside the
//! VRAM peak (`publish::job_peaks`, which owns the records and closes them) and closed at the
//! same moment; this file is the arithmetic, the underuse rule and the Event it asks for.
//!
//! Integration (docs/sizing.md, "Held and used"): at every full poll the interval since the
//! previous poll is credited with the state seen at this poll, for a record that was already
//! live at the previous one (the first sighting credits nothing, so a job's times run from
//! its first poll to its last). Busy time is the per-process SM utilisation NVML reports
//! (the share of the sampling period in which the process's kernels ran on the SMs), summed
//! over the pod's processes on that GPU, capped at 1, times the interval. Under
//! time-slicing the GPU runs one context at a time, so the busy seconds of the replicas of
//! one GPU sum to at most the GPU's own busy seconds; a replica whose neighbours compute
//! does not look busy itself. The utilisation may be read less often than the full poll
//! (`--process-util-interval`); a read gives the samples since the read before it, so the
//! polls in between are credited with the next read's figure, not the last one carried
//! forward (which made two time-sliced jobs of different duty read alike on the H200,
//! docs/validation.md §7), and a job's last stretch after its last read with the last
//! figure. A process that starts and ends between two reads is not seen busy.
//!
//! Pure: the tracker hands in the state at each poll, the injected clock's instants in it.

use super::job_peaks::JobPeak;
use crate::model::event::{EventDraft, EventType, Regarding};
use std::time::Duration;

/// The Event reason for a job that held a GPU long and used little of it.
pub const UNDERUSED_REASON: &str = "GPUUnderused";

/// The state of one (pod, GPU) at one poll.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UsageStep {
    /// The kubelet's pod-resources view names the pod as holding a replica of the GPU.
    pub held: bool,
    /// At least one process of the pod is on the GPU.
    pub with_process: bool,
    /// Σ of its processes' SM utilisation (0..1 each), when NVML gave one for any of them.
    pub sm_util: Option<f64>,
    /// `sm_util` was read at this poll (else carried from an earlier read).
    pub util_fresh: bool,
}

/// The running figures of one (pod, GPU).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageAcc {
    held: Duration,
    with_process: Duration,
    busy_secs: f64,
    util_known: bool,
    /// Time with a process since the last utilisation read, which the next read covers.
    awaiting_read: Duration,
    /// The last read's figure, for the stretch after it when the record closes first.
    last_util: Option<f64>,
    first_process: Option<Duration>,
    last_process: Option<Duration>,
    /// The poll this record was last live at: only an interval whose both ends it was live at
    /// is credited (a pod that left and came back is not credited for the gap).
    last_live: Option<Duration>,
}

impl UsageAcc {
    /// Folds in the state at poll `at`; `prev` is the previous full poll's instant. Returns
    /// the seconds credited as held with no process (the node's idle replica time).
    pub fn step(&mut self, at: Duration, prev: Option<Duration>, s: UsageStep) -> Duration {
        if !s.held && !s.with_process {
            return Duration::ZERO;
        }
        let dt = match (prev, self.last_live) {
            (Some(p), Some(l)) if p == l => at.saturating_sub(p),
            _ => Duration::ZERO,
        };
        self.last_live = Some(at);
        if s.with_process {
            self.first_process.get_or_insert(at);
            self.last_process = Some(at);
            self.with_process += dt;
            match (s.util_fresh, s.sm_util) {
                (true, Some(u)) => {
                    let u = u.clamp(0.0, 1.0);
                    self.util_known = true;
                    self.busy_secs += u * (self.awaiting_read + dt).as_secs_f64();
                    self.awaiting_read = Duration::ZERO;
                    self.last_util = Some(u);
                }
                // A read that gave nothing for this GPU covers nothing either.
                (true, None) => self.awaiting_read = Duration::ZERO,
                (false, _) => self.awaiting_read += dt,
            }
        }
        if s.held {
            self.held += dt;
            if !s.with_process {
                return dt;
            }
        }
        Duration::ZERO
    }

    /// A poll that could not list the GPU's processes: nothing is known of the interval, so
    /// the next one is not credited either.
    pub fn unknown(&mut self) {
        self.last_live = None;
    }

    fn busy_secs(&self) -> f64 {
        let tail = self
            .last_util
            .map_or(0.0, |u| u * self.awaiting_read.as_secs_f64());
        (self.busy_secs + tail).max(0.0)
    }

    /// The closed figures.
    pub fn close(&self) -> JobUsage {
        let span = match (self.first_process, self.last_process) {
            (Some(f), Some(l)) => l.saturating_sub(f),
            _ => Duration::ZERO,
        };
        JobUsage {
            // Without the kubelet's view (or for a pod it did not name) a job holds from its
            // first process to its last; with it, at least that long.
            held: self.held.max(span),
            with_process: self.with_process,
            // No process at all used no GPU time; processes without a utilisation reading
            // used an unknown amount.
            busy: (self.util_known || self.first_process.is_none())
                .then(|| Duration::from_secs_f64(self.busy_secs())),
        }
    }
}

/// One job's figures on one GPU, once closed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobUsage {
    /// Time holding a replica of the GPU.
    pub held: Duration,
    /// Time with at least one of its processes on the GPU.
    pub with_process: Duration,
    /// GPU time its processes used (integrated SM utilisation); zero for a job that never
    /// ran a process there; None when NVML gave no per-process utilisation for its
    /// processes (absent, not zero).
    pub busy: Option<Duration>,
}

impl JobUsage {
    /// Busy time over held time (0..1); None when unknown or nothing was held.
    pub fn share(&self) -> Option<f64> {
        let busy = self.busy?;
        (!self.held.is_zero()).then(|| (busy.as_secs_f64() / self.held.as_secs_f64()).min(1.0))
    }
}

/// When a finished job is told it held a GPU it hardly used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnderusePolicy {
    /// Held at least this long (shorter jobs cost little however idle).
    pub min_held: Duration,
    /// Busy share below this.
    pub max_share: f64,
}

/// Default [`UnderusePolicy::min_held`].
pub const DEFAULT_MIN_HELD: Duration = Duration::from_secs(600);
/// Default [`UnderusePolicy::max_share`].
pub const DEFAULT_MAX_SHARE: f64 = 0.10;

impl Default for UnderusePolicy {
    fn default() -> Self {
        UnderusePolicy {
            min_held: DEFAULT_MIN_HELD,
            max_share: DEFAULT_MAX_SHARE,
        }
    }
}

/// A busy-share threshold that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be a ratio from 0 to 1 (e.g. 0.1), got {0:?}")]
pub struct ShareError(pub String);

/// Parses `--job-underused-max-share`: a ratio 0..=1.
pub fn parse_share(s: &str) -> Result<f64, ShareError> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(ShareError(s.to_string())),
    }
}

impl UnderusePolicy {
    /// The Normal Event on the pod when `peak` (a closed record) held its GPU at least
    /// `min_held` and used less than `max_share` of it; None otherwise, or when the pod is
    /// gone or its utilisation unknown. A job that held a replica and never ran a process
    /// on it used none of it.
    pub fn notice(&self, peak: &JobPeak) -> Option<EventDraft> {
        let u = &peak.usage;
        let share = u.share()?;
        if !peak.pod_exists || u.held < self.min_held || share >= self.max_share {
            return None;
        }
        Some(EventDraft {
            namespace: peak.namespace.clone(),
            regarding: Regarding::Pod {
                namespace: peak.namespace.clone(),
                name: peak.pod.clone(),
                uid: peak.uid.clone(),
            },
            type_: EventType::Normal,
            reason: UNDERUSED_REASON,
            action: "Observe",
            note: underused_note(peak, share),
        })
    }
}

/// "Held GPU 0 (NVIDIA A10G) 14m 2s, used 40s (4.7 %), processes on it 3m, VRAM peak 9.3 GiB:
/// move the steps that need no GPU (setup, lint, uploads) into a CPU job".
fn underused_note(peak: &JobPeak, share: f64) -> String {
    let u = &peak.usage;
    format!(
        "Held GPU {} ({}) {}, used {} ({:.1} %), processes on it {}, VRAM peak {}: move the steps that need no GPU (setup, lint, uploads) into a CPU job",
        peak.gpu,
        peak.gpu_model,
        span(u.held),
        span(u.busy.unwrap_or_default()),
        share * 100.0,
        span(u.with_process),
        super::job_peaks::gib(peak.peak),
    )
}

/// Whole seconds as `1h 2m 3s`, `14m 2s`, `40s`.
fn span(d: Duration) -> String {
    let s = d.as_secs_f64().round() as u64;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m {s}s"),
        _ => format!("{h}h {m}m {s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Polls every second from 0 to `end`; `state(t)` is the state at poll t.
    fn run(end: u64, state: impl Fn(u64) -> Option<UsageStep>) -> (JobUsage, Duration) {
        let mut acc = UsageAcc::default();
        let mut idle = Duration::ZERO;
        let mut prev = None;
        for t in 0..=end {
            if let Some(s) = state(t) {
                idle += acc.step(secs(t), prev, s);
            }
            prev = Some(secs(t));
        }
        (acc.close(), idle)
    }

    fn held(with_process: bool, util: f64) -> Option<UsageStep> {
        Some(UsageStep {
            held: true,
            with_process,
            sm_util: with_process.then_some(util),
            util_fresh: true,
        })
    }

    #[test]
    fn shapes() {
        struct Case {
            name: &'static str,
            end: u64,
            state: fn(u64) -> Option<UsageStep>,
            held: u64,
            with_process: u64,
            busy: Option<u64>,
            idle: u64,
        }
        let cases = [
            Case {
                name: "idle holder: a replica held 600 s, never a process",
                end: 600,
                state: |_| held(false, 0.0),
                held: 600,
                with_process: 0,
                busy: Some(0),
                idle: 600,
            },
            Case {
                name: "half-busy: a process all along at 50 %",
                end: 600,
                state: |_| held(true, 0.5),
                held: 600,
                with_process: 600,
                busy: Some(300),
                idle: 0,
            },
            Case {
                name: "busy: two processes over 100 % together count once",
                end: 600,
                state: |_| held(true, 1.4),
                held: 600,
                with_process: 600,
                busy: Some(600),
                idle: 0,
            },
            Case {
                name: "idle, compute, idle: held 600 s, computed 100 s at 90 %",
                end: 600,
                state: |t| held((250..350).contains(&t), 0.9),
                held: 600,
                with_process: 100,
                busy: Some(90),
                idle: 500,
            },
            Case {
                name: "leaves mid-way: gone from the view and the GPU at 300 s",
                end: 600,
                state: |t| if t <= 300 { held(true, 0.2) } else { None },
                held: 300,
                with_process: 300,
                busy: Some(60),
                idle: 0,
            },
            Case {
                name: "no kubelet view: held from the first process to the last, gaps included",
                end: 600,
                state: |t| {
                    ((100..=200).contains(&t) || (300..=400).contains(&t)).then_some(UsageStep {
                        held: false,
                        with_process: true,
                        sm_util: Some(1.0),
                        util_fresh: true,
                    })
                },
                held: 300,
                with_process: 200,
                busy: Some(200),
                idle: 0,
            },
            Case {
                name: "no per-process utilisation: busy unknown",
                end: 60,
                state: |_| {
                    Some(UsageStep {
                        held: true,
                        with_process: true,
                        sm_util: None,
                        util_fresh: true,
                    })
                },
                held: 60,
                with_process: 60,
                busy: None,
                idle: 0,
            },
        ];
        for c in cases {
            let (u, idle) = run(c.end, c.state);
            assert_eq!(u.held, secs(c.held), "{}: held", c.name);
            assert_eq!(
                u.with_process,
                secs(c.with_process),
                "{}: with process",
                c.name
            );
            assert_eq!(
                u.busy.map(|b| b.as_secs_f64().round() as u64),
                c.busy,
                "{}: busy",
                c.name
            );
            assert_eq!(idle, secs(c.idle), "{}: idle", c.name);
        }
    }

    /// Utilisation read every 5 polls, each read the mean since the read before: a job busy
    /// for its first 20 s and idle for the next 20 is credited 20 s, not the 24 s of the
    /// read at 20 s carried over the polls after it; the stretch after its last read, with
    /// that read's figure.
    #[test]
    fn a_read_covers_the_polls_before_it_not_after() {
        let step = |t: u64| UsageStep {
            held: true,
            with_process: true,
            // The last read, at t rounded down to 5 s: the mean over the 5 s before it.
            sm_util: Some(if t / 5 * 5 <= 20 { 1.0 } else { 0.0 }),
            util_fresh: t % 5 == 0,
        };
        let (u, _) = run(40, |t| Some(step(t)));
        assert_eq!(u.busy, Some(secs(20)), "{u:?}");
        // Closed 3 s after its last read: those 3 s at that read's figure.
        let (u, _) = run(43, |t| {
            Some(UsageStep {
                sm_util: Some(0.5),
                ..step(t)
            })
        });
        assert_eq!(u.busy.map(|b| b.as_secs_f64()), Some(21.5), "{u:?}");
    }

    #[test]
    fn an_unknown_poll_credits_neither_side() {
        let mut acc = UsageAcc::default();
        let on = UsageStep {
            held: true,
            with_process: true,
            sm_util: Some(1.0),
            util_fresh: true,
        };
        acc.step(secs(0), None, on);
        acc.step(secs(1), Some(secs(0)), on);
        acc.unknown();
        acc.step(secs(3), Some(secs(2)), on);
        acc.step(secs(4), Some(secs(3)), on);
        let u = acc.close();
        assert_eq!(u.with_process, secs(2));
        assert_eq!(u.busy, Some(secs(2)));
        // The process span still counts as held.
        assert_eq!(u.held, secs(4));
    }

    #[test]
    fn share_and_spans() {
        let u = JobUsage {
            held: secs(842),
            with_process: secs(190),
            busy: Some(secs(40)),
        };
        assert!((u.share().unwrap() - 40.0 / 842.0).abs() < 1e-9);
        assert_eq!(JobUsage::default().share(), None);
        assert_eq!(span(secs(842)), "14m 2s");
        assert_eq!(span(secs(40)), "40s");
        assert_eq!(span(secs(3723)), "1h 2m 3s");
    }

    #[test]
    fn share_flag_values() {
        assert_eq!(parse_share("0.1"), Ok(0.1));
        assert_eq!(parse_share("0"), Ok(0.0));
        assert_eq!(parse_share("1"), Ok(1.0));
        for bad in ["1.5", "-0.1", "10%", "", "NaN"] {
            assert_eq!(
                parse_share(bad).unwrap_err().to_string(),
                format!("must be a ratio from 0 to 1 (e.g. 0.1), got {bad:?}")
            );
        }
    }
}
