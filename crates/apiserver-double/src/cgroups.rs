//! Killing the cgroups of a deleted pod, for the binary's `--kill-cgroups-under`.
//!
//! On a test machine, "pods" are processes placed in kubepods-shaped cgroups, e.g.
//! `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice`
//! (systemd driver) or `kubepods/burstable/pod<uid>` (cgroupfs driver). When the double deletes
//! an evicted pod it can do what the kubelet would: kill every process in the pod's cgroup, by
//! writing `1` to its `cgroup.kill` (cgroup v2, Linux ≥ 5.14).

use std::path::{Path, PathBuf};

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

#[cfg(test)]
mod tests {
    use super::*;

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
