//! A refusal about the server is not a refusal about the pod (issue 30): the real binary
//! (simulated GPU, guard in enforce mode) against the API double answering evictions with
//! upstream's real shapes — API Priority and Fairness's plain-text 429 with `Retry-After`
//! (apiserver server/filters/priority-and-fairness.go `tooManyRequests`), etcd's ambiguous
//! 500 (`errors.NewInternalError` around `etcdserver: request timed out`), RBAC's 403
//! (`responsewriters.Forbidden`). A correct guard evicts only the greedy CI job, once; it
//! never walks down the ranking to the protected trainer because the *server* said no.
//!
//! The GPU: 22.6 GiB usable; a trainer (priority 1000000, 8 GiB, rank 3 once the CI jobs are
//! ranked first), two CI jobs (3 GiB each) and a greedy CI job growing 1 GiB/s from 1 s:
//! soft pressure at ≈6 s, hard at ≈7.5 s. The plan takes one pod. The double's kubelet is the
//! faithful one; with the policy's grace 0 the API server deletes an evicted pod's object in
//! the same request (the generic store's `lastGraceful == 0`), so the view sees it gone at once.

use crate::support::guard_world::{Counted, GuardWorld, POLICY, SCENARIO};
use apiserver_double::{ApiServer, Fault, FaultAction, Method};
use std::time::{Duration, Instant};

/// Every eviction path a wrong walk could reach (the trainer's namespace included).
const EVICTION_PATHS: [&str; 2] = [
    "/api/v1/namespaces/ci/pods/",
    "/api/v1/namespaces/ml-train/pods/",
];

/// The double with the node and the scenario's pods; `before` injects the faults the
/// agent's first requests meet; `policy` is the guard policy file. Its faults refuse
/// evictions, so only those carried out count as evicted.
fn world(policy: &str, before: impl FnOnce(&ApiServer)) -> GuardWorld {
    GuardWorld::start(SCENARIO, "refusals", policy, before).counting(Counted::Accepted)
}

fn inject_evictions(s: &ApiServer, action: FaultAction, times: Option<usize>) {
    for path in EVICTION_PATHS {
        let f = Fault::new(path, action.clone()).method(Method::POST);
        s.inject(match times {
            Some(n) => f.times(n),
            None => f,
        });
    }
}

const GREEDY: &str = "/api/v1/namespaces/ci/pods/greedy/eviction";

/// The first two eviction POSTs meet API Priority and Fairness's 429 (`Retry-After: 1`, a
/// plain-text body, no `DisruptionBudget` cause). The walk stops at each, waits as told,
/// and posts the *same* pod again: the greedy job is evicted on the third attempt, nobody
/// else ever is (issue 30 saw the trainer evicted 135 ms after the second 429).
#[test]
fn an_apf_429_backs_off_and_retries_the_same_pod() {
    let mut w = world(POLICY, |s| {
        s.inject(
            Fault::new(
                "/api/v1/namespaces/",
                FaultAction::ApfReject {
                    retry_after_seconds: 1,
                },
            )
            .method(Method::POST)
            .times(2),
        );
    });
    w.wait("the greedy job's eviction", Duration::from_secs(30), |w| {
        !w.evicted().is_empty()
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(w.evicted(), vec!["ci/greedy".to_string()]);
    let posts = w.posts();
    let paths: Vec<&str> = posts.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, vec![GREEDY; 3], "{posts:#?}");
    assert_eq!(
        posts.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![Some(429), Some(429), Some(201)]
    );
    for pair in posts.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(
            gap >= Duration::from_millis(950),
            "retried {gap:?} after a Retry-After of 1 s"
        );
    }
    let log = w.stop();
    assert!(log.contains("API server busy"), "{log}");
}

