//! One GPU's step: time- and budget-driven phase changes, the triggers (hard, soft after
//! grace, soft on the trend, the lead-in), and the minimum-reclaim plan under the global
//! rate limit.

use super::escalate;
use super::outcomes::{pids_of, settle};
use super::Guard;
use crate::guard::decision::{Decision, Trigger};
use crate::guard::growth::Carried;
use crate::guard::levels::Pressure;
use crate::guard::policy::Mode;
use crate::guard::rank;
use crate::guard::status::GpuPhase;
use crate::guard::trend;
use crate::model::snapshot::{GpuHealth, ProcessSample};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// The share of the early trigger's rise that something's own climb must carry
/// ([`Guard::early_carry`]), and that the pods it may evict must carry ([`climbers_only`]): half, so a job's start-up beside a returning workspace of
/// more than its size does not pass, and a job climbing beside one passes once it has climbed
/// as much as the workspace (16 ms at 128 GiB/s beside 2 GiB).
const EARLY_CARRIED: f64 = 0.5;

/// A pod whose own part of a climb is less than this is not climbing: allocator noise,
/// a workspace a few MiB larger than before (the early trigger's envelope ignores rises
/// this small too).
const CLIMB_NOISE: u64 = 64 << 20;

/// What the full poll says of the early trigger's rise ([`Guard::early_carry`]).
enum EarlyCarry {
    /// Nothing to judge it by (no processes listed, memory NVML cannot tell, no earlier
    /// poll, or not the early trigger): it stands as the GPU shows it.
    Unjudged,
    /// Less than [`EARLY_CARRIED`] of it is carried yet: wait for the next full poll.
    NotYet,
    /// The rise (bytes) and who carries it.
    Carried(u64, Carried),
}

/// Keeps, of an early decision's candidates, the pods that carry the climb, in rank order;
/// why no early decision is taken otherwise: when the pods it may evict carry less than
/// [`EARLY_CARRIED`] of the rise, or when the first-ranked pod is not one of them.
///
/// Why: the early trigger acts before there is any pressure, to stop a climb; evicting a
/// pod that is not climbing stops nothing and takes a bystander. A climb carried by a
/// process outside any pod, by a pod the guard may not evict, by memory no listed process
/// shows, or by a pod within its declared request (growth inside a declaration never makes
/// another pod a victim, issue 38) is nobody's to stop early; nor is a climb of a pod that
/// a steady one outranks (by priority, or by being over its request): taking the steady pod
/// early would go for nothing if the climb stops short of hard, and taking the climber
/// would invert the order. The soft and hard triggers, which follow the kubelet's order,
/// answer it if the GPU does fill.
fn climbers_only(ranking: &mut rank::Ranking, carried: &Carried, rise: u64) -> Result<(), String> {
    // Only a pod's climb above its declared request is its own to answer for.
    let climb = |v: &rank::Victim| carried.by(&v.uid).min(v.above_request());
    let climbing = |v: &rank::Victim| climb(v) >= CLIMB_NOISE;
    let by_candidates = ranking
        .candidates
        .iter()
        .filter(|v| climbing(v))
        .map(climb)
        .fold(0, u64::saturating_add);
    if (by_candidates as f64) < EARLY_CARRIED * rise as f64 {
        return Err(format!(
            "a climb of {} over {} ms that no pod the guard may evict carries ({}): left to the soft and hard triggers",
            rank::fmt_bytes(rise),
            trend::EARLY_WINDOW.as_millis(),
            carriers(ranking, carried)
        ));
    }
    if let Some(first) = ranking.candidates.first().filter(|v| !climbing(v)) {
        let climber = ranking
            .candidates
            .iter()
            .find(|v| climbing(v))
            .map_or_else(String::new, |v| format!("{}/{}", v.namespace, v.name));
        return Err(format!(
            "{}/{}, which is not climbing, ranks ahead of the climbing {climber} ({}): left to the soft and hard triggers",
            first.namespace, first.name, first.reason
        ));
    }
    ranking.keep_only(climbing, &rank::Exclusion::NotClimbing);
    Ok(())
}

/// Who carries a climb, for the reason a GPU gives for not acting on it: the largest
/// parts first.
fn carriers(ranking: &rank::Ranking, carried: &Carried) -> String {
    let mut parts: Vec<(u64, String)> = carried
        .pods
        .iter()
        .map(|(uid, bytes)| {
            let who = if let Some(v) = ranking.candidates.iter().find(|v| &v.uid == uid) {
                if *bytes > v.above_request() {
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
    if carried.unlisted() > 0 {
        parts.push((carried.unlisted(), "memory no listed process shows".into()));
    }
    parts.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    parts
        .iter()
        .map(|(bytes, who)| format!("{} by {who}", rank::fmt_bytes(*bytes)))
        .collect::<Vec<_>>()
        .join("; ")
}

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
    /// next one (it asks for it on the next fast reading). Where NVML lists no processes or
    /// cannot tell their memory, the trigger stands as the GPU shows it.
    fn early_carry(&self, index: u32, now: Duration) -> EarlyCarry {
        let mut on_gpu = self
            .processes()
            .iter()
            .filter(|p| p.gpu == index)
            .peekable();
        if on_gpu.peek().is_none() || on_gpu.any(|p| p.used_bytes.is_none()) {
            return EarlyCarry::Unjudged;
        }
        let Some(rise) = self
            .gpus
            .get(&index)
            .and_then(|st| st.trend.sustained_rise(now))
        else {
            return EarlyCarry::Unjudged;
        };
        let since = now.saturating_sub(trend::EARLY_WINDOW);
        match self.seen.growth.carried_since(index, since) {
            None => EarlyCarry::Unjudged,
            Some(c) if (c.total as f64) < EARLY_CARRIED * rise as f64 => EarlyCarry::NotYet,
            Some(c) => EarlyCarry::Carried(rise, c),
        }
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
        let early = st
            .trend
            .sustained_time_to(memory.free.saturating_sub(levels.hard), now)
            .filter(|t| *t <= self.policy.act_budget);
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
        } else if early.is_some() {
            Trigger::EarlyTrend
        } else {
            return None;
        };
        let time_to_full = match trigger {
            Trigger::EarlyTrend => st.trend.sustained_time_to(memory.free, now),
            _ => time_to_full,
        };
        // While cooling down, only the readings since: the climb before it was the victims'.
        let sustained = match &cooling_from {
            Some((.., since)) => st.trend.sustained_growth_lasting_since(now, *since),
            None => st.trend.sustained_growth_lasting(now),
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
        let carry = if trigger == Trigger::EarlyTrend {
            self.early_carry(index, now)
        } else {
            EarlyCarry::Unjudged
        };
        if matches!(carry, EarlyCarry::NotYet) {
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
        if let (None, EarlyCarry::Carried(rise, carried)) = (&escalated, &carry) {
            if let Err(why) = climbers_only(&mut ranking, carried, *rise) {
                if let Some(st) = self.gpus.get_mut(&index) {
                    st.inactive_reason = Some(why);
                }
                return None;
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
            Trigger::EarlyTrend => levels.target.saturating_sub(memory.free).max(1),
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
}
