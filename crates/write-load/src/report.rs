//! How the write-load table counts and prints: rates over 1-minute windows, how long a
//! Node's figures over-state what is free, and the Markdown of docs/annotations.md.

use crate::Row;

/// Mean and p99 per second, over 1-minute windows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Writes per second over the whole window.
    pub mean: f64,
    /// The 99th percentile of the 1-minute windows' writes per second.
    pub p99: f64,
}

/// Counts `times` (seconds in `[0, span)`) per minute; the rate's mean and p99.
pub fn rate(counts: &[u64], span: u64) -> Rate {
    let total: u64 = counts.iter().sum();
    let mut per_s: Vec<f64> = counts.iter().map(|c| *c as f64 / 60.0).collect();
    per_s.sort_by(|a, b| a.total_cmp(b));
    let p99 = if per_s.is_empty() {
        0.0
    } else {
        let rank = ((0.99 * per_s.len() as f64).ceil() as usize).clamp(1, per_s.len());
        per_s[rank - 1]
    };
    Rate {
        mean: total as f64 / span.max(1) as f64,
        p99,
    }
}

/// How long a node's Node figures over-stated what was free (the planner's over-promise
/// rule: a GPU's free memory two quanta below its figure, or its pressure above it),
/// counted in simulation steps after the warm-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exposure {
    /// Seconds measured.
    pub measured_s: u64,
    /// Seconds the Node over-promised.
    pub over_s: u64,
    /// The longest over-promise, seconds.
    pub longest_s: u64,
    run_s: u64,
}

impl Exposure {
    /// One step of `step_s` seconds that did (or did not) over-promise.
    pub fn observe(&mut self, over: bool, step_s: u64) {
        self.measured_s += step_s;
        if over {
            self.over_s += step_s;
            self.run_s += step_s;
            self.longest_s = self.longest_s.max(self.run_s);
        } else {
            self.run_s = 0;
        }
    }

    /// Adds another node's.
    pub fn add(&mut self, other: &Exposure) {
        self.measured_s += other.measured_s;
        self.over_s += other.over_s;
        self.longest_s = self.longest_s.max(other.longest_s);
    }

    /// The over-promising share of node-time, 0..1.
    pub fn share(&self) -> f64 {
        self.over_s as f64 / self.measured_s.max(1) as f64
    }
}

/// The table as Markdown.
pub fn markdown(rows: &[Row], watchers_beyond_nodes: u64) -> String {
    let mut s = format!(
        "| nodes | writer | Node writes/s mean | Node writes/s p99 (1-min) | Lease writes/s mean | Lease writes/s p99 | into etcd | Node watch events/s (nodes + {watchers_beyond_nodes} watchers) | Lease watch events/s | Node over-promise ≥ 2 quanta (share of node-time / longest) | Node over-promise ≥ 10 % of a GPU |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} MB/s | {:.0} | {:.0} | {} |\n",
            r.nodes,
            r.what,
            r.node.mean,
            r.node.p99,
            r.lease.mean,
            r.lease.p99,
            r.etcd_bytes_per_s / 1e6,
            r.node_watch_events_per_s,
            r.lease_watch_events_per_s,
            r.exposure.map_or("— | —".to_string(), |(e, l)| format!(
                "{:.2} % / {} s | {:.2} % / {} s",
                100.0 * e.share(),
                e.longest_s,
                100.0 * l.share(),
                l.longest_s
            ))
        ));
    }
    s
}
