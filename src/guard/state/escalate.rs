//! When a cooldown gives way to a new decision: the GPU kept filling after the victims
//! were dealt with, so the growth is someone else's.
//!
//! Why: a cooldown holds the GPU back until the victims' processes are gone, and under a
//! real kubelet that is `max(grace, 2 s)` after the eviction (5 s with the default grace).
//! A second pod growing meanwhile — two greedy jobs, or a first decision that took the
//! wrong pod — would fill the GPU behind the cooldown. The victims' own memory is read per
//! process, so whatever they still hold (stopped, or still growing under evict-only) is
//! told apart from the others' growth, and a victim still growing never escalates; nor does
//! growth no eviction could stop (an exempt pod, a protected one, a host process).

use crate::guard::decision::Decision;
use crate::guard::levels::Levels;
use crate::guard::rank::Ranking;
use std::time::Duration;

/// Shortest time between full polls asked for only to see whether a cooldown should give
/// way. A fast tick under pressure comes every few ms; a full poll costs a few ms of NVML.
pub const ESCALATION_POLL: Duration = Duration::from_millis(200);

/// Bytes by which the pods that may be evicted now, other than `decision`'s victims (those
/// with a pid in `victim_pids`), grew since `decision`: per pod, its use in `now` (a ranking
/// of the current full poll) above its use then (0 if it had none on the GPU), summed.
///
/// Only growth an eviction can stop counts: a pod exempt from eviction, a protected one
/// or a host process may fill the GPU too, but evicting more CI pods would not stop it —
/// the first decision already took what reclaim needed, and the cooldown's rule stands.
pub fn others_growth(decision: &Decision, victim_pids: &[u32], now: &Ranking) -> u64 {
    let victims: Vec<&str> = decision
        .candidates
        .iter()
        .filter(|v| v.pids.iter().any(|p| victim_pids.contains(p)))
        .map(|v| v.uid.as_str())
        .collect();
    let then = |uid: &str| {
        decision
            .candidates
            .iter()
            .find(|v| v.uid == uid)
            .map(|v| v.use_bytes)
            .or_else(|| {
                decision
                    .excluded
                    .iter()
                    .find(|e| e.uid == uid)
                    .map(|e| e.use_bytes)
            })
            .unwrap_or(0)
    };
    now.candidates
        .iter()
        .filter(|v| !victims.contains(&v.uid.as_str()))
        .map(|v| v.use_bytes.saturating_sub(then(&v.uid)))
        .fold(0, u64::saturating_add)
}

/// How much the others must have grown before a cooldown gives way: the width of the soft
/// band (soft − hard), at least 1 MiB. Less would let a protected pod's workspace step,
/// caught by one poll, end a cooldown; the band is what the guard already treats as the
/// room it needs to act in.
pub fn escalation_margin(levels: &Levels) -> u64 {
    levels
        .soft
        .saturating_sub(levels.hard)
        .max(crate::model::snapshot::MIB)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::decision::Trigger;
    use crate::guard::levels::Pressure;
    use crate::guard::policy::{Mode, Policy};
    use crate::guard::rank::rank;
    use crate::model::snapshot::ProcessSample;
    use crate::model::snapshot::MIB;
    use crate::testkit::fixtures::*;
    use std::collections::HashMap;

    fn ranked(procs: &[ProcessSample]) -> Ranking {
        let pods = pods([
            pod("victim"),
            pod("other"),
            pod("new"),
            pod("exempt").annotation("gpu-warden.io/evict", "never"),
        ]);
        rank(&Policy::default(), 0, procs, &pods, &HashMap::new())
    }

    fn decision(procs: &[ProcessSample]) -> Decision {
        let r = ranked(procs);
        Decision {
            id: 1,
            gpu: 0,
            uuid: "GPU-0".into(),
            at: Duration::ZERO,
            mode: Mode::Enforce,
            trigger: Trigger::Hard,
            pressure: Pressure::Hard,
            total: 10_000 * MIB,
            used: 5000 * MIB,
            free: 5000 * MIB,
            levels: levels(),
            time_to_full: None,
            reclaim_target_bytes: MIB,
            candidates: r.candidates,
            planned: 1,
            max_evictions: 1,
            rate_limited: false,
            excluded: r.excluded,
            other_bytes: r.other_bytes,
            escalated: None,
        }
    }

    #[test]
    fn only_the_growth_an_eviction_could_stop_counts() {
        let d = decision(&[
            proc_in("victim", 0, 3000),
            proc_in("other", 0, 1000),
            proc_in("exempt", 0, 500),
        ]);
        let victim = vec![pid_of("victim")];
        let growth = |now: &[ProcessSample]| others_growth(&d, &victim, &ranked(now));
        // The victim stopped, another CI pod grew by 2000 MiB.
        let now = [proc_in("victim", 0, 3000), proc_in("other", 0, 3000)];
        assert_eq!(growth(&now), 2000 * MIB);
        // The victim still growing (evict only): its growth is not the others'.
        let now = [proc_in("victim", 0, 6000), proc_in("other", 0, 1000)];
        assert_eq!(growth(&now), 0);
        // A pod new on the GPU grew from nothing.
        let now = [proc_in("victim", 0, 3000), proc_in("new", 0, 800)];
        assert_eq!(growth(&now), 800 * MIB);
        // An exempt pod and a host process grew: no eviction would stop that.
        let now = [
            proc_in("victim", 0, 3000),
            proc_in("other", 0, 1000),
            proc_in("exempt", 0, 5000),
            host_proc(7, 0, 2500),
        ];
        assert_eq!(growth(&now), 0);
        // A pod that shrank does not offset one that grew.
        let now = [
            proc_in("victim", 0, 3000),
            proc_in("other", 0, 100),
            proc_in("new", 0, 800),
        ];
        assert_eq!(growth(&now), 800 * MIB);
    }

    fn levels() -> Levels {
        Levels {
            hard: 500 * MIB,
            soft: 1000 * MIB,
            target: 1200 * MIB,
        }
    }

    #[test]
    fn the_margin_is_the_soft_band() {
        let l = levels();
        assert_eq!(escalation_margin(&l), 500 * MIB);
        let no_band = Levels {
            hard: 500 * MIB,
            soft: 500 * MIB,
            target: 700 * MIB,
        };
        assert_eq!(escalation_margin(&no_band), MIB);
    }
}
