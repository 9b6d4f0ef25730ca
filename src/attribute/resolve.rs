//! Pure resolution of a parsed cgroup identity against the pod view.

use super::cgroup::CgroupIdentity;
use crate::model::pod::PodInfo;
use crate::model::pod::PodMap;
use crate::model::snapshot::{Owner, PodRef};

/// The annotation in which the kubelet records a static pod's config hash; the mirror pod on
/// the API server carries it, and the hash is the UID the kubelet names the pod's cgroup by.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";

/// The pod whose cgroup is named by `kubelet_uid`: the pod with that `metadata.uid`, else the
/// mirror pod whose config hash it is (a static pod, whose cgroup carries the hash while its
/// mirror on the API server has a UID of its own).
///
/// The UID wins so that an ordinary pod can never be shadowed. Only mirror pods are matched by
/// hash, so a pod that copies the annotation cannot take a static pod's memory. The hash lookup
/// is a scan, paid only for identities the UID index misses (static pods and pods the watch has
/// not delivered yet): a node holds at most a few hundred pods.
pub fn pod_by_kubelet_uid<'a>(pods: &'a PodMap, kubelet_uid: &str) -> Option<&'a PodInfo> {
    pods.get(kubelet_uid).or_else(|| {
        pods.values().find(|p| {
            p.is_mirror
                && p.annotations
                    .get(CONFIG_HASH_ANNOTATION)
                    .map(String::as_str)
                    == Some(kubelet_uid)
        })
    })
}

/// The owner of a process whose cgroup parsed to `identity` (None: not in a pod).
///
/// A pod UID missing from the view (a pod that started after the last watch event) gives
/// a `PodRef` with empty names: its memory still counts, it is never an eviction
/// candidate, and the next poll resolves it once the watch catches up. A container ID that
/// matches no container of the pod (a restart the watch has not seen yet) gives the pod
/// with an empty container name, and so does a pod-level identity (a process in the pod's
/// cgroup but in no container's). A static pod resolves through its mirror pod.
pub fn owner_of(identity: Option<&CgroupIdentity>, pods: &PodMap) -> Owner {
    let Some(id) = identity else {
        return Owner::Host;
    };
    match pod_by_kubelet_uid(pods, &id.pod_uid) {
        None => Owner::Pod(PodRef {
            namespace: String::new(),
            pod: String::new(),
            container: String::new(),
            uid: id.pod_uid.clone(),
        }),
        Some(p) => Owner::Pod(PodRef {
            namespace: p.namespace.clone(),
            pod: p.name.clone(),
            container: id
                .container_id
                .as_deref()
                .and_then(|c| p.container_by_id(c))
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            uid: p.uid.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::cgroup::Runtime;
    use crate::model::pod::{ContainerInfo, PodInfo};

    fn pods() -> PodMap {
        let p = PodInfo {
            uid: "u1".into(),
            namespace: "ci".into(),
            name: "job".into(),
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
                container_id: Some("c1".into()),
                image: None,
                gpu: false,
            }],
        };
        let mut mirror = p.clone();
        mirror.uid = "mirror-uid".into();
        mirror.namespace = "kube-system".into();
        mirror.name = "trainer-node1".into();
        mirror.is_mirror = true;
        mirror.annotations = [
            (
                CONFIG_HASH_ANNOTATION.to_string(),
                "8daa50c3a64c9ff60bb9eab7b44b56fd".to_string(),
            ),
            (
                "kubernetes.io/config.mirror".to_string(),
                "8daa50c3a64c9ff60bb9eab7b44b56fd".to_string(),
            ),
        ]
        .into_iter()
        .collect();
        let mut copycat = p.clone();
        copycat.uid = "copycat-uid".into();
        copycat.name = "copycat".into();
        copycat.annotations = [(
            CONFIG_HASH_ANNOTATION.to_string(),
            "0123456789abcdef0123456789abcdef".to_string(),
        )]
        .into_iter()
        .collect();
        [
            ("u1".to_string(), p),
            ("mirror-uid".to_string(), mirror),
            ("copycat-uid".to_string(), copycat),
        ]
        .into_iter()
        .collect()
    }

    fn id(uid: &str, cid: Option<&str>) -> CgroupIdentity {
        CgroupIdentity {
            pod_uid: uid.into(),
            container_id: cid.map(String::from),
            runtime: Runtime::Containerd,
        }
    }

    #[test]
    fn resolves_pod_and_container() {
        match owner_of(Some(&id("u1", Some("c1"))), &pods()) {
            Owner::Pod(r) => assert_eq!(
                (r.namespace.as_str(), r.pod.as_str(), r.container.as_str()),
                ("ci", "job", "build")
            ),
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn unknown_container_and_unknown_pod() {
        match owner_of(Some(&id("u1", Some("restarted"))), &pods()) {
            Owner::Pod(r) => assert_eq!((r.pod.as_str(), r.container.as_str()), ("job", "")),
            o => panic!("{o:?}"),
        }
        match owner_of(Some(&id("u9", None)), &pods()) {
            Owner::Pod(r) => assert_eq!((r.uid.as_str(), r.pod.as_str()), ("u9", "")),
            o => panic!("{o:?}"),
        }
        assert_eq!(owner_of(None, &pods()), Owner::Host);
    }

    #[test]
    fn static_pods_resolve_through_their_mirror() {
        let hash = "8daa50c3a64c9ff60bb9eab7b44b56fd";
        match owner_of(Some(&id(hash, Some("c1"))), &pods()) {
            Owner::Pod(r) => assert_eq!(
                (
                    r.namespace.as_str(),
                    r.pod.as_str(),
                    r.container.as_str(),
                    r.uid.as_str()
                ),
                ("kube-system", "trainer-node1", "build", "mirror-uid")
            ),
            o => panic!("{o:?}"),
        }
        // A non-mirror pod carrying the annotation is not matched by it.
        match owner_of(Some(&id("0123456789abcdef0123456789abcdef", None)), &pods()) {
            Owner::Pod(r) => assert_eq!(r.pod, "", "{r:?}"),
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn pod_level_identity_names_the_pod_not_a_container() {
        match owner_of(Some(&id("u1", None)), &pods()) {
            Owner::Pod(r) => assert_eq!(
                (r.namespace.as_str(), r.pod.as_str(), r.container.as_str()),
                ("ci", "job", "")
            ),
            o => panic!("{o:?}"),
        }
    }
}
