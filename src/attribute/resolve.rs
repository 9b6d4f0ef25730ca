//! Pure resolution of a parsed cgroup identity against the pod view.

use super::cgroup::CgroupIdentity;
use super::pods::PodMap;
use crate::snapshot::{Owner, PodRef};

/// The owner of a process whose cgroup parsed to `identity` (None: not in a pod).
///
/// A pod UID missing from the view (a pod that started after the last watch event) gives
/// a `PodRef` with empty names: its memory still counts, it is never an eviction
/// candidate, and the next poll resolves it once the watch catches up. A container ID that
/// matches no container of the pod (a restart the watch has not seen yet) gives the pod
/// with an empty container name.
pub fn owner_of(identity: Option<&CgroupIdentity>, pods: &PodMap) -> Owner {
    let Some(id) = identity else {
        return Owner::Host;
    };
    match pods.get(&id.pod_uid) {
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
    use crate::pod::{ContainerInfo, PodInfo};

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
            containers: vec![ContainerInfo {
                name: "build".into(),
                container_id: Some("c1".into()),
            }],
        };
        [("u1".to_string(), p)].into_iter().collect()
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
}
