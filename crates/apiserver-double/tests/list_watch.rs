//! Lists with selectors, and kube's watcher + reflector against the double.

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apiserver_double::{ApiServer, Fault, FaultAction, Method};
use common::{client, eventually, pod};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pods_with_field_and_label_selectors() {
    let server = ApiServer::start().await.unwrap();
    server
        .add_pod(pod("ci", "a", "n1", json!({"app": "gpu", "tier": "ci"})))
        .unwrap();
    server
        .add_pod(pod("ci", "b", "n2", json!({"app": "gpu", "tier": "prod"})))
        .unwrap();
    server
        .add_pod(pod("ml", "c", "n1", json!({"app": "cpu"})))
        .unwrap();
    server
        .add_pod(pod("ml", "d", "n1", json!({"app": "gpu", "tier": "prod"})))
        .unwrap();
    let c = client(&server);

    let all: Api<Pod> = Api::all(c.clone());
    let names =
        |l: kube::core::ObjectList<Pod>| l.items.iter().map(|p| p.name_any()).collect::<Vec<_>>();

    let on_n1 = all
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(names(on_n1.clone()), ["a", "c", "d"]);
    assert!(on_n1
        .metadata
        .resource_version
        .is_some_and(|rv| !rv.is_empty()));

    let lp = ListParams::default().fields("spec.nodeName=n1,metadata.namespace!=ml");
    assert_eq!(names(all.list(&lp).await.unwrap()), ["a"]);

    let lp = ListParams::default().labels("app=gpu,tier in (prod, staging)");
    assert_eq!(names(all.list(&lp).await.unwrap()), ["b", "d"]);
    let lp = ListParams::default().labels("!tier");
    assert_eq!(names(all.list(&lp).await.unwrap()), ["c"]);
    let lp = ListParams::default().labels("app!=gpu");
    assert_eq!(names(all.list(&lp).await.unwrap()), ["c"]);
    let lp = ListParams::default()
        .labels("tier")
        .fields("spec.nodeName=n1");
    assert_eq!(names(all.list(&lp).await.unwrap()), ["a", "d"]);

    let ml: Api<Pod> = Api::namespaced(c.clone(), "ml");
    assert_eq!(
        names(ml.list(&ListParams::default()).await.unwrap()),
        ["c", "d"]
    );
    let got = ml.get("d").await.unwrap();
    assert_eq!(got.spec.unwrap().node_name.as_deref(), Some("n1"));
    let err = ml.get("nope").await.unwrap_err();
    assert_eq!(common::api_code(&err), Some(404));

    // pagination: limit + continue
    let page1 = all.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(names(page1.clone()), ["a", "b", "c"]);
    let token = page1.metadata.continue_.clone().unwrap();
    let page2 = all
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(page2.clone()), ["d"]);
    assert!(page2.metadata.continue_.is_none_or(|c| c.is_empty()));

    // a bad selector is a 400, as from the API server
    let err = all
        .list(&ListParams::default().labels("a b"))
        .await
        .unwrap_err();
    assert_eq!(common::api_code(&err), Some(400));

    // the request log saw the selectors as sent
    let reqs = server.requests();
    assert!(reqs.iter().any(|r| r.path == "/api/v1/pods"
        && r.query_param("fieldSelector").as_deref() == Some("spec.nodeName=n1")));
    assert!(reqs.iter().all(|r| r.status.is_some()));
}

