//! The early trigger's judgement on the full poll it asked for: who carries the climb the
//! GPU's readings showed, and which pods an early decision may take for it (docs/guard.md,
//! "Acting before soft"). The early trigger acts before there is any pressure, to stop a
//! climb, so it takes only the pods that carry it.

use super::Guard;
use crate::guard::growth::{Carried, PodGrowth};
use crate::guard::rank;
use crate::guard::status::HeldBack;
use crate::guard::trend;
use std::collections::HashMap;
use std::time::Duration;

/// The share of the early trigger's rise that something's own climb must carry
/// ([`Guard::early_carry`]), and that the pods it may evict must carry ([`climbers_only`]):
/// half, so a job's start-up beside a returning workspace of more than its size does not
/// pass, and a job climbing beside one passes once it has climbed as much as the workspace
/// (16 ms at 128 GiB/s beside 2 GiB).
const EARLY_CARRIED: f64 = 0.5;

/// A pod whose own part of a climb is less than this is not climbing: allocator noise,
/// a workspace a few MiB larger than before (the early trigger's envelope ignores rises
/// this small too).
pub(super) const CLIMB_NOISE: u64 = 64 << 20;

/// Less than this over a span of [`rising`] is holding, not climbing: a few MiB of
/// allocator churn.
const STILL: u64 = CLIMB_NOISE / 4;

/// At most one reference poll this often ([`wants_reference`]): so that during a climb
/// the decision's full poll finds one before its window, and recent ones for [`rising`].
const REFERENCE_EVERY: Duration = Duration::from_millis(10);

/// Reference polls only while the rise the last reading showed would reach hard within
/// this: where an early decision may come. A model loading at 2–20 GiB/s far from hard
/// asks for none (a review counted 70–97 % of such readings turned into full polls).
const REFERENCE_LEAD: Duration = Duration::from_secs(2);

/// The span of each of [`rising`]'s two steps: a third of the early window, the span over
/// which the early trigger's envelope must rise too, so that a climb it sees as sustained
/// rises in each (a climb in chunks up to 20 ms apart: 2 GiB at 100 GiB/s).
const SPAN: Duration = Duration::from_millis(20);

/// What a job's start-up holds at most: its CUDA context and first buffers (866 MiB on the
/// H100 with a 256 MiB buffer, docs/validation.md §9m). A pod holding less is starting, not
/// climbing ([`starting_up`]).
const START_UP: u64 = 1 << 30;

/// What the full poll says of the early trigger's rise ([`Guard::early_carry`]).
pub(super) enum EarlyCarry {
    /// Not the early trigger, or no rise to judge: it stands as the GPU shows it.
    Unjudged,
    /// Too little of it is carried yet, or nothing to tell who carries it by: wait for the
    /// next full poll (why).
    NotYet(String),
    /// The rise, who carries it, over what it was measured (for the reasons given), and how
    /// the full polls must show a pod still rising for it to be a climber ([`Judged`]).
    Carried {
        rise: u64,
        carried: Carried,
        over: String,
        judged: Judged,
    },
}

/// How [`climbing`] reads the full polls for a pod's rise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judged {
    /// Over each of the last two spans; a pod the polls cannot tell yet is climbing: a climb
    /// the early trigger's 60-ms window shows has lasted most of it.
    TwoSpans,
    /// Over each of the last two spans; a pod the polls cannot tell yet, or one that had
    /// nothing on the GPU a span ago, is not climbing: a climb only the short window shows.
    TwoSpansStrict,
    /// Over the last span, from what it held a span ago or, first seen since, from what it
    /// held when first seen: a climb under way for as little as two steps, which `early_need`
    /// acts on while a neighbour's workspace is out.
    LastSpan,
}

