//! NVML faults survived, with the real binary on the simulated backend
//! over real HTTP: a poll that hangs in a call, a GPU lost mid-run, a call that starts
//! failing; and, on the agent's `Core`, no guard decision on a GPU whose data cannot be
//! trusted.

use crate::support::*;

use gpu_warden::guard::decision::Decision;
use gpu_warden::guard::policy::Policy;
use gpu_warden::guard::ports::{DecisionExecutor, Outcomes};
use gpu_warden::model::pod::PodMap;
use gpu_warden_testkit::rig::{Rig, RigOptions};
use gpu_warden_testkit::wait_for;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Starts the binary on `scenario` (written to a temporary file) with a 200 ms poll.
fn start(scenario: &str) -> (Agent, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.yaml");
    std::fs::write(&path, scenario).unwrap();
    let args = AgentArgs::sim()
        .scenario(&path)
        .kube_off()
        .node("node-r")
        .switch("--per-process-metrics");
    let agent = Agent::start(&args.args());
    (agent, dir)
}

/// An exposition without the `process_*` families (read at scrape time, not per poll).
fn poll_part(body: &str) -> String {
    let families = gpu_warden::publish::process_metrics::FAMILIES;
    body.lines()
        .filter(|l| {
            let name = l
                .trim_start_matches("# HELP ")
                .trim_start_matches("# TYPE ")
                .split([' ', '{'])
                .next()
                .unwrap_or("");
            !families.contains(&name)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of the series `name{labels}` whose labels include every pair of `want`.
fn value(body: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            let (n, labels) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && want
                    .iter()
                    .all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

fn state(port: u16) -> serde_json::Value {
    serde_json::from_str(&get(port, "/state").unwrap().body).unwrap()
}

/// A strict check of the Prometheus text format 0.0.4: every line is a HELP, a TYPE or a
/// sample; names and label names are well formed; label values use only the three escapes;
/// every sample belongs to a family whose TYPE came first; no family is declared twice and
/// no series appears twice. Then `promtool check metrics` when it is installed (exit 3,
/// style findings, is accepted: dcgm-exporter's names are kept on purpose).
fn assert_valid_exposition(body: &str) {
    fn name_ok(s: &str, colon: bool) -> bool {
        let mut cs = s.chars();
        cs.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
            && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
    }
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut series: HashSet<String> = HashSet::new();
    assert!(body.ends_with('\n'), "exposition must end with a newline");
    for (n, line) in body.lines().enumerate() {
        let at = || format!("line {}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            assert!(name_ok(name, true), "{}", at());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or_else(|| panic!("{}", at()));
            assert!(name_ok(name, true), "{}", at());
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty),
                "{}",
                at()
            );
            assert!(
                types.insert(name.to_string(), ty.to_string()).is_none(),
                "family declared twice: {}",
                at()
            );
            continue;
        }
        assert!(!line.starts_with('#') && !line.is_empty(), "{}", at());
        // name{labels} value
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => panic!("{}", at()),
        };
        assert!(name_ok(name, true), "{}", at());
        let mut labels = Vec::new();
        let value = if let Some(mut r) = rest.strip_prefix('{') {
            loop {
                if let Some(after) = r.strip_prefix('}') {
                    r = after;
                    break;
                }
                let eq = r.find('=').unwrap_or_else(|| panic!("{}", at()));
                let lname = &r[..eq];
                assert!(name_ok(lname, false), "label name: {}", at());
                r = r[eq + 1..]
                    .strip_prefix('"')
                    .unwrap_or_else(|| panic!("{}", at()));
                let mut val = String::new();
                let mut chars = r.char_indices();
                let end = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, c @ ('\\' | '"' | 'n'))) => val.push(c),
                            _ => panic!("bad escape: {}", at()),
                        },
                        Some((i, '"')) => break i,
                        Some((_, c)) => val.push(c),
                        None => panic!("unterminated label value: {}", at()),
                    }
                };
                labels.push(format!("{lname}={val}"));
                r = &r[end + 1..];
                r = r.strip_prefix(',').unwrap_or(r);
            }
            r
        } else {
            rest
        };
        let v = value
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("{}", at()));
        let v = v.split(' ').next().unwrap_or("");
        assert!(
            v.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&v),
            "value: {}",
            at()
        );
        let family = types
            .get(name)
            .map(|_| name)
            .or_else(|| {
                ["_bucket", "_sum", "_count"].iter().find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                })
            })
            .unwrap_or_else(|| panic!("sample without a TYPE before it: {}", at()));
        let _ = family;
        labels.sort();
        assert!(
            series.insert(format!("{name}{{{}}}", labels.join(","))),
            "duplicate series: {}",
            at()
        );
    }
    if let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let code = out.status.code();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            code == Some(0) || code == Some(3),
            "promtool could not parse the exposition: {text}"
        );
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                l.starts_with("DCGM_FI_"),
                "promtool finding beyond dcgm-exporter's naming: {l}"
            );
        }
    }
}

