//! The agent's Lease beside its Node annotations, against the Kubernetes API double over
//! real HTTP with the real kube client; and the extender's Lease and Node reflectors
//! reading what they wrote.
//!
//! Intervals are scaled down (renewal 300 ms for 15 s, the Node's 5-minute cadence as a
//! minute or a second) so each test takes seconds.

use apiserver_double::{ApiServer, Method, RecordedRequest};
use bytes::Bytes;
use gpu_warden::act::lease::{spawn_lease, LeaseConfig, LeaseHandle, LEASE_LABEL};
use gpu_warden::act::node_annotations::{spawn_annotator_with, AnnotatorHandle, AnnotatorTiming};
use gpu_warden::extender::judge::{judge, JudgePolicy, Reason};
use gpu_warden::extender::lease_cache::spawn_live_nodes;
use gpu_warden::extender::metrics::ExtenderMetrics;
use gpu_warden::extender::nodes::read_node;
use gpu_warden::extender::watch::{spawn_node_cache, NodeLookup};
use gpu_warden::model::clock::{Clock, SystemClock};
use gpu_warden::model::pressure::Pressure;
use gpu_warden::publish::annotations::AnnotationConfig;
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::publish::state::Published;
use gpu_warden::sample::sampler::Stamper;
use gpu_warden::sample::scenario::Scenario;
use gpu_warden::sample::sim::SimSource;
use gpu_warden::sample::{GpuSource, PollRequest};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

const NODE: &str = "gpu-node-1";
const NS: &str = "gpu-warden";
const NODE_PATH: &str = "/api/v1/nodes/gpu-node-1";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/gpu-warden/leases/gpu-node-1";
const POLL: Duration = Duration::from_millis(25);

const STEADY: &str = "
gpus:
  - {model: NVIDIA A10G, count: 2, memory_mib: 23028, reserved_mib: 434}
processes:
  - {pid: 100, gpu: 0, memory: {constant: 4096}}
";

struct Rig {
    server: ApiServer,
    client: kube::Client,
    src: SimSource,
    stamper: Stamper,
    clock: Arc<dyn Clock>,
    tx: watch::Sender<Option<Arc<Published>>>,
    annotator: Option<AnnotatorHandle>,
    lease: Option<LeaseHandle>,
}

fn node_cfg(heartbeat: Duration, min_interval: Duration) -> AnnotationConfig {
    AnnotationConfig {
        heartbeat,
        min_interval,
        // The Node beside a Lease (the agent's default then).
        pressure_rise_at_once: false,
        ..AnnotationConfig::default()
    }
}

fn lease_cfg(renew: Duration) -> LeaseConfig {
    LeaseConfig {
        namespace: NS.into(),
        name: NODE.into(),
        holder: "gpu-warden-x7k2p".into(),
        renew_interval: renew,
        duration: renew * 4,
    }
}

/// An agent's two writers: the annotator, and the Lease task unless `lease` is `None` (an
/// agent from before Leases).
async fn rig(node: AnnotationConfig, lease: Option<LeaseConfig>) -> Rig {
    rig_carrying(node, lease, None).await
}

/// [`rig`] whose Lease also keeps the guard's carried state from `carry`.
async fn rig_carrying(
    node: AnnotationConfig,
    lease: Option<LeaseConfig>,
    carry: Option<watch::Receiver<Option<String>>>,
) -> Rig {
    let server = ApiServer::start().await.unwrap();
    server
        .add_node(json!({"metadata": {"name": NODE, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}}}))
        .unwrap();
    let client = gpu_warden::act::client::from_config(
        kube::Config::new(server.url().parse().unwrap()),
        "test",
    )
    .unwrap()
    .direct;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let (tx, rx) = watch::channel(None);
    let timing = AnnotatorTiming {
        request_timeout: Duration::from_millis(500),
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
        shutdown_timeout: Duration::from_millis(1500),
    };
    let lease =
        lease.map(|l| spawn_lease(client.clone(), l, &node, rx.clone(), clock.clone(), carry));
    let annotator = spawn_annotator_with(
        client.clone(),
        NODE.into(),
        node,
        rx,
        clock.clone(),
        SelfMetrics::new("test").unwrap(),
        timing,
    );
    Rig {
        server,
        client,
        src: SimSource::new(Scenario::parse(STEADY, "test").unwrap()),
        stamper: Stamper::default(),
        clock,
        tx,
        annotator: Some(annotator),
        lease,
    }
}

