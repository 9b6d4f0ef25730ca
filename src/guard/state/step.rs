//! One GPU's step: time- and budget-driven phase changes, the triggers (hard, soft after
//! grace, soft on the trend, the lead-in), and the minimum-reclaim plan under the global
//! rate limit.

use super::early::{self, EarlyCarry};
use super::escalate;
use super::need;
use super::outcomes::{pids_of, settle};
use super::Guard;
use crate::guard::decision::{Decision, Trigger};
use crate::guard::levels::Pressure;
use crate::guard::policy::Mode;
use crate::guard::rank;
use crate::guard::status::GpuPhase;
use crate::guard::trend;
use crate::model::snapshot::{GpuHealth, ProcessSample};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

impl Guard {
    /// The last full poll's processes (none before the first).
    fn processes(&self) -> &[ProcessSample] {
        self.seen
            .snapshot
            .as_ref()
            .map_or(&[][..], |s| &s.processes[..])
    }

    /// `index`'s pods ranked on what they use now, with no refusals and no growth history:
    /// a restored decision's other candidates.
    pub(super) fn ranked_as_they_are(&self, index: u32) -> rank::Ranking {
        rank::rank_growing(
            &self.policy,
            index,
            self.processes(),
            &self.seen.pods,
            &HashMap::new(),
            &HashMap::new(),
        )
    }

    /// Memory on GPU `index` held by pods the view shows terminating (other than `victims`,
    /// counted with their decision), counted as on its way back for at most
    /// `cooldownTimeout` after the guard first saw each terminating (a pod stuck
    /// terminating does not hold the guard back for ever): the bytes and the deadline of
    /// the last of them.
    pub(super) fn terminating_pending(
        &self,
        excluded: &[rank::Excluded],
        victims: &[&str],
        now: Duration,
    ) -> (u64, Duration) {
        excluded
            .iter()
            .filter(|e| e.exclusion == rank::Exclusion::Terminating)
            .filter(|e| !victims.contains(&e.uid.as_str()))
            .filter_map(|e| {
                let due = *self.seen.terminating_since.get(&e.uid)? + self.policy.cooldown_timeout;
                (due > now).then_some((e.use_bytes, due))
            })
            .fold((0, Duration::ZERO), |(b, d), (bytes, due)| {
                (b.saturating_add(bytes), d.max(due))
            })
    }

    /// When the victims of a decision evicted at `evicted_at` are due to give their memory
    /// back: the kubelet's SIGKILL at `max(grace, 2 s)` (its `minimumGracePeriodInSeconds`
    /// floor), then the driver's release.
    fn victims_due(&self, evicted_at: Duration) -> Duration {
        let grace = u64::try_from(self.policy.eviction_grace_period_seconds.max(2)).unwrap_or(2);
        evicted_at + Duration::from_secs(grace) + escalate::RETURN_ALLOWANCE
    }

    /// Each pod's high-water mark on GPU `index` over the horizon (`PodGrowth::high_water`),
    /// for the pods `ranking` saw there: a decision keeps it as the baseline of the next.
    pub(super) fn high_water_on(
        &self,
        index: u32,
        ranking: &rank::Ranking,
    ) -> std::collections::BTreeMap<String, u64> {
        let uids = ranking
            .candidates
            .iter()
            .map(|v| &v.uid)
            .chain(ranking.excluded.iter().map(|e| &e.uid));
        uids.map(|uid| (uid.clone(), self.seen.growth.high_water(index, uid)))
            .collect()
    }

    /// Notes when each terminating pod of `pods` was first seen so.
    pub(super) fn track_terminating(&mut self, pods: &crate::model::pod::PodMap, now: Duration) {
        self.seen
            .terminating_since
            .retain(|uid, _| pods.get(uid).is_some_and(|p| p.terminating));
        for p in pods.values().filter(|p| p.terminating) {
            self.seen
                .terminating_since
                .entry(p.uid.clone())
                .or_insert(now);
        }
    }

    pub(super) fn expire(&mut self, now: Duration) {
        let per = self.policy.rate_limit.per;
        while let Some(&t) = self.answers.evictions.front() {
            if now.saturating_sub(t) >= per {
                self.answers.evictions.pop_front();
            } else {
                break;
            }
        }
        self.answers.refused.retain(|_, (until, _)| *until > now);
    }

