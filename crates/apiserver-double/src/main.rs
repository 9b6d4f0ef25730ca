//! `apiserver-double`: the Kubernetes API server test double as a standalone process, for
//! test machines (e.g. the GPU hosts of DESIGN §5 tier 4). See the crate README.

// A test double keeps real time: it answers, delays and expires like a real server.
#![allow(clippy::disallowed_methods)]

use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use apiserver_double::{cgroups, ApiServer, Fixtures};
use clap::Parser;
use serde_json::Value;

/// A Kubernetes API server test double on plain HTTP: pods (get/list/watch/evict), nodes
/// (get/list/watch/patch), events (core/v1 and events.k8s.io/v1).
#[derive(Debug, Parser)]
#[command(name = "apiserver-double", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8001")]
    listen: SocketAddr,

    /// YAML file with `pods: [...]` and `nodes: [...]` (full objects) to start with.
    #[arg(long, value_name = "FILE")]
    fixtures: Option<PathBuf>,

    /// Multiplies eviction grace periods (0 deletes evicted pods at once).
    #[arg(long, default_value_t = 1.0, value_name = "FLOAT")]
    eviction_grace_scale: f64,

    /// When an evicted pod is deleted, write `1` to the `cgroup.kill` of every directory
    /// under DIR whose name contains the pod's UID (with `-` or `_`).
    #[arg(long, value_name = "DIR")]
    kill_cgroups_under: Option<PathBuf>,

    /// How deep under --kill-cgroups-under to search.
    #[arg(long, default_value_t = 8, value_name = "N")]
    cgroup_search_depth: usize,

    /// Append every request to FILE as one JSON object per line.
    #[arg(long, value_name = "FILE")]
    request_log: Option<PathBuf>,

    /// Write a kubeconfig pointing at this server to FILE (use with KUBECONFIG=FILE).
    #[arg(long, value_name = "FILE")]
    kubeconfig_out: Option<PathBuf>,

    /// Bookmark interval for watches that allow bookmarks (e.g. `1s`, `250ms`).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    bookmark_interval: Duration,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // a subscriber can only be missing here; if one is somehow set, keep it
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    if !(args.eviction_grace_scale.is_finite() && args.eviction_grace_scale >= 0.0) {
        eprintln!(
            "apiserver-double: --eviction-grace-scale must be a finite number >= 0, got {}",
            args.eviction_grace_scale
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("apiserver-double: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("apiserver-double: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let fixtures = match &args.fixtures {
        Some(path) => Fixtures::from_file(path).map_err(|e| e.to_string())?,
        None => Fixtures::default(),
    };
    let server = ApiServer::builder()
        .listen(args.listen)
        .eviction_grace_scale(args.eviction_grace_scale)
        .bookmark_interval(args.bookmark_interval)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    server.load_fixtures(&fixtures).map_err(|e| e.to_string())?;

    if let Some(dir) = args.kill_cgroups_under.clone() {
        let depth = args.cgroup_search_depth;
        server.on_evict(move |pod: &Value| kill_cgroups(&dir, depth, pod));
    }
    if let Some(path) = &args.request_log {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("--request-log {}: {e}", path.display()))?;
        let file = Mutex::new(file);
        server.on_request(move |req| {
            let mut line = req.to_json().to_string();
            line.push('\n');
            let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = f.write_all(line.as_bytes()) {
                tracing::warn!(error = %e, "cannot append to the request log");
            }
        });
    }
    if let Some(path) = &args.kubeconfig_out {
        server
            .write_kubeconfig(path)
            .map_err(|e| format!("--kubeconfig-out: {e}"))?;
    }

    // The first line on stdout is the URL, for scripts.
    println!("{}", server.url());
    let _ = std::io::stdout().flush();
    tracing::info!(
        url = %server.url(),
        pods = fixtures.pods.len(),
        nodes = fixtures.nodes.len(),
        "apiserver-double serving"
    );

    wait_for_signal().await?;
    tracing::info!("signal received, shutting down");
    server.shutdown();
    Ok(())
}

fn kill_cgroups(dir: &std::path::Path, depth: usize, pod: &Value) {
    let ns = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(uid) = pod.pointer("/metadata/uid").and_then(Value::as_str) else {
        tracing::warn!(
            namespace = ns,
            pod = name,
            "evicted pod has no uid; no cgroup killed"
        );
        return;
    };
    let killed = cgroups::kill_pod_cgroups(dir, uid, depth);
    if killed.is_empty() {
        tracing::warn!(namespace = ns, pod = name, uid, under = %dir.display(), "no cgroup found for the evicted pod");
    }
    for k in killed {
        match k.error {
            None => {
                tracing::info!(namespace = ns, pod = name, uid, cgroup = %k.path.display(), "killed cgroup")
            }
            Some(e) => {
                tracing::warn!(namespace = ns, pod = name, uid, cgroup = %k.path.display(), error = %e, "cannot kill cgroup")
            }
        }
    }
}

#[cfg(unix)]
async fn wait_for_signal() -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn wait_for_signal() -> Result<(), String> {
    tokio::signal::ctrl_c()
        .await
        .map_err(|e| format!("Ctrl-C handler: {e}"))
}
