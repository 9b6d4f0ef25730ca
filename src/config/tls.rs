//! The certificate pair of the old TLS flags, `--web-tls-cert` and `--web-tls-key`, which
//! the agent and `gpu-warden extender` both take (each with its own environment variables,
//! set where the flags are flattened): one definition of the flags and of their
//! both-or-neither rule. Whether the files can be read and used is the loader's one check
//! (src/publish/web_config.rs), which names the flag of a bad file.

use std::path::{Path, PathBuf};

/// `--web-tls-cert` and `--web-tls-key`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsPairArgs {
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs --web-tls-key.
    /// Reloaded when it changes. (--web.config.file's `tls_server_config` does the same.)
    #[arg(long, value_name = "FILE")]
    pub web_tls_cert: Option<PathBuf>,

    /// PEM private key for --web-tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE")]
    pub web_tls_key: Option<PathBuf>,
}

/// A certificate without its key, or the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("--web-tls-cert and --web-tls-key must be given together")]
pub struct TlsPairError;

impl TlsPairArgs {
    /// The certificate and key files, None when neither flag is given.
    pub fn pair(&self) -> Result<Option<(&Path, &Path)>, TlsPairError> {
        match (self.web_tls_cert.as_deref(), self.web_tls_key.as_deref()) {
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
            (None, None) => Ok(None),
            _ => Err(TlsPairError),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_or_neither() {
        let pair = |cert: Option<&str>, key: Option<&str>| TlsPairArgs {
            web_tls_cert: cert.map(PathBuf::from),
            web_tls_key: key.map(PathBuf::from),
        };
        assert_eq!(pair(None, None).pair(), Ok(None));
        assert_eq!(
            pair(Some("c.pem"), Some("k.pem")).pair(),
            Ok(Some((Path::new("c.pem"), Path::new("k.pem"))))
        );
        assert_eq!(pair(Some("c.pem"), None).pair(), Err(TlsPairError));
        assert_eq!(pair(None, Some("k.pem")).pair(), Err(TlsPairError));
    }
}
