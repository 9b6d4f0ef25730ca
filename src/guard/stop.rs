//! Stop at decision, the pure part (docs/guard.md, "Stopping the growth at decision"): which
//! of a victim's processes may be signalled at this moment, and what becomes of the stopped
//! ones after the eviction's outcome. The signals themselves are sent by `act::signal`,
//! through `act::stop`.
//!
//! An eviction reaches the victim's processes only when the kubelet kills them —
//! `max(grace, 2 s)` later, a SIGTERM to PID 1 only in between, which a GitLab job's shell
//! ignores — so a job growing at GiB/s keeps growing after the guard decided. Stopping its
//! GPU processes (SIGSTOP) when the guard decides stops the growth at once. Once the API
//! server accepted the eviction they are killed (SIGKILL): the pod is going, a stopped
//! process can do nothing with the grace period, and its memory is what the neighbours
//! need — the kubelet's own SIGKILL would give it back `max(grace, 2 s)` later, and on the
//! H200 a second greedy job took an A10G's headroom in that time (docs/validation.md §9e).
//! A stop is undone (SIGCONT) whenever the eviction does not happen.

use super::decision::EvictionOutcome;
pub use super::policy::OnDecision;
use crate::model::proc_stat::ProcError;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// `/proc/<pid>/stat` counts a process's start time in clock ticks since boot; Linux fixes
/// the unit at `USER_HZ` = 100 for every architecture it exports it on.
pub const TICKS_PER_SECOND: u64 = 100;

/// What `/proc` says of a pid at this moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Start time, clock ticks since boot.
    pub start_ticks: u64,
    /// The pod UID its cgroup names; `None` outside every pod (a host process).
    pub pod_uid: Option<String>,
}

/// Why a pid is not signalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No such process now (it exited), or its entry cannot be read.
    Gone(ProcError),
    /// Not in any pod's cgroup: a host process.
    HostProcess,
    /// In another pod's cgroup: it left the victim's, or the pid now belongs to another pod
    /// (a re-created pod of the same name has another UID).
    OtherPod(String),
    /// Started after the decision: the pid was reused since.
    Reused {
        /// Its start time, ticks since boot.
        start_ticks: u64,
        /// The decision's time, ticks since boot.
        decided_ticks: u64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Gone(why) => write!(f, "gone ({why})"),
            Refusal::HostProcess => f.write_str("a host process, in no pod's cgroup"),
            Refusal::OtherPod(uid) => write!(f, "in another pod's cgroup ({uid})"),
            Refusal::Reused {
                start_ticks,
                decided_ticks,
            } => write!(
                f,
                "started after the decision (tick {start_ticks} > {decided_ticks}): a reused pid"
            ),
        }
    }
}

/// Whether the process `seen` now holds a pid the decision listed for the victim `uid` may
/// be signalled: it must be in that pod's cgroup and have started before the decision
/// (`decided_ticks`). Returns its start time, which identifies it from then on.
pub fn check(uid: &str, decided_ticks: u64, seen: Result<Seen, ProcError>) -> Result<u64, Refusal> {
    let seen = seen.map_err(Refusal::Gone)?;
    match seen.pod_uid.as_deref() {
        None => return Err(Refusal::HostProcess),
        Some(u) if u != uid => return Err(Refusal::OtherPod(u.to_string())),
        Some(_) => {}
    }
    if seen.start_ticks > decided_ticks {
        return Err(Refusal::Reused {
            start_ticks: seen.start_ticks,
            decided_ticks,
        });
    }
    Ok(seen.start_ticks)
}

/// The decision's time in ticks since boot, from the boot clock now and how long ago (on
/// the agent's own clock) the decision was taken. One tick is subtracted: a start time is
/// rounded down to a tick, and a pid reused within the decision's own tick must not pass.
pub fn decided_ticks(boot_now: Duration, since_decision: Duration) -> u64 {
    let at = boot_now.saturating_sub(since_decision);
    (at.as_millis() as u64 * TICKS_PER_SECOND / 1000).saturating_sub(1)
}

/// A process the guard stopped: its pid and start time (the two together name it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Held {
    pub pid: u32,
    pub start_ticks: u64,
}

/// What to do with a pod's stopped processes after an outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The eviction did not happen: SIGCONT them, saying why.
    Resume(String),
    /// It may still happen (in doubt): keep them stopped until the doubt resolves.
    Keep,
    /// It happened (the API server accepted it): SIGKILL them now.
    Kill,
    /// The pod is gone anyway (already gone, or its UID lost): nothing the guard asked for
    /// ends them, the kubelet's reconciliation does; forget them.
    Forget,
}

