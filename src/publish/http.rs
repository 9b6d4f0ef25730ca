//! The HTTP shell: `/metrics`, `/healthz`, `/readyz`, `/state`. A scrape serves bytes
//! rendered once per poll with the agent's own process families appended by the first
//! scrape of that poll (`process_metrics::ScrapeBodies`); it never calls NVML. Connections
//! are bounded in number, header size and time, so a slow or hostile client cannot starve
//! Prometheus.

use super::auth::{Auth, FlagFileError};
use super::basic_auth::BasicAuthChecker;
use super::process_metrics::ScrapeBodies;
use super::state::Published;
use super::web_config::WebConfig;
use crate::model::clock::Clock;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Optional TLS and authentication of the HTTP server (see docs/reliability.md,
/// "Securing /metrics").
#[derive(Clone, Default)]
pub struct HttpSecurity {
    /// Wraps every accepted connection in TLS when set; the certificate is the one the
    /// files hold at the handshake (`WebConfig` reloads them when they change).
    pub tls: Option<Arc<WebConfig>>,
    /// Credentials required on everything but `/healthz` and `/readyz` when set.
    pub auth: Option<Authn>,
}

/// Where the credentials come from.
#[derive(Clone)]
pub enum Authn {
    /// The old flags: a bearer token, or `user:<sha256>` lines.
    Fixed(Auth),
    /// `basic_auth_users` of the web config file, as it is at each request (none: open).
    Web(Arc<WebConfig>, Arc<BasicAuthChecker>),
}

impl std::fmt::Debug for Authn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Authn::Fixed(a) => a.fmt(f),
            Authn::Web(w, _) => write!(f, "Authn::Web({w:?})"),
        }
    }
}

impl std::fmt::Debug for HttpSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSecurity")
            .field("tls", &self.tls.is_some())
            .field("auth", &self.auth)
            .finish()
    }
}

impl HttpSecurity {
    /// Loads `--web.config.file`, or the old flags' files (TLS certificate and key, the
    /// credentials file). Which flags go together is the configuration's rule
    /// (`Cli::validate`); this reads the files. Errors name the flag or key and the file; no
    /// secret is put in them or logged.
    pub fn load(
        web_config: Option<&Path>,
        tls: Option<(&Path, &Path)>,
        auth: Option<AuthFile<'_>>,
    ) -> Result<HttpSecurity, FlagFileError> {
        if let Some(path) = web_config {
            let web = Arc::new(WebConfig::from_file(path)?);
            return Ok(HttpSecurity {
                tls: web.tls().then(|| web.clone()),
                auth: Some(Authn::Web(web, Arc::default())),
            });
        }
        let tls = tls
            .map(|(cert, key)| WebConfig::from_tls_flags(cert, key).map(Arc::new))
            .transpose()?;
        let auth = match auth {
            Some(AuthFile::Bearer(p)) => Some(Authn::Fixed(Auth::bearer_from_file(p)?)),
            Some(AuthFile::Basic(p)) => Some(Authn::Fixed(Auth::basic_from_file(p)?)),
            None => None,
        };
        Ok(HttpSecurity { tls, auth })
    }

    /// Whether the web config file has `basic_auth_users` now (the extender refuses them:
    /// kube-scheduler's extender client sends no credentials).
    pub fn has_basic_auth_users(&self) -> bool {
        match &self.auth {
            Some(Authn::Web(w, _)) => w.current().is_ok_and(|l| !l.users.is_empty()),
            Some(Authn::Fixed(_)) => true,
            None => false,
        }
    }
}

