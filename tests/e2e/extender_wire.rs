//! Pins the bytes of the extender's `/filter` and `/prioritize` replies on a fixture that
//! reaches every verdict (fits, too little room with and without committed memory, no
//! replica, pressure, stale, missing, malformed, unknown need, two GPUs, a bad declaration;
//! pending and shown reservations; both `unknownNode` rules, pack and spread): a small one
//! written out in full, and a 2,000-node one as a length and hash per reply. The replies were
//! recorded before the per-node work was taken out of the judging (docs/performance.md,
//! "The extender"), so a faster reply that says anything else fails here.
//! Regenerate deliberately with `UPDATE_GOLDEN=1 cargo test --test e2e extender_wire`.

use gpu_warden::extender::config::PolicyFile;
use gpu_warden::extender::ledger::{Ledger, Reservation};
use gpu_warden::extender::metrics::ExtenderMetrics;
use gpu_warden::extender::nodes::{read_node, NodeState};
use gpu_warden::extender::server::{answer, ExtenderState};
use gpu_warden::extender::watch::{LedgerFeed, NodeLookup};
use gpu_warden::model::clock::{Clock, ManualClock};
use gpu_warden::model::pressure::Pressure;
use gpu_warden::publish::annotations::{AnnotationValues, GpuFigures};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, UNIX_EPOCH};

const T0: u64 = 1_780_000_000;

struct Nodes(HashMap<String, Arc<NodeState>>);

impl NodeLookup for Nodes {
    fn state(&self, node: &str) -> Option<Arc<NodeState>> {
        self.0.get(node).cloned()
    }
    fn annotations(&self, _node: &str) -> Option<BTreeMap<String, String>> {
        None
    }
    fn ready(&self) -> bool {
        true
    }
}

fn name(i: usize) -> String {
    format!("node-{i:05}")
}

/// Node `i`'s annotations: a cycle through every shape a verdict can take.
fn annotations(i: usize) -> BTreeMap<String, String> {
    let observed = UNIX_EPOCH + Duration::from_secs(T0);
    match i % 23 {
        // Not an agent's node.
        5 => return BTreeMap::new(),
        11 => return BTreeMap::from([("gpu-warden.io/vram".to_string(), "{not json".to_string())]),
        _ => {}
    }
    let count = [1, 1, 4, 1, 2, 8][i % 6];
    let gpus: Vec<GpuFigures> = (0..count)
        .map(|g| {
            let used = ((i * 7919 + g * 104_729) % 21_000) as u64;
            let with_replicas = i % 7 != 3;
            GpuFigures {
                index: g as u32,
                uuid: format!("GPU-{i:06x}-{g}"),
                total_mib: if i % 9 == 4 { 81_559 } else { 23_028 },
                used_mib: used,
                free_mib: 23_028u64.saturating_sub(used + (i % 3) as u64 * 100),
                pressure: match i % 17 {
                    7 => Pressure::Soft,
                    13 => Pressure::Hard,
                    _ => Pressure::None,
                },
                replicas_allocated: with_replicas.then_some(((i + g) % 5) as u32),
                replicas_allocatable: with_replicas.then_some(4),
                declared_mib: with_replicas.then_some(((i * 31 + g) % 9) as u64 * 1024),
            }
        })
        .collect();
    // One in 19 stale (10 min old).
    let observed_at = if i % 19 == 2 {
        observed - Duration::from_secs(600)
    } else {
        observed
    };
    let v = AnnotationValues {
        observed_at,
        free_mib: gpus.iter().map(|g| g.free_mib).sum(),
        max_free_mib: gpus.iter().map(|g| g.free_mib).max().unwrap_or(0),
        next_gpu: Some(Some(gpus[0].uuid.clone())),
        cuda_driver_version: None,
        gpus,
    };
    v.to_annotations("gpu-warden.io")
}

fn ledger(n: usize, ttl: Duration) -> Ledger {
    let mut l = Ledger::new(ttl);
    for i in (0..n).step_by(13) {
        let uuid = format!("GPU-{i:06x}-0");
        let r = Reservation {
            pod: format!("ci/held-{i}"),
            mib: 2048 + (i as u64 % 5) * 1024,
            gpu: (i % 2 == 0).then_some(uuid),
            at: Duration::ZERO,
            at_wall: UNIX_EPOCH + Duration::from_secs(T0 + 20),
            baseline: Some(0),
            baseline_at: Some(UNIX_EPOCH + Duration::from_secs(T0 + 19)),
            bumped: Vec::new(),
            declared_mib: (i as u64 % 3) * 1024,
            shown: false,
            project: None,
        };
        if i % 3 == 0 {
            l.commit(&name(i), r);
        } else {
            l.reserve(&name(i), r);
        }
    }
    l
}

