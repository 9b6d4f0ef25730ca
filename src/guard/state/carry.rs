//! The guard's side of what survives a restart (`guard::carry`): the doubts and cooldowns
//! in force as a [`Carried`] value for the shell to keep, and a carried value handed back at
//! start restored into the GPUs' phases. A restored doubt is an `in_doubt` phase with a
//! synthetic decision (trigger `restored`) whose only candidates are the pods in doubt, so
//! the rules of `outcomes` resolve it as they would have in the old process: seen gone →
//! evicted and a cooldown; still running after `inDoubtTimeout` of the server answering, as
//! a fresh read confirms → not carried out. Its answered time starts again from zero: what
//! the old process had counted is not known to have been answered time here.

use super::Guard;
use crate::guard::carry::{Carried, CarriedCooldown, CarriedDoubt, RESTORE_MARGIN};
use crate::guard::decision::{Decision, EvictionOutcome, Trigger};
use crate::guard::levels::Levels;
use crate::guard::rank::Victim;
use crate::guard::status::GpuPhase;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

/// Carried entries waiting for their GPU to be seen and the pod view to be proven (an
/// unsynced view is empty, and would resolve every doubt as "gone").
#[derive(Debug, Clone, Default)]
pub(super) struct Pending {
    /// Doubts, each with the monotonic time after which it is too old to restore.
    doubts: Vec<(CarriedDoubt, Duration)>,
    /// Cooldowns, each with its monotonic end.
    cooldowns: Vec<(CarriedCooldown, Duration)>,
    /// When each restored doubt first began (pod UID → wall time), so a carried doubt keeps
    /// its age across restarts and a crash loop cannot keep one alive for ever.
    began: HashMap<String, SystemTime>,
}

/// What a restore kept and dropped, for the shell's log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Doubts kept (restored once their GPU is seen on a proven view).
    pub doubts: usize,
    /// Cooldowns kept.
    pub cooldowns: usize,
    /// Entries dropped, with why.
    pub dropped: Vec<String>,
}

impl Guard {
    /// Takes back what an earlier process of this agent carried (`wall`: the wall clock
    /// now, `now`: the injected monotonic clock). Doubts older than `inDoubtTimeout` +
    /// [`RESTORE_MARGIN`] and cooldowns already over are dropped; a cooldown is never longer
    /// than `cooldownTimeout` from now. The rest is applied on the first full poll on a
    /// proven pod view that shows its GPU.
    pub fn restore(&mut self, carried: Carried, now: Duration, wall: SystemTime) -> RestoreReport {
        let mut report = RestoreReport::default();
        let limit = self.policy.in_doubt_timeout + RESTORE_MARGIN;
        for d in carried.doubts {
            let age = wall.duration_since(d.since).unwrap_or_default();
            if age > limit {
                report.dropped.push(format!(
                    "the doubt about {}/{} began {} s ago, more than inDoubtTimeout + {} s",
                    d.namespace,
                    d.name,
                    age.as_secs(),
                    RESTORE_MARGIN.as_secs()
                ));
                continue;
            }
            self.doubts.carried.began.insert(d.uid.clone(), d.since);
            self.doubts.carried.doubts.push((d, now + (limit - age)));
            report.doubts += 1;
        }
        for c in carried.cooldowns {
            match c.until.duration_since(wall) {
                Ok(left) if !left.is_zero() => {
                    let left = left.min(self.policy.cooldown_timeout);
                    self.doubts.carried.cooldowns.push((c, now + left));
                    report.cooldowns += 1;
                }
                _ => report.dropped.push(format!(
                    "the cooldown of GPU {} from decision {} is over",
                    c.gpu, c.decision
                )),
            }
        }
        report
    }

