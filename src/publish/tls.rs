//! Optional TLS for the HTTP server (`--web-tls-cert`, `--web-tls-key`): rustls with the
//! `ring` provider, the same rustls the Kubernetes client already uses. Certificate and
//! key are loaded once at start; a bad file stops the agent with a message naming the flag.

use super::auth::FlagFileError;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

fn read(path: &Path, flag: &'static str) -> Result<Vec<u8>, FlagFileError> {
    std::fs::read(path).map_err(|source| FlagFileError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

/// Builds the TLS acceptor from a PEM certificate chain (leaf first) and a PEM private key
/// (PKCS#8, PKCS#1 or SEC1). Errors name the flag and file, never the key's contents.
pub fn load_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, FlagFileError> {
    let cert_pem = read(cert, "--web-tls-cert")?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            FlagFileError::invalid("--web-tls-cert", cert, format!("not valid PEM: {e}"))
        })?;
    if certs.is_empty() {
        return Err(FlagFileError::invalid(
            "--web-tls-cert",
            cert,
            "no CERTIFICATE block found",
        ));
    }
    let key_pem = read(key, "--web-tls-key")?;
    // The parser's error does not carry key material, but keep the message generic anyway.
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
        FlagFileError::invalid(
            "--web-tls-key",
            key,
            "no PEM private key (PKCS#8, PKCS#1 or SEC1) found",
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| FlagFileError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| FlagFileError::Pair {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            reason: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
