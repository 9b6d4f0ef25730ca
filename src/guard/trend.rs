//! Per-GPU memory growth estimate: a least-squares line through the last few seconds of
//! `(time, used bytes)` readings.
//!
//! A fit rather than the last two points, because fast memory reads jitter with allocator
//! churn and one noisy pair would project a spurious OOM. A bounded window rather than all
//! history, because a CI job's growth phase lasts seconds and old points would dilute it.

use std::collections::VecDeque;
use std::time::Duration;

/// How far back the fit looks by default.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5);
/// Most points kept by default: 5 s of readings at a 20 ms fast interval.
pub const DEFAULT_CAPACITY: usize = 256;
/// Fewer points than this say nothing about a trend.
pub const MIN_POINTS: usize = 3;
/// Points closer together than this in total are too short a baseline to extrapolate from.
pub const MIN_SPAN: Duration = Duration::from_millis(200);
/// How far before the soft crossing [`Trend::time_to_full_entering`] looks for growth that
/// was already under way.
pub const LEAD_IN: Duration = Duration::from_secs(1);
/// A lead-in projection acts only when the GPU would be full sooner than this. With more
/// time left, waiting [`MIN_SPAN`] for a fit after the crossing costs nothing and tells a
/// job that stopped growing at the crossing from one that did not.
pub const LEAD_IN_URGENT: Duration = Duration::from_secs(1);

/// How far back [`Trend::sustained_growth`] looks at most.
pub const EARLY_WINDOW: Duration = Duration::from_millis(60);
/// The shorter window [`Trend::sustained_growth`] judges first. Why: the rule needs the
/// lowest reading of each third to rise twice, so over [`EARLY_WINDOW`] a climb shows only
/// once it has lasted about 40 ms. At an A10G's headroom a job allocating 2 GiB every 10 ms
/// takes a neighbour's room with its fourth allocation, about 31 ms in, and the neighbour
/// loses what it tries until the stopped job's memory is back, some 50 ms after the kill
/// (issue 38's `two` shape; docs/validation.md §9k). Over 30 ms the same rule shows that
/// climb about 25 ms in, after its third. A workspace's sawtooth, one step and a plateau,
/// and growth that stopped read as they do over 60 ms (trend table tests); more readings are
/// needed per third, so slower readings fall back to [`EARLY_WINDOW`]. What the shorter
/// window loses is the context: who carries a climb it shows is still judged over
/// [`EARLY_WINDOW`], and a pod the full polls cannot yet tell is rising is no climber for it
/// (`state::early`).
pub const EARLY_SHORT_WINDOW: Duration = Duration::from_millis(30);
/// The windows of the early trigger, the shortest first.
pub const EARLY_WINDOWS: [Duration; 2] = [EARLY_SHORT_WINDOW, EARLY_WINDOW];
/// The shortest span of readings [`Trend::sustained_growth`] judges.
pub const EARLY_MIN_SPAN: Duration = Duration::from_millis(15);
/// The fewest readings [`Trend::sustained_growth`] judges.
pub const EARLY_MIN_POINTS: usize = 4;
/// Rises of the lower envelope smaller than this are allocator noise, not growth.
const EARLY_NOISE: u64 = 64 << 20;
/// The windows [`Trend::sustained_growth_lasting`] looks back over besides [`EARLY_WINDOW`],
/// shortest first: growth that comes in chunks (a job allocating 256 MiB every 60 ms grows
/// 4 GiB/s) puts at most one step in the early window, and slower growth rises less than
/// allocator noise across its thirds, so only a window of several chunks shows it climbing,
/// while a workspace allocated and freed several times a second leaves a trough in each of
/// its thirds. Each window must be filled with growth before it says so, hence more than one.
pub const LASTING_WINDOWS: [Duration; 2] = [Duration::from_millis(250), Duration::from_secs(1)];

/// A climb the early trigger sees ([`Trend::early_climb`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Climb {
    /// The window that shows it.
    pub window: Duration,
    /// Bytes per second: the slower of the fit and the lower envelope.
    pub rate: f64,
    /// What the lower envelope rose by across the window, in bytes: the growth the early
    /// trigger acts on, for the pods' own climb to be weighed against.
    pub rise: u64,
}

/// A bounded series of memory readings of one GPU and the growth rate they show.
#[derive(Debug, Clone)]
pub struct Trend {
    points: VecDeque<(Duration, u64)>,
    window: Duration,
    capacity: usize,
}

impl Default for Trend {
    fn default() -> Self {
        Trend::new(DEFAULT_WINDOW, DEFAULT_CAPACITY)
    }
}

impl Trend {
    /// An empty trend keeping points younger than `window`, at most `capacity` of them.
    pub fn new(window: Duration, capacity: usize) -> Self {
        Trend {
            points: VecDeque::with_capacity(capacity.min(1024)),
            window,
            capacity: capacity.max(MIN_POINTS),
        }
    }

