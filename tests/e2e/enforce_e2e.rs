//! The enforcer shell against the API server double over real HTTP, with the real kube
//! clients (`gpu_warden::act::client::from_config`) and decisions made by the real `Guard`.

use crate::support::enforcer_world::{double, process, snapshot, Pod, NODE};
use apiserver_double::{ApiServer, EventApi, Fault, FaultAction, Method, StoredEvent};
use gpu_warden::act::enforce::Enforcer;
use gpu_warden::guard::decision::{Decision, EvictionOutcome};
use gpu_warden::guard::policy::{Mode, Policy};
use gpu_warden::guard::state::Guard;
use gpu_warden::guard::status::GpuPhase;
use gpu_warden::model::clock::SystemClock;
use gpu_warden::model::pod::PodInfo;
use gpu_warden::model::pod::PodMap;
use gpu_warden::model::snapshot::Snapshot;
use gpu_warden::publish::self_metrics::SelfMetrics;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GRACE: i64 = 7;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A pod on the GPU: namespace/name, UID `uid-<name>`, priority, MiB used, annotations.
#[derive(Clone)]
struct P {
    ns: &'static str,
    name: &'static str,
    priority: i32,
    mib: u64,
    annotations: Vec<(&'static str, &'static str)>,
}

fn p(ns: &'static str, name: &'static str, priority: i32, mib: u64) -> P {
    P {
        ns,
        name,
        priority,
        mib,
        annotations: vec![],
    }
}

fn uid(name: &str) -> String {
    format!("uid-{name}")
}

struct World {
    server: ApiServer,
    metrics: SelfMetrics,
    enforcer: Enforcer,
    guard: Guard,
    pods: PodMap,
    snapshot: Snapshot,
}

/// The enforcer's budgets in a test: for one eviction request, and for a decision's Events.
#[derive(Debug, Clone, Copy)]
struct Budgets {
    eviction: Duration,
    events: Duration,
    read_bound: Duration,
}

impl Budgets {
    const DEFAULT: Budgets = Budgets {
        eviction: Duration::from_secs(5),
        events: Duration::from_secs(2),
        read_bound: gpu_warden::act::enforce::DEFAULT_READ_BOUND,
    };

    /// An eviction request without an answer within `d` is in doubt.
    fn eviction(d: Duration) -> Budgets {
        Budgets {
            eviction: d,
            ..Budgets::DEFAULT
        }
    }

    /// A decision's Events are given up after `d`.
    fn events(d: Duration) -> Budgets {
        Budgets {
            events: d,
            ..Budgets::DEFAULT
        }
    }
}

impl World {
    /// A double holding `pods` (all on `NODE`), an enforcer with short timeouts, and a
    /// guard in `mode` that has seen GPU 0 with `used` MiB in use.
    async fn new(mode: Mode, pods: &[P], used: u64) -> Result<World> {
        Self::with_budgets(mode, pods, used, Budgets::DEFAULT).await
    }

    /// Enforce mode on GPU 0 with 9600 MiB in use, the enforcer on `budgets`.
    async fn enforcing(pods: &[P], budgets: Budgets) -> Result<World> {
        Self::with_budgets(Mode::Enforce, pods, 9600, budgets).await
    }