impl Rig {
    fn publish(&mut self, pressure: Pressure) {
        let at = self.clock.mono();
        let raw = self.src.poll(
            at,
            PollRequest {
                process_utilization: false,
                slow_counters: true,
            },
        );
        let snap = self.stamper.stamp(raw, at, self.clock.wall());
        self.tx.send_replace(Some(Arc::new(Published {
            snapshot: Arc::new(snap),
            metrics: Bytes::new(),
            published_at: at,
            guard: None,
            pressure: BTreeMap::from([(0, pressure)]),
            replicas: None,
            figures: None,
        })));
    }

    /// Polls every 25 ms for `total` with `pressure`.
    async fn run(&mut self, total: Duration, pressure: Pressure) {
        let end = Instant::now() + total;
        while Instant::now() < end {
            self.publish(pressure);
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls until `done` holds (at most 5 s).
    async fn until(&mut self, pressure: Pressure, done: impl Fn(&Rig) -> bool) -> Instant {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            if done(self) {
                return Instant::now();
            }
            assert!(
                Instant::now() < end,
                "timed out; requests: {:?}",
                summary(&self.server.requests())
            );
            self.publish(pressure);
            tokio::time::sleep(POLL).await;
        }
    }

    fn requests(&self, method: Method, path: &str) -> Vec<RecordedRequest> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.method == method && r.path == path && r.status.is_some_and(|s| s < 300))
            .collect()
    }

    fn node_annotations(&self) -> BTreeMap<String, String> {
        let n = self.server.node(NODE).unwrap();
        serde_json::from_value(n["metadata"]["annotations"].clone()).unwrap_or_default()
    }

    fn lease_annotations(&self) -> BTreeMap<String, String> {
        self.server
            .lease(NS, NODE)
            .and_then(|l| serde_json::from_value(l["metadata"]["annotations"].clone()).ok())
            .unwrap_or_default()
    }

    async fn stop(&mut self) {
        if let Some(l) = self.lease.take() {
            l.shutdown().await;
        }
        if let Some(a) = self.annotator.take() {
            let _ = a.shutdown().await;
        }
    }
}

fn summary(reqs: &[RecordedRequest]) -> Vec<(Method, String, Option<u16>)> {
    reqs.iter()
        .map(|r| (r.method.clone(), r.path.clone(), r.status))
        .collect()
}

