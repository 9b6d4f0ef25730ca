//! Pins the full exposition of the A10G demo scenario at t = 30 s. Any change to a family
//! name, help text, type, label order, unit or value formatting shows up as a diff here.
//! The body is the one `/metrics` serves: the poll's families, then the agent's own process
//! families read at scrape time, whose values (this test process's memory, CPU time, file
//! descriptors) are masked; their names, help and types stay pinned.
//! Regenerate deliberately with `UPDATE_GOLDEN=1 cargo test --test e2e golden_exposition`.

use gpu_warden::attribute::ports::Attributor;
use gpu_warden::model::snapshot::{Owner, PodRef, Snapshot};
use gpu_warden::publish::dcgm_pod_labels::PodLabels;
use gpu_warden::publish::metrics::HostnameLabel;
use gpu_warden::publish::process_metrics::{self, ProcessSource, FAMILIES};
use gpu_warden::publish::process_reader::SelfProcess;
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::sample::scenario::Scenario;
use gpu_warden_testkit::rig::{Rig, RigOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// Attributes the scenario's processes to the pods the scenario places them in, as the
/// real attributor would once it has read /proc and the pod watch.
struct FromScenario(Scenario);

impl Attributor for FromScenario {
    fn attribute(&mut self, snap: &mut Snapshot) {
        for p in &mut snap.processes {
            let spec = self
                .0
                .processes
                .iter()
                .find(|s| s.pid == p.pid && s.gpu == p.gpu);
            p.owner = match spec.and_then(|s| s.pod.as_ref()) {
                Some(pod) => Owner::Pod(PodRef {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: pod.container.clone(),
                    uid: gpu_warden::sample::sim::placement_uid(pod),
                }),
                None => Owner::Host,
            };
        }
    }
}

fn render(scenario_file: &str, at: Duration, per_process: bool) -> String {
    render_with(scenario_file, at, per_process, PodLabels::Off)
}

fn render_with(
    scenario_file: &str,
    at: Duration,
    per_process: bool,
    pod_labels: PodLabels,
) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scenario = Scenario::load(&root.join(scenario_file)).unwrap();
    let mut rig = Rig::from_scenario(
        scenario.clone(),
        RigOptions {
            node: "ip-10-0-12-34.ec2.internal".into(),
            hostname_label: HostnameLabel::Hostname,
            per_process,
            pod_labels,
            metrics: Some(SelfMetrics::new("golden").unwrap()),
            wall_origin: UNIX_EPOCH + Duration::from_secs(1_780_000_000),
            attributor: Some(Box::new(FromScenario(scenario))),
            ..RigOptions::default()
        },
    )
    .unwrap();
    rig.set(at);
    let mut snap = rig.sample();
    rig.core.prepare(&mut snap, Duration::from_micros(850));
    let published = rig.core.publish(Arc::new(snap), Default::default(), None);
    String::from_utf8(published.metrics.to_vec()).unwrap()
}

/// The `/metrics` body for the scenario as the server builds it, with the values of the
/// process families masked.
fn scrape(scenario_file: &str, at: Duration, per_process: bool) -> String {
    let rendered = render(scenario_file, at, per_process);
    with_process_families(rendered)
}

fn with_process_families(rendered: String) -> String {
    let reader = SelfProcess::new().expect("this platform reports the current process");
    let body = process_metrics::metrics_body(
        &bytes::Bytes::from(rendered),
        Some(&reader as &dyn ProcessSource),
    );
    mask_process_values(std::str::from_utf8(&body).unwrap())
}

