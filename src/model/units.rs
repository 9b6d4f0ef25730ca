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

/// Why a number has no unit: a bare `10` could be seconds (Prometheus) or nanoseconds (Go).
const NO_UNIT: &str = "a unit is required after each number: ns, us, ms, s, m, h or d";

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
            return Err(bad(NO_UNIT));
        };
        rest = &rest[unit.len()..];
        if rest.starts_with(|c: char| c.is_alphabetic()) {
            return Err(bad(NO_UNIT));
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

/// The one serde adapter for durations in files (the guard policy, scenarios):
/// `#[serde(with = "crate::model::units::duration_serde")]`, or its `option` for an
/// `Option<Duration>`. Whatever YAML made of the value (a string, or a number when the unit
/// was left out), it goes through [`parse_duration`], so every file accepts the spellings a
/// flag does and a bad value gets [`DurationError`]'s one message; `0` alone is zero there too.
/// Written back as humantime writes it (`1m 30s`), which [`parse_duration`] reads.
pub mod duration_serde {
    use serde::de::{Deserialize, Deserializer, Error, Visitor};
    use serde::Serializer;
    use std::fmt;
    use std::time::Duration;

    /// Writes `d` as `10s`, `500ms`, `1m 30s`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    /// Reads a duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(Text)
    }

    /// The same for an optional key; an absent or null value is `None`.
    pub mod option {
        use super::{Deserialize, Deserializer, Duration};

        /// Reads an optional duration.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            Ok(Option::<Parsed>::deserialize(d)?.map(|p| p.0))
        }

        struct Parsed(Duration);

        impl<'de> Deserialize<'de> for Parsed {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                super::deserialize(d).map(Parsed)
            }
        }
    }

    struct Text;

    impl Visitor<'_> for Text {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration with a unit, like \"10s\" or \"500ms\"")
        }

        fn visit_str<E: Error>(self, v: &str) -> Result<Duration, E> {
            super::parse_duration(v).map_err(E::custom)
        }

        // A number is what YAML makes of a duration written without its unit.
        fn visit_u64<E: Error>(self, v: u64) -> Result<Duration, E> {
            self.visit_str(&v.to_string())
        }

        fn visit_i64<E: Error>(self, v: i64) -> Result<Duration, E> {
            self.visit_str(&v.to_string())
        }

        fn visit_f64<E: Error>(self, v: f64) -> Result<Duration, E> {
            self.visit_str(&v.to_string())
        }
    }
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

    /// Every file reads durations through one adapter with one message, wherever the key
    /// sits (a struct, an internally tagged enum as the scenarios' faults, an optional key).
    #[test]
    fn one_serde_adapter_one_message() {
        #[derive(Debug, serde::Deserialize)]
        struct Plain {
            #[serde(with = "duration_serde")]
            d: Duration,
            #[serde(default, deserialize_with = "duration_serde::option::deserialize")]
            o: Option<Duration>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(tag = "kind")]
        enum Tagged {
            Lost {
                #[serde(deserialize_with = "duration_serde::deserialize")]
                at: Duration,
            },
        }
        let plain = |y: &str| serde_yaml_ng::from_str::<Plain>(y).map_err(|e| e.to_string());
        let tagged = |y: &str| {
            serde_yaml_ng::from_str::<Tagged>(&format!("kind: Lost\nat: {y}\n"))
                .map(|Tagged::Lost { at }| at)
                .map_err(|e| e.to_string())
        };
        let p = plain("d: 1m 30s\no: 250ms\n").unwrap();
        assert_eq!(
            (p.d, p.o),
            (Duration::from_secs(90), Some(Duration::from_millis(250)))
        );
        assert_eq!(plain("d: 0\n").unwrap().o, None);
        assert_eq!(plain("d: 0\no: ~\n").unwrap().d, Duration::ZERO);
        assert_eq!(tagged("0"), Ok(Duration::ZERO));
        assert_eq!(tagged("\"10s\""), Ok(Duration::from_secs(10)));
        for (value, why) in [
            ("10", "a unit is required"),
            ("1.5", "whole numbers only"),
            ("-1", "expected a number"),
            ("soon", "expected a number"),
        ] {
            let want = parse_duration(value).unwrap_err().to_string();
            assert!(want.contains(why), "{want}");
            for got in [
                plain(&format!("d: {value}\n")).unwrap_err(),
                plain(&format!("d: 1s\no: {value}\n")).unwrap_err(),
                tagged(value).unwrap_err(),
            ] {
                assert!(got.contains(&want), "{value}: {got}");
            }
        }
        let e = plain("d: 10\n").unwrap_err();
        assert!(e.contains("\"10s\""), "{e}");
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
