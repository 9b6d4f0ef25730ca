//! The per-poll allocation budget of what the agent renders, counted by this test binary's
//! global allocator (`crates/alloc-count`, per thread, so parallel tests do not mix). Once the
//! buffers have grown to the node's size, a poll's exposition is one allocation: the copy the
//! publication hands to readers. `benches/alloc.rs` prints the figures for every stage.

use gpu_warden::agent::Core;
use gpu_warden::attribute::attributor::ProcAttributor;
use gpu_warden::attribute::procfs::ProcFs;
use gpu_warden::model::clock::ManualClock;
use gpu_warden::model::pressure::Pressure;
use gpu_warden::publish::metrics::MetricsConfig;
use gpu_warden::publish::self_metrics::SelfMetrics;
use gpu_warden::testkit::rig::{Rig, RigOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

fn scenario(gpus: u32, procs: u32) -> String {
    let mut y = format!(
        "gpus:\n  - {{model: NVIDIA H100 80GB HBM3, count: {gpus}, memory_mib: 81559, gpu_temp_c: 41, power_w: 412.3, remapped_rows: {{}}}}\nprocesses:\n"
    );
    for i in 0..procs {
        y.push_str(&format!(
            "  - {{pid: {}, gpu: {}, name: \"py\\\"th\\\\on\", memory: {{constant: {}}}, sm_util: 0.1, pod: {{namespace: ci, name: job-{}, container: build}}}}\n",
            1000 + i,
            i % gpus,
            100 + i,
            i / 2
        ));
    }
    y
}

#[test]
fn a_warm_exposition_costs_one_allocation_per_poll() {
    for (gpus, procs) in [(1, 4), (8, 64)] {
        let mut rig = Rig::new(&scenario(gpus, procs), RigOptions::default()).unwrap();
        let clock = Arc::new(ManualClock::new(UNIX_EPOCH));
        let metrics = SelfMetrics::new("alloc").unwrap();
        let mut core = Core::new(
            MetricsConfig {
                hostname: "node".into(),
                per_process: true,
                ..Default::default()
            },
            metrics.clone(),
            clock.clone(),
        )
        .with_attributor(Box::new(ProcAttributor::new(
            ProcFs::new(rig.proc_root()),
            rig.pods.clone(),
            None,
        )));
        let pressure: BTreeMap<u32, Pressure> = (0..gpus).map(|g| (g, Pressure::Soft)).collect();
        let mut counts = Vec::new();
        for poll in 0..6 {
            rig.clock.advance(Duration::from_secs(1));
            let mut snap = rig.sample();
            core.prepare(&mut snap, Duration::from_micros(100 + poll));
            metrics
                .decisions
                .with_label_values(&["dry-run", "soft"])
                .inc();
            let snap = Arc::new(snap);
            let pressure = pressure.clone();
            let (stats, published) =
                alloc_count::measure(|| core.publish(snap, pressure, serde_json::Value::Null));
            let text = String::from_utf8(published.metrics.to_vec()).unwrap();
            assert!(text.contains("process_name=\"py\\\"th\\\\on\""), "{text}");
            assert!(text.contains("pod=\"job-0\""), "{text}");
            counts.push(stats.total());
            clock.advance(Duration::from_secs(1));
        }
        // The first polls grow the buffers; from then on only the publication's copy.
        assert!(
            counts[2..].iter().all(|&n| n == 1),
            "{gpus} GPUs × {procs} processes: allocations per publish {counts:?}"
        );
    }
}
