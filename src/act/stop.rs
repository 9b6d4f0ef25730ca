//! Stop at decision: the enforcer's hands on the victim's processes (docs/guard.md,
//! "Stopping the growth at decision"). Before a victim's eviction its GPU processes are
//! stopped (`onDecision: stop`, SIGSTOP, before the fresh read: it is undone if the read
//! disagrees) or killed (`kill`, SIGKILL, only after the fresh read agrees); after the
//! eviction's outcome they are resumed (SIGCONT) whenever the eviction did not happen, kept
//! stopped while it is in doubt, and killed (SIGKILL) once the API server accepted it
//! ([`crate::guard::stop::after`] says why). Every signal goes to a pid verified at that
//! moment to be in the victim pod's cgroup and to have started before the decision
//! ([`crate::guard::stop::check`]); a held process is signalled only while its pid still
//! names the process that started at the recorded time.
//!
//! The signals go through the [`ProcessSignals`] port (the real one is `act::signal`);
//! the bookkeeping is [`StopBook`].

use crate::guard::decision::{Decision, EvictionOutcome};
use crate::guard::notes::{EventDraft, EventType, Regarding};
use crate::guard::ports::{HeldStop, StopStatus};
use crate::guard::rank::Victim;
use crate::guard::stop::{self, Held, Next, OnDecision, Seen, StopBook};
use crate::model::clock::Clock;
use crate::model::proc_stat::ProcError;
use crate::publish::self_metrics::SelfMetrics;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A signal the guard sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Stop,
    Cont,
    Kill,
}

/// Why a signal was not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignalError {
    /// The process exited (or its entry cannot be read).
    #[error("gone: {0}")]
    Gone(String),
    /// The pid now names another process (its start time changed).
    #[error("pid reused (start time now {start_ticks})")]
    NotSame { start_ticks: u64 },
    /// The agent may not signal it (no CAP_KILL).
    #[error("denied: {0}")]
    Denied(String),
    /// Anything else the kernel said.
    #[error("{0}")]
    Other(String),
}

/// Why the agent may not signal at all: it then evicts only (logged once at start, shown
/// in `/state` as `notPermittedReason`).
#[derive(Debug, thiserror::Error)]
pub enum NotPermitted {
    /// The proc root is not this PID namespace's `/proc`, so the identities read there say
    /// nothing of the process a pid signal reaches.
    #[error("the proc root {} is not this PID namespace's /proc (stop at decision signals by pid; it needs hostPID: true and --proc-root /proc); evicting only", .0.display())]
    ForeignProcRoot(PathBuf),
    /// The agent's own status cannot be read.
    #[error("cannot read /proc/self/status: {0}")]
    OwnStatus(#[source] std::io::Error),
    /// CAP_KILL is not in the effective set.
    #[error("the agent lacks CAP_KILL (effective set); it evicts only")]
    NoCapKill,
    /// The effective set cannot be read from the status.
    #[error("/proc/self/status has no readable CapEff line; evicting only")]
    NoCapEff,
}

/// What the stopper needs from the host: each pid's identity now, signals to exactly the
/// process identified, the boot clock, and whether the agent may signal at all.
pub trait ProcessSignals: Send + Sync {
    /// The pid's start time and pod now.
    fn seen(&self, pid: u32) -> Result<Seen, ProcError>;
    /// Sends `sig` to `pid` if it is still the process that started at `start_ticks`.
    fn signal(&self, pid: u32, start_ticks: u64, sig: Sig) -> Result<(), SignalError>;
    /// Time since boot (`CLOCK_BOOTTIME`), the clock `/proc/<pid>/stat` start times use.
    fn boot_time(&self) -> Duration;
    /// Whether the agent may signal other users' processes (CAP_KILL), or why not.
    fn permitted(&self) -> Result<(), NotPermitted>;
}

/// The `result` label of `gpu_warden_guard_stops_total`.
mod result {
    pub const STOPPED: &str = "stopped";
    pub const KILLED: &str = "killed";
    pub const RESUMED: &str = "resumed";
    pub const REFUSED: &str = "refused";
    pub const GONE: &str = "gone";
    pub const DENIED: &str = "denied";
    pub const ERROR: &str = "error";
    pub const NOT_PERMITTED: &str = "not_permitted";
}

/// The `result` label a signal's failure is counted under.
fn result_of(e: &SignalError) -> &'static str {
    match e {
        SignalError::Gone(_) => result::GONE,
        SignalError::NotSame { .. } => result::REFUSED,
        SignalError::Denied(_) => result::DENIED,
        SignalError::Other(_) => result::ERROR,
    }
}

/// How many recent actions `/state` shows.
const RECENT: usize = 32;

pub use crate::guard::ports::ActionRecord;

