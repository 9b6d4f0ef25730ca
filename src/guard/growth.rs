//! How much each pod's VRAM grew on each GPU lately: a short history of the full polls'
//! per-pod use, so the ranking can put the pod that is growing ahead of a steady pod that
//! merely holds more right now.
//!
//! Why: under a real kubelet a victim's memory comes back only at its SIGKILL, `max(grace,
//! 2 s)` after the eviction, so what a decision changes in the next seconds is whose growth
//! it stops. Ranking on memory held alone made the H200's A10G-sized runs at 64 GiB/s pick a
//! steady 3 GiB CI pod over a greedy job that had reached 3.3 GiB a few hundred ms after it
//! started (docs/validation.md §3d), and the greedy job filled the GPU while the wrong
//! victim's reclaim was pending.

use crate::model::snapshot::{Owner, ProcessSample};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

/// Who holds memory on a GPU at a poll: a pod, or the processes outside any pod together,
/// whose climb is part of the GPU's that [`PodGrowth::on_gpu`] shares out and
/// [`Carried::outside`] reports, but whom no plan can take.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Holder {
    Pod(String),
    Outside,
}

impl Holder {
    fn pod(uid: &str) -> Self {
        Holder::Pod(uid.to_string())
    }
}

/// Most full polls kept. Polls come every `interval` and, under pressure, on every fast
/// trigger too; the window is a few seconds, so this bounds memory whatever the cadence.
const MAX_SAMPLES: usize = 64;

/// One full poll: per (GPU index, pod UID), the summed use of the pod's processes.
#[derive(Debug, Clone)]
struct Sample {
    at: Duration,
    gpus: BTreeSet<u32>,
    /// Memory in use on each GPU the poll read it from.
    used: BTreeMap<u32, u64>,
    use_bytes: HashMap<(u32, Holder), u64>,
}

impl Sample {
    /// Each holder's use on GPU `gpu` at this poll.
    fn uses_on(&self, gpu: u32) -> impl Iterator<Item = (&Holder, u64)> {
        self.use_bytes
            .iter()
            .filter(move |((g, _), _)| *g == gpu)
            .map(|((_, holder), b)| (holder, *b))
    }

    /// `holder`'s use on GPU `gpu` at this poll (0 if it had nothing there).
    fn use_of(&self, gpu: u32, holder: &Holder) -> u64 {
        self.use_bytes
            .get(&(gpu, holder.clone()))
            .copied()
            .unwrap_or(0)
    }
}

/// What a pod grew by on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Growth {
    /// Bytes more than at the oldest poll of the window (0 if it held or shrank). A pod
    /// absent from that poll of the GPU counts as having held nothing then.
    pub bytes: u64,
    /// How long before now that poll was.
    pub over: Duration,
    /// What it would add over the next window at the rate it climbed since the previous
    /// full poll (counting only use above its high-water mark), and never less than
    /// `bytes`. Why: a job caught a fraction of a second into its climb has grown little
    /// but fast, and measured against the whole window it ranked behind a steady pod
    /// holding more (the H200's runner run 2, docs/validation.md §9). [`PodGrowth::on_gpu`]
    /// bounds it by the GPU's own sustained climb.
    pub ahead: u64,
    /// Bytes it climbed above its high-water mark since the previous full poll, by which
    /// [`PodGrowth::on_gpu`] shares out the GPU's climb.
    pub climbed: u64,
}

/// Who carried a GPU's climb over a span ([`PodGrowth::carried_since`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    /// Bytes of the climb that something carries.
    pub total: u64,
    /// Per pod UID, the part it carries (pods that carry nothing are absent).
    pub pods: HashMap<String, u64>,
    /// The part the processes outside any pod carry.
    pub outside: u64,
    /// What memory no listed process shows rose by over the span (memory NVML attributes
    /// to nobody, or cannot tell): nobody's.
    pub unlisted: u64,
}

impl Carried {
    /// The part pod `uid` carries.
    pub fn by(&self, uid: &str) -> u64 {
        self.pods.get(uid).copied().unwrap_or(0)
    }
}

/// The recent full polls, newest last.
#[derive(Debug, Clone)]
pub struct PodGrowth {
    window: Duration,
    samples: VecDeque<Sample>,
    /// The full polls of the last [`RECENT_SPAN`], none thinned: who still climbs inside a
    /// climb ([`PodGrowth::recent_use`]) is told by polls a few ms apart, which
    /// `samples` thins so that a burst cannot push the window's start out.
    recent: VecDeque<Sample>,
    /// Each holder's most per GPU over every poll but the latest, in buckets of
    /// [`LONG_SPAN`] / [`MAX_LONG`], for [`LONG_SPAN`]: the levels a pod reached before,
    /// further back than the window ([`PodGrowth::carried_above_peaks`]).
    long: VecDeque<(Duration, Most)>,
}

/// Per (GPU index, holder), the most it used over a bucket of polls.
type Most = HashMap<(u32, Holder), u64>;

/// How far back [`PodGrowth::carried_above_peaks`] remembers a pod's peaks: a minute, longer
/// than the evaluation phases and workspaces of the simulation's workload (every 3–40 s).
const LONG_SPAN: Duration = Duration::from_secs(60);

/// Most buckets kept in [`PodGrowth::long`].
const MAX_LONG: usize = 64;

/// The span of one bucket of [`PodGrowth::long`].
const LONG_BUCKET: Duration = Duration::from_micros(LONG_SPAN.as_micros() as u64 / MAX_LONG as u64);

/// How far back [`PodGrowth::recent_use`] can look: more than the early trigger's
/// window.
const RECENT_SPAN: Duration = Duration::from_millis(100);

