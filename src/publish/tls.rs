//! Optional TLS for the HTTP server (`--web-tls-cert`, `--web-tls-key`): rustls with the
//! `ring` provider, the same rustls the Kubernetes client already uses. Certificate and
//! key are loaded once at start; a bad file stops the agent with a message naming the flag.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

fn read(path: &Path, flag: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag} {}: cannot read: {e}", path.display()))
}

/// Builds the TLS acceptor from a PEM certificate chain (leaf first) and a PEM private key
/// (PKCS#8, PKCS#1 or SEC1). Errors name the flag and file, never the key's contents.
pub fn load_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let cert_pem = read(cert, "--web-tls-cert")?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--web-tls-cert {}: not valid PEM: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "--web-tls-cert {}: no CERTIFICATE block found",
            cert.display()
        ));
    }
    let key_pem = read(key, "--web-tls-key")?;
    // The parser's error does not carry key material, but keep the message generic anyway.
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
        format!(
            "--web-tls-key {}: no PEM private key (PKCS#8, PKCS#1 or SEC1) found",
            key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up failed: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| {
            format!(
                "--web-tls-cert {} / --web-tls-key {}: {e}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