    async fn with_budgets(mode: Mode, pods: &[P], used: u64, budgets: Budgets) -> Result<World> {
        // The faithful kubelet (the default): an evicted pod stays, terminating, through its
        // 7 s grace plus the watch latency — longer than any of these tests looks.
        let (server, clients) = double().await?;
        for p in pods {
            let annotations: serde_json::Map<String, Value> = p
                .annotations
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            server.add_pod(json!({
                "metadata": {"name": p.name, "namespace": p.ns, "uid": uid(p.name), "annotations": annotations},
                "spec": {"nodeName": NODE, "priority": p.priority},
            }))?;
        }
        let metrics = SelfMetrics::new("test")?;
        let policy = Policy {
            mode,
            eviction_grace_period_seconds: GRACE,
            ..Policy::default()
        };
        let enforcer = Enforcer::new(
            &clients,
            NODE,
            metrics.clone(),
            &policy,
            Arc::new(SystemClock::new()),
        )
        .with_timeouts(budgets.eviction, budgets.events)
        .with_read_bound(budgets.read_bound);
        let pod_map: PodMap = pods.iter().map(|p| (uid(p.name), info(p))).collect();
        let processes = pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let pod = Pod {
                    namespace: p.ns,
                    name: p.name,
                    uid: &uid(p.name),
                };
                process(1000 + i as u32, "python", pod, "main", p.mib)
            })
            .collect();
        let snapshot = snapshot(used, processes);
        let guard = Guard::new(policy);
        Ok(World {
            server,
            metrics,
            enforcer,
            guard,
            pods: pod_map,
            snapshot,
        })
    }

    /// Makes the next eviction(s) of pod `ci/<name>` meet `action` (`times`: how many; all
    /// when None).
    fn fault_eviction(&self, name: &str, action: FaultAction, times: Option<usize>) {
        let f = Fault::new(
            format!("/api/v1/namespaces/ci/pods/{name}/eviction"),
            action,
        )
        .method(Method::POST);
        self.server.inject(match times {
            Some(n) => f.times(n),
            None => f,
        });
    }

    /// The guard's view of the current snapshot and pods at `t` seconds.
    fn observe(&mut self, t: f64) -> Vec<Decision> {
        self.guard.observe(
            &Arc::new(self.snapshot.clone()),
            &Arc::new(self.pods.clone()),
            Duration::from_secs_f64(t),
        )
    }

    /// The guard's one decision on the current snapshot at `t` seconds.
    fn decide(&mut self, t: f64) -> Decision {
        let mut ds = self.observe(t);
        assert_eq!(ds.len(), 1, "{ds:#?}");
        ds.remove(0)
    }

    /// Executes `d` and feeds the outcomes back, as the agent loop does.
    async fn execute(&mut self, d: &Decision, t: f64) -> Vec<(String, EvictionOutcome)> {
        let outcomes = self.enforcer.execute(d, &self.pods).await;
        for (uid, outcome) in &outcomes {
            self.guard
                .record_outcome(d.id, uid, outcome.clone(), Duration::from_secs_f64(t));
        }
        outcomes
    }

    fn attempted(&self) -> Vec<String> {
        self.server
            .eviction_attempts()
            .into_iter()
            .map(|e| format!("{}/{}", e.namespace, e.name))
            .collect()
    }

    fn phase(&self) -> GpuPhase {
        self.guard.status().gpus[0].phase.clone()
    }

    fn evictions_metric(&self, ns: &str, result: &str) -> u64 {
        self.metrics
            .evictions
            .with_label_values(&[ns, result])
            .get()
    }

    fn decisions_metric(&self, mode: &str, trigger: &str) -> u64 {
        self.metrics
            .decisions
            .with_label_values(&["false", mode, trigger])
            .get()
    }

    fn pod_events(&self) -> Vec<StoredEvent> {
        self.server
            .events()
            .into_iter()
            .filter(|e| about(e)["kind"] == "Pod")
            .collect()
    }

    fn node_events(&self) -> Vec<StoredEvent> {
        self.server
            .events()
            .into_iter()
            .filter(|e| about(e)["kind"] == "Node")
            .collect()
    }
}

fn info(p: &P) -> PodInfo {
    PodInfo {
        uid: uid(p.name),
        namespace: p.ns.into(),
        name: p.name.into(),
        priority: p.priority,
        priority_class: None,
        owner_kind: Some("Job".into()),
        is_mirror: false,
        labels: BTreeMap::new(),
        annotations: p
            .annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        created_at: None,
        terminating: false,
        phase: None,
        containers: vec![],
    }
}

/// `regarding` (events.k8s.io) or `involvedObject` (core/v1).
fn about(e: &StoredEvent) -> &Value {
    match e.api {
        EventApi::EventsV1 => &e.object["regarding"],
        EventApi::CoreV1 => &e.object["involvedObject"],
    }
}

fn note(e: &StoredEvent) -> &str {
    e.object["note"]
        .as_str()
        .or_else(|| e.object["message"].as_str())
        .unwrap_or("")
}

fn evicted(name: &str) -> (String, EvictionOutcome) {
    (uid(name), EvictionOutcome::Evicted)
}

fn ci_job(mut pod: P) -> P {
    pod.annotations = vec![
        ("job.runner.gitlab.com/id", "987654"),
        (
            "job.runner.gitlab.com/url",
            "https://gitlab.example.com/ml/models/-/jobs/987654",
        ),
    ];
    pod
}