/// Most polls kept in [`PodGrowth::recent`] (the fast watch reads at most every 5 ms).
const MAX_RECENT: usize = 32;

impl PodGrowth {
    /// Keeps polls up to `window` old (the policy's `horizon`: the growth a decision looks at
    /// is the growth over the time it projects ahead).
    pub fn new(window: Duration) -> Self {
        PodGrowth {
            window,
            samples: VecDeque::new(),
            recent: VecDeque::new(),
            long: VecDeque::new(),
        }
    }

    /// Records a full poll taken at `now` of `gpus` (each with its memory in use, when read),
    /// with its process list.
    pub fn record(
        &mut self,
        now: Duration,
        gpus: BTreeMap<u32, Option<u64>>,
        processes: &[ProcessSample],
    ) {
        let used: BTreeMap<u32, u64> = gpus.iter().filter_map(|(g, u)| Some((*g, (*u)?))).collect();
        let gpus: BTreeSet<u32> = gpus.into_keys().collect();
        let mut use_bytes: HashMap<(u32, Holder), u64> = HashMap::new();
        for p in processes.iter().filter(|p| gpus.contains(&p.gpu)) {
            let holder = match &p.owner {
                Owner::Pod(r) => Holder::pod(&r.uid),
                _ => Holder::Outside,
            };
            let e = use_bytes.entry((p.gpu, holder)).or_default();
            *e = e.saturating_add(p.used_bytes.unwrap_or(0));
        }
        // A clock that went backwards (a test, or a restarted core) starts the history over.
        if self.samples.back().is_some_and(|s| s.at > now) {
            self.samples.clear();
            self.recent.clear();
            self.long.clear();
        }
        // Polls closer together than the window's share of the bound are thinned (the
        // previous latest gives way), so a burst of refresh polls cannot push the window's
        // start out of the history.
        let spacing = self.window / MAX_SAMPLES as u32;
        let n = self.samples.len();
        if n >= 2
            && self
                .samples
                .get(n - 2)
                .is_some_and(|s| now.saturating_sub(s.at) < spacing)
        {
            self.samples.pop_back();
        }
        let sample = Sample {
            at: now,
            gpus,
            used,
            use_bytes,
        };
        // The previous latest joins the long memory: it holds every poll but the latest.
        if let Some(prev) = self.recent.back() {
            if self
                .long
                .back()
                .is_none_or(|(at, _)| prev.at.saturating_sub(*at) >= LONG_BUCKET)
            {
                self.long.push_back((prev.at, HashMap::new()));
            }
            if let Some((_, most)) = self.long.back_mut() {
                for (key, b) in &prev.use_bytes {
                    let e = most.entry(key.clone()).or_default();
                    *e = (*e).max(*b);
                }
            }
            while self.long.len() > MAX_LONG
                || self
                    .long
                    .front()
                    .is_some_and(|(at, _)| now.saturating_sub(*at) > LONG_SPAN)
            {
                self.long.pop_front();
            }
        }
        self.recent.push_back(sample.clone());
        while self.recent.len() > MAX_RECENT
            || self
                .recent
                .front()
                .is_some_and(|s| now.saturating_sub(s.at) > RECENT_SPAN)
        {
            self.recent.pop_front();
        }
        self.samples.push_back(sample);
        // Keep the newest poll at or before the window's start: it is the reference.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|s| now.saturating_sub(s.at) >= self.window)
        {
            self.samples.pop_front();
        }
        while self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
    }

    /// Growth of pod `uid` on GPU `gpu`: its use at the latest poll above its high-water
    /// mark over the first half of the window (from the oldest poll within the window that
    /// saw the GPU — or, when none is that recent, the newest before it — to half a window
    /// before the latest poll).
    ///
    /// A high-water mark rather than one reading: a pod whose workspace comes and goes
    /// (a training step's activations, an evaluation's buffers) reads high at one poll and
    /// low at the next, and compared with a trough its next peak would count as growth.
    /// The first half only, so a pod that keeps climbing still shows the climb of the
    /// second half, and a pod new on the GPU all it holds.
    pub fn of(&self, gpu: u32, uid: &str) -> Growth {
        self.growth(gpu, &Holder::pod(uid))
    }

    /// [`PodGrowth::of`] for any holder.
    fn growth(&self, gpu: u32, holder: &Holder) -> Growth {
        let (Some(latest), Some((reference, then_use))) =
            (self.samples.back(), self.mark(gpu, holder))
        else {
            return Growth::default();
        };
        let now_use = latest.use_of(gpu, holder);
        let bytes = now_use.saturating_sub(then_use);
        // The previous poll is at least the thinning spacing back (`record`), so one
        // quick pair of polls cannot turn a few MiB into a rate.
        let (climbed, lately) = self
            .earlier(gpu)
            .next_back()
            .filter(|_| bytes > 0)
            .map(|prev| {
                let before = prev.use_of(gpu, holder);
                let climbed = now_use.saturating_sub(before.max(then_use));
                let took = latest.at.saturating_sub(prev.at).as_secs_f64();
                let lately = if took > 0.0 {
                    climbed as f64 / took * self.window.as_secs_f64()
                } else {
                    0.0
                };
                (climbed, lately)
            })
            .unwrap_or((0, 0.0));
        Growth {
            bytes,
            over: latest.at.saturating_sub(reference.at),
            // `as` saturates a float too large for u64.
            ahead: (lately as u64).max(bytes),
            climbed,
        }
    }

    /// The polls before the latest that saw GPU `gpu`, oldest first.
    fn earlier(&self, gpu: u32) -> impl DoubleEndedIterator<Item = &Sample> {
        let latest = self.samples.back().map(|s| s.at);
        self.samples
            .iter()
            .filter(move |s| s.gpus.contains(&gpu) && latest.is_some_and(|l| s.at < l))
    }

