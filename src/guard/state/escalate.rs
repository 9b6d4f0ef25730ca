//! When a decision may be taken while memory is already on its way back: the victims of a
//! decision in cooldown (stopped, or evicted and waiting for the kubelet's SIGKILL) and pods
//! terminating for any other reason hold memory that the GPU gets back within a known time.
//!
//! Why: under a real kubelet a victim's memory returns only at its SIGKILL, `max(grace,
//! 2 s)` after the eviction, and meanwhile the GPU may dip below `hard` from a neighbour's
//! workspace or stay there because the stopped victim still holds what it took. Neither
//! is a reason to evict anyone else: on the H200 a training pod's 10 GiB workspace, freed at
//! the decision and allocated again 0.3 s later, read as growth of the soft band's size, and
//! the escalated plan, blind to the stopped victim's memory, took a steady CI job and the
//! trainer too (issue 38). A second grower, on the other hand — two greedy jobs, or a first
//! decision that took the wrong pod — fills the GPU behind the cooldown unless it gives way.
//!
//! The rule ([`judge`]): a decision is taken while memory is on its way back only when
//! 1. the pods that may be evicted, other than the pending victims, grew by more than a
//!    margin (the soft band while the GPU has room, less as it fills: [`escalation_margin`])
//!    above their **high-water mark** before — the most
//!    each used at any full poll of the `horizon` before the earlier decision (or, with only
//!    terminating pods pending, before the first half of the horizon) — and above their
//!    declared `vram-request-mib`: a workspace that comes and goes at the same height, and
//!    growth inside a pod's own declaration, are not growth;
//! 2. the GPU's memory in use rises in a sustained way (`Trend::sustained_growth_lasting`:
//!    the troughs of the readings climb, not only the peaks);
//! 3. at that rate the GPU would reach `hard` before the memory on its way back returns.
//!
//! Its plan takes only the pods that grew, and counts the memory on its way back.

use crate::guard::decision::Escalation;
use crate::guard::levels::Levels;
use crate::guard::rank::fmt_bytes;
use std::time::Duration;

/// Shortest time between full polls asked for only to see whether a cooldown should give
/// way. A fast tick under pressure comes every few ms; a full poll costs a few ms of NVML.
pub const ESCALATION_POLL: Duration = Duration::from_millis(200);

/// After the kubelet's SIGKILL, how long the driver takes to give a killed process's memory
/// back as NVML sees it, with the kubelet's own watch latency: the part of a victim's
/// deadline that is not its grace period (docs/guard.md, "While memory is on its way
/// back").
pub const RETURN_ALLOWANCE: Duration = Duration::from_secs(1);

/// How soon memory past its deadline is still expected: a kubelet that kills late (a
/// loaded node, a slow watch) is late by a moment, not for ever. The rule then asks only
/// whether the others' growth reaches `hard` within this.
pub const LATE_RETURN: Duration = Duration::from_secs(1);

/// Memory on its way back to the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Returning {
    /// Bytes the pending pods hold now.
    pub bytes: u64,
    /// Until the last of it is due back (never less than [`LATE_RETURN`]).
    pub due_in: Duration,
}

/// One pod's growth above its baseline (`max(high-water mark before, request)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grower {
    /// Pod UID.
    pub uid: String,
    /// `namespace/name`.
    pub pod: String,
    /// Bytes above its baseline now.
    pub grew_bytes: u64,
}

/// What the rule says.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Decide now, taking only these growers.
    Escalate(Escalation),
    /// Wait for the memory on its way back; the reason is shown in /state.
    Wait(String),
}

/// What [`judge`] weighs.
#[derive(Debug, Clone)]
pub struct Weighed<'a> {
    /// The decision cooling down, if any.
    pub after_decision: Option<u64>,
    /// The pods that may be evicted, other than the pending victims, that grew.
    pub growers: &'a [Grower],
    /// The memory on its way back.
    pub returning: Returning,
    /// Free memory now, bytes.
    pub free: u64,
    /// The GPU's thresholds.
    pub levels: Levels,
    /// `Trend::sustained_growth_lasting` now.
    pub sustained: Option<f64>,
    /// How fast the pending victims themselves still grow, bytes per second (0 when they
    /// were stopped at decision): under evict-only a victim grows until its SIGKILL, and
    /// that part of the GPU's growth is nobody else's.
    pub victims_rate: f64,
}