/// Whether a fast reading should ask for a full poll though no trigger fired: memory in
/// use (`used`) is [`CLIMB_NOISE`] or more above the last full poll's (`polled`); at the
/// rise rate the last reading showed (`rate`, bytes per second) the GPU would reach hard
/// (`to_hard` bytes away) within [`REFERENCE_LEAD`]; and the last full poll is
/// [`REFERENCE_EVERY`] old or more (`last_full_poll`).
///
/// Why: the early trigger's decision tells who climbs by each pod's rise since the last full
/// poll before its 60-ms window, which without this is the last regular poll, up to a
/// second older. A CI job that started in that second and holds steady since rose as much
/// as the climber; ranked first, it was taken for a climb it had no part in (a review of the
/// climbers-only rule: a trainer loading a model beside it). A climb fast enough for the
/// early trigger is only seen as sustained once it fills most of the window, so a poll it
/// asked for itself comes too late: the poll must follow the step. Polled so, a step before
/// the climb is in that reference, and recent polls show who still rises ([`rising`]). The
/// cost, near hard only, is a full poll per [`CLIMB_NOISE`] the GPU gains, at most one per
/// [`REFERENCE_EVERY`]: up to 100 a second during a fast climb, a few a second beside a
/// workspace that comes and goes.
pub(super) fn wants_reference(
    used: u64,
    polled: Option<u64>,
    to_hard: u64,
    rate: f64,
    last_full_poll: Option<Duration>,
    now: Duration,
) -> bool {
    polled.is_some_and(|p| used.saturating_sub(p) >= CLIMB_NOISE)
        && rate > 0.0
        && to_hard as f64 / rate <= REFERENCE_LEAD.as_secs_f64()
        && last_full_poll.is_none_or(|at| now.saturating_sub(at) >= REFERENCE_EVERY)
}

/// Whether pod `uid` is still rising on GPU `gpu` by the full polls of the last ~100 ms:
/// by [`STILL`] or more since the latest poll at least [`SPAN`] old, and over the same
/// span before that poll; `None` without such a poll (nothing tells).
///
/// Two spans, because a step up (a job's CUDA context and first buffers, 2 GiB at once)
/// inside a climb makes the early trigger fire within a few ms: since the poll before it, the
/// step rose as a climber does. A climb the early trigger sees as sustained has lasted most
/// of its 60-ms window and rose in both.
///
/// For a climb only the short window shows ([`Judged::TwoSpansStrict`]) the polls must tell:
/// a pod they cannot judge yet, or one that had nothing on the GPU at the poll a span old (a
/// single step of it reads as a rise in both spans), is not rising. Otherwise a CI job's
/// 2 GiB step, 5 or 20 ms into a trainer's load, was taken for the load (unit
/// `state::a_steady_pod_is_not_taken_early_for_a_climb_it_had_no_part_in`).
fn rising(growth: &PodGrowth, gpu: u32, uid: &str, now: Duration, strict: bool) -> Option<bool> {
    let Some((now_use, at, then)) = growth.recent_use(gpu, uid, now.saturating_sub(SPAN)) else {
        return strict.then_some(false);
    };
    if strict && then == 0 {
        return Some(false);
    }
    let before = growth
        .recent_use(gpu, uid, at.saturating_sub(SPAN))
        .map(|(_, _, b)| b);
    Some(
        now_use.saturating_sub(then) >= STILL
            && before.is_none_or(|b| then.saturating_sub(b) >= STILL),
    )
}

/// Whether candidate `v` on GPU `gpu` is climbing, for an early decision outside the soft
/// band: not while it holds less than [`START_UP`]; otherwise as [`rising`] tells, or, for
/// [`Judged::LastSpan`] (`early_need`), by [`STILL`] or more since the latest full poll at
/// least [`SPAN`] old, which saw it on the GPU, or, where that poll did not, since the first
/// poll after it that did: a job's second 2 GiB step comes 10 ms after its first, and the room
/// a neighbour's workspace needs is gone at its third. A job whose CUDA context arrived
/// between two regular polls is seen first by the poll its first step asked for, 10 ms before
/// its second (unit `need_tests::a_job_climbing_in_2_gib_steps_is_stopped_before_it_takes_a_workspaces_room_at_any_alignment`).
///
/// Why: a job's CUDA context arrives in one or two steps within 50 ms, as a neighbour's
/// workspace comes back: together a climb of 60 GiB/s or more, and the job carries half of
/// it or more. On the H100 at an A10G's headroom the early trigger took a job 20 ms into its
/// start-up, a second before it grew (docs/validation.md §9m; unit
/// `need_tests::a_jobs_start_up_beside_a_returning_workspace_takes_nobody`). Evicting it
/// stops no climb: what a start-up holds is all it takes until it grows, and if it then
/// grows, it is a climber by the next full poll.
pub(super) fn climbing(
    v: &rank::Victim,
    growth: &PodGrowth,
    gpu: u32,
    now: Duration,
    judged: Judged,
) -> Option<bool> {
    if starting_up(v) {
        return Some(false);
    }
    match judged {
        Judged::TwoSpans => rising(growth, gpu, &v.uid, now, false),
        Judged::TwoSpansStrict => rising(growth, gpu, &v.uid, now, true),
        Judged::LastSpan => {
            let span_ago = now.saturating_sub(SPAN);
            Some(
                growth
                    .use_at_or_before(gpu, &v.uid, span_ago)
                    .filter(|(_, then)| *then > 0)
                    .or_else(|| growth.first_seen_between(gpu, &v.uid, span_ago, now))
                    .is_some_and(|(_, then)| v.use_bytes.saturating_sub(then) >= STILL),
            )
        }
    }
}

