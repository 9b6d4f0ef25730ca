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
}

/// A container's resources.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerView {
    /// `resources`.
    #[serde(default)]
    pub resources: Option<Resources>,
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

    /// Whether a container asks for `resource` (in limits or requests).
    pub fn requests_resource(&self, resource: &str) -> bool {
        let containers = self.spec.as_ref().and_then(|s| s.containers.as_deref());
        containers.unwrap_or_default().iter().any(|c| {
            c.resources.as_ref().is_some_and(|r| {
                [&r.limits, &r.requests]
                    .into_iter()
                    .flatten()
                    .any(|m| m.contains_key(resource))
            })
        })
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
    fn null_fields_as_go_sends_them() {
        let a: ExtenderArgs = serde_json::from_str(
            r#"{"Pod":{"metadata":{"name":"p","labels":null}},"Nodes":null,"NodeNames":null}"#,
        )
        .unwrap();
        assert!(a.nodes.is_none() && a.node_names.is_none());
        assert!(a.pod.unwrap().labels().is_empty());
    }
}
