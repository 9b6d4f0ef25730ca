//! Optional authentication of `/metrics`, `/state` and `/` (`--web-auth-bearer-file` or
//! `--web-auth-basic-file`). The probes `/healthz` and `/readyz` stay open: the kubelet
//! cannot present credentials, and they reveal nothing but liveness.
//!
//! Secrets are compared in constant time and never logged; [`Auth`]'s `Debug` redacts them.

use base64::Engine;
use hyper::header::HeaderValue;
use ring::digest::{digest, SHA256};
use std::path::{Path, PathBuf};
use subtle::{Choice, ConstantTimeEq};

/// The realm announced in the Basic challenge.
pub const REALM: &str = "gpu-warden";

/// Configured credentials.
#[derive(Clone)]
pub enum Auth {
    /// `Authorization: Bearer <token>`; holds SHA-256 of the token.
    Bearer([u8; 32]),
    /// `Authorization: Basic ...`; holds (user, SHA-256 of the password) pairs.
    Basic(Vec<(String, [u8; 32])>),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Bearer(_) => f.write_str("Auth::Bearer(<redacted>)"),
            Auth::Basic(u) => write!(f, "Auth::Basic({} users, <redacted>)", u.len()),
        }
    }
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, b).as_ref());
    out
}

/// A flag's file that cannot be used (TLS certificate or key, credentials). Messages name the
/// flag and the path, never the file's contents.
#[derive(Debug, thiserror::Error)]
pub enum FlagFileError {
    #[error("{flag} {}: cannot read: {source}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {}: {problem}", path.display())]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error("{cert_flag} {} / {key_flag} {}: {reason}", cert.display(), key.display())]
    Pair {
        cert_flag: &'static str,
        key_flag: &'static str,
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("TLS set-up failed: {0}")]
    Tls(String),
}

impl FlagFileError {
    pub(crate) fn invalid(flag: &'static str, path: &Path, problem: impl Into<String>) -> Self {
        FlagFileError::Invalid {
            flag,
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}

fn read_text(path: &Path, flag: &'static str) -> Result<String, FlagFileError> {
    let bytes = std::fs::read(path).map_err(|source| FlagFileError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|_| FlagFileError::invalid(flag, path, "not UTF-8 text"))
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Auth {
    /// Reads the bearer token from `path`; trailing line breaks are trimmed. An empty token
    /// is an error.
    pub fn bearer_from_file(path: &Path) -> Result<Auth, FlagFileError> {
        let flag = "--web-auth-bearer-file";
        let text = read_text(path, flag)?;
        let token = text.trim_end_matches(['\n', '\r']);
        if token.is_empty() {
            return Err(FlagFileError::invalid(flag, path, "the file is empty"));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(FlagFileError::invalid(
                flag,
                path,
                "the token must be one line without spaces",
            ));
        }
        Ok(Auth::Bearer(sha256(token.as_bytes())))
    }

    /// Reads `user:<sha256 hex of the password>` lines from `path` (blank lines and lines
    /// starting with `#` are skipped). Plain-text passwords are refused.
    pub fn basic_from_file(path: &Path) -> Result<Auth, FlagFileError> {
        let flag = "--web-auth-basic-file";
        let text = read_text(path, flag)?;
        let mut users = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // Never echo the line: it may hold a plain-text password by mistake.
            let bad = || {
                FlagFileError::invalid(
                    flag,
                    path,
                    format!(
                        "line {}: expected user:<64 hex digits, the SHA-256 of the password>",
                        n + 1
                    ),
                )
            };
            let (user, hash) = line.split_once(':').ok_or_else(bad)?;
            let hash = hash.strip_prefix("$sha256$").unwrap_or(hash);
            if user.is_empty() {
                return Err(bad());
            }
            let hash = parse_hex32(hash).ok_or_else(bad)?;
            users.push((user.to_string(), hash));
        }
        if users.is_empty() {
            return Err(FlagFileError::invalid(flag, path, "no users"));
        }
        Ok(Auth::Basic(users))
    }

    /// The `WWW-Authenticate` value sent with 401.
    pub fn challenge(&self) -> &'static str {
        match self {
            Auth::Bearer(_) => "Bearer",
            Auth::Basic(_) => "Basic realm=\"gpu-warden\"",
        }
    }

    /// Whether the request's `Authorization` header carries valid credentials.
    pub fn check(&self, header: Option<&HeaderValue>) -> bool {
        let Some(value) = header.and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let Some((scheme, cred)) = value.trim().split_once(' ') else {
            return false;
        };
        let cred = cred.trim();
        match self {
            Auth::Bearer(want) => {
                // Comparing digests keeps the time independent of the token's length.
                scheme.eq_ignore_ascii_case("bearer")
                    && bool::from(sha256(cred.as_bytes()).ct_eq(want))
            }
            Auth::Basic(users) => {
                if !scheme.eq_ignore_ascii_case("basic") {
                    return false;
                }
                let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(cred) else {
                    return false;
                };
                let Some(colon) = decoded.iter().position(|&b| b == b':') else {
                    return false;
                };
                let (user, pass) = (&decoded[..colon], &decoded[colon + 1..]);
                let got = sha256(pass);
                // Look at every entry, so the time does not depend on which user matched.
                let mut ok = Choice::from(0);
                for (u, h) in users {
                    ok |= u.as_bytes().ct_eq(user) & got.ct_eq(h);
                }
                bool::from(ok)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn hex(b: &[u8]) -> String {
        sha256(b).iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn bearer_trims_newline_and_compares() {
        let f = file("s3cret\n");
        let a = Auth::bearer_from_file(f.path()).unwrap();
        assert!(a.check(Some(&HeaderValue::from_static("Bearer s3cret"))));
        assert!(!a.check(Some(&HeaderValue::from_static("Bearer s3cre"))));
        assert!(!a.check(Some(&HeaderValue::from_static("Basic s3cret"))));
        assert!(!a.check(None));
        assert!(!format!("{a:?}").contains("s3cret"));
        assert!(Auth::bearer_from_file(file("\n").path())
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }

    #[test]
    fn basic_checks_user_and_password() {
        let f = file(&format!(
            "# comment\nalice:{}\nbob:$sha256${}\n",
            hex(b"pw1"),
            hex(b"pw2")
        ));
        let a = Auth::basic_from_file(f.path()).unwrap();
        let h = |s: &str| {
            let v = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            );
            HeaderValue::from_str(&v).unwrap()
        };
        assert!(a.check(Some(&h("alice:pw1"))));
        assert!(a.check(Some(&h("bob:pw2"))));
        assert!(!a.check(Some(&h("alice:pw2"))));
        assert!(!a.check(Some(&h("carol:pw1"))));
        assert!(!a.check(Some(&HeaderValue::from_static("Basic !!!"))));
    }

    #[test]
    fn plain_text_passwords_are_refused_without_echo() {
        let e = Auth::basic_from_file(file("alice:hunter2\n").path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && !e.contains("hunter2"), "{e}");
    }
}