/// Whether candidate `v` holds no more than a job's start-up ([`START_UP`]).
fn starting_up(v: &rank::Victim) -> bool {
    v.use_bytes < START_UP
}

/// Keeps, of an early decision's candidates, the pods that carry the climb, in rank order;
/// why no early decision is taken otherwise: when the pods it may evict carry less than
/// [`EARLY_CARRIED`] of the rise, or when the first-ranked pod is not one of them. A pod
/// carries what it climbed above its marks (`carried`), counted only above its declared
/// request, if that is [`CLIMB_NOISE`] or more, and — where `climbing` tells ([`climbing`])
/// — it is climbing still. The caller answers `None` from `climbing` inside the soft band,
/// where a climb that is over, or a start-up, still leaves a neighbour no room.
///
/// Why: evicting a pod that is not climbing stops nothing and takes a bystander. A climb
/// carried by a process outside any pod, by a pod the guard may not evict, by memory no
/// listed process shows, or by a pod within its declared request (growth inside a
/// declaration never makes another pod a victim, issue 38) is nobody's to stop early; nor
/// is a climb of a pod that a steady one outranks (by priority, by being over its request,
/// or by holding more): taking the steady pod early would go for nothing if the climb stops
/// short of hard, and taking the climber would invert the order. The soft and hard
/// triggers, which follow the kubelet's order, answer it if the GPU does fill.
pub(super) fn climbers_only(
    ranking: &mut rank::Ranking,
    carried: &Carried,
    rise: u64,
    over: &str,
    judged: Judged,
    climbing: impl Fn(&rank::Victim) -> Option<bool>,
) -> Result<(), String> {
    // Only a pod's climb above its declared request is its own to answer for. Judged once
    // per pod: `climbing` reads the recent polls.
    let climb = |v: &rank::Victim| carried.by(&v.uid).min(v.above_request());
    let climbers: HashMap<String, u64> = ranking
        .candidates
        .iter()
        .filter(|v| climb(v) >= CLIMB_NOISE && climbing(v).unwrap_or(true))
        .map(|v| (v.uid.clone(), climb(v)))
        .collect();
    let a_climber = |v: &rank::Victim| climbers.contains_key(&v.uid);
    let by_candidates = climbers.values().fold(0u64, |a, b| a.saturating_add(*b));
    if (by_candidates as f64) < EARLY_CARRIED * rise as f64 {
        return Err(format!(
            "the pods the guard may evict carry {} of a climb of {} {over}, less than half ({}): left to the soft and hard triggers",
            rank::fmt_bytes(by_candidates),
            rank::fmt_bytes(rise),
            carriers(ranking, carried, judged, &climbing)
        ));
    }
    if let Some(first) = ranking.candidates.first().filter(|v| !a_climber(v)) {
        let climber = ranking
            .candidates
            .iter()
            .find(|v| a_climber(v))
            .map_or_else(String::new, |v| format!("{}/{}", v.namespace, v.name));
        return Err(format!(
            "{}/{}, which is not climbing, ranks ahead of the climbing {climber} ({}): left to the soft and hard triggers",
            first.namespace, first.name, first.reason
        ));
    }
    ranking.keep_only(a_climber, &rank::Exclusion::NotClimbing);
    Ok(())
}