/// `500 etcdserver: request timed out` on an eviction that etcd did commit: the outcome is
/// in doubt, not failed, so the walk stops; the greedy pod is seen gone and the doubt
/// resolves as evicted. One pod for a one-pod plan (issue 30 saw the next candidate
/// evicted 87 ms after the 500, and the first eviction land 1 s later: two for one).
#[test]
fn an_ambiguous_500_that_was_carried_out_evicts_one_pod() {
    let mut w = world(POLICY, |s| {
        inject_evictions(s, FaultAction::EtcdTimeout { apply: true }, Some(1));
    });
    w.wait("the eviction", Duration::from_secs(30), |w| {
        !w.posts().is_empty()
    });
    let posted = Instant::now();
    w.wait("the doubt to resolve", Duration::from_secs(10), |w| {
        w.state()["guard"]["recentDecisions"][0]["victims"][0]["result"] == "evicted"
    });
    while posted.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(w.evicted(), vec!["ci/greedy".to_string()]);
    let posts = w.posts();
    assert_eq!(posts.len(), 1, "{posts:#?}");
    assert_eq!(posts[0].status, Some(500));
    let log = w.stop();
    assert!(
        log.contains("eviction that was in doubt was carried out"),
        "{log}"
    );
}

/// RBAC forbids the eviction (403): no pod is evicted and the walk never moves on — every
/// pod would get the same answer. The agent says so loudly: an error line, `/state`
/// `guard.status.forbidden`, the Node Event; and the GPU pauses for `cooldownTimeout`
/// instead of asking again every poll.
#[test]
fn a_403_stops_the_walk_and_says_so() {
    let mut w = world(POLICY, |s| {
        inject_evictions(s, FaultAction::Forbidden, None);
    });
    w.wait("the refusal in /state", Duration::from_secs(30), |w| {
        w.state()["guard"]["status"]["forbidden"].is_string()
    });
    let forbidden = w.state()["guard"]["status"]["forbidden"].clone();
    assert!(
        forbidden
            .as_str()
            .unwrap_or("")
            .contains("cannot create resource \"pods/eviction\""),
        "{forbidden}"
    );
    // Hard pressure from ≈7.5 s; a walk that moved on, or a retry every poll, would show here.
    std::thread::sleep(Duration::from_secs(5));
    let posts = w.posts();
    assert_eq!(posts.len(), 1, "{posts:#?}");
    assert_eq!(posts[0].path, GREEDY);
    assert!(w.evicted().is_empty());
    let victims = w.state()["guard"]["recentDecisions"][0]["victims"].clone();
    assert_eq!(victims[0]["result"], "forbidden", "{victims}");
    let node_note: String = w.node_notes().concat();
    assert!(node_note.contains("forbidden"), "{node_note}");
    let log = w.stop();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("not allowed to evict")),
        "{log}"
    );
}

/// A slow but working API server: every fresh read of the victim answers after 3 s, over
/// the read's 2 s floor. The first read times out, the limit follows the measured latency
/// (each timeout doubles it, up to 15 s), and the read is tried again within the same walk
/// (the read bound, 15 s): the second gets its answer and the greedy job is evicted — no
/// walk aborted, no pause, no second decision. A slow API slows the guard, it does not
/// switch it off (issue 30: aborted five times, the GPU full from 50 s, nothing evicted),
/// nor does it undo a stop (issue 38: the aborted walk resumed the stopped grower).
#[test]
fn a_slow_api_slows_the_guard_but_does_not_switch_it_off() {
    let mut w = world(POLICY, |s| {
        s.inject(
            Fault::new(
                "/api/v1/namespaces/ci/pods/greedy",
                FaultAction::Delay(Duration::from_secs(3)),
            )
            .method(Method::GET),
        );
    });
    w.wait("the greedy job's eviction", Duration::from_secs(40), |w| {
        !w.evicted().is_empty()
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(w.evicted(), vec!["ci/greedy".to_string()]);
    let reads = w
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::GET && r.path == "/api/v1/namespaces/ci/pods/greedy")
        .count();
    assert_eq!(reads, 2, "the first read timed out, the second answered");
    let log = w.stop();
    assert!(
        !log.contains("cannot read the pod fresh"),
        "no walk was aborted: {log}"
    );
}
