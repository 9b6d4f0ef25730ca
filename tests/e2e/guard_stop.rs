//! Stop at decision with real processes (issue 25): the enforcer, with the real signalling
//! shell (`act::signal`), against the API double over real HTTP. Each victim is a real child
//! process (`sleep`); its `/proc/<pid>/stat` is copied into a proc root beside a
//! `cgroup` file that places it in the victim pod's kubepods cgroup (as attribution reads
//! the host's), so the identity checks read what they would on a node while the signals go
//! to the real process. What a test asserts is the process's real state, read from the real
//! `/proc/<pid>/stat`: `T` while stopped, never left `T` when the pod was not evicted.
//!
//! The double's kubelet is the faithful one (its SIGKILL comes `max(grace, 2 s)` after the
//! eviction, after each test has read what it needs).
//!
//! The state at the moment the double answers the fresh read or the eviction is taken by a
//! request hook, before the agent receives the answer.
//!
//! The agent binary itself never signals through a proc tree that is not its own `/proc`
//! (`ProcSignals::new`): the simulator's tree names made-up pids that may be real processes
//! here. These tests hand the enforcer a tree of copies of their own children's entries and
//! say so (`trusting_proc_root`).

use crate::support::enforcer_world::{double, process, snapshot, Pod, NODE};
use apiserver_double::{ApiServer, Fault, FaultAction, Method};
use gpu_warden::act::enforce::Enforcer;
use gpu_warden::act::signal::ProcSignals;
use gpu_warden::act::stop::Stopper;
use gpu_warden::attribute::procfs::ProcFs;
use gpu_warden::guard::carry::{Carried, CarriedDoubt};
use gpu_warden::guard::decision::{Decision, EvictionOutcome};
use gpu_warden::guard::policy::{Mode, OnDecision, Policy};
use gpu_warden::guard::ports::DecisionExecutor;
use gpu_warden::guard::state::Guard;
use gpu_warden::model::clock::{Clock, SystemClock};
use gpu_warden::model::pod::PodMap;
use gpu_warden::model::snapshot::Snapshot;
use gpu_warden::publish::self_metrics::SelfMetrics;
use serde_json::json;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The victim (rank 1) and a spare candidate; each with one real process.
const VICTIM_UID: &str = "0f4c7a2e-1d3b-4c5a-8e9f-00000000000a";
const SPARE_UID: &str = "0f4c7a2e-1d3b-4c5a-8e9f-00000000000b";

/// The state letter of a real process (`/proc/<pid>/stat` field 3).
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .unwrap_or('?')
}

