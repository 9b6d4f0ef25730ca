//! The soft band's trigger on a need that no longer fits (`soft_need`): a pod gave back
//! memory it held within `horizon` — a workspace between two steps — and free memory, inside
//! the soft band, can no longer hold it, because something else climbed into its room. It acts
//! at once, not after `grace`, and takes only the pods that carry that climb, by the early
//! trigger's rule (docs/guard.md, "A need that no longer fits").
//!
//! Why: on an H100 at an A10G's headroom a greedy job's last 2 GiB step filled the room a
//! declared job's workspace had just left (docs/validation.md §9i). Over the early trigger's
//! 60 ms the GPU rose by nothing, the workspace's fall and the step cancelling out; free sat
//! between soft and hard, nothing projected the GPU full, and each of the workspace's returns
//! failed for the 10 s of `grace`: 915 allocations lost.
//!
//! Its early form (`early_need`), above soft: a pod gave back memory within `horizon` and its
//! return would take free memory below `hard`, while the GPU steps up twice within 30 ms and
//! a pod that climbs above its marks fills the room. It acts at once, only on pods that rose
//! over the last full-poll span (`state::early::climbing`, `Judged::LastSpan`).
//!
//! Why: on the H100 at an A10G's headroom a job climbing in 2 GiB steps 10 ms apart left
//! 2.8 GiB free after its second step, above soft, with the declared job's 2 GiB workspace
//! out; its third step took free past soft and hard at once. The guard decided on that
//! reading, but the workspace's return then failed for the 50 ms the killed job's memory
//! took to come back (docs/validation.md §9n: 5 of 15 runs, 15 allocations). Neither early
//! window can show that climb before its third step. The workspace's return would have left
//! less than hard after the second: the job was filling the room a neighbour had to have.

use super::early::{EarlyCarry, Judged, CLIMB_NOISE};
use super::Guard;
use crate::guard::growth::PodGrowth;
use crate::guard::rank;
use crate::guard::trend::{Trend, EARLY_SHORT_WINDOW};
use std::time::Duration;

/// At most one full poll this often asked for by this rule on a fast reading ([`wants_poll`]).
/// The rule reads who gave back what from the full polls, so a need that stopped fitting
/// between two regular polls (a second apart) is seen within this; a neighbour's training step
/// (56 ms on the H100) loses at most about one allocation to the wait. While the rule holds
/// back (nobody the guard may take carries the climb), this bounds the extra polls to 20 a
/// second, inside the soft band only.
const NEED_POLL: Duration = Duration::from_millis(50);

/// How far back the fast readings are searched for a workspace that came and went
/// ([`ahead`]'s `cycled`): the harness's slowest turn (150 ms in, 150 out) several times.
pub(super) const CYCLE_WINDOW: Duration = Duration::from_secs(1);

/// How long the same pod's need must have gone unmet, at every reading, before the trigger
/// acts: longer than the turn of two workspaces that cannot both be in at once and take turns
/// (150 ms in the harness's training steps), neither of which climbs. On the H100's run the
/// neighbour's steps came every 56 ms, so this costs it three or four.
pub(super) const NEED_HOLD: Duration = Duration::from_millis(200);

/// The pod on GPU `gpu` that wants back more memory than is `free`: the most any pod gave back
/// of what it used within the full polls' window (`PodGrowth::wanted_back`), if that is more
/// than `free` and not allocator noise ([`CLIMB_NOISE`]). The caller asks only inside the soft
/// band.
pub(super) fn unmet(growth: &PodGrowth, gpu: u32, free: u64) -> Option<(String, u64)> {
    growth
        .wanted_back(gpu)
        .filter(|(_, back)| *back >= CLIMB_NOISE && *back > free)
}

