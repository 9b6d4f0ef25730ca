//! The processes of pods on a test machine, for the binary's `--kill-cgroups-under`: the
//! kubelet's SIGTERM to each container's PID 1 and its SIGKILL to the whole pod.
//!
//! On a test machine, "pods" are processes placed in kubepods-shaped cgroups, e.g.
//! `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice`
//! (systemd driver) or `kubepods/burstable/pod<uid>` (cgroupfs driver), with one child cgroup
//! per container (`cri-containerd-<id>.scope`). A container's PID 1 is the process of the
//! container's cgroup that is a PID namespace's init (its `NSpid` ends in 1, as a container's
//! first process does), else its oldest process. SIGKILL to every process of the pod is a `1`
//! written to the pod cgroup's `cgroup.kill` (cgroup v2, Linux ≥ 5.14).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::kubelet_run::PodRuntime;

/// One cgroup directory that matched a pod UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KilledCgroup {
    /// The cgroup directory.
    pub path: PathBuf,
    /// `None` when `1` was written to its `cgroup.kill`; otherwise why that failed.
    pub error: Option<String>,
}

/// Finds the directories under `root` (at most `max_depth` levels down, symlinks not followed)
/// whose name contains the pod UID, with `-` or with `_`, and writes `1` to each one's
/// `cgroup.kill`. A matching directory's own children are not searched (killing it kills
/// them). A UID shorter than 8 characters matches nothing, so an empty UID never kills a
/// whole tree.
pub fn kill_pod_cgroups(root: &Path, pod_uid: &str, max_depth: usize) -> Vec<KilledCgroup> {
    let mut out = Vec::new();
    for path in find_pod_cgroups(root, pod_uid, max_depth) {
        let error = std::fs::write(path.join("cgroup.kill"), b"1")
            .err()
            .map(|e| e.to_string());
        out.push(KilledCgroup { path, error });
    }
    out
}

/// The directories [`kill_pod_cgroups`] would kill, without killing anything.
pub fn find_pod_cgroups(root: &Path, pod_uid: &str, max_depth: usize) -> Vec<PathBuf> {
    let uid = pod_uid.trim();
    if uid.len() < 8 {
        return Vec::new();
    }
    let dashed = uid.replace('_', "-");
    let underscored = uid.replace('-', "_");
    let mut found = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        if depth >= max_depth {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut children: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        children.sort();
        for child in children.into_iter().rev() {
            let name = child
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.contains(&dashed) || name.contains(&underscored) {
                found.push(child);
            } else {
                stack.push((child, depth + 1));
            }
        }
    }
    found.sort();
    found
}

