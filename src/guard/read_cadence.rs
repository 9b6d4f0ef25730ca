//! How often the fast watch reads memory: the interval follows the risk.
//!
//! A memory-only read costs about 8 µs on an idle H200 and about 134 µs on one crowded
//! with 64 processes, so reading every few milliseconds all the time would cost more than
//! the rest of the agent; reading every 100 ms lets growth of 250 GiB/s cross the whole
//! soft band between two reads. The rule, per GPU, the node taking the shortest:
//! - below soft: `fastIntervalMin`;
//! - otherwise a quarter ([`READS_TO_HARD`]) of the time growth at `watchRate` would take to
//!   reach `hard` — or, when the last reading rose faster than allocator noise, a sixteenth
//!   ([`READS_TO_HARD_GROWING`]) of the time growth at that rate would take, if shorter —
//!   rounded down to a √2 ladder below `fastInterval`, within
//!   `fastIntervalMin..=fastInterval`.
//!
//! `watchRate` unset is twice the GPU's memory per second and at least
//! [`WATCH_RATE_FLOOR`](super::policy::WATCH_RATE_FLOOR), so an idle H200 is read every
//! `fastInterval`, as before, and a busy GPU more often the nearer it is to `hard`: an H200
//! with 32 GiB free every 22.6 ms, an A10G with 8.4 GiB free every 5.7 ms. Growth seen
//! shortens it at once in proportion to how soon it would reach hard: a job growing
//! 250 GiB/s there is read every 5 ms from its first step, while a training step's
//! workspace, allocated and freed many times a second on a GPU far from hard, barely
//! changes it.

use super::levels::{Levels, Pressure};
use super::policy::Policy;
use crate::model::snapshot::MemoryInfo;
use std::time::Duration;

/// Reads the watch wants between now and growth at `watchRate` reaching `hard`.
pub const READS_TO_HARD: u32 = 4;
/// Reads the watch wants between now and growth seen reaching `hard`: enough for the early
/// trigger's window (docs/guard.md, "Acting before soft") to fill in a quarter of the time.
pub const READS_TO_HARD_GROWING: u32 = 16;
/// A rise faster than this between two readings is growth seen, not allocator noise
/// (64 MiB in 100 ms).
pub const GROWTH_SEEN: f64 = 640.0 * 1024.0 * 1024.0;

/// The interval for one GPU at `memory` against `levels`, at `pressure`; `rising` is how
/// fast memory in use rose into the last reading, in bytes per second.
pub fn gpu_interval(
    policy: &Policy,
    memory: &MemoryInfo,
    levels: &Levels,
    pressure: Pressure,
    rising: f64,
) -> Duration {
    if pressure != Pressure::None {
        return policy.fast_interval_min;
    }
    let to_hard = memory.free.saturating_sub(levels.hard) as f64;
    let sized = policy.watch_rate_for(memory.total).max(1) as f64;
    let mut secs = to_hard / sized / f64::from(READS_TO_HARD);
    if rising > GROWTH_SEEN {
        secs = secs.min(to_hard / rising / f64::from(READS_TO_HARD_GROWING));
    }
    let interval = Duration::try_from_secs_f64(secs).unwrap_or(policy.fast_interval);
    if interval >= policy.fast_interval {
        return policy.fast_interval;
    }
    quantize(interval).max(policy.fast_interval_min)
}

