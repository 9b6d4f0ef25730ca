//! The OOM guard's scenarios (a)–(i) end to end on an injected clock: the
//! simulator plays the GPU, the agent's `Core` (the same one the event loop drives) attributes
//! through a simulated /proc and the real pod watch, decides, and the real enforcer evicts
//! through the API double over HTTP. The double plays a faithful kubelet on the simulated
//! clock (`apiserver_double::kubelet`, after kubelet's `killContainer` and the API server's
//! graceful delete): it sees an accepted eviction 50 ms later, sends SIGTERM to PID 1 — a
//! GitLab job's shell, which ignores it — and SIGKILLs the pod `max(grace, 2 s)` after that;
//! the harness ends the pod's simulated processes at that simulated instant.
//!
//! Simulated time advances 100 ms a step: a full poll every second, memory-only readings in
//! between while the guard asks for the fast watch.

use crate::support::sim_signals::{self, SimSignals, SimTarget};
use apiserver_double::{ApiServer, EvictionOutcome as Answer, FaultAction, SteppedClock};
use gpu_warden::act::enforce::Enforcer;
use gpu_warden::act::stop::Stopper;
use gpu_warden::attribute::ports::PodSource;
use gpu_warden::attribute::watch::WatchedPods;
use gpu_warden::guard::policy::Policy;
use gpu_warden::guard::ports::DecisionExecutor;
use gpu_warden::model::clock::{Clock, ManualClock};
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::sample::scenario::Scenario;
use gpu_warden::sample::sim::{placement_uid, scenario_pods};
use gpu_warden_testkit::rig::{Rig, RigOptions};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

const NODE: &str = "gpu-node-1";
const STEP: Duration = Duration::from_millis(100);

struct World {
    rt: tokio::runtime::Runtime,
    server: ApiServer,
    clock: Arc<ManualClock>,
    rig: Rig,
    scenario: Scenario,
    executor: Arc<dyn DecisionExecutor>,
    pods: Arc<WatchedPods>,
    /// Simulated time an evicted pod's processes take to exit once killed.
    exit_delay: Duration,
    last_metrics: String,
    /// Simulated time between two memory readings.
    step: Duration,
    clients: gpu_warden::act::client::KubeClients,
    target: SimTarget,
}

/// The enforcer of these tests: the real one, stopping victims at decision (when the
/// policy's `onDecision` says so) through the simulator.
fn enforcer(
    clients: &gpu_warden::act::client::KubeClients,
    metrics: &SelfMetrics,
    policy: &Policy,
    clock: &Arc<ManualClock>,
    target: &SimTarget,
) -> Enforcer {
    let signals = SimSignals {
        target: target.clone(),
        clock: clock.clone(),
    };
    let stopper = Stopper::new(
        policy.on_decision,
        Arc::new(signals),
        metrics.clone(),
        clock.clone(),
    );
    Enforcer::new(clients, NODE, metrics.clone(), policy, clock.clone())
        .with_stopper(Arc::new(stopper))
}

impl World {
    fn new(scenario_yaml: &str, policy_yaml: &str) -> World {
        let scenario = Scenario::parse(scenario_yaml, "scenario").unwrap();
        let policy = Policy::from_yaml_str(policy_yaml).unwrap();
        policy.validate().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let clock = Arc::new(ManualClock::new(
            UNIX_EPOCH + Duration::from_secs(1_790_000_000),
        ));
        let kubelet_clock = clock.clone();
        let server = rt
            .block_on(
                ApiServer::builder()
                    .kubelet_stepped(SteppedClock::new(move || kubelet_clock.mono()))
                    .bookmark_interval(Duration::from_millis(200))
                    .start(),
            )
            .unwrap();
        server
            .add_node(serde_json::json!({"metadata": {"name": NODE}}))
            .unwrap();
        for pod in scenario_pods(&scenario, NODE) {
            server.add_pod(pod).unwrap();
        }
        // kube's client needs the runtime's reactor from its construction on.
        let _entered = rt.enter();
        let clients = gpu_warden::act::client::from_config(
            kube::Config::new(server.url().parse().unwrap()),
            "test",
        )
        .unwrap();
        let pods = WatchedPods::spawn(clients.direct.clone(), NODE);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pods.status().trustworthy() {
            assert!(Instant::now() < deadline, "pod watch never synced");
            std::thread::sleep(Duration::from_millis(20));
        }
        let metrics = SelfMetrics::new("test").unwrap();
        let target = SimTarget::default();
        let executor: Arc<dyn DecisionExecutor> =
            Arc::new(enforcer(&clients, &metrics, &policy, &clock, &target));
        let rig = Rig::from_scenario(
            scenario.clone(),
            RigOptions {
                node: NODE.into(),
                pods: Some(pods.clone()),
                policy: Some(policy.clone()),
                executor: Some(executor.clone()),
                metrics: Some(metrics),
                clock: Some(clock.clone()),
                ..RigOptions::default()
            },
        )
        .unwrap();
        target.set(rig.sim.clone(), rig.proc_root().to_path_buf());
        World {
            rt,
            server,
            clock,
            rig,
            scenario,
            executor,
            pods,
            exit_delay: Duration::ZERO,
            last_metrics: String::new(),
            step: STEP,
            clients,
            target,
        }
    }

    /// Memory read every `step` instead of every 100 ms: the fast watch's cadence near a
    /// threshold, which the early trigger and the sustained-growth windows need.
    fn stepping(mut self, step: Duration) -> World {
        self.step = step;
        self
    }

    /// Advances simulated time by `d`, polling as the agent would.
    fn run_for(&mut self, d: Duration) {
        let end = self.clock.mono() + d;
        while self.clock.mono() < end {
            self.clock.advance(self.step);
            let now = self.clock.mono();
            // The kubelet's part, before the GPU is read: what it did by now.
            self.kubelet_until(now);
            let full_due = now.as_millis() % 1000 == 0;
            // A fast reading that fires a trigger asks for a full poll at once, as the
            // agent's sampler does on `poll_now`.
            let poll_now =
                !full_due && self.rig.core.fast_interval().is_some() && self.rig.memory().1;
            let dispatches = if full_due || poll_now {
                let (published, dispatches) = self.rig.full();
                self.last_metrics = String::from_utf8(published.metrics.to_vec()).unwrap();
                dispatches
            } else {
                Vec::new()
            };
            for (decision, pods) in dispatches {
                let id = decision.id;
                let results = self.rt.block_on(self.executor.execute(decision, pods));
                self.rig.core.on_outcomes(id, results);
            }
            // An instant kubelet would act at once on this step's evictions.
            self.kubelet_until(now);
        }
    }

    /// Lets the double's kubelet run to `now` on the simulated clock, and ends the simulated
    /// processes of each pod it killed (or whose PID 1 exited) at that action's instant.
    fn kubelet_until(&mut self, now: Duration) {
        for action in self.server.kubelet_run_until(now) {
            if !action.ends_processes() {
                continue;
            }
            let pids: Vec<u32> = self
                .scenario
                .processes
                .iter()
                .filter(|p| {
                    p.pod
                        .as_ref()
                        .is_some_and(|pl| placement_uid(pl) == action.uid)
                })
                .map(|p| p.pid)
                .collect();
            self.rig.sim.kill(&pids, action.at + self.exit_delay);
        }
    }

    /// Pods whose eviction the API accepted, by name.
    fn evicted_names(&self) -> Vec<String> {
        self.server
            .eviction_attempts()
            .into_iter()
            .filter(|e| e.outcome == Answer::Accepted)
            .map(|e| e.name)
            .collect()
    }

