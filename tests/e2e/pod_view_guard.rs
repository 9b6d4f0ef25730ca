//! The guard on a pod view the API proves only by LISTs (issue 30): the real binary
//! (simulated GPU, guard in enforce mode) against the API double, where every pod watch is
//! answered `410 Expired` while LISTs work (kube-apiserver's `errWatcher` shape: 200, one
//! ERROR event). Before, each 410 dropped the view and each good LIST reset the backoff:
//! ~2.5 LISTs + watches a second and no decision through 28 s of hard pressure. Now each
//! LIST proves the view at its resourceVersion and the 410 loop backs off (to 8 s): the
//! guard decides on the freshly listed view and evicts the greedy job — only it.
//!
//! The GPU: 22.6 GiB usable; a trainer (priority 1000000, 8 GiB), a CI job (3 GiB) and a
//! greedy CI job growing 1 GiB/s from 1 s: soft pressure at ≈9 s, hard at ≈10.5 s. The
//! double plays the faithful kubelet in real time (as in guard_api_faults): with grace 0 the
//! API server deletes an evicted pod at once, and the kubelet's signals reach no process here
//! — the simulated processes live in the agent — so the cooldown (60 s) keeps the guard from
//! deciding twice.

use crate::support::guard_world::{GuardWorld, POLICY};
use apiserver_double::{Fault, FaultAction};
use std::time::{Duration, Instant};

const SCENARIO: &str = r#"
driver_version: "580.95.05"
gpus:
  - model: NVIDIA A10G
    uuid: GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b
    pci_bus_id: "00000000:00:1E.0"
    memory_mib: 23028
    reserved_mib: 434
processes:
  - pid: 500
    gpu: 0
    name: torchrun
    memory: {constant: 8192}
    pod: {namespace: ml-train, name: trainer, container: main, priority: 1000000}
  - pid: 501
    gpu: 0
    name: pytest
    memory: {constant: 3072}
    pod: {namespace: ci, name: ci-a, container: build, priority: 0}
  - pid: 503
    gpu: 0
    name: python3
    start: 1s
    memory: {linear: {from: 512, per_second: 1024}}
    pod: {namespace: ci, name: greedy, container: build, priority: 0}
"#;

#[test]
fn the_guard_acts_on_a_view_proven_by_lists_when_every_watch_expires() {
    let mut w = GuardWorld::start(SCENARIO, "expired", POLICY, |s| {
        s.inject(Fault::new("/api/v1/pods", FaultAction::ExpireWatch));
    });
    let started = w.started;
    w.wait("the view proven by a LIST", Duration::from_secs(10), |w| {
        let st = w.state();
        st["guard"].is_object() && st["guard"]["held"].is_null()
    });
    w.wait("the greedy job's eviction", Duration::from_secs(25), |w| {
        !w.evicted().is_empty()
    });
    let decided = started.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(w.evicted(), vec!["ci/greedy".to_string()], "{}", w.state());
    assert_eq!(w.posts().len(), 1);
    // The 410 loop backed off: 0.25–0.5, 0.5–1, 1–2, 2–4, 4–8 s between LISTs while the
    // GPU is calm (at most 5 LISTs in the first 7 s: a backoff reset by each LIST gave ~17),
    // at most 2 s apart once it is under pressure (the urgent cap), never a storm.
    let lists: Vec<Instant> = w
        .server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
        .map(|r| r.at)
        .collect();
    let calm = lists
        .iter()
        .filter(|t| **t < started + Duration::from_secs(7))
        .count();
    assert!((3..=5).contains(&calm), "{calm} LISTs in the first 7 s");
    // (Pressure beginning wakes one relist at once, whenever the last one was.)
    let bursts = lists
        .windows(2)
        .filter(|w| w[1] - w[0] < Duration::from_millis(240))
        .count();
    assert!(bursts <= 1, "{lists:?}");
    assert!(decided < Duration::from_secs(20), "{decided:?}");
    let log = w.stop();
    assert!(log.contains("pod watch expired"), "{log}");
}
