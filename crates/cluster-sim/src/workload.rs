//! The job stream: GitLab CI jobs arriving at a GPU runner. Drawn once per seed, before any
//! policy runs, so every policy serves exactly the same jobs (common random numbers: the
//! differences in the report come from the policy, not from the draw).

use crate::rng::Rng;

/// MiB in a GiB.
pub const GIB: f64 = 1024.0;

/// The shape of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadModel {
    /// Mean arrivals per minute (a Poisson process).
    pub arrivals_per_min: f64,
    /// Median job duration, seconds (log-normal).
    pub duration_median_s: f64,
    /// Log-space sigma of the duration.
    pub duration_sigma: f64,
    /// Shortest and longest job, seconds.
    pub duration_clamp_s: (f64, f64),
    /// Median VRAM peak of the body of the distribution, MiB (log-normal).
    pub peak_median_mib: f64,
    /// Log-space sigma of the body.
    pub peak_sigma: f64,
    /// Share of jobs in the heavy tail (Pareto from `tail_min_mib`).
    pub tail_share: f64,
    /// Where the tail starts, MiB.
    pub tail_min_mib: f64,
    /// Pareto shape of the tail.
    pub tail_alpha: f64,
    /// Smallest and largest peak, MiB.
    pub peak_clamp_mib: (f64, f64),
    /// Share of its peak a job allocates at once when it starts (context + weights).
    pub start_share: f64,
    /// Share of its duration within which a job makes its further allocations.
    pub ramp_share: f64,
    /// Fewest and most further allocations after the first (each a step, at a random time
    /// in the ramp: frameworks allocate in chunks, not smoothly).
    pub steps: (u32, u32),
    /// Median share of a GPU's compute a job keeps busy when alone (log-normal, σ 0.6,
    /// 0.05–1): time-slicing shares the compute, so jobs on a GPU whose shares add past 1
    /// run slower.
    pub busy_median: f64,
    /// GitLab projects the jobs come from; each has its own typical peak.
    pub projects: u32,
    /// Share of jobs that declare `vram-request-mib`.
    pub declared_share: f64,
    /// Of the declaring jobs, the share whose declaration is too low.
    pub under_declared_share: f64,
    /// Share of jobs with a workspace that comes and goes (training steps, evaluation,
    /// cuDNN workspaces): part of their peak held only for a while, again and again.
    pub workspace_share: f64,
    /// The workspace's share of such a job's peak (uniform in this range).
    pub workspace_peak_share: (f64, f64),
    /// Its period, seconds of progress (uniform in this range).
    pub workspace_every_s: (f64, f64),
    /// The share of each period it is held (uniform in this range).
    pub workspace_holds: (f64, f64),
}

impl Default for WorkloadModel {
    fn default() -> Self {
        WorkloadModel {
            arrivals_per_min: 16.0,
            duration_median_s: 600.0,
            duration_sigma: 0.7,
            duration_clamp_s: (60.0, 5400.0),
            peak_median_mib: 2.5 * GIB,
            peak_sigma: 0.55,
            tail_share: 0.12,
            tail_min_mib: 6.0 * GIB,
            tail_alpha: 1.4,
            peak_clamp_mib: (0.5 * GIB, 21.0 * GIB),
            start_share: 0.4,
            ramp_share: 0.5,
            steps: (2, 6),
            busy_median: 0.25,
            projects: 40,
            declared_share: 0.6,
            under_declared_share: 0.2,
            workspace_share: 0.3,
            workspace_peak_share: (0.15, 0.45),
            workspace_every_s: (3.0, 40.0),
            workspace_holds: (0.2, 0.7),
        }
    }
}

/// One CI job as submitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Sequence number.
    pub id: u64,
    /// Arrival, seconds after the start.
    pub arrive_s: f64,
    /// Run time once started, seconds (a retried job runs it all again).
    pub duration_s: f64,
    /// VRAM peak, MiB.
    pub peak_mib: u64,
    /// The `vram-request-mib` it declares, if any.
    pub declared_mib: Option<u64>,
    /// Annotated `evict: never` (protected from the guard).
    pub protected: bool,
    /// Its GitLab project (the pod label `project.runner.gitlab.com/id`).
    pub project: u32,
    /// Share of a GPU's compute it keeps busy alone.
    pub busy: f64,
    /// Its allocations: `(seconds of progress, MiB held from then on)`, the first at 0,
    /// the last reaching the peak less its workspace.
    pub allocations: Vec<(f64, u64)>,
    /// A workspace that comes and goes on top of the allocations, if it has one.
    pub workspace: Option<Workspace>,
}

