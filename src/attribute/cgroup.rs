//! Maps the text of `/proc/<pid>/cgroup` to the pod (and container) that owns the process.
//!
//! The kubelet, the CRI runtime and the cgroup driver all shape the path, and the agent may
//! itself sit in a private cgroup namespace, so no fixed prefix can be relied on. Instead the
//! parser walks the path from its end, takes the LAST component that names a pod, and reads the
//! container from the component right after it. Anything further down (CRI-O's `container`
//! sub-cgroup, a container's own nested cgroups) still belongs to that container, and anything
//! further up (kind's `kubelet.slice`, a docker-in-docker `/docker/<id>`, `..` segments) is
//! ignored. Taking the last pod component means that in nested clusters (kind inside a pod) the
//! innermost pod wins, which is the one whose API server the agent talks to.
//!
//! Shapes understood (`docs/attribution.md` has the full table, with real examples):
//! - systemd driver: `…/kubepods[-<qos>]-pod<uid with _>.slice/<scope>` where `<scope>` is
//!   `cri-containerd-<id>.scope`, `crio-<id>.scope` or `docker-<id>.scope`;
//! - systemd driver, cgroup v1, the runtime's `slice:prefix:id` written as ONE component
//!   because runc was not started with `--systemd-cgroup` (containerd 1.5+ with
//!   `SystemdCgroup = false`): `…/kubepods[-<qos>]-pod<uid>.slice:cri-containerd:<id>`, also
//!   with `:crio:` / `:docker:`, at `/` or under `/system.slice/containerd.service`;
//! - cgroupfs driver: `…/kubepods[/<qos>]/pod<uid>/<id>` (or `crio-<id>`);
//! - static pods: the pod component carries the kubelet's 32-hex config hash instead of a UUID
//!   (`kubepods-burstable-pod8daa50c3a64c9ff60bb9eab7b44b56fd.slice`, `pod<hash>`);
//! - cgroup v2 (`0::<path>`) and v1 (`<n>:<controllers>:<path>`), the v2 line winning;
//! - a ` (deleted)` suffix, which the kernel adds on v2 while a dying process outlives its cgroup.
//!
//! A process inside a pod's cgroup whose next component is not a container ID (a runtime's
//! helper such as CRI-O's `crio-conmon-<id>.scope`, a sub-cgroup the workload or a privileged
//! container made, a malformed ID) is the pod's, at pod level: the kubelet charges that cgroup to
//! the pod and kills everything in it when the pod goes, so the pod is its owner, but no
//! container can be named.
//!
//! The module is pure and allocates only the returned identity: it runs once per new PID.

use serde::Serialize;

/// The container runtime, as far as the cgroup path reveals it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// containerd's CRI plugin (`cri-containerd-<id>.scope`).
    Containerd,
    /// CRI-O (`crio-<id>.scope`, or `crio-<id>` under cgroupfs).
    Crio,
    /// Docker through dockershim / cri-dockerd (`docker-<id>.scope`).
    Docker,
    /// The path names a container but not its runtime: the cgroupfs driver of containerd and
    /// docker both use the bare 64-hex ID.
    Unknown,
}

/// Which pod, and which container in it, a process belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupIdentity {
    /// The kubelet's UID for the pod. For pods from the API server it is `metadata.uid` in the
    /// API server's form, with dashes (systemd drivers write `_` for `-`). For a static pod it
    /// is the kubelet's config hash (32 lowercase hex), which the pod's mirror on the API server
    /// carries in its `kubernetes.io/config.hash` annotation, not in `metadata.uid`.
    pub pod_uid: String,
    /// 64-hex container ID when the path names one; None for a pod-level cgroup: a process in
    /// the pod slice itself, or in a child of it that is not a container (see the module doc).
    pub container_id: Option<String>,
    /// The runtime named by the container component; `Unknown` for pod-level cgroups.
    pub runtime: Runtime,
}

/// Parses the full text of /proc/<pid>/cgroup. Returns None for host processes, system
/// services, conmon, and anything not inside a kubepods hierarchy.
///
/// The v2 (`0::`) line wins when it yields an identity: on a hybrid host it is the one the
/// kubelet's systemd driver manages. Otherwise the v1 lines are tried; they normally agree, but
/// a controller the runtime does not manage can stop at the pod or at `/`, so a line naming a
/// container beats one naming only the pod. Lines lacking the two `:` separators or a numeric
/// hierarchy ID are skipped rather than guessed at.
pub fn parse_proc_cgroup(text: &str) -> Option<CgroupIdentity> {
    let mut pod_level: Option<Parsed<'_>> = None;
    let mut with_container: Option<Parsed<'_>> = None;
    for line in text.lines() {
        let mut fields = line.trim().splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if hierarchy.is_empty() || !hierarchy.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Some(parsed) = parse_borrowed(path) else {
            continue;
        };
        if hierarchy == "0" && controllers.is_empty() {
            return Some(parsed.to_identity());
        }
        let slot = if parsed.container.is_some() {
            &mut with_container
        } else {
            &mut pod_level
        };
        if slot.is_none() {
            *slot = Some(parsed);
        }
    }
    with_container.or(pod_level).map(|p| p.to_identity())
}

