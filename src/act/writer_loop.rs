//! The one loop of the agent's two figure writers, the Node's annotator
//! (`src/act/node_annotations.rs`) and the Lease (`src/act/lease.rs`): when to ask the
//! annotation planner, when to wake without a new publication, how to back off after a
//! failed write, and how the task is stopped. The writers supply only what differs: the
//! request, their logs and metrics, an extra wake-up (the Lease's carried guard state) and
//! what they do at shutdown. A retry or wake-up fix is made here, once, for both.
//!
//! The task owns nothing the agent loop waits for: publications come through a `watch`
//! channel that never blocks its sender, so metrics and the guard keep working while the
//! API server is slow or down.

use crate::model::backoff::Backoff;
use crate::model::clock::Clock;
use crate::publish::annotations::{AnnotationPatch, AnnotationPlanner};
use crate::publish::state::Published;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// What one writer does that the other does not.
pub(crate) trait Writer: Send {
    /// Why a write did not go through.
    type Error: Send;
    /// What the task returns once [`finish`](Self::finish) is done.
    type Done: Send + 'static;

    /// Writes what is owed now: `patch` is what the planner planned, if anything. `None`:
    /// nothing to write (no request was made).
    fn write(
        &mut self,
        patch: Option<&AnnotationPatch>,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send;

    /// A write went through; `failures` failed before it (0: none since the last success).
    fn succeeded(&mut self, patch: Option<&AnnotationPatch>, failures: u64);

    /// A write failed, the `failures`-th in a row; the next attempt waits `retry_in`.
    fn failed(
        &mut self,
        patch: Option<&AnnotationPatch>,
        error: Self::Error,
        failures: u64,
        retry_in: Duration,
    );

    /// Resolves when something besides a publication may make a write owed (never, unless
    /// the writer says otherwise).
    fn woken(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }

    /// At shutdown, after the last write (a write in flight is abandoned).
    fn finish(self) -> impl Future<Output = Self::Done> + Send;
}

/// When the next write may go and when to wake without a publication. Pure: times are the
/// injected clock's monotonic time.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    backoff: Backoff,
    /// No write before this, after a failure.
    retry_at: Option<Duration>,
    failures: u64,
    /// Wake this long after the last confirmed write even without a publication (the
    /// Lease's renewal; the planner still decides whether a write is owed then).
    renew_every: Option<Duration>,
}

impl Schedule {
    /// No failures yet.
    pub(crate) fn new(backoff: Backoff, renew_every: Option<Duration>) -> Self {
        Schedule {
            backoff,
            retry_at: None,
            failures: 0,
            renew_every,
        }
    }

    /// Whether a write may go at `now` (false while a failure's pause lasts).
    pub(crate) fn may_write(&mut self, now: Duration) -> bool {
        match self.retry_at {
            Some(t) if now < t => false,
            _ => {
                self.retry_at = None;
                true
            }
        }
    }

    /// A write went through: the backoff starts over. Returns the failures before it.
    pub(crate) fn succeeded(&mut self) -> u64 {
        self.backoff.reset();
        std::mem::take(&mut self.failures)
    }

    /// A write failed at `now`: the pause before the next one, and how many failed in a row.
    pub(crate) fn failed(&mut self, now: Duration) -> (Duration, u64) {
        self.failures += 1;
        let delay = self.backoff.next_delay();
        self.retry_at = Some(now + delay);
        (delay, self.failures)
    }

    /// How long to sleep at `now` before asking the planner again without a publication:
    /// the end of a failure's pause, a change the planner holds back (`due`), or the
    /// renewal after the last confirmed write (`last_success`). An instant already past
    /// does not count: the step just taken saw it, and waking at once for it again would
    /// spin (a renewal with nothing newer to write waits for the next publication).
    pub(crate) fn next_wake(
        &self,
        now: Duration,
        due: Option<Duration>,
        last_success: Option<Duration>,
    ) -> Option<Duration> {
        let renewal = last_success.zip(self.renew_every).map(|(t, r)| t + r);
        [self.retry_at, due, renewal]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min()
            .map(|t| t - now)
    }
}

/// Different per object and per start, so nodes restarted together do not retry together.
pub(crate) fn jitter_seed(clock: &dyn Clock, parts: &[&str]) -> u64 {
    let nanos = clock
        .wall()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ crate::model::ids::fnv64(parts)
}

/// One writer's task: the planner, the publications it plans from and the schedule.
pub(crate) struct WriterLoop<W> {
    pub(crate) writer: W,
    pub(crate) planner: AnnotationPlanner,
    pub(crate) published: watch::Receiver<Option<Arc<Published>>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) schedule: Schedule,
}

/// A running writer: stopped through [`stop`](Self::stop).
pub(crate) struct Running<D> {
    stop: oneshot::Sender<()>,
    task: JoinHandle<D>,
    /// What the writer's `finish` may take.
    limit: Duration,
}