/// Memory a job allocates for a part of every period of its progress and frees again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workspace {
    /// MiB allocated while held.
    pub mib: u64,
    /// Period, seconds of progress.
    pub every_s: f64,
    /// Held for the first this many seconds of each period.
    pub holds_s: f64,
}

impl Workspace {
    /// MiB held after `progress_s` seconds of progress.
    pub fn mib_at(&self, progress_s: f64) -> u64 {
        if progress_s > 0.0 && progress_s.rem_euclid(self.every_s) < self.holds_s {
            self.mib
        } else {
            0
        }
    }
}

impl Job {
    /// MiB the job holds after `progress_s` seconds of progress: its allocations and, when
    /// held, its workspace.
    pub fn used_mib_at(&self, progress_s: f64) -> u64 {
        self.base_mib_at(progress_s) + self.workspace.map_or(0, |w| w.mib_at(progress_s))
    }

    /// MiB of its allocations alone after `progress_s` seconds: what only grows.
    pub fn base_mib_at(&self, progress_s: f64) -> u64 {
        self.allocations
            .iter()
            .take_while(|(at, _)| *at <= progress_s)
            .last()
            .map(|(_, mib)| *mib)
            .unwrap_or(0)
    }

    /// A job that allocates `start_share` of its peak at once and grows linearly to it
    /// over `ramp_share` of its duration, sampled every 2 s of progress (tests).
    pub fn smooth(
        id: u64,
        arrive_s: f64,
        duration_s: f64,
        peak_mib: u64,
        declared_mib: Option<u64>,
        m: &WorkloadModel,
    ) -> Job {
        let ramp = (m.ramp_share * duration_s).max(1.0);
        let mut allocations = Vec::new();
        let mut t = 0.0;
        while t <= ramp + 2.0 {
            let share = m.start_share + (1.0 - m.start_share) * (t / ramp).clamp(0.0, 1.0);
            allocations.push((t, (peak_mib as f64 * share).round() as u64));
            t += 2.0;
        }
        Job {
            id,
            arrive_s,
            duration_s,
            peak_mib,
            declared_mib,
            protected: false,
            project: 0,
            busy: 0.1,
            allocations,
            workspace: None,
        }
    }
}

/// The allocation steps of a job: `start_share` at once, then `k` chunks at random
/// times within the ramp, of random sizes, ending at the peak.
fn allocations(
    peak_mib: u64,
    duration_s: f64,
    m: &WorkloadModel,
    rng: &mut Rng,
) -> Vec<(f64, u64)> {
    let first = (peak_mib as f64 * m.start_share).round() as u64;
    let (lo, hi) = m.steps;
    let k = lo + (rng.uniform() * (hi - lo + 1) as f64) as u32;
    let ramp = (m.ramp_share * duration_s).max(1.0);
    let mut times: Vec<f64> = (0..k).map(|_| rng.range(1.0, ramp)).collect();
    times.sort_by(f64::total_cmp);
    let weights: Vec<f64> = (0..k).map(|_| rng.range(0.2, 1.0)).collect();
    let total: f64 = weights.iter().sum();
    let rest = peak_mib.saturating_sub(first) as f64;
    let mut out = vec![(0.0, first)];
    let mut acc = 0.0;
    for (i, (t, w)) in times.iter().zip(&weights).enumerate() {
        acc += w;
        let held = if i + 1 == k as usize {
            peak_mib
        } else {
            first + (rest * acc / total).round() as u64
        };
        out.push((*t, held));
    }
    if k == 0 {
        out[0].1 = peak_mib;
    }
    out
}

/// Rounds MiB up to a whole 512 MiB, as people write declarations.
fn round_up_512(mib: f64) -> u64 {
    ((mib / 512.0).ceil() as u64).max(1) * 512
}