/// Stops, kills and resumes victims' GPU processes for the enforcer.
pub struct Stopper {
    action: OnDecision,
    signals: Arc<dyn ProcessSignals>,
    permitted: Result<(), NotPermitted>,
    book: Mutex<StopBook>,
    recent: Mutex<VecDeque<ActionRecord>>,
    metrics: SelfMetrics,
    clock: Arc<dyn Clock>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each change under these locks is a single insert or removal: a panic elsewhere
    // leaves them consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn processes(n: usize) -> String {
    if n == 1 {
        "1 GPU process".to_string()
    } else {
        format!("{n} GPU processes")
    }
}

impl Stopper {
    /// A stopper doing `action`; asks `signals` once whether it may signal, and without
    /// the permission logs one line and evicts only (the metric and /state say so too).
    pub fn new(
        action: OnDecision,
        signals: Arc<dyn ProcessSignals>,
        metrics: SelfMetrics,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let permitted = signals.permitted();
        metrics
            .guard_stop_permitted
            .set(i64::from(permitted.is_ok()));
        if action.signals() {
            match &permitted {
                Ok(()) => tracing::info!(
                    on_decision = action.as_str(),
                    "guard will {} the victim's GPU processes when it decides (CAP_KILL held)",
                    action.as_str()
                ),
                Err(why) => {
                    tracing::warn!(on_decision = action.as_str(), reason = %why, "guard cannot signal the victim's GPU processes: it evicts only")
                }
            }
        }
        Stopper {
            action,
            signals,
            permitted,
            book: Mutex::default(),
            recent: Mutex::default(),
            metrics,
            clock,
        }
    }

    /// The configured action.
    pub fn action(&self) -> OnDecision {
        self.action
    }

    fn count(&self, result: &str, n: usize) {
        if n > 0 {
            self.metrics
                .guard_stops
                .with_label_values(&[result])
                .inc_by(n as u64);
        }
    }

    fn note(&self, decision_id: u64, v: &Victim, action: String) {
        let mut recent = lock(&self.recent);
        recent.push_back(ActionRecord {
            decision_id,
            pod: format!("{}/{}", v.namespace, v.name),
            uid: v.uid.clone(),
            action,
            at: self.clock.mono(),
        });
        while recent.len() > RECENT {
            recent.pop_front();
        }
    }

    /// Whether this stopper acts with `sig` at all (the action, and the permission).
    fn acts(&self, sig: Sig) -> bool {
        let wanted = match sig {
            Sig::Stop => self.action == OnDecision::Stop,
            Sig::Kill => self.action == OnDecision::Kill,
            Sig::Cont => false,
        };
        if wanted && self.permitted.is_err() {
            self.count(result::NOT_PERMITTED, 1);
        }
        wanted && self.permitted.is_ok()
    }

    /// Signals every process of `victim` the decision listed that is, at this moment, in
    /// its pod's cgroup and older than the decision. Returns those signalled.
    fn signal_victim(&self, decision: &Decision, victim: &Victim, sig: Sig) -> Vec<Held> {
        let since = self.clock.mono().saturating_sub(decision.at);
        let decided = stop::decided_ticks(self.signals.boot_time(), since);
        let mut done = Vec::new();
        for &pid in &victim.pids {
            let checked = stop::check(&victim.uid, decided, self.signals.seen(pid));
            let start_ticks = match checked {
                Ok(t) => t,
                Err(refusal) => {
                    let gone = matches!(refusal, stop::Refusal::Gone(_));
                    self.count(if gone { result::GONE } else { result::REFUSED }, 1);
                    tracing::warn!(decision = decision.id, pod = %victim.name, namespace = %victim.namespace, pid, reason = %refusal, "not signalling pid");
                    continue;
                }
            };
            match self.signals.signal(pid, start_ticks, sig) {
                Ok(()) => done.push(Held { pid, start_ticks }),
                Err(e) => self.count_error(decision.id, victim, pid, &e),
            }
        }
        done
    }

    fn count_error(&self, decision_id: u64, v: &Victim, pid: u32, e: &SignalError) {
        self.count(result_of(e), 1);
        tracing::warn!(decision = decision_id, pod = %v.name, namespace = %v.namespace, pid, error = %e, "signal not delivered");
    }

    /// `onDecision: stop`: SIGSTOPs the victim's GPU processes before its fresh read.
    /// Returns what was done, for the Events, if anything.
    pub fn stop(&self, decision: &Decision, victim: &Victim) -> Option<String> {
        self.hold(decision, victim, |n| {
            format!("stopped {}; evicting", processes(n))
        })
    }

