//! Kubernetes client construction. In-cluster config first, then `KUBECONFIG` / the
//! default kubeconfig. Two clients: `direct`, with kube's built-in retry off, for every
//! call that has its own error handling — evictions (a PodDisruptionBudget's 429 must come
//! back at once so the guard can try the next candidate; kube 5's default retries it for
//! minutes, DESIGN §4), the pod watch (the watcher backs off itself, and an outage must
//! show in the view's health so the guard stops deciding) and node patches (the annotator
//! backs off itself) — and `main`, with the retry on, for best-effort Events.

use std::time::Duration;

/// The clients the agent uses.
#[derive(Clone)]
pub struct KubeClients {
    /// Events: kube's default retry on 429/503/504.
    pub main: kube::Client,
    /// Evictions, the pod watch, node patches: no automatic retry.
    pub direct: kube::Client,
    /// Where the configuration came from, for the start-up log line.
    pub source: &'static str,
}

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("no Kubernetes configuration found (not in a cluster, no usable kubeconfig): {0}")]
    NoConfig(String),
    #[error("cannot build a Kubernetes client: {0}")]
    Client(String),
}

/// Builds both clients from the inferred configuration.
pub async fn connect() -> Result<KubeClients, KubeError> {
    let (config, source) = match kube::Config::incluster() {
        Ok(c) => (c, "in-cluster service account"),
        Err(in_cluster) => {
            match kube::Config::from_kubeconfig(&kube::config::KubeConfigOptions::default()).await {
                Ok(c) => (c, "kubeconfig"),
                Err(kc) => {
                    return Err(KubeError::NoConfig(format!(
                        "in-cluster: {in_cluster}; kubeconfig: {kc}"
                    )))
                }
            }
        }
    };
    from_config(config, source)
}

/// Builds both clients from `config` (tests point it at the API double).
pub fn from_config(
    mut config: kube::Config,
    source: &'static str,
) -> Result<KubeClients, KubeError> {
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = config.read_timeout.or(Some(Duration::from_secs(295)));
    let main =
        kube::Client::try_from(config.clone()).map_err(|e| KubeError::Client(e.to_string()))?;
    // No read timeout shorter than a watch (290 s server-side): the enforcer and the
    // annotator bound their own requests.
    let mut direct = config;
    direct.default_retry = false;
    let direct = kube::Client::try_from(direct).map_err(|e| KubeError::Client(e.to_string()))?;
    Ok(KubeClients {
        main,
        direct,
        source,
    })
}
