//! The sampler: owns the [`GpuSource`] on a dedicated OS thread (NVML calls block), polls it
//! on a fixed cadence and sends what it read to the async side. Between full polls it reads
//! memory alone at the fast interval while the guard asks for it.

use super::{GpuSource, MemoryReading, PollRequest, RawPoll};
use crate::model::clock::Clock;
use crate::model::snapshot::Snapshot;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Cadences of the sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// Full poll interval (`--poll-interval`).
    pub poll: Duration,
    /// How often the expensive per-process utilization call runs (`--process-util-interval`).
    pub process_util: Duration,
    /// How often the slow counters are read (`--slow-counter-interval`).
    pub slow_counters: Duration,
    /// Memory-only interval the fast watch starts at (policy `fastInterval`); the agent
    /// changes it with [`Control::Fast`] as the guard's risk rule asks.
    pub fast: Duration,
}

/// What the sampler sends.
#[derive(Debug, Clone)]
pub enum Sampled {
    /// A full poll, stamped into a snapshot, with how long the poll took. Owned: the agent
    /// attributes its processes before it becomes the shared, immutable `Arc<Snapshot>`.
    Full(Box<Snapshot>, Duration),
    /// A memory-only reading between full polls.
    Memory {
        at: Duration,
        readings: Vec<MemoryReading>,
    },
}

/// Commands to the sampler thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Turn the memory-only fast watch on at this interval, or off (`None`).
    Fast(Option<Duration>),
    /// Poll in full now (the guard saw a trigger on a fast reading).
    PollNow,
    /// Finish and return.
    Stop,
}

/// Turns raw polls into numbered snapshots and carries forward per-process SM utilization
/// between the (less frequent) polls that read it, so the series does not flap.
#[derive(Debug, Default)]
pub struct Stamper {
    seq: u64,
    last_util: HashMap<(u32, u32), f64>,
}

impl Stamper {
    /// Stamps `raw`, taken at monotonic `at` and wall time `wall`.
    pub fn stamp(
        &mut self,
        mut raw: RawPoll,
        at: Duration,
        wall: std::time::SystemTime,
    ) -> Snapshot {
        self.seq += 1;
        let had_util = raw.processes.iter().any(|p| p.sm_util.is_some());
        if had_util {
            self.last_util = raw
                .processes
                .iter()
                .filter_map(|p| p.sm_util.map(|u| ((p.gpu, p.pid), u)))
                .collect();
        } else {
            for p in &mut raw.processes {
                p.sm_util = self.last_util.get(&(p.gpu, p.pid)).copied();
            }
            // Forget processes that are gone so a reused pid does not inherit a figure.
            let alive: std::collections::HashSet<(u32, u32)> =
                raw.processes.iter().map(|p| (p.gpu, p.pid)).collect();
            self.last_util.retain(|k, _| alive.contains(k));
        }
        Snapshot {
            seq: self.seq,
            at,
            wall,
            driver_version: raw.driver_version,
            cuda_driver_version: raw.cuda_driver_version,
            gpus: raw.gpus,
            processes: raw.processes,
            util_fresh: had_util,
            errors: raw.errors,
        }
    }
}

