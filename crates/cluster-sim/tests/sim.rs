//! The simulator's claims, on scenarios small enough for a debug build.

use cluster_sim::report;
use cluster_sim::sim::{EventKind, Outcome};
use cluster_sim::workload::Job;
use cluster_sim::{run_all, simulate, Cluster, PolicyKind, Scenario};

const GIB: u64 = 1024;

fn one_gpu(jobs: Vec<Job>, horizon_s: u64) -> Scenario {
    Scenario {
        cluster: Cluster {
            small_nodes: 1,
            big_nodes: 0,
            ..Cluster::default()
        },
        horizon_s,
        jobs: Some(jobs),
        ..Scenario::default()
    }
}

fn job(id: u64, arrive_s: f64, duration_s: f64, peak_mib: u64, declared: Option<u64>) -> Job {
    Job {
        id,
        arrive_s,
        duration_s,
        peak_mib,
        declared_mib: declared,
        protected: false,
    }
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
        ..Scenario::default()
    };
    // The default arrival rate scaled to 10 GPUs instead of 90.
    sc.workload.arrivals_per_min *= 10.0 / 90.0;
    sc
}

#[test]
fn same_seed_same_report_byte_for_byte() {
    let sc = small_cluster(7, 0.25);
    let render = |sc: &Scenario| {
        let o = run_all(sc, &[8]).expect("runs");
        (
            report::markdown(sc, &o),
            report::csv(&o),
            report::svg(sc, &o),
        )
    };
    let a = render(&sc);
    assert_eq!(a, render(&sc));
    assert!(a.0.contains("| + extender + guard | 8 |"), "{}", a.0);
    assert!(a.2.starts_with("<svg") && a.2.trim_end().ends_with("</svg>"));
    let other = render(&small_cluster(8, 0.25));
    assert_ne!(a.1, other.1, "the seed drives the workload");
}

#[test]
fn the_extender_keeps_a_job_that_would_not_fit_off_the_gpu() {
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
    assert_eq!(ext.oom_killed, 0, "{:?}", ext.trace);
    assert_eq!(ext.evictions, 0, "{:?}", ext.trace);
    assert_eq!(ext.finished, 2);
    let a_done = events(&ext, 0, |k| *k == EventKind::Finished);
    let b = b_started(&ext);
    assert_eq!(b.len(), 1);
    assert!(b[0] >= a_done[0], "B waits for A: {b:?} vs {a_done:?}");
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
}

#[test]
fn safe_replicas_is_the_highest_setting_under_the_limit_with_all_below_it() {
    let o = |replicas, oom_killed| Outcome {
        policy: PolicyKind::Guard,
        replicas,
        jobs: 10_000,
        finished: 0,
        oom_killed,
        oom_at_start: 0,
        oom_declared_enough: 0,
        evictions: 0,
        jobs_evicted: 0,
        utilisation: 0.0,
        wait_p50_s: 0.0,
        wait_p99_s: 0.0,
        trace: vec![],
    };
    let rows = [o(2, 0), o(4, 10), o(8, 11)];
    assert_eq!(report::safe_replicas(&rows, PolicyKind::Guard), Some(4));
    let rows = [o(2, 20), o(4, 0)];
    assert_eq!(report::safe_replicas(&rows, PolicyKind::Guard), None);
    assert_eq!(report::safe_replicas(&rows, PolicyKind::DevicePlugin), None);
}
