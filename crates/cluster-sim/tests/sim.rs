//! The simulator's claims, on scenarios small enough for a debug build.

use cluster_sim::engine::jobs_evicted;
use cluster_sim::report;
use cluster_sim::workload::{Job, WorkloadModel};
use cluster_sim::{simulate, Cluster, EventKind, OnDecision, Outcome, PolicyKind, Scenario};

const GIB: u64 = 1024;

fn one_gpu(jobs: Vec<Job>, horizon_s: u64) -> Scenario {
    Scenario {
        cluster: Cluster {
            small_nodes: 1,
            big_nodes: 0,
            ..Cluster::default()
        },
        horizon_s,
        warmup_s: 0,
        jobs: Some(jobs),
        ..Scenario::default()
    }
}

fn job(id: u64, arrive_s: f64, duration_s: f64, peak_mib: u64, declared: Option<u64>) -> Job {
    Job::smooth(
        id,
        arrive_s,
        duration_s,
        peak_mib,
        declared,
        &WorkloadModel::default(),
    )
}

/// A job with explicit allocations `(seconds of progress, MiB held)`.
fn stepped(
    id: u64,
    arrive_s: f64,
    duration_s: f64,
    steps: &[(f64, u64)],
    declared: Option<u64>,
) -> Job {
    let mut j = job(
        id,
        arrive_s,
        duration_s,
        steps.last().map(|s| s.1).unwrap_or(0),
        declared,
    );
    j.allocations = steps.to_vec();
    j
}

/// A greedy job's allocations: 2 GiB, then 512 MiB more every 2 s of progress to 14 GiB.
fn greedy_steps() -> Vec<(f64, u64)> {
    (0..=24)
        .map(|i| (i as f64 * 2.0, 2 * GIB + i * 512))
        .collect()
}

fn events(o: &Outcome, job: u64, kind: fn(&EventKind) -> bool) -> Vec<u64> {
    o.trace
        .iter()
        .filter(|e| e.job == job && kind(&e.kind))
        .map(|e| e.at_s)
        .collect()
}

fn small_cluster(seed: u64, hours: f64) -> Scenario {
    let mut sc = Scenario {
        seed,
        cluster: Cluster {
            small_nodes: 6,
            big_nodes: 1,
            ..Cluster::default()
        },
        horizon_s: (hours * 3600.0) as u64,
        warmup_s: 600,
        ..Scenario::default()
    };
    // The default arrival rate scaled to 10 GPUs instead of 50.
    sc.workload.arrivals_per_min *= 10.0 / 50.0;
    sc
}

#[test]
fn same_seed_same_report_byte_for_byte() {
    let render = |sc: &Scenario| {
        let o: Vec<Outcome> = PolicyKind::ALL
            .iter()
            .map(|p| simulate(sc, *p, 8).expect("runs"))
            .collect();
        (report::markdown(&o), report::csv(&o), report::svg("t", &o))
    };
    let sc = small_cluster(7, 0.4);
    let a = render(&sc);
    assert_eq!(a, render(&sc));
    assert!(a.0.contains("| + extender + guard (stop) | 8 |"), "{}", a.0);
    assert!(a.2.starts_with("<svg") && a.2.trim_end().ends_with("</svg>"));
    assert_ne!(
        a.1,
        render(&small_cluster(8, 0.4)).1,
        "the seed drives the workload"
    );
}

#[test]
fn the_shipped_extender_keeps_a_job_that_would_not_fit_off_the_gpu() {
    // A declares 16 GiB and grows to it over 10 minutes; B (12 GiB) arrives while A still
    // uses a fraction of what it declared: free memory says B fits, committed memory says no.
    let jobs = vec![
        job(0, 0.0, 1200.0, 16 * GIB, Some(16 * GIB)),
        job(1, 30.0, 600.0, 12 * GIB, Some(12 * GIB)),
    ];
    let sc = one_gpu(jobs, 2400);
    let alone = simulate(&sc, PolicyKind::DevicePlugin, 4).expect("runs");
    assert_eq!(alone.oom_killed, 1, "{:?}", alone.trace);
    let b_started = |o: &Outcome| events(o, 1, |k| matches!(k, EventKind::Started(..)));
    assert_eq!(
        b_started(&alone),
        vec![30],
        "the device plugin hands B a replica at once"
    );

    let ext = simulate(&sc, PolicyKind::ExtenderGuard, 4).expect("runs");
    assert_eq!(
        (ext.oom_killed, ext.evictions, ext.finished),
        (0, 0, 2),
        "{:?}",
        ext.trace
    );
    let a_done = events(&ext, 0, |k| *k == EventKind::Finished);
    let b = b_started(&ext);
    assert_eq!(b.len(), 1);
    assert!(b[0] >= a_done[0], "B waits for A: {b:?} vs {a_done:?}");
}

