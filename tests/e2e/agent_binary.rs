//! The real binary on the simulated backend, over real HTTP: endpoints, limits, shutdown,
//! and start-up errors.

use crate::support::*;

/// The simulated A10G demo as every test here runs it.
fn sim() -> Agent {
    Agent::start(&AgentArgs::sim().args())
}

#[test]
fn serves_metrics_health_ready_state_and_404() {
    let agent = sim();
    let m = get(agent.port, "/metrics").unwrap();
    assert_eq!(m.status, 200);
    assert_eq!(
        m.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(m.body.contains("DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b\",pci_bus_id=\"00000000:00:1E.0\",device=\"nvidia0\",modelName=\"NVIDIA A10G\",Hostname=\"node-a\",DCGM_FI_DRIVER_VERSION=\"580.95.05\"}"), "{}", m.body);
    assert!(m.body.contains("gpu_warden_build_info{version=\""));
    assert_eq!(get(agent.port, "/healthz").unwrap().status, 200);
    assert_eq!(get(agent.port, "/readyz").unwrap().status, 200);
    let s = get(agent.port, "/state").unwrap();
    assert_eq!(s.status, 200);
    let v: serde_json::Value = serde_json::from_str(&s.body).unwrap();
    assert_eq!(v["snapshot"]["gpus"][0]["id"]["model"], "NVIDIA A10G");
    assert_eq!(
        v["snapshot"]["processes"].as_array().unwrap().len(),
        3,
        "the fourth job starts at 10 s"
    );
    assert_eq!(get(agent.port, "/nope").unwrap().status, 404);
    let post = raw_request(
        agent.port,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(post.status, 405);
    let head = raw_request(
        agent.port,
        b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
}

#[test]
fn scrapes_see_new_polls() {
    let agent = sim();
    let seq = |port| -> u64 {
        let v: serde_json::Value =
            serde_json::from_str(&get(port, "/state").unwrap().body).unwrap();
        v["snapshot"]["seq"].as_u64().unwrap()
    };
    let a = seq(agent.port);
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(seq(agent.port) >= a + 2);
}

#[test]
fn oversized_headers_are_refused_and_the_server_keeps_serving() {
    let agent = sim();
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    // hyper answers 431 or closes; either way no crash and the next scrape works.
    if let Ok(r) = raw_request(agent.port, big.as_bytes()) {
        assert!(r.status == 431 || r.status == 400, "status {}", r.status);
    }
    assert_eq!(get(agent.port, "/metrics").unwrap().status, 200);
}

#[test]
fn sigterm_exits_cleanly_within_five_seconds() {
    let agent = sim();
    let (status, took, stderr) = agent.terminate();
    assert!(status.success(), "exit {status:?}: {stderr}");
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
    assert!(stderr.contains("shutting down"), "{stderr}");
}

#[test]
fn bad_flags_fail_with_the_flag_named() {
    let (code, err) = run_to_exit(&["--backend", "cuda"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--backend") && err.contains("possible values"),
        "{err}"
    );
    let (code, err) = run_to_exit(&["--poll-interval", "soon"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--poll-interval"), "{err}");
    let (code, err) = run_to_exit(&[
        "--backend",
        "sim",
        "--poll-interval",
        "5s",
        "--process-util-interval",
        "1s",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--process-util-interval"), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn bad_scenarios_fail_with_the_field_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("gpus:\n  - model: X\n    memory_mib: 100\n    colour: red\n", "colour"),
        ("gpus:\n  - model: X\n    memory_mib: many\n", "memory_mib"),
        ("gpus:\n  - model: X\n    memory_mib: 100\nprocesses:\n  - {pid: 1, gpu: 2, memory: {constant: 1}}\n", "processes[0].gpu"),
        ("gpus: [\n", "t.yaml"),
    ];
    for (text, needle) in cases {
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, text).unwrap();
        let (code, err) = run_to_exit(&["--backend", "sim", "--scenario", path.to_str().unwrap()]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(needle), "{needle} not in: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{err}"
        );
        assert_eq!(
            err.lines()
                .filter(|l| l.starts_with("gpu-warden: error:"))
                .count(),
            1,
            "{err}"
        );
    }
    let (code, err) = run_to_exit(&["--backend", "sim", "--scenario", "/nonexistent/s.yaml"]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim_end(),
        "gpu-warden: error: cannot read /nonexistent/s.yaml: No such file or directory (os error 2)",
        "one line, each cause once"
    );
}

/// Start-up errors are one line on stderr, with the right cause: a guard policy that is
/// not YAML at all says so (not a type error), and a KUBECONFIG that is set but broken is
/// an error — only no cluster configuration at all runs standalone.
#[test]
fn broken_configuration_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, "mode: [enforce\n").unwrap();
    let (code, err) = run_to_exit(&[
        "--scenario",
        "examples/a10g-timesliced.yaml",
        "--kube",
        "off",
        "--guard-config",
        policy.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("not valid YAML") && err.contains("line 2"),
        "{err}"
    );

    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "garbage\n").unwrap();
    let no_context = dir.path().join("no-context");
    std::fs::write(
        &no_context,
        "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
    )
    .unwrap();
    for (kubeconfig, why) in [
        ("/nonexistent/kubeconfig", "No such file"),
        (garbage.to_str().unwrap(), "expected mapping start"),
        (no_context.to_str().unwrap(), "current context"),
    ] {
        let (code, err) = run_to_exit_with_env(
            &[
                "--scenario",
                "examples/a10g-timesliced.yaml",
                "--listen",
                "127.0.0.1:0",
            ],
            &[("KUBECONFIG", kubeconfig), ("HOME", "/nonexistent")],
        );
        assert_eq!(code, Some(1), "{kubeconfig}: {err}");
        let errors: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("gpu-warden: error:"))
            .collect();
        assert_eq!(errors.len(), 1, "{err}");
        assert!(
            errors[0].contains(&format!("KUBECONFIG {kubeconfig} is unusable"))
                && errors[0].contains(why),
            "{err}"
        );
        assert!(
            !err.contains(" ERROR "),
            "printed once, not also as a log line: {err}"
        );
    }
}

/// The node's keys and the pods' share one prefix: a guard policy naming another is refused
/// at start, in one line naming the key and the flag; one naming the same is accepted.
#[test]
fn a_policy_prefix_other_than_the_flag_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, "annotationPrefix: example.com\n").unwrap();
    let (code, err) = run_to_exit(&AgentArgs::sim().kube_off().guard_config(&policy).args());
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("annotationPrefix \"example.com\"")
            && err.contains("--annotation-prefix \"gpu-warden.io\""),
        "{err}"
    );
    let agreeing = AgentArgs::sim()
        .kube_off()
        .guard_config(&policy)
        .set("--annotation-prefix", "example.com");
    let agent = Agent::start(&agreeing.args());
    assert_eq!(get(agent.port, "/readyz").unwrap().status, 200);
}