    /// Rate-limit budget reserved by in-flight decisions, other than `except`'s GPU.
    pub(super) fn reserved(&self, except: Option<u32>) -> usize {
        self.gpus
            .iter()
            .filter(|(i, _)| Some(**i) != except)
            .map(|(_, s)| s.reservation())
            .sum()
    }

    pub(super) fn allowance(&self, except: Option<u32>) -> usize {
        (self.policy.rate_limit.max_evictions as usize)
            .saturating_sub(self.answers.evictions.len())
            .saturating_sub(self.reserved(except))
    }

    /// `fresh`: the processes were read with this memory reading (a full poll). On a fast
    /// reading a trigger only asks for a full poll ([`Guard::take_refresh_request`]).
    pub(super) fn decide_all(&mut self, now: Duration, fresh: bool) -> Vec<Decision> {
        if self.trust.hold.is_some() {
            return Vec::new();
        }
        let indices: Vec<u32> = self.gpus.keys().copied().collect();
        indices
            .into_iter()
            .filter_map(|i| self.step(i, now, fresh))
            .collect()
    }

    /// Advances one GPU's phase and decides for it if a trigger fires.
    pub(super) fn step(&mut self, index: u32, now: Duration, fresh: bool) -> Option<Decision> {
        let timeout = self.policy.cooldown_timeout;
        let allowance_now = self.allowance(Some(index));
        let st = self.gpus.get_mut(&index)?;

        // Time- and budget-driven phase changes.
        match &st.phase {
            GpuPhase::Evicting {
                outcomes,
                last_activity,
                ..
            } if now.saturating_sub(*last_activity) >= timeout => {
                let next = match &st.last_decision {
                    Some(d) => settle(d, outcomes, now, timeout),
                    None => GpuPhase::Watching,
                };
                st.set_phase(next, now);
            }
            GpuPhase::Cooldown { until, .. } if now >= *until => {
                st.set_phase(GpuPhase::Watching, now);
            }
            GpuPhase::RateLimited { .. } if allowance_now > 0 || st.pressure == Pressure::None => {
                st.set_phase(GpuPhase::Watching, now);
            }
            _ => {}
        }

        st.inactive_reason = match (&self.policy.mode, &st.health, &st.memory, &st.levels) {
            (Mode::Off, ..) => Some("guard mode is off".into()),
            (_, GpuHealth::Lost(r), ..) => Some(format!("GPU lost: {r}")),
            (_, GpuHealth::Degraded(r), ..) => Some(format!("GPU degraded: {r}")),
            (_, _, None, _) => Some("no memory reading".into()),
            (_, _, _, Err(e)) => Some(e.to_string()),
            _ => None,
        };
        // In enforce mode a cooldown may give way (see `escalate`): the triggers are then
        // evaluated as when watching, and on a fresh poll `escalate::judge` decides.
        let cooling_from = match &st.phase {
            GpuPhase::Cooldown {
                decision_id,
                waiting_for_pids,
                ..
            } if self.policy.mode == Mode::Enforce && !waiting_for_pids.is_empty() => {
                Some((*decision_id, waiting_for_pids.clone(), st.phase_since))
            }
            _ => None,
        };
        if st.inactive_reason.is_some()
            || (st.phase != GpuPhase::Watching && cooling_from.is_none())
        {
            st.unmet_since = None;
            return None;
        }
        let (memory, levels) = match (st.memory, &st.levels) {
            (Some(m), Ok(l)) => (m, *l),
            _ => return None,
        };

        // Growth is fitted from the moment free went below soft (see `Trend::slope_since`);
        // until that fit has readings enough, growth that was steady before the crossing
        // counts when it leaves too little time to wait for them.
        // A fit after the crossing that shows no growth is never overridden.
        let time_to_full = st.below_soft_since.and_then(|since| {
            if st.trend.has_fit_since(since) {
                st.trend.time_to_full_since(memory.free, since)
            } else {
                st.trend
                    .time_to_full_entering(memory.free, since)
                    .filter(|t| *t <= trend::LEAD_IN_URGENT)
            }
        });
        // Growth too fast for the rules above: it would cross hard before a decision taken
        // at the soft crossing (or after the soft fit's wait) could free memory.
        // The trend's own latest reading, not `now`: a full poll right after the fast
        // reading that asked for it adds no point (`GpuState::update_memory`), and judged at
        // its own instant the 60-ms window slid past the reading at its start: the trigger
        // that asked for the poll vanished at it (a review, on the H100's figures).
        let at = st.trend.last_at().filter(|t| *t <= now).unwrap_or(now);
        let to_hard = memory.free.saturating_sub(levels.hard);
        let early = st
            .trend
            .sustained_time_to(to_hard, at)
            .filter(|t| *t <= self.policy.act_budget);
        // A pod wants back, inside the soft band, more than is free: told by the full polls'
        // history, so a trigger on a full poll and a request for one on a fast reading.
        let unmet = if memory.free < levels.soft {
            need::unmet(&self.seen.growth, index, memory.free)
        } else {
            None
        };
        st.unmet_since = need::unmet_since(st.unmet_since.take(), unmet.as_ref(), now);
        let unmet_since = st.unmet_since.as_ref().map(|(_, since)| *since);
        let unmet_held =
            unmet_since.is_some_and(|since| now.saturating_sub(since) >= need::NEED_HOLD);
        // A pod's memory back would take free below hard once the climb takes one more of
        // its steps: told by the full polls, and a workspace the fast readings saw come and
        // go; on a full poll only. Inside the soft band too: a climb that stepped twice is no
        // pair of workspaces taking turns (`soft_need`'s 200 ms hold is for those), and on the
        // H100 the `two` shape's second step left free there with the trainer's workspace in.
        // Not while cooling down (the escalation's rule judges growth then), nor unless the
        // GPU stepped up twice over the early trigger's short window.
        let ahead = if fresh && cooling_from.is_none() {
            st.trend
                .stepped_twice(at, trend::EARLY_SHORT_WINDOW)
                .and_then(|step| {
                    need::ahead(
                        &self.seen.growth,
                        index,
                        memory.free,
                        levels.hard,
                        step,
                        st.trend.cycled(at, need::CYCLE_WINDOW).is_some(),
                    )
                })
        } else {
            None
        };
        let trigger = if memory.free < levels.hard {
            Trigger::Hard
        } else if memory.free < levels.soft
            && st
                .below_soft_since
                .is_some_and(|since| now.saturating_sub(since) >= self.policy.grace)
        {
            Trigger::SoftGrace
        } else if memory.free < levels.soft
            && time_to_full.is_some_and(|t| t <= self.policy.horizon)
        {
            Trigger::SoftTrend
        } else if ahead.is_some() {
            Trigger::EarlyNeed
        } else if early.is_some() {
            Trigger::EarlyTrend
        } else if fresh && unmet_held {
            Trigger::SoftNeed
        } else {
            let polled = self.seen.growth.latest_used(index);
            if !fresh
                && cooling_from.is_none()
                && (early::wants_reference(
                    memory.used,
                    polled,
                    to_hard,
                    st.last_rise,
                    self.seen.at,
                    now,
                ) || unmet_since
                    .is_some_and(|since| need::wants_poll(since, self.seen.at, now))
                    || need::wants_step_poll(&st.trend, at, memory.free, levels.hard, self.seen.at)
                    || need::room_left(
                        memory.used,
                        polled,
                        memory.free,
                        levels.soft,
                        self.seen.at,
                        now,
                    ))
            {
                self.refresh_wanted = true;
            }
            return None;
        };
        let mut trigger = trigger;
        let mut time_to_full = match trigger {
            Trigger::EarlyTrend => st.trend.sustained_time_to(memory.free, at),
            _ => time_to_full,
        };
        // The early trigger's projection, for an `early_need` that falls back to it: only
        // then, not on every fast reading a trigger fires on.
        let early_time_to_full = |g: &Guard| {
            g.gpus
                .get(&index)
                .and_then(|st| st.trend.sustained_time_to(memory.free, at))
        };
        // While cooling down, only the readings since: the climb before it was the victims'.
        let sustained = match &cooling_from {
            Some((.., since)) => st.trend.sustained_growth_lasting_since(at, *since),
            None => st.trend.sustained_growth_lasting(at),
        };
        if !fresh {
            // While cooling down the full poll asked for is bounded: a fast tick under
            // pressure comes every few ms while the victims still hold their memory (in
            // doubt, evict-only, a slow teardown). Not while the troughs climb: a second
            // grower fills an A10G's headroom in 60–90 ms, inside that bound (issue 38, on
            // the H200), and a workspace that comes and goes or a victim's held memory never
            // looks so.
            let stale = self
                .seen
                .at
                .is_none_or(|at| now.saturating_sub(at) >= escalate::ESCALATION_POLL);
            let climbing = sustained.is_some_and(|r| r >= 1.0);
            self.refresh_wanted |= cooling_from.is_none() || stale || climbing;
            return None;
        }
        let carry = match (trigger, &unmet, &ahead) {
            (Trigger::EarlyTrend, ..) => self.early_carry(index, at),
            (Trigger::SoftNeed, Some((uid, back)), _) => self.need_carry(
                index,
                now,
                (uid, *back),
                need::Need::Unmet {
                    since: unmet_since.unwrap_or(now),
                },
            ),
            (Trigger::EarlyNeed, _, Some((uid, back))) => {
                self.need_carry(index, now, (uid, *back), need::Need::Ahead)
            }
            _ => EarlyCarry::Unjudged,
        };
        // `early_need` judges first a climb the early trigger sees too; where it holds back,
        // the early trigger judges the climb as it would alone, and a hold-back then says both
        // why nots (the H100's losses of §9o showed only the early trigger's).
        let early_too = trigger == Trigger::EarlyNeed && early.is_some();
        let mut carry = carry;
        let mut need_why = None;
        if early_too {
            if let EarlyCarry::NotYet(why) = &carry {
                need_why = Some(why.clone());
                trigger = Trigger::EarlyTrend;
                time_to_full = early_time_to_full(self);
                carry = self.early_carry(index, at);
            }
        }
        if let EarlyCarry::NotYet(why) = carry {
            self.hold_back(index, both_why_nots(need_why.as_deref(), &why), now);
            return None;
        }

        let refused: HashMap<String, String> = self
            .answers
            .refused
            .iter()
            .map(|(uid, (_, detail))| (uid.clone(), detail.clone()))
            .collect();
        let mut ranking = rank::rank_growing(
            &self.policy,
            index,
            self.processes(),
            &self.seen.pods,
            &refused,
            &self.seen.growth.on_gpu(index, sustained),
        );

        // Memory on its way back: the victims of the decision cooling down (by pid: the
        // view may not show them terminating yet), and pods terminating for any reason —
        // this agent's victims before a restart, a person's delete, the kubelet's own
        // eviction. A decision then follows `escalate::judge`.
        let cooling = cooling_from.as_ref().and_then(|(id, pids, since)| {
            let d = self.gpus.get(&index)?.last_decision.as_ref()?;
            (d.id == *id).then_some((d, pids, *since))
        });
        let victims: Vec<&str> = cooling.map_or_else(Vec::new, |(d, pids, _)| {
            d.candidates
                .iter()
                .filter(|v| v.pids.iter().any(|p| pids.contains(p)))
                .map(|v| v.uid.as_str())
                .collect()
        });
        let (victims_bytes, victims_due, victims_rate) =
            cooling.map_or((0, Duration::ZERO, 0.0), |(d, pids, since)| {
                let bytes = self
                    .processes()
                    .iter()
                    .filter(|p| p.gpu == index && pids.contains(&p.pid))
                    .map(|p| p.used_bytes.unwrap_or(0))
                    .fold(0, u64::saturating_add);
                // What they held at the decision: their growth since, as a rate, is what
                // they still add (stopped victims add nothing).
                let then: u64 = d
                    .candidates
                    .iter()
                    .filter(|v| victims.contains(&v.uid.as_str()))
                    .map(|v| v.use_bytes)
                    .sum();
                let over = now.saturating_sub(d.at).as_secs_f64();
                let rate = if over > 0.0 {
                    bytes.saturating_sub(then) as f64 / over
                } else {
                    0.0
                };
                (bytes, self.victims_due(since), rate)
            });
        let (terminating_bytes, terminating_due) =
            self.terminating_pending(&ranking.excluded, &victims, now);
        let returning = escalate::Returning {
            bytes: victims_bytes.saturating_add(terminating_bytes),
            due_in: escalate::due_in(victims_due.max(terminating_due), now),
        };
        // Whatever is on its way back, and however much: while it returns, a pressure
        // nobody's growth keeps up (a workspace's peak, the victim's own memory) passes.
        let gated = cooling.is_some() || terminating_bytes > 0;
        let escalated = if gated {
            let growers: Vec<escalate::Grower> = ranking
                .candidates
                .iter()
                .filter(|v| !victims.contains(&v.uid.as_str()))
                .filter_map(|v| {
                    // The high-water mark before the decision cooling down, or, with
                    // terminating pods only, over the first half of the horizon.
                    let high_water = match cooling {
                        Some((d, ..)) => d.high_water.get(&v.uid).copied().unwrap_or(0),
                        None => v.use_bytes.saturating_sub(v.grew_bytes),
                    };
                    let grew = escalate::above_baseline(v.use_bytes, high_water, v.request_bytes);
                    (grew > 0).then(|| escalate::Grower {
                        uid: v.uid.clone(),
                        pod: format!("{}/{}", v.namespace, v.name),
                        grew_bytes: grew,
                    })
                })
                .collect();
            let verdict = escalate::judge(&escalate::Weighed {
                after_decision: cooling.map(|(d, ..)| d.id),
                growers: &growers,
                returning,
                free: memory.free,
                levels,
                sustained,
                victims_rate,
            });
            match verdict {
                escalate::Verdict::Wait(why) => {
                    if let Some(st) = self.gpus.get_mut(&index) {
                        st.inactive_reason = Some(why);
                    }
                    return None;
                }
                escalate::Verdict::Escalate(e) => {
                    // Only the pods that kept growing are taken: the others did nothing
                    // the memory on its way back does not already answer.
                    ranking.keep_only(
                        |v| growers.iter().any(|g| g.uid == v.uid),
                        &rank::Exclusion::NotGrowing,
                    );
                    if let Some(st) = self.gpus.get_mut(&index) {
                        st.set_phase(GpuPhase::Watching, now);
                    }
                    Some(e)
                }
            }
        } else {
            None
        };
        if escalated.is_none() {
            let in_soft_band = memory.free < levels.soft;
            if let Err(why) = self.keep_climbers(&mut ranking, &carry, index, now, in_soft_band) {
                if !(trigger == Trigger::EarlyNeed && early_too) {
                    self.hold_back(index, both_why_nots(need_why.as_deref(), &why), now);
                    return None;
                }
                let fallback = match self.early_carry(index, at) {
                    c @ EarlyCarry::Carried { .. } => {
                        self.keep_climbers(&mut ranking, &c, index, now, in_soft_band)
                    }
                    EarlyCarry::NotYet(not_yet) => Err(not_yet),
                    EarlyCarry::Unjudged => Err("no rise to judge".to_string()),
                };
                if let Err(not_early) = fallback {
                    self.hold_back(index, both_why_nots(Some(&why), &not_early), now);
                    return None;
                }
                trigger = Trigger::EarlyTrend;
                time_to_full = early_time_to_full(self);
            }
        }
        // An early decision may come while free is still above the target: the plan then
        // takes the first-ranked pod alone (at least one byte to reclaim), or it would be
        // done before it began. It does not add the growth still to come: evicting the
        // grower stops it, and counting it made the H200 plan take the neighbours too.
        //
        // Memory on its way back counts as reclaimed-pending, whoever deleted its pods, so
        // the plan does not evict a second pod for memory already returning. Not for the
        // early trigger outside an escalation, which is about growth still under way, not
        // about memory held.
        let reclaim = match trigger {
            _ if escalated.is_some() => levels
                .target
                .saturating_sub(memory.free.saturating_add(returning.bytes))
                .max(1),
            Trigger::EarlyTrend | Trigger::EarlyNeed => {
                levels.target.saturating_sub(memory.free).max(1)
            }
            _ => levels
                .target
                .saturating_sub(memory.free.saturating_add(terminating_bytes)),
        };
        if reclaim == 0 {
            if let Some(st) = self.gpus.get_mut(&index) {
                st.inactive_reason = Some(format!(
                    "{} held by terminating pods is on its way back: enough to reach the target",
                    rank::fmt_bytes(terminating_bytes)
                ));
            }
            return None;
        }
        let mut covered = 0u64;
        let needed = ranking
            .candidates
            .iter()
            .position(|v| {
                covered = covered.saturating_add(v.use_bytes);
                covered >= reclaim
            })
            .map_or(ranking.candidates.len(), |i| i + 1);

        // One decision in flight at a time node-wide where budget is short: an in-flight
        // decision holds its allowance until it settles (milliseconds with a no-retry
        // eviction client), so two GPUs can never overspend the global limit together.
        let reserved_elsewhere = self.reserved(Some(index));
        let max = self.policy.rate_limit.max_evictions as usize;
        if reserved_elsewhere > 0
            && self.answers.evictions.len() + reserved_elsewhere + needed > max
        {
            if let Some(st) = self.gpus.get_mut(&index) {
                st.inactive_reason = Some(format!(
                    "waiting for another GPU's decision to settle: it holds {reserved_elsewhere} of the rate limit's {max} evictions"
                ));
            }
            return None;
        }
        let allowance = max
            .saturating_sub(self.answers.evictions.len())
            .saturating_sub(reserved_elsewhere);
        let planned = needed.min(allowance);
        let rate_limited = needed > allowance;
        let max_evictions = allowance.min(ranking.candidates.len());

        let high_water = self.high_water_on(index, &ranking);
        let id = self.next_id;
        self.next_id += 1;
        let st = self.gpus.get_mut(&index)?;
        let decision = Decision {
            id,
            gpu: index,
            uuid: st.uuid.clone(),
            at: now,
            mode: self.policy.mode,
            trigger,
            pressure: st.pressure,
            total: memory.total,
            used: memory.used,
            free: memory.free,
            levels,
            time_to_full,
            reclaim_target_bytes: reclaim,
            candidates: ranking.candidates,
            planned,
            max_evictions,
            rate_limited,
            excluded: ranking.excluded,
            other_bytes: ranking.other_bytes,
            escalated,
            high_water,
        };
        let next = if planned == 0 && rate_limited {
            GpuPhase::RateLimited { decision_id: id }
        } else if self.policy.mode == Mode::Enforce && planned > 0 {
            GpuPhase::Evicting {
                decision_id: id,
                outcomes: BTreeMap::new(),
                last_activity: now,
            }
        } else {
            // Dry-run (wait for the planned victims to finish on their own), or nobody
            // eligible (only the timeout ends it, so the Node Event is not repeated
            // every poll).
            GpuPhase::Cooldown {
                decision_id: id,
                waiting_for_pids: pids_of(decision.planned_victims().iter()),
                until: now + timeout,
            }
        };
        st.set_phase(next, now);
        st.last_decision = Some(decision.clone());
        Some(decision)
    }