/// The container cgroups of a pod cgroup: its child directories, or the pod cgroup itself
/// when it has none.
pub fn container_cgroups(pod_dir: &Path) -> Vec<PathBuf> {
    let mut kids: Vec<PathBuf> = std::fs::read_dir(pod_dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    kids.sort();
    if kids.is_empty() {
        vec![pod_dir.to_path_buf()]
    } else {
        kids
    }
}

/// The processes of a cgroup and of every cgroup below it (`cgroup.procs`).
pub fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            stack.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A process's PID in its innermost PID namespace (the last `NSpid` field), and its start
/// time (field 22 of `stat`, clock ticks since boot).
fn ns_pid_and_start(proc_root: &Path, pid: u32) -> Option<(u32, u64)> {
    let dir = proc_root.join(pid.to_string());
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let ns_pid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(pid);
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    // fields after the name start at field 3 (state); starttime is field 22
    let start = after_name.split_whitespace().nth(19)?.parse().ok()?;
    Some((ns_pid, start))
}

/// The PID 1 of a container whose processes are `pids`: the one that is a PID namespace's
/// init, else the oldest (earliest start, then lowest pid). `None` when none is readable.
pub fn container_pid1(proc_root: &Path, pids: &[u32]) -> Option<u32> {
    let known: Vec<(u32, u32, u64)> = pids
        .iter()
        .filter_map(|&p| ns_pid_and_start(proc_root, p).map(|(ns, st)| (p, ns, st)))
        .collect();
    known
        .iter()
        .filter(|(p, ns, _)| *ns == 1 && *p != 1)
        .min_by_key(|(p, _, st)| (*st, *p))
        .or_else(|| known.iter().min_by_key(|(p, _, st)| (*st, *p)))
        .map(|(p, _, _)| *p)
}

/// The kubelet's hands on a test machine: pods are found by UID under `root`.
#[derive(Debug, Clone)]
pub struct CgroupRuntime {
    root: PathBuf,
    depth: usize,
    proc_root: PathBuf,
}

impl CgroupRuntime {
    /// Pods' cgroups under `root` (at most `depth` levels down); processes read from `/proc`.
    pub fn new(root: impl Into<PathBuf>, depth: usize) -> Self {
        CgroupRuntime {
            root: root.into(),
            depth,
            proc_root: PathBuf::from("/proc"),
        }
    }

    fn pod_dirs(&self, pod: &Value) -> Vec<PathBuf> {
        let uid = pod
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("");
        find_pod_cgroups(&self.root, uid, self.depth)
    }
}

impl PodRuntime for CgroupRuntime {
    fn sigterm_pid1(&self, pod: &Value) -> String {
        let mut said = Vec::new();
        for dir in self.pod_dirs(pod) {
            for ctr in container_cgroups(&dir) {
                let name = ctr
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                match container_pid1(&self.proc_root, &cgroup_pids(&ctr)) {
                    None => said.push(format!("{name}: no process")),
                    Some(pid) => {
                        let sent = i32::try_from(pid)
                            .ok()
                            .and_then(rustix::process::Pid::from_raw)
                            .ok_or_else(|| "not a pid".to_string())
                            .and_then(|p| {
                                rustix::process::kill_process(p, rustix::process::Signal::TERM)
                                    .map_err(|e| e.to_string())
                            });
                        match sent {
                            Ok(()) => said.push(format!("{name}: SIGTERM to pid {pid}")),
                            Err(e) => {
                                said.push(format!("{name}: SIGTERM to pid {pid} failed: {e}"))
                            }
                        }
                    }
                }
            }
        }
        if said.is_empty() {
            "no cgroup found for the pod".into()
        } else {
            said.join("; ")
        }
    }

    fn has_processes(&self, pod: &Value) -> bool {
        self.pod_dirs(pod).iter().any(|d| {
            cgroup_pids(d)
                .iter()
                .any(|p| self.proc_root.join(p.to_string()).exists())
        })
    }

    fn kill_all(&self, pod: &Value) -> String {
        let uid = pod
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("");
        let killed = kill_pod_cgroups(&self.root, uid, self.depth);
        if killed.is_empty() {
            return "no cgroup found for the pod".into();
        }
        killed
            .iter()
            .map(|k| match &k.error {
                None => format!("cgroup.kill {}", k.path.display()),
                Some(e) => format!("cgroup.kill {} failed: {e}", k.path.display()),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(root: &Path, pid: u32, nspid: &str, start: u64) {
        let d = root.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("status"), format!("Name:\tsh\nNSpid:\t{nspid}\n")).unwrap();
        let mut stat = format!("{pid} (sh (x)) S");
        for i in 4..=21 {
            stat.push_str(&format!(" {i}"));
        }
        stat.push_str(&format!(" {start} 0 0"));
        std::fs::write(d.join("stat"), stat).unwrap();
    }

    #[test]
    fn pid1_is_the_namespace_init_else_the_oldest() {
        let tmp = std::env::temp_dir().join(format!("ad-proc-{}", crate::util::new_uid()));
        // 10: the `unshare` parent on the host (oldest, not an init); 11: the shell, init of
        // its namespace; 12: the job under it.
        fake_proc(&tmp, 10, "10", 100);
        fake_proc(&tmp, 11, "11\t1", 101);
        fake_proc(&tmp, 12, "12\t2", 150);
        assert_eq!(container_pid1(&tmp, &[12, 11, 10]), Some(11));
        // no namespace: the oldest
        assert_eq!(container_pid1(&tmp, &[12, 10]), Some(10));
        // same start: the lower pid; unreadable pids are skipped
        fake_proc(&tmp, 13, "13", 100);
        assert_eq!(container_pid1(&tmp, &[13, 10, 99]), Some(10));
        assert_eq!(container_pid1(&tmp, &[99]), None);
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn containers_and_their_pids() {
        let tmp = std::env::temp_dir().join(format!("ad-cg2-{}", crate::util::new_uid()));
        let pod = tmp.join("kubepods-burstable-podx.slice");
        let a = pod.join("cri-containerd-a.scope");
        let b = pod.join("cri-containerd-b.scope");
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("cgroup.procs"), "7\n5\n").unwrap();
        std::fs::write(a.join("sub/cgroup.procs"), "9\n").unwrap();
        std::fs::write(b.join("cgroup.procs"), "").unwrap();
        assert_eq!(container_cgroups(&pod), vec![a.clone(), b.clone()]);
        assert_eq!(container_cgroups(&b), vec![b.clone()]);
        assert_eq!(cgroup_pids(&pod), vec![5, 7, 9]);
        assert!(cgroup_pids(&b).is_empty());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn finds_systemd_and_cgroupfs_shapes_and_kills_them() {
        let tmp = std::env::temp_dir().join(format!("ad-cg-{}", crate::util::new_uid()));
        let uid = "3f6c1a2b-0000-4111-8222-123456789abc";
        let sysd = tmp.join(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f6c1a2b_0000_4111_8222_123456789abc.slice",
        );
        let cgfs = tmp.join("kubepods/besteffort/pod3f6c1a2b-0000-4111-8222-123456789abc");
        let other = tmp.join("kubepods/besteffort/pod99999999-0000-4111-8222-123456789abc");
        for d in [&sysd, &cgfs, &other] {
            std::fs::create_dir_all(d.join("cri-containerd-abc.scope")).unwrap();
            std::fs::write(d.join("cgroup.kill"), "").unwrap();
        }
        let killed = kill_pod_cgroups(&tmp, uid, 8);
        let paths: Vec<_> = killed.iter().map(|k| k.path.clone()).collect();
        assert_eq!(paths, vec![cgfs.clone(), sysd.clone()]);
        assert!(killed.iter().all(|k| k.error.is_none()));
        assert_eq!(
            std::fs::read_to_string(sysd.join("cgroup.kill")).unwrap(),
            "1"
        );
        assert_eq!(
            std::fs::read_to_string(other.join("cgroup.kill")).unwrap(),
            ""
        );
        assert!(find_pod_cgroups(&tmp, "", 8).is_empty());
        assert!(find_pod_cgroups(&tmp, uid, 2).is_empty(), "depth bound");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