/// (1) and (6): the top candidate is evicted with the configured grace period; the
/// high-priority pod is untouched; the Warning Event names GPU, memory and the GitLab job;
/// one Node Event; metrics counted; the guard cools down on the victim's process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforce_evicts_the_top_candidate_with_grace_and_tells_why() -> Result {
    let pods = [
        ci_job(p("ci", "build-gpu-1", 0, 3000)),
        p("ml", "train", 1000, 6000),
    ];
    let mut w = World::new(Mode::Enforce, &pods, 9600).await?;
    let d = w.decide(0.0);
    assert_eq!(d.planned, 1);
    let outcomes = w.execute(&d, 0.1).await;
    assert_eq!(outcomes, vec![evicted("build-gpu-1")]);

    // The request: policy/v1 Eviction with the grace period and the UID precondition.
    let attempts = w.server.eviction_attempts();
    assert_eq!(w.attempted(), vec!["ci/build-gpu-1"]);
    assert_eq!(attempts[0].grace_period_seconds, Some(GRACE));
    assert_eq!(attempts[0].body["apiVersion"], "policy/v1");
    assert_eq!(attempts[0].body["kind"], "Eviction");
    assert_eq!(
        attempts[0].body["deleteOptions"],
        json!({"gracePeriodSeconds": GRACE, "preconditions": {"uid": "uid-build-gpu-1"}})
    );
    let posts: Vec<_> = w
        .server
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .collect();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].method, Method::POST);
    assert_eq!(
        posts[0].path,
        "/api/v1/namespaces/ci/pods/build-gpu-1/eviction"
    );
    // No DELETE of any pod, ever.
    assert!(w
        .server
        .requests()
        .iter()
        .all(|r| r.method != Method::DELETE));
    let train = w.server.pod("ml", "train").ok_or("train is gone")?;
    assert!(train["metadata"].get("deletionTimestamp").is_none());

    // The Warning Event on the victim.
    let evs = w.pod_events();
    assert_eq!(evs.len(), 1, "{evs:#?}");
    let e = &evs[0];
    assert_eq!(e.api, EventApi::EventsV1);
    assert_eq!(e.namespace, "ci");
    let o = &e.object;
    assert_eq!(o["type"], "Warning");
    assert_eq!(o["reason"], "GPUMemoryPressure");
    assert_eq!(o["action"], "Evict");
    assert_eq!(o["reportingController"], "gpu-warden.io/guard");
    assert_eq!(o["reportingInstance"], "gpu-warden-gpu-node-1");
    assert!(o["eventTime"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(
        o["regarding"],
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "ci", "name": "build-gpu-1", "uid": "uid-build-gpu-1"})
    );
    let n = note(e);
    for frag in [
        "GPU 0 (GPU-8f1b2c3d-0000-1111-2222-333344445555)",
        "9600 of 10000 MiB used, 400 MiB free",
        "gpu-warden evicted this job to keep GPU 0 from running out of memory",
        "it used 3000 MiB of GPU memory and declared none.",
        "KUBERNETES_POD_ANNOTATIONS_VRAM: \"gpu-warden.io/vram-request-mib=3072\"",
        "Ranked 1 of 2: uses 2.9 GiB, 2.9 GiB over its request of 0 MiB",
        "GitLab CI job 987654 (https://gitlab.example.com/ml/models/-/jobs/987654)",
    ] {
        assert!(n.contains(frag), "{frag:?} not in {n:?}");
    }
    assert!(n.len() <= 1024);

    // Exactly one Node Event.
    let nodes = w.node_events();
    assert_eq!(nodes.len(), 1, "{nodes:#?}");
    assert_eq!(nodes[0].namespace, "default");
    assert_eq!(about(&nodes[0])["name"], NODE);
    assert_eq!(nodes[0].object["type"], "Warning");
    assert!(
        note(&nodes[0]).contains("Results: ci/build-gpu-1 evicted."),
        "{}",
        note(&nodes[0])
    );

    assert_eq!(w.evictions_metric("ci", "evicted"), 1);
    assert_eq!(w.decisions_metric("enforce", "hard"), 1);
    assert!(
        matches!(w.phase(), GpuPhase::Cooldown { waiting_for_pids, .. } if waiting_for_pids == vec![1000])
    );
    Ok(())
}