fn state(n: usize, policy: &str) -> ExtenderState {
    let nodes = (0..n)
        .map(|i| {
            (
                name(i),
                Arc::new(read_node(&annotations(i), "gpu-warden.io")),
            )
        })
        .collect();
    let policy = PolicyFile::parse(policy)
        .expect("policy")
        .policy()
        .expect("policy");
    let clock: Arc<dyn Clock> =
        Arc::new(ManualClock::new(UNIX_EPOCH + Duration::from_secs(T0 + 30)));
    ExtenderState {
        feed: Arc::new(LedgerFeed {
            ledger: Arc::new(Mutex::new(ledger(n, policy.ledger_ttl))),
            policy,
            nodes: Arc::new(Nodes(nodes)),
            learned: RwLock::default(),
            pods_synced: AtomicBool::new(true),
            clock,
            metrics: ExtenderMetrics::new().expect("metrics"),
        }),
        max_body_bytes: 64 << 20,
        serve_verbs: true,
    }
}

fn pods() -> Vec<(&'static str, serde_json::Value)> {
    let pod = |ann: serde_json::Value, gpus: &str| {
        json!({"metadata": {"name": "runner-x", "namespace": "gitlab-runner",
            "labels": {"project.runner.gitlab.com/id": "7"}, "annotations": ann},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})
    };
    vec![
        (
            "declared-6g",
            pod(json!({"gpu-warden.io/vram-request-mib": "6144"}), "1"),
        ),
        ("undeclared", pod(json!({}), "1")),
        (
            "two-gpus-3g",
            pod(json!({"gpu-warden.io/vram-request-mib": "3000"}), "2"),
        ),
        (
            "bad-declaration",
            pod(json!({"gpu-warden.io/vram-request-mib": "8Gi"}), "1"),
        ),
        (
            "no-gpu",
            json!({"metadata": {"name": "cpu"}, "spec": {"containers": [{}]}}),
        ),
    ]
}

// Recorded before `promisedPercent` and `unknownNeed: {rule: wholeGpu}` existed, when all of
// the memory promised on a GPU was counted and a pod nothing is known of needed 22016 MiB:
// pinned so the replies stay the recorded ones (the share and the whole GPU are tested in
// extender::judge, need and core); "shipped" is otherwise the shipped policy.
const POLICIES: [(&str, &str); 3] = [
    (
        "shipped",
        "promisedPercent: 100\nunknownNeed: {rule: reserve, mib: 22016}\n",
    ),
    (
        "fail-pack-no-margin",
        "unknownNode: fail\nscore: pack\nmarginMiB: 0\npromisedPercent: 100\n\
         unknownNeed: {rule: reserve, mib: 22016}\n",
    ),
    (
        "pass-unknown",
        "unknownNeed: {rule: pass}\nmarginMiB: 1024\npromisedPercent: 100\n",
    ),
];

/// Every reply for `n` nodes, `(label, body)`, state rebuilt per policy (the ledger settles).
fn replies(n: usize) -> Vec<(String, Vec<u8>)> {
    let names: Vec<String> = (0..n).map(name).collect();
    let mut out = Vec::new();
    for (p, yaml) in POLICIES {
        let st = state(n, yaml);
        for (label, pod) in pods() {
            let body = serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": names}))
                .expect("body");
            for verb in ["filter", "prioritize"] {
                let r = answer(&st, verb, &body);
                assert_eq!(r.status(), 200, "{p} {label} {verb}");
                let bytes =
                    futures::executor::block_on(http_body_util::BodyExt::collect(r.into_body()))
                        .expect("body")
                        .to_bytes();
                out.push((format!("{p} {label} {verb}"), bytes.to_vec()));
            }
        }
    }
    out
}

#[test]
fn replies_are_byte_identical_to_the_recorded_ones() {
    let mut text = String::new();
    for (label, bytes) in replies(46) {
        text.push_str(&format!("# {label}\n{}\n", String::from_utf8_lossy(&bytes)));
    }
    for (label, bytes) in replies(2_000) {
        text.push_str(&format!(
            "# 2000 nodes, {label}: {} bytes, fnv64 {:016x}\n",
            bytes.len(),
            gpu_warden::model::ids::fnv64(&[&String::from_utf8_lossy(&bytes)])
        ));
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/extender-replies.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    for (i, (e, a)) in expected.lines().zip(text.lines()).enumerate() {
        assert_eq!(a, e, "extender-replies.txt differs at line {}", i + 1);
    }
    assert_eq!(text.lines().count(), expected.lines().count());
}
