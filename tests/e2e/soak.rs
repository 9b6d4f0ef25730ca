//! A compressed soak: the agent's `Core` — attribution through a
//! simulated /proc, a pod view that churns, the guard in dry-run, rendering — driven on a
//! `ManualClock` for 5 000 one-second polls (83 simulated minutes) with heavy process and
//! pod churn: two new GPU processes every poll, each in its own short-lived pod (one in
//! ten a host process), living 5–24 s, a quarter of them with hostile names, one in seven
//! growing fast until the guard sees pressure. Asserts:
//! - no stale series: every 5th poll, the per-process and per-container series are exactly
//!   the processes and pods alive at that instant;
//! - the simulated /proc holds exactly the live processes (it does not grow);
//! - resident memory of this test process stays within 4 MiB of its post-warm-up figure,
//!   and its descriptors and threads are where they started.
//!
//! Prints its figures (`cargo test --test soak -- --nocapture`), quoted in
//! docs/reliability.md. `SOAK_POLLS=N` runs longer.

use gpu_warden::attribute::pods::pod_info;
use gpu_warden::attribute::ports::PodSource;
use gpu_warden::guard::policy::Policy;
use gpu_warden::model::clock::{Clock, ManualClock};
use gpu_warden::model::pod::{ContainerInfo, PodInfo};
use gpu_warden::model::pod::{PodMap, PodViewStatus};
use gpu_warden::sample::scenario::{ProcessSpec, Scenario, Trajectory};
use gpu_warden::sample::sim::{placement_container_id, placement_uid, scenario_pods};
use gpu_warden::sample::PollRequest;
use gpu_warden_testkit::rig::{Rig, RigOptions};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// Process names; a quarter are hostile (quote, backslash, newline, right-to-left override).
const NAMES: [&str; 4] = ["python", "torchrun", "ev\"il\\\nname", "名前-\u{202e}"];

/// Lifetimes run 5..=24 s; two processes start every second.
const MAX_LIFE_S: u64 = 24;

/// Two processes start every second; each lives 5–24 s. Built by cloning two parsed
/// templates (one in a pod, one on the host), so the test follows the scenario format.
fn scenario(polls: u64) -> Scenario {
    let mut sc = Scenario::parse(
        "gpus:\n  - {model: NVIDIA H100 80GB HBM3, count: 2, memory_mib: 81559, reserved_mib: 520, power_w: 400, gpu_temp_c: 40, sm_clock_mhz: 1980}\nprocesses:\n  - {pid: 1, gpu: 0, memory: {constant: 1}, sm_util: 0.05, pod: {namespace: ci, name: t, container: build}}\n  - {pid: 2, gpu: 0, memory: {constant: 1}, sm_util: 0.05}\n",
        "soak",
    )
    .unwrap();
    let (in_pod, on_host) = (sc.processes[0].clone(), sc.processes[1].clone());
    sc.processes = (0..polls * 2)
        .map(|i| {
            let mut p = if i % 10 == 9 {
                on_host.clone()
            } else {
                in_pod.clone()
            };
            p.pid = 100_000 + i as u32;
            p.gpu = (i % 2) as u32;
            p.name = NAMES[(i % 4) as usize].to_string();
            p.start = Duration::from_millis(i * 500);
            p.stop = Some(p.start + Duration::from_secs(5 + (i * 7919) % (MAX_LIFE_S - 4)));
            p.memory = if i % 7 == 3 {
                Trajectory::Linear {
                    from: 1000,
                    per_second: 2000.0,
                    max: Some(40_000),
                }
            } else {
                Trajectory::Constant(500 + (i * 131) % 2500)
            };
            if let Some(pl) = &mut p.pod {
                pl.name = format!("job-{i}");
                pl.priority = Some((i % 3) as i32);
                pl.annotations.insert(
                    "gpu-warden.io/vram-request-mib".into(),
                    (1000 + (i % 5) * 500).to_string(),
                );
            }
            p
        })
        .collect();
    sc
}

/// A pod view that churns like the watch's: each pod appears 1 s before its process starts
/// and goes 3 s after it stops.
struct ChurningPods {
    clock: Arc<ManualClock>,
    pods: Vec<(Duration, Duration, PodInfo)>,
}

