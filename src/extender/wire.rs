//! kube-scheduler's extender wire types (`k8s.io/kube-scheduler/extender/v1`), as Go's
//! `encoding/json` writes them: the Go types carry no JSON tags, so the keys are the Go
//! field names (`Pod`, `Nodes`, `NodeNames`, `FailedNodes`, …). Go's decoder matches keys
//! case-insensitively, so the lower-case spellings are accepted on the way in too (upstream's
//! own compatibility test round-trips lower-cased JSON).
//!
//! Only what gpu-warden reads of the pod is typed; nodes (sent in full when the extender is
//! not `nodeCacheCapable`) stay raw JSON so a filter reply can hand them back untouched.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The highest score a prioritize reply may give (`extenderv1.MaxExtenderPriority`).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// The body of a `filter` or `prioritize` call.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<PodView>,
    /// Candidate nodes as full objects (`nodeCacheCapable: false`), else `null`.
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names (`nodeCacheCapable: true`), else `null`.
    #[serde(
        rename = "NodeNames",
        alias = "nodenames",
        alias = "nodeNames",
        default
    )]
    pub node_names: Option<Vec<String>>,
}

/// A `v1.NodeList`; its items are kept as sent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct NodeList {
    /// `metadata` of the list (empty from the scheduler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The nodes.
    #[serde(default)]
    pub items: Vec<Value>,
}

/// What the extender reads of a `v1.Pod`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodView {
    /// `metadata`.
    #[serde(default)]
    pub metadata: PodMeta,
    /// `spec` (Go writes `{"containers":null}` for an empty one).
    #[serde(default)]
    pub spec: Option<PodSpecView>,
}

/// The pod's `metadata` fields the extender uses.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMeta {
    /// `metadata.name`.
    #[serde(default)]
    pub name: String,
    /// `metadata.namespace` (absent means `default`, as in the API).
    #[serde(default)]
    pub namespace: Option<String>,
    /// `metadata.uid`.
    #[serde(default)]
    pub uid: Option<String>,
    /// `metadata.labels`.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// `metadata.annotations`.
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The pod's `spec` fields the extender uses.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodSpecView {
    /// `spec.containers` (`null` in Go's output of an empty spec).
    #[serde(default)]
    pub containers: Option<Vec<ContainerView>>,
    /// `spec.initContainers`: a GPU asked for only here is still allocated by the kubelet.
    #[serde(rename = "initContainers", alias = "initcontainers", default)]
    pub init_containers: Option<Vec<ContainerView>>,
}

/// A container's resources.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerView {
    /// `image`: the CUDA check reads a need from a documented tag (docs/cuda.md).
    #[serde(default)]
    pub image: Option<String>,
    /// `resources`.
    #[serde(default)]
    pub resources: Option<Resources>,
    /// `restartPolicy` of an init container: `Always` makes it a sidecar, running beside the
    /// app containers (its request adds to theirs).
    #[serde(rename = "restartPolicy", alias = "restartpolicy", default)]
    pub restart_policy: Option<String>,
}

impl ContainerView {
    /// How many units of `resource` the container asks for: its request, else its limit
    /// (for an extended resource the API defaults the request to the limit); 0 when neither.
    pub fn units(&self, resource: &str) -> u64 {
        let Some(r) = self.resources.as_ref() else {
            return 0;
        };
        let q = r
            .requests
            .as_ref()
            .and_then(|m| m.get(resource))
            .or_else(|| r.limits.as_ref().and_then(|m| m.get(resource)));
        match q {
            None => 0,
            Some(Value::Number(n)) => n.as_u64().unwrap_or(1),
            // Extended resources are whole numbers (the API rejects anything else); an
            // unreadable one still asks for the resource, so it counts as one.
            Some(Value::String(s)) => s.trim().parse::<u64>().unwrap_or(1),
            Some(_) => 1,
        }
    }
}

/// `resources.limits` / `resources.requests` (quantities as strings).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Resources {
    /// `limits`.
    #[serde(default)]
    pub limits: Option<BTreeMap<String, Value>>,
    /// `requests`.
    #[serde(default)]
    pub requests: Option<BTreeMap<String, Value>>,
}

impl PodView {
    /// `namespace/name`, the key the ledger and the logs use.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.metadata.name)
    }

    /// The namespace, `default` when unset.
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// The labels (empty when none).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata.labels.clone().unwrap_or_default()
    }

    /// One annotation.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    /// Whether a container (init containers included) asks for `resource`.
    pub fn requests_resource(&self, resource: &str) -> bool {
        self.units(resource) > 0
    }

    /// The pod's effective request of `resource`, as the kubelet and the scheduler count it
    /// (kubernetes `k8s.io/component-helpers/resource.PodRequests`): the larger of (a) the
    /// app containers' sum plus the sidecars' (init containers with `restartPolicy: Always`)
    /// and (b) each regular init container's request plus the sidecars started before it.
    pub fn units(&self, resource: &str) -> u64 {
        let Some(spec) = self.spec.as_ref() else {
            return 0;
        };
        let mut sidecars = 0u64;
        let mut init_max = 0u64;
        for c in spec.init_containers.as_deref().unwrap_or_default() {
            let u = c.units(resource);
            if c.restart_policy.as_deref() == Some("Always") {
                sidecars += u;
                init_max = init_max.max(sidecars);
            } else {
                init_max = init_max.max(sidecars + u);
            }
        }
        let app: u64 = spec
            .containers
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|c| c.units(resource))
            .sum();
        (app + sidecars).max(init_max)
    }
}

