//! The simulated workload as Kubernetes and `/proc` see it: the Pod objects its placements
//! describe, each process's cgroup line, and a `/proc` tree that follows the live processes
//! (the API double, the rig and the standalone simulator share them).

use super::scenario::{ProcessSpec, Scenario};
use super::sim::{placement_container_id, placement_uid, uuid_from};
use std::collections::BTreeMap;

/// The Pod objects (as Kubernetes JSON) that the scenario's placements describe, one per
/// distinct namespace/name, on node `node`. The API double serves them in tests and
/// demos, and the simulator's standalone mode uses them as its pod view.
pub fn scenario_pods(scenario: &Scenario, node: &str) -> Vec<serde_json::Value> {
    let mut pods: BTreeMap<(String, String), serde_json::Value> = BTreeMap::new();
    for p in &scenario.processes {
        let Some(pl) = &p.pod else { continue };
        let key = (pl.namespace.clone(), pl.name.clone());
        let pod = pods.entry(key).or_insert_with(|| {
            let mut meta = serde_json::json!({
                "name": pl.name,
                "namespace": pl.namespace,
                "uid": placement_uid(pl),
                "creationTimestamp": pl.created_at.clone().unwrap_or_else(|| "2026-01-01T00:00:00Z".into()),
                "labels": pl.labels,
                "annotations": pl.annotations,
            });
            if let Some(kind) = &pl.owner_kind {
                meta["ownerReferences"] = serde_json::json!([{
                    "apiVersion": if kind == "DaemonSet" || kind == "ReplicaSet" || kind == "StatefulSet" { "apps/v1" } else if kind == "Job" { "batch/v1" } else { "v1" },
                    "kind": kind, "name": format!("{}-owner", pl.name),
                    "uid": uuid_from(&["owner", &pl.namespace, &pl.name]), "controller": true
                }]);
            }
            let mut spec = serde_json::json!({"nodeName": node, "containers": []});
            if let Some(pr) = pl.priority {
                spec["priority"] = pr.into();
            }
            if let Some(pc) = &pl.priority_class {
                spec["priorityClassName"] = pc.clone().into();
            }
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                "status": {"phase": "Running", "containerStatuses": []}
            })
        });
        let has = pod["spec"]["containers"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["name"] == pl.container.as_str()));
        if !has {
            if let Some(cs) = pod["spec"]["containers"].as_array_mut() {
                cs.push(serde_json::json!({"name": pl.container, "image": "registry.example/ci:latest"}));
            }
            if let Some(st) = pod["status"]["containerStatuses"].as_array_mut() {
                st.push(serde_json::json!({
                    "name": pl.container, "containerID": format!("containerd://{}", placement_container_id(pl)),
                    "image": "registry.example/ci:latest", "imageID": "", "ready": true, "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
                }));
            }
        }
    }
    pods.into_values().collect()
}

/// The `/proc/<pid>/cgroup` text a simulated process would have: a kubepods cgroup v2
/// path (systemd driver, containerd) for placed processes, a system service otherwise.
pub fn simulated_cgroup(p: &ProcessSpec) -> String {
    match &p.pod {
        Some(pl) => format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope\n",
            placement_uid(pl).replace('-', "_"),
            placement_container_id(pl)
        ),
        None => format!("0::/system.slice/{}.service\n", sanitize_unit(&p.name)),
    }
}

fn sanitize_unit(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes and removes `<root>/<pid>/{stat,cgroup}` for the simulator's live processes, so
/// attribution reads a proc tree exactly as it would read the host's.
#[derive(Debug)]
pub struct SimProcWriter {
    root: std::path::PathBuf,
    written: std::collections::HashSet<u32>,
}

impl SimProcWriter {
    /// Writes under `root` (created if missing).
    pub fn new(root: impl Into<std::path::PathBuf>) -> std::io::Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(SimProcWriter {
            root,
            written: Default::default(),
        })
    }

    /// Makes the tree match `live` (the processes alive now).
    pub fn sync(&mut self, live: &[&ProcessSpec]) {
        let now: std::collections::HashSet<u32> = live.iter().map(|p| p.pid).collect();
        for pid in self.written.difference(&now) {
            let _ = std::fs::remove_dir_all(self.root.join(pid.to_string()));
        }
        for p in live {
            if self.written.contains(&p.pid) {
                continue;
            }
            let dir = self.root.join(p.pid.to_string());
            let stat = format!(
                "{} ({}) S 1 {} {} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {} 0 0",
                p.pid,
                p.name,
                p.pid,
                p.pid,
                u64::from(p.pid) * 7 + p.start.as_millis() as u64
            );
            let ok = std::fs::create_dir_all(&dir)
                .and_then(|_| std::fs::write(dir.join("stat"), stat))
                .and_then(|_| std::fs::write(dir.join("cgroup"), simulated_cgroup(p)));
            if let Err(e) = ok {
                tracing::warn!(pid = p.pid, error = %e, "cannot write the simulated /proc entry");
            }
        }
        self.written = now;
    }

    /// The root written to.
    pub fn root(&self) -> &std::path::Path {
        &self.root
    }
}
