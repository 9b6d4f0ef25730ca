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

use apiserver_double::cgroups::CgroupRuntime;
use apiserver_double::{ApiServer, FaultAction, Fixtures, KubeletModel, KubeletOptions, Pid1Mode};
use clap::Parser;

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

    /// How the double plays the kubelet after an accepted eviction: `faithful` (watch
    /// latency, SIGTERM to each container's PID 1, SIGKILL to the pod after max(grace, 2 s),
    /// then the pod is deleted) or `instant` (killed and deleted after grace × scale: a
    /// comparison only, no real node does it).
    #[arg(long, default_value = "faithful", value_name = "faithful|instant")]
    kubelet: KubeletModel,

    /// Time from an accepted eviction to the kubelet acting on it.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    kubelet_watch_latency: Duration,

    /// What PID 1 does with SIGTERM where no real processes are signalled (no
    /// --kill-cgroups-under): `shell` ignores it, `exits` dies on it.
    #[arg(long, default_value = "shell", value_name = "shell|exits")]
    kubelet_pid1: Pid1Mode,

    /// With `--kubelet instant`: multiplies eviction grace periods (0 kills at once).
    #[arg(long, default_value_t = 0.0, value_name = "FLOAT")]
    eviction_grace_scale: f64,

    /// Play the kubelet on real processes: a pod's cgroups are the directories under DIR
    /// whose name contains its UID (with `-` or `_`); SIGTERM goes to each container
    /// cgroup's PID 1, SIGKILL to the pod through `cgroup.kill`.
    #[arg(long, value_name = "DIR")]
    kill_cgroups_under: Option<PathBuf>,

    /// Append every kubelet action (SIGTERM, SIGKILL, processes gone, pod deleted) to FILE
    /// as one JSON object per line.
    #[arg(long, value_name = "FILE")]
    kubelet_log: Option<PathBuf>,

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

    /// Answer every GET under `/api/v1/namespaces/` that is not a watch — the guard's fresh
    /// read of a pod — only after this long (e.g. `3s`), while cluster-wide LISTs and
    /// watches answer at once: a server slow for one kind of request (issue 38's H200 runs).
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
    slow_pod_reads: Option<Duration>,
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
    let kubelet = KubeletOptions {
        model: args.kubelet,
        watch_latency: args.kubelet_watch_latency,
        pid1: args.kubelet_pid1,
        instant_grace_scale: args.eviction_grace_scale,
    };
    let server = ApiServer::builder()
        .listen(args.listen)
        .kubelet(kubelet)
        .bookmark_interval(args.bookmark_interval)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    server.load_fixtures(&fixtures).map_err(|e| e.to_string())?;
    if let Some(delay) = args.slow_pod_reads {
        server.inject(
            apiserver_double::Fault::new("/api/v1/namespaces/", FaultAction::SlowList(delay))
                .method(apiserver_double::Method::GET),
        );
    }

    if let Some(dir) = args.kill_cgroups_under.clone() {
        server.set_pod_runtime(CgroupRuntime::new(dir, args.cgroup_search_depth));
    }
    if let Some(path) = &args.kubelet_log {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("--kubelet-log {}: {e}", path.display()))?;
        let file = Mutex::new(file);
        server.on_kubelet(move |action| {
            let mut line = action.to_json().to_string();
            line.push('\n');
            let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = f.write_all(line.as_bytes()) {
                tracing::warn!(error = %e, "cannot append to the kubelet log");
            }
        });
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
        kubelet = args.kubelet.as_str(),
        pods = fixtures.pods.len(),
        nodes = fixtures.nodes.len(),
        "apiserver-double serving"
    );

    wait_for_signal().await?;
    tracing::info!("signal received, shutting down");
    server.shutdown();
    Ok(())
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
