//! Kubernetes client construction. In-cluster config first, then `KUBECONFIG` / the
//! default kubeconfig. Two clients: one for reads, watches and patches with kube's
//! default retry, and one for evictions with it off — kube 5's default retries HTTP 429
//! for minutes, and a PodDisruptionBudget's 429 must come back at once so the guard can
//! try the next candidate (DESIGN §4).

use std::time::Duration;

/// The clients the agent uses.
#[derive(Clone)]
pub struct KubeClients {
    /// Watches, node patches, events.
    pub main: kube::Client,
    /// Evictions only: no automatic retry, short timeouts.
    pub evict: kube::Client,
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
    let mut ev = config;
    ev.default_retry = false;
    ev.read_timeout = Some(Duration::from_secs(10));
    ev.write_timeout = Some(Duration::from_secs(10));
    let evict = kube::Client::try_from(ev).map_err(|e| KubeError::Client(e.to_string()))?;
    Ok(KubeClients {
        main,
        evict,
        source,
    })
}