    /// Applies the carried entries whose GPU is known and watching; drops those past their
    /// bound. Called on a full poll whose pod view is proven.
    pub(super) fn apply_carried(&mut self, now: Duration) {
        if self.doubts.carried.doubts.is_empty() && self.doubts.carried.cooldowns.is_empty() {
            return;
        }
        self.doubts.carried.doubts.retain(|(_, until)| *until > now);
        self.doubts
            .carried
            .cooldowns
            .retain(|(_, until)| *until > now);
        let indices: Vec<(u32, String)> = self
            .gpus
            .iter()
            .map(|(i, s)| (*i, s.uuid.clone()))
            .collect();
        for (index, uuid) in indices {
            let doubts: Vec<CarriedDoubt> =
                take_where(&mut self.doubts.carried.doubts, |d| d.0.gpu == uuid)
                    .into_iter()
                    .map(|(d, _)| d)
                    .collect();
            let cooldowns = take_where(&mut self.doubts.carried.cooldowns, |c| c.0.gpu == uuid);
            let Some(st) = self.gpus.get(&index) else {
                continue;
            };
            if st.phase != GpuPhase::Watching {
                continue;
            }
            let id = self.next_id;
            if !doubts.is_empty() {
                let victims: Vec<Victim> = doubts.iter().map(victim_of).collect();
                let outcomes: BTreeMap<String, EvictionOutcome> = doubts
                    .iter()
                    .map(|d| {
                        let why = format!(
                            "carried over an agent restart from decision {} ({})",
                            d.decision, d.detail
                        );
                        (d.uid.clone(), EvictionOutcome::InDoubt(why))
                    })
                    .collect();
                self.install(index, victims, now);
                if let Some(st) = self.gpus.get_mut(&index) {
                    if let Some(d) = &st.last_decision {
                        let mut held = d.clone();
                        held.candidates.truncate(held.planned);
                        self.doubts.restored.push(held);
                    }
                    st.set_phase(
                        GpuPhase::InDoubt {
                            decision_id: id,
                            outcomes,
                            since: now,
                            answered: Duration::ZERO,
                        },
                        now,
                    );
                }
            } else if let Some((c, until)) = cooldowns.into_iter().next() {
                let victims = c
                    .victims
                    .iter()
                    .map(|uid| Victim {
                        pids: c.pids.clone(),
                        ..blank_victim(uid, "", "")
                    })
                    .collect();
                self.install(index, victims, now);
                if let Some(st) = self.gpus.get_mut(&index) {
                    st.set_phase(
                        GpuPhase::Cooldown {
                            decision_id: id,
                            waiting_for_pids: c.pids.clone(),
                            until,
                        },
                        now,
                    );
                }
            }
        }
    }

    /// Makes a synthetic decision for `index` with `victims` its last decision.
    fn install(&mut self, index: u32, victims: Vec<Victim>, now: Duration) {
        let id = self.next_id;
        self.next_id += 1;
        let mode = self.policy.mode;
        // The others on the GPU follow the pods in doubt as candidates (never tried: only
        // the first `n` are the plan), with the most they used at the polls this process
        // has seen: the baseline a cooldown's escalation measures their growth from
        // (`escalate::judge`). What they used before the original decision is not known
        // here, and counting all of it as growth would end the cooldown at once.
        let ranked = self.ranked_as_they_are(index);
        let high_water = self.high_water_on(index, &ranked);
        let Some(st) = self.gpus.get_mut(&index) else {
            return;
        };
        let (total, used, free) = st.memory.map_or((0, 0, 0), |m| (m.total, m.used, m.free));
        let n = victims.len();
        let mut candidates = victims;
        let others: Vec<Victim> = ranked
            .candidates
            .into_iter()
            .filter(|c| !candidates.iter().any(|v| v.uid == c.uid))
            .collect();
        candidates.extend(others);
        st.last_decision = Some(Decision {
            id,
            gpu: index,
            uuid: st.uuid.clone(),
            at: now,
            mode,
            trigger: Trigger::Restored,
            pressure: st.pressure,
            total,
            used,
            free,
            levels: st.levels.as_ref().copied().unwrap_or(Levels {
                hard: 0,
                soft: 0,
                target: 0,
            }),
            time_to_full: None,
            reclaim_target_bytes: 0,
            candidates,
            planned: n,
            max_evictions: n,
            rate_limited: false,
            excluded: Vec::new(),
            other_bytes: 0,
            escalated: None,
            high_water,
        });
    }