/// (2): a PDB-protected top candidate answers 429 at once (no kube retry) and the next
/// one is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_blocked_candidate_is_skipped_at_once() -> Result {
    let pods = [
        p("ci", "protected", 0, 3000),
        p("ci", "next", 1, 3000),
        p("ml", "train", 1000, 3000),
    ];
    let mut w = World::new(Mode::Enforce, &pods, 9600).await?;
    w.server.protect_pod("ci", "protected");
    let d = w.decide(0.0);
    let t0 = Instant::now();
    let outcomes = w.execute(&d, 0.1).await;
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "took {took:?}: is kube's 429 retry on?"
    );
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert!(
        matches!(&outcomes[0].1, EvictionOutcome::Blocked(m) if m.starts_with("429")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[1], evicted("next"));
    assert_eq!(
        w.attempted(),
        vec!["ci/protected", "ci/next"],
        "one attempt each"
    );
    assert_eq!(w.evictions_metric("ci", "blocked"), 1);
    assert_eq!(w.evictions_metric("ci", "evicted"), 1);
    // Only the evicted pod gets a pod Event; the Node Event tells the whole story.
    let evs = w.pod_events();
    assert_eq!(evs.len(), 1);
    assert_eq!(about(&evs[0])["name"], "next");
    let nodes = w.node_events();
    assert_eq!(nodes.len(), 1);
    assert!(
        note(&nodes[0]).contains("ci/protected blocked (429"),
        "{}",
        note(&nodes[0])
    );
    Ok(())
}

/// (3): dry-run evicts nothing, emits Normal `GPUMemoryPressureDryRun` Events on each
/// planned victim and the Node, and counts the decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_evicts_nothing_but_announces() -> Result {
    let pods = [
        p("ci", "a", 0, 500),
        p("ci", "b", 1, 500),
        p("ml", "train", 1000, 3000),
    ];
    let mut w = World::new(Mode::DryRun, &pods, 9600).await?;
    let d = w.decide(0.0);
    assert_eq!(d.planned, 2);
    let outcomes = w.execute(&d, 0.1).await;
    assert!(outcomes.is_empty());
    assert!(w.server.eviction_attempts().is_empty());
    let evs = w.pod_events();
    // Events are sent concurrently: their arrival order is not part of the contract.
    let mut named: Vec<String> = evs
        .iter()
        .map(|e| about(e)["name"].as_str().unwrap_or_default().to_string())
        .collect();
    named.sort();
    assert_eq!(named, vec!["a", "b"]);
    for e in evs.iter().chain(w.node_events().iter()) {
        assert_eq!(e.object["type"], "Normal");
        assert_eq!(e.object["reason"], "GPUMemoryPressureDryRun");
        assert_eq!(e.object["action"], "WouldEvict");
    }
    assert!(note(&evs[0]).starts_with("Dry run, nothing was done: gpu-warden would have evicted"));
    assert_eq!(w.node_events().len(), 1);
    assert_eq!(w.decisions_metric("dry-run", "hard"), 1);
    assert_eq!(w.decisions_metric("enforce", "hard"), 0);
    assert_eq!(w.evictions_metric("ci", "evicted"), 0);
    // The guard cools down waiting for the planned victims' processes.
    assert!(
        matches!(w.phase(), GpuPhase::Cooldown { waiting_for_pids, .. } if waiting_for_pids == vec![1000, 1001])
    );
    Ok(())
}

/// (4): two small victims are needed → both, and no third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_small_victims_and_no_third() -> Result {
    let pods = [
        p("ci", "a", 0, 500),
        p("ci", "b", 1, 500),
        p("ci", "c", 2, 500),
        p("ml", "train", 1000, 3000),
    ];
    let mut w = World::new(Mode::Enforce, &pods, 9600).await?;
    let d = w.decide(0.0);
    let outcomes = w.execute(&d, 0.1).await;
    assert_eq!(outcomes, vec![evicted("a"), evicted("b")]);
    assert_eq!(w.attempted(), vec!["ci/a", "ci/b"]);
    assert_eq!(w.pod_events().len(), 2);
    assert_eq!(w.node_events().len(), 1);
    assert!(matches!(w.phase(), GpuPhase::Cooldown { .. }));
    Ok(())
}

