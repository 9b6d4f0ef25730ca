//! The attribution shell: reads `/proc/<pid>` for each GPU process, parses its cgroup once
//! per process lifetime (cached by pid and start time, so a reused pid is read afresh),
//! and resolves the owner against the current pod view. A known process costs one `stat`
//! of its `/proc/<pid>` directory per poll ([`EntryId`]); the start time is read only when
//! that entry changes.

use super::cgroup::{parse_proc_cgroup, CgroupIdentity};
use super::ports::{Attributor, PodSource};
use super::procfs::{EntryId, ProcFs};
use super::resolve::owner_of;
use crate::model::proc_stat::ProcError;
use crate::model::snapshot::{Owner, Snapshot};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

struct Cached {
    entry: EntryId,
    start_time: u64,
    identity: Option<CgroupIdentity>,
}

/// Attributes processes through `/proc` and a [`PodSource`].
pub struct ProcAttributor {
    proc: ProcFs,
    pods: Arc<dyn PodSource>,
    cache: HashMap<u32, Cached>,
    invisible_gauge: Option<prometheus::IntGauge>,
    warned_invisible: bool,
}

impl ProcAttributor {
    /// Reads `/proc` through `proc` and pods from `pods`; `invisible_gauge` receives the
    /// count of processes whose `/proc` entry is missing.
    pub fn new(
        proc: ProcFs,
        pods: Arc<dyn PodSource>,
        invisible_gauge: Option<prometheus::IntGauge>,
    ) -> Self {
        ProcAttributor {
            proc,
            pods,
            cache: HashMap::new(),
            invisible_gauge,
            warned_invisible: false,
        }
    }

    fn identity(&mut self, pid: u32) -> Result<Option<CgroupIdentity>, ProcError> {
        let entry = self.proc.entry(pid)?;
        if let Some(c) = self.cache.get(&pid) {
            if c.entry == entry {
                return Ok(c.identity.clone());
            }
        }
        let start = self.proc.start_time(pid)?;
        if let Some(c) = self.cache.get_mut(&pid) {
            if c.start_time == start {
                // The kernel remade the inode of the same process.
                c.entry = entry;
                return Ok(c.identity.clone());
            }
        }
        let text = self.proc.cgroup(pid)?;
        let identity = parse_proc_cgroup(&text);
        self.cache.insert(
            pid,
            Cached {
                entry,
                start_time: start,
                identity: identity.clone(),
            },
        );
        Ok(identity)
    }
}

