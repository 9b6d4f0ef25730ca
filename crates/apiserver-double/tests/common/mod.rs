//! Helpers shared by the integration tests: real kube clients pointed at the double.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use apiserver_double::ApiServer;
use kube::{Client, Config};
use serde_json::{json, Value};

/// A kube 5 client for the double, built the way gpu-warden builds one.
pub fn config(server: &ApiServer) -> Config {
    Config::new(server.url().parse().expect("server URL parses as a URI"))
}

/// A client with kube's default retry policy (retries 429/503/504).
pub fn client(server: &ApiServer) -> Client {
    Client::try_from(config(server)).expect("client builds")
}

/// A client with `default_retry = false`, as gpu-warden uses for evictions.
pub fn no_retry_client(server: &ApiServer) -> Client {
    let mut cfg = config(server);
    cfg.default_retry = false;
    Client::try_from(cfg).expect("client builds")
}

/// A pod object on a node, with labels.
pub fn pod(ns: &str, name: &str, node: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda:12"}]},
        "status": {"phase": "Running"}
    })
}

/// Polls `f` until it is true or `timeout` passes; returns the last answer.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The API status code of a kube error, if it is an API error.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}