/// The pod on GPU `gpu` whose memory back would take free memory below `hard` once the climb
/// has taken one more `step`: the most any pod gave back of what it used within the full
/// polls' window (`PodGrowth::wanted_back`), if that is more than `free` less `hard` less
/// `step`, and not allocator noise ([`CLIMB_NOISE`]). The early form of [`unmet`]: the caller
/// asks on a full poll while the GPU steps up, with the largest of those steps.
///
/// `cycled`: whether the GPU's fast readings saw a workspace come and go (`Trend::cycled`).
/// The full polls, a second apart and on the climb's steps, seldom catch a workspace that
/// comes and goes every 10 ms out; on the H100 the `two` shape's trainer lost its return in 5
/// of 15 runs where the polls had seen it in (docs/validation.md §9p).
///
/// Why the step: a decision on this reading stops the climb's next allocation at the
/// earliest, not the one that may land while the decision is taken, and what the stopped job
/// holds comes back only after its kill's teardown. On the H100 at an A10G's headroom a job
/// climbing in 2 GiB steps left 3.4 GiB free after its second, room for the declared job's
/// 2 GiB workspace above hard; its third left 1.4 GiB, and the workspace's return failed for
/// the teardown (docs/validation.md §9o).
pub(super) fn ahead(
    growth: &PodGrowth,
    gpu: u32,
    free: u64,
    hard: u64,
    step: u64,
    cycled: bool,
) -> Option<(String, u64)> {
    let room = free.saturating_sub(hard).saturating_sub(step);
    let out = growth
        .wanted_back(gpu)
        .filter(|(_, back)| *back >= CLIMB_NOISE && *back > room);
    // A workspace the fast readings saw come and go (`cycled`) that the full polls do not show
    // out is taken to be in: it needs its room back once it leaves, and the climb's next step
    // alone would take it, leaving less than hard. Whose it is the readings do not say; nobody
    // is excluded from carrying the climb for it.
    out.or_else(|| (cycled && free < hard.saturating_add(step)).then(|| (String::new(), 0)))
}

/// Whether a fast reading should ask for a full poll because the GPU just stepped up a second
/// time over the early trigger's short window, with `free` within two of those steps of
/// `hard` (where [`ahead`] may act), and no full poll (`last_full_poll`) has come since that
/// step. Why: `early_need` decides on full polls only, and the reference polls' 10-ms spacing
/// let the harness's job's third step, 11 ms after its second, land first (docs/validation.md
/// §9p). At most one poll per step of a climb near hard.
pub(super) fn wants_step_poll(
    trend: &Trend,
    at: Duration,
    free: u64,
    hard: u64,
    last_full_poll: Option<Duration>,
) -> bool {
    trend
        .stepped_twice_at(at, EARLY_SHORT_WINDOW)
        .is_some_and(|(step, step_at)| {
            free < hard.saturating_add(step.saturating_mul(2))
                && last_full_poll.is_none_or(|p| p < step_at)
        })
}

/// Which rule on a need asks who climbed into it ([`Guard::need_carry`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Need {
    /// `soft_need`: the need has gone unmet since this instant.
    Unmet { since: Duration },
    /// `early_need`: the need would not fit above `hard` ([`ahead`]).
    Ahead,
}

/// Since when the same pod's need has gone unmet, given the last answer (`since`) and this
/// reading's (`unmet`): a need met, or another pod's, starts over.
pub(super) fn unmet_since(
    since: Option<(String, Duration)>,
    unmet: Option<&(String, u64)>,
    now: Duration,
) -> Option<(String, Duration)> {
    let (uid, _) = unmet?;
    match since {
        Some((was, at)) if was == *uid => Some((was, at)),
        _ => Some((uid.clone(), now)),
    }
}

/// Whether a fast reading that shows a need unmet since `held_since` should ask for a full
/// poll: none since the need has held [`NEED_HOLD`] (the decision is due), or the last one
/// (`last_full_poll`) is [`NEED_POLL`] old or more.
pub(super) fn wants_poll(
    held_since: Duration,
    last_full_poll: Option<Duration>,
    now: Duration,
) -> bool {
    let due = held_since + NEED_HOLD;
    last_full_poll.is_none_or(|at| (now >= due && at < due) || now.saturating_sub(at) >= NEED_POLL)
}

/// Whether a fast reading should ask for a full poll because memory left inside the soft
/// band: memory in use (`used`) fell by [`CLIMB_NOISE`] or more below the last full poll's
/// (`polled`), which was itself inside the soft band (free then, `free` less the fall, below
/// `soft`), and that poll is [`NEED_POLL`] old or more.
///
/// Why: the rule sees what a pod gave back only in the full polls, and a workspace that leaves
/// between two of them is back in the history only at the next, up to a second later. A job
/// that takes the room at once leaves memory in use where it was, and nothing on the fast
/// readings asks for a poll (the cadence test: 7 of 60 phases acted on a second late).
pub(super) fn room_left(
    used: u64,
    polled: Option<u64>,
    free: u64,
    soft: u64,
    last_full_poll: Option<Duration>,
    now: Duration,
) -> bool {
    polled.is_some_and(|p| {
        let fell = p.saturating_sub(used);
        fell >= CLIMB_NOISE && free.saturating_sub(fell) < soft
    }) && last_full_poll.is_none_or(|at| now.saturating_sub(at) >= NEED_POLL)
}