    /// Keeps, of an early decision's candidates, the pods that carry its climb
    /// (`early::climbers_only`), where `carry` says who carries it; why not otherwise.
    ///
    /// Inside the soft band a climb that is over still leaves a neighbour no room: a pod that
    /// carried it is the climber whether or not it still rises. On the H100 a job's three
    /// 2 GiB allocations in 24 ms, all inside one span, left the GPU between soft and hard,
    /// and 917 of a neighbour's allocations failed with nobody evicted (docs/validation.md
    /// §9h).
    fn keep_climbers(
        &self,
        ranking: &mut rank::Ranking,
        carry: &EarlyCarry,
        index: u32,
        now: Duration,
        in_soft_band: bool,
    ) -> Result<(), String> {
        let EarlyCarry::Carried {
            rise,
            carried,
            over,
            judged,
        } = carry
        else {
            return Ok(());
        };
        let growth = &self.seen.growth;
        let climbing = |v: &rank::Victim| {
            if in_soft_band {
                None
            } else {
                early::climbing(v, growth, index, now, *judged)
            }
        };
        early::climbers_only(ranking, carried, *rise, over, *judged, climbing)
    }
}

/// A hold-back's reason: the early trigger's (`early`), after `early_need`'s where that rule
/// fired first and fell back to it.
fn both_why_nots(need: Option<&str>, early: &str) -> String {
    match need {
        Some(need) => format!("early_need: {need}; early_trend: {early}"),
        None => early.to_string(),
    }
}