const HANG: &str = r#"
gpus:
  - {model: NVIDIA A10G, count: 2, memory_mib: 23028, reserved_mib: 434, power_w: 150, gpu_temp_c: 50}
processes:
  - {pid: 100, gpu: 0, memory: {constant: 4096}, sm_util: 0.3, pod: {namespace: ci, name: job-a}}
  - {pid: 200, gpu: 1, memory: {constant: 2048}, sm_util: 0.2, pod: {namespace: ci, name: job-b}}
faults:
  - {kind: hang, gpu: 1, field: power, at: 2s, for: 3s}
"#;

/// The sampler sticks in an NVML call for 3 s: /healthz turns 503 naming the stuck poll,
/// /metrics keeps serving the last good exposition unchanged, /state serves the last good
/// snapshot marked stale; when the call returns, everything is current again and the
/// 3 s poll shows in the poll-duration histogram.
#[test]
fn a_hung_poll_fails_healthz_and_keeps_serving_the_last_snapshot_marked_stale() {
    let (agent, _dir) = start(HANG);
    let port = agent.port;
    assert_eq!(get(port, "/healthz").unwrap().status, 200);
    assert_eq!(state(port)["stale"], false);

    let reason = wait_for("/healthz to fail", Duration::from_secs(10), || {
        let r = get(port, "/healthz").unwrap();
        (r.status == 503).then_some(r.body)
    });
    assert!(
        reason.contains("stale") && reason.contains("has not finished"),
        "{reason}"
    );
    let s1 = state(port);
    let seq = s1["snapshot"]["seq"].as_u64().unwrap();
    assert!(
        reason.contains(&format!("poll {} has not finished", seq + 1)),
        "the reason names the stuck poll: {reason}"
    );
    assert_eq!(s1["stale"], true, "{s1}");
    assert!(
        s1["staleReason"].as_str().unwrap().contains("stale"),
        "{s1}"
    );
    assert_eq!(s1["snapshot"]["gpus"].as_array().unwrap().len(), 2);
    let m1 = get(port, "/metrics").unwrap();
    assert_eq!(m1.status, 200);
    assert!(
        value(&m1.body, "DCGM_FI_DEV_FB_USED", &[("gpu", "1")]).is_some(),
        "the last good exposition has both GPUs"
    );
    assert_valid_exposition(&m1.body);
    std::thread::sleep(Duration::from_millis(400));
    let m2 = get(port, "/metrics").unwrap();
    assert_eq!(m2.status, 200);
    let still_stuck = get(port, "/healthz").unwrap().status == 503;
    if still_stuck {
        // The agent's own process families are read at each scrape; everything the poll
        // rendered is the same bytes.
        assert_eq!(
            poll_part(&m1.body),
            poll_part(&m2.body),
            "the last good exposition, unchanged"
        );
        assert!(m2
            .body
            .contains("# TYPE process_cpu_seconds_total counter\n"));
        assert_eq!(state(port)["snapshot"]["seq"].as_u64(), Some(seq));
    }
    assert_eq!(get(port, "/readyz").unwrap().status, 200, "still ready");

    wait_for("/healthz to recover", Duration::from_secs(10), || {
        (get(port, "/healthz").unwrap().status == 200).then_some(())
    });
    let s2 = state(port);
    assert_eq!(s2["stale"], false, "{s2}");
    assert!(s2["staleReason"].is_null());
    assert!(s2["snapshot"]["seq"].as_u64().unwrap() > seq);
    let m3 = get(port, "/metrics").unwrap().body;
    let count = value(&m3, "gpu_warden_poll_duration_seconds_count", &[]).unwrap();
    let under = value(
        &m3,
        "gpu_warden_poll_duration_seconds_bucket",
        &[("le", "2.5")],
    )
    .unwrap();
    assert!(
        count - under >= 1.0,
        "the hung poll is recorded above 2.5 s: count {count}, le=2.5 {under}"
    );
    assert_valid_exposition(&m3);
}

const LOST: &str = r#"
gpus:
  - {model: NVIDIA H100 80GB HBM3, count: 3, memory_mib: 81559, reserved_mib: 520, power_w: 400, gpu_temp_c: 41, sm_clock_mhz: 1980}