    /// Adds a reading. A reading older than the newest is dropped: the fit assumes time
    /// moves forward, and a late full-poll reading must not bend it.
    pub fn push(&mut self, at: Duration, used: u64) {
        if let Some(&(last, _)) = self.points.back() {
            if at < last {
                return;
            }
        }
        self.points.push_back((at, used));
        while self.points.len() > self.capacity {
            self.points.pop_front();
        }
        while let Some(&(first, _)) = self.points.front() {
            if at.saturating_sub(first) > self.window {
                self.points.pop_front();
            } else {
                break;
            }
        }
    }

    /// Forgets every reading, e.g. when the GPU stops answering and old points would span a gap.
    pub fn clear(&mut self) {
        self.points.clear();
    }

    /// When the latest reading held was taken.
    pub fn last_at(&self) -> Option<Duration> {
        self.points.back().map(|(t, _)| *t)
    }

    /// Number of readings in the window.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether there are no readings.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Growth in bytes per second, or `None` when the window holds fewer than
    /// [`MIN_POINTS`] readings or they span less than [`MIN_SPAN`]. Negative when memory
    /// is being released (a victim exiting), which projects no OOM.
    pub fn slope(&self) -> Option<f64> {
        self.slope_since(Duration::ZERO)
    }

    /// Like [`Trend::slope`], fitting only the readings taken at or after `from`.
    ///
    /// The guard fits from the moment free memory went below soft: a single step
    /// allocation that crossed soft and then stayed flat would otherwise look like steep
    /// growth for a whole window and pre-empt the grace period.
    pub fn slope_since(&self, from: Duration) -> Option<f64> {
        self.slope_between(from, Duration::MAX)
    }

    /// Least-squares growth over the readings taken at or after `from` and before `until`.
    fn slope_between(&self, from: Duration, until: Duration) -> Option<f64> {
        let pts = self
            .points
            .iter()
            .filter(|&&(t, _)| t >= from && t < until)
            .copied();
        fit(pts, MIN_POINTS, MIN_SPAN)
    }

    /// How long until `free` bytes are used up at the current growth rate; `None` unless
    /// memory is growing and the fit is trustworthy (see [`Trend::slope`]).
    pub fn time_to_full(&self, free: u64) -> Option<Duration> {
        self.time_to_full_since(free, Duration::ZERO)
    }

    /// Like [`Trend::time_to_full`], fitting only the readings at or after `from`.
    pub fn time_to_full_since(&self, free: u64, from: Duration) -> Option<Duration> {
        project(free, self.slope_since(from)?)
    }

    /// Whether the readings at or after `from` are enough for a fit of their own (see
    /// [`Trend::slope`]), whatever it shows.
    pub fn has_fit_since(&self, from: Duration) -> bool {
        let mut pts = self.points.iter().filter(|&&(t, _)| t >= from);
        let (first, n) = match pts.next() {
            Some(&(t0, _)) => (t0, 1 + pts.clone().count()),
            None => return false,
        };
        let last = self.points.back().map_or(first, |p| p.0);
        n >= MIN_POINTS && last - first >= MIN_SPAN
    }

    /// Time to full for growth that was already steady when free memory crossed soft at
    /// `crossed`, before [`Trend::time_to_full_since`] has readings enough of its own.
    ///
    /// Fitting only after the crossing costs [`MIN_SPAN`] of waiting; a job growing at
    /// 64 GiB/s fills an H200 from a 10 % soft threshold in about that long. Growth that
    /// was under way through the [`LEAD_IN`] before the crossing is no step allocation, so
    /// its projection is trusted at once. Both the readings before the crossing alone and
    /// all readings since the lead-in began must show growth; the slower projection of the
    /// two is returned, so a step at the crossing on top of slow growth is not mistaken
    /// for fast growth. And the growth must still be going on at the crossing: the last
    /// step before it and the step onto it must each grow at least a quarter as fast as the fit
    /// before the crossing, so growth that stopped short of soft, followed by a small
    /// allocation that tips it over, is not projected forward.
    pub fn time_to_full_entering(&self, free: u64, crossed: Duration) -> Option<Duration> {
        let from = crossed.saturating_sub(LEAD_IN);
        let before_slope = self.slope_between(from, crossed)?;
        let before = project(free, before_slope)?;
        let all = project(free, self.slope_since(from)?)?;
        let mut pre = self
            .points
            .iter()
            .rev()
            .filter(|&&(t, _)| t >= from && t < crossed);
        let last_pre = *pre.next()?;
        let second_pre = *pre.next()?;
        let at_crossing = *self.points.iter().find(|&&(t, _)| t >= crossed)?;
        let still_growing = |a: (Duration, u64), b: (Duration, u64)| {
            let dt = b.0.saturating_sub(a.0).as_secs_f64();
            dt > 0.0 && (b.1 as f64 - a.1 as f64) / dt >= before_slope / 4.0
        };
        if !still_growing(second_pre, last_pre) || !still_growing(last_pre, at_crossing) {
            return None;
        }
        Some(before.max(all))
    }
}