#[test]
fn a_need_beyond_the_declaration_stays_committed_after_the_replica_shows() {
    // A declares nothing and is judged on the unknown rule's 12 GiB; it starts at 40 % of
    // its 12 GiB and grows over 10 minutes. B (11 GiB, declared) arrives two minutes in,
    // long after A's replica shows in the node's figures: free memory says B fits, and so
    // does `declaredMiB` (A declared nothing) — only A's need, still counted, says no.
    let jobs = vec![
        job(0, 0.0, 1200.0, 12 * GIB, None),
        job(1, 120.0, 600.0, 11 * GIB, Some(11 * GIB)),
    ];
    // Every promised MiB counted (`promisedPercent: 100`): the ledger's accounting alone.
    let sc = Scenario {
        extender_policy: "unknownNeed: {rule: reserve, mib: 12288}\npromisedPercent: 100\n".into(),
        ..one_gpu(jobs.clone(), 2400)
    };
    let ext = simulate(&sc, PolicyKind::ExtenderGuard, 4).expect("runs");
    assert_eq!(
        (ext.oom_killed, ext.evictions, ext.finished),
        (0, 0, 2),
        "{:?}",
        ext.trace
    );
    let a_done = events(&ext, 0, |k| *k == EventKind::Finished);
    let b = events(&ext, 1, |k| matches!(k, EventKind::Started(..)));
    assert!(b[0] >= a_done[0], "B waits for A: {b:?} vs {a_done:?}");

    // At the shipped 75 %, a quarter of A's 7 GiB still to come is lent: B goes next to
    // A, and when their growth passes the GPU the guard evicts (GitLab retries) before
    // CUDA runs out — the trade docs/scheduling.md measures.
    let lent = Scenario {
        extender_policy: "unknownNeed: {rule: reserve, mib: 12288}\n".into(),
        ..one_gpu(jobs, 2400)
    };
    let ext = simulate(&lent, PolicyKind::ExtenderGuard, 4).expect("runs");
    let b = events(&ext, 1, |k| matches!(k, EventKind::Started(..)));
    assert_eq!(b, vec![120], "B placed at once: {:?}", ext.trace);
    assert_eq!(
        (ext.oom_killed, ext.evictions, ext.finished),
        (0, 1, 2),
        "{:?}",
        ext.trace
    );
    let evicted = events(&ext, 0, |k| *k == EventKind::Evicted);
    assert_eq!(
        evicted.len(),
        1,
        "A, which declared nothing, is the one evicted"
    );
}

fn guard_keeps(protect_by_annotation: bool) {
    // P is protected (annotated evict: never, or simply within what it declared); G
    // declares nothing and grows past what the GPU can hold next to P.
    let mut p = job(0, 0.0, 1200.0, 12 * GIB, Some(12 * GIB));
    p.protected = protect_by_annotation;
    let g = job(1, 4.0, 1200.0, 14 * GIB, None);
    let sc = one_gpu(vec![p, g], 3600);
    let alone = simulate(&sc, PolicyKind::DevicePlugin, 4).expect("runs");
    assert!(alone.oom_killed >= 1, "without the guard a job dies");

    let guarded = simulate(&sc, PolicyKind::Guard, 4).expect("runs");
    assert_eq!(guarded.oom_killed, 0, "{:?}", guarded.trace);
    let evicted = |j| events(&guarded, j, |k| *k == EventKind::Evicted);
    assert!(!evicted(1).is_empty(), "the greedy job is evicted");
    assert!(evicted(0).is_empty(), "the protected job is not");
    assert_eq!(events(&guarded, 0, |k| *k == EventKind::Finished).len(), 1);
    assert_eq!(
        events(&guarded, 1, |k| *k == EventKind::Finished).len(),
        1,
        "the greedy job, retried, finishes once P is done"
    );
}

#[test]
fn the_guard_evicts_the_greedy_job_not_the_annotated_one() {
    guard_keeps(true);
}

#[test]
fn the_guard_evicts_the_job_over_its_request_not_the_one_within() {
    guard_keeps(false);
}

#[test]
fn an_evicted_job_grows_through_the_kubelets_grace_unless_stopped_or_killed() {
    // P holds 8 GiB; G grows by 512 MiB every 2 s of progress up to 14 GiB: the guard
    // decides before the GPU is full. Evict-only: G keeps allocating for max(grace 5 s, 2 s).
    let p = stepped(0, 0.0, 600.0, &[(0.0, 8 * GIB)], Some(8 * GIB));
    let steps = greedy_steps();
    let g = stepped(1, 2.0, 600.0, &steps, None);
    let run = |on| {
        let sc = Scenario {
            on_decision: on,
            ..one_gpu(vec![p.clone(), g.clone()], 900)
        };
        simulate(&sc, PolicyKind::Guard, 4).expect("runs")
    };
    let (evict, stop, kill) = (
        run(OnDecision::Evict),
        run(OnDecision::Stop),
        run(OnDecision::Kill),
    );
    for o in [&evict, &stop, &kill] {
        assert!(o.evictions >= 1, "{:?}", o.trace);
        assert!(
            events(o, 0, |k| *k == EventKind::Evicted).is_empty(),
            "P is never the victim"
        );
    }
    assert!(
        evict.victim_growth_mib > 0,
        "the victim kept allocating: {:?}",
        evict.trace
    );
    assert_eq!((stop.victim_growth_mib, kill.victim_growth_mib), (0, 0));
    // The retried attempt starts once the memory is back: stop (killed once evicted) and
    // kill free it at once, evict-only at the kubelet's SIGKILL.
    let restart = |o: &Outcome| events(o, 1, |k| matches!(k, EventKind::Started(..)))[1];
    assert_eq!(restart(&stop), restart(&kill));
    assert!(
        restart(&stop) < restart(&evict),
        "{} vs {}",
        restart(&stop),
        restart(&evict)
    );
}