impl Attributor for ProcAttributor {
    fn attribute(&mut self, snap: &mut Snapshot) {
        let pods = self.pods.pods();
        let mut invisible: HashSet<u32> = HashSet::new();
        let mut seen: HashSet<u32> = HashSet::new();
        for i in 0..snap.processes.len() {
            let pid = snap.processes[i].pid;
            seen.insert(pid);
            let owner = match self.identity(pid) {
                Ok(id) => owner_of(id.as_ref(), &pods),
                Err(ProcError::Missing(_)) => {
                    invisible.insert(pid);
                    Owner::Invisible
                }
                Err(e) => {
                    tracing::debug!(pid, error = %e, "cannot attribute a GPU process");
                    Owner::Unknown
                }
            };
            snap.processes[i].owner = owner;
        }
        self.cache.retain(|pid, _| seen.contains(pid));
        if let Some(g) = &self.invisible_gauge {
            g.set(invisible.len() as i64);
        }
        if !invisible.is_empty() && !self.warned_invisible {
            self.warned_invisible = true;
            let mut pids: Vec<u32> = invisible.into_iter().collect();
            pids.sort_unstable();
            tracing::warn!(
                count = pids.len(),
                pids = ?pids,
                proc_root = %self.proc.root().display(),
                "NVML reports GPU processes that {} cannot see: the agent needs the host's PID namespace (hostPID: true in the DaemonSet) or --proc-root pointing at the host's /proc; these processes are reported without pod labels",
                self.proc.root().display()
            );
        } else if invisible.is_empty() && self.warned_invisible {
            self.warned_invisible = false;
            tracing::info!("every GPU process is visible in /proc again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::pods::StaticPods;
    use crate::model::pod::{ContainerInfo, PodInfo};
    use crate::model::snapshot::ProcessSample;
    use std::path::Path;
    use std::time::{Duration, SystemTime};

    const UID: &str = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d";
    const CID: &str = "5f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    /// Writes `/proc/<pid>` for a new process: as procfs does, a new directory (made beside
    /// any old one, then moved into its place, so it cannot reuse the old inode).
    fn write_proc(root: &Path, pid: u32, start: u64, cgroup: &str) {
        let d = root.join(format!("{pid}.new"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("stat"),
            format!("{pid} (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0"),
        )
        .unwrap();
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
        let _ = std::fs::remove_dir_all(root.join(pid.to_string()));
        std::fs::rename(&d, root.join(pid.to_string())).unwrap();
    }

    fn pod_cgroup(uid: &str, cid: &str) -> String {
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope\n",
            uid.replace('-', "_")
        )
    }

    fn pods() -> Arc<dyn PodSource> {
        let p = PodInfo {
            uid: UID.into(),
            namespace: "ci".into(),
            name: "job-1".into(),
            priority: 0,
            priority_class: None,
            owner_kind: None,
            is_mirror: false,
            labels: Default::default(),
            annotations: Default::default(),
            created_at: None,
            terminating: false,
            phase: None,
            containers: vec![ContainerInfo {
                name: "build".into(),
                container_id: Some(CID.into()),
                image: None,
                gpu: false,
            }],
        };
        Arc::new(StaticPods(Arc::new(
            [(UID.to_string(), p)].into_iter().collect(),
        )))
    }

    fn snap(pids: &[u32]) -> Snapshot {
        Snapshot {
            seq: 1,
            at: Duration::ZERO,
            wall: SystemTime::UNIX_EPOCH,
            driver_version: String::new(),
            cuda_driver_version: None,
            gpus: vec![],
            processes: pids
                .iter()
                .map(|&pid| ProcessSample {
                    pid,
                    gpu: 0,
                    used_bytes: Some(1),
                    sm_util: None,
                    name: "p".into(),
                    owner: Owner::Unknown,
                })
                .collect(),
            util_fresh: true,
            errors: vec![],
        }
    }

    #[test]
    fn pod_host_and_invisible_processes() {
        let dir = tempfile::tempdir().unwrap();
        write_proc(dir.path(), 10, 100, &pod_cgroup(UID, CID));
        write_proc(
            dir.path(),
            11,
            100,
            "0::/system.slice/nv-hostengine.service\n",
        );
        let gauge = prometheus::IntGauge::new("g", "g").unwrap();
        let mut a = ProcAttributor::new(ProcFs::new(dir.path()), pods(), Some(gauge.clone()));
        let mut s = snap(&[10, 11, 12]);
        a.attribute(&mut s);
        match &s.processes[0].owner {
            Owner::Pod(r) => assert_eq!((r.pod.as_str(), r.container.as_str()), ("job-1", "build")),
            o => panic!("{o:?}"),
        }
        assert_eq!(s.processes[1].owner, Owner::Host);
        assert_eq!(s.processes[2].owner, Owner::Invisible);
        assert_eq!(gauge.get(), 1);
    }

    #[test]
    fn pid_reuse_is_detected_by_start_time() {
        let dir = tempfile::tempdir().unwrap();
        write_proc(dir.path(), 10, 100, &pod_cgroup(UID, CID));
        let mut a = ProcAttributor::new(ProcFs::new(dir.path()), pods(), None);
        let mut s = snap(&[10]);
        a.attribute(&mut s);
        assert!(matches!(s.processes[0].owner, Owner::Pod(_)));
        // Same pid, new process (new start time) outside any pod.
        write_proc(
            dir.path(),
            10,
            200,
            "0::/user.slice/user-1000.slice/session-1.scope\n",
        );
        let mut s = snap(&[10]);
        a.attribute(&mut s);
        assert_eq!(s.processes[0].owner, Owner::Host);
    }

    #[test]
    fn a_remade_entry_of_the_same_process_is_not_a_new_process() {
        let dir = tempfile::tempdir().unwrap();
        write_proc(dir.path(), 10, 100, &pod_cgroup(UID, CID));
        let mut a = ProcAttributor::new(ProcFs::new(dir.path()), pods(), None);
        a.attribute(&mut snap(&[10]));
        // Same start time, new inode, and a cgroup file that would no longer parse: the
        // start time vouches for the process, so the cgroup is not read again.
        write_proc(dir.path(), 10, 100, "garbage");
        let mut s = snap(&[10]);
        a.attribute(&mut s);
        assert!(matches!(s.processes[0].owner, Owner::Pod(_)));
    }

    #[test]
    fn a_known_process_costs_no_stat_file_read() {
        let dir = tempfile::tempdir().unwrap();
        write_proc(dir.path(), 10, 100, &pod_cgroup(UID, CID));
        let mut a = ProcAttributor::new(ProcFs::new(dir.path()), pods(), None);
        a.attribute(&mut snap(&[10]));
        // A stat file that no longer parses is not read while the entry is the same.
        std::fs::write(dir.path().join("10/stat"), "garbage").unwrap();
        let mut s = snap(&[10]);
        a.attribute(&mut s);
        assert!(matches!(s.processes[0].owner, Owner::Pod(_)));
    }

    #[test]
    fn cgroup_is_read_once_per_process_lifetime() {
        let dir = tempfile::tempdir().unwrap();
        write_proc(dir.path(), 10, 100, &pod_cgroup(UID, CID));
        let mut a = ProcAttributor::new(ProcFs::new(dir.path()), pods(), None);
        a.attribute(&mut snap(&[10]));
        // Garbage in the cgroup file is not re-read while the start time is unchanged.
        std::fs::write(dir.path().join("10/cgroup"), "garbage").unwrap();
        let mut s = snap(&[10]);
        a.attribute(&mut s);
        assert!(matches!(s.processes[0].owner, Owner::Pod(_)));
    }

    /// Issue 16 through the whole shell: a real `/proc` tree (the colon form, a static pod's
    /// hash-named slice, a pod-level helper cgroup) against pods converted from API objects by
    /// the same code the watch uses.
    #[test]
    fn colon_form_static_pod_and_pod_level_processes() {
        use crate::attribute::pods::index_json;
        const HASH: &str = "8daa50c3a64c9ff60bb9eab7b44b56fd";
        const STATIC_CID: &str = "2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5";
        let pods = index_json(&[
            serde_json::json!({
                "metadata": {"name": "job-1", "namespace": "ci", "uid": UID},
                "spec": {"containers": [{"name": "build"}]},
                "status": {"containerStatuses": [{"name": "build", "containerID": format!("containerd://{CID}"),
                    "image": "i", "imageID": "", "ready": true, "restartCount": 0}]}
            }),
            // The mirror pod of a static pod: its own UID, the hash in two annotations.
            serde_json::json!({
                "metadata": {"name": "infer-gpu-node-1", "namespace": "kube-system",
                    "uid": "6b1c2d3e-0000-4000-8000-00000000beef",
                    "annotations": {"kubernetes.io/config.hash": HASH, "kubernetes.io/config.mirror": HASH,
                        "kubernetes.io/config.source": "file"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": "n", "controller": true}]},
                "spec": {"containers": [{"name": "server"}]},
                "status": {"containerStatuses": [{"name": "server", "containerID": format!("containerd://{STATIC_CID}"),
                    "image": "i", "imageID": "", "ready": true, "restartCount": 0}]}
            }),
        ]);
        let source: Arc<dyn PodSource> = Arc::new(StaticPods(Arc::new(pods)));
        let dir = tempfile::tempdir().unwrap();
        let uid_ = UID.replace('-', "_");
        write_proc(
            dir.path(),
            20,
            100,
            &format!(
                "11:memory:/system.slice/containerd.service/kubepods-burstable-pod{uid_}.slice:cri-containerd:{CID}\n\
                 8:cpuset:/kubepods-burstable-pod{uid_}.slice:cri-containerd:{CID}\n"
            ),
        );
        write_proc(
            dir.path(),
            21,
            100,
            &format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{HASH}.slice/cri-containerd-{STATIC_CID}.scope\n"),
        );
        write_proc(
            dir.path(),
            22,
            100,
            &format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/helper.scope\n"),
        );
        let mut a = ProcAttributor::new(ProcFs::new(dir.path()), source, None);
        let mut s = snap(&[20, 21, 22]);
        a.attribute(&mut s);
        let names: Vec<(String, String, String)> = s
            .processes
            .iter()
            .map(|p| match &p.owner {
                Owner::Pod(r) => (r.namespace.clone(), r.pod.clone(), r.container.clone()),
                o => panic!("{o:?}"),
            })
            .collect();
        let want = |n: &str, p: &str, c: &str| (n.to_string(), p.to_string(), c.to_string());
        assert_eq!(
            names,
            vec![
                want("ci", "job-1", "build"),
                want("kube-system", "infer-gpu-node-1", "server"),
                want("ci", "job-1", ""),
            ]
        );
    }
}
