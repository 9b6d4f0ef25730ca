//! The per-poll allocation budget of what the agent renders, counted by this test binary's
//! global allocator (`crates/alloc-count`, per thread, so parallel tests do not mix). Once the
//! buffers have grown to the node's size, a poll's exposition is one allocation: the copy the
//! publication hands to readers. `benches/alloc.rs` prints the figures for every stage.

use gpu_warden::model::pressure::Pressure;
use gpu_warden_testkit::rig::{Rig, RigOptions};
use gpu_warden_testkit::scenarios::BenchNode;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_warm_exposition_costs_one_allocation_per_poll() {
    for (gpus, procs) in [(1, 4), (8, 64)] {
        let node = BenchNode::new(gpus, procs)
            .process_name("py\"th\\on")
            .procs_per_pod(2);
        let mut rig = Rig::new(
            &node.yaml(),
            RigOptions {
                per_process: true,
                ..RigOptions::default()
            },
        )
        .unwrap();
        let metrics = rig.metrics.clone();
        let pressure: BTreeMap<u32, Pressure> = (0..gpus).map(|g| (g, Pressure::Soft)).collect();
        let mut counts = Vec::new();
        for poll in 0..6 {
            rig.clock.advance(Duration::from_secs(1));
            let mut snap = rig.sample();
            rig.core
                .prepare(&mut snap, Duration::from_micros(100 + poll));
            metrics
                .decisions
                .with_label_values(&["false", "dry-run", "soft"])
                .inc();
            let snap = Arc::new(snap);
            let pressure = pressure.clone();
            let (stats, published) =
                alloc_count::measure(|| rig.core.publish(snap, pressure, None));
            let text = String::from_utf8(published.metrics.to_vec()).unwrap();
            assert!(text.contains("process_name=\"py\\\"th\\\\on\""), "{text}");
            assert!(text.contains("pod=\"job-0\""), "{text}");
            counts.push(stats.total());
        }
        // The first polls grow the buffers; from then on only the publication's copy.
        assert!(
            counts[2..].iter().all(|&n| n == 1),
            "{gpus} GPUs × {procs} processes: allocations per publish {counts:?}"
        );
    }
}