#[test]
fn extender_and_guard_kill_fewer_jobs_than_the_device_plugin_alone() {
    // The ordering docs/scheduling.md reports, on a reduced seeded scenario.
    let sc = small_cluster(3, 1.0);
    let alone = simulate(&sc, PolicyKind::DevicePlugin, 8).expect("runs");
    let ext = simulate(&sc, PolicyKind::ExtenderGuard, 8).expect("runs");
    assert!(alone.oom_killed > 0, "the scenario must stress the GPUs");
    assert!(
        ext.oom_killed < alone.oom_killed,
        "extender + guard {} vs device plugin {}",
        ext.oom_killed,
        alone.oom_killed
    );
    assert!(ext.utilisation > 0.0 && ext.utilisation <= 1.0);
    assert!(jobs_evicted(&ext) <= ext.evictions);
}

#[test]
fn a_row_is_safe_only_when_every_seed_is() {
    let o = |seed, oom_killed| Outcome {
        policy: PolicyKind::Guard,
        on_decision: OnDecision::Stop,
        seed,
        replicas: 8,
        jobs: 10_000,
        finished: 0,
        oom_killed,
        oom_within_declared: 0,
        oom_undeclared: 0,
        oom_causes: Default::default(),
        evictions: 0,
        evicted_not_growing: 0,
        evicted_not_growing_within_declared: 0,
        victim_growth_mib: 0,
        jobs_per_gpu_hour: 1.0,
        evictions_per_hour: 0.0,
        wait_p95_s: 0.0,
        utilisation: 0.0,
        idle_replicas: 0.0,
        idle_short_of_room: 0.0,
        idle_counted_taken: 0.0,
        trace: vec![],
    };
    let runs = [o(1, 0), o(2, 10), o(3, 11)];
    let rows = report::rows(&runs);
    assert_eq!(rows.len(), 1);
    assert!(!rows[0].safe(), "seed 3 kills 0.11 %");
    let runs = [o(1, 0), o(2, 10)];
    assert!(report::rows(&runs)[0].safe());
}

#[test]
fn a_workspace_that_comes_and_goes_is_not_taken_for_growth() {
    // T (a trainer) holds 6 GiB and an 8 GiB workspace for 3 s of every 7 s, inside the
    // 14 GiB it declares; S, a steady CI job, holds 1.5 GiB; G grows by 512 MiB every 2 s
    // to 14 GiB, declaring nothing. Only G fills the GPU, and only G is evicted, however
    // T's workspace falls against the decisions and the cooldowns.
    let mut t = stepped(0, 0.0, 900.0, &[(0.0, 6 * GIB)], Some(14 * GIB));
    t.workspace = Some(cluster_sim::workload::Workspace {
        mib: 8 * GIB,
        every_s: 7.0,
        holds_s: 3.0,
    });
    let s = stepped(1, 0.0, 900.0, &[(0.0, 1536)], Some(2 * GIB));
    let steps = greedy_steps();
    for start in [4.0, 5.0, 8.0, 11.0] {
        let g = stepped(2, start, 900.0, &steps, None);
        let sc = one_gpu(vec![t.clone(), s.clone(), g], 1200);
        let o = simulate(&sc, PolicyKind::Guard, 4).expect("runs");
        assert!(
            !events(&o, 2, |k| *k == EventKind::Evicted).is_empty(),
            "G is evicted (start {start}): {:?}",
            o.trace
        );
        for bystander in [0, 1] {
            assert!(
                events(&o, bystander, |k| *k == EventKind::Evicted).is_empty(),
                "job {bystander} was evicted (G starting at {start}): {:?}",
                o.trace
            );
        }
        assert_eq!(o.evicted_not_growing, 0, "{:?}", o.trace);
    }
}

#[test]
fn a_victim_that_was_not_growing_is_counted_as_a_bystander() {
    // S holds 10 GiB steadily against a 2 GiB declaration; G grows inside its 16 GiB one.
    // The kubelet's order takes the pod over its declaration first: S, which was not
    // growing — counted, and not within its declaration.
    let s = stepped(0, 0.0, 900.0, &[(0.0, 10 * GIB)], Some(2 * GIB));
    let steps = greedy_steps();
    let g = stepped(1, 30.0, 900.0, &steps, Some(16 * GIB));
    let o = simulate(&one_gpu(vec![s, g], 600), PolicyKind::Guard, 4).expect("runs");
    assert!(
        !events(&o, 0, |k| *k == EventKind::Evicted).is_empty(),
        "{:?}",
        o.trace
    );
    assert!(o.evicted_not_growing >= 1, "{:?}", o.trace);
    assert_eq!(o.evicted_not_growing_within_declared, 0);
}
