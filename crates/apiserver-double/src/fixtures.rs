//! Fixture files and kubeconfig generation.

use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::Error;

/// Objects to seed a server with, as read from a YAML (or JSON) file:
///
/// ```yaml
/// nodes:
///   - metadata: {name: gpu-node-1, labels: {nvidia.com/gpu.present: "true"}}
/// pods:
///   - metadata: {name: job-1, namespace: ci, uid: 3f6c…}
///     spec: {nodeName: gpu-node-1, containers: [{name: main, image: cuda}]}
/// ```
///
/// Both lists are optional; each entry is a full object as the API would return it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixtures {
    /// Pods, created in order after the nodes.
    #[serde(default)]
    pub pods: Vec<Value>,
    /// Nodes, created in order.
    #[serde(default)]
    pub nodes: Vec<Value>,
}

impl Fixtures {
    /// Parses fixtures from YAML text (JSON is YAML too).
    pub fn from_yaml(text: &str) -> Result<Self, Error> {
        if text.trim().is_empty() {
            return Ok(Fixtures::default());
        }
        serde_yaml_ng::from_str(text).map_err(|e| Error::Fixtures(e.to_string()))
    }

    /// Reads and parses a fixtures file.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text).map_err(|e| Error::Fixtures(format!("{}: {e}", path.display())))
    }
}

/// A kubeconfig whose current context points at `url` with no credentials.
pub(crate) fn kubeconfig_yaml(url: &str) -> String {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "apiserver-double", "cluster": {"server": url}}],
        "users": [{"name": "apiserver-double", "user": {}}],
        "contexts": [{
            "name": "apiserver-double",
            "context": {"cluster": "apiserver-double", "user": "apiserver-double", "namespace": "default"}
        }],
        "current-context": "apiserver-double",
        "preferences": {}
    });
    // serializing a json! value cannot fail; fall back to JSON (also valid YAML) regardless
    serde_yaml_ng::to_string(&doc).unwrap_or_else(|_| doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fixtures() {
        let f = Fixtures::from_yaml(
            "nodes:\n  - metadata: {name: n1}\npods:\n  - metadata: {name: p1, namespace: ci}\n    spec: {nodeName: n1}\n",
        )
        .unwrap();
        assert_eq!(f.nodes.len(), 1);
        assert_eq!(f.pods[0]["spec"]["nodeName"], "n1");
        assert_eq!(Fixtures::from_yaml("").unwrap(), Fixtures::default());
        assert!(Fixtures::from_yaml("pods: 3").is_err());
        assert!(Fixtures::from_yaml("podz: []").is_err());
    }

    #[test]
    fn kubeconfig_mentions_the_url() {
        let y = kubeconfig_yaml("http://127.0.0.1:1234");
        assert!(y.contains("server: http://127.0.0.1:1234"), "{y}");
        assert!(y.contains("current-context: apiserver-double"), "{y}");
    }
}