    /// Whether the last metrics scrape counts exactly one decision, taken by `trigger`.
    fn decided_once_by(&self, trigger: &str) -> bool {
        let label = format!("trigger=\"{trigger}\"");
        self.last_metrics.lines().any(|l| {
            l.starts_with("gpu_warden_guard_decisions_total")
                && l.contains(&label)
                && l.ends_with(" 1")
        })
    }

    fn attempts(&self) -> Vec<(String, Answer)> {
        self.server
            .eviction_attempts()
            .into_iter()
            .map(|e| (e.name, e.outcome))
            .collect()
    }

    fn events_with_reason(&self, reason: &str) -> Vec<serde_json::Value> {
        self.server
            .events()
            .into_iter()
            .map(|e| e.object)
            .filter(|o| o["reason"] == reason)
            .collect()
    }
}

/// One 10 000 MiB GPU: hard (5 %) is 500 MiB free, soft (10 %) 1 000 MiB free.
const GPU: &str =
    "gpus:\n  - {model: NVIDIA A10G, memory_mib: 10000, gpu_temp_c: 50, power_w: 100}\n";

fn scenario(processes: &str) -> String {
    format!("{GPU}processes:\n{processes}")
}

const TRAIN: &str = "  - {pid: 100, gpu: 0, name: train, memory: {constant: 6000}, pod: {namespace: ml, name: train-0, container: trainer, priority: 1000}}\n";
const SMALL: &str = "  - {pid: 200, gpu: 0, name: pytest, memory: {constant: 1000}, pod: {namespace: ci, name: ci-small, container: build, priority: 0, created_at: \"2026-11-30T10:00:00Z\"}}\n";
const GREEDY: &str = "  - {pid: 300, gpu: 0, name: python, memory: {linear: {from: 500, per_second: 200}}, pod: {namespace: ci, name: ci-greedy, container: build, priority: 0, created_at: \"2026-11-30T09:00:00Z\", annotations: {job.runner.gitlab.com/id: \"4242\", job.runner.gitlab.com/url: \"https://gitlab.example/p/-/jobs/4242\"}}}\n";

const ENFORCE: &str = "mode: enforce\nevictionGracePeriodSeconds: 0\n";

#[test]
fn a_growing_low_priority_ci_pod_is_evicted_before_the_gpu_is_full() {
    let mut w = World::new(&scenario(&format!("{TRAIN}{SMALL}{GREEDY}")), ENFORCE);
    w.run_for(Duration::from_secs(20));
    assert_eq!(w.evicted_names(), vec!["ci-greedy"], "{:?}", w.attempts());
    let ooms = w.rig.sim.ooms();
    assert!(ooms.is_empty(), "nobody may hit OOM: {ooms:?}");
    let warnings = w.events_with_reason("GPUMemoryPressure");
    let on_pod: Vec<_> = warnings
        .iter()
        .filter(|e| e["regarding"]["name"] == "ci-greedy")
        .collect();
    assert_eq!(on_pod.len(), 1, "{warnings:?}");
    assert_eq!(on_pod[0]["type"], "Warning");
    assert_eq!(on_pod[0]["action"], "Evict");
    let note = on_pod[0]["note"].as_str().unwrap();
    assert!(
        note.contains("GPU 0")
            && note.contains("4242")
            && note.contains("https://gitlab.example/p/-/jobs/4242"),
        "{note}"
    );
    assert!(
        w.last_metrics
            .contains("gpu_warden_evictions_total{namespace=\"ci\",result=\"evicted\"} 1"),
        "{}",
        w.last_metrics
    );
    assert!(w
        .last_metrics
        .contains("gpu_warden_gpu_memory_pressure{gpu=\"0\""));
}

#[test]
fn b_a_pdb_protected_pod_is_skipped_for_the_next_candidate() {
    let mut w = World::new(&scenario(&format!("{TRAIN}{SMALL}{GREEDY}")), ENFORCE);
    w.server.protect_pod("ci", "ci-greedy");
    w.run_for(Duration::from_secs(12));
    let attempts = w.attempts();
    assert_eq!(
        attempts[0],
        ("ci-greedy".to_string(), Answer::Blocked),
        "{attempts:?}"
    );
    assert_eq!(
        attempts[1],
        ("ci-small".to_string(), Answer::Accepted),
        "{attempts:?}"
    );
    assert!(!attempts.iter().any(|(n, _)| n == "train-0"));
}

#[test]
fn c_dry_run_evicts_nothing_but_reports() {
    let mut w = World::new(
        &scenario(&format!("{TRAIN}{SMALL}{GREEDY}")),
        "mode: dry-run\n",
    );
    w.run_for(Duration::from_secs(12));
    assert!(w.attempts().is_empty(), "{:?}", w.attempts());
    let dry = w.events_with_reason("GPUMemoryPressureDryRun");
    assert!(
        dry.iter()
            .any(|e| e["regarding"]["name"] == "ci-greedy" && e["type"] == "Normal"),
        "{dry:?}"
    );
    assert!(
        w.last_metrics
            .contains("gpu_warden_guard_decisions_total{escalated=\"false\",mode=\"dry-run\""),
        "{}",
        w.last_metrics
    );
}

#[test]
fn d_two_small_victims_are_taken_and_no_third() {
    // 600 MiB free (soft band); reclaim target 1 200 MiB free: two 400 MiB pods, not the third.
    let procs = "  - {pid: 100, gpu: 0, memory: {constant: 7000}, pod: {namespace: ml, name: train-0, priority: 1000}}\n  - {pid: 201, gpu: 0, memory: {constant: 400}, pod: {namespace: ci, name: ci-a, priority: 0}}\n  - {pid: 202, gpu: 0, memory: {constant: 400}, pod: {namespace: ci, name: ci-b, priority: 0}}\n  - {pid: 203, gpu: 0, memory: {constant: 1600}, pod: {namespace: ci, name: ci-c, priority: 5}}\n";
    let mut w = World::new(&scenario(procs), ENFORCE);
    w.run_for(Duration::from_secs(15));
    let mut names = w.evicted_names();
    names.sort();
    assert_eq!(names, vec!["ci-a", "ci-b"], "{:?}", w.attempts());
}

#[test]
fn e_nobody_else_is_evicted_while_the_victim_releases_its_memory() {
    let greedy = "  - {pid: 300, gpu: 0, memory: {linear: {from: 500, per_second: 400, max: 2900}}, pod: {namespace: ci, name: ci-greedy, priority: 0}}\n";
    let mut w = World::new(&scenario(&format!("{TRAIN}{SMALL}{greedy}")), ENFORCE);
    w.exit_delay = Duration::from_secs(4);
    w.run_for(Duration::from_secs(20));
    assert_eq!(w.evicted_names(), vec!["ci-greedy"], "{:?}", w.attempts());
}

#[test]
fn f_protected_pods_are_never_chosen_even_when_nothing_else_is_left() {
    let procs = "  - {pid: 101, gpu: 0, memory: {linear: {from: 3000, per_second: 300}}, pod: {namespace: kube-system, name: sys-0, priority: 0}}\n  - {pid: 102, gpu: 0, memory: {constant: 2000}, pod: {namespace: monitoring, name: ds-0, priority: 0, owner_kind: DaemonSet}}\n  - {pid: 103, gpu: 0, memory: {constant: 2000}, pod: {namespace: ci, name: never-0, priority: 0, annotations: {gpu-warden.io/evict: never}}}\n  - {pid: 104, gpu: 0, memory: {constant: 2000}, pod: {namespace: ci, name: critical-0, priority: 2000001000}}\n";
    let mut w = World::new(&scenario(procs), ENFORCE);
    w.run_for(Duration::from_secs(15));
    assert!(w.attempts().is_empty(), "{:?}", w.attempts());
    // The decision is still reported on the node.
    let node_events: Vec<_> = w
        .server
        .events()
        .into_iter()
        .map(|e| e.object)
        .filter(|o| o["regarding"]["kind"] == "Node")
        .collect();
    assert!(!node_events.is_empty(), "a node event names the decision");
}

