//! `coordination.k8s.io/v1` Leases through the real kube client: create, get, optimistic
//! update (409 on a stale resourceVersion, as the API server's generic registry answers),
//! list and watch.

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use apiserver_double::{ApiServer, Method};
use common::{api_code, client};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::ResourceExt;

fn lease(name: &str, holder: &str, secs: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(secs),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_update_with_optimistic_concurrency() {
    let server = ApiServer::start().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client(&server), "gpu-warden");
    let pp = PostParams::default();

    let created = leases
        .create(&pp, &lease("gpu-1", "agent-a", 60))
        .await
        .unwrap();
    let rv1 = created.resource_version().unwrap();
    assert!(created.uid().is_some(), "the server assigns a uid");
    assert_eq!(created.namespace().as_deref(), Some("gpu-warden"));

    let again = leases.create(&pp, &lease("gpu-1", "agent-b", 60)).await;
    assert_eq!(
        again.as_ref().err().and_then(api_code),
        Some(409),
        "{again:?}"
    );

    let got = leases.get("gpu-1").await.unwrap();
    assert_eq!(got.resource_version().as_deref(), Some(rv1.as_str()));

    // An update at the current resourceVersion goes through and moves it.
    let mut renewed = got.clone();
    renewed.spec.as_mut().unwrap().lease_duration_seconds = Some(40);
    let after = leases.replace("gpu-1", &pp, &renewed).await.unwrap();
    let rv2 = after.resource_version().unwrap();
    assert_ne!(rv1, rv2);
    assert_eq!(after.uid(), created.uid(), "the uid is the server's");
    assert_eq!(after.spec.unwrap().lease_duration_seconds, Some(40));

    // The same body again carries the old resourceVersion: 409, and nothing changes.
    let stale = leases.replace("gpu-1", &pp, &renewed).await;
    assert_eq!(
        stale.as_ref().err().and_then(api_code),
        Some(409),
        "{stale:?}"
    );
    let now = server.lease("gpu-warden", "gpu-1").unwrap();
    assert_eq!(now["metadata"]["resourceVersion"], rv2.as_str());

    // No resourceVersion: an unconditional update (the Lease strategy allows it).
    let mut blind = lease("gpu-1", "agent-c", 60);
    blind.metadata.resource_version = None;
    let b = leases.replace("gpu-1", &pp, &blind).await.unwrap();
    assert_eq!(b.spec.unwrap().holder_identity.as_deref(), Some("agent-c"));

    // Updating a Lease that does not exist is a 404, not a create.
    let missing = leases.replace("gpu-2", &pp, &lease("gpu-2", "x", 60)).await;
    assert_eq!(missing.as_ref().err().and_then(api_code), Some(404));
    let wrong_name = leases.replace("gpu-1", &pp, &lease("gpu-9", "x", 60)).await;
    assert_eq!(wrong_name.as_ref().err().and_then(api_code), Some(400));
    let bad = leases.create(&pp, &lease("gpu-3", "x", 0)).await;
    assert_eq!(bad.as_ref().err().and_then(api_code), Some(422));

    let puts = server
        .requests()
        .iter()
        .filter(|r| r.method == Method::PUT && r.path.ends_with("/leases/gpu-1"))
        .count();
    // The update, the stale one, the unconditional one and the one naming another Lease.
    assert_eq!(puts, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_watch_by_namespace() {
    let server = ApiServer::start().await.unwrap();
    let c = client(&server);
    let ours: Api<Lease> = Api::namespaced(c.clone(), "gpu-warden");
    let theirs: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let pp = PostParams::default();
    ours.create(&pp, &lease("gpu-1", "a", 60)).await.unwrap();
    theirs
        .create(&pp, &lease("gpu-1", "kubelet", 40))
        .await
        .unwrap();

    let list = ours.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let all: Api<Lease> = Api::all(c.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );

    let rv = list.metadata.resource_version.unwrap();
    let mut stream = ours
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let mut l = ours.get("gpu-1").await.unwrap();
    l.spec.as_mut().unwrap().holder_identity = Some("b".into());
    ours.replace("gpu-1", &pp, &l).await.unwrap();
    theirs.delete("gpu-1", &Default::default()).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Modified(l) => {
            assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("b"))
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }
}
