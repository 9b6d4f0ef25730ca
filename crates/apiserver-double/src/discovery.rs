//! Discovery: `/version`, `/api`, `/apis` and the resource lists a client may read.

use serde_json::{json, Value};

use crate::state::Shared;

pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub(crate) fn api_versions(shared: &Shared) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}]
    })
}

pub(crate) fn api_groups() -> Value {
    let group = |name: &str| {
        let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
        json!({"name": name, "versions": [gv.clone()], "preferredVersion": gv})
    };
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group("events.k8s.io"), group("policy"), group("coordination.k8s.io")]})
}

fn resource(name: &str, singular: &str, kind: &str, verbs: &[&str]) -> Value {
    json!({"name": name, "singularName": singular, "namespaced": kind != "Node", "kind": kind, "verbs": verbs})
}

pub(crate) fn core_resources() -> Value {
    let mut eviction = resource("pods/eviction", "", "Eviction", &["create"]);
    eviction["group"] = json!("policy");
    eviction["version"] = json!("v1");
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            resource("pods", "pod", "Pod", &["get", "list", "watch"]),
            eviction,
            resource("nodes", "node", "Node", &["get", "list", "watch", "patch"]),
            resource("events", "event", "Event", &["create", "get", "list", "patch"]),
        ]
    })
}

pub(crate) fn events_resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "events.k8s.io/v1",
        "resources": [resource("events", "event", "Event", &["create", "get", "list", "patch"])]
    })
}

pub(crate) fn policy_resources() -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "policy/v1", "resources": []})
}