/// Parses one cgroup path (the part after the second ':'), e.g.
/// "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice/cri-containerd-<64hex>.scope".
///
/// A path whose last pod component has nothing after it, or something that is not a container
/// ID (CRI-O's `crio-conmon-<id>.scope`, a helper's or the workload's own sub-cgroup), is a
/// pod-level cgroup: it yields the pod with `container_id: None`. The pod is certain (the path
/// is inside its cgroup, which the kubelet charges to it and tears down with it); only the
/// container is unknown.
pub fn parse_cgroup_path(path: &str) -> Option<CgroupIdentity> {
    parse_borrowed(path).map(|p| p.to_identity())
}

/// The identity as slices of the input, so that rejected lines cost no allocation.
#[derive(Debug, Clone, Copy)]
struct Parsed<'a> {
    /// A UUID (separators may still be `_`) or a static pod's 32-hex config hash.
    pod_uid: &'a str,
    container: Option<(&'a str, Runtime)>,
}

impl Parsed<'_> {
    fn to_identity(self) -> CgroupIdentity {
        let mut pod_uid = String::with_capacity(self.pod_uid.len());
        pod_uid.extend(self.pod_uid.chars().map(|c| if c == '_' { '-' } else { c }));
        let (container_id, runtime) = match self.container {
            Some((id, runtime)) => (Some(id.to_owned()), runtime),
            None => (None, Runtime::Unknown),
        };
        CgroupIdentity {
            pod_uid,
            container_id,
            runtime,
        }
    }
}

fn parse_borrowed(path: &str) -> Option<Parsed<'_>> {
    let path = path.trim();
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let mut components = path.rsplit('/').filter(|c| !c.is_empty()).peekable();
    let mut child: Option<&str> = None;
    while let Some(component) = components.next() {
        let parent = components.peek().copied();
        if let Some((pod_uid, colon_tail)) = pod_of(component, parent) {
            // The colon form names the container in the pod component itself; whatever
            // lies below it is that container's own sub-cgroups.
            let container = match colon_tail {
                Some(tail) => colon_container_of(tail),
                None => child.and_then(container_of),
            };
            return Some(Parsed { pod_uid, container });
        }
        child = Some(component);
    }
    None
}

/// The raw UID (or config hash) if `component` is a pod cgroup, with the `prefix:id` tail
/// when the component is the colon form `<pod slice>:<prefix>:<id>`.
///
/// The systemd slice carries its own proof of being under kubepods (`kubepods` is one of its
/// dash-separated ancestors, also for kind's `kubelet-kubepods-…`); that is also why the colon
/// form, which sits at `/` or under `containerd.service` rather than under `kubepods.slice`, is
/// still recognised. The cgroupfs directory `pod<uid>` carries no such proof, so its parent must
/// be a kubepods/QoS directory, or `..` when a private cgroup namespace hides the common ancestor.
fn pod_of<'a>(component: &'a str, parent: Option<&str>) -> Option<(&'a str, Option<&'a str>)> {
    let (head, colon_tail) = match component.split_once(':') {
        Some((head, tail)) => (head, Some(tail)),
        None => (component, None),
    };
    if let Some(stem) = head.strip_suffix(".slice") {
        // `-pod` cannot occur inside a UID or a hash (neither has a `p` or an `o`), so the
        // last one separates the ancestors from the pod's own name.
        let (ancestors, uid) = stem.rsplit_once("-pod")?;
        let under_kubepods = ancestors.split('-').any(|a| a == "kubepods");
        return (under_kubepods && is_pod_uid(uid)).then_some((uid, colon_tail));
    }
    // The colon form only exists for systemd slices; a cgroupfs name with a colon is not one.
    if colon_tail.is_some() {
        return None;
    }
    let uid = component.strip_prefix("pod")?;
    let parent_ok = parent
        .is_some_and(|p| p.ends_with("kubepods") || matches!(p, "burstable" | "besteffort" | ".."));
    (parent_ok && is_pod_uid(uid)).then_some((uid, None))
}

