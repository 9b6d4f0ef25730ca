//! The agent's own `process_*` families: plausible values from the `/proc/self` reader, and the
//! real binary serving them, read afresh on each scrape.

use crate::support::*;
use gpu_warden::publish::process_metrics::{ProcessFacts, ProcessSource, FAMILIES};
use gpu_warden::publish::process_reader::SelfProcess;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Memory, start time and descriptors of a process started moments ago.
fn assert_plausible(f: &ProcessFacts) {
    assert!(f.resident_bytes > 0, "{f:?}");
    assert!(f.virtual_bytes >= f.resident_bytes, "{f:?}");
    let now = unix_now();
    // Start times are whole seconds; allow one for rounding against `now`.
    assert!(
        f.start_time_seconds <= now + 1,
        "started in the future: {f:?}"
    );
    assert!(
        f.start_time_seconds + 3600 >= now,
        "started over an hour ago: {f:?}"
    );
    assert!(f.cpu_seconds >= 0.0 && f.cpu_seconds.is_finite(), "{f:?}");
    let (open, max) = (f.open_fds.unwrap(), f.max_fds.unwrap());
    assert!(open >= 3 && open <= max, "{f:?}");
}

/// Spins for `d` of wall time (so at least some CPU time on a shared machine).
fn burn(d: Duration) {
    let t0 = Instant::now();
    let mut x = 0u64;
    while t0.elapsed() < d {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

#[test]
fn self_process_reads_are_plausible_and_cpu_time_only_grows() {
    let reader = SelfProcess::new().expect("the current process has an id");
    let a = reader.read().expect("a read of this process");
    assert_plausible(&a);
    burn(Duration::from_millis(300));
    let b = reader.read().unwrap();
    assert_plausible(&b);
    assert!(b.cpu_seconds > a.cpu_seconds, "{a:?} then {b:?}");
    let c = reader.read().unwrap();
    assert!(c.cpu_seconds >= b.cpu_seconds, "{b:?} then {c:?}");
    assert_eq!(a.start_time_seconds, c.start_time_seconds);
}

/// The value of the one sample of `family` in an exposition.
fn value(body: &str, family: &str) -> f64 {
    let prefix = format!("{family} ");
    let line = body
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {family} sample in:\n{body}"));
    line[prefix.len()..].parse().unwrap()
}

#[test]
fn the_agent_serves_its_process_families_read_at_scrape_time() {
    let agent = Agent::start(&AgentArgs::sim().args());
    let first = get(agent.port, "/metrics").unwrap().body;
    for family in FAMILIES {
        let kind = if family.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        assert!(
            first.contains(&format!("# TYPE {family} {kind}\n")),
            "{family}: {first}"
        );
    }
    // After the per-poll families, where the agent's own families end.
    let build_info = first.find("gpu_warden_build_info").unwrap();
    assert!(first.find("# HELP process_cpu_seconds_total").unwrap() > build_info);
    let facts = |body: &str| ProcessFacts {
        cpu_seconds: value(body, "process_cpu_seconds_total"),
        open_fds: Some(value(body, "process_open_fds") as u64),
        max_fds: Some(value(body, "process_max_fds") as u64),
        resident_bytes: value(body, "process_resident_memory_bytes") as u64,
        start_time_seconds: value(body, "process_start_time_seconds") as u64,
        virtual_bytes: value(body, "process_virtual_memory_bytes") as u64,
    };
    let a = facts(&first);
    assert_plausible(&a);
    // Each scrape reads afresh, and the counter never goes back.
    let mut last = a.cpu_seconds;
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(150));
        let f = facts(&get(agent.port, "/metrics").unwrap().body);
        assert_plausible(&f);
        assert!(f.cpu_seconds >= last, "{last} then {}", f.cpu_seconds);
        assert_eq!(f.start_time_seconds, a.start_time_seconds);
        last = f.cpu_seconds;
    }
}

/// What one scrape-time read costs (one read of `/proc/self`, then the
/// descriptor count and limit), and the whole scrape-time addition to a `/metrics` body of
/// the H100 ×8 demo's size. Timing only, so not part of the suite:
/// `cargo test --test e2e process_metrics::read_cost -- --ignored --nocapture`
/// (add `--release` for the figure the agent sees).
#[test]
#[ignore]
fn read_cost() {
    let reader = SelfProcess::new().unwrap();
    let rounds = 2000;
    for _ in 0..50 {
        reader.read().unwrap();
    }
    let t0 = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(reader.read().unwrap());
    }
    let per_read = t0.elapsed() / rounds;
    let body = bytes::Bytes::from(vec![b'x'; 60 * 1024]);
    let t0 = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(gpu_warden::publish::process_metrics::metrics_body(
            &body,
            Some(&reader as &dyn ProcessSource),
        ));
    }
    let per_body = t0.elapsed() / rounds;
    println!(
        "one read: {per_read:?}; read + render + copy of a 60 KiB body: {per_body:?} ({rounds} rounds, open fds {:?})",
        reader.read().unwrap().open_fds
    );
}