/// The state of `pid` once a SIGSTOP sent to it has taken effect (up to 2 s): the kernel
/// wakes a sleeping process to stop it, so right after the signal it may still read `R`.
fn state_once_stopped(pid: u32) -> char {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let s = state(pid);
        if s == 'T' || std::time::Instant::now() >= deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The state of `pid` once it has left `R` (up to 1 s): a process that was sent SIGSTOP
/// is running until it stops (on a loaded machine it may not have been scheduled yet), and
/// a `sleep` that was not signalled shows `S` again at once.
fn settled_state(pid: u32) -> char {
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        let s = state(pid);
        if s != 'R' || std::time::Instant::now() >= deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct World {
    server: ApiServer,
    metrics: SelfMetrics,
    enforcer: Enforcer,
    guard: Guard,
    pods: PodMap,
    snapshot: Snapshot,
    children: Vec<Child>,
    _proc: tempfile::TempDir,
    /// States of the victim's process seen by the request hook, with the request.
    seen: Arc<Mutex<Vec<(String, char)>>>,
}

impl Drop for World {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Writes `<root>/<pid>/{stat,cgroup}`: the real stat, and a containerd cgroup v2 path
/// (systemd driver) in pod `uid`.
fn place(root: &std::path::Path, pid: u32, uid: Option<&str>) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(format!("/proc/{pid}/stat"), dir.join("stat")).unwrap();
    let cgroup = match uid {
        Some(uid) => format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope\n",
            uid.replace('-', "_"),
            "ab".repeat(32)
        ),
        None => "0::/system.slice/containerd.service\n".to_string(),
    };
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
}

impl World {
    /// Two CI pods in the API and the view, the victim first, each with one real process
    /// in its pod's cgroup; `action` at decision.
    async fn new(mode: Mode, action: OnDecision) -> Result<World> {
        let (server, clients) = double().await?;
        for (name, uid, prio) in [("victim", VICTIM_UID, 0), ("spare", SPARE_UID, 5)] {
            server.add_pod(json!({
                "metadata": {"name": name, "namespace": "ci", "uid": uid},
                "spec": {"nodeName": NODE, "priority": prio},
                "status": {"phase": "Running"},
            }))?;
        }
        let children: Vec<Child> = (0..2)
            .map(|_| Command::new("sleep").arg("120").spawn())
            .collect::<std::io::Result<_>>()?;
        // The processes started before the decision, by more than the tick of their start
        // time (a process started in the decision's own tick counts as a reused pid).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let proc = tempfile::tempdir()?;
        place(proc.path(), children[0].id(), Some(VICTIM_UID));
        place(proc.path(), children[1].id(), Some(SPARE_UID));
        let metrics = SelfMetrics::new("test")?;
        let policy = Policy {
            mode,
            on_decision: action,
            eviction_grace_period_seconds: 5,
            ..Policy::default()
        };
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let stopper = Stopper::new(
            action,
            Arc::new(ProcSignals::new(ProcFs::new(proc.path())).trusting_proc_root()),
            metrics.clone(),
            clock.clone(),
        );
        let enforcer = Enforcer::new(&clients, NODE, metrics.clone(), &policy, clock.clone())
            .with_timeouts(Duration::from_millis(400), Duration::from_secs(2))
            .with_read_timeout(Duration::from_millis(400))
            .with_read_bound(READ_BOUND)
            .with_stopper(Arc::new(stopper));
        let pods: PodMap = gpu_warden_testkit::fixtures::pods([
            gpu_warden_testkit::fixtures::pod(VICTIM_UID)
                .name("victim")
                .priority(0),
            gpu_warden_testkit::fixtures::pod(SPARE_UID)
                .name("spare")
                .priority(5),
        ]);
        let processes = [(VICTIM_UID, "victim", 0usize), (SPARE_UID, "spare", 1)]
            .into_iter()
            .map(|(uid, name, i)| {
                let pod = Pod {
                    namespace: "ci",
                    name,
                    uid,
                };
                process(children[i].id(), "sleep", pod, "build", 3000)
            })
            .collect();
        let snapshot = snapshot(9600, processes);
        let seen: Arc<Mutex<Vec<(String, char)>>> = Arc::default();
        let victim_pid = children[0].id();
        let log = seen.clone();
        server.on_request(move |r| {
            if r.path.contains("/pods/victim") {
                log.lock().unwrap().push((
                    format!("{} {}", r.method, r.path),
                    settled_state(victim_pid),
                ));
            }
        });
        let guard = Guard::new(policy);
        Ok(World {
            server,
            metrics,
            enforcer,
            guard,
            pods,
            snapshot,
            children,
            _proc: proc,
            seen,
        })
    }

    /// Moves the victim's process (as `/proc` shows it) into pod `uid`'s cgroup, or out of
    /// every pod (a host process).
    fn place_victim(&self, uid: Option<&str>) {
        place(self._proc.path(), self.victim_pid(), uid);
    }

    fn victim_pid(&self) -> u32 {
        self.children[0].id()
    }

    fn spare_pid(&self) -> u32 {
        self.children[1].id()
    }

    /// Whether child `i` (0 the victim, 1 the spare) ended by SIGKILL: its exit is waited
    /// for (a killed process exits at once; the bound is a safety net for a test that
    /// fails).
    fn killed(&mut self, i: usize) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match self.children[i].try_wait() {
                Ok(Some(status)) => return status.signal() == Some(9),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => return false,
            }
        }
    }

    /// Whether child `i` has not exited (running or stopped), now.
    fn alive(&mut self, i: usize) -> bool {
        matches!(self.children[i].try_wait(), Ok(None))
    }

    /// A world whose one eviction went unanswered: in doubt, the victim held stopped.
    async fn in_doubt() -> Result<World> {
        let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
        w.fault(EVICTION, Method::POST, FaultAction::Hang);
        let d = w.decide();
        let outcomes = w.execute(&d).await;
        assert!(
            matches!(outcomes[0].1, EvictionOutcome::InDoubt(_)),
            "{outcomes:?}"
        );
        assert_eq!(state(w.victim_pid()), 'T', "held while in doubt");
        Ok(w)
    }

    /// The guard's one decision, at its own clock's now (the stopper compares start times
    /// with it).
    fn decide(&mut self) -> Decision {
        let now = Duration::from_millis(1);
        let mut ds = self.guard.observe(
            &Arc::new(self.snapshot.clone()),
            &Arc::new(self.pods.clone()),
            now,
        );
        assert_eq!(ds.len(), 1, "{ds:#?}");
        let d = ds.remove(0);
        assert_eq!(d.candidates[0].uid, VICTIM_UID, "{d:#?}");
        d
    }

    async fn execute(&mut self, d: &Decision) -> Vec<(String, EvictionOutcome)> {
        self.enforcer.execute(d, &self.pods).await
    }

    /// The victim's state when the double answered a request matching `what`.
    fn state_at(&self, what: &str) -> Vec<char> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r.contains(what))
            .map(|(_, s)| *s)
            .collect()
    }

    fn stops(&self, result: &str) -> u64 {
        self.metrics.guard_stops.with_label_values(&[result]).get()
    }

    fn fault(&self, path: &str, method: Method, action: FaultAction) {
        self.server
            .inject(Fault::new(path, action).method(method).times(1));
    }

    /// Like [`World::fault`], for every request that matches.
    fn fault_always(&self, path: &str, method: Method, action: FaultAction) {
        self.server.inject(Fault::new(path, action).method(method));
    }
}

