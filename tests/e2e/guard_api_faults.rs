//! The guard when the API server does not answer: the real binary (simulated GPU, guard in
//! enforce mode) against the API double, with faults injected while the GPU fills up. A
//! correct guard evicts only the greedy CI job (or, when the greedy job has become
//! `evict: never`, the next CI job in rank) — never more pods than its plan, never the
//! high-priority trainer, never on a view or an API it cannot vouch for.
//!
//! The GPU: 22.6 GiB usable; a trainer (priority 1000000, 8 GiB), two CI jobs (3 GiB each)
//! and a greedy CI job growing 1 GiB/s from 1 s: soft pressure at ≈6 s, hard at ≈7.5 s.
//! The plan takes one pod. The double plays the faithful kubelet in real time: with grace 0
//! the API server deletes an evicted pod at once (as the generic store does), and the
//! kubelet's SIGTERM/SIGKILL reach no process here — the simulated processes live in the
//! agent — so the cooldown (60 s here) keeps the guard from deciding twice.

use crate::support::guard_world::{GuardWorld, POLICY, SCENARIO};
use apiserver_double::{ApiServer, Fault, FaultAction, Method, RecordedRequest};
use std::time::{Duration, Instant};

/// The double with the node and the scenario's pods; `before` runs before the agent
/// starts (to inject faults its first requests meet).
fn world(before: impl FnOnce(&ApiServer)) -> GuardWorld {
    GuardWorld::start(SCENARIO, "faults", POLICY, before)
}

fn pressure(w: &GuardWorld) -> u64 {
    w.state()["guard"]["status"]["gpus"][0]["pressure"]
        .as_str()
        .map_or(0, |p| if p == "none" { 0 } else { 1 })
}

