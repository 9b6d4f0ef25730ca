//! The node annotator against the Kubernetes API double: real HTTP, the real kube client,
//! merge patches applied to a stored Node. Snapshots come from the simulator and are fed
//! through the same `watch` channel the agent loop publishes on.
//!
//! Real time with short intervals (heartbeat ≤ 600 ms, min interval ≤ 1 s, backoff from
//! 50 ms) keeps the suite to a few seconds; the ten-minute run uses a manual clock.

use apiserver_double::{ApiServer, Fault, FaultAction, Method, RecordedRequest};
use bytes::Bytes;
use gpu_warden::act::node_annotations::{
    remove_annotations, spawn_annotator_with, AnnotatorError, AnnotatorHandle, AnnotatorTiming,
};
use gpu_warden::model::clock::{Clock, ManualClock, SystemClock};
use gpu_warden::model::pressure::Pressure;
use gpu_warden::publish::annotations::AnnotationConfig;
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::publish::state::Published;
use gpu_warden::sample::sampler::Stamper;
use gpu_warden::sample::scenario::Scenario;
use gpu_warden::sample::sim::SimSource;
use gpu_warden::sample::{GpuSource, PollRequest};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};
use tokio::sync::watch;

const NODE: &str = "gpu-node-1";
const NODE_PATH: &str = "/api/v1/nodes/gpu-node-1";
/// The scenarios' driver (R580) tells its CUDA version, so it is published too.
const OURS: [&str; 5] = [
    "gpu-warden.io/vram-free-mib",
    "gpu-warden.io/vram-max-free-mib",
    "gpu-warden.io/vram",
    "gpu-warden.io/vram-observed-at",
    "gpu-warden.io/cuda-driver-version",
];

/// Two A10Gs; one steady process on each.
const STEADY: &str = "
gpus:
  - {model: NVIDIA A10G, count: 2, memory_mib: 23028, reserved_mib: 434}
processes:
  - {pid: 100, gpu: 0, memory: {constant: 4096}}
  - {pid: 200, gpu: 1, memory: {constant: 1000}}
";

fn growing(per_second: u64) -> String {
    format!(
        "
gpus:
  - {{model: NVIDIA A10G, memory_mib: 23028, reserved_mib: 434}}
processes:
  - {{pid: 100, gpu: 0, memory: {{linear: {{from: 1000, per_second: {per_second}}}}}}}
"
    )
}

/// The other owners of the Node: labels and annotations that must survive.
fn foreign_node() -> Value {
    json!({
        "metadata": {
            "name": NODE,
            "labels": {
                "kubernetes.io/hostname": NODE,
                "nvidia.com/gpu.product": "NVIDIA-A10G",
                "node.kubernetes.io/instance-type": "g5.2xlarge"
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                // Same prefix, not ours: removal must leave it.
                "gpu-warden.io/owner-note": "set by an operator"
            }
        },
        "spec": {"podCIDR": "10.0.1.0/24"},
        "status": {"capacity": {"nvidia.com/gpu": "8"}}
    })
}

/// Plays a scenario poll by poll into `Published` values on the injected clock.
struct Feed {
    src: SimSource,
    stamper: Stamper,
    clock: Arc<dyn Clock>,
    tx: watch::Sender<Option<Arc<Published>>>,
}

impl Feed {
    fn publish(&mut self, pressure: &[(u32, Pressure)]) {
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
            pressure: pressure.iter().copied().collect(),
            replicas: None,
            figures: None,
        })));
    }

    /// Publishes every `every` for `total`, with fixed pressure.
    async fn steady(&mut self, every: Duration, total: Duration, pressure: &[(u32, Pressure)]) {
        let end = Instant::now() + total;
        while Instant::now() < end {
            self.publish(pressure);
            tokio::time::sleep(every).await;
        }
    }
}

struct Rig {
    server: ApiServer,
    feed: Feed,
    metrics: SelfMetrics,
    handle: Option<AnnotatorHandle>,
}

fn fast_timing() -> AnnotatorTiming {
    AnnotatorTiming {
        request_timeout: Duration::from_millis(300),
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
        shutdown_timeout: Duration::from_millis(1500),
    }
}

fn cfg(heartbeat_ms: u64, min_interval_ms: u64) -> AnnotationConfig {
    let c = AnnotationConfig {
        heartbeat: Duration::from_millis(heartbeat_ms),
        min_interval: Duration::from_millis(min_interval_ms),
        ..AnnotationConfig::default()
    };
    c.validate().unwrap();
    c
}