/// The reply to `filter` (`ExtenderFilterResult`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ExtenderFilterResult {
    /// The feasible nodes as full objects, when they came as full objects.
    #[serde(rename = "Nodes")]
    pub nodes: Option<NodeList>,
    /// The feasible node names, when they came as names.
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<String>>,
    /// Node → why the pod does not fit there (preemption may still help).
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: BTreeMap<String, String>,
    /// Node → why the pod cannot go there and preemption would not help.
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable: BTreeMap<String, String>,
    /// A whole-call error; empty on success.
    #[serde(rename = "Error")]
    pub error: String,
}

/// One entry of a prioritize reply (`HostPriority`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// The node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// 0..=[`MAX_EXTENDER_PRIORITY`].
    #[serde(rename = "Score")]
    pub score: i64,
}

/// Node name of a raw node object (`metadata.name`).
pub fn node_name(node: &Value) -> Option<&str> {
    node.get("metadata")?.get("name")?.as_str()
}

/// The annotations of a raw node object.
pub fn node_annotations(node: &Value) -> BTreeMap<String, String> {
    node.get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Go's encoding/json output of extenderv1 types, verbatim from upstream's compatibility
    // test: kubernetes/kubernetes, staging/src/k8s.io/kube-scheduler/extender/v1/types_test.go
    // (commit 9891f82d816be0f7ee3ff1eb080089737ad596c9), TestCompatibility.
    const UPSTREAM_ARGS: &str = r#"{"Pod":{"metadata":{"name":"podname","creationTimestamp":null},"spec":{"containers":null},"status":{}},"Nodes":{"metadata":{},"items":[{"metadata":{"name":"nodename","creationTimestamp":null},"spec":{},"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}}]},"NodeNames":["node1"]}"#;
    const UPSTREAM_HOST_PRIORITY: &str = r#"{"Host":"myhost","Score":1}"#;

    #[test]
    fn reads_upstreams_extender_args() {
        let a: ExtenderArgs = serde_json::from_str(UPSTREAM_ARGS).unwrap();
        let pod = a.pod.unwrap();
        assert_eq!(pod.metadata.name, "podname");
        assert_eq!(pod.key(), "default/podname");
        assert!(!pod.requests_resource("nvidia.com/gpu"));
        let nodes = a.nodes.unwrap();
        assert_eq!(node_name(&nodes.items[0]), Some("nodename"));
        assert_eq!(a.node_names.unwrap(), vec!["node1".to_string()]);
        // Go's decoder ignores case; upstream round-trips lower-cased JSON.
        let lower: ExtenderArgs = serde_json::from_str(&UPSTREAM_ARGS.to_lowercase()).unwrap();
        assert_eq!(lower.node_names.unwrap(), vec!["node1".to_string()]);
    }

    #[test]
    fn writes_what_go_writes() {
        let hp = HostPriority {
            host: "myhost".into(),
            score: 1,
        };
        assert_eq!(serde_json::to_string(&hp).unwrap(), UPSTREAM_HOST_PRIORITY);
        let r = ExtenderFilterResult {
            node_names: Some(vec!["node1".into()]),
            failed_nodes: BTreeMap::from([("foo".into(), "bar".into())]),
            error: "myerror".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"Nodes":null,"NodeNames":["node1"],"FailedNodes":{"foo":"bar"},"FailedAndUnresolvableNodes":{},"Error":"myerror"}"#
        );
    }

    #[test]
    fn gpus_counted_as_the_kubelet_counts_them() {
        let pod = |spec: Value| -> PodView {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
                .unwrap()
        };
        let gpu = |n: Value| serde_json::json!({"resources": {"limits": {"nvidia.com/gpu": n}}});
        let cases = [
            (serde_json::json!({"containers": [gpu("1".into())]}), 1),
            (
                serde_json::json!({"containers": [gpu("2".into()), gpu(1.into())]}),
                3,
            ),
            // A GPU asked for by an init container only is allocated all the same.
            (
                serde_json::json!({"containers": [{}], "initContainers": [gpu("1".into())]}),
                1,
            ),
            // A regular init container runs before the app containers: the larger counts.
            (
                serde_json::json!({"containers": [gpu("1".into())], "initContainers": [gpu("2".into())]}),
                2,
            ),
            // A sidecar (restartPolicy: Always) runs beside them: it adds.
            (
                serde_json::json!({"containers": [gpu("1".into())], "initContainers": [
                {"restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}),
                2,
            ),
            (
                serde_json::json!({"containers": [{"resources": {"limits": {"cpu": "1"}}}]}),
                0,
            ),
            (serde_json::json!({"containers": null}), 0),
        ];
        for (i, (spec, want)) in cases.into_iter().enumerate() {
            let p = pod(spec);
            assert_eq!(p.units("nvidia.com/gpu"), want, "case {i}");
            assert_eq!(p.requests_resource("nvidia.com/gpu"), want > 0, "case {i}");
        }
    }

    #[test]
    fn null_fields_as_go_sends_them() {
        let a: ExtenderArgs = serde_json::from_str(
            r#"{"Pod":{"metadata":{"name":"p","labels":null}},"Nodes":null,"NodeNames":null}"#,
        )
        .unwrap();
        assert!(a.nodes.is_none() && a.node_names.is_none());
        assert!(a.pod.unwrap().labels().is_empty());
    }
}