/// How long these tests' enforcer retries a victim's fresh read.
const READ_BOUND: Duration = Duration::from_secs(2);

const EVICTION: &str = "/api/v1/namespaces/ci/pods/victim/eviction";
const POD: &str = "/api/v1/namespaces/ci/pods/victim";

/// Evicted: stopped before the fresh read, still stopped when the eviction is posted, and
/// killed once the API server accepted it (its memory back at once, not at the kubelet's
/// SIGKILL `max(grace, 2 s)` later); the Event says both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_victim_is_stopped_then_killed_once_evicted() -> Result {
    let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
    let d = w.decide();
    let outcomes = w.execute(&d).await;
    assert_eq!(
        outcomes,
        vec![(VICTIM_UID.to_string(), EvictionOutcome::Evicted)]
    );
    assert_eq!(
        w.state_at("GET"),
        vec!['T'],
        "stopped before the fresh read"
    );
    assert_eq!(w.state_at("POST"), vec!['T']);
    assert!(w.killed(0), "killed once evicted");
    assert_ne!(state(w.spare_pid()), 'T', "only the victim");
    assert!(w.alive(1), "only the victim");
    assert_eq!(
        (w.stops("stopped"), w.stops("killed"), w.stops("resumed")),
        (1, 1, 0)
    );
    let notes: Vec<String> = w
        .server
        .events()
        .into_iter()
        .map(|e| e.object["note"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        notes.iter().any(|n| n.starts_with(
            "At decision: stopped 1 GPU process; evicting, then killed 1 GPU process once evicted."
        )),
        "{notes:#?}"
    );
    let st = serde_json::to_value(w.enforcer.status()).unwrap_or_default();
    assert_eq!(st["onDecision"], "stop", "{st}");
    assert_eq!(st["permitted"], true, "{st}");
    assert_eq!(
        st["stopped"],
        json!([]),
        "evicted: forgotten, not held: {st}"
    );
    Ok(())
}