impl Trend {
    /// The growth rate in bytes per second when the readings of the last
    /// [`EARLY_SHORT_WINDOW`] or, failing that, [`EARLY_WINDOW`] before `now` show growth that
    /// is sustained and still going on; `None` otherwise.
    ///
    /// The window is cut in three by time, and the lowest reading of each third must rise
    /// from one third to the next, each time by at least a quarter of what the fit
    /// predicts. The lower envelope, because a pod that allocates and frees a workspace
    /// many times a second puts a sawtooth on top of the memory in use: its peaks and
    /// troughs come and go, its troughs do not climb. Both steps, because one large
    /// allocation followed by a plateau raises the envelope once, not twice, and growth
    /// that stopped shows in the last third. Memory returning to the driver never
    /// qualifies. The rate returned is the slower of the fit and the envelope's.
    pub fn sustained_growth(&self, now: Duration) -> Option<f64> {
        self.early_climb(now).map(|c| c.rate)
    }

    /// The early trigger's climb: the first of [`EARLY_WINDOWS`] whose readings show
    /// sustained growth (the rule of [`Trend::sustained_growth`]), its rate and the lower
    /// envelope's rise across it; `None` when neither does.
    pub fn early_climb(&self, now: Duration) -> Option<Climb> {
        EARLY_WINDOWS.iter().find_map(|&window| {
            self.envelope_over(now, window)
                .map(|(rate, rise)| Climb { window, rate, rise })
        })
    }

    /// The growth rate in bytes per second when the last [`EARLY_WINDOW`] of readings, or
    /// any of the [`LASTING_WINDOWS`], shows sustained growth (the rule of
    /// [`Trend::sustained_growth`]), the shortest first; `None` otherwise. Fast growth shows
    /// in the short window at once, chunked or slower growth only in a longer one.
    pub fn sustained_growth_lasting(&self, now: Duration) -> Option<f64> {
        self.sustained_growth_lasting_since(now, Duration::ZERO)
    }

    /// Like [`Trend::sustained_growth_lasting`], judging only the windows that begin at or
    /// after `since`. Why: after a decision the growth the windows still hold from before
    /// it is the victims' own, stopped since; counted, it made a trainer's evaluation
    /// workspace, starting in the cooldown, look like a sustained climb.
    pub fn sustained_growth_lasting_since(&self, now: Duration, since: Duration) -> Option<f64> {
        std::iter::once(EARLY_WINDOW)
            .chain(LASTING_WINDOWS)
            .filter(|w| now.saturating_sub(*w) >= since)
            .find_map(|w| self.sustained_over(now, w))
    }

    fn sustained_over(&self, now: Duration, window: Duration) -> Option<f64> {
        self.envelope_over(now, window).map(|(rate, _)| rate)
    }

    /// What the lower envelope rose by across the last [`EARLY_WINDOW`], from the lowest
    /// reading of its first third to the lowest of its last, sustained or not; `None` with
    /// too few readings. Why: when the early trigger's climb shows over
    /// [`EARLY_SHORT_WINDOW`], who carries it is judged against this rise too. A job's CUDA
    /// start-up (800 MiB in 15 ms) just after a neighbour's 2 GiB workspace came back
    /// carries the whole of the short window's rise, the workspace being older than it;
    /// over 60 ms it carries less than half (unit
    /// `state::an_early_trigger_acts_on_a_rise_the_processes_carry`).
    pub fn early_window_rise(&self, now: Duration) -> Option<u64> {
        let ([first, _, last], _) = lows_of_thirds(&self.readings(now, EARLY_WINDOW))?;
        Some(last?.saturating_sub(first?))
    }

    /// The largest step up of the last `window` before `now`, if the GPU stepped up at least
    /// twice in it: two readings each [`EARLY_NOISE`] or more above the one before, and the
    /// latest that much above the earliest. Why: `early_need` acts on a climb under way however
    /// short (a job's second 2 GiB step, 10 ms after its first, is a rise the envelope's thirds
    /// do not show yet), but not on one step: a workspace taking the room another had just
    /// left, or a job stepping up once and holding, is left to `soft_need`'s hold and the hard
    /// trigger. The largest step is how much the climb may take before a decision on this
    /// reading can stop it: its next allocation.
    pub fn stepped_twice(&self, now: Duration, window: Duration) -> Option<u64> {
        self.stepped_twice_at(now, window)
            .map(|(largest, _)| largest)
    }

