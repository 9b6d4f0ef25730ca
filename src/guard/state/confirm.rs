//! The fresh read that ends a doubt as "not carried out": an eviction in doubt whose pod
//! still looks alive in the view after `inDoubtTimeout` of the server answering is read
//! afresh, and only a read showing it running (same UID, no deletion timestamp, not
//! finished) ends the doubt that way. Why: the view can lag (a watch that drops events keeps
//! showing a pod the eviction already took until the next relist), and ending a doubt as
//! "not carried out" lets the guard evict the next pod — two for one if the view was wrong.

use super::Guard;
use crate::guard::ports::{ConfirmRequest, Confirmation};
use crate::guard::rank::Victim;
use std::collections::HashMap;
use std::time::Duration;

/// How long after an unanswered (or failed) fresh read of a pod in doubt it is asked again.
pub const CONFIRM_RETRY: Duration = Duration::from_secs(2);

/// The fresh reads asked for and their answers, by (decision, pod UID).
#[derive(Debug, Default, Clone)]
pub(super) struct Confirms {
    asked: HashMap<(u64, String), Duration>,
    answers: HashMap<(u64, String), Confirmation>,
    requests: Vec<ConfirmRequest>,
}

impl Confirms {
    /// The answer for the pod in doubt, if one came.
    pub(super) fn answer(&self, decision_id: u64, uid: &str) -> Option<&Confirmation> {
        self.answers.get(&(decision_id, uid.to_string()))
    }

    /// Asks for a fresh read of `victim` unless one was asked within [`CONFIRM_RETRY`].
    pub(super) fn ask(&mut self, decision_id: u64, victim: &Victim, now: Duration) {
        let key = (decision_id, victim.uid.clone());
        if self
            .asked
            .get(&key)
            .is_some_and(|at| now.saturating_sub(*at) < CONFIRM_RETRY)
        {
            return;
        }
        self.asked.insert(key, now);
        self.requests.push(ConfirmRequest {
            decision_id,
            uid: victim.uid.clone(),
            namespace: victim.namespace.clone(),
            name: victim.name.clone(),
        });
    }

    /// The doubt is resolved: nothing more to ask or remember.
    pub(super) fn forget(&mut self, decision_id: u64, uid: &str) {
        let key = (decision_id, uid.to_string());
        self.asked.remove(&key);
        self.answers.remove(&key);
        self.requests
            .retain(|r| (r.decision_id, r.uid.as_str()) != (decision_id, uid));
    }
}

impl Guard {
    /// The fresh reads of pods in doubt the guard wants; the caller reads each and reports
    /// with [`Guard::record_confirmation`].
    pub fn take_confirm_requests(&mut self) -> Vec<ConfirmRequest> {
        std::mem::take(&mut self.doubts.confirms.requests)
    }

    /// What the fresh read of a pod in doubt showed. A running pod ends the doubt as not
    /// carried out, a gone one as carried out (both at once, on the last full poll); an
    /// unknown answer leaves it in doubt and the read is asked again after [`CONFIRM_RETRY`].
    pub fn record_confirmation(
        &mut self,
        decision_id: u64,
        uid: &str,
        confirmation: Confirmation,
        now: Duration,
    ) {
        if !matches!(confirmation, Confirmation::Unknown(_)) {
            self.doubts
                .confirms
                .answers
                .insert((decision_id, uid.to_string()), confirmation);
        }
        let processes = self.seen.snapshot.clone();
        let pods = self.seen.pods.clone();
        let fresh_view = self.trust.hold.is_none();
        let indices: Vec<u32> = self.gpus.keys().copied().collect();
        for index in indices {
            self.resolve_doubt(
                index,
                processes.as_ref().map_or(&[][..], |s| &s.processes[..]),
                &pods,
                fresh_view,
                now,
            );
        }
    }
}