/// The rule of the module documentation.
pub fn judge(w: &Weighed) -> Verdict {
    let returning = format!(
        "{} held by victims or terminating pods is due back within {:.1} s",
        fmt_bytes(w.returning.bytes),
        w.returning.due_in.as_secs_f64()
    );
    let grew: u64 = w
        .growers
        .iter()
        .map(|g| g.grew_bytes)
        .fold(0, u64::saturating_add);
    let margin = escalation_margin(&w.levels, w.free);
    if grew <= margin {
        return Verdict::Wait(format!(
            "{returning}; the pods that may be evicted grew {} above their high-water marks and requests, not more than the margin ({})",
            fmt_bytes(grew),
            fmt_bytes(margin)
        ));
    }
    let Some(sustained) = w.sustained.filter(|r| *r >= 1.0) else {
        return Verdict::Wait(format!(
            "{returning}; the GPU's memory in use is not climbing in a sustained way (its troughs hold)"
        ));
    };
    let rate = sustained - w.victims_rate.max(0.0);
    if rate < 1.0 {
        return Verdict::Wait(format!(
            "{returning}; the GPU fills at {}/s, no faster than the victims themselves still grow",
            fmt_bytes(sustained as u64)
        ));
    }
    let to_hard = w.free.saturating_sub(w.levels.hard);
    let hard_in = Duration::try_from_secs_f64(to_hard as f64 / rate).unwrap_or(Duration::MAX);
    if hard_in >= w.returning.due_in {
        return Verdict::Wait(format!(
            "{returning}; at the sustained {}/s the GPU would reach hard in {:.1} s, after that",
            fmt_bytes(rate as u64),
            hard_in.as_secs_f64()
        ));
    }
    let mut growers: Vec<&Grower> = w.growers.iter().collect();
    growers.sort_by(|a, b| b.grew_bytes.cmp(&a.grew_bytes).then(a.pod.cmp(&b.pod)));
    Verdict::Escalate(Escalation {
        after_decision: w.after_decision,
        others_grew_bytes: grew,
        growers: growers
            .iter()
            .map(|g| format!("{} (+{})", g.pod, fmt_bytes(g.grew_bytes)))
            .collect(),
        growth_bytes_per_second: rate,
        hard_in,
        returning_bytes: w.returning.bytes,
        returning_in: w.returning.due_in,
    })
}

/// How much the others must have grown before a decision is taken while memory is on its
/// way back, with `free` bytes free now: the width of the soft band (soft − hard) while the
/// GPU has room, shrinking to half the room left above `hard` as it fills, never below
/// allocator noise ([`NOISE`]). With room, a step of a pod's memory smaller than the band —
/// a cache, a batch a little larger — evicts nobody; near `hard` any sustained growth is
/// what will run the neighbours out (an A10G's band is 1.2 GiB: a second grower past it
/// would have left a training step's workspace no room).
pub fn escalation_margin(levels: &Levels, free: u64) -> u64 {
    let band = levels.soft.saturating_sub(levels.hard);
    let room = free.saturating_sub(levels.hard) / 2;
    band.min(room).max(NOISE)
}

/// Growth smaller than this is allocator noise (the early trigger's envelope noise).
pub const NOISE: u64 = 64 << 20;

/// A pod's growth above its baseline: its use now above the larger of its high-water mark
/// before and its declared request (growth within a pod's own declaration never makes
/// another pod a victim).
pub fn above_baseline(use_bytes: u64, high_water: u64, request_bytes: u64) -> u64 {
    use_bytes.saturating_sub(high_water.max(request_bytes))
}

