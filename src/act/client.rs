//! Kubernetes client construction. In-cluster config first, then `KUBECONFIG` / the
//! default kubeconfig. Two clients: `direct`, with kube's built-in retry off, for every
//! call that has its own error handling — evictions (a PodDisruptionBudget's 429 must come
//! back at once so the guard can try the next candidate; kube 5's default retries it for
//! minutes), the pod watch (the watcher backs off itself, and an outage must
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
    /// A configuration is there (in-cluster environment, `KUBECONFIG`, or
    /// `~/.kube/config`) but cannot be used: a start-up error, never a quiet standalone run.
    #[error("{0}")]
    BadConfig(String),
    #[error("cannot build a Kubernetes client: {0}")]
    Client(String),
}

/// Builds both clients from the inferred configuration: in-cluster when
/// `KUBERNETES_SERVICE_HOST` is set, else the kubeconfig (`KUBECONFIG`, or
/// `~/.kube/config` when it exists). `Ok(None)` when there is no configuration at all (the
/// agent then runs standalone); a configuration that is there but broken (missing file,
/// not YAML, no current context, no service-account token) is an error.
/// Boxed: docs/architecture.md, "Crates".
pub fn connect() -> futures::future::BoxFuture<'static, Result<Option<KubeClients>, KubeError>> {
    Box::pin(connect_inner())
}
async fn connect_inner() -> Result<Option<KubeClients>, KubeError> {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty()) {
        let config = kube::Config::incluster().map_err(|e| {
            KubeError::BadConfig(format!(
                "KUBERNETES_SERVICE_HOST is set but the in-cluster configuration is unusable: {e}"
            ))
        })?;
        return from_config(config, "in-cluster service account").map(Some);
    }
    let named = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty());
    let default = std::env::var_os("HOME")
        .map(|h| std::path::PathBuf::from(h).join(".kube").join("config"))
        .filter(|p| p.exists());
    let Some(path) = named.clone().or(default.map(Into::into)) else {
        return Ok(None);
    };
    let config = kube::Config::from_kubeconfig(&kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| {
            let which = if named.is_some() {
                "KUBECONFIG"
            } else {
                "kubeconfig"
            };
            KubeError::BadConfig(format!(
                "{which} {} is unusable: {e} (unset it, or use --kube off, to run standalone)",
                std::path::Path::new(&path).display()
            ))
        })?;
    from_config(config, "kubeconfig").map(Some)
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