    /// The reference poll of [`PodGrowth::of`] (the oldest within the window that saw the
    /// GPU, or the newest before it) and `holder`'s high-water mark over the window's first
    /// half from there; `None` without an earlier poll that saw the GPU.
    fn mark(&self, gpu: u32, holder: &Holder) -> Option<(&Sample, u64)> {
        let latest = self.samples.back()?;
        let start = latest.at.saturating_sub(self.window);
        let reference = self
            .earlier(gpu)
            .find(|s| s.at >= start)
            .or_else(|| self.earlier(gpu).next_back())?;
        let half = reference.at.max(latest.at.saturating_sub(self.window / 2));
        let mark = self
            .earlier(gpu)
            .filter(|s| s.at >= reference.at && s.at <= half)
            .map(|s| s.use_of(gpu, holder))
            .max()
            .unwrap_or(0);
        Some((reference, mark))
    }

    /// How much of GPU `gpu`'s climb since `since` something carries, and who carries it
    /// ([`Carried`]); `None` without an earlier poll that saw the GPU.
    ///
    /// Each pod, and the processes outside any pod together, carry what they climbed above
    /// both their use at the last full poll at or before `since` and their high-water mark
    /// (a pod new on the GPU: all it holds): a workspace back at its height carries nothing,
    /// and nor does a job regrowing to where it was before it shrank (the rule: a
    /// level a pod held within the window is not growth). The total is the larger of their
    /// sum and what the GPU uses above the most it used at any earlier full poll of the
    /// window: the GPU above its own peak is new growth whoever holds it, enough for the
    /// early trigger to stop waiting, but nobody's to be taken for. The poll at or before
    /// `since`, not the previous one, so that polls taken close together during a climb
    /// measure it over the same span as the trigger's window.
    ///
    /// (A share of that unexplained rise once went to pods that regrew below their marks;
    /// a review showed a workspace ramping back to its height taken early for a host
    /// process's climb, in 25 of 48 phases: a regrowing job and a returning workspace look
    /// alike.)
    pub fn carried_since(&self, gpu: u32, since: Duration) -> Option<Carried> {
        let latest = self.samples.back()?;
        let before = self
            .earlier(gpu)
            .rev()
            .find(|s| s.at <= since)
            .or_else(|| self.earlier(gpu).next())?;
        let start = latest.at.saturating_sub(self.window);
        let peak = self
            .earlier(gpu)
            .filter(|s| s.at >= start)
            .filter_map(|s| s.used.get(&gpu).copied())
            .max();
        let above_peak = match (latest.used.get(&gpu), peak) {
            (Some(now), Some(peak)) => now.saturating_sub(peak),
            _ => 0,
        };
        let mut carried = Carried::default();
        let mut by_marks = 0u64;
        for (holder, now) in latest.uses_on(gpu) {
            let then = before.use_of(gpu, holder);
            let mark = self.mark(gpu, holder).map_or(0, |(_, m)| m);
            let above = now.saturating_sub(then.max(mark));
            by_marks = by_marks.saturating_add(above);
            if above == 0 {
                continue;
            }
            match holder {
                Holder::Outside => carried.outside = above,
                Holder::Pod(uid) => {
                    carried.pods.insert(uid.clone(), above);
                }
            }
        }
        carried.total = by_marks.max(above_peak);
        // What the GPU rose by since `before` beyond the listed processes' own change.
        let listed = |s: &Sample| s.uses_on(gpu).fold(0u64, |a, (_, b)| a.saturating_add(b));
        carried.unlisted = match (latest.used.get(&gpu), before.used.get(&gpu)) {
            (Some(now), Some(then)) => now
                .saturating_sub(listed(latest))
                .saturating_sub(then.saturating_sub(listed(before))),
            _ => 0,
        };
        Some(carried)
    }

    /// GPU `gpu`'s memory in use at the latest full poll, if that poll read it.
    pub fn latest_used(&self, gpu: u32) -> Option<u64> {
        self.samples.back()?.used.get(&gpu).copied()
    }

    /// Pod `uid`'s use on GPU `gpu` at the latest full poll, and at the latest of the last
    /// [`RECENT_SPAN`]'s polls (none thinned) taken at or before `at`, before the latest, with
    /// when that was; `None` without such a poll. Polls a few ms apart tell a pod climbing now
    /// from one that stepped up and holds since: both rose since the poll before a climb.
    pub fn recent_use(&self, gpu: u32, uid: &str, at: Duration) -> Option<(u64, Duration, u64)> {
        let latest = self.recent.back()?;
        let holder = Holder::pod(uid);
        let use_at = |s: &Sample| s.use_of(gpu, &holder);
        let then = self
            .recent
            .iter()
            .rfind(|s| s.gpus.contains(&gpu) && s.at < latest.at && s.at <= at)?;
        Some((use_at(latest), then.at, use_at(then)))
    }

    /// Pod `uid`'s use on GPU `gpu` at the latest full poll taken at or before `at`, among the
    /// recent polls and the window's, with when; `None` without such a poll. Why: a climb
    /// from a plateau has no recent poll before it (nothing asked for one), only the regular
    /// poll up to a second older.
    pub fn use_at_or_before(&self, gpu: u32, uid: &str, at: Duration) -> Option<(Duration, u64)> {
        let holder = Holder::pod(uid);
        self.recent
            .iter()
            .chain(self.samples.iter())
            .filter(|s| s.gpus.contains(&gpu) && s.at <= at)
            .max_by_key(|s| s.at)
            .map(|s| (s.at, s.use_of(gpu, &holder)))
    }

