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
//! Shapes understood:
//! - systemd driver: `…/kubepods[-<qos>]-pod<uid with _>.slice/<scope>` where `<scope>` is
//!   `cri-containerd-<id>.scope`, `crio-<id>.scope` or `docker-<id>.scope`;
//! - cgroupfs driver: `…/kubepods[/<qos>]/pod<uid>/<id>` (or `crio-<id>`);
//! - cgroup v2 (`0::<path>`) and v1 (`<n>:<controllers>:<path>`), the v2 line winning;
//! - a ` (deleted)` suffix, which the kernel adds on v2 while a dying process outlives its cgroup.
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
    /// Pod UID in the API server's form, with dashes (systemd drivers write `_` for `-`).
    pub pod_uid: String,
    /// 64-hex container ID when the path names one; None for a pod-level cgroup (e.g. the
    /// pause/sandbox slice without a container scope).
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
/// A path whose last pod component has nothing after it is a pod-level cgroup (a process placed
/// directly in the pod slice, outside any container scope): it yields the pod with
/// `container_id: None`. A pod component followed by something that is not a container
/// (CRI-O's `crio-conmon-<id>.scope`, an unknown runtime's helper) yields None, because
/// charging such a process to the pod would be a guess.
pub fn parse_cgroup_path(path: &str) -> Option<CgroupIdentity> {
    parse_borrowed(path).map(|p| p.to_identity())
}

/// The identity as slices of the input, so that rejected lines cost no allocation.
#[derive(Debug, Clone, Copy)]
struct Parsed<'a> {
    /// 36 chars; separators may still be `_`.
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
        if let Some(pod_uid) = pod_uid_of(component, parent) {
            let container = match child {
                None => None,
                Some(c) => Some(container_of(c)?),
            };
            return Some(Parsed { pod_uid, container });
        }
        child = Some(component);
    }
    None
}

/// The raw UID if `component` is a pod cgroup.
///
/// The systemd slice carries its own proof of being under kubepods (`kubepods` is one of its
/// dash-separated ancestors, also for kind's `kubelet-kubepods-…`). The cgroupfs directory
/// `pod<uid>` does not, so its parent must be a kubepods/QoS directory, or `..` when a private
/// cgroup namespace hides the common ancestor.
fn pod_uid_of<'a>(component: &'a str, parent: Option<&str>) -> Option<&'a str> {
    if let Some(stem) = component.strip_suffix(".slice") {
        let split = stem.len().checked_sub(UUID_LEN)?;
        let uid = stem.get(split..)?;
        let ancestors = stem.get(..split)?.strip_suffix("-pod")?;
        let under_kubepods = ancestors.split('-').any(|a| a == "kubepods");
        return (under_kubepods && is_uuid(uid)).then_some(uid);
    }
    let uid = component.strip_prefix("pod")?;
    let parent_ok = parent
        .is_some_and(|p| p.ends_with("kubepods") || matches!(p, "burstable" | "besteffort" | ".."));
    (parent_ok && is_uuid(uid)).then_some(uid)
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

const UUID_LEN: usize = 36;

/// 8-4-4-4-12 hex. Either separator is accepted because systemd escapes `-` as `_` and
/// cgroupfs does not; hex case is kept as written so the result matches the API server's UID.
fn is_uuid(s: &str) -> bool {
    s.len() == UUID_LEN
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-' || b == b'_',
            _ => b.is_ascii_hexdigit(),
        })
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
            (
                "crio conmon",
                fixture(&format!("0::{sd_burstable}/crio-conmon-{{CID}}.scope\n")),
                None,
            ),
            (
                "crio conmon, cgroupfs",
                fixture("0::/kubepods/burstable/pod{UID}/crio-conmon-{CID}\n"),
                None,
            ),
            ("empty", String::new(), None),
            ("garbage", "hello world\n:::\n::\n\u{0}\u{ffff}:x:y\n".into(), None),
            (
                "QoS slice, no pod",
                "0::/kubepods.slice/kubepods-burstable.slice\n".into(),
                None,
            ),
            (
                "short container id",
                fixture("0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-3f9a1c2b4d5e.scope\n"),
                None,
            ),
            (
                "upper-case container id",
                fixture("0::/kubepods/pod{UID}/{CID}").replace(CID, &CID.to_uppercase()),
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
                "unknown child in the pod slice",
                fixture(&format!("0::{sd_burstable}/helper.scope\n")),
                None,
            ),
        ];
        assert!(cases.len() >= 20);
        assert!(cases.iter().filter(|c| c.2.is_none()).count() >= 6);
        for (name, text, want) in &cases {
            assert_eq!(&parse_proc_cgroup(text), want, "case {name:?}: {text:?}");
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
                is_uuid(&got.pod_uid) && !got.pod_uid.contains('_'),
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
            shape in 0usize..5,
        ) {
            let uid_ = uid.replace('-', "_");
            let (tail, runtime) = match shape {
                0 => (format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{cid}.scope"), Runtime::Containerd),
                1 => (format!("kubepods.slice/kubepods-pod{uid_}.slice/crio-{cid}.scope/container"), Runtime::Crio),
                2 => (format!("kubepods-besteffort-pod{uid_}.slice/docker-{cid}.scope"), Runtime::Docker),
                3 => (format!("kubepods/pod{uid}/{cid}"), Runtime::Unknown),
                _ => (format!("kubepods/besteffort/pod{uid}/crio-{cid}"), Runtime::Crio),
            };
            let text = format!("0::/{}/{tail}\n", prefix.join("/"));
            let want = CgroupIdentity { pod_uid: uid, container_id: Some(cid), runtime };
            prop_assert_eq!(parse_proc_cgroup(&text), Some(want));
        }
    }
}
