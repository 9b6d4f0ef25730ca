//! The signalling shell of stop-at-decision: reads `/proc/<pid>/{stat,cgroup}` under the
//! proc root, and sends SIGSTOP, SIGCONT or SIGKILL to exactly the process it verified.
//!
//! A pid is only a name that the kernel may give to another process as soon as the first
//! exits. So each signal goes through a pidfd (`pidfd_open`, Linux 5.3): the pidfd is
//! opened first, the start time read *after* it, and the signal sent through it. If the
//! process that held the pid when the pidfd was opened had exited and the pid been reused
//! before the read, the start time differs and nothing is sent; if it exits after, the
//! pidfd still names it and the signal fails with ESRCH. No window is left in which a
//! verified pid reaches another process.
//!
//! Permission: signalling another user's process needs CAP_KILL (docs/deploy.md,
//! "The permission to stop a victim's processes"); the agent reads its own effective set at
//! start and, without it, evicts only.

use crate::act::stop::{NotPermitted, ProcessSignals, Sig, SignalError};
use crate::attribute::cgroup::parse_proc_cgroup;
use crate::attribute::procfs::ProcFs;
use crate::guard::stop::Seen;
use crate::model::proc_stat::ProcError;
use rustix::io::Errno;
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use std::path::Path;
use std::time::Duration;

/// CAP_KILL's bit in the capability sets (linux/capability.h).
const CAP_KILL: u32 = 5;

/// Signals real processes, reading their identity under `proc`.
#[derive(Debug, Clone)]
pub struct ProcSignals {
    proc: ProcFs,
    /// Whether `proc` describes the processes of the agent's own PID namespace.
    own: bool,
}

impl ProcSignals {
    /// Reads identities under `proc`. A signal goes to a pid of the agent's own PID
    /// namespace, so unless `proc` is that namespace's `/proc` (with `hostPID: true`, the
    /// host's) the identities it reads say nothing about the process a signal would reach:
    /// a host `/proc` mounted elsewhere, or the simulator's proc tree of made-up pids. Then
    /// nothing is signalled ([`ProcessSignals::permitted`] says why).
    pub fn new(proc: ProcFs) -> Self {
        let own = same_dir(proc.root(), Path::new("/proc"));
        ProcSignals { proc, own }
    }

    /// Trusts `proc` to describe the processes of this PID namespace although it is not
    /// `/proc`: for tests whose proc tree holds copies of real processes' entries.
    #[must_use]
    pub fn trusting_proc_root(mut self) -> Self {
        self.own = true;
        self
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

impl ProcessSignals for ProcSignals {
    fn seen(&self, pid: u32) -> Result<Seen, ProcError> {
        let start_ticks = self.proc.start_time(pid)?;
        let cgroup = self.proc.cgroup(pid)?;
        Ok(Seen {
            start_ticks,
            pod_uid: parse_proc_cgroup(&cgroup).map(|id| id.pod_uid),
        })
    }

    fn signal(&self, pid: u32, start_ticks: u64, sig: Sig) -> Result<(), SignalError> {
        let raw = i32::try_from(pid).ok().and_then(Pid::from_raw);
        let Some(raw) = raw else {
            return Err(SignalError::Gone(format!("pid {pid} is not a process id")));
        };
        let fd = pidfd_open(raw, PidfdFlags::empty()).map_err(|e| errno(e, pid))?;
        // Read after the pidfd exists: if this is still the verified process, the pidfd
        // names it (see the module documentation).
        let now = self
            .proc
            .start_time(pid)
            .map_err(|e| SignalError::Gone(e.to_string()))?;
        if now != start_ticks {
            return Err(SignalError::NotSame { start_ticks: now });
        }
        let signal = match sig {
            Sig::Stop => Signal::STOP,
            Sig::Cont => Signal::CONT,
            Sig::Kill => Signal::KILL,
        };
        pidfd_send_signal(&fd, signal).map_err(|e| errno(e, pid))
    }

    fn boot_time(&self) -> Duration {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Duration::new(
            t.tv_sec.max(0) as u64,
            t.tv_nsec.clamp(0, 999_999_999) as u32,
        )
    }

    fn permitted(&self) -> Result<(), NotPermitted> {
        if !self.own {
            return Err(NotPermitted::ForeignProcRoot(
                self.proc.root().to_path_buf(),
            ));
        }
        let status =
            std::fs::read_to_string("/proc/self/status").map_err(NotPermitted::OwnStatus)?;
        match has_cap(&status, CAP_KILL) {
            Some(true) => Ok(()),
            Some(false) => Err(NotPermitted::NoCapKill),
            None => Err(NotPermitted::NoCapEff),
        }
    }
}

fn errno(e: Errno, pid: u32) -> SignalError {
    match e {
        Errno::SRCH => SignalError::Gone(format!("pid {pid} exited")),
        Errno::PERM | Errno::ACCESS => SignalError::Denied(format!("pid {pid}: {e}")),
        other => SignalError::Other(format!("pid {pid}: {other}")),
    }
}

/// Whether capability `bit` is in the `CapEff` mask of a `/proc/<pid>/status` text; None
/// when the line is missing or not hex.
pub fn has_cap(status: &str, bit: u32) -> Option<bool> {
    let line = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    let mask = u64::from_str_radix(line.trim(), 16).ok()?;
    Some(mask & (1 << bit) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_namespaces_proc_is_trusted() {
        let dir = std::env::temp_dir();
        let other = ProcSignals::new(ProcFs::new(&dir));
        let err = other.permitted().unwrap_err().to_string();
        assert!(err.contains("is not this PID namespace's /proc"), "{err}");
        assert!(ProcSignals::new(ProcFs::new("/proc")).own);
        assert!(ProcSignals::new(ProcFs::new("/proc/")).own);
        assert!(ProcSignals::new(ProcFs::new(&dir)).trusting_proc_root().own);
    }

    #[test]
    fn cap_kill_is_read_from_the_effective_set() {
        let root = "Name:\tgpu-warden\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000020\nCapEff:\t0000000000000020\nCapBnd:\t0000000000000020\n";
        let none = "CapPrm:\t0000000000000020\nCapEff:\t0000000000000000\n";
        let all = "CapEff:\t000001ffffffffff\n";
        assert_eq!(has_cap(root, CAP_KILL), Some(true));
        assert_eq!(
            has_cap(none, CAP_KILL),
            Some(false),
            "permitted is not enough"
        );
        assert_eq!(has_cap(all, CAP_KILL), Some(true));
        assert_eq!(has_cap("Name: x\n", CAP_KILL), None);
        assert_eq!(has_cap("CapEff:\tzz\n", CAP_KILL), None);
    }
}
