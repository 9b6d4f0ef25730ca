//! Objects from JSON the agent already holds (the simulator's pods, test fixtures), decoded
//! from text as kube decodes the API server's answers (`serde_json::from_str`, in
//! kube-client's `Client::request`), so the deserializer compiled for the calls is the one
//! used: no second one for `serde_json::Value`, hundreds of KiB for a Pod. Pure: no call.

use k8s_openapi::api::core::v1::Pod;

/// A Pod from its JSON object.
pub fn pod(object: &serde_json::Value) -> serde_json::Result<Pod> {
    serde_json::from_str(&object.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pod_and_a_refusal() {
        let p = super::pod(&serde_json::json!({"metadata": {"name": "p", "uid": "u"}})).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("p"));
        assert!(super::pod(&serde_json::json!({"metadata": "not an object"})).is_err());
    }
}