#[test]
fn g_the_rate_limit_holds_under_flapping() {
    // A new greedy job starts every 6 s and grows fast; the limit allows 2 evictions a minute.
    let mut procs = String::from(TRAIN);
    for i in 0..6 {
        procs.push_str(&format!(
            "  - {{pid: {}, gpu: 0, start: {}s, memory: {{linear: {{from: 200, per_second: 1500}}}}, pod: {{namespace: ci, name: flap-{i}, priority: 0}}}}\n",
            400 + i,
            i * 6
        ));
    }
    let mut w = World::new(
        &scenario(&procs),
        "mode: enforce\nevictionGracePeriodSeconds: 0\nrateLimit: {maxEvictions: 2, per: 60s}\n",
    );
    w.run_for(Duration::from_secs(40));
    assert_eq!(w.evicted_names().len(), 2, "{:?}", w.attempts());
    assert!(
        w.rig.sim.ooms().len() >= 2,
        "the flapping went on past the limit (as intended)"
    );
}

#[test]
fn h_larger_use_over_request_goes_first_at_equal_priority() {
    // ci-a uses more in total, ci-b more above its request: ci-b goes.
    let procs = "  - {pid: 100, gpu: 0, memory: {linear: {from: 3000, per_second: 200}}, pod: {namespace: ml, name: train-0, priority: 1000}}\n  - {pid: 201, gpu: 0, memory: {constant: 3000}, pod: {namespace: ci, name: ci-a, priority: 0, annotations: {gpu-warden.io/vram-request-mib: \"2500\"}}}\n  - {pid: 202, gpu: 0, memory: {constant: 2000}, pod: {namespace: ci, name: ci-b, priority: 0, annotations: {gpu-warden.io/vram-request-mib: \"500\"}}}\n";
    let mut w = World::new(&scenario(procs), ENFORCE);
    w.run_for(Duration::from_secs(12));
    let names = w.evicted_names();
    assert_eq!(
        names.first().map(String::as_str),
        Some("ci-b"),
        "{:?}",
        w.attempts()
    );
}