/// When memory due at `deadline` (monotonic) is due back, seen at `now`: never less than
/// [`LATE_RETURN`].
pub fn due_in(deadline: Duration, now: Duration) -> Duration {
    deadline.saturating_sub(now).max(LATE_RETURN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::MIB;

    const GIB: u64 = 1024 * MIB;

    fn levels() -> Levels {
        Levels {
            hard: 500 * MIB,
            soft: 1000 * MIB,
            target: 1200 * MIB,
        }
    }

    fn grower(name: &str, mib: u64) -> Grower {
        Grower {
            uid: name.into(),
            pod: format!("ci/{name}"),
            grew_bytes: mib * MIB,
        }
    }

    fn weigh(growers: &[Grower], free_mib: u64, rate_mib_s: Option<f64>, due_s: f64) -> Verdict {
        judge(&Weighed {
            after_decision: Some(1),
            growers,
            returning: Returning {
                bytes: 3 * GIB,
                due_in: Duration::from_secs_f64(due_s),
            },
            free: free_mib * MIB,
            levels: levels(),
            sustained: rate_mib_s.map(|r| r * MIB as f64),
            victims_rate: 0.0,
        })
    }

    #[test]
    fn a_decision_waits_for_memory_on_its_way_back_unless_growth_would_beat_it() {
        // (what, growers, free MiB, sustained MiB/s, due in s, escalates)
        type Row = (&'static str, Vec<Grower>, u64, Option<f64>, f64, bool);
        let rows: Vec<Row> = vec![
            (
                "a second grower that reaches hard before the victim's memory returns",
                vec![grower("g2", 800)],
                900,
                Some(2000.0),
                3.0,
                true,
            ),
            (
                "growth no larger than the soft band, with room",
                vec![grower("g2", 300), grower("g3", 200)],
                2500,
                Some(2000.0),
                3.0,
                false,
            ),
            (
                "two pods' growth summed past the band",
                vec![grower("g2", 300), grower("g3", 300)],
                2500,
                Some(2000.0),
                3.0,
                true,
            ),
            (
                "near hard, growth smaller than the band counts",
                vec![grower("g2", 150)],
                700,
                Some(2000.0),
                3.0,
                true,
            ),
            (
                "grown, but the GPU is not climbing now (a workspace's peak, a plateau)",
                vec![grower("g2", 800)],
                400,
                None,
                3.0,
                false,
            ),
            (
                "growth too slow to reach hard before the memory returns",
                vec![grower("g2", 800)],
                900,
                Some(100.0),
                3.0,
                false,
            ),
            (
                "below hard already and still climbing",
                vec![grower("g2", 800)],
                300,
                Some(100.0),
                3.0,
                true,
            ),
            ("nobody grew", vec![], 300, Some(5000.0), 3.0, false),
        ];
        for (what, growers, free, rate, due, want) in rows {
            let v = weigh(&growers, free, rate, due);
            assert_eq!(matches!(v, Verdict::Escalate(_)), want, "{what}: {v:?}");
        }
    }

    #[test]
    fn growth_that_is_the_victims_own_is_nobody_elses() {
        let w = |victims_mib_s: f64| {
            judge(&Weighed {
                after_decision: Some(1),
                growers: &[grower("train", 2000)],
                returning: Returning {
                    bytes: 3 * GIB,
                    due_in: Duration::from_secs(3),
                },
                free: 900 * MIB,
                levels: levels(),
                sustained: Some(2000.0 * MIB as f64),
                victims_rate: victims_mib_s * MIB as f64,
            })
        };
        assert!(
            matches!(w(2000.0), Verdict::Wait(_)),
            "evict only: the victim fills it"
        );
        assert!(matches!(w(0.0), Verdict::Escalate(_)));
    }

    #[test]
    fn an_escalation_names_its_growers_most_first_and_what_it_waited_for() {
        let Verdict::Escalate(e) = weigh(
            &[grower("small", 300), grower("big", 900)],
            900,
            Some(2000.0),
            3.0,
        ) else {
            panic!("escalates");
        };
        assert_eq!(e.growers, ["ci/big (+900 MiB)", "ci/small (+300 MiB)"]);
        assert_eq!(e.others_grew_bytes, 1200 * MIB);
        assert_eq!(e.hard_in, Duration::from_millis(200));
        let text = e.describe();
        assert!(
            text.contains("after decision 1, whose victims hold 3.0 GiB due back within 3.0 s"),
            "{text}"
        );
        assert!(text.contains("reaching hard in 0.2 s"), "{text}");
    }

    #[test]
    fn growth_counts_above_the_high_water_mark_and_the_request() {
        // A workspace back at the height it had before: nothing.
        assert_eq!(above_baseline(9 * GIB, 9 * GIB, 0), 0);
        // Growth inside the declaration: nothing.
        assert_eq!(above_baseline(7 * GIB, 2 * GIB, 8 * GIB), 0);
        // Past both: only the part past the larger.
        assert_eq!(above_baseline(10 * GIB, 2 * GIB, 8 * GIB), 2 * GIB);
        assert_eq!(above_baseline(10 * GIB, 9 * GIB, 0), GIB);
    }

    #[test]
    fn memory_past_its_deadline_is_still_expected_for_a_moment() {
        let s = Duration::from_secs;
        assert_eq!(due_in(s(10), s(4)), s(6));
        assert_eq!(due_in(s(10), s(10)), LATE_RETURN);
        assert_eq!(due_in(s(10), s(30)), LATE_RETURN);
    }

    #[test]
    fn the_margin_is_the_soft_band_while_there_is_room_and_shrinks_as_the_gpu_fills() {
        let l = levels();
        // (free MiB, margin MiB)
        for (free, want) in [
            (5000, 500),
            (1500, 500),
            (1300, 400),
            (700, 100),
            (500, 64),
            (0, 64),
        ] {
            assert_eq!(
                escalation_margin(&l, free * MIB),
                want * MIB,
                "free {free} MiB"
            );
        }
        let no_band = Levels {
            hard: 500 * MIB,
            soft: 500 * MIB,
            target: 700 * MIB,
        };
        assert_eq!(escalation_margin(&no_band, 5000 * MIB), NOISE);
    }
}