    /// A doubt restored after an agent restart: SIGSTOPs its pod's processes again (the
    /// earlier process resumed them when it shut down), each verified as [`Stopper::stop`]
    /// verifies, against the restored decision's time. Resolved like any doubt.
    pub fn stop_again(&self, decision: &Decision, victim: &Victim) -> Option<String> {
        self.hold(decision, victim, |n| {
            format!(
                "stopped {} again after an agent restart: its eviction is in doubt",
                processes(n)
            )
        })
    }

    fn hold(
        &self,
        decision: &Decision,
        victim: &Victim,
        say: impl Fn(usize) -> String,
    ) -> Option<String> {
        if !self.acts(Sig::Stop) {
            return None;
        }
        let held = self.signal_victim(decision, victim, Sig::Stop);
        if held.is_empty() {
            return None;
        }
        self.count(result::STOPPED, held.len());
        let pod = format!("{}/{}", victim.namespace, victim.name);
        lock(&self.book).hold(&victim.uid, &pod, decision.id, &held, self.clock.mono());
        let text = say(held.len());
        tracing::warn!(decision = decision.id, pod = %victim.name, namespace = %victim.namespace, pids = ?held.iter().map(|h| h.pid).collect::<Vec<_>>(), "{text}");
        self.note(decision.id, victim, text.clone());
        Some(text)
    }

    /// `onDecision: kill`: SIGKILLs the victim's GPU processes once its fresh read agreed.
    pub fn kill(&self, decision: &Decision, victim: &Victim) -> Option<String> {
        if !self.acts(Sig::Kill) {
            return None;
        }
        let killed = self.signal_victim(decision, victim, Sig::Kill);
        if killed.is_empty() {
            return None;
        }
        self.count(result::KILLED, killed.len());
        let text = format!("killed {}; evicting", processes(killed.len()));
        tracing::warn!(decision = decision.id, pod = %victim.name, namespace = %victim.namespace, pids = ?killed.iter().map(|h| h.pid).collect::<Vec<_>>(), "{text}");
        self.note(decision.id, victim, text.clone());
        Some(text)
    }

    /// Applies the eviction's `outcome` to the victim's stopped processes: resumes them if
    /// the eviction did not happen, kills them once it did. Returns what was done, if
    /// anything.
    pub fn after(
        &self,
        decision_id: u64,
        victim: &Victim,
        outcome: &EvictionOutcome,
    ) -> Option<String> {
        let next = stop::after(outcome);
        let stopped = lock(&self.book).settle(&victim.uid, &next)?;
        let text = self.finish(&stopped, &next);
        self.note(decision_id, victim, text.clone());
        Some(text)
    }

    /// What the guard learned of an eviction in doubt: resumes the pod's processes if it was
    /// not carried out, kills them if it was, forgets them if the pod is gone anyway.
    pub fn resolved(&self, uid: &str, outcome: &EvictionOutcome) {
        let next = match outcome {
            EvictionOutcome::Evicted => Next::Kill,
            EvictionOutcome::AlreadyGone => Next::Forget,
            EvictionOutcome::InDoubt(_) => Next::Keep,
            _ => Next::Resume("the eviction in doubt was not carried out".into()),
        };
        let settled = lock(&self.book).settle(uid, &next);
        if let Some(stopped) = settled {
            let text = self.finish(&stopped, &next);
            let mut recent = lock(&self.recent);
            recent.push_back(ActionRecord {
                decision_id: stopped.decision_id,
                pod: stopped.pod.clone(),
                uid: uid.to_string(),
                action: text,
                at: self.clock.mono(),
            });
            while recent.len() > RECENT {
                recent.pop_front();
            }
        }
    }

    /// Resumes everything still stopped (the agent is shutting down: nobody would resolve
    /// the doubts that hold them).
    pub fn resume_all(&self, why: &str) {
        let all = lock(&self.book).take_all();
        for (_, stopped) in all {
            self.resume(&stopped, why);
        }
    }

    /// Signals a pod's settled processes as `next` says; what was done, for the Events.
    fn finish(&self, s: &stop::Stopped, next: &Next) -> String {
        match next {
            Next::Resume(why) => self.resume(s, why),
            Next::Kill => self.kill_held(s),
            Next::Keep | Next::Forget => String::new(),
        }
    }

    /// Sends `sig` to each of a pod's held processes that is still the one recorded; how
    /// many got it. One that exited, or whose pid is another's now, needs nothing; any
    /// other failure goes to `failed`.
    fn signal_held(&self, s: &stop::Stopped, sig: Sig, failed: impl Fn(u32, SignalError)) -> usize {
        let mut done = 0;
        for h in &s.procs {
            match self.signals.signal(h.pid, h.start_ticks, sig) {
                Ok(()) => done += 1,
                Err(SignalError::Gone(_) | SignalError::NotSame { .. }) => {}
                Err(e) => failed(h.pid, e),
            }
        }
        done
    }