/// (5): an internal error (500) may still be carried out (`etcdserver: request timed out`
/// is a write etcd may commit): it is in doubt and the walk stops there, the next
/// candidate untouched. A 404 is AlreadyGone (and counts as reclaimed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_missing_pods() -> Result {
    let pods = [
        p("ci", "flaky", 0, 3000),
        p("ci", "gone", 1, 3000),
        p("ci", "spare", 2, 3000),
    ];
    let mut w = World::new(Mode::Enforce, &pods, 9600).await?;
    w.server.delete_pod("ci", "gone");
    w.fault_eviction("flaky", FaultAction::Status(500), Some(1));
    let d = w.decide(0.0);
    let outcomes = w.execute(&d, 0.1).await;
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert!(
        matches!(&outcomes[0].1, EvictionOutcome::InDoubt(m) if m.starts_with("500")),
        "{outcomes:?}"
    );
    assert_eq!(w.evictions_metric("ci", "in_doubt"), 1);
    assert!(w.server.pod("ci", "spare").is_some());

    w.server.protect_pod("ci", "flaky");
    let mut w2 = World::new(Mode::Enforce, &pods, 9600).await?;
    w2.server.delete_pod("ci", "gone");
    w2.server.protect_pod("ci", "flaky");
    let d = w2.decide(0.0);
    let outcomes = w2.execute(&d, 0.1).await;
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert!(
        matches!(&outcomes[0].1, EvictionOutcome::Blocked(_)),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[1], (uid("gone"), EvictionOutcome::AlreadyGone));
    assert_eq!(w2.evictions_metric("ci", "already_gone"), 1);
    assert!(w2.server.pod("ci", "spare").is_some());
    assert!(
        w2.pod_events().is_empty(),
        "no Event on a gone or unevicted pod"
    );
    assert_eq!(w2.node_events().len(), 1);
    Ok(())
}

/// In doubt is not failed: an eviction that gets no answer may still be carried out, so
/// the walk stops there (the next candidate is not evicted), the outcome is `InDoubt`, and
/// the guard waits on that GPU until the pod is seen gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_eviction_is_in_doubt_and_stops_the_walk() -> Result {
    let pods = [p("ci", "stuck", 0, 3000), p("ci", "next", 1, 3000)];
    let mut w = World::enforcing(&pods, Budgets::eviction(Duration::from_millis(300))).await?;
    w.fault_eviction("stuck", FaultAction::Hang, None);
    let d = w.decide(0.0);
    let t0 = Instant::now();
    let outcomes = w.execute(&d, 0.1).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(
        outcomes.len(),
        1,
        "the walk stops at the doubt: {outcomes:?}"
    );
    assert!(
        matches!(&outcomes[0].1, EvictionOutcome::InDoubt(m) if m.contains("no answer within 300 ms")),
        "{outcomes:?}"
    );
    assert!(w.server.pod("ci", "next").is_some());
    let posts: Vec<String> = w
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::POST && r.path.ends_with("/eviction"))
        .map(|r| r.path)
        .collect();
    assert_eq!(
        posts,
        vec!["/api/v1/namespaces/ci/pods/stuck/eviction".to_string()]
    );
    assert!(
        matches!(w.phase(), GpuPhase::InDoubt { .. }),
        "{:?}",
        w.phase()
    );
    assert_eq!(w.evictions_metric("ci", "in_doubt"), 1);
    // Still under pressure a second later, with the pod still in view: no new decision.
    let ds = w.observe(1.0);
    assert!(ds.is_empty(), "{ds:#?}");
    // The pod is seen gone: the doubt resolves as evicted, and the guard cools down on it.
    w.pods.remove(&uid("stuck"));
    let ds = w.observe(2.0);
    assert!(ds.is_empty(), "{ds:#?}");
    assert!(
        matches!(w.phase(), GpuPhase::Cooldown { .. }),
        "{:?}",
        w.phase()
    );
    Ok(())
}

