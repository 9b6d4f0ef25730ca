//! exporter-toolkit's web configuration file (`--web.config.file`), the format every
//! Prometheus exporter takes for TLS and basic auth (prometheus/exporter-toolkit,
//! its web-configuration doc; web/tls_config.go and web/handler.go are what this follows):
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt          # relative paths are relative to this file's folder
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
//!   client_ca_file: ca.crt
//!   min_version: TLS12             # TLS12 | TLS13
//! basic_auth_users:
//!   prometheus: $2y$10$...         # bcrypt (htpasswd -nBC 10 "" | tr -d ':\n')
//! ```
//!
//! As in exporter-toolkit, the file and the files it names are read again when they change:
//! a rotated certificate (cert-manager, a Secret volume's symlink swap) is served from the
//! next TLS handshake, a changed user list from the next request. Whether TLS is on at all is
//! decided at start. A change that does not load fails closed, as exporter-toolkit does
//! (handshakes fail, requests get 500) and is logged once, rather than keep serving a
//! certificate or a user someone meant to revoke. Keys gpu-warden does not implement
//! (`cipher_suites`, `client_allowed_sans`, `http_server_config.headers`, `rate_limit`, …)
//! are refused at start with their name, never silently ignored.
//!
//! The old flags (`--web-tls-cert`/`--web-tls-key`) go through the same loader, so they get
//! the reload too.

use super::auth::FlagFileError;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio_rustls::rustls::{self, server::WebPkiClientVerifier, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// The flag that names the file, in messages.
pub const FLAG: &str = "--web.config.file";

/// The file's shape. Unknown keys are refused (exporter-toolkit parses with `UnmarshalStrict`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    rate_limit: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_ca_file: Option<String>,
    client_auth_type: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    // exporter-toolkit's keys gpu-warden does not implement: named so the error can say so.
    cert: Option<serde_yaml_ng::Value>,
    key: Option<serde_yaml_ng::Value>,
    client_ca: Option<serde_yaml_ng::Value>,
    cipher_suites: Option<serde_yaml_ng::Value>,
    curve_preferences: Option<serde_yaml_ng::Value>,
    client_allowed_sans: Option<serde_yaml_ng::Value>,
    // A no-op since Go 1.17; accepted so files written for other exporters load.
    #[allow(dead_code)]
    prefer_server_cipher_suites: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    // gpu-warden serves HTTP/1.1 only; `http2: true` (the default) is accepted and means that.
    #[allow(dead_code)]
    http2: Option<bool>,
    headers: Option<serde_yaml_ng::Value>,
}

/// What a loaded file says.
#[derive(Clone)]
pub struct Loaded {
    /// TLS, when `tls_server_config` is set.
    pub tls: Option<Arc<ServerConfig>>,
    /// `basic_auth_users`: user → bcrypt hash (checked parseable at load).
    pub users: BTreeMap<String, String>,
}

/// Where the settings come from: the web config file, or the old certificate flags.
#[derive(Debug, Clone)]
enum Origin {
    File(PathBuf),
    Flags { cert: PathBuf, key: PathBuf },
}

/// A file's identity and version: a Secret volume swaps a symlink, so the inode changes
/// even when the size and the second do not.
type Stamp = Option<(i64, i64, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.mtime(), m.mtime_nsec(), m.len(), m.ino()))
}

struct Current {
    /// The files read for `loaded` and their stamps then.
    stamps: Vec<(PathBuf, Stamp)>,
    loaded: Result<Arc<Loaded>, String>,
}

/// The web settings, read again whenever one of their files changes.
pub struct WebConfig {
    origin: Origin,
    tls_at_start: bool,
    current: Mutex<Current>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("origin", &self.origin)
            .field("tls", &self.tls_at_start)
            .finish()
    }
}

impl WebConfig {
    /// Loads `--web.config.file`; any problem is an error naming the flag, the file and the key.
    pub fn from_file(path: &Path) -> Result<WebConfig, FlagFileError> {
        WebConfig::start(Origin::File(path.to_path_buf()))
    }

    /// The old `--web-tls-cert`/`--web-tls-key` flags, with the same reload.
    pub fn from_tls_flags(cert: &Path, key: &Path) -> Result<WebConfig, FlagFileError> {
        WebConfig::start(Origin::Flags {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        })
    }

    fn start(origin: Origin) -> Result<WebConfig, FlagFileError> {
        let (loaded, stamps) = load(&origin)?;
        Ok(WebConfig {
            tls_at_start: loaded.tls.is_some(),
            origin,
            current: Mutex::new(Current {
                stamps,
                loaded: Ok(Arc::new(loaded)),
            }),
        })
    }

    /// Whether connections are wrapped in TLS (decided at start, as in exporter-toolkit).
    pub fn tls(&self) -> bool {
        self.tls_at_start
    }

