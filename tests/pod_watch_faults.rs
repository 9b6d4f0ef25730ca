//! The pod view under API server faults, with the real kube client over HTTP: a dropped
//! watch, a restarted server with a new resourceVersion history (410 → relist), and an
//! outage. The view must say when it cannot be trusted, and catch up afterwards.

use apiserver_double::{ApiServer, Fault, FaultAction};
use gpu_warden::attribute::pods::PodSource;
use gpu_warden::attribute::watch::WatchedPods;
use std::time::{Duration, Instant};

fn pod(name: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "ci", "uid": uid},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}
    })
}

fn wait(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_view_follows_drops_restarts_and_outages() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(
            ApiServer::builder()
                .bookmark_interval(Duration::from_millis(100))
                .start(),
        )
        .unwrap();
    server
        .add_pod(pod("a", "00000000-0000-4000-8000-00000000000a"))
        .unwrap();
    let _entered = rt.enter();
    let clients =
        gpu_warden::kube::from_config(kube::Config::new(server.url().parse().unwrap()), "test")
            .unwrap();
    let view = WatchedPods::spawn(clients.direct.clone(), "n1");
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
