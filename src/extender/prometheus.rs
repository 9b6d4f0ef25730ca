//! The learned-needs shell: asks Prometheus's HTTP API (`GET /api/v1/query`) every
//! `learned.refresh` for the job peaks of the window, and swaps the table the verdicts read
//! ([`super::learned`] reads the answer). When Prometheus stops answering the last table is
//! kept for `learned.maxAge`, then dropped: pods fall back to the namespace defaults and the
//! chart default instead of trusting an ever older figure.

use super::config::LearnedSource;
use super::learned::{learn, query, LearnError, LearnedNeeds};
use super::watch::LedgerFeed;
use std::sync::Arc;
use std::time::Duration;

/// Largest answer read, bytes (a few hundred projects × ~20 buckets is well under 1 MiB).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// One query's time limit.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Percent-encodes a query-string value (RFC 3986 unreserved characters kept).
pub fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The query URL for `src`.
pub fn query_url(src: &LearnedSource) -> String {
    format!(
        "{}/api/v1/query?query={}",
        src.url,
        encode(&query(&src.window))
    )
}

/// Why one query gave no table (logged once when the learner starts failing).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No answer: the URL, a `learned.*` file, the connection, TLS, or the body.
    #[error(transparent)]
    Http(#[from] super::prom_http::HttpError),
    /// [`QUERY_TIMEOUT`] passed.
    #[error("no answer in {}s", .0.as_secs())]
    Timeout(Duration),
    /// The answer is not a table (Prometheus's own error envelope included).
    #[error("HTTP {status}: {source}")]
    Answer {
        /// The HTTP status code.
        status: u16,
        /// What the body said.
        source: LearnError,
    },
}

/// One query: the learned table, or why not.
pub async fn fetch(src: &LearnedSource) -> Result<LearnedNeeds, FetchError> {
    let url = query_url(src);
    let answer = super::prom_http::get(&url, &src.transport, MAX_ANSWER_BYTES);
    let (status, body) = tokio::time::timeout(QUERY_TIMEOUT, answer)
        .await
        .map_err(|_| FetchError::Timeout(QUERY_TIMEOUT))??;
    // Prometheus answers errors (400 bad_data, 422, 503) with the same JSON envelope: read
    // it for the reason whatever the status. A proxy's 401 has another body: its status
    // tells the operator what is wrong.
    learn(&body, src.min_jobs).map_err(|source| FetchError::Answer {
        status: status.as_u16(),
        source,
    })
}

