//! Replicas left idle while jobs wait: where a policy's throughput goes at saturation. Each
//! step after the warm-up, with jobs queued, every GPU replica no job holds is counted, and
//! of those the ones on a GPU where the extender's own view (the node's last published
//! figures less what it counts as committed there, `extender::judge::committed`, and the
//! margin) leaves less than 4 GiB — a typical job's learned need (its project's p95, 2.5
//! GiB peaks rounded up to their 4 GiB bucket) — so no typical job may go there; and the
//! ones the extender counts as taken (the node's last figures' replicas out plus the
//! ledger's pods not shown yet leave none): its view behind the kubelet's.

use crate::engine::Engine;
use gpu_warden_extender::judge::committed;
use gpu_warden_extender::nodes::NodeState;

/// Room below which a replica counts as idle for want of room, MiB.
const TYPICAL_NEED_MIB: i64 = 4096;

/// The counts of one run.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdleCount {
    replica_steps: u64,
    idle: u64,
    short_of_room: u64,
    counted_taken: u64,
}

impl IdleCount {
    /// Idle replica-steps as a share of all replica-steps counted.
    pub(crate) fn share(&self) -> f64 {
        self.idle as f64 / self.replica_steps.max(1) as f64
    }

    /// Those idle for want of room, as a share of all replica-steps counted.
    pub(crate) fn short_of_room_share(&self) -> f64 {
        self.short_of_room as f64 / self.replica_steps.max(1) as f64
    }

    /// Those the extender counts as taken, as a share of all replica-steps counted.
    pub(crate) fn counted_taken_share(&self) -> f64 {
        self.counted_taken as f64 / self.replica_steps.max(1) as f64
    }
}

impl Engine<'_> {
    /// Counts this step's idle replicas (after the scheduler's turn).
    pub(crate) fn count_idle(&mut self, t: u64) {
        if t < self.sc.warmup_s || self.queue.is_empty() {
            return;
        }
        let margin = self.extender.judge.margin_mib as i64;
        let mut c = self.idle;
        for n in &self.nodes {
            let shown = match n.state.as_deref() {
                Some(NodeState::Known(v)) => Some(v),
                _ => None,
            };
            let pending = self.ledger.pending(&n.name);
            for g in &n.gpus {
                let free = (self.replicas as usize).saturating_sub(g.runs.len()) as u64;
                c.replica_steps += self.replicas as u64;
                c.idle += free;
                let Some(f) = shown.and_then(|v| v.gpus.iter().find(|f| f.uuid == g.uuid)) else {
                    continue;
                };
                let committed = committed(f, pending, &self.extender.judge);
                let room = f.free_mib as i64 - committed as i64 - margin;
                if room < TYPICAL_NEED_MIB {
                    c.short_of_room += free;
                }
                let waiting = pending
                    .iter()
                    .filter(|r| !r.shown && r.gpu.as_ref().is_none_or(|u| *u == f.uuid))
                    .count() as u32;
                let out = f.replicas_allocated.unwrap_or(0) + waiting;
                if f.replicas_allocatable.is_some_and(|a| out >= a) {
                    c.counted_taken += free;
                }
            }
        }
        self.idle = c;
    }
}