    /// [`Trend::stepped_twice`] with when the latest of those steps was read: in one pass over
    /// the window, as a fast reading asks both (`need::wants_step_poll`).
    pub fn stepped_twice_at(&self, now: Duration, window: Duration) -> Option<(u64, Duration)> {
        let pts = self.readings(now, window);
        let (mut count, mut largest, mut last_at) = (0, 0, Duration::ZERO);
        for (at, rise) in steps_up(&pts) {
            count += 1;
            largest = largest.max(rise);
            last_at = at;
        }
        let net = match (pts.first(), pts.last()) {
            (Some(a), Some(b)) => b.1.saturating_sub(a.1),
            _ => 0,
        };
        (count >= 2 && net >= EARLY_NOISE).then_some((largest, last_at))
    }

    /// The largest fall between two readings of the last `window` before `now` that a rise of
    /// at least as much followed within it: a workspace that came and went (a job ending
    /// leaves a fall nothing fills). `None` below [`EARLY_NOISE`].
    pub fn cycled(&self, now: Duration, window: Duration) -> Option<u64> {
        let pts = self.readings(now, window);
        // Newest first, carrying the largest rise after each pair: one pass over the second's
        // readings on every full poll, not one per fall.
        let (mut best, mut rise_after) = (0u64, 0u64);
        for w in pts.windows(2).rev() {
            let fall = w[0].1.saturating_sub(w[1].1);
            if fall >= EARLY_NOISE && rise_after + EARLY_NOISE >= fall {
                best = best.max(fall);
            }
            rise_after = rise_after.max(w[1].1.saturating_sub(w[0].1));
        }
        (best > 0).then_some(best)
    }

    /// The readings of the last `window` before `now`, oldest first.
    fn readings(&self, now: Duration, window: Duration) -> Vec<(Duration, u64)> {
        let from = now.saturating_sub(window);
        self.points
            .iter()
            .filter(|&&(t, _)| t >= from && t <= now)
            .copied()
            .collect()
    }

    /// The sustained rate over `window` and the envelope's rise across it.
    fn envelope_over(&self, now: Duration, window: Duration) -> Option<(f64, u64)> {
        let pts = self.readings(now, window);
        let (&(t0, _), &(tn, _)) = (pts.first()?, pts.last()?);
        let span = tn.saturating_sub(t0);
        if pts.len() < EARLY_MIN_POINTS || span < EARLY_MIN_SPAN {
            return None;
        }
        let fit = fit(pts.iter().copied(), EARLY_MIN_POINTS, EARLY_MIN_SPAN)?;
        if fit < 1.0 {
            return None;
        }
        let ([a, b, c], third) = lows_of_thirds(&pts)?;
        let lows = [a?, b?, c?];
        let step = (fit * third.as_secs_f64() / 4.0).max(EARLY_NOISE as f64);
        let rises = lows.windows(2).all(|w| w[1] as f64 - w[0] as f64 >= step);
        if !rises {
            return None;
        }
        // The envelope's rate: from the first third's trough to the last's, two thirds apart.
        let rise = lows[2].saturating_sub(lows[0]);
        let envelope = rise as f64 / (2.0 * third.as_secs_f64());
        Some((fit.min(envelope), rise))
    }
}

/// The lowest reading of each third of `pts` (in time order) by time, `None` for a third
/// without one, and a third's length; `None` without readings.
fn lows_of_thirds(pts: &[(Duration, u64)]) -> Option<([Option<u64>; 3], Duration)> {
    let (&(t0, _), &(tn, _)) = (pts.first()?, pts.last()?);
    let third = tn.saturating_sub(t0) / 3;
    let low = |a: Duration, b: Duration| {
        pts.iter()
            .filter(|&&(t, _)| t >= a && t <= b)
            .map(|&(_, m)| m)
            .min()
    };
    let lows = [
        low(t0, t0 + third),
        low(t0 + third + Duration::from_nanos(1), tn - third),
        low(tn - third + Duration::from_nanos(1), tn),
    ];
    Some((lows, third))
}

