//! What the extender learns when `learned.prometheusUrl` is set: each pod's peak is recorded
//! when it leaves (finished, killed, or evicted — as the agents' histogram
//! `gpu_warden_ci_job_gpu_memory_peak_bytes` records it, in the agents' buckets), and every
//! `learned.refresh` the extender's own reader (`extender::learned::learn`) is handed the
//! answer Prometheus would give to its query: the cumulative bucket counts per project.

use crate::engine::Engine;
use crate::scenario::NAMESPACE;
use gpu_warden_extender::learned::learn;
use gpu_warden_publish::job_peaks::BUCKETS_MIB;

impl Engine<'_> {
    /// Records one pod's peak for its project.
    pub(crate) fn record_peak(&mut self, project: u32, peak_mib: u64) {
        if peak_mib == 0 {
            return;
        }
        let counts = self
            .peaks
            .entry(project)
            .or_insert_with(|| vec![0; BUCKETS_MIB.len() + 1]);
        let i = BUCKETS_MIB
            .iter()
            .position(|b| peak_mib <= *b)
            .unwrap_or(BUCKETS_MIB.len());
        counts[i] += 1;
    }

    /// Re-learns the needs from the peaks so far, when it is time.
    pub(crate) fn learn(&mut self, t: u64) {
        let Some(src) = self.extender.learned.as_ref() else {
            return;
        };
        if t < self.next_learn_s {
            return;
        }
        self.next_learn_s = t + src.refresh.as_secs().max(1);
        let mut result = Vec::new();
        for (project, counts) in &self.peaks {
            let mut cumulative = 0u64;
            for (i, c) in counts.iter().enumerate() {
                cumulative += c;
                let le = match BUCKETS_MIB.get(i) {
                    Some(b) => (b * 1024 * 1024).to_string(),
                    None => "+Inf".to_string(),
                };
                result.push(serde_json::json!({
                    "metric": {"namespace": NAMESPACE, "project": project.to_string(), "le": le},
                    "value": [t as f64, cumulative.to_string()],
                }));
            }
        }
        let body = serde_json::json!({"status": "success",
            "data": {"resultType": "vector", "result": result}});
        if let Ok(table) = learn(body.to_string().as_bytes(), src.min_jobs) {
            self.learned = table;
            // As the extender's learning shell does (`LedgerFeed::set_learned`).
            self.ledger.relearn(&self.learned);
        }
    }
}
