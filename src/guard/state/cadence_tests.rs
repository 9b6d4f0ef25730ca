//! The guard driven as the agent drives it, on the clock of a real node: a regular full poll
//! every second, fast readings at the interval the guard asks for, and the full poll a fast
//! reading asks for arriving a fraction of a millisecond after it, the next reading one
//! interval after that poll. The unit tests of `state` feed readings on a fixed 5-ms grid at
//! the poll's own instant; these sweep the phases a real node has (where the climb starts
//! between polls, where a workspace is in its cycle), on an H100's 80 GB.
//!
//! Written after a review that built this simulator to find the cases the grid hid: a
//! ramped workspace back at its height taken early for a host process's climb, and an early
//! trigger that vanished at the full poll it had asked for.
#![cfg(test)]

use super::Guard;
use crate::guard::decision::{Decision, Trigger};
use crate::guard::policy::{Mode, Policy};
use crate::model::snapshot::MIB;
use crate::testkit::fixtures::*;
use std::sync::Arc;
use std::time::Duration;

/// One process: its pod (or a host process) and its MiB at `t` ms.
struct Load {
    uid: &'static str,
    priority: i32,
    host: bool,
    mib: Box<dyn Fn(f64) -> u64>,
}

fn load(uid: &'static str, priority: i32, mib: impl Fn(f64) -> u64 + 'static) -> Load {
    Load {
        uid,
        priority,
        host: false,
        mib: Box::new(mib),
    }
}

fn host(uid: &'static str, mib: impl Fn(f64) -> u64 + 'static) -> Load {
    Load {
        host: true,
        ..load(uid, 0, mib)
    }
}

/// What a run came to.
#[derive(Debug, Default)]
struct Outcome {
    /// The first decision: ms, trigger, planned victims, free MiB.
    first: Option<(f64, Trigger, Vec<String>, u64)>,
    /// When an allocation first failed (the GPU full), ms.
    oom_at: Option<f64>,
    /// Full polls a fast reading asked for.
    asked_polls: u32,
}

/// An H100's memory, MiB.
const H100: u64 = 81_559;
/// The asked-for full poll's delay after the reading that asked, µs.
const POLL_DELAY_US: u64 = 300;

/// A node's clock for the guard, in µs: a regular full poll every second, fast readings at
/// the interval the guard asks for, and the full poll a fast reading asks for
/// [`POLL_DELAY_US`] after it, the next reading one interval after that poll.
pub(super) struct NodeClock {
    /// Now, µs.
    pub(super) us: u64,
    next_regular: u64,
    next_fast: u64,
    /// Full polls a fast reading asked for.
    pub(super) asked_polls: u32,
}

impl NodeClock {
    pub(super) fn new() -> Self {
        NodeClock {
            us: 0,
            next_regular: 0,
            next_fast: 0,
            asked_polls: 0,
        }
    }

    /// What is due now on one GPU of `total` MiB with `used` MiB in use: a regular full poll,
    /// or a fast reading and the full poll it asks for; `full(g, at)` takes a full poll at
    /// `at` µs. The decisions those polls returned.
    pub(super) fn tick(
        &mut self,
        g: &mut Guard,
        total: u64,
        used: u64,
        mut full: impl FnMut(&mut Guard, u64) -> Vec<Decision>,
    ) -> Vec<Decision> {
        let interval = |g: &Guard| {
            g.watch_interval()
                .unwrap_or(Duration::from_millis(100))
                .as_micros() as u64
        };
        let mut decided = Vec::new();
        if self.us >= self.next_regular {
            decided = full(g, self.us);
            self.next_regular += 1_000_000;
            self.next_fast = self.us + interval(g);
        } else if self.us >= self.next_fast {
            let none = g.observe_memory(&[(0, mem(total, used))], Duration::from_micros(self.us));
            assert!(none.is_empty(), "a fast reading never decides");
            if g.take_refresh_request() {
                self.us += POLL_DELAY_US;
                self.asked_polls += 1;
                decided = full(g, self.us);
            }
            self.next_fast = self.us + interval(g);
        }
        decided
    }
}