#[test]
fn nvml_backend_without_a_driver_says_what_is_missing() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return;
    }
    let (code, err) = run_to_exit(&["--backend", "nvml"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("libnvidia-ml.so.1") && err.contains("--backend sim"),
        "{err}"
    );
}

#[test]
fn listen_conflict_is_a_clear_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (code, err) = run_to_exit(&["--backend", "sim", "--listen", &addr]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("cannot listen on") && err.contains("--listen"),
        "{err}"
    );
}

/// `--help` prints on stdout; this runs the binary and returns (exit code, stdout).
fn help_of(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-warden"))
        .args(args)
        .output()
        .expect("run gpu-warden");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn help_lists_the_subcommands_with_their_own_usage_lines() {
    let (code, top) = help_of(&["--help"]);
    assert_eq!(code, Some(0));
    assert!(
        top.contains("Usage: gpu-warden [OPTIONS]\n       gpu-warden <COMMAND>"),
        "{top}"
    );
    for sub in ["extender", "check-config"] {
        assert!(
            top.lines()
                .any(|l| l.trim_start().starts_with(&format!("{sub} "))),
            "{sub} is not listed under Commands: {top}"
        );
        let (code, own) = help_of(&[sub, "--help"]);
        assert_eq!(code, Some(0));
        assert!(
            own.contains(&format!("Usage: gpu-warden {sub} [OPTIONS]")),
            "{sub} --help: {own}"
        );
        assert!(
            !own.contains("--backend"),
            "{sub} --help shows the agent's flags: {own}"
        );
    }
    // An agent flag before a subcommand is refused, not half applied.
    let (code, err) = run_to_exit(&["--backend", "sim", "extender"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("cannot be used with"), "{err}");
}