impl Guard {
    /// Who carries the climb that left pod `uid`'s `back` bytes no room on GPU `index`: what
    /// each holds above the most it held at any full poll of the last minute
    /// (`PodGrowth::carried_above_peaks`), so a workspace or an evaluation's buffers back at a
    /// height they reached before, a steady pod and the pod that wants its memory back carry
    /// nothing; nor does a pod that gave memory back at any poll of the window
    /// (`PodGrowth::gave_back`): a workspace whose peak no poll caught looks like a climb, but
    /// a climb gives nothing back. For a need unmet since `since` ([`Need::Unmet`]) the polls
    /// after it are left out: those of the hold see a job that took the room at the level it
    /// climbed to. For [`Need::Ahead`] the climb is under way: a pod is a climber only where
    /// the full polls show it rising over the last span ([`Judged::LastSpan`]).
    ///
    /// Nothing to act on when nothing climbed so, or when the pod that wants memory back
    /// carried the climb itself (the guard protects a pod's neighbours, not a job from its own
    /// growth), or before the guard has watched the GPU for half of `horizon` (too few polls
    /// to have seen anyone's peaks). Those are left to the other triggers (`soft_need`'s to
    /// the soft trigger's `grace`).
    pub(super) fn need_carry(
        &self,
        index: u32,
        now: Duration,
        (uid, back): (&str, u64),
        need: Need,
    ) -> EarlyCarry {
        let window = self.policy.horizon;
        let who = self.seen.pods.get(uid).map_or_else(
            || format!("pod {uid}"),
            |p| format!("{}/{}", p.namespace, p.name),
        );
        let (wants, left, before) = match need {
            Need::Unmet { since } => (
                format!(
                    "{who} wants back {} that no longer fits",
                    rank::fmt_bytes(back)
                ),
                "left to the soft trigger's grace",
                since,
            ),
            // `ahead`'s workspace from the fast readings: nobody's the polls can name.
            Need::Ahead if uid.is_empty() => (
                "a workspace the readings saw come and go would find its room taken by one more \
                 step"
                    .to_string(),
                "left to the other triggers",
                now,
            ),
            Need::Ahead => (
                format!(
                    "{who} wants back {}, more than is free above hard",
                    rank::fmt_bytes(back)
                ),
                "left to the other triggers",
                now,
            ),
        };
        let watched = self
            .seen
            .growth
            .watched_since(index)
            .map_or(Duration::ZERO, |since| now.saturating_sub(since));
        if watched < window / 2 {
            return EarlyCarry::NotYet(format!(
                "{wants}, but the guard has watched this GPU for {} ms, less than half of `horizon`: too little to tell a climb from a workspace at the first peak it saw; {left}",
                watched.as_millis()
            ));
        }
        match self.seen.growth.carried_above_peaks(index, before) {
            None => EarlyCarry::NotYet(format!(
                "{wants}: waiting for a second full poll to tell who climbed into it"
            )),
            Some(c) if c.total < CLIMB_NOISE => EarlyCarry::NotYet(format!(
                "{wants}, but nobody holds more than they did in the minute before: {left}"
            )),
            Some(c) if c.by(uid) >= CLIMB_NOISE => {
                EarlyCarry::NotYet(format!("{wants}, of its own climb: {left}"))
            }
            Some(mut c) => {
                // A pod that gave memory back within the window is a workspace at its
                // height, however its peaks read: it carries nothing here.
                let growth = &self.seen.growth;
                c.pods
                    .retain(|pod, _| growth.gave_back(index, pod) < CLIMB_NOISE);
                EarlyCarry::Carried {
                    rise: c.total,
                    carried: c,
                    over: "above the peaks of the minute before".to_string(),
                    judged: match need {
                        Need::Unmet { .. } => Judged::TwoSpans,
                        Need::Ahead => Judged::LastSpan,
                    },
                }
            }
        }
    }
}