/// The container ID and runtime if `component` names a container; `crio-conmon-<id>` fails
/// here because `conmon-<id>` is not a bare ID.
fn container_of(component: &str) -> Option<(&str, Runtime)> {
    let stem = component.strip_suffix(".scope").unwrap_or(component);
    let (id, runtime) = if let Some(id) = stem.strip_prefix("cri-containerd-") {
        (id, Runtime::Containerd)
    } else if let Some(id) = stem.strip_prefix("crio-") {
        (id, Runtime::Crio)
    } else if let Some(id) = stem.strip_prefix("docker-") {
        (id, Runtime::Docker)
    } else {
        (stem, Runtime::Unknown)
    };
    is_container_id(id).then_some((id, runtime))
}

/// The container of the colon form's `<prefix>:<id>` tail: the prefixes are the ones the
/// runtimes put in the OCI `cgroupsPath` (`slice:prefix:name`); an unknown prefix or a
/// malformed ID leaves the process at pod level.
fn colon_container_of(tail: &str) -> Option<(&str, Runtime)> {
    let (prefix, id) = tail.split_once(':')?;
    let runtime = match prefix {
        "cri-containerd" => Runtime::Containerd,
        "crio" => Runtime::Crio,
        "docker" => Runtime::Docker,
        _ => return None,
    };
    is_container_id(id).then_some((id, runtime))
}

const UUID_LEN: usize = 36;

/// What a pod component may carry: a UUID (pods from the API server) or a config hash (static
/// pods, whose kubelet UID is that hash).
fn is_pod_uid(s: &str) -> bool {
    is_uuid(s) || is_config_hash(s)
}

/// 8-4-4-4-12 hex. Either separator is accepted because systemd escapes `-` as `_` and
/// cgroupfs does not; hex case is kept as written so the result matches the API server's UID.
fn is_uuid(s: &str) -> bool {
    s.len() == UUID_LEN
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-' || b == b'_',
            _ => b.is_ascii_hexdigit(),
        })
}