/// Rounds down to a step of a √2 ladder from 1 ms (the caller clamps afterwards), so the
/// interval the sampler is told changes a few times per episode rather than on every
/// reading.
fn quantize(d: Duration) -> Duration {
    const LADDER_US: [u64; 21] = [
        1_000, 1_414, 2_000, 2_828, 4_000, 5_657, 8_000, 11_314, 16_000, 22_627, 32_000, 45_255,
        64_000, 90_510, 128_000, 181_019, 256_000, 362_039, 512_000, 724_077, 1_024_000,
    ];
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    match LADDER_US.iter().rev().find(|&&r| r <= us) {
        Some(&r) if us < 1_024_000 => Duration::from_micros(r),
        _ => d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::policy::WATCH_RATE_FLOOR;
    use crate::model::snapshot::MIB;

    const GIB: u64 = 1024 * MIB;

    fn gpu(total_gib: u64, free_gib: u64) -> (MemoryInfo, Levels) {
        let total = total_gib * GIB;
        let m = MemoryInfo {
            total,
            used: total - free_gib * GIB,
            free: free_gib * GIB,
            reserved: 0,
        };
        (m, Levels::resolve(&Policy::default(), total).unwrap())
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn the_interval_follows_the_runway_to_hard() {
        let p = Policy::default();
        // (total GiB, free GiB, pressure, rising MiB/s, expected interval range in ms)
        type Row = (u64, u64, Pressure, u64, (u64, u64));
        let rows: &[Row] = &[
            // An idle H200: calm, as slow as the fast watch always was.
            (141, 140, Pressure::None, 0, (100, 100)),
            // An idle H100 and an idle A10G are read for the floor, 256 GiB/s: 71 and
            // 21.8 GiB to hard, a quarter of that rounded down.
            (80, 75, Pressure::None, 0, (64, 64)),
            (24, 23, Pressure::None, 0, (16, 16)),
            // A busy but calm H200 with 32 GiB free: 25 GiB to hard at 282 GiB/s is 89 ms;
            // a quarter of that, rounded down.
            (141, 32, Pressure::None, 0, (16, 23)),
            (141, 20, Pressure::None, 0, (8, 12)),
            // A busy A10G at issue 38's headroom: 7.2 GiB to hard, 7 ms, every 5.7.
            (24, 8, Pressure::None, 0, (5, 6)),
            // Noise is not growth.
            (141, 32, Pressure::None, 600, (16, 23)),
            // 250 GiB/s seen with 32 GiB free: hard 100 ms away, read every 5 ms.
            (141, 32, Pressure::None, 250 * 1024, (5, 6)),
            // A 2 GiB workspace allocated within one 22 ms read (93 GiB/s) far from hard:
            // 270 ms to hard at that rate, a sixteenth of it is no shorter than calm.
            (141, 32, Pressure::None, 93 * 1024, (16, 23)),
            // The same nearer hard shortens the interval (calm there: 11.3 ms).
            (141, 20, Pressure::None, 93 * 1024, (8, 9)),
            // Under pressure, always the minimum.
            (141, 13, Pressure::Soft, 0, (5, 5)),
            (141, 3, Pressure::Hard, 0, (5, 5)),
        ];
        for &(total, free, pressure, rising, (lo, hi)) in rows {
            let (m, l) = gpu(total, free);
            let got = gpu_interval(&p, &m, &l, pressure, (rising * MIB) as f64);
            assert!(
                got >= ms(lo) && got <= ms(hi),
                "{free} of {total} GiB free, {pressure:?}, rising {rising} MiB/s: {got:?} not in {lo}..={hi} ms"
            );
        }
    }

    #[test]
    fn the_bounds_and_the_rate_come_from_the_policy() {
        let p = Policy::from_yaml_str("fastInterval: 40ms\nfastIntervalMin: 10ms").unwrap();
        let (m, l) = gpu(141, 140);
        assert_eq!(gpu_interval(&p, &m, &l, Pressure::None, 0.0), ms(40));
        let (m, l) = gpu(24, 2);
        assert_eq!(gpu_interval(&p, &m, &l, Pressure::None, 0.0), ms(10));
        assert_eq!(gpu_interval(&p, &m, &l, Pressure::Hard, 0.0), ms(10));
        // A slower sized-for rate reads less often.
        let slow = Policy::from_yaml_str("watchRate: 16Gi").unwrap();
        let (m, l) = gpu(141, 32);
        assert_eq!(gpu_interval(&slow, &m, &l, Pressure::None, 0.0), ms(100));
        // A rate set, even below the floor, is the rate: 200 % of an A10G (48 GiB/s) reads
        // an idle one every `fastInterval` and a busy one at 8 GiB free every 32 ms.
        let own = Policy::from_yaml_str("watchRate: 200%").unwrap();
        let (m, l) = gpu(24, 23);
        assert_eq!(gpu_interval(&own, &m, &l, Pressure::None, 0.0), ms(100));
        let (m, l) = gpu(24, 8);
        assert_eq!(gpu_interval(&own, &m, &l, Pressure::None, 0.0), ms(32));
    }

    #[test]
    fn unset_the_rate_is_twice_the_memory_and_at_least_the_floor() {
        let p = Policy::default();
        assert_eq!(p.watch_rate_for(24 * GIB), WATCH_RATE_FLOOR);
        assert_eq!(p.watch_rate_for(80 * GIB), WATCH_RATE_FLOOR);
        assert_eq!(p.watch_rate_for(141 * GIB), 282 * GIB);
        let set = Policy::from_yaml_str("watchRate: 16Gi").unwrap();
        assert_eq!(set.watch_rate_for(141 * GIB), 16 * GIB);
    }

    #[test]
    fn quantize_rounds_down_to_the_ladder() {
        assert_eq!(quantize(ms(100)), Duration::from_micros(90_510));
        assert_eq!(quantize(ms(5)), ms(4));
        assert_eq!(quantize(ms(24)), Duration::from_micros(22_627));
        assert_eq!(quantize(ms(16)), ms(16));
        assert_eq!(quantize(ms(2000)), ms(2000));
    }
}