async fn rig(
    scenario: &str,
    cfg: AnnotationConfig,
    timing: AnnotatorTiming,
    clock: Arc<dyn Clock>,
) -> Rig {
    let server = ApiServer::start().await.unwrap();
    server.add_node(foreign_node()).unwrap();
    // The eviction client: no kube-level retry, so the annotator's own backoff is the only one.
    let client = gpu_warden::act::client::from_config(
        kube::Config::new(server.url().parse().unwrap()),
        "test",
    )
    .unwrap()
    .direct;
    let metrics = SelfMetrics::new("test").unwrap();
    let (tx, rx) = watch::channel(None);
    let handle = spawn_annotator_with(
        client,
        NODE.to_string(),
        cfg,
        rx,
        clock.clone(),
        metrics.clone(),
        timing,
    );
    Rig {
        server,
        feed: Feed {
            src: SimSource::new(Scenario::parse(scenario, "test").unwrap()),
            stamper: Stamper::default(),
            clock,
            tx,
        },
        metrics,
        handle: Some(handle),
    }
}

impl Rig {
    fn patches(&self) -> Vec<RecordedRequest> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.method == Method::PATCH && r.path == NODE_PATH)
            .collect()
    }

    fn ok_patches(&self) -> Vec<RecordedRequest> {
        self.patches()
            .into_iter()
            .filter(|r| r.status == Some(200))
            .collect()
    }

    fn annotations(&self) -> BTreeMap<String, String> {
        let node = self.server.node(NODE).unwrap();
        serde_json::from_value(node["metadata"]["annotations"].clone()).unwrap_or_default()
    }

    fn vram(&self) -> Value {
        serde_json::from_str(&self.annotations()["gpu-warden.io/vram"]).unwrap()
    }

    fn count(&self, result: &str) -> u64 {
        self.metrics
            .annotation_patches
            .with_label_values(&[result])
            .get()
    }

    /// Waits (publishing steadily) until `n` patches have been applied and the annotator has
    /// seen their answers (the double records a 200 before the client has read it).
    async fn until_ok_patches(&mut self, n: usize, pressure: &[(u32, Pressure)]) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.ok_patches().len() < n || (self.count("success") as usize) < n {
            assert!(
                Instant::now() < deadline,
                "waited for {n} patches: {:?}",
                summary(&self.patches())
            );
            self.feed.publish(pressure);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown(&mut self) -> Result<(), AnnotatorError> {
        self.handle.take().unwrap().shutdown().await
    }
}

fn summary(reqs: &[RecordedRequest]) -> Vec<(u64, Option<u16>)> {
    reqs.iter().map(|r| (r.id, r.status)).collect()
}

