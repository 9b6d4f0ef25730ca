//! The shell behind [`ProcessSource`]: reads the agent's own process through sysinfo,
//! refreshing this one process and only the fields the families need (memory and CPU
//! times; the descriptor count and limit are read on demand). sysinfo still lists `/proc`
//! to find the pid, so a read grows with the node's process count; without `tasks` it does
//! not also list every process's threads, which made a read about five times dearer
//! (docs/performance.md has the figures).

use super::process_metrics::{ProcessFacts, ProcessSource};
use std::sync::Mutex;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// Reads the current process. Concurrent scrapes take turns on one `System`.
pub struct SelfProcess {
    pid: Pid,
    system: Mutex<System>,
}

impl SelfProcess {
    /// A reader of the calling process; `None` where the platform has no process id for it.
    pub fn new() -> Option<SelfProcess> {
        let pid = sysinfo::get_current_pid().ok()?;
        Some(SelfProcess {
            pid,
            system: Mutex::new(System::new()),
        })
    }
}

impl ProcessSource for SelfProcess {
    fn read(&self) -> Option<ProcessFacts> {
        // A scrape that panicked mid-read leaves nothing half-written that matters: the
        // next refresh overwrites every field read here.
        let mut sys = self
            .system
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let pids = [self.pid];
        let kind = ProcessRefreshKind::nothing()
            .without_tasks()
            .with_memory()
            .with_cpu();
        if sys.refresh_processes_specifics(ProcessesToUpdate::Some(&pids), true, kind) == 0 {
            return None;
        }
        let p = sys.process(self.pid)?;
        Some(ProcessFacts {
            cpu_seconds: p.accumulated_cpu_time() as f64 / 1000.0,
            open_fds: p.open_files().map(|n| n as u64),
            max_fds: p.open_files_limit().map(|n| n as u64),
            resident_bytes: p.memory(),
            start_time_seconds: p.start_time(),
            virtual_bytes: p.virtual_memory(),
        })
    }
}