/// Why a writer's task did not end as asked.
#[derive(Debug)]
pub(crate) enum NotStopped {
    /// It panicked (the text says how).
    Failed(String),
    /// It was still running after its limit and a grace; it was aborted.
    Late(Duration),
}

impl<D: Send + 'static> Running<D> {
    /// Spawns `writer_loop` on the current tokio runtime; `limit` bounds its `finish`.
    pub(crate) fn spawn<W>(writer_loop: WriterLoop<W>, limit: Duration) -> Self
    where
        W: Writer<Done = D> + 'static,
    {
        let (stop, stop_rx) = oneshot::channel();
        Running {
            stop,
            task: tokio::spawn(writer_loop.run(stop_rx)),
            limit,
        }
    }

    /// Stops the task and waits for its `finish`, at most the limit and half a second.
    pub(crate) fn stop(self) -> impl Future<Output = Result<D, NotStopped>> + Send + 'static {
        let Running { stop, task, limit } = self;
        async move {
            let _ = stop.send(());
            let abort = task.abort_handle();
            let grace = limit + Duration::from_millis(500);
            match tokio::time::timeout(grace, task).await {
                Ok(Ok(done)) => Ok(done),
                Ok(Err(join)) => Err(NotStopped::Failed(join.to_string())),
                Err(_) => {
                    abort.abort();
                    Err(NotStopped::Late(grace))
                }
            }
        }
    }
}

impl<W: Writer> WriterLoop<W> {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) -> W::Done {
        // Steps first: a publication made before the task started is not "changed" for
        // the receiver.
        let mut feed_open = true;
        loop {
            // A write in flight is abandoned at shutdown: the writer's `finish` supersedes it.
            tokio::select! {
                biased;
                _ = &mut stop => break,
                _ = self.step() => {}
            }
            let wake = self.schedule.next_wake(
                self.clock.mono(),
                self.planner.next_due(),
                self.planner.last_success(),
            );
            tokio::select! {
                biased;
                _ = &mut stop => break,
                changed = self.published.changed(), if feed_open => {
                    if changed.is_err() {
                        tracing::debug!("publications ended; the writer waits for shutdown");
                        feed_open = false;
                    }
                }
                _ = self.writer.woken() => {}
                _ = sleep_for(wake), if wake.is_some() => {}
            }
        }
        self.writer.finish().await
    }

    async fn step(&mut self) {
        let now = self.clock.mono();
        if !self.schedule.may_write(now) {
            return;
        }
        let latest = self.published.borrow_and_update().clone();
        let patch = latest.and_then(|p| {
            self.planner
                .plan_with_replicas(&p.snapshot, &p.pressure, p.replicas.as_deref(), now)
        });
        let Some(result) = self.writer.write(patch.as_ref()).await else {
            return;
        };
        let now = self.clock.mono();
        match result {
            Ok(()) => {
                if patch.is_some() {
                    self.planner.patch_succeeded(now);
                }
                let failures = self.schedule.succeeded();
                self.writer.succeeded(patch.as_ref(), failures);
            }
            Err(e) => {
                if patch.is_some() {
                    self.planner.patch_failed(now);
                }
                let (delay, failures) = self.schedule.failed(now);
                self.writer.failed(patch.as_ref(), e, failures, delay);
            }
        }
    }
}

