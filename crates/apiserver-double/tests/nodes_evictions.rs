//! Node annotation patches and pod evictions through the real kube client.

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apiserver_double::{ApiServer, EvictionOutcome, RecordedBody};
use common::{api_code, client, eventually, no_retry_client, pod};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube::ResourceExt;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(5);

fn node(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"}
        },
        "status": {"capacity": {"nvidia.com/gpu": "4"}}
    })
}

fn annotations_patch(pairs: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"metadata": {"annotations": pairs}}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_patches_touch_only_the_given_annotations() {
    let server = ApiServer::start().await.unwrap();
    server.add_node(node("gpu-1")).unwrap();
    let nodes: Api<Node> = Api::all(client(&server));
    let pp = PatchParams::default();

    let n = nodes
        .patch(
            "gpu-1",
            &pp,
            &annotations_patch(json!({"gpu-warden.io/vram-free-mib": "1024", "gpu-warden.io/vram-max-free-mib": "512"})),
        )
        .await
        .unwrap();
    let rv1 = n.resource_version().unwrap();
    assert_eq!(n.annotations()["gpu-warden.io/vram-free-mib"], "1024");
    assert_eq!(
        n.annotations()["node.alpha.kubernetes.io/ttl"],
        "0",
        "other owners' annotations survive"
    );
    assert_eq!(
        n.labels()["nvidia.com/gpu.present"],
        "true",
        "labels survive"
    );

    // a foreign writer in between
    assert!(server.set_node_annotation("gpu-1", "other-team.io/owner", "ml"));
    let n = nodes
        .patch(
            "gpu-1",
            &pp,
            &annotations_patch(json!({"gpu-warden.io/vram-free-mib": "768", "gpu-warden.io/vram-max-free-mib": null})),
        )
        .await
        .unwrap();
    let a = n.annotations().clone();
    assert_eq!(a["gpu-warden.io/vram-free-mib"], "768");
    assert!(
        !a.contains_key("gpu-warden.io/vram-max-free-mib"),
        "null removes a key"
    );
    assert_eq!(
        a["other-team.io/owner"], "ml",
        "the foreign annotation survives"
    );
    assert_eq!(a["node.alpha.kubernetes.io/ttl"], "0");
    assert!(n.resource_version().unwrap().parse::<u64>().unwrap() > rv1.parse::<u64>().unwrap());
    assert_eq!(
        n.status.unwrap().capacity.unwrap()["nvidia.com/gpu"].0,
        "4",
        "status untouched"
    );

    // the stored node is what the client got back
    let stored = server.node("gpu-1").unwrap();
    assert_eq!(
        stored["metadata"]["annotations"]["other-team.io/owner"],
        "ml"
    );
    assert_eq!(nodes.get("gpu-1").await.unwrap().annotations(), &a);

    // strategic merge patch: same map semantics
    let n = nodes
        .patch(
            "gpu-1",
            &pp,
            &Patch::Strategic(json!({"metadata": {"annotations": {"gpu-warden.io/vram": "{}"}}})),
        )
        .await
        .unwrap();
    assert_eq!(n.annotations()["gpu-warden.io/vram"], "{}");
    assert_eq!(n.annotations()["other-team.io/owner"], "ml");

    // what went over the wire
    let patches: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(patches.len(), 3);
    assert_eq!(patches[0].path, "/api/v1/nodes/gpu-1");
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        patches[2].content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    assert_eq!(
        patches[1].body,
        RecordedBody::Json(
            json!({"metadata": {"annotations": {"gpu-warden.io/vram-free-mib": "768", "gpu-warden.io/vram-max-free-mib": null}}})
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_patch_unsupported_types_missing_nodes_and_conflicts() {
    let server = ApiServer::start().await.unwrap();
    server.add_node(node("gpu-1")).unwrap();
    let c = client(&server);
    let nodes: Api<Node> = Api::all(c.clone());

    // RFC 6902, sent raw (kube's Patch::Json needs its `jsonpatch` feature)
    let req = http::Request::patch("/api/v1/nodes/gpu-1")
        .header("content-type", "application/json-patch+json")
        .body(
            serde_json::to_vec(&json!([
                {"op": "test", "path": "/metadata/annotations/node.alpha.kubernetes.io~1ttl", "value": "0"},
                {"op": "add", "path": "/metadata/annotations/gpu-warden.io~1vram-free-mib", "value": "100"},
                {"op": "remove", "path": "/metadata/annotations/node.alpha.kubernetes.io~1ttl"}
            ]))
            .unwrap(),
        )
        .unwrap();
    let n: Node = c.request(req).await.unwrap();
    assert_eq!(n.annotations().len(), 1);
    assert_eq!(n.annotations()["gpu-warden.io/vram-free-mib"], "100");
    let failing = http::Request::patch("/api/v1/nodes/gpu-1")
        .header("content-type", "application/json-patch+json")
        .body(br#"[{"op":"test","path":"/metadata/name","value":"other"}]"#.to_vec())
        .unwrap();
    let err = c.request::<Node>(failing).await.unwrap_err();
    assert_eq!(api_code(&err), Some(422));

    // server-side apply is not served
    let err = nodes
        .patch(
            "gpu-1",
            &PatchParams::apply("gpu-warden"),
            &Patch::Apply(json!({"metadata": {"name": "gpu-1"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(415));

    let err = nodes
        .patch(
            "nope",
            &PatchParams::default(),
            &annotations_patch(json!({"a": "b"})),
        )
        .await
        .unwrap_err();
    match &err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.reason, "NotFound");
        }
        other => panic!("expected a 404 Status, got {other:?}"),
    }

    // a merge patch carrying a stale resourceVersion is a 409 Conflict
    let err = nodes
        .patch(
            "gpu-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
}

fn eviction(name: &str, ns: &str, grace: i64) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            ..Default::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(grace),
            ..Default::default()
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instant_kubelet_marks_then_deletes_after_grace_times_scale_and_runs_the_hook() {
    // The instant comparison (`eviction_grace_scale`), not a real node: tests/kubelet.rs
    // has the faithful kubelet every guard test uses.
    let server = ApiServer::builder()
        .eviction_grace_scale(0.0)
        .start()
        .await
        .unwrap();
    let p = server.add_pod(pod("ci", "job-1", "n1", json!({}))).unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let evicted = Arc::new(Mutex::new(Vec::new()));
    let seen = evicted.clone();
    server.on_evict(Box::new(move |pod: &serde_json::Value| {
        seen.lock()
            .unwrap()
            .push(pod["metadata"]["uid"].as_str().unwrap_or("").to_string());
    }) as apiserver_double::EvictHook);

    let pods: Api<Pod> = Api::namespaced(no_retry_client(&server), "ci");
    let status: Status = pods
        .create_subresource(
            "eviction",
            "job-1",
            &PostParams::default(),
            &eviction("job-1", "ci", 5),
        )
        .await
        .unwrap();
    assert_eq!(status.code, 201);
    assert!(status.is_success());
    // scale 0: deleted promptly, hook fired with the pod
    assert!(eventually(WAIT, || async { server.pod("ci", "job-1").is_none() }).await);
    assert!(eventually(WAIT, || async { evicted.lock().unwrap().len() == 1 }).await);
    assert_eq!(evicted.lock().unwrap()[0], uid);
    let ev = server.evictions();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].namespace.as_str(), ev[0].name.as_str()),
        ("ci", "job-1")
    );
    assert_eq!(ev[0].grace_period_seconds, Some(5));
    assert_eq!(ev[0].body["kind"], "Eviction");
    assert_eq!(ev[0].body["apiVersion"], "policy/v1");

    // with a real-time grace (5 s × 0.05 = 250 ms) the pod terminates first, then goes
    server.set_eviction_grace_scale(0.05);
    server.add_pod(pod("ci", "job-2", "n1", json!({}))).unwrap();
    let t0 = Instant::now();
    let _: Status = pods
        .create_subresource(
            "eviction",
            "job-2",
            &PostParams::default(),
            &eviction("job-2", "ci", 5),
        )
        .await
        .unwrap();
    let terminating = server
        .pod("ci", "job-2")
        .expect("still there during its grace period");
    assert!(terminating["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 5);
    assert!(eventually(WAIT, || async { server.pod("ci", "job-2").is_none() }).await);
    assert!(
        t0.elapsed() >= Duration::from_millis(240),
        "{:?}",
        t0.elapsed()
    );
    assert!(eventually(WAIT, || async { evicted.lock().unwrap().len() == 2 }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdb_blocked_eviction_comes_back_fast_without_default_retry() {
    let server = ApiServer::start().await.unwrap();
    server
        .add_pod(pod("ci", "guarded", "n1", json!({})))
        .unwrap();
    server.protect_pod("ci", "guarded");
    let pods: Api<Pod> = Api::namespaced(no_retry_client(&server), "ci");

    let t0 = Instant::now();
    let err = pods
        .create_subresource::<_, Status>(
            "eviction",
            "guarded",
            &PostParams::default(),
            &eviction("guarded", "ci", 5),
        )
        .await
        .unwrap_err();
    let took = t0.elapsed();
    eprintln!("PDB 429 with default_retry=false came back in {took:?}");
    assert!(
        took < Duration::from_secs(1),
        "429 must come back at once, took {took:?}"
    );
    match &err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 429);
            assert_eq!(s.reason, "TooManyRequests");
            assert_eq!(
                s.message,
                "Cannot evict pod as it would violate the pod's disruption budget."
            );
            let causes = s.details.as_ref().unwrap().causes.clone();
            assert_eq!(causes[0].reason, "DisruptionBudget");
        }
        other => panic!("expected a 429 Status, got {other:?}"),
    }
    assert!(
        server.pod("ci", "guarded").is_some(),
        "a blocked eviction deletes nothing"
    );
    assert!(server.evictions().is_empty());
    assert_eq!(
        server.eviction_attempts()[0].outcome,
        EvictionOutcome::Blocked
    );

    // missing pod: 404
    let err = pods
        .create_subresource::<_, Status>(
            "eviction",
            "gone",
            &PostParams::default(),
            &eviction("gone", "ci", 5),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(404));
    assert_eq!(
        server.eviction_attempts()[1].outcome,
        EvictionOutcome::NotFound
    );

    // kube 5's default client retries the PDB 429 (DESIGN §4): it does not come back in 1.5 s
    server.clear_requests();
    let default_pods: Api<Pod> = Api::namespaced(client(&server), "ci");
    let res = tokio::time::timeout(
        Duration::from_millis(1500),
        default_pods.create_subresource::<_, Status>(
            "eviction",
            "guarded",
            &PostParams::default(),
            &eviction("guarded", "ci", 5),
        ),
    )
    .await;
    assert!(res.is_err(), "the default client is still retrying");
    let posts = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .count();
    eprintln!("default client: {posts} eviction POSTs in 1.5 s without returning");
    assert!(
        posts >= 3,
        "the default client re-sent the eviction {posts} times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_body_traps_in_kube_5() {
    let server = ApiServer::start().await.unwrap();
    server.add_pod(pod("ci", "p", "n1", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(no_retry_client(&server), "ci");

    // create_subresource serializes `data` itself: pre-serialized bytes go out as a JSON array
    let bytes = serde_json::to_vec(&eviction("p", "ci", 5)).unwrap();
    let err = pods
        .create_subresource::<_, Status>("eviction", "p", &PostParams::default(), &bytes)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(400));
    assert!(server
        .requests()
        .last()
        .unwrap()
        .body
        .json()
        .unwrap()
        .is_array());

    // Api::evict puts the delete options under "delete_options": the grace period is lost
    let ep = EvictParams {
        delete_options: Some(DeleteParams {
            grace_period_seconds: Some(5),
            ..Default::default()
        }),
        ..Default::default()
    };
    pods.evict("p", &ep).await.unwrap();
    let body = server.evictions()[0].body.clone();
    assert!(body.get("delete_options").is_some(), "{body}");
    assert!(body.get("deleteOptions").is_none(), "{body}");
    assert_eq!(server.evictions()[0].grace_period_seconds, None);
}

/// A freeze holds an eviction; with `set_thaw_writes_after`, the thaw answers a read at once
/// and carries the held eviction out only after the delay (a server whose watch cache comes
/// back before its storage); without it, the held requests go in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thaw_can_answer_reads_before_the_writes_it_held() {
    for delay in [Duration::ZERO, Duration::from_millis(800)] {
        let server = ApiServer::start().await.unwrap();
        server
            .add_pod(pod("ci", "job", "gpu-1", json!({})))
            .unwrap();
        server.set_thaw_writes_after(delay);
        let pods: Api<Pod> = Api::namespaced(no_retry_client(&server), "ci");
        server.set_frozen(true);
        let evict = {
            let pods = pods.clone();
            tokio::spawn(async move { pods.evict("job", &EvictParams::default()).await })
        };
        // The eviction reaches the server before the read does.
        assert!(
            eventually(WAIT, || async {
                server
                    .requests()
                    .iter()
                    .any(|r| r.path.ends_with("/eviction"))
            })
            .await
        );
        let read = {
            let pods = pods.clone();
            tokio::spawn(async move { pods.get("job").await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let thawed = Instant::now();
        server.set_frozen(false);
        let got = read.await.unwrap().unwrap();
        let read_after = thawed.elapsed();
        evict.await.unwrap().unwrap();
        let evicted_after = thawed.elapsed();
        if delay.is_zero() {
            assert!(
                got.metadata.deletion_timestamp.is_some(),
                "in arrival order, the read sees the eviction: {got:?}"
            );
        } else {
            assert!(
                got.metadata.deletion_timestamp.is_none(),
                "the read came first: {got:?}"
            );
            assert!(read_after < Duration::from_millis(500), "{read_after:?}");
            assert!(evicted_after >= delay, "{evicted_after:?}");
        }
        assert_eq!(server.evictions().len(), 1);
        assert_eq!(server.evictions()[0].outcome, EvictionOutcome::Accepted);
    }
}