/// Runs `loads` on one GPU of `total` MiB until the first decision or `until_ms`.
fn run(total: u64, loads: &[Load], until_ms: f64) -> Outcome {
    let mut g = Guard::new(Policy {
        mode: Mode::Enforce,
        ..Policy::default()
    });
    let pods = Arc::new(pods(
        loads
            .iter()
            .filter(|l| !l.host)
            .map(|l| pod(l.uid).priority(l.priority)),
    ));
    // What each process holds at `t` ms (memory it cannot get is a CUDA OOM), memory in
    // use, and whether any allocation failed.
    let state = |t: f64| {
        let mut left = total - 10;
        let mut procs = Vec::new();
        let mut oom = false;
        for l in loads {
            let want = (l.mib)(t);
            oom |= want > left;
            let got = want.min(left);
            left -= got;
            if got > 0 {
                procs.push(if l.host {
                    host_proc(pid_of(l.uid), 0, got)
                } else {
                    proc_in(l.uid, 0, got)
                });
            }
        }
        (procs, total - 10 - left, oom)
    };
    let full = |g: &mut Guard, us: u64| -> Vec<Decision> {
        let (procs, used, _) = state(us as f64 / 1000.0);
        g.note_view_proof(Some(Duration::from_micros(us)));
        let s = snap(vec![gpu(0, total, used)], procs);
        g.observe(&Arc::new(s), &pods, Duration::from_micros(us))
    };
    let mut out = Outcome::default();
    let mut clock = NodeClock::new();
    let until = (until_ms * 1000.0) as u64;
    while clock.us <= until && out.first.is_none() {
        let t = clock.us as f64 / 1000.0;
        let (_, used, oom) = state(t);
        if out.oom_at.is_none() && oom {
            out.oom_at = Some(t);
        }
        let decided = clock.tick(&mut g, total, used, full);
        out.asked_polls = clock.asked_polls;
        out.first = decided.first().map(|d| {
            let victims = d.planned_victims().iter().map(|v| v.uid.clone()).collect();
            (
                d.at.as_secs_f64() * 1000.0,
                d.trigger,
                victims,
                d.free / MIB,
            )
        });
        clock.us += 100;
    }
    out
}

/// From `start` ms, `first` MiB at once (a CUDA context), then `chunk` MiB every
/// `period` ms.
fn climber(start: f64, first: u64, chunk: u64, period: f64) -> impl Fn(f64) -> u64 {
    move |t| {
        if t < start {
            0
        } else {
            first + chunk * ((t - start) / period) as u64
        }
    }
}

/// `base` MiB and a workspace of `ws` MiB over it, allocated over `ramp` ms (0: at once) and
/// held to 150 ms of every 300 ms, from `phase` ms into the cycle.
fn workspace(base: u64, ws: u64, ramp: f64, phase: f64) -> impl Fn(f64) -> u64 {
    move |t| {
        let p = (t + phase).rem_euclid(300.0);
        base + if p < ramp {
            (ws as f64 * p / ramp) as u64 / 256 * 256
        } else if p < 150.0 {
            ws
        } else {
            0
        }
    }
}

/// A lowest-priority CI job starting between full polls (its CUDA context, 0.8 GiB, then a
/// climb in chunks), beside a trainer whose workspace comes and goes and two steady CI
/// jobs, on an H100 with about 38 GiB free, once the agent has polled for some seconds (the
/// pods' high-water marks known): whatever the phase, the rate and the chunk, the guard
/// takes the climber alone, before anybody's allocation fails.
#[test]
fn a_fast_climber_is_taken_alone_at_any_phase() {
    let mut wrong = Vec::new();
    for (gib_s, chunk) in [(64u64, 1024u64), (128, 1024), (128, 2048), (250, 2048)] {
        let period = chunk as f64 / (gib_s as f64 * 1024.0) * 1000.0;
        for ws in [0u64, 2048, 10240] {
            for i in 0..4 {
                let start = 6100.0 + f64::from(i) * 213.7;
                let phase = f64::from(i * 71 % 300);
                let loads = [
                    load("train", 1000, workspace(30_000, ws, 0.0, phase)),
                    load("steady3", 0, |_| 3000),
                    load("steady6", 0, |_| 6000),
                    load("x", 0, climber(start, 800, chunk, period)),
                ];
                let o = run(H100, &loads, 8500.0);
                let took = o.first.as_ref().map(|f| f.2.clone());
                let fine = took == Some(vec!["x".to_string()])
                    && o.oom_at
                        .is_none_or(|t| o.first.as_ref().is_some_and(|f| f.0 <= t));
                if !fine {
                    wrong.push((gib_s, chunk, ws, start, o.first, o.oom_at));
                }
            }
        }
    }
    assert_eq!(wrong, Vec::new());
}

