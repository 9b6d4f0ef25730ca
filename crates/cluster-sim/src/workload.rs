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
    /// Share of its duration over which a job grows linearly to its peak.
    pub ramp_share: f64,
    /// Share of jobs that declare `vram-request-mib`.
    pub declared_share: f64,
    /// Of the declaring jobs, the share whose declaration is too low.
    pub under_declared_share: f64,
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
            declared_share: 0.6,
            under_declared_share: 0.2,
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
}

impl Job {
    /// MiB the job holds `age_s` seconds after it started: `start_share` of its peak at
    /// once, then linear growth to the peak over `ramp_share` of its duration.
    pub fn used_mib_at(&self, age_s: f64, m: &WorkloadModel) -> u64 {
        let peak = self.peak_mib as f64;
        let ramp = (m.ramp_share * self.duration_s).max(1.0);
        let share = m.start_share + (1.0 - m.start_share) * (age_s / ramp).clamp(0.0, 1.0);
        (peak * share).round() as u64
    }
}

/// Rounds MiB up to a whole 512 MiB, as people write declarations.
fn round_up_512(mib: f64) -> u64 {
    ((mib / 512.0).ceil() as u64).max(1) * 512
}

/// Draws the jobs arriving in `[0, horizon_s)`.
pub fn draw(model: &WorkloadModel, seed: u64, horizon_s: f64) -> Vec<Job> {
    let root = Rng::new(seed);
    let (mut arrivals, mut sizes, mut declare) = (
        root.fork("arrivals"),
        root.fork("sizes"),
        root.fork("declarations"),
    );
    let mean_gap = 60.0 / model.arrivals_per_min;
    let mut jobs = Vec::new();
    let mut t = arrivals.exponential(mean_gap);
    while t < horizon_s {
        let (lo, hi) = model.duration_clamp_s;
        let duration_s = sizes
            .log_normal(model.duration_median_s, model.duration_sigma)
            .clamp(lo, hi)
            .round();
        let peak = if sizes.chance(model.tail_share) {
            sizes.pareto(model.tail_min_mib, model.tail_alpha)
        } else {
            sizes.log_normal(model.peak_median_mib, model.peak_sigma)
        };
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
        jobs.push(Job {
            id: jobs.len() as u64,
            arrive_s: t,
            duration_s,
            peak_mib,
            declared_mib,
            protected: false,
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
        assert!(small / n > 0.8, "most jobs are 1–6 GiB: {}", small / n);
        assert!(big > 20, "a tail past 16 GiB: {big}");
        let declared = jobs.iter().filter(|j| j.declared_mib.is_some()).count() as f64;
        assert!((declared / n - 0.6).abs() < 0.05);
        let low = jobs
            .iter()
            .filter(|j| j.declared_mib.is_some_and(|d| d < j.peak_mib))
            .count();
        assert!(low > 0, "some declarations are too low");
        let j = &jobs[0];
        assert!(j.used_mib_at(0.0, &m) < j.used_mib_at(j.duration_s, &m));
        assert_eq!(j.used_mib_at(j.duration_s, &m), j.peak_mib);
    }
}