/// Refused by a PodDisruptionBudget (429 with the DisruptionBudget cause): stopped when
/// the eviction was posted, resumed at once; a Normal Event on the pod says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_eviction_resumes_the_victim() -> Result {
    let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
    w.server.protect_pod("ci", "victim");
    w.server.protect_pod("ci", "spare");
    let d = w.decide();
    let outcomes = w.execute(&d).await;
    assert!(
        matches!(outcomes[0].1, EvictionOutcome::Blocked(_)),
        "{outcomes:?}"
    );
    assert_eq!(w.state_at("POST"), vec!['T']);
    assert_ne!(state(w.victim_pid()), 'T', "resumed");
    assert_eq!(
        (w.stops("stopped"), w.stops("resumed")),
        (2, 2),
        "victim and spare"
    );
    let resumed: Vec<String> = w
        .server
        .events()
        .into_iter()
        .filter(|e| e.object["reason"] == "GPUMemoryPressureResumed")
        .map(|e| e.object["note"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(resumed.len(), 2, "{resumed:#?}");
    assert!(
        resumed[0].contains("resumed 1 GPU process: eviction refused by a PodDisruptionBudget"),
        "{resumed:#?}"
    );
    Ok(())
}

/// Skipped: the fresh read shows the victim now `evict: never`: it was stopped at the read,
/// is resumed, and the walk moves on to the spare, which is stopped and evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_victim_is_resumed() -> Result {
    let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
    w.server.update_pod("ci", "victim", |p| {
        p["metadata"]["annotations"] = json!({"gpu-warden.io/evict": "never"});
    });
    let d = w.decide();
    let outcomes = w.execute(&d).await;
    assert!(
        matches!(outcomes[0].1, EvictionOutcome::Skipped(_)),
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes[1],
        (SPARE_UID.to_string(), EvictionOutcome::Evicted)
    );
    assert_eq!(w.state_at("GET"), vec!['T']);
    assert_ne!(state(w.victim_pid()), 'T', "resumed");
    assert!(w.alive(0), "resumed, not killed");
    assert!(w.killed(1), "the spare was evicted: killed");
    Ok(())
}

/// Aborted: every fresh read fails (500) for the whole read bound: nothing is evicted and
/// the victim, stopped through every retry, is resumed; the Event-facing outcome says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_walk_resumes_the_victim() -> Result {
    let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
    w.fault_always(POD, Method::GET, FaultAction::Status(500));
    let d = w.decide();
    let t0 = std::time::Instant::now();
    let outcomes = w.execute(&d).await;
    assert!(
        matches!(&outcomes[0].1, EvictionOutcome::Aborted(m) if m.contains("did not answer the fresh read of the pod within 2s")),
        "{outcomes:?}"
    );
    assert!(t0.elapsed() >= READ_BOUND, "{:?}", t0.elapsed());
    assert_eq!(outcomes.len(), 1);
    let at_reads = w.state_at("GET");
    assert!(at_reads.len() >= 3, "retried: {at_reads:?}");
    assert!(
        at_reads.iter().all(|s| *s == 'T'),
        "stopped through every retry: {at_reads:?}"
    );
    assert_ne!(state(w.victim_pid()), 'T', "resumed");
    assert!(w.server.evictions().is_empty());
    Ok(())
}

/// A slow or failing API server is not a verdict on the pod (issue 38: a 3 s read against a
/// 2 s limit resumed the stopped grower, and its neighbours lost 43 allocations a run): a
/// read that times out, or fails with a 5xx, is tried again while the victim stays stopped,
/// and once the server answers the victim is evicted — stopped from the decision until the
/// eviction is accepted, then killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_failing_fresh_read_keeps_the_victim_stopped_until_it_answers() -> Result {
    // (what, fault on the first read, reads answered at least: a read the client gave up
    // on is never answered, so the double's hook does not see it)
    for (what, fault, answered) in [
        // Over the 400 ms read limit once: the next read's limit has doubled.
        ("slow", FaultAction::Delay(Duration::from_millis(700)), 1),
        ("failing", FaultAction::Status(503), 2),
    ] {
        let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
        w.fault(POD, Method::GET, fault);
        let d = w.decide();
        let t0 = std::time::Instant::now();
        let outcomes = w.execute(&d).await;
        assert_eq!(
            outcomes,
            vec![(VICTIM_UID.to_string(), EvictionOutcome::Evicted)],
            "{what}"
        );
        assert!(
            t0.elapsed() >= Duration::from_millis(200),
            "{what}: {:?}",
            t0.elapsed()
        );
        let at_reads = w.state_at("GET");
        assert!(
            at_reads.len() >= answered,
            "{what}: read again: {at_reads:?}"
        );
        assert!(at_reads.iter().all(|s| *s == 'T'), "{what}: {at_reads:?}");
        assert_eq!(w.state_at("POST"), vec!['T'], "{what}");
        assert!(w.killed(0), "{what}: killed once evicted");
        assert_eq!(w.stops("resumed"), 0, "{what}");
    }
    Ok(())
}