processes:
  - {pid: 100, gpu: 0, memory: {constant: 4096}, sm_util: 0.3, pod: {namespace: ci, name: job-a}}
  - {pid: 101, gpu: 1, memory: {constant: 8192}, sm_util: 0.5, pod: {namespace: ci, name: job-b}}
  - {pid: 102, gpu: 2, memory: {constant: 2048}, sm_util: 0.1, pod: {namespace: ci, name: job-c}}
  - {pid: 103, gpu: 0, name: "x\"} 1\nfake_metric{a=\"b\\", memory: {constant: 512}, pod: {namespace: "ci\"", name: "job-\u202e\n# TYPE", container: "c\\"}}
faults:
  - {kind: lost, gpu: 1, at: 1s}
  - {kind: error, gpu: 2, field: power, from: 1s}
  - {kind: error, gpu: 0, field: gpu_temp, from: 1s, until: 2s}
"#;

/// GPU 1 falls off the bus at 1 s; GPU 2's power call starts failing for good at 1 s;
/// GPU 0's temperature fails between 1 s and 2 s. The other GPUs and fields keep being
/// reported, the errors are counted per call, the lost GPU is counted, and the exposition
/// stays valid throughout — with a process and a pod on GPU 0 whose names try to inject a
/// series (quote, brace, newline, backslash, right-to-left override).
#[test]
fn a_lost_gpu_and_a_failing_call_mid_run_leave_the_rest_reported() {
    let (agent, _dir) = start(LOST);
    let port = agent.port;
    let before = get(port, "/metrics").unwrap().body;
    assert_valid_exposition(&before);
    for g in ["0", "1", "2"] {
        assert!(
            value(&before, "DCGM_FI_DEV_FB_USED", &[("gpu", g)]).is_some(),
            "{g}"
        );
    }
    let body = wait_for("GPU 1 lost", Duration::from_secs(10), || {
        let b = get(port, "/metrics").unwrap().body;
        (value(&b, "gpu_warden_gpus", &[("state", "lost")]) == Some(1.0)).then_some(b)
    });
    assert_valid_exposition(&body);
    assert_eq!(
        value(&body, "gpu_warden_gpus", &[("state", "ok")]),
        Some(2.0)
    );
    assert_eq!(value(&body, "DCGM_FI_DEV_FB_USED", &[("gpu", "1")]), None);
    assert_eq!(
        value(&body, "DCGM_FI_DEV_POWER_USAGE", &[("gpu", "1")]),
        None
    );
    assert_eq!(
        value(
            &body,
            "gpu_warden_container_gpu_memory_used_bytes",
            &[("pod", "job-b")]
        ),
        None,
        "a lost GPU lists no processes"
    );
    for g in ["0", "2"] {
        assert!(
            value(&body, "DCGM_FI_DEV_FB_USED", &[("gpu", g)]).is_some(),
            "{g}"
        );
        assert!(
            value(&body, "DCGM_FI_DEV_SM_CLOCK", &[("gpu", g)]).is_some(),
            "{g}"
        );
    }
    assert_eq!(
        value(&body, "DCGM_FI_DEV_FB_USED", &[("gpu", "2")]),
        Some(2048.0)
    );
    for pod in ["job-a", "job-c"] {
        assert!(
            value(
                &body,
                "gpu_warden_container_gpu_memory_used_bytes",
                &[("pod", pod)]
            )
            .is_some(),
            "{pod}"
        );
    }
    assert_eq!(
        value(&body, "DCGM_FI_DEV_POWER_USAGE", &[("gpu", "2")]),
        None
    );
    assert!(value(&body, "DCGM_FI_DEV_POWER_USAGE", &[("gpu", "0")]).is_some());
    let power_errors = value(&body, "gpu_warden_nvml_errors_total", &[("call", "power")])
        .expect("failed power calls are counted");
    assert!(value(&body, "gpu_warden_nvml_errors_total", &[("call", "memory")]).unwrap() >= 1.0);
    assert!(!body.contains("\nfake_metric"), "nothing injected");
    assert!(
        body.contains(r#"process_name="x\"} 1\nfake_metric{a=\"b\\""#),
        "the hostile process name, escaped"
    );
    let st = state(port);
    assert_eq!(st["snapshot"]["gpus"][1]["health"]["state"], "lost", "{st}");
    assert_eq!(st["snapshot"]["gpus"][0]["health"]["state"], "ok");

    // The failure keeps counting, once per poll; GPU 0's temperature comes back after 2 s.
    let later = wait_for(
        "temperature back and errors counting",
        Duration::from_secs(10),
        || {
            let b = get(port, "/metrics").unwrap().body;
            let more = value(&b, "gpu_warden_nvml_errors_total", &[("call", "power")])
                .is_some_and(|n| n >= power_errors + 2.0);
            let temp = value(&b, "DCGM_FI_DEV_GPU_TEMP", &[("gpu", "0")]).is_some();
            (more && temp).then_some(b)
        },
    );
    assert_valid_exposition(&later);
    assert!(
        value(
            &later,
            "gpu_warden_nvml_errors_total",
            &[("call", "gpu_temp")]
        )
        .unwrap()
            >= 1.0
    );
    assert_eq!(
        value(&later, "gpu_warden_gpus", &[("state", "lost")]),
        Some(1.0)
    );
    assert_eq!(
        get(port, "/healthz").unwrap().status,
        200,
        "faults are not staleness"
    );
}

/// Collects nothing: the test reads the decisions `Core` hands out.
struct Nobody;

impl DecisionExecutor for Nobody {
    fn execute(
        &self,
        _decision: Decision,
        _pods: Arc<PodMap>,
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + '_>> {
        Box::pin(async { Vec::new() })
    }
}

const PRESSURE: &str = r#"
gpus:
  - {model: X, count: 3, memory_mib: 10000}
processes:
  - {pid: 100, gpu: 0, memory: {constant: 9700}, pod: {namespace: ci, name: job-a}}
  - {pid: 101, gpu: 1, memory: {constant: 9700}, pod: {namespace: ci, name: job-b}}
  - {pid: 102, gpu: 2, memory: {constant: 9700}, pod: {namespace: ci, name: job-c}}
faults:
  - {kind: lost, gpu: 1, at: 0s}
  - {kind: error, gpu: 2, field: memory, from: 0s, until: 5s}
"#;

/// Every GPU is at hard pressure (3 % free). The healthy one is decided on at once; the lost
/// one never; the one whose memory read fails only once the read answers again — and the
/// fast memory watch (whose readings fail for both) never revives them in between.
#[test]
fn the_guard_decides_only_on_gpus_whose_data_is_current() {
    let mut rig = Rig::new(
        PRESSURE,
        RigOptions {
            policy: Some(Policy::default()),
            executor: Some(Arc::new(Nobody)),
            ..RigOptions::default()
        },
    )
    .unwrap();
    let mut decided: Vec<(u32, Duration)> = Vec::new();
    for step in 0..80u64 {
        let now = Duration::from_millis(step * 100);
        rig.set(now);
        if step % 10 == 0 {
            let (published, dispatches) = rig.full();
            decided.extend(dispatches.iter().map(|(d, _)| (d.gpu, now)));
            let guard = published
                .guard
                .as_ref()
                .map(|g| g.to_json())
                .unwrap_or_default();
            let guard = &guard["status"]["gpus"];
            let reason = |i: usize| guard[i]["inactive_reason"].as_str().map(str::to_string);
            if now < Duration::from_secs(5) {
                assert!(
                    reason(2).is_some_and(|r| r.contains("degraded")),
                    "{:?}",
                    guard[2]
                );
            }
            assert!(
                reason(1).is_some_and(|r| r.contains("lost")),
                "{:?}",
                guard[1]
            );
        } else {
            // The fast watch's readings fail for both faulty GPUs (until the memory read
            // of GPU 2 answers again at 5 s): they never revive them in between.
            let (readings, _) = rig.memory();
            assert!(
                readings[1].1.is_err() && (now >= Duration::from_secs(5) || readings[2].1.is_err())
            );
        }
    }
    let gpus: Vec<u32> = decided.iter().map(|(g, _)| *g).collect();
    assert_eq!(gpus, vec![0, 2], "{decided:?}");
    assert_eq!(decided[0].1, Duration::ZERO, "the healthy GPU at once");
    assert_eq!(
        decided[1].1,
        Duration::from_secs(5),
        "the degraded GPU once its memory read answers, on a full poll"
    );
}

/// The threat model's claim (docs/reliability.md): a pod that inflates its own VRAM to get
/// a neighbour evicted makes itself the first victim — going over its declared request puts
/// it ahead of every pod within theirs, whatever the priorities, and among pods over their
/// request of equal priority the largest overrun goes first. A neighbour goes first only when
/// it is over its own request too and has a lower priority (the kubelet's order), or when
/// the attacker's creator declared a request above what it uses.
#[test]
fn a_pod_inflating_its_own_vram_ranks_itself_first() {
    use gpu_warden::guard::rank::rank;
    use gpu_warden::model::pod::{ContainerInfo, PodInfo};
    use gpu_warden::model::snapshot::{Owner, PodRef, ProcessSample, MIB};
    use std::collections::HashMap;

    let pod = |name: &str, priority: i32, request_mib: Option<u64>| PodInfo {
        uid: format!("uid-{name}"),
        namespace: "ci".into(),
        name: name.into(),
        priority,
        priority_class: None,
        owner_kind: Some("Job".into()),
        is_mirror: false,
        labels: Default::default(),
        annotations: request_mib
            .map(|r| {
                [("gpu-warden.io/vram-request-mib".to_string(), r.to_string())]
                    .into_iter()
                    .collect()
            })
            .unwrap_or_default(),
        created_at: None,
        terminating: false,
        phase: None,
        containers: vec![ContainerInfo {
            name: "main".into(),
            container_id: Some(format!("cid-{name}")),
            image: None,
            gpu: false,
        }],
    };
    let process = |pid: u32, name: &str, mib: u64| ProcessSample {
        pid,
        gpu: 0,
        used_bytes: Some(mib * MIB),
        sm_util: None,
        name: "python".into(),
        owner: Owner::Pod(PodRef {
            namespace: "ci".into(),
            pod: name.into(),
            container: "main".into(),
            uid: format!("uid-{name}"),
        }),
    };
    let order = |pods: Vec<PodInfo>, procs: Vec<ProcessSample>| -> Vec<String> {
        let map: HashMap<String, PodInfo> = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        rank(&Policy::default(), 0, &procs, &map, &HashMap::new())
            .candidates
            .into_iter()
            .map(|v| v.name)
            .collect()
    };

    // The attacker (priority 100, above its neighbours) inflates to 20 GiB over a 4 GiB
    // request; the neighbours stay within theirs.
    let first = order(
        vec![
            pod("attacker", 100, Some(4096)),
            pod("neighbour-a", 0, Some(8192)),
            pod("neighbour-b", 0, Some(4096)),
        ],
        vec![
            process(1, "attacker", 20_480),
            process(2, "neighbour-a", 8000),
            process(3, "neighbour-b", 4096),
        ],
    );
    assert_eq!(first[0], "attacker", "{first:?}");

    // Nobody declares a request (all count as over it): same priority, largest use first.
    let first = order(
        vec![
            pod("attacker", 0, None),
            pod("neighbour-a", 0, None),
            pod("neighbour-b", 0, None),
        ],
        vec![
            process(1, "attacker", 20_480),
            process(2, "neighbour-a", 8000),
            process(3, "neighbour-b", 4096),
        ],
    );
    assert_eq!(first, vec!["attacker", "neighbour-a", "neighbour-b"]);

    // Priority comes before the size of the overrun: a neighbour over its own request with a
    // lower priority goes first (the kubelet's order); minimum reclaim then stops as soon
    // as enough is free, and the attacker is next if it keeps growing.
    let first = order(
        vec![
            pod("attacker", 10, Some(4096)),
            pod("neighbour", 0, Some(1000)),
        ],
        vec![
            process(1, "attacker", 20_480),
            process(2, "neighbour", 1100),
        ],
    );
    assert_eq!(first, vec!["neighbour", "attacker"]);

    // The request is whatever the pod's creator declared: a pod declaring more than it uses
    // stays behind every pod over its own request. Who may set the annotation matters
    // (docs/reliability.md, threat model).
    let first = order(
        vec![
            pod("attacker", 0, Some(30_000)),
            pod("neighbour", 0, Some(1000)),
        ],
        vec![
            process(1, "attacker", 20_480),
            process(2, "neighbour", 1100),
        ],
    );
    assert_eq!(first, vec!["neighbour", "attacker"]);
}

/// An agent whose sampler is stuck in NVML for good must still exit on SIGTERM (Kubernetes
/// would SIGKILL it after the grace period, but annotations, logs and the exit status are
/// only clean on a real exit). `main` shuts the runtime down with a timeout for this.
#[test]
fn sigterm_ends_an_agent_stuck_in_nvml() {
    let (agent, _dir) = start(
        "gpus:\n  - {model: X, memory_mib: 1000, power_w: 10}\nfaults:\n  - {kind: hang, gpu: 0, field: power, at: 1s}\n",
    );
    let port = agent.port;
    wait_for("/healthz to fail", Duration::from_secs(10), || {
        (get(port, "/healthz").unwrap().status == 503).then_some(())
    });
    let (status, took, stderr) = agent.terminate();
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert!(status.success(), "{status:?}: {stderr}");
}