    /// Pod `uid`'s use on GPU `gpu` at the earliest of the recent full polls taken after
    /// `from` and before `before` that saw it there, with when; `None` without one. Why: a job
    /// whose CUDA context arrived between two regular polls is first seen by the poll its
    /// climb asked for, and the poll a span before it never saw it there.
    pub fn first_seen_between(
        &self,
        gpu: u32,
        uid: &str,
        from: Duration,
        before: Duration,
    ) -> Option<(Duration, u64)> {
        let holder = Holder::pod(uid);
        self.recent
            .iter()
            .filter(|s| s.gpus.contains(&gpu) && s.at > from && s.at < before)
            .map(|s| (s.at, s.use_of(gpu, &holder)))
            .find(|(_, used)| *used > 0)
    }

    /// The most pod `uid` used on GPU `gpu` at any poll of the window, the latest included
    /// (0 if it had nothing there): the level a decision remembers, so that what comes
    /// after it is judged against the pod's peaks, not against one instant.
    pub fn high_water(&self, gpu: u32, uid: &str) -> u64 {
        self.uses_in_window(gpu, uid).max().unwrap_or(0)
    }

    /// Pod `uid`'s use on GPU `gpu` at each poll of the window that saw the GPU, oldest
    /// first, the latest included.
    fn uses_in_window<'a>(&'a self, gpu: u32, uid: &str) -> impl Iterator<Item = u64> + 'a {
        let start = self
            .samples
            .back()
            .map_or(Duration::ZERO, |l| l.at.saturating_sub(self.window));
        let holder = Holder::pod(uid);
        self.samples
            .iter()
            .filter(move |s| s.gpus.contains(&gpu) && s.at >= start)
            .map(move |s| s.use_of(gpu, &holder))
    }

    /// The most pod `uid` fell on GPU `gpu` below the most it had used before, at any poll of
    /// the window, oldest first (0 for a pod that never gave anything back): a workspace
    /// that comes and goes shows its size, a job that only climbs or holds nothing.
    pub fn gave_back(&self, gpu: u32, uid: &str) -> u64 {
        let mut peak = 0u64;
        let mut most = 0u64;
        for u in self.uses_in_window(gpu, uid) {
            peak = peak.max(u);
            most = most.max(peak - u);
        }
        most
    }

    /// Who holds more on GPU `gpu` at the latest poll than at any poll of the last
    /// [`LONG_SPAN`] taken before `before`, and by how much ([`Carried`]: pods, the processes
    /// outside any pod, their total; nothing unlisted); `None` without such a poll. Buckets
    /// that may hold a poll at or after `before` are left out.
    ///
    /// Why: the marks of [`PodGrowth::carried_since`] are the window's first half, a few
    /// seconds; a pod whose evaluation buffers come every 30 s is at a level it never held by
    /// them each time they come (the simulation's workload has workspaces every 3–40 s).
    pub fn carried_above_peaks(&self, gpu: u32, before: Duration) -> Option<Carried> {
        let latest = self.samples.back()?;
        let earlier: Vec<&Most> = self
            .long
            .iter()
            .filter(|(at, _)| at.saturating_add(LONG_BUCKET) < before)
            .map(|(_, most)| most)
            .collect();
        if earlier.is_empty() {
            return None;
        }
        let mut carried = Carried::default();
        for (holder, now) in latest.uses_on(gpu) {
            let key = (gpu, holder.clone());
            let peak = earlier
                .iter()
                .filter_map(|most| most.get(&key).copied())
                .max()
                .unwrap_or(0);
            let above = now.saturating_sub(peak);
            if above == 0 {
                continue;
            }
            carried.total = carried.total.saturating_add(above);
            match holder {
                Holder::Outside => carried.outside = above,
                Holder::Pod(uid) => {
                    carried.pods.insert(uid.clone(), above);
                }
            }
        }
        Some(carried)
    }

    /// When the oldest poll kept that saw GPU `gpu` was taken: how far back the marks reach.
    pub fn watched_since(&self, gpu: u32) -> Option<Duration> {
        self.samples
            .iter()
            .find(|s| s.gpus.contains(&gpu))
            .map(|s| s.at)
    }

    /// The pod on GPU `gpu` furthest below the most it used at any poll of the window, among
    /// the pods the latest poll saw there, and by how much (`None` without such a pod): what
    /// it gave back and may want again, as a workspace that comes and goes does. A pod whose
    /// processes all left is absent from the latest poll and wants nothing back.
    pub fn wanted_back(&self, gpu: u32) -> Option<(String, u64)> {
        let latest = self.samples.back()?;
        if !latest.gpus.contains(&gpu) {
            return None;
        }
        latest
            .uses_on(gpu)
            .filter_map(|(holder, now)| match holder {
                Holder::Pod(uid) => Some((uid, now)),
                Holder::Outside => None,
            })
            .map(|(uid, now)| (uid.clone(), self.high_water(gpu, uid).saturating_sub(now)))
            .filter(|(_, back)| *back > 0)
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
    }

    /// Per pod UID, its growth on GPU `gpu`, for the pods the latest poll saw there, each
    /// pod's rate bounded by `climb`, the GPU's sustained growth (bytes per second, from the
    /// fast readings: `guard::trend`'s rule, which a step does not pass), and not projected at
    /// all without one. Why: between two full polls a workspace allocated at once and a
    /// job climbing look alike; only the GPU's readings in between tell a climb from a step,
    /// and in the simulation's workspaces an unbounded rate took more pods that were not
    /// growing (docs/scheduling.md).
    ///
    /// A pod is projected at no less than its share of that climb: what it climbed above its
    /// high-water mark since the previous full poll, among everything on the GPU that did.
    /// Why: its own rate is measured over the time since the previous poll, most of which a
    /// job that started in between did not exist; on the H100, 3 ms into a 128 GiB/s climb,
    /// a job holding 0.8 GiB was projected at 4 GiB and the steady 6.6 GiB pod beside it
    /// was evicted first (issue 38, runner at an A10G's headroom).
    pub fn on_gpu(&self, gpu: u32, climb: Option<f64>) -> HashMap<String, Growth> {
        let Some(latest) = self.samples.back() else {
            return HashMap::new();
        };
        let bound = climb.map_or(0.0, |r| r.max(0.0) * self.window.as_secs_f64());
        let all: Vec<(&Holder, Growth)> = latest
            .uses_on(gpu)
            .map(|(holder, _)| (holder, self.growth(gpu, holder)))
            .collect();
        // Shared out of no less than what the GPU itself rose by since the previous poll: a
        // climb no listed process shows is nobody's to be projected at.
        let gpu_rose = self
            .earlier(gpu)
            .next_back()
            .and_then(|prev| Some(latest.used.get(&gpu)?.saturating_sub(*prev.used.get(&gpu)?)))
            .unwrap_or(0);
        let climbed_all = all
            .iter()
            .map(|(_, g)| g.climbed)
            .fold(0, u64::saturating_add)
            .max(gpu_rose);
        all.into_iter()
            .filter_map(|(holder, g)| match holder {
                Holder::Pod(uid) => Some((uid, g)),
                Holder::Outside => None,
            })
            .map(|(uid, mut g)| {
                let share = if climbed_all > 0 {
                    bound * (g.climbed as f64 / climbed_all as f64)
                } else {
                    0.0
                };
                // `as` saturates a float too large for u64.
                g.ahead = g.ahead.max(share as u64).min(bound as u64).max(g.bytes);
                (uid.clone(), g)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::MIB;
    use crate::testkit::fixtures::*;

    fn s(t: f64) -> Duration {
        Duration::from_secs_f64(t)
    }

    /// GPUs read without their memory in use.
    fn gpus(g: &[u32]) -> BTreeMap<u32, Option<u64>> {
        g.iter().map(|&g| (g, None)).collect()
    }

    /// GPU 0 with `mib` in use.
    fn used(mib: u64) -> BTreeMap<u32, Option<u64>> {
        BTreeMap::from([(0, Some(mib * MIB))])
    }

    #[test]
    fn a_new_pod_grew_from_nothing_and_a_steady_one_not_at_all() {
        let mut h = PodGrowth::new(s(5.0));
        h.record(s(0.0), gpus(&[0]), &[proc_in("steady", 0, 3000)]);
        assert_eq!(
            h.of(0, "steady"),
            Growth::default(),
            "one poll: no growth yet"
        );
        h.record(
            s(1.0),
            gpus(&[0]),
            &[proc_in("steady", 0, 3000), proc_in("greedy", 0, 3300)],
        );
        assert_eq!(h.of(0, "steady").bytes, 0);
        let g = h.of(0, "greedy");
        assert_eq!((g.bytes, g.over), (3300 * MIB, s(1.0)));
        assert_eq!(h.on_gpu(0, None).len(), 2);
        assert!(h.on_gpu(1, None).is_empty());
    }

    /// A job a fraction of a second into its climb is projected at its rate; a workspace
    /// back at the height it had before, or a climb back up to its high-water mark, is not.
    #[test]
    fn a_young_climb_is_projected_at_its_rate_and_a_workspace_is_not() {
        let mut h = PodGrowth::new(s(5.0));
        h.record(s(0.0), gpus(&[0]), &[proc_in("ws", 0, 3000)]);
        h.record(
            s(1.0),
            gpus(&[0]),
            &[proc_in("ws", 0, 1000), proc_in("greedy", 0, 300)],
        );
        h.record(
            s(1.1),
            gpus(&[0]),
            &[proc_in("ws", 0, 3000), proc_in("greedy", 0, 1100)],
        );
        let g = h.of(0, "greedy");
        // Counted from nothing over the window, it grew 1100 MiB; since the previous poll
        // 800 MiB in 0.1 s, which over the next 5 s is 40 000 MiB.
        assert_eq!((g.bytes, g.over), (1100 * MIB, s(1.1)));
        assert_eq!(g.ahead / MIB, 40_000, "{g:?}");
        let ws = h.of(0, "ws");
        assert_eq!((ws.bytes, ws.ahead), (0, 0), "back at its high-water mark");
        // Above the mark by 200 MiB: only those count towards the rate, not the 2200 MiB
        // climb back from the trough.
        h.record(
            s(1.2),
            gpus(&[0]),
            &[proc_in("ws", 0, 1000), proc_in("greedy", 0, 1100)],
        );
        h.record(
            s(1.3),
            gpus(&[0]),
            &[proc_in("ws", 0, 3200), proc_in("greedy", 0, 1100)],
        );
        let ws = h.of(0, "ws");
        assert_eq!((ws.bytes, ws.ahead / MIB), (200 * MIB, 10_000), "{ws:?}");
        // A pod that stopped climbing keeps its growth but is projected at none.
        let g = h.of(0, "greedy");
        assert_eq!((g.bytes, g.ahead), (1100 * MIB, 1100 * MIB), "{g:?}");

        // Ranked, the rate is bounded by the GPU's sustained climb, and without one (the
        // GPU's readings showed a step, or nothing) only the growth counts.
        h.record(
            s(1.4),
            gpus(&[0]),
            &[proc_in("ws", 0, 3200), proc_in("greedy", 0, 1900)],
        );
        let mib_s = |m: f64| Some(m * MIB as f64);
        let on = h.on_gpu(0, mib_s(1000.0));
        assert_eq!(
            on["greedy"].ahead / MIB,
            5000,
            "1000 MiB/s over 5 s: {:?}",
            on["greedy"]
        );
        // The only pod that climbed: the GPU's climb is all its own.
        let on = h.on_gpu(0, mib_s(100_000.0));
        assert_eq!(
            on["greedy"].ahead / MIB,
            500_000,
            "the GPU's climb: {:?}",
            on["greedy"]
        );
        let on = h.on_gpu(0, None);
        assert_eq!(on["greedy"].ahead, on["greedy"].bytes, "{:?}", on["greedy"]);
        assert_eq!(on["greedy"].bytes, 1900 * MIB);
    }

    /// The H100's runner run at 128 GiB/s (issue 38): a full poll a second before the job
    /// started, the next 3 ms into its climb. Its own rate since that poll (0.8 GiB over
    /// 1 s) projected it behind a steady 6.6 GiB pod; all of the GPU's climb in between was
    /// its, and so is the projection. A workspace back at its height and a steady pod share
    /// none of it; two climbers share it by what each climbed, processes outside any pod
    /// included.
    #[test]
    fn a_pod_is_projected_at_its_share_of_the_gpus_climb() {
        let mut h = PodGrowth::new(s(5.0));
        let base = |ws: u64| vec![proc_in("steady", 0, 6754), proc_in("runner", 0, 4700 + ws)];
        h.record(s(0.0), gpus(&[0]), &base(2048));
        h.record(s(1.0), gpus(&[0]), &base(0));
        let mut now = base(2048);
        now.push(proc_in("greedy", 0, 800));
        h.record(s(2.0), gpus(&[0]), &now);
        let mib_s = |m: f64| Some(m * MIB as f64);
        // The GPU climbs at 20 GiB/s (its fast readings): 100 GiB over the 5-s window.
        let on = h.on_gpu(0, mib_s(20_480.0));
        assert_eq!(on["greedy"].ahead / MIB, 102_400, "{:?}", on["greedy"]);
        assert_eq!(on["steady"].ahead, 0);
        assert_eq!(on["runner"].ahead, 0, "back at its high-water mark");
        // Without the GPU's climb nothing is projected beyond what it grew.
        assert_eq!(h.on_gpu(0, None)["greedy"].ahead, 800 * MIB);

        // A second climber and a host process climbing: shares by what each climbed.
        let mut next = base(2048);
        next.extend([
            proc_in("greedy", 0, 1400),
            proc_in("other", 0, 300),
            host_proc(7, 0, 300),
        ]);
        h.record(s(3.0), gpus(&[0]), &next);
        let on = h.on_gpu(0, mib_s(10_240.0));
        // Climbed since the previous poll: greedy 600 (above its 800 mark), other 300, the
        // host 300; of the 50 GiB ahead, half, a quarter, and the host's quarter to nobody.
        // Their own rates (600 and 300 MiB over 1 s) would say 3000 and 1500 MiB.
        assert_eq!(on["greedy"].ahead / MIB, 25_600, "{:?}", on["greedy"]);
        assert_eq!(on["other"].ahead / MIB, 12_800, "{:?}", on["other"]);
        assert_eq!(on["steady"].ahead, 0);
        // The host process's share is nobody's: only pods are projected.
        let mut pods: Vec<&str> = on.keys().map(String::as_str).collect();
        pods.sort_unstable();
        assert_eq!(pods, ["greedy", "other", "runner", "steady"]);
    }

    /// What carries a climb over the early trigger's window: a workspace back at its height
    /// carries none of it and a job new on the GPU all it holds; a job climbing while polls
    /// come close together carries its climb since before the window, not since the last
    /// poll; a job regrowing to where it was before it shrank carries nothing by its own
    /// mark, and the GPU above its own peak is a rise but nobody's; a climb no listed
    /// process shows is nobody's, and counted as such.
    #[test]
    fn a_climb_is_carried_by_what_rose_above_its_marks() {
        // A workspace coming back as a job starts up.
        let mut h = PodGrowth::new(s(5.0));
        h.record(
            s(0.0),
            used(8000),
            &[proc_in("ws", 0, 7000), proc_in("steady", 0, 1000)],
        );
        h.record(
            s(0.5),
            used(6000),
            &[proc_in("ws", 0, 5000), proc_in("steady", 0, 1000)],
        );
        let now = [
            proc_in("ws", 0, 7000),
            proc_in("steady", 0, 1000),
            proc_in("new", 0, 774),
        ];
        h.record(s(1.04), used(8774), &now);
        let c = h.carried_since(0, s(0.98)).unwrap_or_default();
        assert_eq!(c.total, 774 * MIB);
        // The workspace back at its height carries none of it; the new job all of it.
        assert_eq!((c.by("new"), c.by("ws"), c.by("steady")), (774 * MIB, 0, 0));
        assert_eq!(h.carried_since(1, s(0.98)), None, "never saw GPU 1");

        // Polls 5 ms apart during a climb: measured from the poll before the window.
        let mut h = PodGrowth::new(s(5.0));
        h.record(s(0.0), used(2000), &[proc_in("g", 0, 1000)]);
        h.record(s(1.0), used(2000), &[proc_in("g", 0, 1000)]);
        h.record(s(1.1), used(4000), &[proc_in("g", 0, 3000)]);
        h.record(s(1.105), used(4200), &[proc_in("g", 0, 3200)]);
        assert_eq!(h.of(0, "g").climbed, 200 * MIB, "since the previous poll");
        let c = h.carried_since(0, s(1.045)).unwrap_or_default();
        assert_eq!((c.total, c.by("g")), (2200 * MIB, 2200 * MIB));

        // A job regrowing below its own mark, into memory a neighbour took meanwhile.
        let mut h = PodGrowth::new(s(5.0));
        for (t, a, b) in [
            (0.0, 6000, 1000),
            (1.0, 1000, 6000),
            (2.0, 1000, 6000),
            (2.1, 3000, 6000),
        ] {
            let procs = [proc_in("a", 0, a), proc_in("b", 0, b)];
            h.record(s(t), used(a + b), &procs);
        }
        let c = h.carried_since(0, s(2.04)).unwrap_or_default();
        // The GPU above its peak is a rise, but nobody's: the job is back below a level it
        // held, as a workspace would be, and the neighbour holds steady.
        assert_eq!(c.total, 2000 * MIB);
        assert_eq!((c.by("a"), c.by("b"), c.unlisted), (0, 0, 0));

        // A climb carried by a process outside any pod, memory no process shows, and a
        // workspace back at its height: the pods carry none of what is not theirs.
        let mut h = PodGrowth::new(s(5.0));
        let host = |mib| host_proc(7, 0, mib);
        h.record(s(0.0), used(6000), &[proc_in("ws", 0, 3000), host(1000)]);
        h.record(s(0.5), used(4000), &[proc_in("ws", 0, 1000), host(1000)]);
        h.record(s(1.0), used(4000), &[proc_in("ws", 0, 1000), host(1000)]);
        h.record(s(1.06), used(9500), &[proc_in("ws", 0, 3000), host(4000)]);
        let c = h.carried_since(0, s(1.0)).unwrap_or_default();
        // The GPU is 3500 above its peak; the host process climbed 3000 above its mark.
        assert_eq!(
            (c.total, c.outside, c.by("ws")),
            (3500 * MIB, 3000 * MIB, 0)
        );
        assert_eq!(c.unlisted, 500 * MIB);

        // A workspace ramping back to its height while a host process climbs, the GPU's
        // peak poll having caught the workspace low (a review: it was given 6000).
        let mut h = PodGrowth::new(s(5.0));
        let both = |w, x| (used(w + x), [proc_in("w", 0, w), host(x)]);
        for (t, w, x) in [(1.0, 10_000, 0), (4.0, 4000, 8000), (4.06, 10_000, 12_000)] {
            let (u, procs) = both(w, x);
            h.record(s(t), u, &procs);
        }
        let c = h.carried_since(0, s(4.0)).unwrap_or_default();
        assert_eq!((c.by("w"), c.outside, c.unlisted), (0, 4000 * MIB, 0));

        // A pod 10 MiB up below its mark, as memory no listed process shows climbs: it
        // carries nothing of the climb (a review found it handed all 2000).
        let mut h = PodGrowth::new(s(5.0));
        let at = |ws, a| [proc_in("ws", 0, ws), proc_in("a", 0, a)];
        h.record(s(1.0), used(3500), &at(3000, 500));
        h.record(s(3.0), used(4500), &at(1000, 3500));
        h.record(s(4.0), used(1500), &at(1000, 500));
        h.record(s(5.2), used(6500), &at(1010, 500));
        let c = h.carried_since(0, s(5.14)).unwrap_or_default();
        assert_eq!(
            (c.total, c.by("ws"), c.unlisted),
            (2000 * MIB, 0, 4990 * MIB)
        );

        // Every byte listed: nothing unlisted, though the GPU's peak is older than the
        // poll before the window (a review: 3000 of it was called unlisted).
        let mut h = PodGrowth::new(s(5.0));
        for (t, a, x) in [
            (0.0, 40_000, 1000),
            (3.0, 30_000, 3000),
            (3.9, 30_000, 4000),
            (3.96, 40_000, 8000),
        ] {
            h.record(s(t), used(a + x), &[proc_in("t", 0, a), proc_in("x", 0, x)]);
        }
        let c = h.carried_since(0, s(3.9)).unwrap_or_default();
        assert_eq!((c.by("x"), c.unlisted), (4000 * MIB, 0));

        // Use at recent polls: the climber's and a pod's that stepped up before it.
        let mut h = PodGrowth::new(s(5.0));
        let with_s = |a| {
            [
                proc_in("ws", 0, 1000),
                proc_in("a", 0, a),
                proc_in("s", 0, 2000),
            ]
        };
        h.record(s(0.0), used(2000), &at(1000, 1000));
        h.record(s(0.62), used(5000), &with_s(1000));
        h.record(s(0.64), used(5800), &with_s(1800));
        let then = s(0.625);
        assert_eq!(
            h.recent_use(0, "a", then),
            Some((1800 * MIB, s(0.62), 1000 * MIB))
        );
        assert_eq!(
            h.recent_use(0, "s", then),
            Some((2000 * MIB, s(0.62), 2000 * MIB))
        );
        // The poll at 0 s is more than the recent span before the latest.
        assert_eq!(h.recent_use(0, "s", s(0.6)), None, "no recent poll then");

        // 2 GiB that no listed process shows, and a steady pod 1 MiB up.
        let mut h = PodGrowth::new(s(5.0));
        h.record(s(0.0), used(6000), &[proc_in("steady", 0, 6000)]);
        h.record(s(1.0), used(8000), &[proc_in("steady", 0, 6001)]);
        let on = h.on_gpu(0, Some(20_480.0 * MIB as f64));
        assert!(on["steady"].ahead < 60 * MIB, "{:?}", on["steady"]);
    }

    #[test]
    fn a_workspace_that_left_is_wanted_back_for_the_window_and_a_pod_that_left_is_not() {
        let mut h = PodGrowth::new(s(5.0));
        assert_eq!(h.wanted_back(0), None, "no poll yet");
        assert_eq!(h.watched_since(0), None);
        let at = |ws, steady| [proc_in("ws", 0, ws), proc_in("steady", 0, steady)];
        h.record(s(0.0), used(9000), &at(7000, 2000));
        assert_eq!(h.wanted_back(0), None, "every pod at its peak");
        assert_eq!(h.watched_since(0), Some(s(0.0)));
        h.record(s(0.3), used(7000), &at(5000, 2000));
        assert_eq!(h.wanted_back(0), Some(("ws".into(), 2000 * MIB)));
        // The steady pod shrank by less: the workspace's 2000 is the most wanted back.
        h.record(s(0.6), used(6500), &at(5000, 1500));
        assert_eq!(h.wanted_back(0), Some(("ws".into(), 2000 * MIB)));
        assert_eq!(h.gave_back(0, "ws"), 2000 * MIB);
        assert_eq!(h.gave_back(0, "steady"), 500 * MIB);
        assert_eq!(h.gave_back(0, "nobody"), 0);
        // Back at its height: only the steady pod's 500.
        h.record(s(0.9), used(8500), &at(7000, 1500));
        assert_eq!(h.wanted_back(0), Some(("steady".into(), 500 * MIB)));
        // Past the window, a peak is forgotten.
        h.record(s(6.0), used(6500), &at(5000, 1500));
        h.record(s(12.0), used(6500), &at(5000, 1500));
        assert_eq!(h.wanted_back(0), None);
        // A pod whose processes left wants nothing back; a poll that did not read the GPU
        // tells nothing.
        h.record(s(12.5), used(5000), &[proc_in("ws", 0, 5000)]);
        assert_eq!(h.wanted_back(0), None);
        h.record(s(13.0), gpus(&[1]), &[]);
        assert_eq!(h.wanted_back(0), None);
    }

    #[test]
    fn a_level_held_within_a_minute_is_no_climb_above_the_peaks() {
        let mut h = PodGrowth::new(s(5.0));
        let at = |ev, x| [proc_in("ev", 0, ev), proc_in("x", 0, x)];
        h.record(s(0.0), used(1000), &at(1000, 0));
        assert_eq!(
            h.carried_above_peaks(0, s(1.0)),
            None,
            "one poll: nothing before it"
        );
        // Evaluation buffers of 3000 for two seconds, every 30 s.
        h.record(s(1.0), used(4000), &at(4000, 0));
        h.record(s(2.0), used(4000), &at(4000, 0));
        for t in 3..31 {
            h.record(s(f64::from(t)), used(1000), &at(1000, 0));
        }
        // Back at 31 s, with a job that climbed to 2000 meanwhile: the job alone carries.
        h.record(s(30.5), used(2000), &at(1000, 1000));
        h.record(s(31.0), used(6000), &at(4000, 2000));
        let c = h.carried_above_peaks(0, s(31.0)).unwrap_or_default();
        assert_eq!(
            (c.by("ev"), c.by("x"), c.total),
            (0, 1000 * MIB, 1000 * MIB)
        );
        // Measured only against polls before 30 s: the job climbed all of its 2000.
        let c = h.carried_above_peaks(0, s(30.0)).unwrap_or_default();
        assert_eq!((c.by("ev"), c.by("x")), (0, 2000 * MIB));
        // The window's marks forget the buffers: by them, they climbed 3000.
        let w = h.carried_since(0, s(26.0)).unwrap_or_default();
        assert_eq!(w.by("ev"), 3000 * MIB);
        // More than a minute later they are a level never held.
        for t in 32..100 {
            h.record(s(f64::from(t)), used(3000), &at(1000, 2000));
        }
        h.record(s(100.0), used(6000), &at(4000, 2000));
        let c = h.carried_above_peaks(0, s(100.0)).unwrap_or_default();
        assert_eq!((c.by("ev"), c.by("x")), (3000 * MIB, 0));
        assert!(h.long.len() <= MAX_LONG);
    }

    #[test]
    fn growth_is_measured_over_the_window_and_shrinking_counts_as_none() {
        let mut h = PodGrowth::new(s(2.0));
        for (t, mib) in [(0.0, 100), (1.0, 200), (2.0, 400), (3.0, 800), (3.5, 700)] {
            h.record(s(t), gpus(&[0]), &[proc_in("a", 0, mib)]);
        }
        // The oldest poll within 2 s of 3.5 s is the one at 2.0 s (400 MiB).
        let g = h.of(0, "a");
        assert_eq!((g.bytes, g.over), (300 * MIB, s(1.5)));
        h.record(s(4.0), gpus(&[0]), &[proc_in("a", 0, 100)]);
        assert_eq!(h.of(0, "a").bytes, 0);
    }

    #[test]
    fn only_polls_that_saw_the_gpu_are_a_reference_and_memory_is_bounded() {
        let mut h = PodGrowth::new(s(5.0));
        h.record(s(0.0), gpus(&[0]), &[proc_in("a", 0, 1000)]);
        // A poll where GPU 0 was not read (lost for a moment): not a reference for it.
        h.record(s(1.0), gpus(&[1]), &[]);
        h.record(s(2.0), gpus(&[0]), &[proc_in("a", 0, 1500)]);
        let g = h.of(0, "a");
        assert_eq!((g.bytes, g.over), (500 * MIB, s(2.0)));
        for i in 0..1000 {
            h.record(
                s(3.0 + i as f64 * 0.001),
                gpus(&[0]),
                &[proc_in("a", 0, 1500)],
            );
        }
        assert!(h.samples.len() <= MAX_SAMPLES);
        // A burst of polls does not push the window's start out: the reference is still
        // about a window back.
        assert!(h.of(0, "a").over >= s(0.9), "{:?}", h.of(0, "a"));
        // A clock that goes backwards starts over.
        h.record(s(0.5), gpus(&[0]), &[proc_in("a", 0, 1500)]);
        assert_eq!(h.of(0, "a"), Growth::default());
    }
}