/// What an outcome means for the pod's stopped processes.
pub fn after(outcome: &EvictionOutcome) -> Next {
    match outcome {
        EvictionOutcome::Evicted => Next::Kill,
        EvictionOutcome::AlreadyGone | EvictionOutcome::Lost(_) => Next::Forget,
        EvictionOutcome::InDoubt(_) => Next::Keep,
        EvictionOutcome::Blocked(_) => {
            Next::Resume("eviction refused by a PodDisruptionBudget".into())
        }
        EvictionOutcome::Throttled { .. } => {
            Next::Resume("the API server is busy (429); the eviction will be retried".into())
        }
        EvictionOutcome::Forbidden(_) => {
            Next::Resume("the agent may not evict (403); nothing evicted".into())
        }
        EvictionOutcome::Failed(d) => Next::Resume(format!("eviction not carried out: {d}")),
        EvictionOutcome::Skipped(d) => Next::Resume(format!("not evicted, the pod changed: {d}")),
        EvictionOutcome::Aborted(d) => Next::Resume(format!("not evicted: {d}")),
    }
}

/// The processes stopped and not yet resumed or forgotten, by pod UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopBook {
    pods: BTreeMap<String, Stopped>,
}

/// One pod's stopped processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stopped {
    /// `namespace/name`, for logs and /state.
    pub pod: String,
    /// The decision that stopped them.
    pub decision_id: u64,
    /// The processes.
    pub procs: Vec<Held>,
    /// When (the agent's monotonic clock).
    #[serde(serialize_with = "super::decision::ser_secs")]
    pub since: Duration,
}

impl StopBook {
    /// Records `procs` of pod `uid` as stopped (added to any already held for it).
    pub fn hold(&mut self, uid: &str, pod: &str, decision_id: u64, procs: &[Held], now: Duration) {
        if procs.is_empty() {
            return;
        }
        let entry = self.pods.entry(uid.to_string()).or_insert_with(|| Stopped {
            pod: pod.to_string(),
            decision_id,
            procs: Vec::new(),
            since: now,
        });
        for p in procs {
            if !entry.procs.contains(p) {
                entry.procs.push(*p);
            }
        }
    }

    /// Applies `next` to pod `uid`: the processes to signal now as `next` says (SIGCONT
    /// for `Resume`, SIGKILL for `Kill`; none otherwise), each returned once.
    pub fn settle(&mut self, uid: &str, next: &Next) -> Option<Stopped> {
        match next {
            Next::Keep => None,
            Next::Forget => {
                self.pods.remove(uid);
                None
            }
            Next::Resume(_) | Next::Kill => self.pods.remove(uid),
        }
    }

    /// Everything still held (to resume at shutdown), emptying the book.
    pub fn take_all(&mut self) -> Vec<(String, Stopped)> {
        std::mem::take(&mut self.pods).into_iter().collect()
    }

