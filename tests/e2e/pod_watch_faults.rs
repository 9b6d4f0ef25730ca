//! The pod view under API server faults, with the real kube client over HTTP: a dropped
//! watch, a restarted server with a new resourceVersion history (410 → relist), and an
//! outage. The view must say when it cannot be trusted, and catch up afterwards.

use apiserver_double::{ApiServer, Fault, FaultAction};
use gpu_warden::attribute::ports::PodSource;
use gpu_warden::attribute::watch::{WatchTiming, WatchedPods};
use std::time::{Duration, Instant};

fn pod(name: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "ci", "uid": uid},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}
    })
}

fn wait(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    gpu_warden::testkit::wait_for(what, Duration::from_secs(secs), || f().then_some(()));
}

/// A runtime, a double built by `builder` holding pod `a`, and a pod view of node `n1` on it
/// with `timing`.
fn watched(
    builder: apiserver_double::Builder,
    timing: WatchTiming,
) -> (
    tokio::runtime::Runtime,
    ApiServer,
    std::sync::Arc<WatchedPods>,
) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(builder.start()).unwrap();
    server
        .add_pod(pod("a", "00000000-0000-4000-8000-00000000000a"))
        .unwrap();
    // kube's client and the watch task need the runtime's reactor from their start on.
    let entered = rt.enter();
    let clients = gpu_warden::act::client::from_config(
        kube::Config::new(server.url().parse().unwrap()),
        "test",
    )
    .unwrap();
    let view = WatchedPods::spawn_with(clients.direct.clone(), "n1", timing);
    drop(entered);
    (rt, server, view)
}

#[test]
fn the_view_follows_drops_restarts_and_outages() {
    let (_rt, server, view) = watched(
        ApiServer::builder().bookmark_interval(Duration::from_millis(100)),
        WatchTiming::default(),
    );
    wait("first sync", 10, || view.status().trustworthy());
    assert_eq!(view.pods().len(), 1);

    // A dropped watch: changes made meanwhile still arrive.
    server.inject(Fault::new("/api/v1/pods", FaultAction::DropWatchAfter(0)).times(1));
    server
        .add_pod(pod("b", "00000000-0000-4000-8000-00000000000b"))
        .unwrap();
    wait("pod b", 10, || view.pods().len() == 2);

    // A restarted API server: old resourceVersions are gone (410); the view relists.
    server.restart_history();
    server
        .add_pod(pod("c", "00000000-0000-4000-8000-00000000000c"))
        .unwrap();
    server.delete_pod("ci", "a").unwrap();
    wait("relist after the restart", 15, || {
        let pods = view.pods();
        pods.len() == 2
            && pods.contains_key("00000000-0000-4000-8000-00000000000c")
            && !pods.contains_key("00000000-0000-4000-8000-00000000000a")
    });
    assert!(view.status().trustworthy());

    // An outage: the view says so (the guard then holds its decisions) and recovers.
    server.set_down(true);
    wait("unhealthy during the outage", 10, || !view.status().healthy);
    assert!(view.status().last_error.is_some());
    server.set_down(false);
    wait("healthy after the outage", 40, || {
        view.status().trustworthy()
    });
}

/// A watch that stalls silently (the connection stays open, nothing flows) is detected
/// within the stall bound, the view says so, and a relist brings the missed change; a
/// quiet but healthy watch (no changes, no bookmarks: only the server ending each watch at
/// its timeout) is never mistaken for a stalled one; a distrusted view relists at once.
#[test]
fn a_silent_stall_is_detected_and_a_quiet_watch_is_not() {
    let timing = WatchTiming {
        watch_timeout_secs: 1,
        stall_bound: Duration::from_millis(2500),
        ..WatchTiming::default()
    };
    let (_rt, server, view) = watched(
        ApiServer::builder().bookmark_interval(Duration::from_secs(3600)),
        timing,
    );
    wait("first sync", 10, || view.status().trustworthy());

    // Quiet and healthy for well past the stall bound.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        assert!(view.status().trustworthy(), "{:?}", view.status());
        std::thread::sleep(Duration::from_millis(50));
    }

    // The next watch stalls; a change made meanwhile is missed until the stall is seen.
    let watches = || {
        server
            .requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && r.query.contains("watch=true"))
            .count()
    };
    server.inject(Fault::new("/api/v1/pods", FaultAction::StallWatch).times(1));
    let before = watches();
    wait("the stalled watch to start", 5, || watches() > before);
    let stalled_at = Instant::now();
    server.update_pod("ci", "a", |p| {
        p["metadata"]["annotations"] = serde_json::json!({"gpu-warden.io/evict": "never"});
    });
    wait("the stall to be noticed", 6, || !view.status().healthy);
    let noticed = stalled_at.elapsed();
    assert!(noticed <= Duration::from_millis(3500), "{noticed:?}");
    let why = view.status().last_error.unwrap_or_default();
    assert!(why.contains("stalled"), "{why}");
    wait("relist with the missed change", 10, || {
        view.status().trustworthy()
            && view
                .pods()
                .values()
                .any(|p| p.annotations.contains_key("gpu-warden.io/evict"))
    });

    // Distrust: dropped and relisted at once.
    let lists_before = server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
        .count();
    view.distrust("a fresh read disagrees");
    wait("relist after distrust", 5, || {
        server
            .requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
            .count()
            > lists_before
    });
    wait("healthy again", 5, || view.status().trustworthy());
}

/// While a GPU is under pressure the view comes back sooner after an outage: a relist that
/// waits out a long backoff is woken when pressure begins, and relists are then at most
/// `urgent_relist_cap` apart (bounded: no storm).
#[test]
fn pressure_brings_the_view_back_sooner() {
    let timing = WatchTiming {
        // The first pause after a failure is 10–20 s: long enough to tell apart.
        relist_backoff: (Duration::from_secs(20), Duration::from_secs(60)),
        urgent_relist_cap: Duration::from_millis(500),
        ..WatchTiming::default()
    };
    let (_rt, server, view) = watched(ApiServer::builder(), timing);
    wait("first sync", 10, || view.status().trustworthy());
    let lists = || {
        server
            .requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
            .count()
    };
    server.set_down(true);
    wait("the outage to be seen", 5, || !view.status().healthy);
    server.set_down(false);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!view.status().healthy, "still in its 10 s+ backoff");
    let before = lists();
    view.set_urgent(true);
    wait("the urgent relist", 3, || view.status().trustworthy());
    assert_eq!(lists(), before + 1);

    // Down again while urgent: relists every ≤ 0.5 s, not more often than every 0.25 s.
    server.set_down(true);
    wait("the outage to be seen", 5, || !view.status().healthy);
    let before = lists();
    std::thread::sleep(Duration::from_secs(3));
    let during = lists() - before;
    assert!((5..=13).contains(&during), "{during} relists in 3 s");
    server.set_down(false);
    wait("back", 3, || view.status().trustworthy());
}