impl PodSource for ChurningPods {
    fn pods(&self) -> Arc<PodMap> {
        let now = self.clock.mono();
        // Sorted by appearance and none lives longer than MAX_LIFE_S: look at the last minute only.
        let lo = self
            .pods
            .partition_point(|(from, _, _)| *from + Duration::from_secs(MAX_LIFE_S + 5) < now);
        let hi = self.pods.partition_point(|(from, _, _)| *from <= now);
        Arc::new(
            self.pods[lo..hi]
                .iter()
                .filter(|(_, until, _)| now < *until)
                .map(|(_, _, p)| (p.uid.clone(), p.clone()))
                .collect(),
        )
    }
    fn status(&self) -> PodViewStatus {
        PodViewStatus::fixed()
    }
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn self_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn alive(p: &ProcessSpec, now: Duration) -> bool {
    p.start <= now && p.stop.is_none_or(|s| now < s)
}

/// The value of label `name` in a series line (the first occurrence).
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(",{name}=\"");
    let at = line.find(&key)? + key.len();
    let rest = &line[at..];
    Some(&rest[..rest.find('"')?])
}

/// The soak measures this process (RSS, descriptors, threads), so it runs alone: the test
/// re-runs itself in a child test process, where no other test shares the counters.
#[test]
fn thousands_of_polls_with_heavy_churn_leave_no_stale_series_and_flat_memory() {
    const CHILD: &str = "GPU_WARDEN_SOAK_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return soak();
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "soak::thousands_of_polls_with_heavy_churn_leave_no_stale_series_and_flat_memory",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the soak failed in its own process");
    assert!(
        stdout.contains("1 passed"),
        "the child ran no soak: {stdout}"
    );
}