/// A server that answers an eviction late (after the client gave up) and carries it out:
/// one pod goes, as planned, never two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_eviction_that_is_carried_out_evicts_one_pod_not_two() -> Result {
    let pods = [p("ci", "slow", 0, 3000), p("ci", "next", 1, 3000)];
    let mut w = World::enforcing(&pods, Budgets::eviction(Duration::from_millis(300))).await?;
    w.fault_eviction(
        "slow",
        FaultAction::Delay(Duration::from_millis(700)),
        Some(1),
    );
    let d = w.decide(0.0);
    let outcomes = w.execute(&d, 0.1).await;
    assert!(
        matches!(&outcomes[..], [(u, EvictionOutcome::InDoubt(_))] if *u == uid("slow")),
        "{outcomes:?}"
    );
    // The server carries it out after the client gave up.
    let t0 = Instant::now();
    while w.server.evictions().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "the late eviction never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The watch shows the pod terminating: resolved as evicted, cooldown, no second victim.
    w.pods.get_mut(&uid("slow")).unwrap().terminating = true;
    let ds = w.observe(1.0);
    assert!(ds.is_empty(), "{ds:#?}");
    assert!(
        matches!(w.phase(), GpuPhase::Cooldown { .. }),
        "{:?}",
        w.phase()
    );
    let names: Vec<String> = w.server.evictions().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec!["slow".to_string()]);
    Ok(())
}

/// The connection breaks after the request body: whether or not the server carried the
/// eviction out, the outcome is in doubt and nobody else is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_after_the_request_is_in_doubt() -> Result {
    for apply in [true, false] {
        let pods = [p("ci", "cut", 0, 3000), p("ci", "next", 1, 3000)];
        let mut w = World::new(Mode::Enforce, &pods, 9600).await?;
        w.fault_eviction("cut", FaultAction::DropAfterBody { apply }, Some(1));
        let d = w.decide(0.0);
        let outcomes = w.execute(&d, 0.1).await;
        assert!(
            matches!(&outcomes[..], [(u, EvictionOutcome::InDoubt(_))] if *u == uid("cut")),
            "apply={apply}: {outcomes:?}"
        );
        assert_eq!(
            w.server.evictions().len(),
            usize::from(apply),
            "apply={apply}"
        );
        assert!(w.server.pod("ci", "next").is_some());
        assert!(w
            .server
            .pod("ci", "next")
            .unwrap()
            .pointer("/metadata/deletionTimestamp")
            .is_none());
    }
    Ok(())
}

/// Fresh before acting: a pod the (stale) view thinks evictable but whose fresh read says
/// otherwise is not evicted; the walk moves to the next candidate, itself read fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_changed_since_the_plan_is_not_evicted() -> Result {
    let pods = [
        p("ci", "now-never", 0, 3000),
        p("ci", "recreated", 1, 3000),
        p("ci", "moved", 2, 3000),
        p("ci", "ok", 3, 3000),
    ];
    let mut w = World::new(Mode::Enforce, &pods, 9600).await?;
    w.server.update_pod("ci", "now-never", |p| {
        p["metadata"]["annotations"]["gpu-warden.io/evict"] = json!("never");
    });
    w.server.update_pod("ci", "moved", |p| {
        p["spec"]["nodeName"] = json!("other-node");
    });
    w.server.delete_pod("ci", "recreated");
    w.server.add_pod(json!({
        "metadata": {"name": "recreated", "namespace": "ci", "uid": "uid-new"},
        "spec": {"nodeName": NODE, "priority": 1},
    }))?;
    let d = w.decide(0.0);
    assert_eq!(d.planned, 1, "{}", d.summary());
    let outcomes = w.execute(&d, 0.1).await;
    let results: Vec<(&str, &str)> = outcomes
        .iter()
        .map(|(u, o)| (u.as_str(), o.as_str()))
        .collect();
    assert_eq!(
        results,
        vec![
            ("uid-now-never", "skipped"),
            // re-created under its name: the pod we chose is gone
            ("uid-recreated", "already_gone"),
        ],
        "{outcomes:?}"
    );
    assert!(
        matches!(&outcomes[0].1, EvictionOutcome::Skipped(m) if m.contains("evict: never")),
        "{outcomes:?}"
    );
    // The old pod's gone-ness reclaims the plan: nobody evicted at all.
    assert!(
        w.server.evictions().is_empty(),
        "{:?}",
        w.server.evictions()
    );
    assert_eq!(w.attempted(), Vec::<String>::new());
    // The skipped pod is not a candidate for a while.
    assert!(w
        .guard
        .status()
        .refused
        .iter()
        .any(|r| r.uid == uid("now-never")));
    Ok(())
}