/// Starts the learning loop.
pub fn spawn_learner(src: LearnedSource, feed: Arc<LedgerFeed>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(src.refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_ok: Option<Duration> = None;
        let mut failing = false;
        loop {
            tick.tick().await;
            let now = feed.clock.mono();
            match fetch(&src).await {
                Ok(table) => {
                    feed.metrics
                        .learned_queries
                        .with_label_values(&["ok"])
                        .inc();
                    feed.metrics.learned_projects.set(table.len() as i64);
                    if failing || last_ok.is_none() {
                        tracing::info!(url = %src.url, projects = table.len(), window = %src.window, "learned needs from Prometheus");
                    }
                    let changed = feed.set_learned(table);
                    if changed > 0 {
                        tracing::debug!(
                            changed,
                            "bound pods' needs resolved again from the learned table"
                        );
                    }
                    last_ok = Some(now);
                    failing = false;
                }
                Err(e) => {
                    feed.metrics
                        .learned_queries
                        .with_label_values(&["error"])
                        .inc();
                    if !failing {
                        tracing::warn!(url = %src.url, error = %e, "cannot learn needs from Prometheus: keeping the last ones for learned.maxAge");
                        failing = true;
                    }
                    let expired = last_ok.is_some_and(|t| now.saturating_sub(t) >= src.max_age);
                    if expired {
                        tracing::warn!(max_age = ?src.max_age, "learned needs dropped: Prometheus has not confirmed them for learned.maxAge; pods fall back to the defaults");
                        feed.set_learned(LearnedNeeds::default());
                        feed.metrics.learned_projects.set(0);
                        last_ok = None;
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::{Request, Response, StatusCode};
    use std::convert::Infallible;

    /// A Prometheus HTTP API double, after Prometheus's web/api/v1 (api.go `query`,
    /// `respond`/`respondError`): `GET /api/v1/query?query=…` answers the JSON envelope
    /// `{"status":"success","data":{"resultType":"vector","result":[{"metric":{…},
    /// "value":[<unix s>,"<float>"]}]}}`; an unparsable query gets 400 with
    /// `{"status":"error","errorType":"bad_data","error":"…"}`; other paths 404. It only
    /// knows the one PromQL query the extender sends and answers it from a fixed histogram.
    async fn prometheus(
        req: Request<hyper::body::Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let want = format!("query={}", encode(&query("7d")));
        let (status, body) = match (req.uri().path(), req.uri().query()) {
            ("/api/v1/query", Some(q)) if q == want => {
                let gib = 1024u64 * 1024 * 1024;
                let s = |le: String, v: &str| serde_json::json!({"metric": {"namespace": "gitlab-runner", "project": "7", "le": le}, "value": [1780000000.5, v]});
                (
                    StatusCode::OK,
                    serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": [
                        s((4 * gib).to_string(), "80"), s((12 * gib).to_string(), "99"),
                        s((16 * gib).to_string(), "100"), s("+Inf".into(), "100")]}}),
                )
            }
            ("/api/v1/query", _) => (
                StatusCode::BAD_REQUEST,
                serde_json::json!({"status": "error", "errorType": "bad_data", "error": "invalid parameter \"query\": 1:1: parse error"}),
            ),
            _ => (StatusCode::NOT_FOUND, serde_json::json!({})),
        };
        let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
        *r.status_mut() = status;
        Ok(r)
    }

    fn source(port: u16, window: &str) -> LearnedSource {
        LearnedSource {
            url: format!("http://127.0.0.1:{port}"),
            window: window.into(),
            min_jobs: 20,
            refresh: Duration::from_secs(60),
            max_age: Duration::from_secs(3600),
            transport: Default::default(),
        }
    }

    #[tokio::test]
    async fn learns_from_prometheus_over_http() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(s),
                            hyper::service::service_fn(prometheus),
                        )
                        .await;
                });
            }
        });
        let t = fetch(&source(port, "7d")).await.unwrap();
        // 80 % under 4 GiB, 99 % under 12: the p95 is in (4, 12] GiB.
        assert_eq!(
            t.get("gitlab-runner", "7").map(|n| (n.mib, n.jobs)),
            Some((12288, 100))
        );
        let e = fetch(&source(port, "30d")).await.unwrap_err().to_string();
        assert!(e.contains("HTTP 400") && e.contains("bad_data"), "{e}");
        let e = fetch(&source(1, "7d")).await.unwrap_err().to_string();
        assert!(!e.is_empty());
    }

    /// A test CA and a certificate for `localhost` it signs: (CA PEM, cert PEM, key PEM).
    fn test_ca() -> (String, String, String) {
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
        (ca_cert.pem(), cert.pem(), key.serialize_pem())
    }

    /// The Prometheus double behind TLS and an auth check, as Prometheus with a web config
    /// (exporter-toolkit's web/handler.go: 401 `Unauthorized`, `WWW-Authenticate: Basic`) or
    /// a bearer-checking proxy in front of it (kube-rbac-proxy) answers. Serves until dropped.
    async fn https_prometheus(cert: &str, key: &str, want_auth: &'static str) -> u16 {
        use rustls_pki_types::pem::PemObject;
        let certs = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(s).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |req: Request<hyper::body::Incoming>| async move {
                            let got = req
                                .headers()
                                .get(hyper::header::AUTHORIZATION)
                                .and_then(|v| v.to_str().ok());
                            if got != Some(want_auth) {
                                let mut r = Response::new(Full::new(Bytes::from("Unauthorized\n")));
                                *r.status_mut() = StatusCode::UNAUTHORIZED;
                                r.headers_mut().insert(
                                    "www-authenticate",
                                    hyper::header::HeaderValue::from_static("Basic"),
                                );
                                return Ok::<_, Infallible>(r);
                            }
                            prometheus(req).await
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn learns_over_https_with_a_ca_file_and_bearer_or_basic_auth() {
        use crate::extender::learned::{LearnedAuth, LearnedTransport};
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = test_ca();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &ca).unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t0k3n\n").unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "s3cret\n").unwrap();

        let https =
            |port: u16, auth: Option<LearnedAuth>, ca: Option<std::path::PathBuf>| LearnedSource {
                url: format!("https://localhost:{port}"),
                transport: LearnedTransport { ca_file: ca, auth },
                ..source(port, "7d")
            };
        let p95 = |t: &LearnedNeeds| t.get("gitlab-runner", "7").map(|n| n.mib);

        // Bearer: the token file's content, line break trimmed.
        let port = https_prometheus(&cert, &key, "Bearer t0k3n").await;
        let bearer = Some(LearnedAuth::BearerTokenFile(token.clone()));
        let t = fetch(&https(port, bearer.clone(), Some(ca_file.clone())))
            .await
            .unwrap();
        assert_eq!(p95(&t), Some(12288));
        // Without the test CA the system's roots do not trust it.
        let e = fetch(&https(port, bearer, None))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("TLS with localhost"), "{e}");
        // A wrong token: the 401 is named.
        std::fs::write(&token, "other").unwrap();
        let e = fetch(&https(
            port,
            Some(LearnedAuth::BearerTokenFile(token.clone())),
            Some(ca_file.clone()),
        ))
        .await
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("HTTP 401"), "{e}");
        assert!(!e.contains("other"), "the token is never in the error: {e}");

        // Basic: user and the password file's content.
        let want = "Basic ZXh0ZW5kZXI6czNjcmV0"; // base64("extender:s3cret")
        let port = https_prometheus(&cert, &key, want).await;
        let basic = Some(LearnedAuth::Basic {
            username: "extender".into(),
            password_file: password.clone(),
        });
        let t = fetch(&https(port, basic, Some(ca_file.clone())))
            .await
            .unwrap();
        assert_eq!(p95(&t), Some(12288));
        // A missing password file is named by its key.
        let gone = Some(LearnedAuth::Basic {
            username: "extender".into(),
            password_file: dir.path().join("nope"),
        });
        let e = fetch(&https(port, gone, Some(ca_file)))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("learned.basicAuth.passwordFile"), "{e}");
    }

    #[test]
    fn encodes_promql() {
        assert_eq!(
            encode("sum by (a) (x[7d])"),
            "sum%20by%20%28a%29%20%28x%5B7d%5D%29"
        );
    }
}