#[test]
fn i_api_server_down_decisions_wait_and_the_agent_keeps_publishing() {
    let mut w = World::new(&scenario(&format!("{TRAIN}{SMALL}{GREEDY}")), ENFORCE);
    w.run_for(Duration::from_secs(3));
    w.server.set_down(true);
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.pods.status().healthy {
        assert!(
            Instant::now() < deadline,
            "the pod watch never noticed the outage"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Into hard pressure while the API is down: nothing is evicted on a stale pod view,
    // and metrics keep being published.
    w.run_for(Duration::from_secs(8));
    assert!(w.attempts().is_empty());
    assert!(
        w.last_metrics
            .contains("gpu_warden_gpu_memory_pressure{gpu=\"0\",UUID="),
        "{}",
        w.last_metrics
    );
    w.server.set_down(false);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !w.pods.status().trustworthy() {
        assert!(Instant::now() < deadline, "the pod watch never recovered");
        std::thread::sleep(Duration::from_millis(50));
    }
    w.run_for(Duration::from_secs(3));
    assert_eq!(w.evicted_names(), vec!["ci-greedy"], "{:?}", w.attempts());
    let _ = FaultAction::Hang; // (faults on single calls are covered in enforce_e2e.rs)
}

/// The H200's A10G-sized failure (docs/validation.md §3d) on the simulated clock: a greedy
/// job starts late and grows fast; when the guard decides it holds less than a steady CI pod
/// of the same priority. Ranked on memory held, the steady pod was the victim and the greedy
/// job filled the GPU during the cooldown; counting each pod's growth over the last
/// `horizon` takes the greedy job first, and nobody else.
#[test]
fn j_a_young_grower_goes_before_a_steady_pod_that_holds_more() {
    let steady = "  - {pid: 200, gpu: 0, name: pytest, memory: {constant: 2000}, pod: {namespace: ci, name: ci-steady, container: build, priority: 0, created_at: \"2026-11-30T10:00:00Z\"}}\n";
    let greedy = "  - {pid: 300, gpu: 0, name: python, start: 5s, memory: {linear: {from: 0, per_second: 5000, max: 1900}}, pod: {namespace: ci, name: ci-greedy, container: build, priority: 0, created_at: \"2026-11-30T09:00:00Z\"}}\n";
    let mut w = World::new(&scenario(&format!("{TRAIN}{steady}{greedy}")), ENFORCE);
    w.run_for(Duration::from_secs(12));
    let attempts = w.attempts();
    assert_eq!(
        attempts.first(),
        Some(&("ci-greedy".to_string(), Answer::Accepted)),
        "{attempts:?}"
    );
    assert_eq!(w.evicted_names(), vec!["ci-greedy"], "{attempts:?}");
    let warnings = w.events_with_reason("GPUMemoryPressure");
    let note = warnings
        .iter()
        .find(|e| e["regarding"]["name"] == "ci-greedy")
        .and_then(|e| e["note"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(note.contains("counting its growth"), "{note}");
}

/// A training pod whose 2.5 GiB workspace — five times the soft band — is allocated for
/// 150 ms of every 300 ms: the neighbour the guard must not mistake for a grower.
const TRAIN_WS: &str = "  - {pid: 100, gpu: 0, name: train, memory: {workspace: {base: 5000, mib: 2500, every: 300ms, holds: 150ms}}, pod: {namespace: ml, name: train-0, container: trainer, priority: 1000}}\n";

/// The shipped action and grace: stop at decision, evict with a 5 s grace period (the
/// faithful kubelet SIGKILLs 5 s after it sees the eviction).
const STOP: &str = "mode: enforce\nonDecision: stop\n";

/// The pids of the neighbours that OOMed (the greedy job's own failed allocations are its
/// business, not a neighbour's).
fn neighbour_ooms(w: &World, greedy: &[u32]) -> Vec<u32> {
    w.rig
        .sim
        .ooms()
        .into_keys()
        .filter(|pid| !greedy.contains(pid))
        .collect()
}

/// Issue 38: beside a trainer whose workspace comes and goes (larger than the soft band,
/// and dipping free below hard at its peaks once the stopped greedy job holds its memory)
/// and a steady CI job, the guard takes the greedy job — stopped at decision, SIGKILLed by
/// the faithful kubelet 5 s after the eviction — and nobody else; no neighbour hits OOM.
#[test]
fn k_a_workspace_that_comes_and_goes_is_not_growth() {
    let greedy = "  - {pid: 300, gpu: 0, name: python, start: 3s, memory: {linear: {from: 200, per_second: 4000}}, pod: {namespace: ci, name: ci-greedy, container: build, priority: 0}}\n";
    let mut w = World::new(&scenario(&format!("{TRAIN_WS}{SMALL}{greedy}")), STOP)
        .stepping(Duration::from_millis(10));
    w.run_for(Duration::from_secs(12));
    assert_eq!(w.evicted_names(), vec!["ci-greedy"], "{:?}", w.attempts());
    assert_eq!(neighbour_ooms(&w, &[300]), Vec::<u32>::new());
}

/// The seed's shape: four jobs of one runner at one priority; one declares 3.5 GiB and
/// stays inside it while its 1.5 GiB workspace comes and goes, one grows. Only the grower
/// goes.
#[test]
fn l_four_jobs_of_one_runner_lose_only_the_grower() {
    let procs = "  - {pid: 101, gpu: 0, name: python, memory: {workspace: {base: 1500, mib: 1500, every: 300ms, holds: 150ms}}, pod: {namespace: ci, name: ci-declared, container: build, priority: 0, annotations: {gpu-warden.io/vram-request-mib: \"3500\"}}}\n  - {pid: 102, gpu: 0, name: python, memory: {constant: 2400}, pod: {namespace: ci, name: ci-steady, container: build, priority: 0}}\n  - {pid: 103, gpu: 0, name: python, memory: {constant: 800}, pod: {namespace: ci, name: ci-small, container: build, priority: 0}}\n  - {pid: 104, gpu: 0, name: python, start: 3s, memory: {linear: {from: 200, per_second: 4000}}, pod: {namespace: ci, name: ci-greedy, container: build, priority: 0}}\n";
    let mut w = World::new(&scenario(procs), STOP).stepping(Duration::from_millis(10));
    w.run_for(Duration::from_secs(12));
    assert_eq!(w.evicted_names(), vec!["ci-greedy"], "{:?}", w.attempts());
    assert_eq!(neighbour_ooms(&w, &[104]), Vec::<u32>::new());
}

/// Two greedy jobs (`ci-g1` at 3 s, `ci-g2` at 4 s, each from `from` MiB at `per_second`)
/// beside `train` and a small CI pod, memory read every `step`, a killed victim's memory back
/// `teardown` after its kill: both go, alone, and no neighbour hits OOM.
fn two_greedy(
    train: &str,
    from: u32,
    per_second: u32,
    step: Duration,
    teardown: Duration,
) -> World {
    let job = |pid: u32, name: &str, start: u32| {
        format!("  - {{pid: {pid}, gpu: 0, name: python, start: {start}s, memory: {{linear: {{from: {from}, per_second: {per_second}}}}}, pod: {{namespace: ci, name: {name}, container: build, priority: 0}}}}\n")
    };
    let procs = format!(
        "{train}{SMALL}{}{}",
        job(301, "ci-g1", 3),
        job(302, "ci-g2", 4)
    );
    let mut w = World::new(&scenario(&procs), STOP).stepping(step);
    w.target.set_teardown(teardown);
    w.run_for(Duration::from_secs(12));
    assert_eq!(
        w.evicted_names(),
        vec!["ci-g1", "ci-g2"],
        "{:?}",
        w.attempts()
    );
    assert_eq!(neighbour_ooms(&w, &[301, 302]), Vec::<u32>::new());
    w
}

/// Two greedy jobs starting a second apart, with the stop at decision's kill once the first
/// is evicted (`teardown`: how long its memory then takes to come back): both go, alone,
/// nobody else hits OOM, the decisions are (ordinary, escalated) as `decided`, and a Node
/// Event says `node_says`.
fn two_greedy_jobs(teardown: Duration, decided: (u64, u64), node_says: &str) {
    let w = two_greedy(TRAIN, 200, 3000, Duration::from_millis(10), teardown);
    let m = &w.last_metrics;
    assert!(
        m.contains("gpu_warden_guard_decision_evictions_bucket{le=\"1\"} 2\n")
            && m.contains("gpu_warden_guard_decision_evictions_count 2\n"),
        "one pod per decision: {m}"
    );
    assert_eq!(
        (decisions(&w, false), decisions(&w, true)),
        decided,
        "(ordinary, escalated): {m}"
    );
    let node = node_notes(&w);
    assert!(
        node.iter().any(|n| n.contains(node_says)),
        "a Node Event says {node_says:?}: {node:?}"
    );
}

fn node_notes(w: &World) -> Vec<String> {
    w.server
        .events()
        .into_iter()
        .map(|e| e.object)
        .filter(|o| o["regarding"]["kind"] == "Node")
        .filter_map(|o| o["note"].as_str().map(str::to_string))
        .collect()
}

fn decisions(w: &World, escalated: bool) -> u64 {
    let prefix =
        format!("gpu_warden_guard_decisions_total{{escalated=\"{escalated}\",mode=\"enforce\"");
    w.last_metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

/// Two greedy jobs a second apart: the first, stopped at decision, is killed once its
/// eviction is accepted, so its memory is back before the second starts and the second is an
/// ordinary decision; both go alone and nobody hits OOM.
#[test]
fn m_two_greedy_jobs_a_second_apart_are_both_taken_and_nobody_else() {
    two_greedy_jobs(
        sim_signals::TEARDOWN,
        (2, 0),
        "ci/ci-g1 stopped 1 GPU process; evicting, then killed 1 GPU process once evicted",
    );
}

/// The same while the first victim's memory comes back slowly even after its kill (3 s: a
/// driver tearing down a large context): the second grows while the first still holds what
/// it took. The cooldown gives way for it — an escalated decision that takes it alone,
/// counted as such — and nobody else is evicted or hits OOM.
#[test]
fn m2_the_cooldown_gives_way_to_a_second_grower_while_the_first_s_memory_is_held() {
    two_greedy_jobs(Duration::from_secs(3), (1, 1), "escalated after decision 1");
}

/// Issue 38: the agent restarts — started without a Lease, so nothing is carried — while
/// its victim, stopped at decision by the earlier process, terminates and holds what it took
/// until the kubelet's SIGKILL. At each peak of the trainer's workspace free dips below
/// hard, and what the victim holds would not bring the GPU back to the target by itself;
/// but nobody is growing and that memory is on its way back, so the new agent evicts nobody
/// (it evicted a bystander in 2 of 2 runs against an independent API double). Counted
/// against the target as before, the victim's memory still left a plan taking ci-small.
#[test]
fn n_a_restarted_agent_evicts_nobody_while_its_victim_terminates() {
    let train = "  - {pid: 100, gpu: 0, name: train, memory: {workspace: {base: 5000, mib: 3300, every: 300ms, holds: 150ms}}, pod: {namespace: ml, name: train-0, container: trainer, priority: 1000}}\n";
    let victim = "  - {pid: 300, gpu: 0, name: python, memory: {constant: 300}, pod: {namespace: ci, name: ci-greedy, container: build, priority: 0}}\n";
    let mut w = World::new(&scenario(&format!("{train}{SMALL}{victim}")), STOP)
        .stepping(Duration::from_millis(10));
    // The earlier agent process stopped and evicted ci-greedy (the API's default grace:
    // the kubelet kills it 30 s later), then shut down; this one starts now.
    w.rig.sim.stop(&[300], Duration::ZERO);
    w.rt.block_on(async {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(w.clients.direct.clone(), "ci");
        pods.evict("ci-greedy", &kube::api::EvictParams::default())
            .await
            .unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !w
        .pods
        .pods()
        .values()
        .any(|p| p.name == "ci-greedy" && p.terminating)
    {
        assert!(
            Instant::now() < deadline,
            "the pod view never showed the eviction"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    w.run_for(Duration::from_secs(8));
    assert_eq!(w.evicted_names(), vec!["ci-greedy"], "{:?}", w.attempts());
    assert_eq!(neighbour_ooms(&w, &[300]), Vec::<u32>::new());
}

/// Two greedy jobs a second apart, the second as fast as the first (on the H200 at an
/// A10G's headroom, 16–250 GiB/s: the second filled the GPU 60–90 ms after it began to grow
/// while the cooldown asked for the processes at most every 200 ms, so the escalated
/// decision came after the trainer's workspace had no room). A climb the troughs show asks
/// for the processes at once, as it does outside a cooldown, and the second grower is
/// stopped about as soon as the first was.
#[test]
fn o_a_second_grower_as_fast_as_the_first_is_stopped_as_soon() {
    let train = "  - {pid: 100, gpu: 0, name: train, memory: {workspace: {base: 4000, mib: 500, every: 300ms, holds: 150ms}}, pod: {namespace: ml, name: train-0, container: trainer, priority: 1000}}\n";
    // The first victim's memory held 3 s after its kill, so the second meets the cooldown.
    let w = two_greedy(
        train,
        300,
        16000,
        Duration::from_millis(5),
        Duration::from_secs(3),
    );
    // Nobody hit OOM, the greedy jobs included: the GPU never filled (a trainer whose
    // workspace comes back while it is full loses its step; here it came back in a trough).
    assert_eq!(w.rig.sim.ooms(), Default::default());
}

/// The H100's runner run at 128 GiB/s (issue 38, at an A10G's headroom): the job started
/// most of a second after the last full poll, and the poll its climb asked for caught it
/// holding 1 GiB. Its own rate, measured since the earlier poll, projected it behind a
/// steady pod holding 6.6 GiB, which was evicted first. All the GPU's climb since that poll
/// was the job's, and so is its projection: it goes first, and alone — whenever between two
/// full polls it starts, and at any rate the simulated reads can follow.
#[test]
fn p_a_job_starting_between_full_polls_is_projected_at_the_gpus_climb() {
    let gpu = "gpus:\n  - {model: NVIDIA A10G, memory_mib: 24000, gpu_temp_c: 50, power_w: 100}\n";
    let base = "  - {pid: 101, gpu: 0, name: python, memory: {workspace: {base: 4000, mib: 2000, every: 300ms, holds: 150ms}}, pod: {namespace: ci, name: ci-declared, container: build, priority: 0, annotations: {gpu-warden.io/vram-request-mib: \"6500\"}}}\n  - {pid: 102, gpu: 0, name: python, memory: {constant: 9000}, pod: {namespace: ci, name: ci-steady, container: build, priority: 0}}\n  - {pid: 103, gpu: 0, name: python, memory: {constant: 2000}, pod: {namespace: ci, name: ci-small, container: build, priority: 0}}\n";
    // (start, MiB/s): a full poll every second from 0, so 3.9 s is 0.9 s after one.
    for (start, rate) in [("3900ms", 32000), ("3500ms", 32000), ("3950ms", 16000)] {
        let greedy = format!("  - {{pid: 104, gpu: 0, name: python, start: {start}, memory: {{linear: {{from: 250, per_second: {rate}}}}}, pod: {{namespace: ci, name: ci-greedy, container: build, priority: 0}}}}\n");
        let mut w = World::new(&format!("{gpu}processes:\n{base}{greedy}"), STOP)
            .stepping(Duration::from_millis(10));
        w.run_for(Duration::from_secs(8));
        assert_eq!(
            w.evicted_names(),
            vec!["ci-greedy"],
            "start {start}, {rate} MiB/s: {:?}",
            w.attempts()
        );
        assert_eq!(
            neighbour_ooms(&w, &[104]),
            Vec::<u32>::new(),
            "start {start}, {rate} MiB/s"
        );
    }
}

/// A job that only starts — its CUDA context and a first buffer, 774 MiB in 40 ms, the
/// H100's own start-up — just as a trainer's 2 GiB workspace comes back, at an A10G's
/// headroom. On the H100 that coincidence made the early trigger fire in 3 of 135 runs
/// (docs/validation.md §9f): the two rises in one 60-ms window looked like a sustained climb
/// of 95 GiB/s. Nobody is growing; nobody may go. The same start-up followed by a climb is
/// still caught by the early trigger, alone, before any neighbour loses an allocation.
#[test]
fn q_a_job_starting_up_as_a_workspace_returns_is_not_a_climb() {
    // The H100 of the harness, emulating an A10G: a holder leaves 23 GiB, the A10G's
    // thresholds (5 % and 10 % of 24 GiB), the base load of `ws` at that headroom.
    let gpu = "gpus:\n  - {model: NVIDIA H100, memory_mib: 81559, gpu_temp_c: 50, power_w: 100}\n";
    let policy = format!("{STOP}hard: 1229Mi\nsoft: 2458Mi\n");
    let base = "  - {pid: 100, gpu: 0, name: train, memory: {workspace: {base: 5892, mib: 2112, every: 300ms, holds: 150ms}}, pod: {namespace: ml, name: train-0, container: trainer, priority: 1000}}\n  - {pid: 102, gpu: 0, name: python, memory: {constant: 3682}, pod: {namespace: ci, name: ci-small, container: build, priority: 0}}\n  - {pid: 103, gpu: 0, name: python, memory: {constant: 3682}, pod: {namespace: ci, name: ci-small-2, container: build, priority: 0}}\n  - {pid: 99, gpu: 0, name: holder, memory: {constant: 58476}}\n";
    let mut evicted = Vec::new();
    for start in [
        "3270ms", "3275ms", "3280ms", "3285ms", "3290ms", "3295ms", "3300ms", "3305ms", "3310ms",
        "3315ms", "3320ms",
    ] {
        let new = format!("  - {{pid: 104, gpu: 0, name: python, start: {start}, memory: {{steps: [{{at: 0s, mib: 14}}, {{at: 10ms, mib: 104}}, {{at: 20ms, mib: 518}}, {{at: 40ms, mib: 774}}]}}, pod: {{namespace: ci, name: ci-new, container: build, priority: 0}}}}\n");
        let mut w = World::new(&format!("{gpu}processes:\n{base}{new}"), &policy)
            .stepping(Duration::from_millis(5));
        w.run_for(Duration::from_secs(6));
        if !w.evicted_names().is_empty() {
            evicted.push((start, w.evicted_names()));
        }
    }
    assert_eq!(evicted, Vec::new());

    // The same start-up followed by a climb at 128 GiB/s in 1 GiB allocations (the
    // harness's greedy job): caught by the early trigger as it climbs past the workspace.
    let mut missed = Vec::new();
    for start in ["3270ms", "3285ms", "3295ms", "3300ms"] {
        let steps: String = (1..=10)
            .map(|i| format!(", {{at: {}ms, mib: {}}}", 40 + 8 * i, 774 + 1024 * i))
            .collect();
        let new = format!("  - {{pid: 104, gpu: 0, name: python, start: {start}, memory: {{steps: [{{at: 0s, mib: 14}}, {{at: 10ms, mib: 104}}, {{at: 20ms, mib: 518}}, {{at: 40ms, mib: 774}}{steps}]}}, pod: {{namespace: ci, name: ci-new, container: build, priority: 0}}}}\n");
        let mut w = World::new(&format!("{gpu}processes:\n{base}{new}"), &policy)
            .stepping(Duration::from_millis(5));
        w.run_for(Duration::from_secs(6));
        let ooms = neighbour_ooms(&w, &[104]);
        // By the early trigger: the wait for a carried rise must not leave it to hard.
        let early = w.decided_once_by("early_trend");
        if w.evicted_names() != ["ci-new"] || !ooms.is_empty() || !early {
            missed.push((start, w.evicted_names(), ooms, early));
        }
    }
    assert_eq!(missed, Vec::new());
}

/// Two jobs starting up 90 ms apart — each its CUDA context and a 256 MiB buffer, 866 MiB
/// in 50 ms, as the H100 showed it — beside a trainer whose workspace (512 MiB or 1 GiB)
/// comes and goes every 24 or 34 ms, at an A10G's headroom with 5.8 GiB free (issue 38's
/// `runner` base load). On the H100 the early trigger took such a job 20 ms into its
/// start-up (docs/validation.md §9m): the job carried half of the pair's climb or more. A
/// pod holding less than a start-up (1 GiB) is no climber: nobody goes. (Without that rule,
/// 6 of these 48 took the second starting job.)
#[test]
fn q2_jobs_starting_beside_a_quick_workspace_are_not_climbers() {
    let gpu = "gpus:\n  - {model: NVIDIA H100, memory_mib: 81559, gpu_temp_c: 50, power_w: 100}\n";
    let policy = format!("{STOP}hard: 1229Mi\nsoft: 2458Mi\n");
    let start_up = |pid: u32, name: &str, start: u32| {
        format!("  - {{pid: {pid}, gpu: 0, name: python, start: {start}ms, memory: {{steps: [{{at: 0s, mib: 14}}, {{at: 183ms, mib: 104}}, {{at: 200ms, mib: 774}}, {{at: 212ms, mib: 776}}, {{at: 228ms, mib: 866}}]}}, pod: {{namespace: ci, name: {name}, container: build, priority: 0}}}}\n")
    };
    let mut evicted = Vec::new();
    for (ws, every, holds) in [(512, 24, 12), (1088, 24, 12), (512, 34, 17), (1088, 34, 17)] {
        for start in (3000..3034).step_by(3) {
            let base = format!("  - {{pid: 100, gpu: 0, name: train, memory: {{workspace: {{base: 9800, mib: {ws}, every: {every}ms, holds: {holds}ms}}}}, pod: {{namespace: ml, name: train-0, container: trainer, priority: 1000}}}}\n  - {{pid: 102, gpu: 0, name: python, memory: {{constant: 3682}}, pod: {{namespace: ci, name: ci-small, container: build, priority: 0}}}}\n  - {{pid: 103, gpu: 0, name: python, memory: {{constant: 3682}}, pod: {{namespace: ci, name: ci-small-2, container: build, priority: 0}}}}\n  - {{pid: 99, gpu: 0, name: holder, memory: {{constant: 58476}}}}\n");
            let procs = format!(
                "{base}{}{}",
                start_up(104, "ci-a", start),
                start_up(105, "ci-b", start + 90)
            );
            let mut w = World::new(&format!("{gpu}processes:\n{procs}"), &policy)
                .stepping(Duration::from_millis(5));
            w.run_for(Duration::from_millis(3600));
            if !w.evicted_names().is_empty() {
                evicted.push((ws, every, start, w.evicted_names()));
            }
        }
    }
    assert_eq!(evicted, Vec::new());
}

/// One phase of issue 38's climb on an H100 at an A10G's thresholds: beside `base` (the
/// neighbours' processes), a job whose memory takes the steps `context` (its start-up) and then
/// climbs in 2 GiB allocations 10 ms apart from `start` ms, run through the kill's 50-ms
/// teardown with OOMs counted at every reading (a neighbour's failure in the teardown falls
/// between full polls) and an allocation 1 ms inside the driver landing despite the stop
/// (SIGSTOP is taken on the return to user space; added with q6, so the figures "without" in
/// q3's and q4's notes were measured before it). Returns who was evicted, the neighbours that
/// hit OOM, and whether `early_need` decided.
fn climb_phase(base: &str, context: &str, start: u32) -> (Vec<String>, Vec<u32>, bool) {
    climb_phase_at(base, context, start, &[0, 10, 20, 30, 40, 50])
}

/// [`climb_phase`] with the job's 2 GiB allocations at `offsets` ms from `start`.
fn climb_phase_at(
    base: &str,
    context: &str,
    start: u32,
    offsets: &[u32],
) -> (Vec<String>, Vec<u32>, bool) {
    let gpu = "gpus:\n  - {model: NVIDIA H100, memory_mib: 81559, gpu_temp_c: 50, power_w: 100}\n";
    let policy = format!("{STOP}hard: 1229Mi\nsoft: 2458Mi\n");
    let steps: String = (1..)
        .zip(offsets)
        .map(|(i, at)| format!(", {{at: {}ms, mib: {}}}", start + at, 866 + 2048 * i))
        .collect();
    let greedy = format!("  - {{pid: 104, gpu: 0, name: python, memory: {{steps: [{context}{steps}]}}, pod: {{namespace: ci, name: ci-greedy, container: build, priority: 0}}}}\n");
    let mut w = World::new(&format!("{gpu}processes:\n{base}{greedy}"), &policy)
        .stepping(Duration::from_millis(5));
    w.target.set_teardown(Duration::from_millis(50));
    w.rig.sim.count_ooms_at_every_reading();
    w.rig.sim.set_in_driver(Duration::from_millis(1));
    w.run_for(Duration::from_millis(5500));
    let by_early_need = w.decided_once_by("early_need");
    (w.evicted_names(), neighbour_ooms(&w, &[104]), by_early_need)
}

/// The runner shape's neighbours for [`climb_phase`], the second steady job of `steady` MiB.
/// The declared job starts 1 ms after the others: memory goes to processes in the order they
/// started, so the greedy job's allocations are held against its workspace.
fn runner_neighbours(steady: u32) -> String {
    format!("  - {{pid: 99, gpu: 0, name: holder, memory: {{constant: 58482}}}}\n  - {{pid: 101, gpu: 0, name: python, start: 1ms, memory: {{workspace: {{base: 4868, mib: 2048, every: 300ms, holds: 150ms}}}}, pod: {{namespace: ci, name: ci-declared, container: build, priority: 0, annotations: {{gpu-warden.io/vram-request-mib: \"8192\"}}}}}}\n  - {{pid: 102, gpu: 0, name: python, memory: {{constant: {steady}}}, pod: {{namespace: ci, name: ci-steady, container: build, priority: 0}}}}\n  - {{pid: 103, gpu: 0, name: python, memory: {{constant: 3682}}, pod: {{namespace: ci, name: ci-steady-2, container: build, priority: 0}}}}\n")
}

/// A phase gone wrong: its start, whether the workspace was out, who was evicted, the
/// neighbours' OOMs, whether `early_need` decided.
type WrongPhase = (u32, bool, Vec<String>, Vec<u32>, bool);

/// The runner shape's phases for q3 and q4: every 25 ms of the workspace's 300-ms cycle. The
/// workspace is in for the first 150 ms of each 300 of its own time; a phase is `out` when it
/// is out from the climb's start to its third allocation. Returns the phases gone wrong:
/// anyone but the job evicted, a neighbour's OOM, or an `out` phase not decided by
/// `early_need`.
fn runner_phases(steady: u32, context: impl Fn(u32) -> String) -> Vec<WrongPhase> {
    let base = runner_neighbours(steady);
    let mut wrong = Vec::new();
    let mut out_phases = 0;
    for start in (4000..4300).step_by(25) {
        let out = (start - 1) % 300 >= 150 && (start + 19) % 300 >= 150;
        out_phases += u32::from(out);
        let (evicted, ooms, by_early_need) = climb_phase(&base, &context(start), start);
        if evicted != ["ci-greedy"] || !ooms.is_empty() || (out && !by_early_need) {
            wrong.push((start, out, evicted, ooms, by_early_need));
        }
    }
    assert_eq!(out_phases, 5);
    wrong
}

/// The harness's job's 2 GiB allocations at 250 GiB/s, ms from its first, for
/// [`climb_phase_at`]: 6 and 11 ms apart in either order (`hw/gpu_load.py` checks what is due
/// every 5 ms; NVML showed it so on the H100, docs/validation.md §9p).
const HARNESS_CADENCES: [[u32; 6]; 2] = [[0, 6, 17, 23, 34, 40], [0, 11, 17, 28, 34, 45]];

/// The job's start-up for [`climb_phase_at`]: `held`, its 866-MiB context held for seconds
/// before the climb at `start`; otherwise arriving 10 ms before it ([`fresh_context`]).
fn context_of(what: &str, start: u32) -> String {
    match what {
        "held" => "{at: 0s, mib: 866}".to_string(),
        _ => fresh_context(start, 10),
    }
}

/// The harness's job as it starts: 14 MiB for seconds, then its CUDA context, the last of
/// it `lead` ms before its first 2 GiB allocation at `start` (§9o's timeline).
fn fresh_context(start: u32, lead: u32) -> String {
    format!(
        "{{at: 0s, mib: 14}}, {{at: {}ms, mib: 774}}, {{at: {}ms, mib: 866}}",
        start - lead - 10,
        start - lead
    )
}

/// Issue 38's `runner` shape at an A10G's headroom, as the H100 lost it (docs/validation.md
/// §9n): the declared job's 2 GiB workspace comes and goes every 150 ms, two steady CI jobs,
/// and a job that has held its CUDA context for seconds climbs in 2 GiB allocations 10 ms
/// apart, from 6.9 GiB free while the workspace is out. Its second allocation leaves 2.8 GiB,
/// above soft; its third takes free past soft and hard at once, and the workspace then cannot
/// return until the stopped job's memory is back, 50 ms after its kill. The guard takes the
/// job alone at every phase of the workspace's cycle, and the workspace never fails (OOMs
/// counted at every reading, as the teardown falls between full polls); wherever the climb
/// starts with the workspace out, by `early_need`, before the third allocation. (Without that
/// trigger, those 5 of the 12 phases were decided by `hard` or `early_trend` after it, and 2
/// of them lost the workspace's return.)
#[test]
fn q3_a_job_climbing_into_a_declared_workspaces_room_is_stopped_before_it_takes_it() {
    let held = |_| "{at: 0s, mib: 866}".to_string();
    assert_eq!(runner_phases(6754, held), Vec::new());
}

/// q3's shape at the alignment the H100 lost at next (docs/validation.md §9o), with the job
/// as the harness starts it: 14 MiB for seconds, then its CUDA context 10 ms before its first
/// 2 GiB allocation, with no regular poll between. From 7.4 GiB free while the workspace is
/// out, the job's second allocation leaves 3.3 GiB: the workspace's 2 GiB still fits above
/// hard; its third leaves 1.3 GiB, inside the soft band, and the workspace's return fails for
/// the kill's teardown. `early_need` counts the climb's next step against the workspace: it
/// decides before the third allocation wherever the workspace is out. (Without the step, those
/// 5 of the 12 phases were decided by `early_trend` after it, and 2 of them lost the
/// workspace's return.)
#[test]
fn q4_a_job_starting_and_climbing_into_a_declared_workspaces_room_is_stopped_before_it_takes_it() {
    // From 7.4 GiB free while the workspace is out (q3: 6.9).
    assert_eq!(
        runner_phases(6132, |start| fresh_context(start, 10)),
        Vec::new()
    );
}

/// Issue 38's `two` shape at the alignment the H100 lost at most (docs/validation.md §9o): a
/// trainer whose 1 GiB workspace comes and goes every 20 ms, two steady CI jobs, and a job that
/// starts as the harness's does and climbs in 2 GiB allocations 10 ms apart, from 7.1 GiB free
/// while the workspace is out. Its second allocation leaves 2.9 GiB, above soft, room for the
/// workspace above hard; its third leaves 0.9 GiB, below hard and below the workspace. On the
/// H100 the guard decided on that reading and the trainer's next workspace failed until the
/// killed job's memory came back. The guard takes the job alone at every phase of the
/// workspace's cycle and the trainer never fails. Here `early_trend` decides after the second
/// allocation, with or without `early_need`'s next step; on the H100 it held back there, for
/// a reason the agent's info log does not show (a run with its debug log is outstanding). The
/// scenario keeps the alignment the table lost at most.
#[test]
fn q5_a_job_climbing_past_hard_beside_a_trainers_workspace_is_stopped_before_it_takes_its_room() {
    let base = two_neighbours(7060);
    let mut wrong = Vec::new();
    for start in (4000..4040).step_by(3) {
        let (evicted, ooms, _) = climb_phase(&base, &fresh_context(start, 10), start);
        if evicted != ["ci-greedy"] || !ooms.is_empty() {
            wrong.push((start, evicted, ooms));
        }
    }
    assert_eq!(wrong, Vec::new());
}

/// Issue 38's `two` shape's neighbours for [`climb_phase`] with `free` MiB left while the
/// trainer's 1 GiB workspace is out and the job holds its 866-MiB context: a holder standing
/// for the rest of the H100, the trainer (its workspace in for 10 ms of every 20), two steady
/// CI jobs.
fn two_neighbours(free: u32) -> String {
    let holder = 81559 - 6916 - 2 * 3682 - 866 - free;
    format!("  - {{pid: 99, gpu: 0, name: holder, memory: {{constant: {holder}}}}}\n  - {{pid: 101, gpu: 0, name: python, start: 1ms, memory: {{workspace: {{base: 6916, mib: 1024, every: 20ms, holds: 10ms}}}}, pod: {{namespace: ml, name: train-0, container: trainer, priority: 1000000}}}}\n  - {{pid: 102, gpu: 0, name: python, memory: {{constant: 3682}}, pod: {{namespace: ci, name: ci-steady, container: build, priority: 0}}}}\n  - {{pid: 103, gpu: 0, name: python, memory: {{constant: 3682}}, pod: {{namespace: ci, name: ci-steady-2, container: build, priority: 0}}}}\n")
}

/// q5's shape with the job's allocations at the harness's own cadence, 6 and 11 ms apart in
/// either order (`hw/gpu_load.py` checks what is due every 5 ms; NVML showed it so on the H100,
/// docs/validation.md §9p), from 7,060 or 6,400 MiB free while the trainer's 1 GiB workspace
/// is out: three allocations leave it less than the workspace. On the H100 5 of 15 runs at
/// 7,060 MiB lost the trainer's allocations during the kill's teardown, decided 27–30 ms into
/// the climb. The simulated stop lets an allocation already inside the driver land (1 ms, as
/// SIGSTOP does). The guard takes the job alone at every phase of the workspace's cycle and
/// the trainer never fails.
///
/// A job that has held its context for seconds is the case that needs `early_need` to know
/// the workspace from the fast readings (the full polls seldom see it out), to look inside the
/// soft band, and a full poll after the climb's second step: without them (e3c24a9) 28 of
/// the 80 such phases lost the trainer's return, the third allocation landed before the
/// stop. A job whose context came 10 ms before its first allocation is caught after
/// the second either way (the context's rise makes the climb sustained sooner); it guards the
/// cadence against regressions.
#[test]
fn q6_the_harness_jobs_cadence_beside_a_trainers_workspace_is_stopped_before_it_takes_its_room() {
    let mut wrong = Vec::new();
    for (what, every) in [("held", 2), ("fresh", 3)] {
        for free in [7060, 6400] {
            let base = two_neighbours(free);
            for offsets in HARNESS_CADENCES {
                for start in (4000..4040).step_by(every) {
                    let (evicted, ooms, _) =
                        climb_phase_at(&base, &context_of(what, start), start, &offsets);
                    if evicted != ["ci-greedy"] || !ooms.is_empty() {
                        wrong.push((what, free, offsets[1], start, evicted, ooms));
                    }
                }
            }
        }
    }
    assert_eq!(wrong, Vec::new());
}

/// q3's and q4's `runner` shape with the job's allocations at the harness's own cadence (6 and
/// 11 ms apart, either order), its context held for seconds or arriving 10 ms before its climb,
/// from 6.9 and 7.5 GiB free while the declared job's 2 GiB workspace is out, at every 25 ms of
/// the workspace's 300-ms cycle; an allocation 1 ms inside the driver lands despite the stop.
/// On the H100 this shape lost the workspace's return in 2 of 15 runs at 250 GiB/s
/// (docs/validation.md §9p): decided by `early_trend` or `hard` after the third allocation, with
/// 1.4 and 0.7 GiB left. The guard takes the job alone and the workspace never fails. Without
/// the readings' workspace, the soft band and the poll after the second step (e3c24a9), 8 of
/// these 96 phases lost it.
#[test]
fn q7_the_harness_jobs_cadence_into_a_declared_workspaces_room_is_stopped_before_it_takes_it() {
    let mut wrong = Vec::new();
    for steady in [6754, 6132] {
        let base = runner_neighbours(steady);
        for offsets in HARNESS_CADENCES {
            for what in ["held", "fresh"] {
                for start in (4000..4300).step_by(25) {
                    let (evicted, ooms, _) =
                        climb_phase_at(&base, &context_of(what, start), start, &offsets);
                    if evicted != ["ci-greedy"] || !ooms.is_empty() {
                        wrong.push((steady, offsets[1], what, start, evicted, ooms));
                    }
                }
            }
        }
    }
    assert_eq!(wrong, Vec::new());
}

/// The early trigger acts before any pressure, to stop a climb, so it takes only a pod that
/// carries the climb and that the guard may take first. A climb of a process outside any
/// pod, of a pod annotated evict: never, of a pod inside its declared request or of a pod
/// that steady ones outrank (a trainer loading a larger model, also with a CI job starting
/// just before or inside its climb), stopping short of soft beside steady CI jobs, evicts
/// nobody: before this rule the early trigger took the first-ranked steady (or starting)
/// CI job, for a climb that evicting it could not stop. The same climb
/// by a CI job of the lowest priority is still caught by the early trigger, alone.
#[test]
fn r_a_climb_no_pod_it_may_take_carries_evicts_nobody_early() {
    let gpu = "gpus:\n  - {model: NVIDIA A10G, memory_mib: 24000, gpu_temp_c: 50, power_w: 100}\n";
    // 11 000 MiB of neighbours; the climb's 10 400 leaves 2 600 free, above soft (2 400).
    let base = "  - {pid: 100, gpu: 0, name: train, memory: {constant: 6000}, pod: {namespace: ml, name: train-0, container: trainer, priority: 1000}}\n  - {pid: 200, gpu: 0, name: pytest, memory: {constant: 2000}, pod: {namespace: ci, name: ci-small, container: build, priority: 0}}\n  - {pid: 201, gpu: 0, name: pytest, memory: {constant: 3000}, pod: {namespace: ci, name: ci-steady, container: build, priority: 0}}\n";
    let climber = |pod: &str, max: u32| {
        let pod = if pod.is_empty() {
            String::new()
        } else {
            format!(", pod: {{namespace: ci, name: ci-climb, container: build, {pod}}}")
        };
        format!("  - {{pid: 400, gpu: 0, name: python, start: 3500ms, memory: {{linear: {{from: 0, per_second: 32000, max: {max}}}}}{pod}}}\n")
    };
    let run = |pod: &str, extra: &str, max: u32| {
        let yaml = format!("{gpu}processes:\n{base}{extra}{}", climber(pod, max));
        let mut w = World::new(&yaml, STOP).stepping(Duration::from_millis(5));
        w.run_for(Duration::from_secs(6));
        let early = w.decided_once_by("early_trend");
        (w.evicted_names(), w.rig.sim.ooms().len(), early)
    };
    let mut wrong = Vec::new();
    // A CI job holding 2 GiB from 150 ms before the trainer's climb (half a second after the
    // last regular poll), or from 180 ms into it, about 25 ms before the early trigger fires.
    let starting = |at: &str| {
        format!("  - {{pid: 401, gpu: 0, name: pytest, start: {at}, memory: {{constant: 2000}}, pod: {{namespace: ci, name: ci-new, container: build, priority: 0}}}}\n")
    };
    let (before, during) = (starting("3350ms"), starting("3680ms"));
    for (what, pod, extra, max) in [
        ("a process outside any pod", "", "", 10400),
        (
            "annotated evict: never",
            "priority: 0, annotations: {gpu-warden.io/evict: \"never\"}",
            "",
            10400,
        ),
        (
            "inside its declared request",
            "priority: 0, annotations: {gpu-warden.io/vram-request-mib: \"12000\"}",
            "",
            10400,
        ),
        ("outranked by steady pods", "priority: 1000", "", 10400),
        (
            "outranked, a job started just before",
            "priority: 1000",
            before.as_str(),
            8400,
        ),
        (
            "outranked, a job started inside the climb",
            "priority: 1000",
            during.as_str(),
            8400,
        ),
    ] {
        let (evicted, ooms, early) = run(pod, extra, max);
        if !evicted.is_empty() || ooms > 0 || early {
            wrong.push((what, evicted, ooms, early));
        }
    }
    assert_eq!(wrong, Vec::new());

    let (evicted, ooms, early) = run("priority: 0", "", 10400);
    assert_eq!(
        (evicted, ooms, early),
        (vec!["ci-climb".to_string()], 0, true)
    );
}

/// A job that takes the room a neighbour's workspace needs, in one step, and stops inside the
/// soft band (docs/validation.md §9i: on the H100 a greedy job's last 2 GiB filled the room a
/// declared job's workspace had just left, and that workspace failed for the 10 s of `grace`).
/// Here the CI job holds its CUDA context for six seconds beside a declared job whose 1.5 GiB
/// workspace comes and goes, then steps to 3.8 GiB at once: the workspace no longer fits
/// (800 MiB free, soft 1 000, hard 500), no reading shows a sustained climb, and free stays
/// above hard. The guard takes the job by `soft_need` within a second, not after `grace`, and
/// nobody else. A job that holds its new level inside its declared request is nobody's to take
/// early: it waits for `grace` (past the end of the run).
#[test]
fn s_a_job_that_fills_a_workspaces_room_is_taken_before_grace() {
    let run = |annotations: &str| {
        let procs = format!("  - {{pid: 102, gpu: 0, name: python, memory: {{constant: 2400}}, pod: {{namespace: ci, name: ci-steady, container: build, priority: 0}}}}\n  - {{pid: 104, gpu: 0, name: python, start: 500ms, memory: {{steps: [{{at: 0s, mib: 200}}, {{at: 6s, mib: 3800}}]}}, pod: {{namespace: ci, name: ci-greedy, container: build, priority: 0{annotations}}}}}\n  - {{pid: 101, gpu: 0, name: python, start: 1s, memory: {{workspace: {{base: 3000, mib: 1500, every: 300ms, holds: 150ms}}}}, pod: {{namespace: ci, name: ci-declared, container: build, priority: 0, annotations: {{gpu-warden.io/vram-request-mib: \"4500\"}}}}}}\n");
        let mut w = World::new(&scenario(&procs), STOP).stepping(Duration::from_millis(5));
        w.run_for(Duration::from_secs(8));
        w
    };
    let w = run("");
    assert_eq!(w.evicted_names(), vec!["ci-greedy"], "{:?}", w.attempts());
    assert!(w.decided_once_by("soft_need"), "{}", w.last_metrics);
    // The workspace failed only until the decision: the polls that saw it short.
    let ooms = w.rig.sim.ooms();
    assert!(ooms.keys().all(|pid| *pid == 101), "{ooms:?}");
    assert!(ooms.get(&101).is_some_and(|n| *n <= 12), "{ooms:?}");

    let w = run(", annotations: {gpu-warden.io/vram-request-mib: \"4000\"}");
    assert_eq!(
        w.evicted_names(),
        Vec::<String>::new(),
        "{:?}",
        w.attempts()
    );
}
