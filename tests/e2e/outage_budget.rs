//! "No retry storm": how many requests one agent sends to an API server that is down for
//! five minutes. The retrying shells sleep `Backoff::next_delay()` between attempts (one
//! request each — the pod watch relists with one LIST, the annotator sends one PATCH), so
//! counting attempts over 300 s of virtual time with the shipped schedules counts requests.
//! The real-HTTP outage tests (tests/e2e/annotations_e2e.rs, tests/e2e/guard_scenarios.rs (i))
//! check that an attempt is one request and that both recover; evictions are never attempted
//! during an outage because the guard holds decisions while the pod view is unhealthy.

use gpu_warden::act::node_annotations::AnnotatorTiming;
use gpu_warden::attribute::watch::RELIST_BACKOFF;
use gpu_warden::model::backoff::Backoff;
use std::time::Duration;

const OUTAGE: Duration = Duration::from_secs(300);

/// Attempts made during `OUTAGE` by a shell that tries at once, then after each failure
/// sleeps the next delay (plus `per_attempt`, the time a failed request itself takes).
fn attempts(mut b: Backoff, per_attempt: Duration) -> usize {
    let mut t = Duration::ZERO;
    let mut n = 0;
    while t < OUTAGE {
        n += 1;
        t += per_attempt + b.next_delay();
    }
    n
}

#[test]
fn a_five_minute_outage_costs_each_agent_a_bounded_number_of_requests() {
    let mut worst_watch = 0;
    let mut worst_annotator = 0;
    let annot = AnnotatorTiming::default();
    // Many nodes: the jitter seeds differ; the bound must hold for every one of them.
    for node in 0..1000u64 {
        let seed = node.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1;
        // A refused connection fails in microseconds: the worst case for the count.
        let w = attempts(
            Backoff::new(RELIST_BACKOFF.0, RELIST_BACKOFF.1, seed),
            Duration::ZERO,
        );
        let a = attempts(
            Backoff::new(annot.backoff_initial, annot.backoff_max, seed),
            Duration::ZERO,
        );
        worst_watch = worst_watch.max(w);
        worst_annotator = worst_annotator.max(a);
    }
    println!("5-minute outage, worst of 1000 nodes: pod watch {worst_watch} LISTs, annotator {worst_annotator} PATCHes");
    // 500 ms doubling to 30 s with waits in [base/2, base]: at most 6 + 290/15 ≈ 26.
    assert!(
        worst_watch <= 26,
        "pod watch: {worst_watch} requests in 5 minutes"
    );
    // 1 s doubling to 60 s: at most 6 + 270/30 ≈ 15.
    assert!(
        worst_annotator <= 15,
        "annotator: {worst_annotator} requests in 5 minutes"
    );
    // A fleet of 1000 nodes then adds at most ~0.14 requests/s per node to a recovering server.
    let fleet_rate = (worst_watch + worst_annotator) as f64 * 1000.0 / OUTAGE.as_secs_f64();
    assert!(
        fleet_rate < 150.0,
        "{fleet_rate} requests/s from 1000 nodes"
    );
}

#[test]
fn jitter_spreads_a_fleet_after_a_shared_outage() {
    // All nodes lose the server at the same instant; their 5th retries must not coincide.
    let mut fifth: Vec<Duration> = (0..100u64)
        .map(|node| {
            let mut b = Backoff::new(RELIST_BACKOFF.0, RELIST_BACKOFF.1, node * 7919 + 1);
            (0..5).map(|_| b.next_delay()).sum()
        })
        .collect();
    fifth.sort();
    let spread = fifth[fifth.len() - 1] - fifth[0];
    assert!(
        spread > Duration::from_secs(2),
        "retries bunch within {spread:?}"
    );
}