/// A frozen API server (connections accepted, nothing answered) while the GPU crosses soft
/// and hard: no eviction is posted (the fresh read of the victim gets no answer), the
/// requests made meanwhile are a handful, and once the server thaws the greedy job — and
/// only it — is evicted.
#[test]
fn a_frozen_api_server_evicts_nothing_then_only_the_greedy_job() {
    let mut w = world(|_| {});
    w.wait("the view to sync", Duration::from_secs(10), |w| {
        let st = w.state();
        st["guard"].is_object() && st["guard"]["held"].is_null()
    });
    w.server.set_frozen(true);
    let frozen_at = Instant::now();
    let before = w.server.requests().len();
    w.wait("soft pressure", Duration::from_secs(15), |w| {
        pressure(w) > 0
    });
    // Well past hard and into a full GPU, still frozen.
    std::thread::sleep(Duration::from_secs(6));
    let during: Vec<RecordedRequest> = w.server.requests().into_iter().skip(before).collect();
    let frozen_for = frozen_at.elapsed();
    assert!(
        w.posts().is_empty(),
        "an eviction was posted into a frozen server: {:?}",
        w.posts()
    );
    let reads = during
        .iter()
        .filter(|r| r.method == Method::GET && r.path.starts_with("/api/v1/namespaces/"))
        .count();
    // The walk retries the read of its victim while the server is frozen (issue 38: giving
    // up at the first silence resumed a stopped grower), each try waiting out at least the
    // 2 s floor of the read's limit: one read per 2 s, plus the first.
    let bound = 2 + (frozen_for.as_secs() / 2) as usize;
    assert!(
        reads >= 1 && reads <= bound,
        "{reads} fresh reads in {frozen_for:?}: {during:#?}"
    );
    assert!(
        during.len() <= 10 + reads,
        "a storm into the frozen server: {during:#?}"
    );

    w.server.set_frozen(false);
    w.wait("the greedy job's eviction", Duration::from_secs(15), |w| {
        !w.evicted().is_empty()
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(w.evicted(), vec!["ci/greedy".to_string()]);
    let posted: Vec<String> = w.posts().into_iter().map(|r| r.path).collect();
    assert_eq!(
        posted,
        vec!["/api/v1/namespaces/ci/pods/greedy/eviction".to_string()]
    );
    let log = w.stop();
    assert!(
        log.contains("retrying the fresh read of the victim"),
        "{log}"
    );
}

/// A slow eviction: the server answers after 7 s (the agent gives up at 5 s) and carries it
/// out. The outcome is in doubt, not failed: nobody else is evicted, and once the watch
/// shows the pod gone the decision's record says it was evicted.
#[test]
fn a_slow_eviction_is_in_doubt_and_evicts_one_pod() {
    let mut w = world(|s| {
        s.inject(
            Fault::new(
                "/api/v1/namespaces/ci/pods/greedy/eviction",
                FaultAction::Delay(Duration::from_secs(7)),
            )
            .method(Method::POST)
            .times(1),
        );
    });
    w.wait("the eviction to be posted", Duration::from_secs(20), |w| {
        !w.posts().is_empty()
    });
    let posted_at = Instant::now();
    w.wait("the doubt", Duration::from_secs(8), |w| {
        w.state()["guard"]["status"]["gpus"][0]["phase"]["phase"] == "in_doubt"
    });
    w.wait("the late eviction to land", Duration::from_secs(10), |w| {
        !w.evicted().is_empty()
    });
    w.wait("the doubt to resolve", Duration::from_secs(5), |w| {
        w.state()["guard"]["status"]["gpus"][0]["phase"]["phase"] == "cooldown"
    });
    let victims = w.state()["guard"]["recentDecisions"][0]["victims"].clone();
    assert_eq!(victims[0]["name"], "greedy", "{victims}");
    assert_eq!(victims[0]["result"], "evicted", "{victims}");
    // Well past the point where the old walk would have taken the next candidate.
    while posted_at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(w.evicted(), vec!["ci/greedy".to_string()]);
    assert_eq!(w.posts().len(), 1, "{:?}", w.posts());
    let node_note = w.node_notes().into_iter().next().unwrap_or_default();
    assert!(node_note.contains("ci/greedy in_doubt"), "{node_note}");
    assert!(!node_note.contains("failed"), "{node_note}");
    w.stop();
}

/// A watch that stalls silently while the greedy job is re-annotated `evict: never`: the
/// guard's view is stale, but the fresh read before the eviction sees the annotation, so the
/// greedy job is not evicted; the view relists, and the next CI job in rank is evicted
/// instead — one pod, as the plan says. The trainer is never touched.
#[test]
fn a_stalled_watch_never_evicts_a_pod_that_became_exempt() {
    let mut w = world(|s| {
        s.inject(Fault::new("/api/v1/pods", FaultAction::StallWatch).times(1));
    });
    // The first watch is the stalled one; the change is not seen through it.
    w.server.update_pod("ci", "greedy", |p| {
        p["metadata"]["annotations"]["gpu-warden.io/evict"] = serde_json::json!("never");
    });
    w.wait("an eviction", Duration::from_secs(25), |w| {
        !w.evicted().is_empty()
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(w.evicted(), vec!["ci/ci-a".to_string()]);
    let posted: Vec<String> = w.posts().into_iter().map(|r| r.path).collect();
    assert_eq!(
        posted,
        vec!["/api/v1/namespaces/ci/pods/ci-a/eviction".to_string()]
    );
    let victims = w.state()["guard"]["recentDecisions"][0]["victims"].clone();
    assert_eq!(victims[0]["name"], "greedy", "{victims}");
    assert_eq!(victims[0]["result"], "skipped", "{victims}");
    assert!(
        victims[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("evict: never")),
        "{victims}"
    );
    let lists = w
        .server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
        .count();
    assert!((2..=4).contains(&lists), "{lists} lists");
    let log = w.stop();
    assert!(log.contains("disagrees with the pod view"), "{log}");
}

/// A freeze that begins between the fresh read of the greedy job and its eviction and lasts
/// longer than `MAX_PROOF_GAP` (30 s), so none of it is time the server answered; on the
/// thaw the server answers reads at once and carries the held eviction out 2 s later
/// (`set_thaw_writes_after`: a watch cache back before its storage). With `inDoubtTimeout:
/// 4s`, a guard that counted the frozen time would end the doubt as "not carried out" at the
/// first good view after the thaw — a fresh read then even shows the pod running — and
/// evict `ci-a` too: two for one. Counting only answered time, the held eviction lands
/// first and the doubt ends as carried out; nobody else is evicted.
#[test]
fn a_thaw_that_answers_reads_first_does_not_make_a_held_eviction_two_for_one() {
    let policy = format!("{POLICY}inDoubtTimeout: 4s\n");
    let mut w = GuardWorld::start(SCENARIO, "faults", &policy, |s| {
        s.inject(
            Fault::new(
                "/api/v1/namespaces/ci/pods/greedy/eviction",
                FaultAction::Freeze,
            )
            .method(Method::POST)
            .times(1),
        );
        s.set_thaw_writes_after(Duration::from_secs(2));
    });
    w.wait(
        "the greedy job's eviction to freeze the server",
        Duration::from_secs(30),
        |w| w.server.is_frozen(),
    );
    std::thread::sleep(Duration::from_secs(33));
    w.server.set_frozen(false);
    // Past the held eviction, and past inDoubtTimeout of answering after it.
    std::thread::sleep(Duration::from_secs(10));
    if w.evicted() != vec!["ci/greedy".to_string()] {
        let log = w.stop();
        panic!("{:?}\n{log}", w.evicted());
    }
    let posted: Vec<String> = w.posts().into_iter().map(|r| r.path).collect();
    assert_eq!(
        posted,
        vec!["/api/v1/namespaces/ci/pods/greedy/eviction".to_string()]
    );
    let log = w.stop();
    assert!(
        log.contains("eviction that was in doubt was carried out"),
        "{log}"
    );
    assert!(!log.contains("was not carried out"), "{log}");
}

/// The agent is restarted (a rollout) while its eviction of the greedy job is in doubt: the
/// POST was answered `500 etcdserver: request timed out` and is carried out only after the
/// new process has started (etcd committed it late). The new process starts its scenario
/// again (its processes there from the first poll), so the GPU fills up again within
/// seconds; the greedy pod is gone from the API by then and its process, which the kubelet
/// has not killed yet, belongs to no pod. Without
/// the doubt carried over the restart (in the agent's Lease, `gpu-warden.io/guard-doubts`)
/// the new process plans from scratch and evicts `ci-a`: two pods for one. With it, the
/// restored doubt resolves as carried out and the GPU cools down on the greedy job's
/// process: nobody else is evicted.
#[test]
fn an_agent_restarted_while_an_eviction_is_in_doubt_evicts_no_second_pod() {
    let lease_ns = "gpu-warden";
    // The greedy job's process from the first poll: the simulator plays its scenario from
    // the start in each process, and a real process outlives the agent's restart.
    let scenario = SCENARIO.replace("    start: 1s\n", "");
    assert_ne!(scenario, SCENARIO);
    let mut w = GuardWorld::start_env(
        &scenario,
        "faults",
        POLICY,
        &[("POD_NAMESPACE", lease_ns)],
        |s| {
            s.inject(
                Fault::new(
                    "/api/v1/namespaces/ci/pods/greedy/eviction",
                    FaultAction::EtcdTimeout { apply: false },
                )
                .method(Method::POST)
                .times(1),
            );
        },
    );
    w.wait("the doubt", Duration::from_secs(25), |w| {
        w.state()["guard"]["status"]["gpus"][0]["phase"]["phase"] == "in_doubt"
    });
    let key = "gpu-warden.io/guard-doubts";
    let carried = |w: &GuardWorld| {
        w.server
            .lease(lease_ns, crate::support::guard_world::NODE)
            .and_then(|l| l["metadata"]["annotations"][key].as_str().map(String::from))
    };
    w.wait("the doubt on the lease", Duration::from_secs(5), |w| {
        carried(w).is_some_and(|c| c.contains("greedy"))
    });
    w.restart();
    if !carried(&w).is_some_and(|c| c.contains("greedy")) {
        let lease = w.server.lease(lease_ns, crate::support::guard_world::NODE);
        panic!(
            "the doubt is not on the lease after the restart: {lease:?}\n{}",
            w.stop()
        );
    }
    // The held write lands: the pod is deleted (grace 0) after the restart.
    w.server.delete_pod("ci", "greedy");
    let restarted = Instant::now();
    w.wait("hard pressure again", Duration::from_secs(20), |w| {
        w.state()["guard"]["status"]["gpus"][0]["pressure"] == "hard"
    });
    // Well past the moment a fresh plan would have evicted the next pod.
    std::thread::sleep(Duration::from_secs(4));
    let posted: Vec<String> = w.posts().into_iter().map(|r| r.path).collect();
    let phase = w.state()["guard"]["status"]["gpus"][0]["phase"].clone();
    let log = w.stop();
    assert_eq!(
        posted,
        vec!["/api/v1/namespaces/ci/pods/greedy/eviction".to_string()],
        "{:?} after the restart, phase {phase}\n{log}",
        restarted.elapsed()
    );
    assert_eq!(phase["phase"], "cooldown", "{phase}\n{log}");
    assert!(log.contains("guard state carried over a restart"), "{log}");
    assert!(
        log.contains("eviction that was in doubt was carried out"),
        "{log}"
    );
}

/// etcd stalls under the API server once the view has synced, and the GPU fills up: the
/// watch cache still ends every watch cleanly at its 20 s timeout and sends bookmarks with
/// a resourceVersion that no longer moves, while every GET, LIST and write hangs. Neither
/// proves the pod view, so within the proof's lifetime (30 s) the guard holds its decisions
/// — no fresh read into the stalled server, no eviction — and once storage answers it
/// evicts the greedy job, and only it. (While a clean end proved the view, it stayed proven
/// through the stall and the guard kept deciding, sending a fresh read every 7 s.)
#[test]
fn a_storage_stall_holds_the_guard_though_its_watches_end_cleanly() {
    let fresh_reads = |w: &GuardWorld| {
        w.server
            .requests()
            .iter()
            .filter(|r| r.method == Method::GET && r.path.starts_with("/api/v1/namespaces/"))
            .count()
    };
    let mut w = world(|_| {});
    w.wait("the view to sync", Duration::from_secs(10), |w| {
        let st = w.state();
        st["guard"].is_object() && st["guard"]["held"].is_null()
    });
    w.server.set_storage_stalled(true);
    let stalled_at = Instant::now();
    w.wait("decisions held", Duration::from_secs(45), |w| {
        w.state()["guard"]["held"].is_string()
    });
    let held_after = stalled_at.elapsed();
    assert!(held_after <= Duration::from_secs(36), "{held_after:?}");
    let reads = fresh_reads(&w);
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(fresh_reads(&w), reads, "a fresh read on an unproven view");
    assert!(w.posts().is_empty(), "{:?}", w.posts());
    assert!(w.state()["guard"]["held"].is_string(), "{}", w.state());

    w.server.set_storage_stalled(false);
    w.wait("the greedy job's eviction", Duration::from_secs(20), |w| {
        !w.evicted().is_empty()
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(w.evicted(), vec!["ci/greedy".to_string()]);
    w.stop();
}

/// The greedy job's eviction gets no answer (in doubt), and the API server restarts: its
/// history is gone (410), its pods come back under new UIDs, and the eviction it held is
/// lost with it. `/state` must not call that eviction `evicted`: the old UID vanished, but the
/// pod of that name running now was never evicted — the record says `lost`, and why.
#[test]
fn an_eviction_lost_with_a_restarted_server_is_not_shown_as_evicted() {
    let mut w = world(|s| {
        s.inject(
            Fault::new(
                "/api/v1/namespaces/ci/pods/greedy/eviction",
                FaultAction::Hang,
            )
            .method(Method::POST)
            .times(1),
        );
    });
    w.wait("the doubt", Duration::from_secs(30), |w| {
        w.state()["guard"]["status"]["gpus"][0]["phase"]["phase"] == "in_doubt"
    });
    // The restart: new history, every pod back under a new UID.
    w.server.restart_history();
    for mut p in w.server.pods() {
        let (ns, name) = (
            p["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            p["metadata"]["name"].as_str().unwrap_or("").to_string(),
        );
        w.server.delete_pod(&ns, &name);
        let uid = p["metadata"]["uid"].as_str().unwrap_or("").to_string();
        p["metadata"]["uid"] = serde_json::json!(format!("{}{}", &uid[..uid.len() - 4], "beef"));
        p["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        w.server.add_pod(p).unwrap();
    }
    w.wait("the doubt to resolve", Duration::from_secs(20), |w| {
        w.state()["guard"]["recentDecisions"][0]["victims"][0]["result"] != "in_doubt"
    });
    let victim = w.state()["guard"]["recentDecisions"][0]["victims"][0].clone();
    let log = w.stop();
    assert_eq!(victim["name"], "greedy", "{victim}");
    assert_eq!(victim["result"], "lost", "{victim}\n{log}");
    let detail = victim["detail"].as_str().unwrap_or("");
    assert!(detail.contains("was not evicted"), "{detail}");
}

/// Issue 30, "read, not reproduced": the fresh read re-checked exclusions but not the
/// ranking's inputs, so a stale view could rank the wrong pod first. A watch stalls
/// silently while the greedy job declares a VRAM request above what it uses
/// (`gpu-warden.io/vram-request-mib`; `spec.priority` is immutable on a real server, the
/// declared need is not): it no longer ranks first, the fresh read before its eviction
/// sees that and skips it ("request 0 MiB → 20000 MiB"), and the next CI job in rank is
/// evicted instead — one pod for the decision, as its plan says.
#[test]
fn a_stale_view_that_ranks_the_wrong_pod_first_is_caught_by_the_fresh_read() {
    let mut w = world(|s| {
        s.inject(Fault::new("/api/v1/pods", FaultAction::StallWatch).times(1));
    });
    // The change must come after the view's list, into the stalled watch: made before the
    // agent's first list (a loaded machine starts it late), the view has it from the start and
    // nothing is stale.
    w.wait("the pod watch to stall", Duration::from_secs(20), |w| {
        w.server
            .requests()
            .iter()
            .any(|r| r.is_watch() && r.path == "/api/v1/pods")
    });
    w.server.update_pod("ci", "greedy", |p| {
        p["metadata"]["annotations"]["gpu-warden.io/vram-request-mib"] = serde_json::json!("20000");
    });
    w.wait("an eviction", Duration::from_secs(25), |w| {
        !w.evicted().is_empty()
    });
    std::thread::sleep(Duration::from_secs(1));
    // The first decision: the greedy job skipped, ci-a evicted, and nobody else. (The greedy
    // job, now within its declared need, keeps growing: a later decision whose cooldown gave
    // way to that growth may take ci-b — the next pod over its request — but never it.)
    let first = w.evicted();
    assert_eq!(
        first.first().map(String::as_str),
        Some("ci/ci-a"),
        "{first:?}"
    );
    assert!(
        !first.contains(&"ml-train/trainer".to_string()),
        "{first:?}"
    );
    let decisions = w.state()["guard"]["recentDecisions"].clone();
    let victims = decisions[0]["victims"].clone();
    assert_eq!(victims[0]["name"], "greedy", "{victims}");
    assert_eq!(victims[0]["result"], "skipped", "{victims}");
    assert!(
        victims[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("request 0 MiB → 20000 MiB")),
        "{victims}"
    );
    assert_eq!(victims[1]["name"], "ci-a", "{victims}");
    assert_eq!(victims[1]["result"], "evicted", "{victims}");
    let evicted_by_first = victims
        .as_array()
        .map_or(0, |v| v.iter().filter(|v| v["result"] == "evicted").count());
    assert_eq!(evicted_by_first, 1, "{victims}");
    w.stop();
}

/// What the Lease carries is read as hostile input (anyone allowed to write the Lease can
/// write it): an annotation that is not the guard's JSON — here a doubt naming a path for a
/// namespace — is ignored with one warning line, and nothing else is lost: the guard acts
/// as a fresh agent would (the greedy job, only it), the Lease gets its figures, and another
/// owner's annotation on it survives.
#[test]
fn a_hostile_carried_state_on_the_lease_is_ignored_with_one_warning() {
    let lease_ns = "gpu-warden";
    let node = crate::support::guard_world::NODE;
    let hostile = r#"{"v":1,"doubts":[{"gpu":"GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b","uid":"u-1","namespace":"../../etc","name":"greedy","pids":[503],"since":"2026-01-01T00:00:00Z","decision":1}]}"#;
    let mut w = GuardWorld::start_env(
        SCENARIO,
        "faults",
        POLICY,
        &[("POD_NAMESPACE", lease_ns)],
        |s| {
            s.add_lease(serde_json::json!({
                "metadata": {"name": node, "namespace": lease_ns, "annotations": {
                    "gpu-warden.io/guard-doubts": hostile,
                    "example.com/owner": "someone else",
                }},
                "spec": {"holderIdentity": "an-earlier-agent"},
            }))
            .unwrap();
        },
    );
    w.wait("the greedy job's eviction", Duration::from_secs(25), |w| {
        !w.evicted().is_empty()
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(w.evicted(), vec!["ci/greedy".to_string()]);
    let lease = w.server.lease(lease_ns, node).unwrap_or_default();
    let annotations = &lease["metadata"]["annotations"];
    assert_eq!(annotations["example.com/owner"], "someone else", "{lease}");
    assert!(
        annotations["gpu-warden.io/vram-free-mib"].is_string(),
        "{lease}"
    );
    let log = w.stop();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("carried state on the lease"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("namespace \"../../etc\""),
        "{}",
        warnings[0]
    );
}
