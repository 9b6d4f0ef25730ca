//! The one generator of benchmark-shaped nodes: `gpus` H100s with every device field set and
//! `procs` CI processes spread over them, each pod in the `ci` namespace. The benches and
//! the allocation budget measure the same node, so their figures compare.

/// A generated node; [`BenchNode::yaml`] writes its scenario.
#[derive(Debug, Clone)]
pub struct BenchNode {
    pub gpus: u32,
    pub procs: u32,
    /// The processes' name (a hostile one checks escaping on the measured path).
    pub process_name: String,
    /// Processes per pod: 1 gives every process its own pod.
    pub procs_per_pod: u32,
}

impl BenchNode {
    /// `gpus` GPUs and `procs` processes named `python`, one pod each.
    pub fn new(gpus: u32, procs: u32) -> Self {
        BenchNode {
            gpus,
            procs,
            process_name: "python".into(),
            procs_per_pod: 1,
        }
    }

    /// Names every process `name`.
    pub fn process_name(mut self, name: &str) -> Self {
        self.process_name = name.into();
        self
    }

    /// Puts `n` processes in each pod.
    pub fn procs_per_pod(mut self, n: u32) -> Self {
        self.procs_per_pod = n.max(1);
        self
    }

    /// The scenario YAML.
    pub fn yaml(&self) -> String {
        let gpus = self.gpus.max(1);
        let mut y = format!(
            "gpus:\n  - {{model: NVIDIA H100 80GB HBM3, count: {gpus}, memory_mib: 81559, reserved_mib: 520, sm_clock_mhz: 1980, mem_clock_mhz: 2619, gpu_temp_c: 41, memory_temp_c: 49, power_w: 412.3, mem_copy_util_pct: 27, enc_util_pct: 0, dec_util_pct: 0, pcie_replays: 0, remapped_rows: {{}}}}\nprocesses:\n"
        );
        // A JSON string is a YAML double-quoted scalar: any name survives.
        let name = serde_json::to_string(&self.process_name).unwrap_or_default();
        for i in 0..self.procs {
            y.push_str(&format!(
                "  - {{pid: {}, gpu: {}, name: {name}, memory: {{constant: {}}}, sm_util: 0.1, pod: {{namespace: ci, name: job-{}, container: build, priority: {}}}}}\n",
                1000 + i,
                i % gpus,
                100 + (i % 7) * 10,
                i / self.procs_per_pod,
                (i / self.procs_per_pod) % 3
            ));
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::scenario::Scenario;

    #[test]
    fn generated_nodes_parse() {
        let sc = Scenario::parse(
            &BenchNode::new(8, 64)
                .process_name("py\"th\\on")
                .procs_per_pod(2)
                .yaml(),
            "t",
        )
        .unwrap();
        assert_eq!(sc.processes.len(), 64);
        assert_eq!(sc.processes[3].name, "py\"th\\on");
    }
}
