//! Each CI job's VRAM peak on the simulated backend, through the real agent core: the
//! attributor, the pod view, the histogram in the exposition and the Event on the pod.

use gpu_warden::agent::core::PEAK_REASON;
use gpu_warden::guard::notes::Regarding;
use gpu_warden::guard::policy::Policy;
use gpu_warden_testkit::rig::{Rig, RigOptions};
use std::time::Duration;

/// A job pod of GitLab project 4711 whose two processes peak together at 9500 MiB (at the
/// 4 s poll: 9000 + 500) and end at 6 s; a pod without a project label whose process ends at 2 s; a host process.
const SCENARIO: &str = r#"
gpus:
  - {model: NVIDIA A10G, memory_mib: 23028}
processes:
  - pid: 300
    gpu: 0
    memory: {linear: {from: 1000, per_second: 2000, max: 9023}}
    stop: 6s
    pod: {namespace: ci, name: job-a, labels: {project.runner.gitlab.com/id: "4711"}, annotations: {gpu-warden.io/vram-request-mib: "8192"}}
  - pid: 301
    gpu: 0
    memory: {constant: 500}
    start: 1s
    stop: 5s
    pod: {namespace: ci, name: job-a, container: helper}
  - pid: 302
    gpu: 0
    memory: {constant: 2048}
    stop: 2s
    pod: {namespace: ml, name: notebook}
  - {pid: 303, gpu: 0, memory: {constant: 300}}
"#;

#[test]
fn a_jobs_peak_reaches_the_histogram_and_an_event_on_its_pod() {
    let mut rig = Rig::new(
        SCENARIO,
        RigOptions {
            policy: Some(Policy::default()),
            job_peaks: true,
            ..RigOptions::default()
        },
    )
    .unwrap();
    let mut notices = Vec::new();
    let mut text = String::new();
    for s in 0..=20u64 {
        rig.set(Duration::from_secs(s));
        let (published, _) = rig.full();
        text = String::from_utf8(published.metrics.to_vec()).unwrap();
        notices.extend(rig.core.take_notices());
        if s < 12 {
            assert!(
                !text.contains("_count{namespace=\"ci\""),
                "job-a recorded at {s} s, before its processes were gone for 10 s"
            );
        }
    }
    let name = "gpu_warden_ci_job_gpu_memory_peak_bytes";
    assert!(
        text.contains(&format!("# TYPE {name} histogram\n")),
        "{text}"
    );
    // 9000 + 500 MiB at the 4 s poll, the last with both processes.
    let peak = 9500u64 << 20;
    assert!(
        text.contains(&format!(
            "{name}_sum{{namespace=\"ci\",project=\"4711\"}} {peak}\n"
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "{name}_bucket{{namespace=\"ci\",project=\"4711\",le=\"8589934592\"}} 0\n"
    )));
    assert!(text.contains(&format!(
        "{name}_bucket{{namespace=\"ci\",project=\"4711\",le=\"12884901888\"}} 1\n"
    )));
    assert!(text.contains(&format!(
        "{name}_count{{namespace=\"ml\",project=\"\"}} 1\n"
    )));
    // Host processes are nobody's job.
    assert_eq!(
        text.matches(&format!("{name}_count{{")).count(),
        2,
        "{text}"
    );

    // Both pods are still in the (fixed) pod view: an Event each, once.
    assert_eq!(notices.len(), 2, "{notices:?}");
    let job = notices
        .iter()
        .find(|n| matches!(&n.regarding, Regarding::Pod { name, .. } if name == "job-a"))
        .expect("an Event on job-a");
    assert_eq!(job.reason, PEAK_REASON);
    assert_eq!(job.type_.as_str(), "Normal");
    assert_eq!(
        job.note,
        "GPU peak 9.3 GiB on GPU 0 (NVIDIA A10G, 22.5 GiB); declared 8 GiB"
    );
}
