//! The reservation ledger: pods this scheduler bound to a node recently whose memory the
//! node's annotations do not show yet, and, once they do, what of each pod's need they still
//! do not show. Without it, a burst of pods would all be placed on the same free figure before
//! the agent's next patch — and a pod judged on more than it declares (a need learned for its
//! project, a default, `unknownNeed`) would have that need forgotten once its replica shows:
//! the agent's `declaredMiB` counts declarations only.
//!
//! A reservation stops being *pending* when the node's annotations show the pod — an
//! observation made after the binding whose replicas-allocated total has grown past the
//! reservation's baseline (the kubelet has allocated it, so its declared MiB is in
//! `declaredMiB`). A pod that leaves the node lowers that total too: when the pod watch
//! sees one of the pods the baseline counted finish or go ([`Ledger::depart`]), the
//! baseline drops by one — else a job finishing there before the agent's next patch would
//! hide the new pod's allocation, and its replica and its whole need would stay counted
//! twice until the TTL (the cluster simulation found replicas idle that way 1.6–2.0 % of the
//! time at `replicas: 2`). From then on it is *shown*: only the part of its need beyond its own
//! declaration (`mib − declared_mib`) is still counted, added to the GPU's `declaredMiB`
//! before the GPU's use is taken off (src/extender/judge.rs), until the pod is deleted or
//! finishes. A shown reservation whose need is within its declaration ends there (the node
//! counts all of it). A pending reservation also ends after a TTL (nodes without pod-resources
//! data: the pod's use shows only once it allocates), or when the pod is deleted. Pure: time
//! is handed in.

use super::learned::LearnedNeeds;
use super::nodes::NodeState;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// One pod's reservation on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// `namespace/name`.
    pub pod: String,
    /// MiB reserved.
    pub mib: u64,
    /// The GPU it is expected on (the one the device plugin hands out next), when known.
    pub gpu: Option<String>,
    /// Monotonic time it was made.
    pub at: Duration,
    /// Wall time it was made (compared with the annotation's `observedAt`).
    pub at_wall: SystemTime,
    /// The node's replicas-allocated total when it was made, when known (plus one for each
    /// reservation ahead of it shown since, less one for each pod it counted that left).
    pub baseline: Option<u32>,
    /// `observedAt` of the figures the baseline was read from: a pod bound before it had
    /// its replica counted there unless the ledger held it pending then.
    pub baseline_at: Option<SystemTime>,
    /// The pods pending ahead of it when it was made whose showing raised its baseline
    /// since (`namespace/name`): their leaving lowers it again.
    pub bumped: Vec<String>,
    /// What the agent counts for the pod in `declaredMiB` once its replica is allocated: its
    /// own `vram-request-mib` (0 when it declares none).
    pub declared_mib: u64,
    /// The node's annotations show the pod: it no longer waits for a replica, and only
    /// `mib − declared_mib` is counted on top of the node's figures.
    pub shown: bool,
    /// `(namespace, project)` when the pod carries the GitLab project label: its need is
    /// resolved again when the needs learned for its project change ([`Ledger::relearn`]).
    pub project: Option<(String, String)>,
}

impl Reservation {
    /// Its need on a GPU with `usable_mib` to give (what it shows less the margin): no pod
    /// holds more than the whole GPU, and a need resolved while its node could not be read
    /// (the whole-GPU placeholder, a learned bucket past the GPU) becomes that GPU here.
    pub fn mib_on(&self, usable_mib: u64) -> u64 {
        self.mib.min(usable_mib)
    }

    /// MiB of its need the node's `declaredMiB` does not carry once the pod is shown.
    pub fn beyond_declared_mib(&self) -> u64 {
        self.mib.saturating_sub(self.declared_mib)
    }
}

/// Why a reservation stopped being pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The node's annotations account for it (what they do not carry of its need stays
    /// counted until the pod ends, when there is any).
    Shown,
    /// Its TTL ran out.
    Expired,
}

/// Reservations by node, each node's in the order they were made (pending and shown).
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    ttl: Duration,
    nodes: BTreeMap<String, Vec<Reservation>>,
}

