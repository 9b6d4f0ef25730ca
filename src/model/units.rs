//! The spelling rules the configuration shares: durations (`500ms`, `10s`, `2m`) and RFC 1123
//! DNS names (namespaces, annotation prefixes, node names). One parser and one validator, so
//! a flag, a policy file and a scenario file accept the same spellings.

use std::time::Duration;

/// A duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?} ({reason}); write e.g. \"500ms\", \"10s\", \"2m\"")]
pub struct DurationError {
    /// What was written.
    pub input: String,
    /// What the parser said.
    pub reason: String,
}

/// Parses a duration with a unit (`500ms`, `10s`, `2m`, `1h 30m`); `0` alone is zero.
/// Surrounding whitespace is ignored. Callers add their own bounds.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t).map_err(|e| DurationError {
        input: s.to_string(),
        reason: e.to_string(),
    })
}

/// Why a name is not an RFC 1123 DNS name. The messages complete "… is not a DNS name: …".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DnsNameError {
    #[error("it is empty")]
    Empty,
    #[error("it is longer than 253 characters")]
    TooLong,
    #[error("it has an empty part between dots")]
    EmptyLabel,
    #[error("a part is longer than 63 characters")]
    LabelTooLong,
    #[error("it has a character other than a-z, 0-9, '-' and '.'")]
    BadCharacter,
    #[error("a part starts or ends with '-'")]
    Hyphen,
}

/// An RFC 1123 label (a namespace name): 1–63 of `a-z`, `0-9`, `-`, not starting or ending
/// with `-`.
pub fn check_dns_label(s: &str) -> Result<(), DnsNameError> {
    if s.is_empty() {
        return Err(DnsNameError::Empty);
    }
    if s.len() > 63 {
        return Err(DnsNameError::LabelTooLong);
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(DnsNameError::BadCharacter);
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err(DnsNameError::Hyphen);
    }
    Ok(())
}

/// The default prefix of every annotation key gpu-warden reads or writes: `<prefix>/evict`
/// and `<prefix>/vram-request-mib` on pods, `<prefix>/vram-free-mib` and friends on nodes.
/// One setting, `--annotation-prefix`, changes it for all of them.
pub const DEFAULT_ANNOTATION_PREFIX: &str = "gpu-warden.io";

/// An RFC 1123 subdomain (an annotation key's prefix, a node name): at most 253 characters
/// of labels joined by dots.
pub fn check_dns_subdomain(s: &str) -> Result<(), DnsNameError> {
    if s.is_empty() {
        return Err(DnsNameError::Empty);
    }
    if s.len() > 253 {
        return Err(DnsNameError::TooLong);
    }
    for label in s.split('.') {
        match check_dns_label(label) {
            Err(DnsNameError::Empty) => return Err(DnsNameError::EmptyLabel),
            other => other?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration(" 250ms "), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        let e = parse_duration("soon").unwrap_err().to_string();
        assert!(
            e.starts_with("invalid duration \"soon\" (") && e.contains("\"500ms\""),
            "{e}"
        );
        assert!(parse_duration("10").is_err(), "a unit is required");
    }

    #[test]
    fn dns_names() {
        let long_label = "a".repeat(64);
        let rows: &[(&str, Result<(), DnsNameError>)] = &[
            ("gpu-warden.io", Ok(())),
            ("a", Ok(())),
            ("", Err(DnsNameError::Empty)),
            ("a..b", Err(DnsNameError::EmptyLabel)),
            ("Gpu.io", Err(DnsNameError::BadCharacter)),
            ("-a.io", Err(DnsNameError::Hyphen)),
            ("a-.io", Err(DnsNameError::Hyphen)),
            ("a_b.io", Err(DnsNameError::BadCharacter)),
        ];
        for (s, want) in rows {
            assert_eq!(check_dns_subdomain(s), *want, "{s:?}");
        }
        assert_eq!(
            check_dns_subdomain(&format!("{long_label}.io")),
            Err(DnsNameError::LabelTooLong),
            "the 63-character label limit"
        );
        assert_eq!(
            check_dns_subdomain(&"a.".repeat(127)),
            Err(DnsNameError::TooLong)
        );
        assert_eq!(check_dns_label("a.b"), Err(DnsNameError::BadCharacter));
        assert_eq!(check_dns_label("kube-system"), Ok(()));
    }
}