/// Replaces the value of every process-family sample with `<masked>`.
fn mask_process_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        match line.split_once(' ') {
            Some((name, _)) if FAMILIES.contains(&name) => {
                out.push_str(name);
                out.push_str(" <masked>");
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

fn check(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    if expected != actual {
        for (i, (e, a)) in expected.lines().zip(actual.lines()).enumerate() {
            if e != a {
                panic!(
                    "{name} differs at line {}:\n expected: {e}\n   actual: {a}",
                    i + 1
                );
            }
        }
        panic!(
            "{name} differs in length: expected {} lines, got {}",
            expected.lines().count(),
            actual.lines().count()
        );
    }
}

#[test]
fn a10g_timesliced_at_30s() {
    check(
        "a10g-timesliced-30s.prom",
        &scrape(
            "examples/a10g-timesliced.yaml",
            Duration::from_secs(30),
            true,
        ),
    );
}

#[test]
fn h100x8_at_60s() {
    check(
        "h100x8-60s.prom",
        &scrape("examples/h100x8.yaml", Duration::from_secs(60), false),
    );
}

/// `--dcgm-pod-labels per-pod` on the time-sliced A10G demo: one series per container with a
/// process on a GPU, as dcgm-exporter's `--kubernetes-virtual-gpus` writes them.
#[test]
fn a10g_timesliced_with_pod_labels_per_pod_at_30s() {
    let rendered = render_with(
        "examples/a10g-timesliced.yaml",
        Duration::from_secs(30),
        false,
        PodLabels::PerPod,
    );
    check(
        "a10g-timesliced-30s-pod-labels.prom",
        &with_process_families(rendered),
    );
}

/// What each `--dcgm-pod-labels` mode writes, against dcgm-exporter's Kubernetes mode
/// (internal/pkg/transformation/kubernetes.go): `container`, `namespace`, `pod` after the
/// device labels; `on` keeps one series per GPU (so sums over GPUs stay right), `per-pod`
/// one per container on the GPU; a GPU without a pod keeps its series without them; NVLink
/// only where the GPU has it (the A10G has none).
#[test]
fn dcgm_pod_labels_follow_dcgm_exporter() {
    let at = Duration::from_secs(30);
    let a10g = "examples/a10g-timesliced.yaml";
    let series = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
            .map(str::to_string)
            .collect()
    };
    let off = series(&render_with(a10g, at, false, PodLabels::Off));
    let on = series(&render_with(a10g, at, false, PodLabels::On));
    let per_pod = series(&render_with(a10g, at, false, PodLabels::PerPod));
    assert_eq!(on.len(), off.len(), "on: one series per GPU");
    assert!(
        per_pod.len() > on.len(),
        "the demo shares a GPU: {per_pod:#?}"
    );
    let value = |l: &str| l.rsplit(' ').next().unwrap().to_string();
    // Same values, labels added after DCGM_FI_DRIVER_VERSION in dcgm-exporter's order.
    for (o, l) in off.iter().zip(&on) {
        assert_eq!(value(o), value(l));
        let head = &o[..o.rfind('}').unwrap()];
        assert!(l.starts_with(head), "{l}");
        let rest = &l[head.len()..];
        assert!(
            rest.starts_with(",container=\"")
                && rest.contains("\",namespace=\"")
                && rest.contains("\",pod=\""),
            "{l}"
        );
    }
    let per_gpu = |lines: &[String], gpu: &str| {
        lines
            .iter()
            .filter(|l| l.contains(&format!("{{gpu=\"{gpu}\",")))
            .count()
    };
    assert_eq!(
        per_gpu(&per_pod, "0"),
        4,
        "the demo's GPU 0 runs four CI jobs: {per_pod:#?}"
    );
    let text = render_with(a10g, at, false, PodLabels::PerPod);
    assert!(
        !text.contains("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{"),
        "an A10G has no NVLink"
    );
}

#[test]
fn exposition_has_every_dcgm_family_of_the_contract() {
    let text = render("examples/h100x8.yaml", Duration::from_secs(60), false);
    for family in [
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    ] {
        let series = text
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .count();
        assert_eq!(series, 8, "{family}: expected one series per GPU");
        let counter = text.contains(&format!("# TYPE {family} counter"));
        let expect_counter = matches!(
            family,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
                | "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
                | "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
                | "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
                | "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
        );
        assert_eq!(counter, expect_counter, "{family} type");
    }
    // Label names, in dcgm-exporter's order, on every device series.
    for line in text.lines().filter(|l| l.starts_with("DCGM_FI_")) {
        let labels: Vec<&str> = line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()]
            .split("\",")
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        assert_eq!(
            labels,
            [
                "gpu",
                "UUID",
                "pci_bus_id",
                "device",
                "modelName",
                "Hostname",
                "DCGM_FI_DRIVER_VERSION"
            ],
            "{line}"
        );
    }
    // Integers print as integers.
    assert!(text.contains("DCGM_FI_DEV_FB_USED{gpu=\"0\""));
    assert!(!text
        .lines()
        .any(|l| l.starts_with("DCGM_FI_DEV_FB_USED") && l.ends_with(".0")));
}

#[test]
fn per_container_sum_equals_per_process_sum() {
    let text = render("examples/h100x8.yaml", Duration::from_secs(60), true);
    let sum = |family: &str, gpu: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{family}{{gpu=\"{gpu}\"")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    for gpu in 0..8 {
        let g = gpu.to_string();
        assert_eq!(
            sum("gpu_warden_container_gpu_memory_used_bytes", &g),
            sum("gpu_warden_process_gpu_memory_used_bytes", &g),
            "GPU {gpu}"
        );
    }
    // The host process on GPU 0 appears with empty pod labels.
    assert!(
        text.contains("gpu_warden_container_gpu_memory_used_bytes{gpu=\"0\",UUID=\"")
            && text.contains("namespace=\"\",pod=\"\",container=\"\"} 2097152")
    );
}