    /// The settings as the files are now: the last load when no file changed, else a new
    /// one. A failed load is logged once and returned as the error.
    pub fn current(&self) -> Result<Arc<Loaded>, String> {
        let Ok(mut cur) = self.current.lock() else {
            return Err("web config state poisoned".into());
        };
        let changed = cur.stamps.iter().any(|(p, s)| stamp(p) != *s);
        if changed {
            let (loaded, stamps) = match load(&self.origin) {
                Ok((l, s)) => (Ok(Arc::new(l)), s),
                Err(e) => {
                    tracing::warn!(error = %e, "web config changed but cannot be used: TLS handshakes and authenticated requests fail until it is fixed");
                    // Watch the same files: the next change tries again.
                    let stamps = cur
                        .stamps
                        .iter()
                        .map(|(p, _)| (p.clone(), stamp(p)))
                        .collect();
                    (Err(e.to_string()), stamps)
                }
            };
            if loaded.is_ok() {
                tracing::info!(origin = ?self.origin, "web config reloaded");
            }
            *cur = Current { stamps, loaded };
        }
        cur.loaded.clone()
    }

    /// The acceptor for a new connection, with the certificate as it is now.
    pub fn acceptor(&self) -> Result<TlsAcceptor, String> {
        match self.current()?.tls.clone() {
            Some(c) => Ok(TlsAcceptor::from(c)),
            None => Err("tls_server_config was removed; TLS stays on until a restart".into()),
        }
    }
}

fn bad(path: &Path, problem: impl Into<String>) -> FlagFileError {
    FlagFileError::invalid(FLAG, path, problem)
}

fn read(path: &Path, flag: &'static str) -> Result<Vec<u8>, FlagFileError> {
    std::fs::read(path).map_err(|source| FlagFileError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

/// Reads the settings and the stamps of every file they came from.
fn load(origin: &Origin) -> Result<(Loaded, Vec<(PathBuf, Stamp)>), FlagFileError> {
    match origin {
        Origin::Flags { cert, key } => {
            let stamps = vec![(cert.clone(), stamp(cert)), (key.clone(), stamp(key))];
            let tls = server_config(
                (cert, "--web-tls-cert"),
                (key, "--web-tls-key"),
                ClientAuth::None,
                &[&rustls::version::TLS12, &rustls::version::TLS13],
            )?;
            Ok((
                Loaded {
                    tls: Some(tls),
                    users: BTreeMap::new(),
                },
                stamps,
            ))
        }
        Origin::File(path) => load_file(path),
    }
}

fn load_file(path: &Path) -> Result<(Loaded, Vec<(PathBuf, Stamp)>), FlagFileError> {
    let mut stamps = vec![(path.to_path_buf(), stamp(path))];
    let text = read(path, FLAG)?;
    let file: File = if text.iter().all(u8::is_ascii_whitespace) {
        File::default()
    } else {
        // serde's message names the key and its line; it never quotes a value.
        serde_yaml_ng::from_slice(&text).map_err(|e| bad(path, e.to_string()))?
    };
    if file.rate_limit.is_some() {
        return Err(bad(
            path,
            "rate_limit is not supported by gpu-warden (its HTTP server bounds connections itself)",
        ));
    }
    if file.http_server_config.and_then(|h| h.headers).is_some() {
        return Err(bad(
            path,
            "http_server_config.headers is not supported by gpu-warden",
        ));
    }
    // Relative paths are relative to the file's folder (exporter-toolkit's SetDirectory).
    let dir = path.parent().unwrap_or(Path::new("."));
    let tls = match file.tls_server_config {
        None => None,
        Some(t) => {
            let unsupported = [
                ("cert", t.cert.is_some()),
                ("key", t.key.is_some()),
                ("client_ca", t.client_ca.is_some()),
                ("cipher_suites", t.cipher_suites.is_some()),
                ("curve_preferences", t.curve_preferences.is_some()),
                ("client_allowed_sans", t.client_allowed_sans.is_some()),
            ];
            if let Some((key, _)) = unsupported.iter().find(|(_, set)| *set) {
                return Err(bad(path, format!("tls_server_config.{key} is not supported by gpu-warden (use cert_file, key_file, client_ca_file, client_auth_type, min_version, max_version)")));
            }
            let join = |p: &str| dir.join(p);
            let cert = t
                .cert_file
                .as_deref()
                .map(join)
                .ok_or_else(|| bad(path, "tls_server_config: cert_file is required"))?;
            let key = t
                .key_file
                .as_deref()
                .map(join)
                .ok_or_else(|| bad(path, "tls_server_config: key_file is required"))?;
            let ca = t.client_ca_file.as_deref().map(join);
            let auth = client_auth(path, t.client_auth_type.as_deref(), ca.as_deref())?;
            let versions = versions(path, t.min_version.as_deref(), t.max_version.as_deref())?;
            stamps.push((cert.clone(), stamp(&cert)));
            stamps.push((key.clone(), stamp(&key)));
            if let Some(ca) = &ca {
                stamps.push((ca.clone(), stamp(ca)));
            }
            Some(
                server_config(
                    (&cert, "tls_server_config.cert_file"),
                    (&key, "tls_server_config.key_file"),
                    auth,
                    &versions,
                )
                // The file's flag and path first, then the key and the file it names.
                .map_err(|e| bad(path, e.to_string()))?,
            )
        }
    };
    for (user, hash) in &file.basic_auth_users {
        if hash.parse::<bcrypt::HashParts>().is_err() {
            // Never echo the value: it may be a plain-text password by mistake.
            return Err(bad(path, format!("basic_auth_users.{user}: not a bcrypt hash ($2y$/$2b$…; htpasswd -nBC 10 \"\" | tr -d ':\\n' makes one)")));
        }
    }
    Ok((
        Loaded {
            tls,
            users: file.basic_auth_users,
        },
        stamps,
    ))
}

/// The client certificate rule, with the CA file it needs.
enum ClientAuth<'a> {
    None,
    /// `VerifyClientCertIfGiven` (`optional`) or `RequireAndVerifyClientCert`.
    Verify {
        ca: &'a Path,
        optional: bool,
    },
}

fn client_auth<'a>(
    path: &Path,
    kind: Option<&str>,
    ca: Option<&'a Path>,
) -> Result<ClientAuth<'a>, FlagFileError> {
    let optional = match kind.unwrap_or("") {
        "" | "NoClientCert" => {
            if ca.is_some() {
                // exporter-toolkit: "client CA's have been configured without a Client Auth Policy".
                return Err(bad(path, "tls_server_config.client_ca_file is set but client_auth_type is not: set RequireAndVerifyClientCert or VerifyClientCertIfGiven"));
            }
            return Ok(ClientAuth::None);
        }
        "VerifyClientCertIfGiven" => true,
        "RequireAndVerifyClientCert" => false,
        "RequestClientCert" | "RequireAnyClientCert" | "RequireClientCert" => {
            return Err(bad(path, format!("tls_server_config.client_auth_type {}: accepting client certificates without verifying them is not supported by gpu-warden; use RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file", kind.unwrap_or(""))));
        }
        other => {
            return Err(bad(path, format!("tls_server_config.client_auth_type {other:?}: one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert")));
        }
    };
    let ca = ca.ok_or_else(|| {
        bad(path, "tls_server_config.client_auth_type verifies client certificates: client_ca_file is required")
    })?;
    Ok(ClientAuth::Verify { ca, optional })
}

