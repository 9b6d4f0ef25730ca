//! The guard's recent decisions and what became of each pod tried, and the guard's part of
//! `/state` built from them: typed, kept per poll as plain data, and turned into JSON only
//! when `/state` is read.

use super::decision::{Decision, EvictionOutcome};
use super::policy::Mode;
use super::ports::StopStatus;
use super::status::GuardStatus;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// How many recent decisions `/state` shows.
pub const RECENT_DECISIONS: usize = 16;

/// A recent decision and what became of each pod tried.
#[derive(Debug, Clone)]
struct Recent {
    decision: Decision,
    outcomes: BTreeMap<String, EvictionOutcome>,
}

/// The last [`RECENT_DECISIONS`] decisions, oldest first.
#[derive(Debug, Clone, Default)]
pub struct History {
    recent: VecDeque<Recent>,
}

impl History {
    /// Keeps `decision`, dropping the oldest beyond [`RECENT_DECISIONS`].
    pub fn push(&mut self, decision: Decision) {
        self.recent.push_back(Recent {
            decision,
            outcomes: BTreeMap::new(),
        });
        while self.recent.len() > RECENT_DECISIONS {
            self.recent.pop_front();
        }
    }

    /// Keeps `outcome` of pod `uid` with its decision `id`, if that is still recent.
    pub fn record(&mut self, id: u64, uid: &str, outcome: &EvictionOutcome) {
        if let Some(r) = self.recent.iter_mut().find(|r| r.decision.id == id) {
            r.outcomes.insert(uid.to_string(), outcome.clone());
        }
    }

    /// The guard's part of `/state`: its `status`, why it holds decisions (`held`), what
    /// the executor's stop at decision did and holds (`on_decision`, the executor's own
    /// report), and the recent decisions.
    pub fn view(
        &self,
        status: GuardStatus,
        held: Option<&str>,
        on_decision: Option<StopStatus>,
    ) -> GuardView {
        GuardView {
            status,
            held: held.map(str::to_string),
            on_decision,
            recent_decisions: self
                .recent
                .iter()
                .map(|r| RecentView {
                    id: r.decision.id,
                    gpu: r.decision.gpu,
                    uuid: r.decision.uuid.clone(),
                    mode: r.decision.mode,
                    trigger: r.decision.trigger.as_str(),
                    summary: r.decision.summary(),
                    victims: victims(r),
                })
                .collect(),
        }
    }
}

/// The guard's part of `/state`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardView {
    status: GuardStatus,
    held: Option<String>,
    /// What stop-at-decision did and holds (`act::stop`), when the executor stops.
    on_decision: Option<StopStatus>,
    recent_decisions: Vec<RecentView>,
}

impl GuardView {
    /// As `/state` writes it: through a JSON value, whose objects keep their keys sorted
    /// (`/state`'s layout).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// One recent decision in `/state`.
#[derive(Debug, Clone, Serialize)]
struct RecentView {
    id: u64,
    gpu: u32,
    uuid: String,
    mode: Mode,
    trigger: &'static str,
    summary: String,
    victims: Vec<RecentVictim>,
}

/// One pod of a recent decision in `/state`: planned or tried, and its outcome.
#[derive(Debug, Clone, Serialize)]
struct RecentVictim {
    namespace: String,
    name: String,
    reason: String,
    /// An [`EvictionOutcome`] label, `pending` (planned, no outcome yet), `not_tried` (the
    /// walk ended first) or `dry_run`.
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

/// The planned victims and every other pod tried, in rank order, with what became of each.
fn victims(r: &Recent) -> Vec<RecentVictim> {
    let d = &r.decision;
    let walked = !r.outcomes.is_empty();
    d.candidates
        .iter()
        .enumerate()
        .filter(|(i, v)| *i < d.planned || r.outcomes.contains_key(&v.uid))
        .map(|(_, v)| {
            let outcome = r.outcomes.get(&v.uid);
            let result = match (outcome, d.mode) {
                (Some(o), _) => o.as_str(),
                (None, Mode::DryRun) => "dry_run",
                (None, _) if walked => "not_tried",
                (None, _) => "pending",
            };
            RecentVictim {
                namespace: v.namespace.clone(),
                name: v.name.clone(),
                reason: v.reason.clone(),
                result,
                detail: outcome
                    .and_then(EvictionOutcome::detail)
                    .map(str::to_string),
            }
        })
        .collect()
}