/// Collects the watcher's errors so the test can see the recoveries.
fn spawn_reflector(
    api: Api<Pod>,
    cfg: watcher::Config,
) -> (
    reflector::Store<Pod>,
    Arc<Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let (reader, writer) = reflector::store();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let errs = errors.clone();
    let task = tokio::spawn(async move {
        // no backoff: recover at once, to keep the test fast
        let mut stream = watcher(api, cfg).reflect(writer).boxed();
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                errs.lock().unwrap().push(format!("{e:?}"));
            }
        }
    });
    (reader, errors, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_follows_changes_and_recovers_from_drops_and_410() {
    let server = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    server
        .add_pod(pod("ci", "p1", "n1", json!({"app": "gpu"})))
        .unwrap();
    server
        .add_pod(pod("ci", "other-node", "n2", json!({"app": "gpu"})))
        .unwrap();
    // the first watch breaks after one event
    server.inject(
        Fault::new("/api/v1/pods", FaultAction::DropWatchAfter(1))
            .method(Method::GET)
            .times(1),
    );

    let api: Api<Pod> = Api::all(client(&server));
    let cfg = watcher::Config::default().fields("spec.nodeName=n1");
    let (store, errors, task) = spawn_reflector(api, cfg);
    tokio::time::timeout(WAIT, store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.state().len(), 1);
    let key = |n: &str| ObjectRef::<Pod>::new(n).within("ci");
    assert!(store.get(&key("p1")).is_some());

    // ADDED (this is the event after which the first watch is dropped)
    let p2 = server.add_pod(pod("ci", "p2", "n1", json!({}))).unwrap();
    assert!(
        eventually(WAIT, || async { store.get(&key("p2")).is_some() }).await,
        "p2 never arrived; requests {:#?}, errors {:?}",
        server
            .requests()
            .iter()
            .map(|r| (&r.path, &r.query, r.status))
            .collect::<Vec<_>>(),
        errors.lock().unwrap()
    );
    // wait for the watcher to come back on a second watch, resumed from p2's resourceVersion
    let p2_rv = p2["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        eventually(WAIT, || async {
            server.requests().iter().any(|r| {
                r.is_watch() && r.query_param("resourceVersion").as_deref() == Some(&p2_rv)
            })
        })
        .await,
        "the watcher resumes from the last resourceVersion it saw: {:#?}",
        server
            .requests()
            .iter()
            .map(|r| (&r.path, &r.query))
            .collect::<Vec<_>>()
    );
    // MODIFIED
    server.update_pod("ci", "p1", |p| {
        p["metadata"]["labels"]["phase"] = json!("two")
    });
    assert!(
        eventually(WAIT, || async {
            store
                .get(&key("p1"))
                .is_some_and(|p| p.labels().get("phase").map(String::as_str) == Some("two"))
        })
        .await
    );
    // DELETED
    server.delete_pod("ci", "p2");
    assert!(eventually(WAIT, || async { store.get(&key("p2")).is_none() }).await);
    // a pod on another node never shows up
    server
        .add_pod(pod("ci", "elsewhere", "n2", json!({})))
        .unwrap();

    let lists_before = server
        .requests()
        .iter()
        .filter(|r| !r.is_watch() && r.path == "/api/v1/pods")
        .count();
    assert_eq!(lists_before, 1, "a dropped watch is resumed, not relisted");

    // API server restart: the open watch gets 410 Gone, the watcher relists and watches again
    server.restart_history();
    server.add_pod(pod("ci", "p3", "n1", json!({}))).unwrap();
    assert!(eventually(WAIT, || async { store.get(&key("p3")).is_some() }).await);
    assert!(
        eventually(WAIT, || async {
            server
                .requests()
                .iter()
                .filter(|r| !r.is_watch() && r.path == "/api/v1/pods")
                .count()
                == 2
        })
        .await
    );
    assert!(
        errors.lock().unwrap().iter().any(|e| e.contains("410")),
        "the watcher reported the 410: {:?}",
        errors.lock().unwrap()
    );
    eprintln!("watcher errors seen: {:?}", errors.lock().unwrap());
    // the relisted store is the truth: p1 and p3 on n1
    let mut names: Vec<String> = store.state().iter().map(|p| p.name_any()).collect();
    names.sort();
    assert_eq!(names, ["p1", "p3"]);

    // what kube's watcher asked for
    let watches: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_watch())
        .collect();
    for w in &watches {
        assert_eq!(
            w.query_param("allowWatchBookmarks").as_deref(),
            Some("true")
        );
        assert_eq!(w.query_param("timeoutSeconds").as_deref(), Some("290"));
        assert_eq!(
            w.query_param("fieldSelector").as_deref(),
            Some("spec.nodeName=n1")
        );
        assert_eq!(w.status, Some(200));
    }
    let first_list = server
        .requests()
        .into_iter()
        .find(|r| !r.is_watch() && r.path == "/api/v1/pods")
        .unwrap();
    // ListSemantic::MostRecent is kube 5's default: no resourceVersion on the list
    assert_eq!(first_list.query_param("resourceVersion"), None);
    assert_eq!(first_list.query_param("resourceVersionMatch"), None);
    assert_eq!(first_list.query_param("limit").as_deref(), Some("500"));
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_watcher_gets_initial_events_and_bookmark() {
    let server = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    server
        .add_pod(pod("ci", "p1", "n1", json!({"workload-type": "gpu-ci"})))
        .unwrap();
    server.add_pod(pod("ci", "p2", "n1", json!({}))).unwrap();
    let api: Api<Pod> = Api::namespaced(client(&server), "ci");
    let cfg = watcher::Config::default()
        .labels("workload-type=gpu-ci")
        .streaming_lists();
    let (store, _errors, task) = spawn_reflector(api, cfg);
    tokio::time::timeout(WAIT, store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .state()
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>(),
        ["p1"]
    );

    // a label change moves p2 into the selection: the watch sends it as ADDED
    server.update_pod("ci", "p2", |p| {
        p["metadata"]["labels"]["workload-type"] = json!("gpu-ci")
    });
    let key = ObjectRef::<Pod>::new("p2").within("ci");
    assert!(eventually(WAIT, || async { store.get(&key).is_some() }).await);
    // and out of it again: DELETED
    server.update_pod("ci", "p2", |p| {
        p["metadata"]["labels"]["workload-type"] = json!("other")
    });
    assert!(eventually(WAIT, || async { store.get(&key).is_none() }).await);

    let reqs = server.requests();
    assert!(
        reqs.iter().all(|r| r.is_watch()),
        "a streaming list makes no list call"
    );
    let first = &reqs[0];
    assert_eq!(first.path, "/api/v1/namespaces/ci/pods");
    assert_eq!(
        first.query_param("sendInitialEvents").as_deref(),
        Some("true")
    );
    assert_eq!(
        first.query_param("resourceVersionMatch").as_deref(),
        Some("NotOlderThan")
    );
    assert_eq!(first.query_param("resourceVersion").as_deref(), Some("0"));
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_watch_from_a_compacted_version_gets_410_and_bookmarks_flow() {
    let server = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    server.add_pod(pod("ci", "p1", "n1", json!({}))).unwrap();
    let api: Api<Pod> = Api::namespaced(client(&server), "ci");
    let old_rv = server.resource_version().to_string();
    server.restart_history();

    let wp = kube::api::WatchParams::default().timeout(2);
    let mut stream = api.watch(&wp, &old_rv).await.unwrap().boxed();
    match stream.next().await {
        Some(Ok(kube::api::WatchEvent::Error(s))) => {
            assert_eq!(s.code, 410);
            assert_eq!(s.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        stream.next().await.is_none(),
        "the stream ends after the 410"
    );

    // changes made before the watch arrives are replayed from the history
    let before = server.resource_version().to_string();
    server.add_pod(pod("ci", "p2", "n1", json!({}))).unwrap();
    let mut stream = api.watch(&wp, &before).await.unwrap().boxed();
    match stream.next().await {
        Some(Ok(kube::api::WatchEvent::Added(p))) => assert_eq!(p.name_any(), "p2"),
        other => panic!("expected ADDED p2, got {other:?}"),
    }
    drop(stream);

    // from the current version: bookmarks arrive, then an event
    let now_rv = server.resource_version().to_string();
    let wp = kube::api::WatchParams::default().timeout(2);
    let mut stream = api.watch(&wp, &now_rv).await.unwrap().boxed();
    match stream.next().await {
        // The cluster's resourceVersion moves on its own (`storage::HEARTBEAT`): at or past
        // where the watch began.
        Some(Ok(kube::api::WatchEvent::Bookmark(b))) => {
            let at: u64 = b.metadata.resource_version.parse().unwrap();
            assert!(at >= now_rv.parse::<u64>().unwrap(), "{at} < {now_rv}");
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
    server.update_pod("ci", "p1", |p| p["status"]["phase"] = json!("Succeeded"));
    let modified = loop {
        match stream.next().await {
            Some(Ok(kube::api::WatchEvent::Bookmark(_))) => continue,
            Some(Ok(kube::api::WatchEvent::Modified(p))) => break p,
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    };
    assert_eq!(modified.status.unwrap().phase.as_deref(), Some("Succeeded"));
}

/// A storage stall (`set_storage_stalled`), as kube-apiserver's watch cache answers over a
/// stalled etcd (`storage::` module docs): a watch still starts, gets bookmarks whose
/// resourceVersion stands still and ends cleanly at its timeout, while a LIST hangs until
/// storage answers again. Healthy, the resourceVersion moves on its own (the heartbeat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_stall_keeps_watches_answering_from_the_cache_and_lists_hanging() {
    let server = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(50))
        .heartbeat(Some(Duration::from_millis(20)))
        .start()
        .await
        .unwrap();
    server.add_pod(pod("ci", "p1", "n1", json!({}))).unwrap();
    let before = server.resource_version();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(server.resource_version() > before, "the heartbeat moves it");

    server.set_storage_stalled(true);
    let api: Api<Pod> = Api::namespaced(client(&server), "ci");
    let stalled_rv = server.resource_version();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.resource_version(), stalled_rv, "no write commits");
    let wp = kube::api::WatchParams::default().timeout(1);
    let started = std::time::Instant::now();
    let mut stream = api
        .watch(&wp, &stalled_rv.to_string())
        .await
        .unwrap()
        .boxed();
    let mut bookmarks = 0;
    while let Some(e) = stream.next().await {
        match e {
            Ok(kube::api::WatchEvent::Bookmark(b)) => {
                assert_eq!(b.metadata.resource_version, stalled_rv.to_string());
                bookmarks += 1;
            }
            other => panic!("only bookmarks during a stall, got {other:?}"),
        }
    }
    assert!(bookmarks >= 5, "{bookmarks} bookmarks");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "a clean end at the timeout"
    );

    let list = tokio::spawn(async move { api.list(&ListParams::default()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!list.is_finished(), "a LIST needs storage");
    server.set_storage_stalled(false);
    let listed = tokio::time::timeout(Duration::from_secs(5), list)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(listed.items.len(), 1);
}
