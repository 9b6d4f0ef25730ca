//! The reservation ledger: pods this scheduler bound to a node recently whose memory the
//! node's annotations do not show yet. Without it, a burst of pods would all be placed on
//! the same free figure before the agent's next patch.
//!
//! A reservation ends when the node's annotations show the pod — an observation made after
//! the binding whose replicas-allocated total has grown past the reservation's baseline
//! (the kubelet has allocated it, so its declared MiB is in `declaredMiB`) — or after a TTL
//! (nodes without pod-resources data: the pod's use shows only once it allocates), or when
//! the pod is deleted. Pure: time is handed in.

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
    /// The node's replicas-allocated total when it was made, when known.
    pub baseline: Option<u32>,
}

/// Why a reservation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The node's annotations account for it.
    Shown,
    /// Its TTL ran out.
    Expired,
}

/// Reservations by node, each node's in the order they were made.
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

    /// Ends the reservations on `node` that `state` shows or whose TTL ran out at `now`;
    /// returns what ended, in order.
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
        for mut r in list.drain(..) {
            if now.saturating_sub(r.at) >= self.ttl {
                ended.push((r, Release::Expired));
                continue;
            }
            r.baseline = r.baseline.map(|b| b + bump);
            // The k-th still-pending reservation is shown once k more replicas are out than
            // when it was made, in an observation taken after it.
            let position = kept.len() as u32 + 1;
            let shown = match (allocated, r.baseline, observed_at) {
                (Some(a), Some(b), Some(t)) => t >= r.at_wall && a >= b + position,
                _ => false,
            };
            if shown {
                bump += 1;
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

    /// Ends every reservation whose TTL ran out (nodes that vanished from the cache too).
    pub fn expire(&mut self, now: Duration) -> usize {
        let ttl = self.ttl;
        let mut n = 0;
        for list in self.nodes.values_mut() {
            let before = list.len();
            list.retain(|r| now.saturating_sub(r.at) < ttl);
            n += before - list.len();
        }
        self.nodes.retain(|_, l| !l.is_empty());
        n
    }

    /// The pending reservations on `node`, oldest first.
    pub fn pending(&self, node: &str) -> &[Reservation] {
        self.nodes.get(node).map(Vec::as_slice).unwrap_or(&[])
    }

    /// How many reservations are pending in all.
    pub fn len(&self) -> usize {
        self.nodes.values().map(Vec::len).sum()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
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
    fn without_replica_data_only_the_ttl_ends_it() {
        let mut l = Ledger::new(Duration::from_secs(60));
        l.reserve("n1", r("ci/a", 0, None));
        let plain = node(vec![gpu(0, 100, 20000, None)], None);
        assert!(l.settle("n1", &plain, Duration::from_secs(59)).is_empty());
        let ended = l.settle("n1", &plain, Duration::from_secs(60));
        assert_eq!(ended[0].1, Release::Expired);
    }
}