/// Every patch is a JSON merge patch of exactly our annotations, nothing else.
fn assert_only_our_keys(reqs: &[RecordedRequest]) {
    let ours: BTreeSet<String> = OURS.iter().map(|s| s.to_string()).collect();
    for r in reqs {
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        let body = r.body.json().expect("JSON body");
        assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
        assert_eq!(body["metadata"].as_object().unwrap().len(), 1, "{body}");
        let keys: BTreeSet<String> = body["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(keys, ours, "{body}");
    }
}

fn gaps(reqs: &[RecordedRequest]) -> Vec<Duration> {
    reqs.windows(2).map(|w| w[1].at - w[0].at).collect()
}

fn free_of(r: &RecordedRequest) -> u64 {
    r.body.json().unwrap()["metadata"]["annotations"]["gpu-warden.io/vram-free-mib"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_annotation_written_between_two_of_our_patches_survives() {
    let mut rig = rig(STEADY, cfg(600, 100), fast_timing(), system_clock()).await;
    rig.until_ok_patches(1, &[]).await;
    let first = rig.annotations();
    assert_eq!(first["gpu-warden.io/vram-free-mib"], "39936"); // floor(23028−434−4096) + floor(23028−434−1000)
    assert_eq!(first["gpu-warden.io/vram-max-free-mib"], "21504");

    // Another controller writes the Node between our patches.
    assert!(rig
        .server
        .set_node_annotation(NODE, "example.com/foreign", "written-between"));
    rig.until_ok_patches(2, &[(1, Pressure::Soft)]).await;

    let after = rig.annotations();
    assert_eq!(after["example.com/foreign"], "written-between");
    assert_eq!(after["node.alpha.kubernetes.io/ttl"], "0");
    assert_eq!(after["gpu-warden.io/owner-note"], "set by an operator");
    assert_eq!(rig.vram()["gpus"][1]["pressure"], "soft");
    let node = rig.server.node(NODE).unwrap();
    assert_eq!(
        node["metadata"]["labels"],
        foreign_node()["metadata"]["labels"]
    );
    assert_eq!(node["spec"], foreign_node()["spec"]);
    assert_eq!(node["status"], foreign_node()["status"]);
    assert_only_our_keys(&rig.patches());
    rig.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_removes_exactly_our_keys() {
    let mut rig = rig(STEADY, cfg(600, 100), fast_timing(), system_clock()).await;
    rig.until_ok_patches(1, &[]).await;
    for k in OURS {
        assert!(rig.annotations().contains_key(k), "{k}");
    }
    let t0 = Instant::now();
    rig.shutdown().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let left: BTreeMap<String, String> =
        serde_json::from_value(foreign_node()["metadata"]["annotations"].clone()).unwrap();
    assert_eq!(rig.annotations(), left);
    let node = rig.server.node(NODE).unwrap();
    assert_eq!(
        node["metadata"]["labels"],
        foreign_node()["metadata"]["labels"]
    );
    let last = rig.patches().pop().unwrap();
    let nulls = last.body.json().unwrap()["metadata"]["annotations"].clone();
    assert_eq!(nulls.as_object().unwrap().len(), OURS.len());
    assert!(nulls.as_object().unwrap().values().all(Value::is_null));
    assert_only_our_keys(&rig.patches());
    assert_eq!(rig.count("success"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_scenario_patches_once_per_heartbeat_and_no_more() {
    let heartbeat = Duration::from_millis(500);
    let mut rig = rig(STEADY, cfg(500, 100), fast_timing(), system_clock()).await;
    let t0 = Instant::now();
    rig.feed
        .steady(Duration::from_millis(25), Duration::from_millis(2200), &[])
        .await;
    let elapsed = t0.elapsed();
    let patches = rig.patches();
    let max = 1 + (elapsed.as_millis() / heartbeat.as_millis()) as usize;
    assert!(
        patches.len() <= max,
        "{} patches in {elapsed:?}",
        patches.len()
    );
    assert!(
        patches.len() >= max - 1,
        "{} patches in {elapsed:?}",
        patches.len()
    );
    // One per heartbeat: never closer, and (polls being 25 ms apart) not much later.
    for g in gaps(&patches) {
        assert!(g >= heartbeat - Duration::from_millis(15), "{g:?}");
        assert!(g < heartbeat + Duration::from_millis(250), "{g:?}");
    }
    // Steady values: every heartbeat carries the same figures, only the time moves.
    assert!(patches.iter().all(|p| free_of(p) == 39_936));
    assert_only_our_keys(&patches);
    assert_eq!(rig.count("success"), patches.len() as u64);
    assert_eq!(rig.count("error"), 0);
    assert!(rig.metrics.annotation_last_success.get() > 1_700_000_000);
    rig.shutdown().await.unwrap();
}

/// Ten minutes of 1 s polls of a steady node, over real HTTP, on a manual clock (the
/// annotator takes all its time decisions from the injected clock). `heartbeat`: the Node's
/// cadence, `None` for the default (with a Lease: 5m30s).
async fn ten_minute_steady_run(heartbeat: Option<Duration>) -> Vec<String> {
    let clock = Arc::new(ManualClock::new(
        UNIX_EPOCH + Duration::from_secs(1_780_000_000),
    ));
    let cfg = match heartbeat {
        Some(h) => AnnotationConfig {
            heartbeat: h,
            min_interval: Duration::from_secs(5),
            ..AnnotationConfig::default()
        },
        None => AnnotationConfig::default(),
    };
    let mut rig = rig(STEADY, cfg, fast_timing(), clock.clone()).await;
    for t in 0..=600u64 {
        clock.set(Duration::from_secs(t));
        rig.feed
            .publish(&[(0, Pressure::None), (1, Pressure::None)]);
        if t == 0 {
            // The first poll is patched at once: waited for, so that on a loaded machine the
            // next poll cannot overtake it (the first patch then said 20:26:41).
            let deadline = Instant::now() + Duration::from_secs(5);
            while rig.patches().is_empty() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // Let the annotator take each poll (it would see only the latest otherwise).
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let patches = rig.patches();
    assert_only_our_keys(&patches);
    let observed: Vec<String> = patches
        .iter()
        .map(|p| {
            p.body.json().unwrap()["metadata"]["annotations"]["gpu-warden.io/vram-observed-at"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    rig.shutdown().await.unwrap();
    observed
}

/// Without a Lease (the cadence before Leases, `--annotation-heartbeat 60s`): a patch a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_minute_steady_sim_run_makes_at_most_eleven_patches() {
    let observed = ten_minute_steady_run(Some(Duration::from_secs(60))).await;
    assert!(observed.len() <= 11 && observed.len() >= 10, "{observed:?}");
    assert_eq!(observed[0], "2026-05-28T20:26:40Z");
    // The heartbeat after one minute (a poll later if the annotator lagged behind the feed).
    assert!(
        observed[1].starts_with("2026-05-28T20:27:4"),
        "{observed:?}"
    );
}

/// The default Node cadence beside a Lease: the first patch and one heartbeat at 5m30s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_minute_steady_run_at_the_default_cadence_patches_twice() {
    let observed = ten_minute_steady_run(None).await;
    assert_eq!(observed.len(), 2, "{observed:?}");
    assert_eq!(observed[0], "2026-05-28T20:26:40Z");
    // 5m30s later (a poll later if the annotator lagged behind the feed).
    assert!(
        observed[1].starts_with("2026-05-28T20:32:1"),
        "{observed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_process_patches_as_it_crosses_quanta() {
    // 1280 MiB/s crosses a 256 MiB quantum every 200 ms; min interval 50 ms does not hold
    // it back, so every crossing is one patch, one quantum lower.
    let mut rig = rig(&growing(1280), cfg(5000, 50), fast_timing(), system_clock()).await;
    rig.feed
        .steady(Duration::from_millis(20), Duration::from_millis(1300), &[])
        .await;
    let patches = rig.patches();
    assert!(patches.len() >= 5, "{}", patches.len());
    let frees: Vec<u64> = patches.iter().map(free_of).collect();
    for w in frees.windows(2) {
        let step = w[0] - w[1];
        assert!(step == 256 || step == 512, "{frees:?}");
    }
    assert!(frees.iter().all(|f| f % 256 == 0));
    assert_only_our_keys(&patches);
    rig.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_growth_is_patched_no_more_often_than_the_min_interval() {
    // 5120 MiB/s crosses a quantum every 50 ms; the 300 ms minimum interval rules.
    let min_interval = Duration::from_millis(300);
    let mut rig = rig(
        &growing(5120),
        cfg(5000, 300),
        fast_timing(),
        system_clock(),
    )
    .await;
    rig.feed
        .steady(Duration::from_millis(20), Duration::from_millis(1600), &[])
        .await;
    let patches = rig.patches();
    assert!((4..=6).contains(&patches.len()), "{}", patches.len());
    for g in gaps(&patches) {
        // Arrival times at the server jitter by a few ms around the planned instants.
        assert!(g >= min_interval - Duration::from_millis(15), "{g:?}");
    }
    let frees: Vec<u64> = patches.iter().map(free_of).collect();
    assert!(frees.windows(2).all(|w| w[1] < w[0]), "{frees:?}");
    rig.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pressure_rise_is_patched_at_once_and_a_fall_waits_for_the_min_interval() {
    let min_interval = Duration::from_millis(800);
    let mut rig = rig(STEADY, cfg(5000, 800), fast_timing(), system_clock()).await;
    rig.until_ok_patches(1, &[]).await;
    rig.feed
        .steady(Duration::from_millis(20), Duration::from_millis(100), &[])
        .await;
    let raised_at = Instant::now();
    rig.feed.publish(&[(0, Pressure::Hard)]);
    rig.until_ok_patches(2, &[(0, Pressure::Hard)]).await;
    let reaction = raised_at.elapsed();
    assert!(reaction < Duration::from_millis(200), "{reaction:?}");
    assert_eq!(rig.vram()["gpus"][0]["pressure"], "hard");
    // Easing is news too, but it waits for the minimum interval.
    rig.feed
        .steady(Duration::from_millis(20), Duration::from_millis(1200), &[])
        .await;
    let patches = rig.patches();
    assert_eq!(patches.len(), 3, "{:?}", summary(&patches));
    let g = patches[2].at - patches[1].at;
    assert!(g >= min_interval - Duration::from_millis(15), "{g:?}");
    assert!(g < min_interval + Duration::from_millis(200), "{g:?}");
    assert_eq!(rig.vram()["gpus"][0]["pressure"], "none");
    rig.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_timeouts_back_off_and_recover() {
    let mut rig = rig(STEADY, cfg(5000, 20), fast_timing(), system_clock()).await;
    rig.server.inject(
        Fault::new(NODE_PATH, FaultAction::Status(500))
            .method(Method::PATCH)
            .times(4),
    );
    rig.server.inject(
        Fault::new(NODE_PATH, FaultAction::Hang)
            .method(Method::PATCH)
            .times(1),
    );
    let t0 = Instant::now();
    rig.until_ok_patches(1, &[]).await;
    let patches = rig.patches();
    let statuses: Vec<Option<u16>> = patches.iter().map(|r| r.status).collect();
    // Four 500s, one that hung until the 300 ms request timeout, then success.
    assert_eq!(
        statuses,
        [Some(500), Some(500), Some(500), Some(500), None, Some(200)]
    );
    // Pauses grow: backoff bases 50, 100, 200, 400 ms with jitter in the upper half;
    // without backoff there would be one attempt per 20 ms publication.
    let g = gaps(&patches);
    let min_pause = [25, 50, 100, 200, 300 + 200];
    for (gap, min) in g.iter().zip(min_pause) {
        assert!(*gap >= Duration::from_millis(min - 10), "{g:?}");
    }
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(rig.count("error"), 5);
    assert_eq!(rig.count("success"), 1);
    assert!(rig.annotations().contains_key("gpu-warden.io/vram"));
    rig.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_server_gets_no_retry_storm_and_the_latest_values_once_back() {
    let mut rig = rig(STEADY, cfg(600, 20), fast_timing(), system_clock()).await;
    rig.until_ok_patches(1, &[]).await;
    rig.server.set_down(true);
    let before = rig.patches().len();
    // While down, pressure flaps (rises bypass the minimum interval): every 20 ms poll
    // would be a patch if nothing held back.
    let down_for = Duration::from_millis(2000);
    let end = Instant::now() + down_for;
    let mut n = 0u32;
    while Instant::now() < end {
        let p = if n % 2 == 0 {
            Pressure::Soft
        } else {
            Pressure::Hard
        };
        // A watch send never waits for the annotator, whatever state it is in.
        rig.feed.publish(&[(0, p)]);
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during = rig.patches().len() - before;
    // 50 ms doubling to 400 ms, jitter in [base/2, base]: at most ~12 in 2 s; 100 polls.
    assert!((2..=14).contains(&during), "{during} attempts while down");
    // Every attempt is counted (one killed mid-flight by the outage may not be recorded).
    assert!((during as u64..=during as u64 + 1).contains(&rig.count("error")));
    rig.server.set_down(false);
    let back = Instant::now();
    rig.until_ok_patches(2, &[(0, Pressure::Hard)]).await;
    // Back within one capped backoff (400 ms) plus the request; generous for a loaded CI box.
    assert!(
        back.elapsed() < Duration::from_secs(3),
        "{:?}",
        back.elapsed()
    );
    assert_eq!(rig.vram()["gpus"][0]["pressure"], "hard");
    assert_eq!(rig.count("success"), 2);
    assert_only_our_keys(&rig.patches());
    rig.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_when_the_server_hangs() {
    let timing = AnnotatorTiming {
        shutdown_timeout: Duration::from_millis(400),
        ..fast_timing()
    };
    let mut rig = rig(STEADY, cfg(600, 100), timing, system_clock()).await;
    rig.until_ok_patches(1, &[]).await;
    rig.server
        .inject(Fault::new(NODE_PATH, FaultAction::Hang).method(Method::PATCH));
    let t0 = Instant::now();
    let err = rig.shutdown().await.unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t0.elapsed()
    );
    assert!(
        matches!(err, AnnotatorError::ShutdownTimeout { .. }),
        "{err}"
    );
    // The keys are still there; consumers see vram-observed-at age.
    assert!(rig
        .annotations()
        .contains_key("gpu-warden.io/vram-free-mib"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_left_by_an_earlier_run_can_be_removed_when_annotations_are_off() {
    let server = ApiServer::start().await.unwrap();
    let mut node = foreign_node();
    for k in OURS {
        node["metadata"]["annotations"][k] = json!("left by a crashed run");
    }
    server.add_node(node).unwrap();
    let client = gpu_warden::act::client::from_config(
        kube::Config::new(server.url().parse().unwrap()),
        "test",
    )
    .unwrap()
    .direct;
    remove_annotations(client, NODE, "gpu-warden.io", Duration::from_secs(3))
        .await
        .unwrap();
    let left: Value = server.node(NODE).unwrap()["metadata"]["annotations"].clone();
    assert_eq!(left, foreign_node()["metadata"]["annotations"]);
}