/// A read the server refuses (403: the agent may not read pods) says the same whoever
/// asks again: the walk ends at once, nothing is evicted and the victim is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_fresh_read_resumes_the_victim_at_once() -> Result {
    let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
    w.fault_always(POD, Method::GET, FaultAction::Forbidden);
    let d = w.decide();
    let t0 = std::time::Instant::now();
    let outcomes = w.execute(&d).await;
    assert!(t0.elapsed() < READ_BOUND, "{:?}", t0.elapsed());
    assert!(
        matches!(&outcomes[0].1, EvictionOutcome::Aborted(m) if m.contains("refused (403")),
        "{outcomes:?}"
    );
    assert_eq!(w.state_at("GET").len(), 1, "not asked again");
    assert_ne!(state(w.victim_pid()), 'T', "resumed");
    assert!(w.server.evictions().is_empty());
    Ok(())
}

/// Throttled (API Priority and Fairness's 429) and forbidden (403): the eviction did not
/// happen, so the victim is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_or_forbidden_eviction_resumes_the_victim() -> Result {
    for action in [
        FaultAction::ApfReject {
            retry_after_seconds: 1,
        },
        FaultAction::Forbidden,
    ] {
        let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
        w.fault(EVICTION, Method::POST, action.clone());
        let d = w.decide();
        let outcomes = w.execute(&d).await;
        assert_eq!(outcomes.len(), 1, "{action:?}: {outcomes:?}");
        assert!(outcomes[0].1.not_carried_out(), "{outcomes:?}");
        assert_eq!(w.state_at("POST"), vec!['T'], "{action:?}");
        assert_ne!(state(w.victim_pid()), 'T', "{action:?}: resumed");
    }
    Ok(())
}

/// In doubt (no answer): the victim stays stopped — the eviction may still happen — until
/// the guard resolves the doubt as not carried out; then it is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_in_doubt_keeps_the_victim_stopped_until_resolved_not_carried_out() -> Result {
    let w = World::in_doubt().await?;
    let st = serde_json::to_value(w.enforcer.status()).unwrap_or_default();
    assert_eq!(st["stopped"][0]["uid"], VICTIM_UID, "{st}");
    let not_done = EvictionOutcome::Failed("not carried out".into());
    w.enforcer.resolved(VICTIM_UID, &not_done);
    assert_ne!(state(w.victim_pid()), 'T', "resumed");
    assert_eq!(w.stops("resumed"), 1);
    // Resolved once: a second resolution signals nothing.
    w.enforcer.resolved(VICTIM_UID, &not_done);
    assert_eq!(w.stops("resumed"), 1);
    Ok(())
}

/// In doubt, then resolved as carried out (the pod seen terminating): the victim, held
/// stopped through the doubt, is killed then, once; a pod already gone is only forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_in_doubt_resolved_as_carried_out_kills_the_victim() -> Result {
    let mut w = World::in_doubt().await?;
    w.enforcer.resolved(VICTIM_UID, &EvictionOutcome::Evicted);
    assert!(
        w.killed(0),
        "killed once the eviction is known to have happened"
    );
    w.enforcer.resolved(VICTIM_UID, &EvictionOutcome::Evicted);
    assert_eq!((w.stops("killed"), w.stops("resumed")), (1, 0), "once");
    let st = serde_json::to_value(w.enforcer.status()).unwrap_or_default();
    assert_eq!(st["stopped"], json!([]), "{st}");
    Ok(())
}

/// In doubt at shutdown: nobody will resolve it, so the victim is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_resumes_what_is_still_stopped() -> Result {
    let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
    w.fault(EVICTION, Method::POST, FaultAction::Hang);
    let d = w.decide();
    w.execute(&d).await;
    assert_eq!(state(w.victim_pid()), 'T');
    w.enforcer.shutdown();
    assert_ne!(state(w.victim_pid()), 'T', "resumed at shutdown");
    Ok(())
}

/// Dry-run signals nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_signals_nothing() -> Result {
    let mut w = World::new(Mode::DryRun, OnDecision::Stop).await?;
    let d = w.decide();
    w.execute(&d).await;
    assert!(w.server.evictions().is_empty());
    assert_ne!(state(w.victim_pid()), 'T');
    assert_eq!(w.stops("stopped"), 0);
    Ok(())
}