/// Who carries a climb, for the reason a GPU gives for not acting on it: the largest
/// parts first.
fn carriers(
    ranking: &rank::Ranking,
    carried: &Carried,
    judged: Judged,
    climbing: &impl Fn(&rank::Victim) -> Option<bool>,
) -> String {
    let mut parts: Vec<(u64, String)> = carried
        .pods
        .iter()
        .map(|(uid, bytes)| {
            let who = if let Some(v) = ranking.candidates.iter().find(|v| &v.uid == uid) {
                let not_climbing = climbing(v) == Some(false);
                if not_climbing && starting_up(v) {
                    format!(
                        "{}/{}, which holds {}, no more than a job's start-up",
                        v.namespace,
                        v.name,
                        rank::fmt_bytes(v.use_bytes)
                    )
                } else if not_climbing && judged == Judged::LastSpan {
                    format!(
                        "{}/{}, which did not rise over the last {} ms from what it held then",
                        v.namespace,
                        v.name,
                        SPAN.as_millis()
                    )
                } else if not_climbing {
                    format!(
                        "{}/{}, which stepped up and holds: it did not rise over each of the last two {} ms spans",
                        v.namespace,
                        v.name,
                        SPAN.as_millis()
                    )
                } else if v.request_bytes > 0 && *bytes > v.above_request() {
                    format!(
                        "{}/{}, within its request of {} MiB",
                        v.namespace,
                        v.name,
                        v.request_bytes >> 20
                    )
                } else {
                    format!("{}/{}", v.namespace, v.name)
                }
            } else if let Some(e) = ranking.excluded.iter().find(|e| &e.uid == uid) {
                format!("{}/{}, {}", e.namespace, e.name, e.exclusion)
            } else {
                format!("pod {uid}")
            };
            (*bytes, who)
        })
        .collect();
    if carried.outside > 0 {
        parts.push((carried.outside, "processes outside any pod".into()));
    }
    if carried.unlisted > 0 {
        parts.push((carried.unlisted, "memory no listed process shows".into()));
    }
    parts.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    parts
        .iter()
        .map(|(bytes, who)| format!("{} by {who}", rank::fmt_bytes(*bytes)))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Guard {
    /// What the full poll says of the rise the early trigger saw on GPU `index` over the
    /// early window: who carries it (`PodGrowth::carried_since`: pods and processes outside
    /// any pod above their high-water marks, or the GPU above its own peak), or that too
    /// little of it is carried yet to act on: less than [`EARLY_CARRIED`].
    ///
    /// Why: two unrelated steps inside the early window — a job's CUDA start-up (0.8 GiB)
    /// just as a neighbour's 2 GiB workspace comes back to its height — pass the envelope's
    /// rule as a climb of 60–95 GiB/s; on the H100 at an A10G's headroom that took a job
    /// that had only started in 3 of 135 runs (issue 38, docs/validation.md §9f). A real
    /// climb carries more of the rise at each full poll, so the trigger only waits for the
    /// next one (it asks for it on the next fast reading). Memory NVML cannot tell for a
    /// process is memory no listed process shows: nobody's.
    pub(super) fn early_carry(&self, index: u32, now: Duration) -> EarlyCarry {
        let Some((climb, readings)) = self
            .gpus
            .get(&index)
            .and_then(|st| Some((st.trend.early_climb(now)?, &st.trend)))
        else {
            return EarlyCarry::Unjudged;
        };
        // Who carries a climb the short window shows is judged over the long one too: the
        // larger rise, and what climbed since the last full poll before the long window.
        let long_rise = readings.early_window_rise(now).unwrap_or(0);
        let rise = climb.rise.max(long_rise);
        let over = format!("over {} ms", trend::EARLY_WINDOW.as_millis());
        let since = now.saturating_sub(trend::EARLY_WINDOW);
        match self.seen.growth.carried_since(index, since) {
            None => EarlyCarry::NotYet(format!(
                "a climb of {} {over}: waiting for a second full poll to tell who carries it",
                rank::fmt_bytes(rise),
            )),
            Some(c) if (c.total as f64) < EARLY_CARRIED * rise as f64 => {
                EarlyCarry::NotYet(format!(
                    "a climb of {} {over}, of which what climbed above its marks carries {}: waiting for the next full poll",
                    rank::fmt_bytes(rise),
                    rank::fmt_bytes(c.total)
                ))
            }
            Some(carried) => EarlyCarry::Carried {
                rise,
                carried,
                over,
                judged: if climb.window < trend::EARLY_WINDOW {
                    Judged::TwoSpansStrict
                } else {
                    Judged::TwoSpans
                },
            },
        }
    }

    /// Notes why an early trigger on GPU `index` was not acted on: in `inactive_reason` for
    /// this step, and kept in `/state` until the next one (a climb that stopped leaves no
    /// trigger to show it otherwise).
    pub(super) fn hold_back(&mut self, index: u32, why: String, now: Duration) {
        if let Some(st) = self.gpus.get_mut(&index) {
            st.early_held_back = Some(HeldBack {
                at: now,
                reason: why.clone(),
            });
            st.inactive_reason = Some(why);
        }
    }
}
