//! What CI jobs did with their GPU, on the simulated backend through the real agent core
//! (attributor, pod view, the kubelet's replica view): three jobs hold a replica of one A10G
//! for 13 minutes and run a process from 1 min to 11 min — one never computes, one computes
//! at 90 % for one minute (idle, compute, idle), one computes at 95 % throughout. The
//! families pin the record; the `GPUUnderused` Events go through the agent's Event sender to
//! the API server double.

use apiserver_double::{ApiServer, EventApi};
use gpu_warden::act::event_sender::EventSender;
use gpu_warden::guard::policy::Policy;
use gpu_warden::model::replicas::ReplicaView;
use gpu_warden::model::snapshot::Snapshot;
use gpu_warden::publish::job_usage::UNDERUSED_REASON;
use gpu_warden_testkit::rig::{Rig, RigOptions};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

const SCENARIO: &str = r#"
gpus:
  - {model: NVIDIA A10G, memory_mib: 23028}
processes:
  - pid: 400
    gpu: 0
    memory: {constant: 2048}
    sm_util: 0
    start: 60s
    stop: 660s
    pod: {namespace: ci, name: job-idle, labels: {project.runner.gitlab.com/id: "1"}}
  - pid: 401
    gpu: 0
    memory: {constant: 4096}
    sm_util_steps: [{at: 240s, util: 0.9}, {at: 300s, util: 0}]
    start: 60s
    stop: 660s
    pod: {namespace: ci, name: job-shape, labels: {project.runner.gitlab.com/id: "2"}}
  - pid: 402
    gpu: 0
    memory: {constant: 8192}
    sm_util: 0.95
    start: 60s
    stop: 660s
    pod: {namespace: ci, name: job-busy, labels: {project.runner.gitlab.com/id: "2"}}
"#;

/// The kubelet hands each job a replica of GPU 0 until 780 s, then the jobs are done.
fn kubelet(snap: &Snapshot) -> Option<Arc<ReplicaView>> {
    let mut v = ReplicaView::default();
    if snap.at < Duration::from_secs(780) {
        let uuid = snap.gpus.first()?.id.uuid.clone();
        for pod in ["job-idle", "job-shape", "job-busy"] {
            v.allocations
                .pod_gpus
                .entry(("ci".to_string(), pod.to_string()))
                .or_default()
                .insert(uuid.clone());
        }
    }
    Some(Arc::new(v))
}

/// The value of the sample `series` (name and labels as written) in `text`.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[test]
fn held_and_used_time_reach_the_families_and_underused_jobs_get_an_event() {
    let mut rig = Rig::new(
        SCENARIO,
        RigOptions {
            // The guard's pod view is the one the job records read (dry-run: it acts on nothing).
            policy: Some(Policy::default()),
            job_peaks: true,
            replicas: Some(Box::new(kubelet)),
            ..RigOptions::default()
        },
    )
    .unwrap();
    let mut notices = Vec::new();
    let mut text = String::new();
    // A full poll every 2 s; the records close 10 s after the kubelet lets go (the pods
    // still run).
    for s in (0..=800u64).step_by(2) {
        rig.set(Duration::from_secs(s));
        let (published, _) = rig.full();
        text = String::from_utf8(published.metrics.to_vec()).unwrap();
        notices.extend(rig.core.take_notices());
        if s < 780 {
            assert!(
                !text.contains("gpu_warden_ci_job_gpu_replica_seconds_total{"),
                "a record closed at {s} s while its pod held a replica"
            );
        }
    }
    // Held: polls 2..=778 s, 778 s per job.
    let held = |p: &str| {
        value(
            &text,
            &format!(
                "gpu_warden_ci_job_gpu_replica_seconds_total{{namespace=\"ci\",project=\"{p}\"}}"
            ),
        )
    };
    assert_eq!(held("1"), 778.0);
    assert_eq!(held("2"), 2.0 * 778.0);
    // Busy: job-idle none; job-shape 90 % over 60 s (54 s); job-busy 95 % over 600 s.
    let busy = |p: &str| {
        value(
            &text,
            &format!(
                "gpu_warden_ci_job_gpu_busy_seconds_total{{namespace=\"ci\",project=\"{p}\"}}"
            ),
        )
    };
    assert_eq!(busy("1"), 0.0);
    assert!((busy("2") - (54.0 + 570.0)).abs() < 1e-6, "{text}");
    let share = |p: &str, le: &str| {
        value(
            &text,
            &format!(
                "gpu_warden_ci_job_gpu_busy_share_bucket{{namespace=\"ci\",project=\"{p}\",le=\"{le}\"}}"
            ),
        )
    };
    assert_eq!(share("1", "0.01"), 1.0);
    assert_eq!((share("2", "0.05"), share("2", "0.1")), (0.0, 1.0));
    assert_eq!((share("2", "0.5"), share("2", "0.75")), (1.0, 2.0));
    // Held with no process: 178 s per job (778 s held, 600 s with its process).
    assert_eq!(
        value(&text, "gpu_warden_gpu_replica_idle_seconds_total"),
        3.0 * 178.0
    );
    // The peaks close with the record.
    assert_eq!(
        value(
            &text,
            "gpu_warden_ci_job_gpu_memory_peak_bytes_count{namespace=\"ci\",project=\"2\"}"
        ),
        2.0
    );

    let underused: Vec<_> = notices
        .iter()
        .filter(|n| n.reason == UNDERUSED_REASON)
        .collect();
    assert_eq!(underused.len(), 2, "{notices:?}");

    // Through the agent's Event sender to the API server double.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(ApiServer::start()).unwrap();
    let _in_runtime = rt.enter();
    let client = gpu_warden::act::client::from_config(
        kube::Config::new(server.url().parse().unwrap()),
        "test",
    )
    .unwrap()
    .direct;
    let sender = EventSender::new(client, "node");
    let at = UNIX_EPOCH + Duration::from_secs(1_790_000_800);
    for n in &underused {
        rt.block_on(sender.send(n, at)).unwrap();
    }
    let events = server.events();
    let stored: Vec<(String, String, String, String)> = events
        .iter()
        .map(|e| {
            let (about, note) = match e.api {
                EventApi::EventsV1 => (&e.object["regarding"], &e.object["note"]),
                EventApi::CoreV1 => (&e.object["involvedObject"], &e.object["message"]),
            };
            (
                e.object["reason"].as_str().unwrap_or("").to_string(),
                e.object["type"].as_str().unwrap_or("").to_string(),
                about["name"].as_str().unwrap_or("").to_string(),
                note.as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        stored,
        [
            (
                "GPUUnderused".to_string(),
                "Normal".to_string(),
                "job-idle".to_string(),
                "Held GPU 0 (NVIDIA A10G) 12m 58s, used 0s (0.0 %), processes on it 10m 0s, VRAM peak 2 GiB: move the steps that need no GPU (setup, lint, uploads) into a CPU job".to_string()
            ),
            (
                "GPUUnderused".to_string(),
                "Normal".to_string(),
                "job-shape".to_string(),
                "Held GPU 0 (NVIDIA A10G) 12m 58s, used 54s (6.9 %), processes on it 10m 0s, VRAM peak 4 GiB: move the steps that need no GPU (setup, lint, uploads) into a CPU job".to_string()
            ),
        ]
    );
    for e in &events {
        let about = match e.api {
            EventApi::EventsV1 => &e.object["regarding"],
            EventApi::CoreV1 => &e.object["involvedObject"],
        };
        assert!(
            !about["uid"].as_str().unwrap_or("").is_empty(),
            "kubectl describe pod selects Events by uid: {e:?}"
        );
    }
}