/// Draws the jobs arriving in `[0, horizon_s)`.
pub fn draw(model: &WorkloadModel, seed: u64, horizon_s: f64) -> Vec<Job> {
    let root = Rng::new(seed);
    let (mut arrivals, mut sizes, mut declare, mut steps, mut who) = (
        root.fork("arrivals"),
        root.fork("sizes"),
        root.fork("declarations"),
        root.fork("steps"),
        root.fork("projects"),
    );
    // Its own stream: the other draws stay those of a workload without workspaces.
    let mut spaces = root.fork("workspaces");
    // Each project's typical peak, drawn from the body-and-tail distribution; its jobs
    // scatter around it (σ 0.25), so a project's past peaks say something of its next.
    let typical: Vec<f64> = (0..model.projects.max(1))
        .map(|_| {
            if who.chance(model.tail_share) {
                who.pareto(model.tail_min_mib, model.tail_alpha)
            } else {
                who.log_normal(model.peak_median_mib, model.peak_sigma)
            }
        })
        .collect();
    let mean_gap = 60.0 / model.arrivals_per_min;
    let mut jobs = Vec::new();
    let mut t = arrivals.exponential(mean_gap);
    while t < horizon_s {
        let (lo, hi) = model.duration_clamp_s;
        let duration_s = sizes
            .log_normal(model.duration_median_s, model.duration_sigma)
            .clamp(lo, hi)
            .round();
        let project = (who.uniform() * typical.len() as f64) as usize % typical.len();
        let peak = sizes.log_normal(typical[project], 0.25);
        let peak_mib = peak
            .clamp(model.peak_clamp_mib.0, model.peak_clamp_mib.1)
            .round() as u64;
        let declared_mib = declare.chance(model.declared_share).then(|| {
            let factor = if declare.chance(model.under_declared_share) {
                declare.range(0.5, 0.95)
            } else {
                declare.range(1.0, 1.4)
            };
            round_up_512(peak_mib as f64 * factor)
        });
        let busy = sizes.log_normal(model.busy_median, 0.6).clamp(0.05, 1.0);
        let workspace = spaces.chance(model.workspace_share).then(|| {
            let (lo, hi) = model.workspace_peak_share;
            let every_s = spaces.range(model.workspace_every_s.0, model.workspace_every_s.1);
            let (hlo, hhi) = model.workspace_holds;
            Workspace {
                mib: (peak_mib as f64 * spaces.range(lo, hi)).round() as u64,
                every_s,
                holds_s: every_s * spaces.range(hlo, hhi),
            }
        });
        let base_peak = peak_mib - workspace.map_or(0, |w| w.mib);
        jobs.push(Job {
            id: jobs.len() as u64,
            arrive_s: t,
            duration_s,
            peak_mib,
            declared_mib,
            protected: false,
            project: project as u32,
            busy,
            allocations: allocations(base_peak, duration_s, model, &mut steps),
            workspace,
        });
        t += arrivals.exponential(mean_gap);
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_has_the_documented_shape() {
        let m = WorkloadModel::default();
        let jobs = draw(&m, 1, 4.0 * 3600.0);
        let n = jobs.len() as f64;
        // 16/min for 4 h: 3840 expected.
        assert!((n - 3840.0).abs() < 250.0, "{n}");
        let small = jobs.iter().filter(|j| j.peak_mib <= 6 * 1024).count() as f64;
        let big = jobs.iter().filter(|j| j.peak_mib >= 16 * 1024).count();
        // The body is 88 % of the projects; their jobs scatter around each project's peak.
        assert!(small / n > 0.65, "most jobs are 1–6 GiB: {}", small / n);
        assert!(big > 20, "a tail past 16 GiB: {big}");
        let declared = jobs.iter().filter(|j| j.declared_mib.is_some()).count() as f64;
        assert!((declared / n - 0.6).abs() < 0.05);
        let low = jobs
            .iter()
            .filter(|j| j.declared_mib.is_some_and(|d| d < j.peak_mib))
            .count();
        assert!(low > 0, "some declarations are too low");
        let spaced = jobs.iter().filter(|j| j.workspace.is_some()).count() as f64;
        assert!((spaced / n - 0.3).abs() < 0.05, "{}", spaced / n);
        for j in jobs.iter().take(200) {
            assert!(j.base_mib_at(0.0) < j.base_mib_at(j.duration_s), "{j:?}");
            let ws = j.workspace.map_or(0, |w| w.mib);
            assert_eq!(j.base_mib_at(j.duration_s) + ws, j.peak_mib);
            // The workspace comes and goes: held at some moments of the run, not at others,
            // and the job never holds more than its peak.
            if let Some(w) = j.workspace {
                let at: Vec<u64> = (1..400).map(|i| w.mib_at(i as f64 * 0.7)).collect();
                assert!(at.contains(&w.mib) && at.contains(&0), "{w:?}");
            }
            assert!((0..200).all(|i| j.used_mib_at(i as f64 * 3.1) <= j.peak_mib));
            // In steps: at most 7 distinct allocations.
            assert!((3..=7).contains(&j.allocations.len()), "{j:?}");
            assert!(j
                .allocations
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        }
        let projects: std::collections::BTreeSet<u32> = jobs.iter().map(|j| j.project).collect();
        assert!(projects.len() > 30);
    }
}