    /// What must survive a restart now: every eviction in doubt and every cooldown that
    /// waits for victims' processes (a pause after a throttled or failed answer is not
    /// carried: it is seconds long, and writing it would load a server already in trouble),
    /// with the entries restored but not applied yet. Wall times are `wall` shifted by the
    /// monotonic distance from `now`.
    pub fn carried(&self, now: Duration, wall: SystemTime) -> Carried {
        let at = |mono: Duration| -> SystemTime {
            if mono >= now {
                wall + (mono - now)
            } else {
                wall.checked_sub(now - mono).unwrap_or(wall)
            }
        };
        let mut out = Carried {
            v: 1,
            ..Carried::default()
        };
        for st in self.gpus.values() {
            let decision = st.last_decision.as_ref();
            match &st.phase {
                GpuPhase::InDoubt {
                    decision_id,
                    outcomes,
                    since,
                    ..
                } => {
                    for (uid, o) in outcomes {
                        let EvictionOutcome::InDoubt(detail) = o else {
                            continue;
                        };
                        let victim = decision
                            .filter(|d| d.id == *decision_id)
                            .and_then(|d| d.candidates.iter().find(|v| &v.uid == uid));
                        let Some(v) = victim else { continue };
                        out.doubts.push(CarriedDoubt {
                            gpu: st.uuid.clone(),
                            uid: uid.clone(),
                            namespace: v.namespace.clone(),
                            name: v.name.clone(),
                            pids: v.pids.clone(),
                            since: self
                                .doubts
                                .carried
                                .began
                                .get(uid)
                                .copied()
                                .unwrap_or(at(*since)),
                            decision: *decision_id,
                            detail: truncated(detail),
                        });
                    }
                }
                GpuPhase::Cooldown {
                    decision_id,
                    waiting_for_pids,
                    until,
                } if !waiting_for_pids.is_empty() => {
                    let victims = decision
                        .filter(|d| d.id == *decision_id)
                        .map(|d| {
                            d.candidates
                                .iter()
                                .filter(|v| v.pids.iter().any(|p| waiting_for_pids.contains(p)))
                                .map(|v| v.uid.clone())
                                .collect()
                        })
                        .unwrap_or_default();
                    out.cooldowns.push(CarriedCooldown {
                        gpu: st.uuid.clone(),
                        until: at(*until),
                        victims,
                        pids: waiting_for_pids.clone(),
                        decision: *decision_id,
                    });
                }
                _ => {}
            }
        }
        out.doubts
            .extend(self.doubts.carried.doubts.iter().map(|(d, _)| d.clone()));
        out.cooldowns
            .extend(
                self.doubts
                    .carried
                    .cooldowns
                    .iter()
                    .map(|(c, until)| CarriedCooldown {
                        until: at(*until),
                        ..c.clone()
                    }),
            );
        out
    }
}

/// A carried value's entries without their times: what decides whether it must be written
/// again (times recomputed from two clocks move by microseconds between polls).
pub fn carried_key(c: &Carried) -> Vec<String> {
    let doubts = c
        .doubts
        .iter()
        .map(|d| format!("d {} {} {}", d.gpu, d.uid, d.decision));
    let cooldowns = c
        .cooldowns
        .iter()
        .map(|k| format!("c {} {} {:?}", k.gpu, k.decision, k.pids));
    doubts.chain(cooldowns).collect()
}

fn truncated(detail: &str) -> String {
    let mut end = detail.len().min(512);
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    detail[..end].to_string()
}

fn take_where<T>(from: &mut Vec<T>, f: impl Fn(&T) -> bool) -> Vec<T> {
    let (taken, kept): (Vec<T>, Vec<T>) = std::mem::take(from).into_iter().partition(|t| f(t));
    *from = kept;
    taken
}

fn victim_of(d: &CarriedDoubt) -> Victim {
    Victim {
        pids: d.pids.clone(),
        ..blank_victim(&d.uid, &d.namespace, &d.name)
    }
}

fn blank_victim(uid: &str, namespace: &str, name: &str) -> Victim {
    Victim {
        uid: uid.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        containers: Vec::new(),
        pids: Vec::new(),
        use_bytes: 0,
        request_bytes: 0,
        grew_bytes: 0,
        grew_over_ms: 0,
        growth_ahead_bytes: 0,
        priority: 0,
        priority_class: None,
        created_at: None,
        ci_job_id: None,
        ci_job_url: None,
        reason: "carried over from before an agent restart".to_string(),
    }
}