    /// SIGKILLs a pod's stopped processes once its eviction happened.
    fn kill_held(&self, s: &stop::Stopped) -> String {
        let killed = self.signal_held(s, Sig::Kill, |pid, e| {
            self.count(result_of(&e), 1);
            tracing::error!(pod = %s.pod, pid, error = %e, "cannot kill a stopped process of an evicted pod");
        });
        self.count(result::KILLED, killed);
        let text = if killed == 0 {
            "its stopped GPU processes had exited by the time it was evicted".to_string()
        } else {
            format!("killed {} once evicted", processes(killed))
        };
        tracing::warn!(decision = s.decision_id, pod = %s.pod, "{text}");
        text
    }

    fn resume(&self, s: &stop::Stopped, why: &str) -> String {
        let resumed = self.signal_held(s, Sig::Cont, |pid, e| {
            tracing::error!(pod = %s.pod, pid, error = %e, "cannot resume a stopped process");
        });
        self.count(result::RESUMED, resumed);
        let text = format!("resumed {}: {why}", processes(resumed));
        tracing::warn!(decision = s.decision_id, pod = %s.pod, "{text}");
        text
    }

    /// The stopper's part of /state: the action, whether it is permitted, what is stopped
    /// now and the recent actions.
    pub fn status(&self) -> StopStatus {
        let book = lock(&self.book);
        let stopped = book
            .held()
            .into_iter()
            .map(|(uid, s)| HeldStop {
                uid: uid.to_string(),
                pod: s.pod.clone(),
                decision_id: s.decision_id,
                pids: s.procs.iter().map(|h| h.pid).collect(),
                since: s.since,
            })
            .collect();
        StopStatus {
            on_decision: self.action.as_str(),
            permitted: self.permitted.is_ok(),
            not_permitted_reason: self.permitted.as_ref().err().map(ToString::to_string),
            stopped,
            recent: lock(&self.recent).iter().cloned().collect(),
        }
    }
}

/// Adds what was done to the victims' processes to a decision's Events: each evicted pod's
/// note and the Node's say it ("stopped 2 GPU processes; evicting"), and a pod that was
/// stopped and then resumed — its eviction did not happen, so it has no eviction Event —
/// gets a Normal Event of its own saying why ("resumed 1 GPU process: eviction refused by a
/// PodDisruptionBudget").
pub fn annotate(drafts: &mut Vec<EventDraft>, decision: &Decision, actions: &[(String, String)]) {
    if actions.is_empty() {
        return;
    }
    for d in drafts.iter_mut() {
        match &d.regarding {
            Regarding::Pod { uid, .. } => {
                let done: Vec<&str> = actions
                    .iter()
                    .filter(|(u, _)| u == uid)
                    .map(|(_, t)| t.as_str())
                    .collect();
                if !done.is_empty() {
                    // First, so the note's limit never cuts it off.
                    d.note = format!("At decision: {}. {}", done.join(", then "), d.note);
                }
            }
            Regarding::Node { .. } => {
                // One entry per pod, its actions in order, as on the pod's own Event.
                let mut uids: Vec<&str> = Vec::new();
                for (uid, _) in actions {
                    if !uids.contains(&uid.as_str()) {
                        uids.push(uid);
                    }
                }
                let done: Vec<String> = uids
                    .into_iter()
                    .filter_map(|uid| {
                        let v = decision.candidates.iter().find(|v| v.uid == uid)?;
                        let texts: Vec<&str> = actions
                            .iter()
                            .filter(|(u, _)| u == uid)
                            .map(|(_, t)| t.as_str())
                            .collect();
                        Some(format!(
                            "{}/{} {}",
                            v.namespace,
                            v.name,
                            texts.join(", then ")
                        ))
                    })
                    .collect();
                d.note = format!("{} Processes: {}.", d.note, done.join("; "));
            }
        }
    }
    drafts.extend(resume_events(decision, actions));
}

fn resume_events(decision: &Decision, actions: &[(String, String)]) -> Vec<EventDraft> {
    actions
        .iter()
        .filter(|(_, text)| text.starts_with("resumed"))
        .filter_map(|(uid, text)| {
            let v = decision.candidates.iter().find(|v| &v.uid == uid)?;
            Some(EventDraft {
                namespace: v.namespace.clone(),
                regarding: Regarding::Pod {
                    namespace: v.namespace.clone(),
                    name: v.name.clone(),
                    uid: v.uid.clone(),
                },
                type_: EventType::Normal,
                reason: REASON_RESUMED,
                action: "Resume",
                note: format!(
                    "GPU {} ({}) memory pressure: the guard stopped this pod's GPU processes to evict it, then {text}",
                    decision.gpu, decision.uuid
                ),
            })
        })
        .collect()
}

/// The reason of the Event on a pod whose stopped processes were resumed.
pub const REASON_RESUMED: &str = "GPUMemoryPressureResumed";
