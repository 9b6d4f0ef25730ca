//! Events through both APIs, fault injection, the down state, and the request log.

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use apiserver_double::{ApiServer, EventApi, Fault, FaultAction, Method};
use common::{api_code, config, eventually, no_retry_client, pod};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as EventsV1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams, WatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, ResourceExt};
use serde_json::json;

fn pod_ref() -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some("job-1".into()),
        namespace: Some("ci".into()),
        uid: Some("3f6c1a2b-0000-4111-8222-123456789abc".into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_through_core_v1_and_events_k8s_io_v1_are_stored() {
    let server = ApiServer::start().await.unwrap();
    let c = no_retry_client(&server);

    let core: Api<CoreEvent> = Api::namespaced(c.clone(), "ci");
    let created = core
        .create(
            &PostParams::default(),
            &CoreEvent {
                metadata: ObjectMeta {
                    generate_name: Some("job-1.".into()),
                    ..Default::default()
                },
                involved_object: pod_ref(),
                type_: Some("Warning".into()),
                reason: Some("GPUMemoryPressure".into()),
                action: Some("Evict".into()),
                message: Some("GPU 0 (GPU-1234): 23000/24000 MiB used".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let name = created.name_any();
    assert!(
        name.starts_with("job-1.") && name.len() == "job-1.".len() + 5,
        "{name}"
    );
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.resource_version.is_some());

    let ev1: Api<EventsV1> = Api::namespaced(c.clone(), "ci");
    ev1.create(
        &PostParams::default(),
        &EventsV1 {
            metadata: ObjectMeta {
                name: Some("job-1.dry-run".into()),
                ..Default::default()
            },
            regarding: Some(pod_ref()),
            type_: Some("Normal".into()),
            reason: Some("GPUMemoryPressureDryRun".into()),
            action: Some("Evict".into()),
            note: Some("would evict".into()),
            reporting_controller: Some("gpu-warden.io/guard".into()),
            reporting_instance: Some("gpu-node-1".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // the same name again: 409 AlreadyExists
    let err = ev1
        .create(
            &PostParams::default(),
            &EventsV1 {
                metadata: ObjectMeta {
                    name: Some("job-1.dry-run".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));

    // kube's Recorder (events.k8s.io/v1): creates, then patches the series on a repeat
    let recorder = Recorder::new(
        c.clone(),
        Reporter {
            controller: "gpu-warden".into(),
            instance: Some("gpu-node-1".into()),
        },
    );
    let event = Event {
        type_: EventType::Warning,
        reason: "GPUMemoryPressure".into(),
        note: Some("evicting".into()),
        action: "Evict".into(),
        secondary: None,
    };
    recorder.publish(&event, &pod_ref()).await.unwrap();
    recorder.publish(&event, &pod_ref()).await.unwrap();

    let events = server.events();
    assert_eq!(events.len(), 3, "{events:#?}");
    assert_eq!(events[0].api, EventApi::CoreV1);
    assert_eq!(events[0].namespace, "ci");
    assert_eq!(events[0].name, name);
    assert_eq!(events[0].object["reason"], "GPUMemoryPressure");
    assert_eq!(events[0].object["involvedObject"]["name"], "job-1");
    assert_eq!(events[1].api, EventApi::EventsV1);
    assert_eq!(events[1].object["apiVersion"], "events.k8s.io/v1");
    assert_eq!(events[1].object["regarding"]["kind"], "Pod");
    assert_eq!(events[2].api, EventApi::EventsV1);
    assert_eq!(events[2].object["reportingController"], "gpu-warden");
    assert_eq!(
        events[2].object["series"]["count"], 2,
        "the repeat was patched in"
    );

    let methods: Vec<(String, String)> = server
        .requests()
        .iter()
        .map(|r| (r.method.to_string(), r.path.clone()))
        .collect();
    assert!(methods.contains(&("POST".into(), "/api/v1/namespaces/ci/events".into())));
    assert!(methods.contains(&(
        "POST".into(),
        "/apis/events.k8s.io/v1/namespaces/ci/events".into()
    )));
    assert!(methods.iter().any(
        |(m, p)| m == "PATCH" && p.starts_with("/apis/events.k8s.io/v1/namespaces/ci/events/")
    ));

    // and they list back: one Event resource behind both APIs, as in the API server, so the
    // core/v1 list shows the events.k8s.io/v1 one too, converted (note → message, regarding →
    // involvedObject), and a field selector picks by the core names.
    let listed = core.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 3);
    let converted = &listed.items[1];
    assert_eq!(converted.message.as_deref(), Some("would evict"));
    assert_eq!(converted.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(
        converted.reporting_component.as_deref(),
        Some("gpu-warden.io/guard")
    );
    // By the core names, as GitLab Runner lists a pod's warnings: the core/v1 one and the
    // recorder's, not the Normal dry-run one.
    let warnings = core
        .list(&ListParams::default().fields("involvedObject.name=job-1,type=Warning"))
        .await
        .unwrap();
    let messages: Vec<_> = warnings
        .items
        .iter()
        .map(|e| e.message.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(
        messages,
        ["GPU 0 (GPU-1234): 23000/24000 MiB used", "evicting"]
    );
    // And the other way: events.k8s.io/v1 lists the core/v1 one with its note.
    let all_v1 = ev1.list(&ListParams::default()).await.unwrap();
    assert_eq!(all_v1.items.len(), 3);
    assert_eq!(
        all_v1.items[0].note.as_deref(),
        Some("GPU 0 (GPU-1234): 23000/24000 MiB used")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_faults_then_success_and_everything_is_logged() {
    let server = ApiServer::start().await.unwrap();
    server.add_pod(pod("ci", "p1", "n1", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(no_retry_client(&server), "ci");

    server.inject(
        Fault::new("/api/v1/namespaces/ci/pods/p1", FaultAction::Status(500))
            .method(Method::GET)
            .times(2),
    );
    for _ in 0..2 {
        let err = pods.get("p1").await.unwrap_err();
        match &err {
            kube::Error::Api(s) => {
                assert_eq!(s.code, 500);
                assert_eq!(s.reason, "InternalError");
            }
            other => panic!("expected a 500 Status, got {other:?}"),
        }
    }
    assert_eq!(pods.get("p1").await.unwrap().name_any(), "p1");

    // 429 and 503 faults; the no-retry client sees them at once
    server.inject(Fault::new("/api/v1/namespaces/ci/pods", FaultAction::Status(429)).times(1));
    server.inject(Fault::new("/api/v1/namespaces/ci/pods", FaultAction::Status(503)).times(1));
    assert_eq!(
        api_code(&pods.list(&ListParams::default()).await.unwrap_err()),
        Some(429)
    );
    assert_eq!(
        api_code(&pods.list(&ListParams::default()).await.unwrap_err()),
        Some(503)
    );
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    // a method filter leaves other methods alone; clear_faults removes forever-rules
    server.inject(Fault::new("/", FaultAction::Status(500)).method(Method::POST));
    assert!(pods.get("p1").await.is_ok());
    server.clear_faults();

    let log: Vec<(String, u16)> = server
        .requests()
        .iter()
        .map(|r| (format!("{} {}", r.method, r.path), r.status.unwrap()))
        .collect();
    assert_eq!(
        log,
        [
            ("GET /api/v1/namespaces/ci/pods/p1", 500),
            ("GET /api/v1/namespaces/ci/pods/p1", 500),
            ("GET /api/v1/namespaces/ci/pods/p1", 200),
            ("GET /api/v1/namespaces/ci/pods", 429),
            ("GET /api/v1/namespaces/ci/pods", 503),
            ("GET /api/v1/namespaces/ci/pods", 200),
            ("GET /api/v1/namespaces/ci/pods/p1", 200),
        ]
        .map(|(a, b)| (a.to_string(), b))
    );
    server.clear_requests();
    assert!(server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_beyond_the_read_timeout_and_hangs_fail_the_client() {
    let server = ApiServer::start().await.unwrap();
    server.add_pod(pod("ci", "p1", "n1", json!({}))).unwrap();
    let mut cfg = config(&server);
    cfg.default_retry = false;
    cfg.read_timeout = Some(Duration::from_millis(300));
    let pods: Api<Pod> = Api::namespaced(Client::try_from(cfg).unwrap(), "ci");

    // a delay under the timeout is served, late
    server.inject(
        Fault::new(
            "/api/v1/namespaces/ci/pods/p1",
            FaultAction::Delay(Duration::from_millis(150)),
        )
        .times(1),
    );
    let t0 = Instant::now();
    assert!(pods.get("p1").await.is_ok());
    assert!(t0.elapsed() >= Duration::from_millis(150));

    // beyond it: the client gives up
    server.inject(
        Fault::new(
            "/api/v1/namespaces/ci/pods/p1",
            FaultAction::Delay(Duration::from_secs(2)),
        )
        .times(1),
    );
    let t0 = Instant::now();
    let err = pods.get("p1").await.unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(
        api_code(&err),
        None,
        "a transport error, not a Status: {err:?}"
    );

    // a hang: same, and the log shows a request that was never answered
    server.inject(Fault::new("/api/v1/namespaces/ci/pods", FaultAction::Hang).times(1));
    let err = pods.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_code(&err), None, "{err:?}");
    let reqs = server.requests();
    let hung = reqs.last().unwrap();
    assert_eq!(hung.path, "/api/v1/namespaces/ci/pods");
    assert_eq!(hung.status, None);
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[0].status, Some(200));
    assert_eq!(
        reqs[1].status, None,
        "still being delayed when the client gave up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_server_drops_watches_and_answers_503_until_back_up() {
    let server = ApiServer::start().await.unwrap();
    server.add_pod(pod("ci", "p1", "n1", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(no_retry_client(&server), "ci");
    let rv = server.resource_version().to_string();
    let mut stream = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    server.set_down(true);
    let ended = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(ev) = stream.next().await {
            if ev.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the open watch is cut when the server goes down"
    );
    assert_eq!(api_code(&pods.get("p1").await.unwrap_err()), Some(503));

    server.set_down(false);
    assert!(
        eventually(Duration::from_secs(2), || async {
            pods.get("p1").await.is_ok()
        })
        .await
    );
    let statuses: Vec<Option<u16>> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses[..2], [Some(200), Some(503)]);
}