impl Ledger {
    /// An empty ledger whose reservations live at most `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Ledger {
            ttl,
            nodes: BTreeMap::new(),
        }
    }

    /// Records `r` on `node`; false (nothing changes) when the pod already has one anywhere,
    /// since a watch replays a bound pod on every relist.
    pub fn reserve(&mut self, node: &str, r: Reservation) -> bool {
        if self.nodes.values().flatten().any(|x| x.pod == r.pod) {
            return false;
        }
        self.nodes.entry(node.to_string()).or_default().push(r);
        true
    }

    /// Drops the pod's reservation (the pod was deleted); true when it had one.
    pub fn forget(&mut self, pod: &str) -> bool {
        let mut found = false;
        for list in self.nodes.values_mut() {
            let before = list.len();
            list.retain(|r| r.pod != pod);
            found |= list.len() != before;
        }
        self.nodes.retain(|_, l| !l.is_empty());
        found
    }

    /// The pod `pod` (`namespace/name`), bound to `node` at `bound_at`, finished or was
    /// deleted: its own reservation ends, and when it was not pending (its replica was in the
    /// node's figures) each pending reservation on that node whose baseline counted it —
    /// read from figures observed after its binding, or raised when it was shown — has that
    /// baseline lowered by one, so the node's next figures, which no longer count it, still
    /// show the pods that arrived meanwhile. A pod without a known binding time counts as
    /// bound long ago. A pod that was still pending only drops out of the queue ahead of the
    /// later ones (their position falls by one). Returns whether anything changed.
    pub fn depart(&mut self, pod: &str, node: Option<&str>, bound_at: Option<SystemTime>) -> bool {
        let was_pending = self
            .nodes
            .values()
            .flatten()
            .any(|r| r.pod == pod && !r.shown);
        let mut changed = self.forget(pod);
        if was_pending {
            return changed;
        }
        let Some(list) = node.and_then(|n| self.nodes.get_mut(n)) else {
            return changed;
        };
        for r in list.iter_mut().filter(|r| !r.shown) {
            let Some(b) = r.baseline else { continue };
            let was_bumped = r.bumped.iter().any(|p| p == pod);
            let in_figures = match (bound_at, r.baseline_at) {
                // The condition's time is truncated to the second: a pod bound in the
                // second before the figures is taken as not in them yet.
                (Some(t), Some(seen)) => t + Duration::from_secs(1) <= seen,
                (None, _) => true,
                (Some(_), None) => false,
            };
            if (was_bumped || in_figures) && b > 0 {
                r.baseline = Some(b - 1);
                r.bumped.retain(|p| p != pod);
                changed = true;
            }
        }
        changed
    }

    /// Records `r` on `node` as already shown (a pod bound before the extender started,
    /// found on a relist): only its need beyond its declaration counts, until it ends. False
    /// when the pod already has one, or when nothing of its need is beyond its declaration.
    pub fn commit(&mut self, node: &str, mut r: Reservation) -> bool {
        r.shown = true;
        if r.beyond_declared_mib() == 0 || self.nodes.values().flatten().any(|x| x.pod == r.pod) {
            return false;
        }
        self.nodes.entry(node.to_string()).or_default().push(r);
        true
    }

    /// Keeps only the reservations of `pods` (`namespace/name`): after a relist of the
    /// watched pods, one whose deletion was missed must not count forever. Returns how many
    /// ended.
    pub fn retain_pods(&mut self, pods: &std::collections::HashSet<String>) -> usize {
        let mut n = 0;
        for list in self.nodes.values_mut() {
            let before = list.len();
            list.retain(|r| pods.contains(&r.pod));
            n += before - list.len();
        }
        self.nodes.retain(|_, l| !l.is_empty());
        n
    }

    /// Settles the pending reservations on `node` that `state` shows (they become shown, or
    /// end when the node counts all of their need) or whose TTL ran out at `now`; returns
    /// those that stopped being pending, in order.
    pub fn settle(
        &mut self,
        node: &str,
        state: &NodeState,
        now: Duration,
    ) -> Vec<(Reservation, Release)> {
        let Some(list) = self.nodes.get_mut(node) else {
            return Vec::new();
        };
        let (allocated, observed_at) = match state {
            NodeState::Known(v) => (v.replicas_allocated(), Some(v.observed_at)),
            _ => (None, None),
        };
        let mut ended = Vec::new();
        let mut kept: Vec<Reservation> = Vec::with_capacity(list.len());
        // Once a reservation is shown, the later ones no longer wait for its allocation:
        // their position drops by one, so their baseline rises by one.
        let mut bump = 0;
        let mut shown_now: Vec<String> = Vec::new();
        for mut r in list.drain(..) {
            if r.shown {
                kept.push(r);
                continue;
            }
            if now.saturating_sub(r.at) >= self.ttl {
                ended.push((r, Release::Expired));
                continue;
            }
            if bump > 0 && r.baseline.is_some() {
                r.baseline = r.baseline.map(|b| b + bump);
                r.bumped.extend(shown_now.iter().cloned());
            }
            // The k-th still-pending reservation is shown once k more replicas are out than
            // when it was made, in an observation taken after it.
            let position = kept.iter().filter(|k| !k.shown).count() as u32 + 1;
            let shown = match (allocated, r.baseline, observed_at) {
                (Some(a), Some(b), Some(t)) => t >= r.at_wall && a >= b + position,
                _ => false,
            };
            if shown {
                bump += 1;
                shown_now.push(r.pod.clone());
                if r.beyond_declared_mib() > 0 {
                    let mut k = r.clone();
                    k.shown = true;
                    kept.push(k);
                }
                ended.push((r, Release::Shown));
            } else {
                kept.push(r);
            }
        }
        *list = kept;
        if list.is_empty() {
            self.nodes.remove(node);
        }
        ended
    }

    /// Ends every pending reservation whose TTL ran out (nodes that vanished from the cache
    /// too). Shown ones end with their pod.
    pub fn expire(&mut self, now: Duration) -> usize {
        let ttl = self.ttl;
        let mut n = 0;
        for list in self.nodes.values_mut() {
            let before = list.len();
            list.retain(|r| r.shown || now.saturating_sub(r.at) < ttl);
            n += before - list.len();
        }
        self.nodes.retain(|_, l| !l.is_empty());
        n
    }

    /// Resolves again the needs of the pods whose project `learned` has a need for, as the
    /// need rules would now (`need::NeedRules::need`): the larger of the pod's declaration
    /// and its project's learned need. A job placed while its project was unknown
    /// (`unknownNeed`: a whole GPU) or on a default keeps that reservation for its whole
    /// run otherwise — up to 90 min of a GPU held for a job the cluster has since learned
    /// needs 4 GiB. A project the table no longer has keeps what its pods were placed on.
    /// Shown reservations left with nothing beyond their declaration end (the node counts
    /// all of it). Returns how many changed.
    pub fn relearn(&mut self, learned: &LearnedNeeds) -> usize {
        let mut changed = 0;
        for list in self.nodes.values_mut() {
            for r in list.iter_mut() {
                let Some(n) = r.project.as_ref().and_then(|(ns, p)| learned.get(ns, p)) else {
                    continue;
                };
                let mib = n.mib.max(r.declared_mib);
                if mib != r.mib {
                    r.mib = mib;
                    changed += 1;
                }
            }
            list.retain(|r| !r.shown || r.beyond_declared_mib() > 0);
        }
        self.nodes.retain(|_, l| !l.is_empty());
        changed
    }

    /// The reservations on `node`, oldest first: pending and shown (`Reservation::shown`).
    pub fn pending(&self, node: &str) -> &[Reservation] {
        self.nodes.get(node).map(Vec::as_slice).unwrap_or(&[])
    }

    /// [`Ledger::pending`] on `node` for a pod bound there now, once `state` has settled
    /// them ([`Ledger::settle`]): the figures may already show pods the ledger still holds
    /// pending — a filter call settles them, but the pod watch can see a binding first — and
    /// those must not count twice, in the new pod's baseline and in the queue ahead of it.
    pub fn pending_settled(
        &mut self,
        node: &str,
        state: Option<&NodeState>,
        now: Duration,
    ) -> &[Reservation] {
        if let Some(s) = state {
            self.settle(node, s, now);
        }
        self.pending(node)
    }

    /// How many reservations are pending in all (not yet shown by their node).
    pub fn len(&self) -> usize {
        self.nodes.values().flatten().filter(|r| !r.shown).count()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many shown reservations still count part of their pod's need.
    pub fn shown(&self) -> usize {
        self.nodes.values().flatten().filter(|r| r.shown).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::judge::tests::{at, gpu, node};

    fn r(pod: &str, at_s: u64, baseline: Option<u32>) -> Reservation {
        Reservation {
            pod: pod.into(),
            mib: 4096,
            gpu: None,
            at: Duration::from_secs(at_s),
            at_wall: at(at_s),
            baseline,
            baseline_at: baseline.map(|_| at(at_s.saturating_sub(1))),
            bumped: Vec::new(),
            declared_mib: 4096,
            shown: false,
            project: None,
        }
    }

    /// A node whose one GPU has `allocated` replicas out, observed at T0 + `obs`.
    fn shown(allocated: u32) -> NodeState {
        node(vec![gpu(0, 10000, 0, Some((allocated, 8, 0)))], None)
    }

    #[test]
    fn reserve_once_forget_and_expire() {
        let mut l = Ledger::new(Duration::from_secs(60));
        assert!(l.reserve("n1", r("ci/a", 0, None)));
        assert!(
            !l.reserve("n2", r("ci/a", 1, None)),
            "one reservation per pod"
        );
        assert!(l.reserve("n1", r("ci/b", 10, None)));
        assert_eq!(l.len(), 2);
        assert!(l.forget("ci/b"));
        assert!(!l.forget("ci/b"));
        assert_eq!(l.expire(Duration::from_secs(59)), 0);
        assert_eq!(l.expire(Duration::from_secs(60)), 1);
        assert!(l.is_empty());
    }

    #[test]
    fn ends_when_the_node_shows_it_in_order() {
        let mut l = Ledger::new(Duration::from_secs(600));
        // Both made when the node had 2 replicas out; the annotation is from T0 (at(0)),
        // so the reservations must be made at or before it to count as shown by it.
        l.reserve("n1", r("ci/a", 0, Some(2)));
        l.reserve("n1", r("ci/b", 0, Some(2)));
        // Nothing allocated yet.
        assert!(l.settle("n1", &shown(2), Duration::from_secs(1)).is_empty());
        // One more out: the first is shown, the second still waits.
        let ended = l.settle("n1", &shown(3), Duration::from_secs(2));
        assert_eq!(ended.len(), 1);
        assert_eq!(
            (ended[0].0.pod.as_str(), ended[0].1),
            ("ci/a", Release::Shown)
        );
        assert!(
            l.settle("n1", &shown(3), Duration::from_secs(3)).is_empty(),
            "the same figure does not show the second"
        );
        let ended = l.settle("n1", &shown(4), Duration::from_secs(4));
        assert_eq!(ended[0].0.pod, "ci/b");
        assert!(l.is_empty());
    }

    /// A node whose one GPU has `allocated` of 8 replicas out, observed at T0 + `obs_s`.
    fn seen(allocated: u32, obs_s: u64) -> NodeState {
        match shown(allocated) {
            NodeState::Known(mut v) => {
                v.observed_at = at(obs_s);
                NodeState::Known(v)
            }
            other => other,
        }
    }

    /// `r` made at T0 + `at_s` from figures observed at T0 + `obs_s` with `baseline` out.
    fn made(pod: &str, at_s: u64, baseline: u32, obs_s: u64) -> Reservation {
        Reservation {
            baseline_at: Some(at(obs_s)),
            ..r(pod, at_s, Some(baseline))
        }
    }

    #[test]
    fn a_pod_leaving_before_the_next_figures_does_not_hide_the_one_that_arrived() {
        // ci/old (bound at T0) holds the node's one replica out in the figures of T0 + 10;
        // ci/new is bound at T0 + 12 on them. ci/old finishes at T0 + 15: the figures of
        // T0 + 20 show one replica out again — ci/new's.
        let mut l = Ledger::new(Duration::from_secs(600));
        l.reserve("n1", made("ci/new", 12, 1, 10));
        let mut without = l.clone();
        assert!(l.depart("ci/old", Some("n1"), Some(at(0))));
        assert_eq!(l.pending("n1")[0].baseline, Some(0));
        let ended = l.settle("n1", &seen(1, 20), Duration::from_secs(20));
        assert_eq!(ended.len(), 1, "ci/new is shown");
        assert!(l.is_empty());
        // Told nothing of the departure, the ledger would wait for two replicas out, and
        // count ci/new's replica and need on top of the node's figures until the TTL.
        assert!(without
            .settle("n1", &seen(1, 20), Duration::from_secs(20))
            .is_empty());
        assert_eq!(without.len(), 1);
    }

    #[test]
    fn only_a_pod_the_baseline_counted_lowers_it() {
        let mut l = Ledger::new(Duration::from_secs(600));
        l.reserve("n1", made("ci/new", 12, 2, 10));
        // Bound after the figures the baseline came from: not in them.
        assert!(!l.depart("ci/later", Some("n1"), Some(at(11))));
        // Bound in the second before them (the condition's time is in whole seconds).
        assert!(!l.depart("ci/close", Some("n1"), Some(at(10))));
        // Another node's pod.
        assert!(!l.depart("ci/elsewhere", Some("n2"), Some(at(0))));
        assert_eq!(l.pending("n1")[0].baseline, Some(2));
        // Bound before them (or when, unknown): counted there.
        assert!(l.depart("ci/before", Some("n1"), Some(at(9))));
        assert_eq!(l.pending("n1")[0].baseline, Some(1));
        assert!(l.depart("ci/unknown", Some("n1"), None));
        assert_eq!(l.pending("n1")[0].baseline, Some(0));
        assert!(
            !l.depart("ci/more", Some("n1"), Some(at(0))),
            "never below zero"
        );
        assert_eq!(l.pending("n1")[0].baseline, Some(0));
    }

    #[test]
    fn a_pod_shown_after_the_reservation_was_made_lowers_it_when_it_leaves() {
        // ci/a and ci/b are bound at T0 + 12 and 13 on figures of T0 + 10 (1 out). The
        // figures of T0 + 14 show ci/a (2 out): ci/b's baseline rises to 2. ci/a finishes;
        // the figures of T0 + 20 show ci/b and the pod from before (2 out).
        let mut l = Ledger::new(Duration::from_secs(600));
        l.reserve("n1", made("ci/a", 12, 1, 10));
        l.reserve("n1", made("ci/b", 13, 1, 10));
        let ended = l.settle("n1", &seen(2, 14), Duration::from_secs(14));
        assert_eq!(ended.len(), 1);
        assert_eq!(l.pending("n1")[0].baseline, Some(2));
        assert_eq!(l.pending("n1")[0].bumped, vec!["ci/a".to_string()]);
        // ci/a was bound after the baseline's figures: only its showing counted it.
        assert!(l.depart("ci/a", Some("n1"), Some(at(12))));
        assert_eq!(l.pending("n1")[0].baseline, Some(1));
        assert_eq!(
            l.settle("n1", &seen(2, 20), Duration::from_secs(20)).len(),
            1
        );
        assert!(l.is_empty());
    }

    #[test]
    fn a_pod_that_leaves_still_pending_only_leaves_the_queue() {
        let mut l = Ledger::new(Duration::from_secs(600));
        l.reserve("n1", made("ci/a", 12, 1, 10));
        l.reserve("n1", made("ci/b", 13, 1, 10));
        // ci/a is deleted before the kubelet allocated it: ci/b is first in line now, on
        // the same baseline.
        assert!(l.depart("ci/a", Some("n1"), Some(at(12))));
        assert_eq!(l.pending("n1")[0].baseline, Some(1));
        assert_eq!(
            l.settle("n1", &seen(2, 20), Duration::from_secs(20)).len(),
            1
        );
        assert!(l.is_empty());
    }

    #[test]
    fn an_observation_older_than_the_binding_shows_nothing() {
        let mut l = Ledger::new(Duration::from_secs(600));
        l.reserve("n1", r("ci/a", 30, Some(2)));
        // The annotation is from T0, the reservation from T0 + 30.
        assert!(l
            .settle("n1", &shown(5), Duration::from_secs(31))
            .is_empty());
    }

    #[test]
    fn a_need_beyond_the_declaration_stays_counted_until_the_pod_ends() {
        let mut l = Ledger::new(Duration::from_secs(60));
        // Judged on 12 GiB (learned for its project), declared 4 GiB; another declared
        // enough; a third declared nothing (judged on the unknown rule's 8 GiB).
        let mut a = r("ci/a", 0, Some(2));
        a.mib = 12288;
        let b = r("ci/b", 0, Some(2));
        let mut c = r("ci/c", 0, Some(2));
        (c.mib, c.declared_mib) = (8192, 0);
        l.reserve("n1", a);
        l.reserve("n1", b);
        l.reserve("n1", c);
        let ended = l.settle("n1", &shown(5), Duration::from_secs(1));
        assert_eq!(ended.len(), 3, "all three shown");
        assert!(ended.iter().all(|(_, why)| *why == Release::Shown));
        assert_eq!(
            (l.len(), l.shown()),
            (0, 2),
            "none pending; a and c still count"
        );
        let kept: Vec<(&str, u64)> = l
            .pending("n1")
            .iter()
            .map(|r| (r.pod.as_str(), r.beyond_declared_mib()))
            .collect();
        assert_eq!(kept, vec![("ci/a", 8192), ("ci/c", 8192)]);
        assert!(l.pending("n1").iter().all(|r| r.shown));
        // Settling again changes nothing, and the TTL does not end a shown reservation.
        assert!(l.settle("n1", &shown(5), Duration::from_secs(2)).is_empty());
        assert_eq!(l.expire(Duration::from_secs(3600)), 0);
        assert_eq!(l.shown(), 2);
        // The pod's end does.
        assert!(l.forget("ci/a"));
        assert_eq!(l.shown(), 1);
    }

    #[test]
    fn a_relist_ends_reservations_of_pods_no_longer_there_and_commit_counts_old_pods() {
        let mut l = Ledger::new(Duration::from_secs(60));
        l.reserve("n1", r("ci/a", 0, None));
        let mut old = r("ci/old", 0, None);
        (old.mib, old.declared_mib) = (8192, 0);
        assert!(
            l.commit("n2", old.clone()),
            "bound before the extender started"
        );
        assert!(!l.commit("n2", old), "once per pod");
        let within = r("ci/within", 0, None);
        assert!(
            !l.commit("n2", within),
            "a need within the declaration: the node counts all of it"
        );
        assert_eq!((l.len(), l.shown()), (1, 1));
        let listed: std::collections::HashSet<String> = ["ci/old".to_string()].into();
        assert_eq!(l.retain_pods(&listed), 1);
        assert_eq!((l.len(), l.shown()), (0, 1));
    }

    #[test]
    fn without_replica_data_only_the_ttl_ends_it() {
        let mut l = Ledger::new(Duration::from_secs(60));
        l.reserve("n1", r("ci/a", 0, None));
        let plain = node(vec![gpu(0, 100, 20000, None)], None);
        assert!(l.settle("n1", &plain, Duration::from_secs(59)).is_empty());
        let ended = l.settle("n1", &plain, Duration::from_secs(60));
        assert_eq!(ended[0].1, Release::Expired);
    }

    #[test]
    fn a_learned_table_resolves_the_bound_pods_needs_again() {
        use crate::extender::learned::LearnedNeed;
        let project = |p: &str| Some(("ci".to_string(), p.to_string()));
        let mut l = Ledger::new(Duration::from_secs(600));
        // Placed while project 7 was unknown: a whole A10G (unknownNeed), shown by now.
        let mut unknown = r("ci/unknown", 0, None);
        (unknown.mib, unknown.declared_mib, unknown.shown) = (22016, 0, true);
        unknown.project = project("7");
        // Declared 8 GiB in project 7, placed on a learned 12 GiB, shown.
        let mut declared = r("ci/declared", 0, None);
        (declared.mib, declared.declared_mib, declared.shown) = (12288, 8192, true);
        declared.project = project("7");
        // Still pending, project 7.
        let mut pending = r("ci/pending", 0, None);
        (pending.mib, pending.declared_mib) = (22016, 0);
        pending.project = project("7");
        // Project 8 is not in the table; a pod without the label has no project.
        let mut other = r("ci/other", 0, None);
        (other.mib, other.declared_mib, other.shown) = (22016, 0, true);
        other.project = project("8");
        let mut bare = r("ci/bare", 0, None);
        (bare.mib, bare.declared_mib, bare.shown) = (22016, 0, true);
        for x in [unknown, declared, pending, other, bare] {
            l.nodes.entry("n1".into()).or_default().push(x);
        }
        let learned = LearnedNeeds::from_entries([(
            "ci".to_string(),
            "7".to_string(),
            LearnedNeed {
                mib: 4096,
                jobs: 3,
                floor_mib: 2048,
            },
        )]);
        assert_eq!(l.relearn(&learned), 3);
        let mib =
            |l: &Ledger, pod: &str| l.pending("n1").iter().find(|x| x.pod == pod).map(|x| x.mib);
        assert_eq!(
            mib(&l, "ci/unknown"),
            Some(4096),
            "the whole GPU given back"
        );
        assert_eq!(mib(&l, "ci/pending"), Some(4096));
        // Its declaration (8 GiB) is above the learned 4 GiB: within its declaration the
        // node counts all of it, so the shown reservation ends.
        assert_eq!(mib(&l, "ci/declared"), None);
        assert_eq!(
            mib(&l, "ci/other"),
            Some(22016),
            "a project not learned keeps its need"
        );
        assert_eq!(mib(&l, "ci/bare"), Some(22016));
        assert_eq!(l.relearn(&learned), 0, "nothing changes twice");
        // A table that lost the project (Prometheus gone past maxAge) changes nothing.
        assert_eq!(l.relearn(&LearnedNeeds::default()), 0);
        assert_eq!(mib(&l, "ci/unknown"), Some(4096));
    }
}
