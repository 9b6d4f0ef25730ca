//! The scheduler side (`gpu-warden extender`, docs/scheduling.md): kube-scheduler's HTTP extender,
//! keeping a GPU pod off nodes where the GPU it would get lacks the VRAM it needs.
//!
//! Pure core — [`wire`] (the extender protocol's JSON), [`need`] (a pod's VRAM need),
//! [`learned`] (needs learned from the projects' job peaks), [`nodes`] (a node's
//! annotations, read with the agent's own types), [`ledger`] (pods bound but not yet shown
//! by their node), [`judge`] (feasibility and score), [`core`] (one call) and [`config`] —
//! and thin shells: [`watch`] (the Node cache and the pod watch), [`prometheus`] (the
//! learned needs' source), [`server`] (HTTP) and [`metrics`].

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates"). The config room
// is written `gpu_warden_config::…`: `config` here is the extender's own flags and policy.
#[cfg(test)]
use crate as extender;
use gpu_warden_act as act;
use gpu_warden_guard as guard;
use gpu_warden_kubeapi as kubeapi;
use gpu_warden_model as model;
use gpu_warden_publish as publish;

pub mod config;
pub mod core;
pub mod judge;
pub mod learned;
pub mod lease_cache;
pub mod ledger;
pub mod liveness;
pub mod metrics;
pub mod need;
pub mod nodes;
pub mod prom_http;
pub mod prometheus;
pub mod reply;
pub mod server;
pub mod watch;
pub mod why;
pub mod wire;

use crate::model::clock::{Clock, SystemClock};
use crate::publish::http::{serve_with, HttpLimits, HttpSecurity};
use config::ExtenderCli;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// Why the extender could not start.
#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    /// The policy file.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// TLS files.
    #[error(transparent)]
    Tls(#[from] crate::publish::auth::FlagFileError),
    /// A certificate without its key, or the other way round.
    #[error(transparent)]
    TlsPair(#[from] gpu_warden_config::tls::TlsPairError),
    /// The web config file with the old TLS flags.
    #[error("--web.config.file excludes --web-tls-cert and --web-tls-key: put the certificate in the web config file's tls_server_config")]
    WebConfigAndFlags,
    /// Users the verbs' callers cannot present.
    #[error("--web.config.file: basic_auth_users cannot be used by the extender: kube-scheduler's extender client sends no credentials; verify its client certificate instead (tls_server_config.client_auth_type: RequireAndVerifyClientCert, client_ca_file)")]
    BasicAuthUsers,
    /// No usable Kubernetes configuration.
    #[error("{0}")]
    Kube(String),
    /// The listening socket or the runtime.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Metric registration.
    #[error("registering metrics: {0}")]
    Metrics(#[from] ::prometheus::Error),
    /// The verbs asked to listen beyond loopback.
    #[error("--listen {0} is not a loopback address: /filter and /prioritize carry no credentials (kube-scheduler's extender client sends none), so they are served on the pod's loopback only; use --probe-listen for the kubelet's probes and Prometheus")]
    NotLoopback(std::net::SocketAddr),
}

/// Runs the extender until `shutdown` resolves.
pub fn run(
    cli: ExtenderCli,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ExtenderError> {
    let policy = config::load_policy(cli.config.as_deref())?;
    if !cli.listen.ip().is_loopback() {
        return Err(ExtenderError::NotLoopback(cli.listen));
    }
    let tls = cli.tls.pair()?;
    if cli.web_config_file.is_some() && tls.is_some() {
        return Err(ExtenderError::WebConfigAndFlags);
    }
    let mut security = HttpSecurity::load(cli.web_config_file.as_deref(), tls, None)?;
    if security.has_basic_auth_users() {
        return Err(ExtenderError::BasicAuthUsers);
    }
    // The verbs' handler has no credentials check: TLS (and client certificates) only.
    security.auth = None;
    let metrics = metrics::ExtenderMetrics::new()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ExtenderError::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    let result = runtime.block_on(async move {
        let clients = crate::act::client::connect()
            .await
            .map_err(|e| ExtenderError::Kube(e.to_string()))?
            .ok_or_else(|| {
                ExtenderError::Kube(
                    "no Kubernetes configuration (not in a cluster, no KUBECONFIG): the extender needs the API server to read the nodes' annotations".into(),
                )
            })?;
        tracing::info!(source = clients.source, listen = %cli.listen, probe_listen = ?cli.probe_listen, scheduler = %cli.scheduler_name, margin_mib = policy.judge.margin_mib, stale_after = ?policy.judge.stale_after, unknown_node = ?policy.judge.unknown_node, score = ?policy.judge.score, unknown_need = ?policy.needs.unknown, learned = ?policy.learned.as_ref().map(|l| &l.url), "starting gpu-warden extender {}", env!("CARGO_PKG_VERSION"));
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let nodes = watch::spawn_node_cache(
            clients.direct.clone(),
            cli.node_selector.as_deref(),
            &policy.prefix,
            metrics.clone(),
        );
        let nodes: Arc<dyn watch::NodeLookup> = match cli.lease_namespace.as_deref() {
            Some(ns) => lease_cache::spawn_live_nodes(
                clients.direct.clone(),
                ns,
                &policy.prefix,
                nodes,
                metrics.clone(),
            ),
            None => {
                tracing::info!("no --lease-namespace: node liveness from the Nodes' vram-observed-at alone (agents before Leases)");
                nodes
            }
        };
        let learned_source = policy.learned.clone();
        let feed = Arc::new(watch::LedgerFeed {
            ledger: Arc::new(Mutex::new(ledger::Ledger::new(policy.ledger_ttl))),
            policy,
            nodes,
            learned: Default::default(),
            pods_synced: Default::default(),
            clock,
            metrics,
        });
        watch::spawn_pod_feed(clients.direct.clone(), &cli.scheduler_name, feed.clone());
        if let Some(src) = learned_source {
            prometheus::spawn_learner(src, feed.clone());
        }
        let bind = |addr: std::net::SocketAddr, flag: &'static str| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ExtenderError::Io {
                    what: format!("cannot listen on {addr} ({flag})"),
                    source,
                })
        };
        let listener = bind(cli.listen, "--listen").await?;
        let probe = match cli.probe_listen {
            Some(a) => Some(bind(a, "--probe-listen").await?),
            None => None,
        };
        let state = Arc::new(server::ExtenderState {
            feed: feed.clone(),
            max_body_bytes: cli.max_body_bytes,
            serve_verbs: true,
        });
        let limits = HttpLimits {
            security,
            ..HttpLimits::default()
        };
        let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
        let probes = probe.map(|l| {
            let st = Arc::new(server::ExtenderState {
                feed,
                max_body_bytes: 0,
                serve_verbs: false,
            });
            let limits = HttpLimits::default();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                serve_with(l, &limits, stop, move |req| server::handle(st.clone(), req)).await
            })
        });
        serve_with(listener, &limits, shutdown, move |req| {
            server::handle(state.clone(), req)
        })
        .await;
        if let Some(p) = probes {
            let _ = p.await;
        }
        Ok(())
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}