/// A CI pod's 6 GiB workspace ramping back to its own height (over 40 ms, every 300 ms)
/// while a host process climbs 20 GiB at 128 GiB/s and stops with free above soft: the
/// workspace is no climb and the host process nobody's to take, whatever the phase. (The
/// review's sweep: taken in 25 of 48 phases when a pod that regrew below its mark got a
/// share of the GPU's rise above its peak; in 48 of 48 before the climbers-only rule.)
#[test]
fn a_workspace_ramping_back_beside_a_host_climb_is_not_taken() {
    let mut taken = Vec::new();
    for i in 0..12 {
        let start = 6100.0 + f64::from(i) * 23.7;
        let phase = f64::from(i * 37 % 300);
        let climb = climber(start, 0, 1024, 8.0);
        let loads = [
            load("big", 1000, |_| 40_000),
            load("w", 0, workspace(4000, 6144, 40.0, phase)),
            host("h", move |t| climb(t).min(20_480)),
        ];
        let o = run(H100, &loads, 7500.0);
        if o.first.is_some() {
            taken.push((start, phase, o.first));
        }
    }
    assert_eq!(taken, Vec::new());
}

/// A model loading at 2 and 10 GiB/s on an H200 that stays 35 GiB from hard: no early
/// decision is in reach, so the fast readings ask for no full polls (a review counted
/// 70–97 % of them turned into full polls when every 64 MiB gained asked for one).
#[test]
fn a_load_far_from_hard_asks_for_no_full_polls() {
    for gib_s in [2.0f64, 10.0] {
        let loads = [
            load("other", 0, |_| 40_000),
            load("loader", 1000, move |t| {
                (1000.0 + (t - 1000.0).max(0.0) * gib_s * 1.024).min(60_000.0) as u64
            }),
        ];
        let o = run(143_771, &loads, 1000.0 + 60_000.0 / (gib_s * 1.024) + 500.0);
        assert_eq!((o.first, o.asked_polls), (None, 0), "{gib_s} GiB/s");
    }
}

/// An early trigger seen on a fast reading must not vanish at the full poll it asks for:
/// that poll's own reading adds no point to the trend, and judged at the poll's instant
/// the 60-ms window slid past the reading at its start (a review: at a fixed 20-ms
/// cadence the guard then never decided before the GPU filled).
#[test]
fn the_early_trigger_survives_its_own_full_poll() {
    let total = 10_000;
    let mut g = Guard::new(Policy {
        mode: Mode::Enforce,
        ..Policy::default()
    });
    let pods = Arc::new(pods([pod("a"), pod("x")]));
    let poll = |g: &mut Guard, us: u64, used: u64| {
        g.note_view_proof(Some(Duration::from_micros(us)));
        let procs = vec![proc_in("a", 0, 1000), proc_in("x", 0, used - 1000)];
        let s = snap(vec![gpu(0, total, used)], procs);
        g.observe(&Arc::new(s), &pods, Duration::from_micros(us))
    };
    assert!(poll(&mut g, 0, 3000).is_empty());
    // 80 MiB/ms (78 GiB/s), read every 20 ms; each asked-for full poll 0.5 ms later.
    let used = |ms: u64| 3000 + 80 * (ms - 1000);
    let mut decided = Vec::new();
    for ms in (1000..=1100).step_by(20) {
        if used(ms) > total - 10 {
            break;
        }
        let none = g.observe_memory(&[(0, mem(total, used(ms)))], Duration::from_millis(ms));
        assert!(none.is_empty());
        if g.take_refresh_request() {
            let ds = poll(&mut g, ms * 1000 + 500, used(ms));
            decided.extend(ds.into_iter().map(|d| (ms, d.trigger, d.free / MIB)));
        }
    }
    assert!(
        decided
            .first()
            .is_some_and(|d| d.0 <= 1060 && d.1 == Trigger::EarlyTrend),
        "{decided:?}"
    );
}