/// A victim pid whose cgroup is now another pod's (it left the victim's, or a re-created
/// pod) or the host's is never signalled; the eviction goes ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_outside_the_victims_cgroup_is_never_signalled() -> Result {
    for cgroup in [Some("7b7b7b7b-0000-4000-8000-000000000007"), None] {
        let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
        w.place_victim(cgroup);
        let d = w.decide();
        let outcomes = w.execute(&d).await;
        assert_eq!(outcomes[0].1, EvictionOutcome::Evicted, "{cgroup:?}");
        assert_eq!(w.state_at("POST"), vec!['S'], "{cgroup:?}: not stopped");
        assert_eq!(
            (w.stops("stopped"), w.stops("refused")),
            (0, 1),
            "{cgroup:?}"
        );
    }
    Ok(())
}

/// Kill: SIGKILL once the fresh read agrees, then the eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_ends_the_victims_processes_before_the_eviction() -> Result {
    let mut w = World::new(Mode::Enforce, OnDecision::Kill).await?;
    let d = w.decide();
    let outcomes = w.execute(&d).await;
    assert_eq!(outcomes[0].1, EvictionOutcome::Evicted);
    let status = w.children[0].wait()?;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert_ne!(state(w.spare_pid()), 'Z');
    assert_eq!(w.stops("killed"), 1);
    Ok(())
}

/// A doubt restored after an agent restart: the earlier process resumed the victim when it
/// shut down, so the new one stops it again — verified as at decision, so a pid that is no
/// longer the victim's is not touched — and resumes it when the doubt resolves as not
/// carried out. The other pod of the GPU is never stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubt_restored_after_a_restart_stops_its_pod_again_until_resolved() -> Result {
    for moved in [false, true] {
        let mut w = World::new(Mode::Enforce, OnDecision::Stop).await?;
        if moved {
            w.place_victim(Some("7b7b7b7b-0000-4000-8000-000000000007"));
        }
        let wall = std::time::SystemTime::now();
        let carried = Carried {
            v: 1,
            doubts: vec![CarriedDoubt {
                gpu: w.snapshot.gpus[0].id.uuid.clone(),
                uid: VICTIM_UID.into(),
                namespace: "ci".into(),
                name: "victim".into(),
                pids: vec![w.victim_pid()],
                since: wall - Duration::from_secs(3),
                decision: 7,
                detail: "500 etcdserver: request timed out".into(),
            }],
            cooldowns: Vec::new(),
        };
        let now = Duration::from_millis(1);
        let report = w.guard.restore(carried, now, wall);
        assert_eq!(report.doubts, 1, "{report:?}");
        let ds = w.guard.observe(
            &Arc::new(w.snapshot.clone()),
            &Arc::new(w.pods.clone()),
            now,
        );
        assert!(
            ds.is_empty(),
            "a GPU restored in doubt decides nothing: {ds:#?}"
        );
        let restored = w.guard.take_restored();
        assert_eq!(restored.len(), 1, "{restored:#?}");
        w.enforcer.hold_again(&restored[0]);
        assert_ne!(state(w.spare_pid()), 'T', "the other pod is never stopped");
        if moved {
            assert_ne!(
                state(w.victim_pid()),
                'T',
                "no longer the victim's: untouched"
            );
            assert_eq!((w.stops("stopped"), w.stops("refused")), (0, 1));
            continue;
        }
        assert_eq!(
            state_once_stopped(w.victim_pid()),
            'T',
            "stopped again while in doubt"
        );
        assert_eq!(w.stops("stopped"), 1);
        let st = serde_json::to_value(w.enforcer.status()).unwrap_or_default();
        assert_eq!(st["stopped"][0]["uid"], VICTIM_UID, "{st}");
        let said = st["recent"].to_string();
        assert!(said.contains("again after an agent restart"), "{st}");
        w.enforcer.resolved(
            VICTIM_UID,
            &EvictionOutcome::Failed("not carried out".into()),
        );
        assert_ne!(state(w.victim_pid()), 'T', "resumed");
        assert_eq!(w.stops("resumed"), 1);
    }
    Ok(())
}