async fn sleep_for(d: Option<Duration>) {
    if let Some(d) = d {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::clock::{ManualClock, SystemClock};
    use crate::model::snapshot::Snapshot;
    use crate::publish::annotations::AnnotationConfig;
    use crate::testkit::fixtures::{gpu, snap};
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// The backoff doubles from 1 s to 8 s with jitter in the upper half of each base, no
    /// write goes before its pause ends, and a success starts it over.
    #[test]
    fn failures_back_off_and_a_success_starts_over() {
        let clock = ManualClock::new(UNIX_EPOCH);
        let mut sched = Schedule::new(Backoff::new(s(1), s(8), 42), None);
        assert!(sched.may_write(clock.mono()));
        for (n, base) in [1u64, 2, 4, 8, 8].into_iter().enumerate() {
            let now = clock.mono();
            let (delay, failures) = sched.failed(now);
            assert_eq!(failures, n as u64 + 1);
            assert!(
                delay >= s(base) / 2 && delay <= s(base),
                "{delay:?}, base {base}s"
            );
            assert_eq!(sched.next_wake(now, None, None), Some(delay));
            clock.advance(delay - Duration::from_millis(1));
            assert!(!sched.may_write(clock.mono()), "before the pause ends");
            clock.advance(Duration::from_millis(1));
            assert!(sched.may_write(clock.mono()), "when it ends");
        }
        assert_eq!(sched.succeeded(), 5, "the failures before the success");
        assert_eq!(sched.succeeded(), 0);
        let (delay, failures) = sched.failed(clock.mono());
        assert_eq!(failures, 1);
        assert!(delay <= s(1), "the backoff started over: {delay:?}");
    }

    /// The next wake is the earliest of the retry, the planner's held-back change and the
    /// renewal; an instant already past is no reason to wake (it would spin).
    #[test]
    fn the_next_wake_is_the_earliest_instant_still_ahead() {
        let node = Schedule::new(Backoff::new(s(1), s(60), 7), None);
        let now = s(100);
        assert_eq!(
            node.next_wake(now, None, None),
            None,
            "wait for a publication"
        );
        assert_eq!(node.next_wake(now, Some(s(103)), Some(s(90))), Some(s(3)));
        assert_eq!(
            node.next_wake(now, None, Some(s(90))),
            None,
            "the Node renews only with a poll"
        );

        let mut lease = Schedule::new(Backoff::new(s(1), s(30), 7), Some(s(15)));
        assert_eq!(
            lease.next_wake(now, None, Some(s(90))),
            Some(s(5)),
            "renewal"
        );
        assert_eq!(lease.next_wake(now, Some(s(102)), Some(s(90))), Some(s(2)));
        assert_eq!(
            lease.next_wake(now, Some(s(99)), Some(s(80))),
            None,
            "a renewal due with nothing newer to write waits for the next publication"
        );
        let (delay, _) = lease.failed(now);
        assert_eq!(
            lease.next_wake(now, None, Some(s(90))),
            Some(delay.min(s(5)))
        );
        assert_eq!(lease.next_wake(now, None, None), Some(delay), "the retry");
    }

    /// A writer whose first `fail` writes fail; records when each write was tried.
    struct Flaky {
        fail: u64,
        clock: Arc<dyn Clock>,
        tried: Arc<Mutex<Vec<(Duration, u64)>>>,
    }

    impl Writer for Flaky {
        type Error = ();
        type Done = ();

        async fn write(&mut self, patch: Option<&AnnotationPatch>) -> Option<Result<(), ()>> {
            patch?;
            let mut tried = self.tried.lock().unwrap_or_else(|e| e.into_inner());
            tried.push((self.clock.mono(), 0));
            Some(if tried.len() as u64 <= self.fail {
                Err(())
            } else {
                Ok(())
            })
        }

        fn succeeded(&mut self, _: Option<&AnnotationPatch>, failures: u64) {
            let mut tried = self.tried.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(last) = tried.last_mut() {
                last.1 = failures;
            }
        }

        fn failed(&mut self, _: Option<&AnnotationPatch>, _: (), _: u64, _: Duration) {}

        async fn finish(self) {}
    }

    fn published(at: Duration) -> Arc<Published> {
        let snapshot = Snapshot {
            at,
            ..snap(vec![gpu(0, 23_028, 4096)], vec![])
        };
        Arc::new(Published {
            snapshot: Arc::new(snapshot),
            metrics: Default::default(),
            published_at: at,
            guard: None,
            pressure: BTreeMap::new(),
            replicas: None,
            figures: None,
        })
    }

    /// The loop itself: one publication, three failed writes retried after growing pauses
    /// without a new publication, then one that goes through, reporting the three.
    #[tokio::test]
    async fn the_loop_retries_a_failed_write_after_the_backoff() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let tried = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = watch::channel(Some(published(clock.mono())));
        let ms = Duration::from_millis;
        let running = Running::spawn(
            WriterLoop {
                writer: Flaky {
                    fail: 3,
                    clock: clock.clone(),
                    tried: tried.clone(),
                },
                // No minimum interval: the pauses are the backoff's alone.
                planner: AnnotationPlanner::new(AnnotationConfig {
                    min_interval: Duration::ZERO,
                    ..AnnotationConfig::default()
                }),
                published: rx,
                clock: clock.clone(),
                schedule: Schedule::new(Backoff::new(ms(40), ms(400), 3), None),
            },
            ms(100),
        );
        for _ in 0..200 {
            let done = tried.lock().unwrap_or_else(|e| e.into_inner()).len() >= 4;
            if done {
                break;
            }
            tokio::time::sleep(ms(10)).await;
        }
        // Nothing moved since: no fifth write.
        tokio::time::sleep(ms(100)).await;
        assert!(running.stop().await.is_ok());
        drop(tx);
        let tried = tried.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(tried.len(), 4, "{tried:?}");
        // Each pause is at least half its base: 40, 80, 160 ms.
        for (w, base) in tried.windows(2).zip([40u64, 80, 160]) {
            let gap = w[1].0 - w[0].0;
            assert!(
                gap >= ms(base / 2),
                "{gap:?} after a failure, base {base} ms"
            );
        }
        assert_eq!(tried[3].1, 3, "the success reports the failures before it");
    }
}