/// The UID precondition: the double answers 409 as a real server does, and the outcome is
/// AlreadyGone (the pod chosen is not the one under that name now).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_uid_precondition_is_honoured() -> Result {
    let pods = [p("ci", "a", 0, 3000)];
    let w = World::new(Mode::Enforce, &pods, 9600).await?;
    let client = reqwest_like_post(
        &w.server.url(),
        "/api/v1/namespaces/ci/pods/a/eviction",
        r#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"a","namespace":"ci"},"deleteOptions":{"preconditions":{"uid":"someone-else"}}}"#,
    )
    .await?;
    assert!(client.starts_with("HTTP/1.1 409"), "{client}");
    assert!(
        client.contains(
            "the UID in the precondition (someone-else) does not match the UID in record (uid-a)"
        ),
        "{client}"
    );
    assert!(w.server.evictions().is_empty());
    assert!(w
        .server
        .pod("ci", "a")
        .unwrap()
        .pointer("/metadata/deletionTimestamp")
        .is_none());
    Ok(())
}

/// A minimal HTTP/1.1 POST over a raw socket; returns the whole answer.
async fn reqwest_like_post(base: &str, path: &str, body: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    sock.read_to_string(&mut out).await?;
    Ok(out)
}

/// What the job's author reads: GitLab Runner's Kubernetes executor, when a job fails, lists
/// the pod's Warning Events through the core/v1 API (`CoreV1().Events(ns).List` with
/// `fieldSelector=involvedObject.name=<pod>,type=Warning`, executors/kubernetes
/// `logPodWarningEvents`) and prints each as `WARNING: Event retrieved from the cluster:
/// <message>`. The agent creates its Events through events.k8s.io/v1; the API server (here the
/// double, converting as kubernetes' pkg/apis/events/v1/conversion.go does) shows them there
/// with the note as the message. The line opens with what to declare next time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_prints_the_eviction_as_one_actionable_line() -> Result {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    let pods = [
        ci_job(p("ci", "build-gpu-1", 0, 3000)),
        p("ml", "train", 1000, 6000),
    ];
    let mut w = World::new(Mode::Enforce, &pods, 9600).await?;
    let d = w.decide(0.0);
    assert_eq!(w.execute(&d, 0.1).await, vec![evicted("build-gpu-1")]);
    let client = kube::Client::try_from(kube::Config::new(w.server.url().parse()?))?;
    let events: kube::Api<CoreEvent> = kube::Api::namespaced(client, "ci");
    let list = events
        .list(
            &kube::api::ListParams::default()
                .fields("involvedObject.name=build-gpu-1,type=Warning"),
        )
        .await?;
    let log: Vec<String> = list
        .items
        .iter()
        .map(|e| {
            format!(
                "WARNING: Event retrieved from the cluster: {}",
                e.message.as_deref().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(log.len(), 1, "{log:#?}");
    assert!(
        log[0].starts_with(
            "WARNING: Event retrieved from the cluster: gpu-warden evicted this job to keep GPU 0 \
             from running out of memory for every job on it: it used 3000 MiB of GPU memory and \
             declared none. Next time declare what it needs, e.g. the CI/CD variable \
             KUBERNETES_POD_ANNOTATIONS_VRAM: \"gpu-warden.io/vram-request-mib=3072\""
        ),
        "{}",
        log[0]
    );
    assert!(!log[0].contains('\n'));
    // The high-priority neighbour, not evicted, has no Warning to print.
    let ml: kube::Api<CoreEvent> = kube::Api::namespaced(
        kube::Client::try_from(kube::Config::new(w.server.url().parse()?))?,
        "ml",
    );
    let none = ml
        .list(&kube::api::ListParams::default().fields("involvedObject.name=train,type=Warning"))
        .await?;
    assert!(none.items.is_empty());
    Ok(())
}

/// (6): one Node Event per decision, through events.k8s.io/v1 only: an API server answering
/// 404 there gets no core/v1 Event instead (the fallback is gone, issue 39) and the eviction
/// is not held up; hanging Events neither block nor fail evictions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_best_effort_through_events_k8s_io_only() -> Result {
    let pods = [ci_job(p("ci", "a", 0, 3000)), p("ci", "b", 1, 3000)];
    let mut w = World::enforcing(&pods, Budgets::events(Duration::from_millis(500))).await?;
    let d1 = w.decide(0.0);
    assert_eq!(w.execute(&d1, 0.1).await, vec![evicted("a")]);
    let evs = w.server.events();
    assert_eq!(evs.len(), 2, "{evs:#?}");
    assert!(evs.iter().all(|e| e.api == EventApi::EventsV1));
    assert_eq!(w.node_events().len(), 1);

    // events.k8s.io answers 404: the eviction goes on, nothing is sent through core/v1.
    let mut w = World::enforcing(&pods, Budgets::events(Duration::from_millis(500))).await?;
    w.server
        .inject(Fault::new("/apis/events.k8s.io/", FaultAction::Status(404)));
    let d = w.decide(0.0);
    assert_eq!(w.execute(&d, 0.1).await, vec![evicted("a")]);
    assert!(w.server.events().is_empty());
    assert!(
        w.server
            .requests()
            .iter()
            .all(|r| !(r.path.starts_with("/api/v1/") && r.path.contains("/events"))),
        "no core/v1 Event is tried"
    );

    // Events hang: the eviction outcome still comes back, within the Events budget.
    let mut w = World::enforcing(&pods, Budgets::events(Duration::from_millis(300))).await?;
    w.server
        .inject(Fault::new("/apis/events.k8s.io/", FaultAction::Hang));
    let d = w.decide(0.0);
    let t0 = Instant::now();
    assert_eq!(w.execute(&d, 0.1).await, vec![evicted("a")]);
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    Ok(())
}

/// (7): the API server is down → the fresh read of the first victim is tried again for
/// the read bound (here 500 ms) and then given up: nothing is evicted, nothing panics, and
/// the GPU pauses before deciding again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_down_gives_up_within_the_read_bound() -> Result {
    let pods = [p("ci", "a", 0, 3000), p("ci", "b", 1, 3000)];
    // The main client retries 503s for Events until their budget runs out: keep it short.
    let budgets = Budgets {
        read_bound: Duration::from_millis(500),
        ..Budgets::events(Duration::from_millis(300))
    };
    let mut w = World::enforcing(&pods, budgets).await?;
    w.server.set_down(true);
    let d = w.decide(0.0);
    let t0 = Instant::now();
    let outcomes = w.execute(&d, 0.1).await;
    assert!(
        t0.elapsed() < Duration::from_millis(2000),
        "{:?}",
        t0.elapsed()
    );
    // The fresh read of the first victim never answers: nothing is evicted, nothing more
    // tried.
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert!(
        matches!(&outcomes[0].1, EvictionOutcome::Aborted(m) if m.contains("did not answer the fresh read of the pod within 500ms")),
        "{outcomes:?}"
    );
    assert_eq!(w.evictions_metric("ci", "aborted"), 1);
    assert!(w.server.eviction_attempts().is_empty());
    // The GPU pauses briefly instead of deciding again on every poll.
    assert!(
        matches!(w.phase(), GpuPhase::Cooldown { ref waiting_for_pids, .. } if waiting_for_pids.is_empty()),
        "{:?}",
        w.phase()
    );
    w.server.set_down(false);
    Ok(())
}

/// A rate-limited decision with no allowance evicts nobody but still tells the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_without_allowance_evicts_nobody() -> Result {
    let pods = [p("ci", "a", 0, 3000)];
    let mut w = World::new(Mode::Enforce, &pods, 9600).await?;
    let mut d = w.decide(0.0);
    d.max_evictions = 0;
    d.planned = 0;
    d.rate_limited = true;
    let outcomes = w.enforcer.execute(&d, &w.pods).await;
    assert!(outcomes.is_empty());
    assert!(w.server.eviction_attempts().is_empty());
    let nodes = w.node_events();
    assert_eq!(nodes.len(), 1);
    assert!(
        note(&nodes[0]).contains("cut by the rate limit to 0"),
        "{}",
        note(&nodes[0])
    );
    assert!(note(&nodes[0]).contains("Nothing was evicted."));
    Ok(())
}
