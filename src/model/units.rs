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

/// The units a duration may be written in, longest spelling first so `ms` is not read as
/// `m` then `s`. The chart's template (deploy/helm/gpu-warden/templates/_validate_spelling.tpl,
/// `gpu-warden.re.duration`) holds the same list: the two must accept the same spellings.
const DURATION_UNITS: &[(&str, u64)] = &[
    ("nsec", 1),
    ("ns", 1),
    ("usec", 1_000),
    ("us", 1_000),
    ("\u{b5}s", 1_000),  // micro sign, as Go's time.ParseDuration takes it
    ("\u{3bc}s", 1_000), // Greek small mu, likewise
    ("msec", 1_000_000),
    ("ms", 1_000_000),
    ("seconds", 1_000_000_000),
    ("second", 1_000_000_000),
    ("sec", 1_000_000_000),
    ("s", 1_000_000_000),
    ("minutes", 60_000_000_000),
    ("minute", 60_000_000_000),
    ("min", 60_000_000_000),
    ("m", 60_000_000_000),
    ("hours", 3_600_000_000_000),
    ("hour", 3_600_000_000_000),
    ("hr", 3_600_000_000_000),
    ("h", 3_600_000_000_000),
    ("days", 86_400_000_000_000),
    ("day", 86_400_000_000_000),
    ("d", 86_400_000_000_000),
];

/// Parses a duration: one or more `<whole number><unit>` terms (`500ms`, `10s`, `1m 30s`,
/// `5000us` or `5000µs`), ASCII spaces allowed around and between them; `0` alone is zero.
/// Whole numbers only (`1500ms`, not `1.5s`) and ASCII whitespace only, so that the chart's
/// schema and template, whose regular expressions know ASCII whitespace alone, accept exactly
/// what the programs accept (issue 39). Callers add their own bounds.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let bad = |reason: &str| DurationError {
        input: s.to_string(),
        reason: reason.to_string(),
    };
    let mut rest = s.trim_matches(|c: char| c.is_ascii_whitespace());
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad(if rest.starts_with('.') || rest.starts_with(',') {
                "whole numbers only: write 1500ms, not 1.5s"
            } else {
                "expected a number"
            }));
        }
        let n: u128 = rest[..digits]
            .parse()
            .map_err(|_| bad("number too large"))?;
        rest = rest[digits..].trim_start_matches(|c: char| c.is_ascii_whitespace());
        if rest.starts_with('.') || rest.starts_with(',') {
            return Err(bad("whole numbers only: write 1500ms, not 1.5s"));
        }
        let Some((unit, scale)) = DURATION_UNITS.iter().find(|(u, _)| rest.starts_with(u)) else {
            return Err(bad("expected a unit: ns, us, ms, s, m, h or d"));
        };
        rest = &rest[unit.len()..];
        if rest.starts_with(|c: char| c.is_alphabetic()) {
            return Err(bad("expected a unit: ns, us, ms, s, m, h or d"));
        }
        rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
        nanos = n
            .checked_mul(u128::from(*scale))
            .and_then(|v| v.checked_add(nanos))
            .ok_or_else(|| bad("too long"))?;
    }
    // Whole seconds as far as Duration goes (u64), as humantime took them before.
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| bad("too long"))?;
    let sub = u32::try_from(nanos % 1_000_000_000).map_err(|_| bad("too long"))?;
    Ok(Duration::new(secs, sub))
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
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("5000us"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_duration("5000\u{b5}s"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_duration("5000\u{3bc}s"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_duration("2 minutes"), Ok(Duration::from_secs(120)));
        assert_eq!(
            parse_duration("18446744073709551615s"),
            Ok(Duration::from_secs(u64::MAX)),
            "as long as a Duration goes"
        );
        assert!(parse_duration("18446744073709551616s").is_err());
        // What the chart's regular expressions cannot take, the programs refuse too (issue 39).
        for s in [
            "1.5s", "5\u{a0}s", "\u{a0}5s", "", " ", "s", "5sec5", "5 years", "5msx", "-1s",
        ] {
            assert!(parse_duration(s).is_err(), "{s:?}");
        }
        let e = parse_duration("1.5s").unwrap_err().to_string();
        assert!(e.contains("whole numbers only"), "{e}");
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
