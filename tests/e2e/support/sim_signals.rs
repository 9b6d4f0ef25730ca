//! Stop at decision on the simulator: the stopper's identity checks read the simulated
//! `/proc` the attributor reads (start times, cgroups), and its signals become the
//! simulator's own stop, resume and kill at the clock's now. The simulator's pids are made
//! up and may be real processes of this machine: nothing here signals a real process.

use gpu_warden::act::stop::{NotPermitted, ProcessSignals, Sig, SignalError};
use gpu_warden::attribute::cgroup::parse_proc_cgroup;
use gpu_warden::attribute::procfs::ProcFs;
use gpu_warden::guard::stop::Seen;
use gpu_warden::model::clock::{Clock, ManualClock};
use gpu_warden::model::proc_stat::ProcError;
use gpu_warden::sample::sim::SimHandle;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long a killed process's memory takes to come back by default: the CUDA context's
/// teardown measured on the H200 (docs/guard.md, "Stopping the growth at decision": ≈60 ms).
pub const TEARDOWN: Duration = Duration::from_millis(60);

/// The simulator and its `/proc`, known once the rig that owns them is built, and how long
/// a killed process's memory takes to come back.
#[derive(Clone)]
pub struct SimTarget(Arc<OnceLock<(SimHandle, PathBuf)>>, Arc<AtomicU64>);

impl Default for SimTarget {
    fn default() -> Self {
        let t = SimTarget(Arc::default(), Arc::default());
        t.set_teardown(TEARDOWN);
        t
    }
}

impl SimTarget {
    /// Points the signals at the rig's simulator and `/proc`.
    pub fn set(&self, sim: SimHandle, proc_root: PathBuf) {
        let _ = self.0.set((sim, proc_root));
    }

    /// A SIGKILL's process ends `d` after the signal ([`TEARDOWN`] by default; longer: a
    /// driver tearing down a large CUDA context).
    pub fn set_teardown(&self, d: Duration) {
        self.1.store(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn teardown(&self) -> Duration {
        Duration::from_nanos(self.1.load(Ordering::Relaxed))
    }
}

/// [`ProcessSignals`] on the simulator.
pub struct SimSignals {
    pub target: SimTarget,
    pub clock: Arc<ManualClock>,
}

impl SimSignals {
    fn proc(&self) -> Option<(ProcFs, &SimHandle)> {
        let (sim, root) = self.target.0.get()?;
        Some((ProcFs::new(root), sim))
    }
}

impl ProcessSignals for SimSignals {
    fn seen(&self, pid: u32) -> Result<Seen, ProcError> {
        let Some((proc, _)) = self.proc() else {
            return Err(ProcError::Missing(pid));
        };
        let start_ticks = proc.start_time(pid)?;
        let cgroup = proc.cgroup(pid)?;
        Ok(Seen {
            start_ticks,
            pod_uid: parse_proc_cgroup(&cgroup).map(|id| id.pod_uid),
        })
    }

    fn signal(&self, pid: u32, start_ticks: u64, sig: Sig) -> Result<(), SignalError> {
        let Some((proc, sim)) = self.proc() else {
            return Err(SignalError::Gone(format!("pid {pid}: no simulator")));
        };
        let now = proc
            .start_time(pid)
            .map_err(|e| SignalError::Gone(e.to_string()))?;
        if now != start_ticks {
            return Err(SignalError::NotSame { start_ticks: now });
        }
        let at = self.clock.mono();
        match sig {
            Sig::Stop => sim.stop(&[pid], at),
            Sig::Cont => sim.resume(&[pid]),
            Sig::Kill => sim.kill(&[pid], at + self.target.teardown()),
        }
        Ok(())
    }

    /// Far past every simulated process's start time (`pid × 7 + start ms` ticks), so each
    /// counts as older than any decision.
    fn boot_time(&self) -> Duration {
        Duration::from_secs(1_000_000_000) + self.clock.mono()
    }

    fn permitted(&self) -> Result<(), NotPermitted> {
        Ok(())
    }
}