/// The kubelet's config hash of a static pod: an MD5 printed by Go's `hex.EncodeToString`,
/// so exactly 32 lowercase hex digits.
fn is_config_hash(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Runtimes print IDs as 64 lowercase hex, and `status.containerStatuses[].containerID` is
/// compared byte for byte, so anything else (short IDs, upper case) cannot match anyway.
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UID: &str = "8f3c1a2e-5b7d-4e9f-a1c3-0d2e4f6a8b9c";
    const UID_: &str = "8f3c1a2e_5b7d_4e9f_a1c3_0d2e4f6a8b9c";
    const CID: &str = "3f9a1c2b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
    const CID2: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
    const OUTER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn id(container: Option<&str>, runtime: Runtime) -> Option<CgroupIdentity> {
        Some(CgroupIdentity {
            pod_uid: UID.to_owned(),
            container_id: container.map(str::to_owned),
            runtime,
        })
    }

    /// Expands `{UID}`, `{UID_}`, `{CID}`, `{CID2}`, `{OUTER}` so fixtures read like real files.
    fn fixture(t: &str) -> String {
        t.replace("{UID_}", UID_)
            .replace("{UID}", UID)
            .replace("{CID2}", CID2)
            .replace("{CID}", CID)
            .replace("{OUTER}", OUTER)
    }

    /// v1 file of a systemd-driver host, every controller pointing at `path`.
    fn v1_systemd(path: &str) -> String {
        [
            "12:hugetlb:",
            "11:cpuset:",
            "10:memory:",
            "9:devices:",
            "8:blkio:",
            "7:pids:",
            "6:net_cls,net_prio:",
            "5:perf_event:",
            "4:freezer:",
            "3:cpu,cpuacct:",
            "2:rdma:/",
            "1:name=systemd:",
            "0::/",
        ]
        .iter()
        .map(|h| {
            if h.ends_with(':') {
                format!("{h}{path}\n")
            } else {
                format!("{h}\n")
            }
        })
        .collect()
    }

    #[test]
    fn table() {
        let sd_burstable =
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice";
        let cases: Vec<(&str, String, Option<CgroupIdentity>)> = vec![
            (
                "v2 systemd containerd burstable",
                fixture(&format!("0::{sd_burstable}/cri-containerd-{{CID}}.scope\n")),
                id(Some(CID), Runtime::Containerd),
            ),
            (
                "v2 systemd containerd besteffort",
                fixture("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"),
                id(Some(CID), Runtime::Containerd),
            ),
            (
                "v2 systemd containerd guaranteed (no QoS slice)",
                fixture("0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"),
                id(Some(CID), Runtime::Containerd),
            ),
            (
                "v2 systemd crio burstable",
                fixture(&format!("0::{sd_burstable}/crio-{{CID}}.scope\n")),
                id(Some(CID), Runtime::Crio),
            ),
            (
                "v2 systemd crio with crun's `container` sub-cgroup",
                fixture(&format!("0::{sd_burstable}/crio-{{CID}}.scope/container\n")),
                id(Some(CID), Runtime::Crio),
            ),
            (
                "v2 systemd cri-dockerd guaranteed",
                fixture("0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n"),
                id(Some(CID), Runtime::Docker),
            ),
            (
                "v2 pod-level cgroup, no container scope",
                fixture(&format!("0::{sd_burstable}\n")),
                id(None, Runtime::Unknown),
            ),
            (
                "v1 systemd containerd, 13 lines",
                fixture(&v1_systemd(&format!("{sd_burstable}/cri-containerd-{{CID}}.scope"))),
                id(Some(CID), Runtime::Containerd),
            ),
            (
                "v1 cgroupfs docker burstable",
                fixture(
                    "12:pids:/kubepods/burstable/pod{UID}/{CID}\n\
                     11:memory:/kubepods/burstable/pod{UID}/{CID}\n\
                     10:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n\
                     9:devices:/kubepods/burstable/pod{UID}/{CID}\n\
                     1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n",
                ),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "v1 cgroupfs guaranteed (no QoS dir)",
                fixture(
                    "5:memory:/kubepods/pod{UID}/{CID}\n\
                     4:cpu,cpuacct:/kubepods/pod{UID}/{CID}\n\
                     1:name=systemd:/kubepods/pod{UID}/{CID}\n",
                ),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "v2 cgroupfs besteffort",
                fixture("0::/kubepods/besteffort/pod{UID}/{CID}\n"),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "v2 cgroupfs crio",
                fixture("0::/kubepods/burstable/pod{UID}/crio-{CID}\n"),
                id(Some(CID), Runtime::Crio),
            ),
            (
                "hybrid: v2 line is `/`, v1 lines carry the pod",
                fixture(
                    "11:memory:/kubepods/burstable/pod{UID}/{CID}\n\
                     3:rdma:/\n\
                     1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n\
                     0::/\n",
                ),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "v1: a container line beats an earlier pod-level line",
                fixture(
                    "6:perf_event:/kubepods/burstable/pod{UID}\n\
                     5:memory:/kubepods/burstable/pod{UID}/{CID}\n",
                ),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "hybrid: the v2 line wins over v1",
                fixture(
                    "1:name=systemd:/kubepods/burstable/pod{UID}/{CID2}\n\
                     0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n",
                ),
                id(Some(CID), Runtime::Crio),
            ),
            (
                "kind, systemd driver under kubelet.slice",
                fixture("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"),
                id(Some(CID), Runtime::Containerd),
            ),
            (
                "kind, cgroupfs under /docker/<node id>, v1",
                fixture(
                    "9:memory:/docker/{OUTER}/kubepods/besteffort/pod{UID}/{CID}\n\
                     1:name=systemd:/docker/{OUTER}/kubepods/besteffort/pod{UID}/{CID}\n",
                ),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "docker-in-docker under a systemd scope",
                fixture("0::/system.slice/docker-{OUTER}.scope/kubepods/burstable/pod{UID}/{CID}\n"),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "nested cluster: the innermost pod wins",
                fixture(&format!(
                    "0::/kubepods/burstable/pod{}/{{CID2}}/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{{UID_}}.slice/cri-containerd-{{CID}}.scope\n",
                    "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
                )),
                id(Some(CID), Runtime::Containerd),
            ),
            (
                "private cgroup namespace, systemd",
                fixture("0::/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n"),
                id(Some(CID), Runtime::Containerd),
            ),
            (
                "private cgroup namespace, cgroupfs sibling pod",
                fixture("0::/../../pod{UID}/{CID}\n"),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "CRLF and trailing whitespace",
                fixture("0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope  \r\n"),
                id(Some(CID), Runtime::Docker),
            ),
            (
                "extra colons stay in the path",
                fixture("0::/odd:dir:name/kubepods/besteffort/pod{UID}/{CID}\n"),
                id(Some(CID), Runtime::Unknown),
            ),
            (
                "dying process: ` (deleted)` suffix",
                fixture(&format!("0::{sd_burstable}/cri-containerd-{{CID}}.scope (deleted)\n")),
                id(Some(CID), Runtime::Containerd),
            ),
            (
                "no trailing newline",
                fixture("0::/kubepods/pod{UID}/{CID}"),
                id(Some(CID), Runtime::Unknown),
            ),
            // --- None ---
            ("host user session", "0::/user.slice/user-1000.slice/session-3.scope\n".into(), None),
            ("init", "0::/init.scope\n".into(), None),
            ("root cgroup", "0::/\n".into(), None),
            ("containerd service", "0::/system.slice/containerd.service\n".into(), None),
            (
                "kubelet service, v1",
                v1_systemd("/system.slice/kubelet.service"),
                None,
            ),
            // --- pod known, container not: the pod's, at pod level ---
            (
                "crio conmon: CRI-O charges its monitor to the pod",
                fixture(&format!("0::{sd_burstable}/crio-conmon-{{CID}}.scope\n")),
                id(None, Runtime::Unknown),
            ),
            (
                "crio conmon, cgroupfs",
                fixture("0::/kubepods/burstable/pod{UID}/crio-conmon-{CID}\n"),
                id(None, Runtime::Unknown),
            ),
            (
                "short container id: not a container, still the pod",
                fixture("0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-3f9a1c2b4d5e.scope\n"),
                id(None, Runtime::Unknown),
            ),
            (
                "upper-case container id: not a container, still the pod",
                fixture("0::/kubepods/pod{UID}/{CID}").replace(CID, &CID.to_uppercase()),
                id(None, Runtime::Unknown),
            ),
            (
                "unknown child in the pod slice",
                fixture(&format!("0::{sd_burstable}/helper.scope\n")),
                id(None, Runtime::Unknown),
            ),
            (
                "the workload's own sub-cgroup below an unknown child",
                fixture(&format!("0::{sd_burstable}/helper.scope/worker/leaf\n")),
                id(None, Runtime::Unknown),
            ),
            (
                "kata-style sandbox directory under a cgroupfs pod",
                fixture("0::/kubepods/besteffort/pod{UID}/kata_{CID}\n"),
                id(None, Runtime::Unknown),
            ),
            (
                "colon form with an unknown runtime prefix",
                fixture("0::/kubepods-besteffort-pod{UID_}.slice:runsc:{CID}\n"),
                id(None, Runtime::Unknown),
            ),
            (
                "colon form with a short id",
                fixture("0::/kubepods-besteffort-pod{UID_}.slice:cri-containerd:3f9a1c2b\n"),
                id(None, Runtime::Unknown),
            ),
            (
                "colon form, a container's sub-cgroup below it",
                fixture("0::/kubepods-besteffort-pod{UID_}.slice:crio:{CID}/container\n"),
                id(Some(CID), Runtime::Crio),
            ),
            (
                "colon form, docker prefix",
                fixture("1:name=systemd:/kubepods-pod{UID_}.slice:docker:{CID}\n"),
                id(Some(CID), Runtime::Docker),
            ),
            ("empty", String::new(), None),
            ("garbage", "hello world\n:::\n::\n\u{0}\u{ffff}:x:y\n".into(), None),
            (
                "QoS slice, no pod",
                "0::/kubepods.slice/kubepods-burstable.slice\n".into(),
                None,
            ),
            (
                "pod uid not a UUID",
                fixture("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice/cri-containerd-{CID}.scope\n"),
                None,
            ),
            (
                "bare path without hierarchy fields",
                fixture("/kubepods/burstable/pod{UID}/{CID}\n"),
                None,
            ),
            (
                "non-numeric hierarchy id",
                fixture("x:memory:/kubepods/burstable/pod{UID}/{CID}\n"),
                None,
            ),
            (
                "cgroupfs pod dir outside kubepods",
                fixture("0::/system.slice/pod{UID}/{CID}\n"),
                None,
            ),
            (
                "systemd pod slice outside kubepods",
                fixture("0::/machine.slice/machine-pod{UID_}.slice/cri-containerd-{CID}.scope\n"),
                None,
            ),
            (
                "podman container",
                fixture("0::/machine.slice/libpod-{CID}.scope/container\n"),
                None,
            ),
            (
                "config hash too short",
                fixture("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8daa50c3a64c9ff60bb9eab7b44b56f.slice/cri-containerd-{CID}.scope\n"),
                None,
            ),
            (
                "config hash in upper case (Go's hex encoder writes lower case)",
                fixture("0::/kubepods/burstable/pod8DAA50C3A64C9FF60BB9EAB7B44B56FD/{CID}\n"),
                None,
            ),
            (
                "colon form outside kubepods (a BuildKit step under dockerd)",
                fixture("0::/system.slice/system.slice:docker:{CID}\n"),
                None,
            ),
            (
                "colon form on a cgroupfs pod directory is not a shape",
                fixture("0::/kubepods/burstable/pod{UID}:cri-containerd:{CID}\n"),
                None,
            ),
        ];
        assert!(cases.len() >= 20);
        assert!(cases.iter().filter(|c| c.2.is_none()).count() >= 6);
        for (name, text, want) in &cases {
            assert_eq!(&parse_proc_cgroup(text), want, "case {name:?}: {text:?}");
        }
    }

    fn expect(uid: &str, cid: Option<&str>, runtime: Runtime) -> Option<CgroupIdentity> {
        Some(CgroupIdentity {
            pod_uid: uid.to_owned(),
            container_id: cid.map(str::to_owned),
            runtime,
        })
    }

    /// Files of the two shapes named in docs/attribution.md, as published in public bug reports and test
    /// suites. Each is quoted as far as its source shows it (lines a source cut off are left
    /// out, never made up); where a source gave only a path, the line it belongs on is built
    /// around it and the comment says so.
    #[test]
    fn real_files_of_the_colon_form_and_static_pods() {
        // open-telemetry/opentelemetry-java#4507 (comment of 2022-06-09), `cat
        // /proc/self/cgroup` in a containerd pod, cgroup v1: the runtime's `slice:prefix:id`
        // written as one component, at `/` for some controllers and under
        // `/system.slice/containerd.service` for others.
        let otel_4507 = "\
11:perf_event:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
9:cpuacct,cpu:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
8:cpuset:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
7:hugetlb:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
6:devices:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
";
        // duckdb/duckdb#16608 (comment of 2025-03-13), `cat /proc/self/cgroup`, containerd,
        // burstable pod, cgroup v1 with the `misc` and `rdma` controllers.
        let duckdb_16608 = "\
13:cpuset:/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_155cc887b417.slice:cri-containerd:6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294
12:rdma:/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_155cc887b417.slice:cri-containerd:6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294
11:blkio:/system.slice/containerd.service/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_155cc887b417.slice:cri-containerd:6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294
10:pids:/system.slice/containerd.service/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_155cc887b417.slice:cri-containerd:6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294
9:cpu,cpuacct:/system.slice/containerd.service/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_155cc887b417.slice:cri-containerd:6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294
8:misc:/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_155cc887b417.slice:cri-containerd:6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294
";
        // open-telemetry/opentelemetry-java#4730 (Kubernetes 1.25.0, containerd 1.6.8), the
        // line quoted in the report: a Guaranteed pod (no QoS in the slice name).
        let otel_4730 = "11:devices:/system.slice/containerd.service/kubepods-pod87a18a64_b74a_454a_b10b_a4a36059d0a3.slice:cri-containerd:05c48c82caff3be3d7f1e896981dd410e81487538936914f32b624d168de9db0\n";
        // falcosecurity/libs#63 (Kubernetes >= 1.20 on Debian 10, containerd without
        // `SystemdCgroup = true`), the line quoted in the report.
        let falco_63 = "11:pids:/system.slice/containerd.service/kubepods-burstable-podb4f3dfaf_f987_499d_a04c_2c60eb01958c.slice:cri-containerd:f659de946112140fd722cddfd24015a8c9fce51b7ab7f007ac30612b6f9acfc9\n";
        // containerd/runwasi#821 (k3s, cgroup v2): the container's cgroup directory
        // `/sys/fs/cgroup//kubepods-besteffort-podb7c2…slice:cri-containerd:66dd…`; the `0::`
        // line is built around that path.
        let runwasi_821 = "0::/kubepods-besteffort-podb7c2cbdb_9ab5_47ef_977e_97e39a73da6d.slice:cri-containerd:66dda1e97c4fc48204b066f07fc1e28bab94a571820484e01576982d4cb9d32b\n";
        // kubernetes/kubernetes#106514: BOTH shapes at once, a static pod (32-hex config hash)
        // in the colon form. The report gives the v1 systemd-hierarchy directory
        // `/sys/fs/cgroup/systemd/system.slice/containerd.service/kubepods-burstable-pod36b6…slice\:cri-containerd\:79fe…`
        // (shell escapes removed here); the `name=systemd` line is built around it.
        let k8s_106514 = "1:name=systemd:/system.slice/containerd.service/kubepods-burstable-pod36b6d6be73b1065af369b3985edafa09.slice:cri-containerd:79fedb3bd23ca77c9d9ccb41909038316f713df22b54b7d942b71d3812e7c74e\n";
        // netdata/netdata#4868 (comment listing a v1 node's `net_cls,net_prio` tree, systemd
        // driver, containerd): the static pod `kubepods-burstable-pod8daa…56fd.slice` with its
        // container scope `cri-containerd-2884…51ac5.scope`; the line is built around that path.
        let netdata_4868 = "8:net_cls,net_prio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8daa50c3a64c9ff60bb9eab7b44b56fd.slice/cri-containerd-2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5.scope\n";
        // cri-o/cri-o#9082: the etcd static pod's slice under CRI-O,
        // `kubepods-burstable-pod1864dd0546310be9937c37cf88024cb8.slice` (from the error
        // message `Unit kubepods-burstable-pod1864…cb8.slice not found`); pod level, since the
        // report names no container scope.
        let crio_9082 = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1864dd0546310be9937c37cf88024cb8.slice\n";
        // pixie-io/pixie#399: under cgroupfs a static pod's directory is `kubepods/pod<UID>`
        // with the kubelet-made UID (the config hash, kubelet pkg/kubelet/config/common.go);
        // built from that rule with netdata#4868's hash and container ID.
        let pixie_399 = "4:memory:/kubepods/burstable/pod8daa50c3a64c9ff60bb9eab7b44b56fd/2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5\n";

        let cases = [
            (
                "opentelemetry-java#4507",
                otel_4507,
                expect(
                    "0125ec2f-b64a-4868-8f5b-94b56cbab864",
                    Some("ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459"),
                    Runtime::Containerd,
                ),
            ),
            (
                "duckdb#16608",
                duckdb_16608,
                expect(
                    "b96a7488-3ee1-4bdc-9c98-155cc887b417",
                    Some("6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294"),
                    Runtime::Containerd,
                ),
            ),
            (
                "opentelemetry-java#4730",
                otel_4730,
                expect(
                    "87a18a64-b74a-454a-b10b-a4a36059d0a3",
                    Some("05c48c82caff3be3d7f1e896981dd410e81487538936914f32b624d168de9db0"),
                    Runtime::Containerd,
                ),
            ),
            (
                "falcosecurity/libs#63",
                falco_63,
                expect(
                    "b4f3dfaf-f987-499d-a04c-2c60eb01958c",
                    Some("f659de946112140fd722cddfd24015a8c9fce51b7ab7f007ac30612b6f9acfc9"),
                    Runtime::Containerd,
                ),
            ),
            (
                "runwasi#821",
                runwasi_821,
                expect(
                    "b7c2cbdb-9ab5-47ef-977e-97e39a73da6d",
                    Some("66dda1e97c4fc48204b066f07fc1e28bab94a571820484e01576982d4cb9d32b"),
                    Runtime::Containerd,
                ),
            ),
            (
                "kubernetes#106514",
                k8s_106514,
                expect(
                    "36b6d6be73b1065af369b3985edafa09",
                    Some("79fedb3bd23ca77c9d9ccb41909038316f713df22b54b7d942b71d3812e7c74e"),
                    Runtime::Containerd,
                ),
            ),
            (
                "netdata#4868",
                netdata_4868,
                expect(
                    "8daa50c3a64c9ff60bb9eab7b44b56fd",
                    Some("2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5"),
                    Runtime::Containerd,
                ),
            ),
            (
                "cri-o#9082",
                crio_9082,
                expect("1864dd0546310be9937c37cf88024cb8", None, Runtime::Unknown),
            ),
            (
                "pixie#399",
                pixie_399,
                expect(
                    "8daa50c3a64c9ff60bb9eab7b44b56fd",
                    Some("2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5"),
                    Runtime::Unknown,
                ),
            ),
        ];
        for (source, text, want) in &cases {
            assert_eq!(&parse_proc_cgroup(text), want, "{source}: {text:?}");
        }
    }

    #[test]
    fn parse_cgroup_path_takes_the_bare_path() {
        assert_eq!(
            parse_cgroup_path(&fixture("/kubepods/burstable/pod{UID}/{CID}")),
            id(Some(CID), Runtime::Unknown)
        );
        assert_eq!(parse_cgroup_path(""), None);
        assert_eq!(parse_cgroup_path("/"), None);
    }

    #[test]
    fn runtime_serializes_lowercase() {
        let json = |r: Runtime| serde_json::to_string(&r).unwrap_or_default();
        assert_eq!(json(Runtime::Containerd), "\"containerd\"");
        assert_eq!(json(Runtime::Crio), "\"crio\"");
        assert_eq!(json(Runtime::Docker), "\"docker\"");
        assert_eq!(json(Runtime::Unknown), "\"unknown\"");
    }

    #[test]
    fn very_long_line_does_not_blow_up() {
        let deep = "/a".repeat(100_000);
        let text = fixture(&format!("0::{deep}/kubepods/pod{{UID}}/{{CID}}\n"));
        assert_eq!(parse_proc_cgroup(&text), id(Some(CID), Runtime::Unknown));
        assert_eq!(parse_proc_cgroup(&"x".repeat(1_000_000)), None);
    }

    fn check_invariants(got: &Option<CgroupIdentity>) {
        if let Some(got) = got {
            assert!(
                is_pod_uid(&got.pod_uid) && !got.pod_uid.contains('_'),
                "pod_uid {:?}",
                got.pod_uid
            );
            if let Some(cid) = &got.container_id {
                assert!(is_container_id(cid), "container_id {cid:?}");
            } else {
                assert_eq!(got.runtime, Runtime::Unknown);
            }
        }
    }

    fn hex(len: usize) -> impl Strategy<Value = String> {
        proptest::string::string_regex(&format!("[0-9a-f]{{{len}}}"))
            .unwrap_or_else(|e| panic!("bad regex: {e}"))
    }

    fn uuid() -> impl Strategy<Value = String> {
        (hex(8), hex(4), hex(4), hex(4), hex(12))
            .prop_map(|(a, b, c, d, e)| format!("{a}-{b}-{c}-{d}-{e}"))
    }

    /// Plausible components, right and subtly wrong, so the search reaches the deep branches.
    fn fragment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("kubepods".to_owned()),
            Just("kubepods.slice".to_owned()),
            Just("kubepods-burstable.slice".to_owned()),
            Just("burstable".to_owned()),
            Just("besteffort".to_owned()),
            Just("..".to_owned()),
            Just(String::new()),
            Just("system.slice".to_owned()),
            Just("container".to_owned()),
            Just("pod".to_owned()),
            Just(".slice".to_owned()),
            Just("kubepods-pod.slice".to_owned()),
            Just("é-pod€.slice".to_owned()),
            uuid().prop_map(|u| format!("pod{u}")),
            uuid().prop_map(|u| format!("kubepods-besteffort-pod{}.slice", u.replace('-', "_"))),
            uuid().prop_map(|u| format!("kubepods-pod{}.slice", &u[1..])),
            hex(32).prop_map(|h| format!("kubepods-burstable-pod{h}.slice")),
            hex(31).prop_map(|h| format!("pod{h}")),
            (uuid(), hex(64)).prop_map(|(u, c)| format!(
                "kubepods-besteffort-pod{}.slice:cri-containerd:{c}",
                u.replace('-', "_")
            )),
            hex(64).prop_map(|c| format!("kubepods-pod.slice:crio:{c}")),
            hex(64),
            hex(63),
            hex(64).prop_map(|c| format!("cri-containerd-{c}.scope")),
            hex(64).prop_map(|c| format!("crio-{c}.scope")),
            hex(64).prop_map(|c| format!("crio-conmon-{c}.scope")),
            hex(64).prop_map(|c| format!("docker-{c}.scope (deleted)")),
            "[a-z:_.\\- ]{0,12}",
            ".{0,8}",
        ]
    }

    fn line() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                Just("0::"),
                Just("1:name=systemd:"),
                Just("4:memory:"),
                Just("x:"),
                Just(""),
                Just(":::"),
            ],
            prop::collection::vec(fragment(), 0..10),
            prop_oneof![Just(""), Just("\r"), Just(" "), Just(":")],
        )
            .prop_map(|(head, parts, tail)| format!("{head}/{}{tail}", parts.join("/")))
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(text in any::<String>()) {
            check_invariants(&parse_proc_cgroup(&text));
            check_invariants(&parse_cgroup_path(&text));
        }

        #[test]
        fn never_panics_on_plausible_files(lines in prop::collection::vec(line(), 0..6)) {
            let text = lines.join("\n");
            check_invariants(&parse_proc_cgroup(&text));
        }

        #[test]
        fn finds_generated_pods_under_any_prefix(
            uid in uuid(),
            cid in hex(64),
            prefix in prop::collection::vec(fragment(), 0..4),
            hash in hex(32),
            static_pod in any::<bool>(),
            shape in 0usize..8,
        ) {
            // A static pod's kubelet UID is its config hash; the shapes are the same.
            let uid = if static_pod { hash } else { uid };
            let uid_ = uid.replace('-', "_");
            let (tail, runtime) = match shape {
                0 => (format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{cid}.scope"), Runtime::Containerd),
                1 => (format!("kubepods.slice/kubepods-pod{uid_}.slice/crio-{cid}.scope/container"), Runtime::Crio),
                2 => (format!("kubepods-besteffort-pod{uid_}.slice/docker-{cid}.scope"), Runtime::Docker),
                3 => (format!("kubepods/pod{uid}/{cid}"), Runtime::Unknown),
                4 => (format!("kubepods-burstable-pod{uid_}.slice:cri-containerd:{cid}"), Runtime::Containerd),
                5 => (format!("system.slice/containerd.service/kubepods-pod{uid_}.slice:crio:{cid}"), Runtime::Crio),
                6 => (format!("kubepods-besteffort-pod{uid_}.slice:docker:{cid}/nested"), Runtime::Docker),
                _ => (format!("kubepods/besteffort/pod{uid}/crio-{cid}"), Runtime::Crio),
            };
            let text = format!("0::/{}/{tail}\n", prefix.join("/"));
            let want = CgroupIdentity { pod_uid: uid, container_id: Some(cid), runtime };
            prop_assert_eq!(parse_proc_cgroup(&text), Some(want));
        }
    }
}