/// Least-squares slope (bytes per second) of `pts`, in time order; `None` with fewer than
/// `min_points` readings, a span under `min_span`, or all readings at one instant.
fn fit(
    pts: impl Iterator<Item = (Duration, u64)>,
    min_points: usize,
    min_span: Duration,
) -> Option<f64> {
    let mut pts = pts;
    let (t0, y0) = pts.next()?;
    let (mut n, mut tn) = (1usize, t0);
    // Centre on the first point so seconds and bytes stay small enough for f64.
    let (mut sx, mut sy, mut sxx, mut sxy) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (t, y) in pts {
        let x = (t - t0).as_secs_f64();
        let y = y as f64 - y0 as f64;
        n += 1;
        tn = t;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    if n < min_points || tn - t0 < min_span {
        return None;
    }
    let n = n as f64;
    let var = sxx - sx * sx / n;
    if var <= f64::EPSILON {
        return None;
    }
    Some((sxy - sx * sy / n) / var)
}

impl Trend {
    /// How long `bytes` last at the rate of [`Trend::sustained_growth`]; `None` without it.
    pub fn sustained_time_to(&self, bytes: u64, now: Duration) -> Option<Duration> {
        project(bytes, self.sustained_growth(now)?)
    }
}

/// How long `free` bytes last at `slope` bytes per second; `None` unless memory grows.
fn project(free: u64, slope: f64) -> Option<Duration> {
    if slope < 1.0 {
        // Less than a byte per second is noise, not growth.
        return None;
    }
    Duration::try_from_secs_f64(free as f64 / slope).ok()
}

/// Each reading of `pts` that rose [`EARLY_NOISE`] or more above the one before: when, and by
/// how much. What `early_need` counts as a step of a climb.
fn steps_up(pts: &[(Duration, u64)]) -> impl Iterator<Item = (Duration, u64)> + '_ {
    pts.windows(2)
        .map(|w| (w[1].0, w[1].1.saturating_sub(w[0].1)))
        .filter(|(_, rise)| *rise >= EARLY_NOISE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::MIB;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn trend(points: &[(u64, u64)]) -> Trend {
        let mut t = Trend::default();
        for &(at_ms, mib) in points {
            t.push(ms(at_ms), mib * MIB);
        }
        t
    }

    /// A workspace that came and went: a fall a rise as large followed; not a job that ended
    /// (a fall nothing filled), nor noise; the largest such fall.
    #[test]
    fn cycled_table() {
        let w = ms(1000);
        type Case<'a> = (&'a str, &'a [(u64, u64)], Option<u64>);
        let cases: [Case; 5] = [
            (
                "a 1 GiB workspace out and back every 10 ms",
                &[(100, 17024), (110, 16000), (120, 17024), (130, 16000)],
                Some(1024 * MIB),
            ),
            (
                "a job ended: 4 GiB gone, nothing back",
                &[(100, 20096), (110, 16000), (120, 16000), (130, 16000)],
                None,
            ),
            (
                "back in two steps of half",
                &[(100, 18048), (110, 16000), (120, 17024), (130, 18048)],
                None,
            ),
            (
                "a 2 GiB and a 512 MiB workspace: the larger",
                &[
                    (100, 18560),
                    (110, 18048),
                    (120, 18560),
                    (130, 16512),
                    (140, 18560),
                ],
                Some(2048 * MIB),
            ),
            (
                "allocator noise",
                &[(100, 16032), (110, 16000), (120, 16032), (130, 16000)],
                None,
            ),
        ];
        for (what, points, want) in cases {
            assert_eq!(trend(points).cycled(ms(140), w), want, "{what}");
        }
    }

    /// With the largest step, when the latest step was read (not the largest's instant).
    #[test]
    fn stepped_twice_at_tells_the_latest_step() {
        let t = trend(&[
            (100, 16000),
            (105, 18048),
            (110, 18048),
            (115, 19072),
            (121, 19072),
        ]);
        assert_eq!(
            t.stepped_twice_at(ms(121), ms(30)),
            Some((2048 * MIB, ms(115)))
        );
        assert_eq!(t.stepped_twice(ms(121), ms(30)), Some(2048 * MIB));
        // Only the 115-ms step in the window: one step is not twice.
        assert_eq!(t.stepped_twice_at(ms(121), ms(12)), None);
    }

    /// `early_need`'s gate: two steps up across the window, not one, and not a dip and a step;
    /// the largest step when it holds.
    #[test]
    fn stepped_twice_table() {
        let w = ms(30);
        type Case<'a> = (&'a str, &'a [(u64, u64)], Option<u64>);
        let cases: [Case; 7] = [
            (
                "a 512 MiB step, then a 1 GiB one",
                &[
                    (100, 16000),
                    (105, 16000),
                    (110, 16512),
                    (115, 16512),
                    (121, 17536),
                ],
                Some(1024 * MIB),
            ),
            (
                "two 2 GiB steps 10 ms apart",
                &[
                    (100, 16000),
                    (105, 16000),
                    (110, 18048),
                    (115, 18048),
                    (121, 20096),
                ],
                Some(2048 * MIB),
            ),
            (
                "one step, held",
                &[
                    (100, 16000),
                    (105, 16000),
                    (110, 18048),
                    (115, 18048),
                    (121, 18048),
                ],
                None,
            ),
            (
                "a workspace leaves and another takes its room",
                &[
                    (100, 18048),
                    (105, 16000),
                    (110, 16000),
                    (115, 18048),
                    (121, 18048),
                ],
                None,
            ),
            (
                "a sawtooth at one height",
                &[
                    (100, 16000),
                    (105, 18048),
                    (110, 16000),
                    (115, 18048),
                    (121, 16000),
                ],
                None,
            ),
            (
                "steps older than the window",
                &[
                    (60, 16000),
                    (70, 18048),
                    (80, 20096),
                    (100, 20096),
                    (121, 20096),
                ],
                None,
            ),
            (
                "allocator noise",
                &[
                    (100, 16000),
                    (105, 16030),
                    (110, 16060),
                    (115, 16090),
                    (121, 16120),
                ],
                None,
            ),
        ];
        for (what, points, want) in cases {
            assert_eq!(trend(points).stepped_twice(ms(121), w), want, "{what}");
        }
    }

    #[test]
    fn slope_table() {
        /// (readings as (ms, MiB), expected slope in MiB/s or None)
        type Row<'a> = (&'a [(u64, u64)], Option<f64>);
        let rows: &[Row] = &[
            (&[], None),
            (&[(0, 100)], None),
            (&[(0, 100), (500, 200)], None),
            // three points but only 150 ms apart
            (&[(0, 100), (75, 110), (150, 120)], None),
            (&[(0, 100), (100, 110), (200, 120)], Some(100.0)),
            (
                &[(0, 1000), (500, 1500), (1000, 2000), (1500, 2500)],
                Some(1000.0),
            ),
            // flat
            (&[(0, 100), (500, 100), (1000, 100)], Some(0.0)),
            // all at one instant
            (&[(100, 1), (100, 2), (100, 3), (100, 4)], None),
            // equal timestamps among others still fit
            (&[(0, 100), (0, 100), (1000, 200), (1000, 200)], Some(100.0)),
            // memory released: a victim died
            (
                &[(0, 2000), (500, 2000), (1000, 1000), (1500, 1000)],
                Some(-800.0),
            ),
        ];
        for (points, want) in rows {
            let got = trend(points).slope().map(|s| s / MIB as f64);
            match (got, want) {
                (None, None) => {}
                (Some(g), Some(w)) => assert!((g - w).abs() < 1e-6, "{points:?}: {g} != {w}"),
                _ => panic!("{points:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn time_to_full_only_for_growth() {
        // 1000 MiB/s with 2500 MiB free: full in 2.5 s.
        let t = trend(&[(0, 1000), (500, 1500), (1000, 2000)]);
        assert_eq!(t.time_to_full(2500 * MIB), Some(ms(2500)));
        assert_eq!(t.time_to_full(0), Some(Duration::ZERO));
        assert_eq!(
            trend(&[(0, 100), (500, 100), (1000, 100)]).time_to_full(MIB),
            None
        );
        assert_eq!(
            trend(&[(0, 300), (500, 200), (1000, 100)]).time_to_full(MIB),
            None
        );
        assert_eq!(trend(&[(0, 100), (100, 200)]).time_to_full(MIB), None);
    }

    #[test]
    fn window_and_capacity_bound_the_points() {
        let mut t = Trend::default();
        for i in 0..200u64 {
            t.push(ms(i * 100), i * MIB);
        }
        assert!(t.len() <= DEFAULT_CAPACITY);
        assert!(t.len() <= 51, "only the last 5 s: {}", t.len());
        // Old steep growth leaves the window: after 6 s flat, the slope is flat.
        let mut t = trend(&[(0, 0), (500, 5000), (1000, 10000)]);
        for i in 0..=60u64 {
            t.push(ms(1100 + i * 100), 10000 * MIB);
        }
        assert_eq!(t.slope(), Some(0.0));
    }

    #[test]
    fn a_step_then_flat_shows_no_growth_when_fitted_from_the_step() {
        // 1200 MiB allocated at once at t=1 s, then flat.
        let t = trend(&[
            (0, 8000),
            (500, 8000),
            (1000, 9200),
            (1500, 9200),
            (2000, 9200),
        ]);
        assert!(
            t.time_to_full(800 * MIB).is_some(),
            "the whole window sees a step as growth"
        );
        assert_eq!(t.slope_since(ms(1000)), Some(0.0));
        assert_eq!(t.time_to_full_since(800 * MIB, ms(1000)), None);
        assert_eq!(t.slope_since(ms(1600)), None, "too few points after");
    }

    #[test]
    fn growth_under_way_before_the_crossing_projects_at_once() {
        // 2500 MiB/s for 400 ms, crossing soft at 500 ms with 750 MiB free.
        let ramp = trend(&[
            (0, 8000),
            (100, 8250),
            (200, 8500),
            (300, 8750),
            (500, 9250),
        ]);
        assert_eq!(
            ramp.time_to_full_since(750 * MIB, ms(500)),
            None,
            "one point after"
        );
        let t = ramp.time_to_full_entering(750 * MIB, ms(500)).unwrap();
        assert!(t > ms(290) && t < ms(310), "{t:?}");

        // Flat, then one 1250 MiB step at the crossing: the readings before show nothing.
        let step = trend(&[
            (0, 8000),
            (100, 8000),
            (200, 8000),
            (300, 8000),
            (500, 9250),
        ]);
        assert_eq!(step.time_to_full_entering(750 * MIB, ms(500)), None);

        // Slow growth, then a step: the slower (pre-crossing) projection is the one returned.
        let slow = trend(&[
            (0, 8000),
            (100, 8010),
            (200, 8020),
            (300, 8030),
            (500, 9250),
        ]);
        let t = slow.time_to_full_entering(750 * MIB, ms(500)).unwrap();
        assert!(t > Duration::from_secs(7), "{t:?}");

        // Too short a baseline before the crossing.
        let short = trend(&[(300, 8750), (400, 9000), (500, 9250)]);
        assert_eq!(short.time_to_full_entering(750 * MIB, ms(500)), None);

        // Growth stopped 400 ms before the crossing; a 10 MiB tick then tips it over.
        let stopped = trend(&[
            (0, 7750),
            (250, 8375),
            (500, 9000),
            (600, 9000),
            (700, 9000),
            (800, 9000),
            (900, 9000),
            (1000, 9010),
        ]);
        assert_eq!(stopped.time_to_full_entering(990 * MIB, ms(1000)), None);
        // Growth that paused, then a large step across soft: the pause before it counts.
        let paused = trend(&[
            (0, 7750),
            (250, 8375),
            (500, 9000),
            (900, 9000),
            (1000, 9500),
        ]);
        assert_eq!(paused.time_to_full_entering(500 * MIB, ms(1000)), None);

        // Readings older than the lead-in do not count.
        let old = trend(&[
            (0, 7000),
            (100, 7500),
            (200, 8000),
            (1400, 8000),
            (1500, 9250),
        ]);
        assert_eq!(old.time_to_full_entering(750 * MIB, ms(1500)), None);
    }

    #[test]
    fn a_fit_of_its_own_needs_three_readings_over_the_minimum_span() {
        let t = trend(&[(0, 100), (100, 100), (200, 100), (300, 100)]);
        assert!(t.has_fit_since(ms(0)));
        assert!(t.has_fit_since(ms(100)), "flat is still a fit");
        assert!(!t.has_fit_since(ms(150)), "two readings");
        assert!(!t.has_fit_since(ms(400)));
        assert!(!trend(&[(0, 1), (50, 2), (100, 3), (150, 4)]).has_fit_since(ms(0)));
    }

    #[test]
    fn out_of_order_readings_are_dropped_and_clear_resets() {
        let mut t = trend(&[(0, 100), (100, 110), (200, 120)]);
        t.push(ms(150), 9999 * MIB);
        assert_eq!(t.len(), 3);
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.slope(), None);
    }

    #[test]
    fn a_drop_after_growth_turns_the_projection_off_without_a_reset() {
        let mut t = trend(&[(0, 1000), (200, 1200), (400, 1400), (600, 1600)]);
        assert!(t.time_to_full(1000 * MIB).is_some());
        // The victim exits: memory falls by 1 GiB and stays.
        for at in [800, 1000, 1200, 1400] {
            t.push(ms(at), 600 * MIB);
        }
        assert!(t.slope().unwrap() < 0.0);
        assert_eq!(t.time_to_full(1000 * MIB), None);
        assert_eq!(t.len(), 8);
    }

    /// Memory in use (MiB) at `t_ms` for one shape of the sustained-growth table.
    #[derive(Clone, Copy, Debug)]
    enum Shape {
        /// Growth at `rate` GiB/s from t=0, in `chunk` MiB steps.
        Ramp { rate: u64, chunk: u64 },
        /// A `gib` GiB workspace held for 2 ms of every 22 ms (a training step).
        Workspace { gib: u64 },
        /// A ramp with the workspace on top.
        RampAndWorkspace { rate: u64, chunk: u64, gib: u64 },
        /// One allocation of `gib` GiB at `at` ms, then flat.
        Step { gib: u64, at: u64 },
        /// Growth at `rate` GiB/s until `until` ms, then flat.
        RampThenPlateau { rate: u64, until: u64 },
        /// Memory returning to the driver at `rate` GiB/s.
        Release { rate: u64 },
        /// Growth of 2 GiB in one allocation every 30 ms (two large steps in a window).
        SlowSteps,
    }

    fn used_mib(shape: Shape, t: u64) -> u64 {
        let base = 100_000;
        let ramp = |rate: u64, chunk: u64, t: u64| (rate * 1024 * t / 1000) / chunk * chunk;
        let ws = |gib: u64, t: u64| if t % 22 < 2 { gib * 1024 } else { 0 };
        match shape {
            Shape::Ramp { rate, chunk } => base + ramp(rate, chunk, t),
            Shape::Workspace { gib } => base + ws(gib, t),
            Shape::RampAndWorkspace { rate, chunk, gib } => {
                base + ramp(rate, chunk, t) + ws(gib, t)
            }
            Shape::Step { gib, at } => base + if t >= at { gib * 1024 } else { 0 },
            Shape::RampThenPlateau { rate, until } => base + ramp(rate, 1, t.min(until)),
            Shape::Release { rate } => base - ramp(rate, 1, t),
            Shape::SlowSteps => base + t / 30 * 2048,
        }
    }

    #[test]
    fn sustained_growth_table() {
        // (shape, reading interval ms, readings up to ms, growth expected)
        let rows: &[(Shape, u64, u64, bool)] = &[
            (
                Shape::Ramp {
                    rate: 250,
                    chunk: 256,
                },
                5,
                60,
                true,
            ),
            // Multi-GiB steps sampled every 5 ms: some readings see no step.
            (
                Shape::Ramp {
                    rate: 250,
                    chunk: 2048,
                },
                5,
                60,
                true,
            ),
            (
                Shape::Ramp {
                    rate: 128,
                    chunk: 1024,
                },
                5,
                60,
                true,
            ),
            (
                Shape::Ramp {
                    rate: 64,
                    chunk: 256,
                },
                5,
                60,
                true,
            ),
            // Too short a span for a judgement.
            (
                Shape::Ramp {
                    rate: 250,
                    chunk: 256,
                },
                5,
                10,
                false,
            ),
            (Shape::Workspace { gib: 2 }, 1, 200, false),
            (Shape::Workspace { gib: 20 }, 5, 200, false),
            (
                Shape::RampAndWorkspace {
                    rate: 250,
                    chunk: 2048,
                    gib: 2,
                },
                1,
                60,
                true,
            ),
            (
                Shape::RampAndWorkspace {
                    rate: 128,
                    chunk: 512,
                    gib: 8,
                },
                5,
                60,
                true,
            ),
            (Shape::Step { gib: 20, at: 30 }, 5, 60, false),
            (Shape::Step { gib: 20, at: 30 }, 5, 200, false),
            (Shape::Step { gib: 20, at: 58 }, 5, 60, false),
            (
                Shape::RampThenPlateau {
                    rate: 250,
                    until: 40,
                },
                5,
                80,
                false,
            ),
            (
                Shape::RampThenPlateau {
                    rate: 250,
                    until: 60,
                },
                5,
                200,
                false,
            ),
            (Shape::Release { rate: 100 }, 5, 60, false),
            (Shape::SlowSteps, 5, 60, false),
            // Flat memory.
            (Shape::Ramp { rate: 0, chunk: 1 }, 5, 100, false),
        ];
        for &(shape, every, until, want) in rows {
            let mut t = Trend::default();
            let mut fired_at = Vec::new();
            for at in (0..=until).step_by(every as usize) {
                t.push(ms(at), used_mib(shape, at) * MIB);
                if t.sustained_growth(ms(at)).is_some() {
                    fired_at.push(at);
                }
            }
            let last = t.sustained_growth(ms(until));
            assert_eq!(
                last.is_some(),
                want,
                "{shape:?} every {every} ms to {until} ms: {last:?}"
            );
            if !want {
                assert!(
                    fired_at.is_empty() || matches!(shape, Shape::RampThenPlateau { .. }),
                    "{shape:?} fired at {fired_at:?}"
                );
            }
        }
    }

    #[test]
    fn sustained_growth_reports_the_slower_rate() {
        let mut t = Trend::default();
        for at in (0..=60).step_by(5) {
            t.push(
                ms(at),
                used_mib(
                    Shape::Ramp {
                        rate: 128,
                        chunk: 256,
                    },
                    at,
                ) * MIB,
            );
        }
        let gib_s = t.sustained_growth(ms(60)).unwrap() / (1024.0 * MIB as f64);
        assert!((100.0..=140.0).contains(&gib_s), "{gib_s}");
        // Readings outside the window do not count: 200 ms later nothing is judged.
        assert_eq!(t.sustained_growth(ms(260)), None);
    }

    #[test]
    fn windows_that_begin_before_a_decision_are_not_judged_after_it() {
        // A steady climb for a second (5 ms readings): every window shows it…
        let mut t = Trend::default();
        for at in (0..=1000).step_by(5) {
            t.push(ms(at), (1000 + 4 * at) * MIB);
        }
        assert!(t.sustained_growth_lasting(ms(1000)).is_some());
        assert!(t
            .sustained_growth_lasting_since(ms(1000), ms(900))
            .is_some());
        // …but none that began before `since` is judged: growth from before a decision is
        // the victims' own.
        assert_eq!(t.sustained_growth_lasting_since(ms(1000), ms(950)), None);
        assert_eq!(
            t.sustained_growth_lasting_since(ms(1000), Duration::ZERO),
            t.sustained_growth_lasting(ms(1000))
        );
    }
}