fn soak() {
    let polls: u64 = std::env::var("SOAK_POLLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let warmup = polls / 5;
    let t_start = Instant::now();
    let sc = scenario(polls);
    let specs = sc.processes.clone();
    // The simulated /proc on tmpfs where there is one, as the real /proc is in memory.
    let dir = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap()),
        false => tempfile::tempdir().unwrap(),
    };
    let clock = Arc::new(ManualClock::new(
        UNIX_EPOCH + Duration::from_secs(1_780_000_000),
    ));
    // The pod view: one template Pod converted once, then cloned per placement with the
    // UID and container ID the simulated /proc carries.
    let template: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(scenario_pods(&sc, "node")[0].clone()).unwrap();
    let template = pod_info(&template).unwrap();
    let mut pods: Vec<(Duration, Duration, PodInfo)> = specs
        .iter()
        .filter_map(|p| {
            let pl = p.pod.as_ref()?;
            let mut info = template.clone();
            info.uid = placement_uid(pl);
            info.name = pl.name.clone();
            info.priority = pl.priority.unwrap_or(0);
            info.annotations = pl.annotations.clone();
            info.containers = vec![ContainerInfo {
                name: pl.container.clone(),
                container_id: Some(placement_container_id(pl)),
                image: None,
                gpu: false,
            }];
            let from = p.start.saturating_sub(Duration::from_secs(1));
            let until = p.stop.unwrap() + Duration::from_secs(3);
            Some((from, until, info))
        })
        .collect();
    pods.sort_by_key(|(from, _, _)| *from);
    let pod_count = pods.len();
    let view: Arc<dyn PodSource> = Arc::new(ChurningPods {
        clock: clock.clone(),
        pods,
    });
    let mut rig = Rig::from_scenario(
        sc,
        RigOptions {
            pods: Some(view),
            policy: Some(Policy::default()),
            per_process: true,
            clock: Some(clock.clone()),
            proc_parent: Some(dir.path().to_path_buf()),
            ..RigOptions::default()
        },
    )
    .unwrap();
    // Microseconds spent in the simulator's poll, in Core::on_full, and in the fast
    // memory reading, summed over the run.
    let mut cost = [0u64; 3];
    let setup = t_start.elapsed();

    let (fds0, threads0) = (self_fds(), status_kib("Threads:"));
    let mut rss_warm = 0;
    let mut rss_max_after_warmup = 0;
    let mut checks = 0;
    let mut max_live = 0;
    let mut last_series = 0;
    let loop_start = Instant::now();
    for poll in 0..polls {
        let now = Duration::from_secs(poll);
        clock.set(now);
        let ta = Instant::now();
        let snap = rig.sample_with(PollRequest {
            process_utilization: poll % 5 == 0,
            slow_counters: poll % 10 == 0,
        });
        let tb = Instant::now();
        let (published, _) = rig.core.on_full(snap, Duration::from_micros(100));
        let tc = Instant::now();
        // A fast memory reading half-way to the next poll, as the guard's watch takes.
        let half = now + Duration::from_millis(500);
        clock.set(half);
        rig.memory();
        let td = Instant::now();
        cost[0] += (tb - ta).as_micros() as u64;
        cost[1] += (tc - tb).as_micros() as u64;
        cost[2] += (td - tc).as_micros() as u64;

        // Specs are in start order and none lives longer than MAX_LIFE_S.
        let lo = specs.partition_point(|p| p.start + Duration::from_secs(MAX_LIFE_S + 5) < now);
        let hi = specs.partition_point(|p| p.start <= now);
        let live: Vec<&ProcessSpec> = specs[lo..hi].iter().filter(|p| alive(p, now)).collect();
        max_live = max_live.max(live.len());
        if poll % 5 == 0 || poll == polls - 1 {
            checks += 1;
            let text = std::str::from_utf8(&published.metrics).unwrap();
            let mut pids = BTreeSet::new();
            let mut pods = BTreeSet::new();
            let mut series = 0;
            for l in text.lines().filter(|l| !l.starts_with('#')) {
                series += 1;
                if l.starts_with("gpu_warden_process_gpu_memory_used_bytes{") {
                    pids.insert(label(l, "pid").unwrap().parse::<u32>().unwrap());
                }
                if l.starts_with("gpu_warden_container_gpu_memory_used_bytes{") {
                    let pod = label(l, "pod").unwrap();
                    if !pod.is_empty() {
                        pods.insert(pod.to_string());
                    }
                }
            }
            last_series = series;
            let want_pids: BTreeSet<u32> = live.iter().map(|p| p.pid).collect();
            let want_pods: BTreeSet<String> = live
                .iter()
                .filter_map(|p| p.pod.as_ref().map(|pl| pl.name.clone()))
                .collect();
            assert_eq!(pids, want_pids, "per-process series at poll {poll}");
            assert_eq!(pods, want_pods, "per-container series at poll {poll}");
            let entries = std::fs::read_dir(rig.proc_root()).unwrap().count();
            assert_eq!(
                entries,
                live.len(),
                "simulated /proc entries at poll {poll}"
            );
        }
        if poll == warmup {
            rss_warm = status_kib("VmRSS:");
        }
        if poll > warmup && poll % 100 == 0 {
            rss_max_after_warmup = rss_max_after_warmup.max(status_kib("VmRSS:"));
        }
    }
    let took = loop_start.elapsed();
    let rss_end = status_kib("VmRSS:");
    rss_max_after_warmup = rss_max_after_warmup.max(rss_end);
    let (fds1, threads1) = (self_fds(), status_kib("Threads:"));
    let guard = rig.core.guard_json().unwrap();
    let recent = guard["recentDecisions"].as_array().unwrap();
    // Decision ids count up from 1: the last one is how many were taken.
    let decisions = recent.last().map_or(0, |d| d["id"].as_u64().unwrap());
    let recent = recent.len();
    println!(
        "soak: {polls} polls ({} processes, {pod_count} pods, up to {max_live} alive at once) in {:.1}s (+{:.1}s setup), {:.2} ms/poll; {checks} stale-series checks passed; last exposition {last_series} series; RSS after warm-up ({warmup} polls) {rss_warm} KiB, end {rss_end} KiB ({:+} KiB), max {rss_max_after_warmup} KiB; fds {fds0}->{fds1}, threads {threads0}->{threads1}; {decisions} guard decisions (dry-run), {recent} kept in /state (bounded at 16); per poll: simulator {} µs, Core::on_full {} µs, fast memory reading {} µs",
        specs.len(),
        took.as_secs_f64(),
        setup.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / polls as f64,
        rss_end as i64 - rss_warm as i64,
        cost[0] / polls,
        cost[1] / polls,
        cost[2] / polls,
    );
    assert!(recent <= 16);
    assert!(
        rss_max_after_warmup < rss_warm + 4 * 1024,
        "RSS grew after warm-up: {rss_warm} KiB → max {rss_max_after_warmup} KiB"
    );
    assert_eq!(fds1, fds0, "descriptors leaked");
    assert_eq!(threads1, threads0, "threads leaked");
}