/// The credentials file the HTTP server checks requests against.
#[derive(Debug, Clone, Copy)]
pub enum AuthFile<'a> {
    /// `--web-auth-bearer-file`: one token.
    Bearer(&'a Path),
    /// `--web-auth-basic-file`: `user:<sha256>` lines.
    Basic(&'a Path),
}

/// Limits of the HTTP server.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Connections served at once; further ones wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Time allowed for a client to send its request headers.
    pub header_timeout: Duration,
    /// Lifetime of one connection (keep-alive included).
    pub connection_timeout: Duration,
    /// Largest request head accepted (request line plus headers), bytes; at least 8 KiB.
    pub max_header_bytes: usize,
    /// TLS and authentication; both off by default.
    pub security: HttpSecurity,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 256,
            header_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(60),
            max_header_bytes: 16 * 1024,
            security: HttpSecurity::default(),
        }
    }
}

/// What the handlers read.
#[derive(Clone)]
pub struct HttpState {
    /// The latest publication (None until the first poll is done).
    pub published: watch::Receiver<Option<Arc<Published>>>,
    pub clock: Arc<dyn Clock>,
    /// The full poll interval: `/healthz` fails after three without a new snapshot.
    pub poll_interval: Duration,
    /// The `/metrics` bodies: each publication with the agent's own process families.
    pub bodies: Arc<ScrapeBodies>,
}

const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