fn versions(
    path: &Path,
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, FlagFileError> {
    // rustls speaks TLS 1.2 and 1.3 only; exporter-toolkit's TLS10/TLS11 are refused.
    let rank = |key: &str, v: Option<&str>, default: u8| {
        match v {
        None => Ok(default),
        Some("TLS12") => Ok(12),
        Some("TLS13") => Ok(13),
        Some(other) => Err(bad(path, format!("tls_server_config.{key} {other:?}: TLS12 or TLS13 (TLS 1.0 and 1.1 are not offered)"))),
    }
    };
    let (lo, hi) = (rank("min_version", min, 12)?, rank("max_version", max, 13)?);
    if lo > hi {
        return Err(bad(
            path,
            "tls_server_config: min_version is above max_version",
        ));
    }
    let mut out = Vec::new();
    if lo <= 12 {
        out.push(&rustls::version::TLS12);
    }
    if hi >= 13 {
        out.push(&rustls::version::TLS13);
    }
    Ok(out)
}

/// Builds rustls's server configuration from PEM files. Errors name the key (or flag) and
/// the file, never a key's contents.
fn server_config(
    (cert, cert_key): (&Path, &'static str),
    (key, key_key): (&Path, &'static str),
    auth: ClientAuth<'_>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<Arc<ServerConfig>, FlagFileError> {
    let cert_pem = read(cert, cert_key)?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FlagFileError::invalid(cert_key, cert, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(FlagFileError::invalid(
            cert_key,
            cert,
            "no CERTIFICATE block found",
        ));
    }
    let key_pem = read(key, key_key)?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
        FlagFileError::invalid(
            key_key,
            key,
            "no PEM private key (PKCS#8, PKCS#1 or SEC1) found",
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| FlagFileError::Tls(e.to_string()))?;
    let builder = match auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Verify { ca, optional } => {
            let key = "tls_server_config.client_ca_file";
            let pem = read(ca, key)?;
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&pem) {
                let c =
                    c.map_err(|e| FlagFileError::invalid(key, ca, format!("not valid PEM: {e}")))?;
                roots
                    .add(c)
                    .map_err(|e| FlagFileError::invalid(key, ca, e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(FlagFileError::invalid(
                    key,
                    ca,
                    "no CERTIFICATE block found",
                ));
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if optional {
                v.allow_unauthenticated()
            } else {
                v
            };
            let v = v
                .build()
                .map_err(|e| FlagFileError::invalid(key, ca, e.to_string()))?;
            builder.with_client_cert_verifier(v)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key_der)
        .map_err(|e| FlagFileError::Pair {
            cert_flag: cert_key,
            key_flag: key_key,
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            reason: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