    /// What is held, for /state.
    pub fn held(&self) -> Vec<(&str, &Stopped)> {
        self.pods.iter().map(|(u, s)| (u.as_str(), s)).collect()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(start: u64, uid: Option<&str>) -> Result<Seen, ProcError> {
        Ok(Seen {
            start_ticks: start,
            pod_uid: uid.map(str::to_string),
        })
    }

    /// The agent never signals a pid outside the victim's cgroup, nor one that is not the
    /// process the decision saw.
    #[test]
    fn only_the_victims_own_processes_from_before_the_decision_are_signalled() {
        let victim = "3f1c-victim";
        let decided = 50_000;
        type Row = (&'static str, Result<Seen, ProcError>, Result<u64, Refusal>);
        let rows: Vec<Row> = vec![
            (
                "the victim's process",
                seen(40_000, Some(victim)),
                Ok(40_000),
            ),
            (
                "started in the decision's tick",
                seen(50_000, Some(victim)),
                Ok(50_000),
            ),
            (
                "pid reused since the decision, same pod",
                seen(50_001, Some(victim)),
                Err(Refusal::Reused {
                    start_ticks: 50_001,
                    decided_ticks: 50_000,
                }),
            ),
            (
                "pid reused by a host process",
                seen(50_020, None),
                Err(Refusal::HostProcess),
            ),
            ("a host process", seen(10, None), Err(Refusal::HostProcess)),
            (
                "left the victim's cgroup for another pod's",
                seen(40_000, Some("9a9a-other")),
                Err(Refusal::OtherPod("9a9a-other".into())),
            ),
            (
                "a re-created pod of the same name (new UID)",
                seen(50_500, Some("77aa-recreated")),
                Err(Refusal::OtherPod("77aa-recreated".into())),
            ),
            (
                "a protected pod's process (the ranking excludes it)",
                seen(1_000, Some("trainer-uid")),
                Err(Refusal::OtherPod("trainer-uid".into())),
            ),
            (
                "exited",
                Err(ProcError::Missing(7)),
                Err(Refusal::Gone(ProcError::Missing(7))),
            ),
        ];
        for (name, s, want) in rows {
            assert_eq!(check(victim, decided, s), want, "{name}");
        }
    }

    #[test]
    fn the_decision_time_in_ticks_is_rounded_down_and_one_tick_early() {
        // Booted 1000 s ago, decided 250 ms ago: 999.75 s → tick 99975, minus one.
        let t = decided_ticks(Duration::from_secs(1000), Duration::from_millis(250));
        assert_eq!(t, 99_974);
        assert_eq!(decided_ticks(Duration::ZERO, Duration::from_secs(5)), 0);
    }

    #[test]
    fn outcomes_resume_keep_or_forget() {
        let throttled = EvictionOutcome::Throttled {
            detail: "429".into(),
            retry_after_ms: 1000,
        };
        let rows: Vec<(EvictionOutcome, &str)> = vec![
            (EvictionOutcome::Evicted, "kill"),
            (EvictionOutcome::AlreadyGone, "forget"),
            (EvictionOutcome::Lost("new UID".into()), "forget"),
            (EvictionOutcome::InDoubt("no answer".into()), "keep"),
            (EvictionOutcome::Blocked("429 PDB".into()), "resume"),
            (throttled, "resume"),
            (EvictionOutcome::Forbidden("403".into()), "resume"),
            (EvictionOutcome::Failed("400".into()), "resume"),
            (
                EvictionOutcome::Skipped("now evict: never".into()),
                "resume",
            ),
            (EvictionOutcome::Aborted("no answer".into()), "resume"),
        ];
        for (o, want) in rows {
            let got = match after(&o) {
                Next::Resume(_) => "resume",
                Next::Keep => "keep",
                Next::Kill => "kill",
                Next::Forget => "forget",
            };
            assert_eq!(got, want, "{o:?}");
            // Every outcome that resumes is one that says the eviction did not happen.
            assert_eq!(got == "resume", o.not_carried_out(), "{o:?}");
        }
        assert_eq!(
            after(&EvictionOutcome::Blocked("x".into())),
            Next::Resume("eviction refused by a PodDisruptionBudget".into())
        );
    }

    #[test]
    fn the_book_resumes_or_kills_each_process_once() {
        let mut b = StopBook::default();
        let p = |pid| Held {
            pid,
            start_ticks: 7,
        };
        b.hold("u1", "ci/a", 1, &[p(10), p(11)], Duration::ZERO);
        b.hold("u1", "ci/a", 1, &[p(11)], Duration::ZERO);
        b.hold("u2", "ci/b", 1, &[p(20)], Duration::ZERO);
        b.hold("u3", "ci/c", 1, &[], Duration::ZERO);
        assert_eq!(b.held().len(), 2, "nothing stopped, nothing held");
        assert_eq!(b.settle("u2", &Next::Keep), None);
        let s = b.settle("u1", &Next::Resume("refused".into())).unwrap();
        assert_eq!(s.procs, vec![p(10), p(11)]);
        assert_eq!(b.settle("u1", &Next::Resume("again".into())), None);
        assert_eq!(b.settle("u1", &Next::Kill), None);
        assert_eq!(b.settle("u2", &Next::Forget), None);
        assert!(b.is_empty());
        b.hold("u5", "ci/e", 2, &[p(50)], Duration::ZERO);
        assert_eq!(
            b.settle("u5", &Next::Kill).map(|s| s.procs),
            Some(vec![p(50)])
        );
        assert_eq!(b.settle("u5", &Next::Kill), None, "killed once");
        b.hold("u4", "ci/d", 2, &[p(40)], Duration::ZERO);
        let all = b.take_all();
        assert_eq!(all.len(), 1);
        assert!(b.is_empty());
    }
}