fn reply(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn plain(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", Bytes::from(msg))
}

/// Why the publication `p` is stale — no poll has finished within 3 poll intervals, so
/// poll `seq + 1` is stuck — or None while it is current.
fn staleness(state: &HttpState, p: &Published) -> Option<String> {
    let age = state.clock.mono().saturating_sub(p.published_at);
    let limit = state.poll_interval * 3;
    (age > limit).then(|| {
        format!(
            "stale: poll {} has not finished; the last poll (#{}) finished {:.1}s ago (limit {:.1}s, 3 poll intervals); the sampler may be stuck in an NVML call",
            p.snapshot.seq + 1,
            p.snapshot.seq,
            age.as_secs_f64(),
            limit.as_secs_f64()
        )
    })
}

/// Answers one request. Public so tests and benches can call it without a socket.
pub fn handle(state: &HttpState, method: &Method, path: &str) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        r.headers_mut()
            .insert("allow", HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let published = state.published.borrow().clone();
    match path {
        "/metrics" => match published {
            Some(p) => reply(
                StatusCode::OK,
                TEXT_FORMAT,
                state.bodies.body(
                    &p.metrics,
                    (p.snapshot.seq, p.published_at),
                    state.clock.mono(),
                ),
            ),
            None => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "no snapshot yet: the first poll has not finished\n".into(),
            ),
        },
        "/healthz" => match published {
            None => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "no poll has finished yet\n".into(),
            ),
            Some(p) => match staleness(state, &p) {
                None => plain(StatusCode::OK, "ok\n".into()),
                Some(reason) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
            },
        },
        "/readyz" => match published {
            Some(_) => plain(StatusCode::OK, "ready\n".into()),
            None => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: waiting for the first snapshot\n".into(),
            ),
        },
        "/state" => match published {
            Some(p) => reply(
                StatusCode::OK,
                "application/json",
                Bytes::from(p.state_json_marked(staleness(state, &p).as_deref())),
            ),
            None => plain(StatusCode::SERVICE_UNAVAILABLE, "no snapshot yet\n".into()),
        },
        "/" => plain(
            StatusCode::OK,
            "gpu-warden: /metrics /healthz /readyz /state\n".into(),
        ),
        _ => plain(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// Whether `path` needs credentials when authentication is on: everything but the kubelet's
/// probes, which cannot present any and reveal nothing but liveness.
pub fn needs_auth(path: &str) -> bool {
    !matches!(path, "/healthz" | "/readyz")
}

/// Why a request is not answered.
enum Refusal {
    /// 401 with this challenge.
    Unauthorized(&'static str),
    /// 500: the web config changed and cannot be used (logged where it was read).
    Broken,
}

fn unauthorized(challenge: &'static str) -> Response<Full<Bytes>> {
    let mut r = plain(StatusCode::UNAUTHORIZED, "unauthorized\n".into());
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    r
}

/// Checks the request's credentials when `auth` is set and `path` needs them. A bcrypt
/// comparison that is not cached runs on the blocking pool, never on a runtime worker. The
/// presented credentials are never logged.
async fn authorize(
    auth: Option<&Authn>,
    path: &str,
    header: Option<&HeaderValue>,
) -> Result<(), Refusal> {
    let Some(auth) = auth.filter(|_| needs_auth(path)) else {
        return Ok(());
    };
    match auth {
        Authn::Fixed(a) => match a.check(header) {
            true => Ok(()),
            false => Err(Refusal::Unauthorized(a.challenge())),
        },
        Authn::Web(web, checker) => {
            let loaded = web.current().map_err(|_| Refusal::Broken)?;
            if loaded.users.is_empty() {
                return Ok(());
            }
            let header = header.and_then(|h| h.to_str().ok());
            let ok = if checker.is_cached(&loaded.users, header) {
                checker.check(&loaded.users, header)
            } else {
                let (checker, header) = (checker.clone(), header.map(str::to_string));
                tokio::task::spawn_blocking(move || checker.check(&loaded.users, header.as_deref()))
                    .await
                    .unwrap_or(false)
            };
            // exporter-toolkit's challenge: `Basic`, no realm.
            ok.then_some(()).ok_or(Refusal::Unauthorized("Basic"))
        }
    }
}

/// Serves until `shutdown` resolves, then lets open requests finish for up to 5 s. Boxed,
/// like every shell room's entry point another crate awaits: docs/architecture.md, "Crates".
pub fn serve(
    listener: TcpListener,
    state: HttpState,
    limits: HttpLimits,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(serve_inner(listener, state, limits, shutdown))
}
async fn serve_inner(
    listener: TcpListener,
    state: HttpState,
    limits: HttpLimits,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
) {
    let auth = limits.security.auth.clone();
    let handler = move |req: Request<Incoming>| {
        let (state, auth) = (state.clone(), auth.clone());
        async move {
            let path = req.uri().path();
            let resp = match authorize(auth.as_ref(), path, req.headers().get(AUTHORIZATION)).await
            {
                Ok(()) => handle(&state, req.method(), path),
                Err(Refusal::Unauthorized(challenge)) => unauthorized(challenge),
                Err(Refusal::Broken) => plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the web config file cannot be used; see the agent's log\n".into(),
                ),
            };
            if req.method() == Method::HEAD {
                let (parts, _) = resp.into_parts();
                Response::from_parts(parts, Full::new(Bytes::new()))
            } else {
                resp
            }
        }
    };
    serve_with(listener, &limits, shutdown, handler).await
}

/// The connection loop shared by the agent's server and the scheduler extender's: at most
/// `max_connections` at once, header and connection timeouts, optional TLS, and a graceful
/// drain of up to 5 s once `shutdown` resolves. `handler` answers each request (it may read
/// the body); authentication, if any, is the handler's business.
pub async fn serve_with<H, F>(
    listener: TcpListener,
    limits: &HttpLimits,
    shutdown: impl Future<Output = ()>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .max_headers(64);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let h = handler.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let fut = h(req);
            async move { Ok::<_, Infallible>(fut.await) }
        });
        let lifetime = limits.connection_timeout;
        let Some(tls) = limits.security.tls.clone() else {
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                let _permit = permit;
                // A connection that outlives its budget is dropped; Prometheus reconnects.
                let _ = tokio::time::timeout(lifetime, conn).await;
            });
            continue;
        };
        let watcher = graceful.watcher();
        let builder = builder.clone();
        let handshake_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            // The certificate as its files are now (a rotated one from the next handshake).
            let Ok(tls) = tls.acceptor() else {
                return; // logged once where the change was read
            };
            let stream = match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    // The error describes the protocol failure only, no secrets.
                    tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(peer = %peer, "TLS handshake timed out");
                    return;
                }
            };
            let conn = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
            let _ = tokio::time::timeout(lifetime, conn).await;
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(5)) => {
            tracing::warn!("HTTP connections still open after 5 s; closing them");
        }
    }
}
