//! One GET to the learned-needs source, over `http://` or `https://`, with the credentials
//! `learned.*` names (docs/scheduling.md, "Learned needs"). A connection per query: the query
//! runs every few minutes, so a pool would only hold a socket open. The CA, token and password
//! files are read at each query, so a rotated one is used from the next query on.
//!
//! A Prometheus that takes only AWS SigV4 (Amazon Managed Service for Prometheus) is reached
//! through a signing proxy beside the extender (aws-sigv4-proxy): `prometheusUrl:
//! http://localhost:8005/workspaces/<id>`, the proxy signing with the pod's IAM role.

use super::learned::{LearnedAuth, LearnedTransport};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, HOST};
use hyper::{Request, StatusCode, Uri};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

/// Why a GET gave no answer; the message names the `learned.*` key or the step, never a
/// secret.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// `learned.prometheusUrl` does not make a URI with a host.
    #[error("learned.prometheusUrl: {0}")]
    Url(String),
    /// A file named by `learned.*` cannot be read or used.
    #[error("{key} {}: {problem}", path.display())]
    File {
        /// The key naming the file.
        key: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// No connection, no TLS session, or no answer head.
    #[error("{0}")]
    Connect(String),
    /// The body broke off or passed the limit.
    #[error("reading the answer: {0}")]
    Read(String),
}

fn read_file(key: &'static str, path: &Path) -> Result<Vec<u8>, HttpError> {
    std::fs::read(path).map_err(|e| HttpError::File {
        key,
        path: path.to_path_buf(),
        problem: format!("cannot read: {e}"),
    })
}

/// The secret of a `*_file` key: its content without the trailing line break.
fn secret(key: &'static str, path: &Path) -> Result<String, HttpError> {
    let text = String::from_utf8(read_file(key, path)?).map_err(|_| HttpError::File {
        key,
        path: path.to_path_buf(),
        problem: "not UTF-8 text".into(),
    })?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

fn authorization(auth: &LearnedAuth) -> Result<HeaderValue, HttpError> {
    let value = match auth {
        LearnedAuth::BearerTokenFile(p) => {
            format!("Bearer {}", secret("learned.bearerTokenFile", p)?)
        }
        LearnedAuth::Basic {
            username,
            password_file,
        } => {
            let pw = secret("learned.basicAuth.passwordFile", password_file)?;
            let pair = format!("{username}:{pw}");
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        }
    };
    let mut v = HeaderValue::from_str(&value).map_err(|_| HttpError::File {
        key: match auth {
            LearnedAuth::BearerTokenFile(_) => "learned.bearerTokenFile",
            LearnedAuth::Basic { .. } => "learned.basicAuth.passwordFile",
        },
        path: match auth {
            LearnedAuth::BearerTokenFile(p) => p.clone(),
            LearnedAuth::Basic { password_file, .. } => password_file.clone(),
        },
        problem: "the secret is not one line of visible characters".into(),
    })?;
    v.set_sensitive(true);
    Ok(v)
}

fn tls_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, HttpError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let key = "learned.caFile";
            let bad = |problem: String| HttpError::File {
                key,
                path: path.to_path_buf(),
                problem,
            };
            let pem = read_file(key, path)?;
            for c in CertificateDer::pem_slice_iter(&pem) {
                let c = c.map_err(|e| bad(format!("not valid PEM: {e}")))?;
                roots.add(c).map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad("no CERTIFICATE block found".into()));
            }
        }
        None => {
            // The image ships Debian's ca-certificates; a root that does not parse is skipped.
            let found = rustls_native_certs::load_native_certs();
            let (_added, _skipped) = roots.add_parsable_certificates(found.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Connect(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// GETs `url` and returns the status and at most `limit` bytes of the body.
pub async fn get(
    url: &str,
    transport: &LearnedTransport,
    limit: usize,
) -> Result<(StatusCode, Bytes), HttpError> {
    let uri: Uri = url.parse().map_err(|e| HttpError::Url(format!("{e}")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(HttpError::Url("an http:// or https:// URL".into())),
    };
    let host = uri
        .host()
        .ok_or_else(|| HttpError::Url("no host".into()))?
        .to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let mut req = Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .body(Empty::<Bytes>::new())
        .map_err(|e| HttpError::Url(e.to_string()))?;
    let authority = uri.authority().map_or(host.as_str(), |a| a.as_str());
    req.headers_mut().insert(
        HOST,
        HeaderValue::from_str(authority).map_err(|e| HttpError::Url(e.to_string()))?,
    );
    if let Some(auth) = &transport.auth {
        req.headers_mut()
            .insert(AUTHORIZATION, authorization(auth)?);
    }
    // IPv6 literals come bracketed in the URI; the socket address and the TLS name do not.
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let tcp = TcpStream::connect((bare.as_str(), port))
        .await
        .map_err(|e| HttpError::Connect(format!("connecting to {host}:{port}: {e}")))?;
    if https {
        let name = ServerName::try_from(bare.clone())
            .map_err(|e| HttpError::Url(format!("{host}: {e}")))?;
        let tls = tokio_rustls::TlsConnector::from(tls_config(transport.ca_file.as_deref())?)
            .connect(name, tcp)
            .await
            .map_err(|e| HttpError::Connect(format!("TLS with {host}:{port}: {e}")))?;
        send(tls, req, limit).await
    } else {
        send(tcp, req, limit).await
    }
}

async fn send<S>(
    stream: S,
    req: Request<Empty<Bytes>>,
    limit: usize,
) -> Result<(StatusCode, Bytes), HttpError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| HttpError::Connect(e.to_string()))?;
    // The connection task ends with the answer (or is dropped with the caller's timeout).
    let driver = tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| HttpError::Connect(e.to_string()))?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), limit)
        .collect()
        .await
        .map_err(|e| HttpError::Read(e.to_string()))?
        .to_bytes();
    driver.abort();
    Ok((status, body))
}