/// Runs the poll loop on the current thread until [`Control::Stop`] arrives or the
/// receiving side hangs up. `send` returns false when nobody listens any more.
pub fn run_loop(
    source: &mut dyn GpuSource,
    clock: &dyn Clock,
    cadence: Cadence,
    control: &Receiver<Control>,
    mut send: impl FnMut(Sampled) -> bool,
) {
    let mut stamper = Stamper::default();
    let mut fast: Option<Duration> = None;
    let mut next_full = clock.mono();
    let mut next_util = next_full;
    let mut next_slow = next_full;
    let mut next_fast = next_full + cadence.fast;
    let mut last_fast = next_full;
    loop {
        let now = clock.mono();
        if now >= next_full {
            let req = PollRequest {
                process_utilization: now >= next_util,
                slow_counters: now >= next_slow,
            };
            if req.process_utilization {
                next_util = now + cadence.process_util;
            }
            if req.slow_counters {
                next_slow = now + cadence.slow_counters;
            }
            let started = clock.mono();
            let raw = source.poll(now, req);
            let took = clock.mono().saturating_sub(started);
            let snap = stamper.stamp(raw, now, clock.wall());
            if !send(Sampled::Full(Box::new(snap), took)) {
                return;
            }
            // Keep a fixed rate; after a long stall skip missed ticks instead of bursting.
            next_full += cadence.poll;
            if next_full <= clock.mono() {
                next_full = clock.mono() + cadence.poll;
            }
            last_fast = now;
            next_fast = now + fast.unwrap_or(cadence.fast);
        } else if let Some(every) = fast.filter(|_| now >= next_fast) {
            let readings = source.memory(now);
            if !send(Sampled::Memory { at: now, readings }) {
                return;
            }
            last_fast = now;
            next_fast = now + every;
        }
        let now = clock.mono();
        let wake = match fast {
            Some(_) => next_full.min(next_fast),
            None => next_full,
        };
        match control.recv_timeout(wake.saturating_sub(now)) {
            Ok(Control::Fast(every)) => {
                // Switched on: read at once. A new interval counts from the last read, so
                // a shorter one takes effect now instead of after the old one runs out.
                next_fast = match (fast, every) {
                    (None, Some(_)) => clock.mono(),
                    (_, Some(e)) => last_fast + e,
                    (_, None) => next_fast,
                };
                fast = every;
            }
            Ok(Control::PollNow) => next_full = clock.mono(),
            Ok(Control::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// The running sampler thread.
pub struct Sampler {
    control: Sender<Control>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts polling `source` on its own thread; readings go to `tx`.
    pub fn spawn(
        mut source: Box<dyn GpuSource>,
        clock: Arc<dyn Clock>,
        cadence: Cadence,
        tx: tokio::sync::mpsc::Sender<Sampled>,
    ) -> std::io::Result<Sampler> {
        let (control, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("sampler-{}", source.name()))
            .spawn(move || {
                run_loop(source.as_mut(), clock.as_ref(), cadence, &rx, |s| {
                    tx.blocking_send(s).is_ok()
                })
            })?;
        Ok(Sampler {
            control,
            thread: Some(thread),
        })
    }

    /// Turns the fast memory watch on at `every`, or off with `None`.
    pub fn set_fast(&self, every: Option<Duration>) {
        let _ = self.control.send(Control::Fast(every));
    }

    /// Asks for a full poll now instead of at the next tick.
    pub fn poll_now(&self) {
        let _ = self.control.send(Control::PollNow);
    }

    /// Stops the thread and waits for it (a poll in progress finishes first).
    pub fn stop(mut self) {
        let _ = self.control.send(Control::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::clock::SystemClock;
    use crate::sample::scenario::Scenario;
    use crate::sample::sim::SimSource;

    fn sim() -> SimSource {
        SimSource::new(
            Scenario::parse(
                "gpus:\n  - {model: X, memory_mib: 100}\nprocesses:\n  - {pid: 5, gpu: 0, memory: {constant: 10}, sm_util: 0.25}\n",
                "t",
            )
            .unwrap(),
        )
    }

    #[test]
    fn stamper_numbers_and_carries_utilization() {
        let mut src = sim();
        let mut st = Stamper::default();
        let with = PollRequest {
            process_utilization: true,
            slow_counters: true,
        };
        let without = PollRequest {
            process_utilization: false,
            slow_counters: true,
        };
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let a = st.stamp(src.poll(Duration::ZERO, with), Duration::ZERO, t0);
        let b = st.stamp(
            src.poll(Duration::from_secs(1), without),
            Duration::from_secs(1),
            t0,
        );
        assert_eq!((a.seq, b.seq), (1, 2));
        assert_eq!(b.processes[0].sm_util, Some(0.25));
    }

    #[test]
    fn loop_polls_and_runs_fast_watch_on_request() {
        let mut src = sim();
        let clock = SystemClock::new();
        let cadence = Cadence {
            poll: Duration::from_millis(200),
            process_util: Duration::from_millis(200),
            slow_counters: Duration::from_millis(200),
            fast: Duration::from_millis(20),
        };
        let (ctl_tx, ctl_rx) = std::sync::mpsc::channel();
        ctl_tx.send(Control::Fast(Some(cadence.fast))).unwrap();
        let mut full = 0;
        let mut mem = 0;
        run_loop(&mut src, &clock, cadence, &ctl_rx, |s| {
            match s {
                Sampled::Full(..) => full += 1,
                Sampled::Memory { .. } => mem += 1,
            }
            full < 3
        });
        assert_eq!(full, 3);
        assert!(mem >= 5, "fast watch produced {mem} memory readings");
    }

    #[test]
    fn the_fast_interval_follows_control_and_switches_off() {
        let mut src = sim();
        let clock = SystemClock::new();
        let cadence = Cadence {
            poll: Duration::from_millis(300),
            process_util: Duration::from_secs(1),
            slow_counters: Duration::from_secs(1),
            fast: Duration::from_millis(100),
        };
        let (ctl_tx, ctl_rx) = std::sync::mpsc::channel();
        ctl_tx
            .send(Control::Fast(Some(Duration::from_millis(5))))
            .unwrap();
        let (mut full, mut mem_fast, mut mem_off) = (0, 0, 0);
        run_loop(&mut src, &clock, cadence, &ctl_rx, |s| {
            match s {
                Sampled::Full(..) => {
                    full += 1;
                    if full == 2 {
                        // After the second poll the watch goes off.
                        let _ = ctl_tx.send(Control::Fast(None));
                    }
                }
                Sampled::Memory { .. } if full < 2 => mem_fast += 1,
                Sampled::Memory { .. } => mem_off += 1,
            }
            full < 4
        });
        // 300 ms at 5 ms is about 60 reads; at the 100 ms cadence it would be 3.
        assert!(
            mem_fast >= 20,
            "{mem_fast} fast reads in the first poll interval"
        );
        assert!(mem_off <= 1, "{mem_off} reads after the watch went off");
    }

    #[test]
    fn stop_ends_the_thread() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let cadence = Cadence {
            poll: Duration::from_millis(50),
            process_util: Duration::from_secs(1),
            slow_counters: Duration::from_secs(1),
            fast: Duration::from_millis(10),
        };
        let s = Sampler::spawn(Box::new(sim()), Arc::new(SystemClock::new()), cadence, tx).unwrap();
        assert!(matches!(rx.blocking_recv(), Some(Sampled::Full(..))));
        s.stop();
    }
}
