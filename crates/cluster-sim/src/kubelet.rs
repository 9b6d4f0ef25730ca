//! The guard's action and the kubelet's, on one victim, as docs/guard.md describes them and
//! the API double's faithful kubelet plays them: the eviction reaches the node after a watch
//! latency (50 ms, inside a step); the container's PID 1 — a GitLab job's shell, which
//! ignores SIGTERM — gets SIGTERM; every process of the pod gets SIGKILL at
//! `max(grace, 2 s)` (kubelet's `killContainer` floors the grace at
//! `minimumGracePeriodInSeconds = 2`). Until then an evicted job keeps its memory and,
//! unless the guard stopped it, keeps allocating. `onDecision: stop` halts it at once and
//! kills it once the eviction is accepted (at once here: the simulated API server refuses
//! nothing), `kill` kills it before the eviction: either gives the memory back ≈60 ms after
//! the decision, i.e. by the next step. Only `evict` leaves it to the kubelet's SIGKILL.

use crate::engine::Engine;
use crate::outcome::EventKind;
use crate::scenario::OnDecision;

/// The kubelet's floor on every grace period (`minimumGracePeriodInSeconds`).
pub const MIN_GRACE_S: u64 = 2;

/// A victim is counted as growing when its allocations (its workspace aside) rose within
/// this many seconds of its progress before the decision, or it started within them (new
/// on the GPU, it grew from nothing): two of the guard's 5 s horizons. Any other victim is
/// a bystander — the eviction issue 38 is about.
pub const GROWING_WINDOW_S: f64 = 10.0;

impl Engine<'_> {
    /// Carries out the guard's decision on run `id` at `t`.
    pub(crate) fn act_on_victim(&mut self, id: u64, t: u64) {
        let grace = self.sc.eviction_grace_s.max(MIN_GRACE_S);
        let step = self.sc.step_s.max(1);
        let on = self.sc.on_decision;
        let Some(r) = self.runs.get_mut(&id) else {
            return;
        };
        if r.evicted_at_s.is_some() {
            return;
        }
        r.evicted_at_s = Some(t);
        r.info.terminating = true;
        let (stopped, release) = match on {
            OnDecision::Evict => (false, t + grace),
            OnDecision::Stop | OnDecision::Kill => (true, t + step),
        };
        r.stopped = stopped;
        r.release_at_s = Some(release);
        let job = r.job;
        let (progress, used) = (r.progress_s, r.used_mib);
        let j = &self.jobs[job];
        let growing = progress <= GROWING_WINDOW_S
            || j.base_mib_at(progress) > j.base_mib_at(progress - GROWING_WINDOW_S);
        if !growing {
            self.out.evicted_not_growing += 1;
            if j.declared_mib.is_some_and(|d| used <= d) {
                self.out.evicted_not_growing_within_declared += 1;
            }
        }
        self.out.evictions += 1;
        self.event(t, job, EventKind::Evicted);
    }
}