fn pressure_of(ann: &BTreeMap<String, String>) -> Option<String> {
    let doc: Value = serde_json::from_str(ann.get("gpu-warden.io/vram")?).ok()?;
    doc["gpus"][0]["pressure"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_is_one_lease_renewal_per_interval_and_no_node_patch() {
    let renew = Duration::from_millis(300);
    // The Node's 5-minute cadence, scaled to a minute: longer than the test.
    let minute = Duration::from_secs(60);
    let mut r = rig(node_cfg(minute, minute), Some(lease_cfg(renew))).await;
    r.until(Pressure::None, |r| {
        !r.requests(Method::PUT, LEASE_PATH).is_empty()
    })
    .await;
    let started = Instant::now();
    r.run(Duration::from_millis(2100), Pressure::None).await;
    let elapsed = started.elapsed();

    let patches = r.requests(Method::PATCH, NODE_PATH);
    assert_eq!(
        patches.len(),
        1,
        "the first publication only: {:?}",
        summary(&patches)
    );
    let creates = r.requests(
        Method::POST,
        "/apis/coordination.k8s.io/v1/namespaces/gpu-warden/leases",
    );
    assert_eq!(creates.len(), 1, "created once");
    let renewals: Vec<Instant> = r
        .requests(Method::PUT, LEASE_PATH)
        .iter()
        .map(|q| q.at)
        .filter(|t| *t >= started)
        .collect();
    let most = 1 + (elapsed.as_millis() / renew.as_millis()) as usize;
    assert!(
        renewals.len() >= most - 2 && renewals.len() <= most,
        "{} renewals in {elapsed:?} at {renew:?}",
        renewals.len()
    );
    for w in renewals.windows(2) {
        let gap = w[1] - w[0];
        assert!(gap >= renew - Duration::from_millis(15), "{gap:?}");
        assert!(gap < renew + Duration::from_millis(250), "{gap:?}");
    }
    // Same figures on both; the Lease's are newer and its renewal time moves.
    let (node, lease) = (r.node_annotations(), r.lease_annotations());
    assert_eq!(
        node["gpu-warden.io/vram-free-mib"],
        lease["gpu-warden.io/vram-free-mib"]
    );
    assert!(lease["gpu-warden.io/vram-observed-at"] >= node["gpu-warden.io/vram-observed-at"]);
    let l = r.server.lease(NS, NODE).unwrap();
    assert_eq!(l["metadata"]["labels"][LEASE_LABEL.0], LEASE_LABEL.1);
    assert_eq!(l["spec"]["holderIdentity"], "gpu-warden-x7k2p");

    // At shutdown the figures come off both (the Lease stays: no delete in the RBAC).
    r.stop().await;
    assert!(!r.node_annotations().contains_key("gpu-warden.io/vram"));
    assert!(r.server.lease(NS, NODE).is_some());
    assert!(r
        .lease_annotations()
        .keys()
        .all(|k| !k.starts_with("gpu-warden.io/")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_reaches_the_lease_at_once_and_the_node_within_its_interval() {
    let renew = Duration::from_millis(300);
    // The Node's 5-minute bound, scaled to a second.
    let interval = Duration::from_secs(1);
    let mut r = rig(node_cfg(interval * 10, interval), Some(lease_cfg(renew))).await;
    let client = r.client.clone();
    let metrics = ExtenderMetrics::new().unwrap();
    let nodes = spawn_node_cache(client.clone(), None, "gpu-warden.io", metrics.clone());
    let live = spawn_live_nodes(client, NS, "gpu-warden.io", nodes, metrics);
    r.until(Pressure::None, |r| {
        !r.requests(Method::PUT, LEASE_PATH).is_empty() && live.ready()
    })
    .await;
    r.run(Duration::from_millis(200), Pressure::None).await;

    let changed = Instant::now();
    let on_lease = r
        .until(Pressure::Hard, |r| {
            pressure_of(&r.lease_annotations()).as_deref() == Some("hard")
        })
        .await;
    assert!(
        on_lease - changed < Duration::from_millis(300),
        "a pressure rise goes at once: {:?}",
        on_lease - changed
    );
    assert_eq!(
        pressure_of(&r.node_annotations()).as_deref(),
        Some("none"),
        "the Node keeps its interval"
    );

    // The extender reads the Lease through its reflector: pressure, whatever the Node says.
    let policy = JudgePolicy::default();
    let seen = {
        let end = Instant::now() + Duration::from_secs(3);
        loop {
            let ann = live.annotations(NODE).unwrap();
            let v = judge(
                &read_node(&ann, "gpu-warden.io"),
                &[],
                Some(1024),
                1,
                &policy,
                r.clock.wall(),
            );
            if v.reason == Reason::Pressure || Instant::now() > end {
                break v.reason;
            }
            r.publish(Pressure::Hard);
            tokio::time::sleep(POLL).await;
        }
    };
    assert_eq!(seen, Reason::Pressure);
    let node_only = judge(
        &read_node(&r.node_annotations(), "gpu-warden.io"),
        &[],
        Some(1024),
        1,
        &policy,
        r.clock.wall(),
    );
    assert_eq!(
        node_only.reason,
        Reason::Fits,
        "an extender without Leases still sees the old figures"
    );

    let on_node = r
        .until(Pressure::Hard, |r| {
            pressure_of(&r.node_annotations()).as_deref() == Some("hard")
        })
        .await;
    let lag = on_node - changed;
    assert!(
        lag <= interval + Duration::from_millis(300),
        "within the Node's interval: {lag:?}"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_extender_reads_an_old_agent_by_its_node() {
    // An agent from before Leases: a 500 ms Node heartbeat (60 s scaled), no Lease.
    let hb = Duration::from_millis(500);
    let old = AnnotationConfig {
        heartbeat: hb,
        min_interval: Duration::from_millis(100),
        ..AnnotationConfig::default()
    };
    let mut r = rig(old, None).await;
    let metrics = ExtenderMetrics::new().unwrap();
    let nodes = spawn_node_cache(r.client.clone(), None, "gpu-warden.io", metrics.clone());
    let live = spawn_live_nodes(r.client.clone(), NS, "gpu-warden.io", nodes, metrics);
    r.until(Pressure::None, |r| {
        r.requests(Method::PATCH, NODE_PATH).len() >= 2 && live.ready()
    })
    .await;
    assert!(r.server.lease(NS, NODE).is_none());
    let ann = live.annotations(NODE).unwrap();
    assert_eq!(
        ann,
        r.node_annotations(),
        "no Lease: the Node's annotations as they are"
    );
    // vram-observed-at has whole seconds: 3 s leaves room for the rounding.
    let policy = JudgePolicy {
        stale_after: Duration::from_secs(3),
        ..JudgePolicy::default()
    };
    let fresh = judge(
        &read_node(&ann, "gpu-warden.io"),
        &[],
        Some(1024),
        1,
        &policy,
        r.clock.wall(),
    );
    assert_eq!(fresh.reason, Reason::Fits, "{}", fresh.message());
    // The agent stops: its heartbeat stops, the figures go stale by their vram-observed-at.
    let frozen = ann.clone();
    tokio::time::sleep(Duration::from_millis(4200)).await;
    let stale = judge(
        &read_node(&frozen, "gpu-warden.io"),
        &[],
        Some(1024),
        1,
        &policy,
        r.clock.wall(),
    );
    assert_eq!(stale.reason, Reason::Stale, "{}", stale.message());
    r.stop().await;
}

/// The guard's carried state (`gpu-warden.io/guard-doubts`) rides on the Lease: written as
/// soon as it changes — not held by the 5 s between figure changes, nor waiting for the 15 s
/// renewal — taken off as soon as there is nothing to carry, and kept when the figures are
/// taken off at shutdown (the next process of the agent reads it at start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_doubts_reach_the_lease_at_once_and_outlive_the_shutdown() {
    const KEY: &str = "gpu-warden.io/guard-doubts";
    let (carry_tx, carry_rx) = watch::channel(None);
    let mut r = rig_carrying(
        AnnotationConfig::default(),
        Some(lease_cfg(Duration::from_secs(15))),
        Some(carry_rx),
    )
    .await;
    r.until(Pressure::None, |r| {
        r.lease_annotations().contains_key("gpu-warden.io/vram")
    })
    .await;
    let doubt = r#"{"v":1,"doubts":[],"cooldowns":[]}"#.to_string();
    carry_tx.send_replace(Some(doubt.clone()));
    let sent = Instant::now();
    r.until(Pressure::None, |r| {
        r.lease_annotations().get(KEY) == Some(&doubt)
    })
    .await;
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert!(
        r.lease_annotations().contains_key("gpu-warden.io/vram"),
        "the figures stay beside it"
    );
    carry_tx.send_replace(None);
    r.until(Pressure::None, |r| !r.lease_annotations().contains_key(KEY))
        .await;
    carry_tx.send_replace(Some(doubt.clone()));
    r.until(Pressure::None, |r| r.lease_annotations().contains_key(KEY))
        .await;
    r.stop().await;
    let left = r.lease_annotations();
    assert_eq!(left.get(KEY), Some(&doubt), "{left:?}");
    assert!(!left.contains_key("gpu-warden.io/vram"), "{left:?}");
}
