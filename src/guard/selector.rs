//! The guard's optional label selector: Kubernetes' equality-based selector syntax
//! (`workload-type=gpu-ci,team!=infra,has-key,!no-key`), parsed once at start so a typo
//! fails the configuration instead of silently matching nothing.
//!
//! Set-based requirements (`in`, `notin`) are refused rather than half-supported: a
//! selector that narrows who may be evicted must mean exactly what the operator wrote.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One term of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` or `key==value`: the label is present with exactly this value.
    Equals { key: String, value: String },
    /// `key!=value`: the label is absent or has another value (Kubernetes semantics).
    NotEquals { key: String, value: String },
    /// `key`: the label is present, whatever its value.
    Exists { key: String },
    /// `!key`: the label is absent.
    NotExists { key: String },
}

impl Requirement {
    /// Whether a pod with these labels satisfies this term.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals { key, value } => labels.get(key) == Some(value),
            Requirement::NotEquals { key, value } => labels.get(key) != Some(value),
            Requirement::Exists { key } => labels.contains_key(key),
            Requirement::NotExists { key } => !labels.contains_key(key),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requirement::Equals { key, value } => write!(f, "{key}={value}"),
            Requirement::NotEquals { key, value } => write!(f, "{key}!={value}"),
            Requirement::Exists { key } => write!(f, "{key}"),
            Requirement::NotExists { key } => write!(f, "!{key}"),
        }
    }
}

/// A parsed equality-based label selector; every requirement must hold (logical AND).
/// The empty selector matches every pod, as in Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    /// The terms in the order written.
    pub requirements: Vec<Requirement>,
}

/// Why a selector string was refused; the message quotes the offending term.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector term `{term}`: {reason}")]
pub struct SelectorError {
    /// The term as written (trimmed).
    pub term: String,
    /// What is wrong with it and what would be accepted.
    pub reason: String,
}

impl Selector {
    /// Parses `k=v,k!=v,k,!k` (whitespace around terms and operators is ignored).
    pub fn parse(input: &str) -> Result<Selector, SelectorError> {
        let input = input.trim();
        if input.is_empty() {
            return Ok(Selector::default());
        }
        let requirements = input
            .split(',')
            .map(parse_term)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Selector { requirements })
    }

    /// Whether a pod with these labels is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl FromStr for Selector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Selector::parse(s)
    }
}

impl Serialize for Selector {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Selector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        // In a file an empty selector is a mistake more often than a wish (a template that
        // rendered nothing): omitting the key already selects every pod (issue 39).
        if s.trim_matches(|c: char| c.is_ascii_whitespace()).is_empty() {
            return Err(serde::de::Error::custom(
                "an empty label selector; omit the key to select every pod",
            ));
        }
        Selector::parse(&s).map_err(serde::de::Error::custom)
    }
}

fn parse_term(raw: &str) -> Result<Requirement, SelectorError> {
    let term = raw.trim();
    let err = |reason: &str| SelectorError {
        term: term.to_string(),
        reason: reason.to_string(),
    };
    if term.is_empty() {
        return Err(err("empty term (two commas in a row, or a trailing comma)"));
    }
    if term.contains('(') || term.contains(')') || term.split_whitespace().count() > 1 {
        return Err(err(
            "whitespace or parentheses inside a term: set-based requirements (`in`, `notin`) are not supported; use `key=value`, `key!=value`, `key` or `!key`",
        ));
    }
    let req = if let Some(key) = term.strip_prefix('!') {
        if key.contains('=') {
            return Err(err(
                "`!` negates a key only; write `key!=value` to exclude a value",
            ));
        }
        Requirement::NotExists {
            key: key.trim().to_string(),
        }
    } else if let Some((key, value)) = term.split_once("!=") {
        Requirement::NotEquals {
            key: key.trim().to_string(),
            value: value.trim().to_string(),
        }
    } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        Requirement::Equals {
            key: key.trim().to_string(),
            value: value.trim().to_string(),
        }
    } else {
        Requirement::Exists {
            key: term.to_string(),
        }
    };
    let (key, value) = match &req {
        Requirement::Equals { key, value } | Requirement::NotEquals { key, value } => {
            (key, Some(value))
        }
        Requirement::Exists { key } | Requirement::NotExists { key } => (key, None),
    };
    check_key(key).map_err(|r| err(&r.to_string()))?;
    if let Some(v) = value {
        check_value(v).map_err(|r| err(&r.to_string()))?;
    }
    Ok(req)
}

/// Why a label key or value is not one Kubernetes accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("missing label key")]
    NoKey,
    #[error(
        "label key prefix `{0}` is not a DNS subdomain (lowercase letters, digits, `-` and `.`)"
    )]
    Prefix(String),
    #[error("label key has an empty name after its prefix")]
    NoName,
    #[error("label key name `{0}` must be at most 63 characters of letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit")]
    Name(String),
    #[error("label value `{0}` must be empty or at most 63 characters of letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit")]
    Value(String),
}

/// A label key is `[prefix/]name`: the prefix a DNS subdomain, the name a qualified name.
/// Also the form of an extended resource name (`nvidia.com/gpu`).
pub fn check_key(key: &str) -> Result<(), LabelError> {
    if key.is_empty() {
        return Err(LabelError::NoKey);
    }
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err(LabelError::Prefix(p.to_string()));
        }
    }
    if name.is_empty() {
        return Err(LabelError::NoName);
    }
    if !is_qualified_name(name) {
        return Err(LabelError::Name(name.to_string()));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), LabelError> {
    if value.is_empty() || is_qualified_name(value) {
        Ok(())
    } else {
        Err(LabelError::Value(value.to_string()))
    }
}

fn is_qualified_name(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.len() <= 63
        && s.chars().next().is_some_and(alnum)
        && s.chars().last().is_some_and(alnum)
        && s.chars()
            .all(|c| alnum(c) || c == '-' || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_term_kind() {
        let s =
            Selector::parse(" workload-type=gpu-ci , team!=infra,has-key,!no-key,a==b").unwrap();
        assert_eq!(
            s.requirements,
            vec![
                Requirement::Equals {
                    key: "workload-type".into(),
                    value: "gpu-ci".into()
                },
                Requirement::NotEquals {
                    key: "team".into(),
                    value: "infra".into()
                },
                Requirement::Exists {
                    key: "has-key".into()
                },
                Requirement::NotExists {
                    key: "no-key".into()
                },
                Requirement::Equals {
                    key: "a".into(),
                    value: "b".into()
                },
            ]
        );
        assert_eq!(
            s.to_string(),
            "workload-type=gpu-ci,team!=infra,has-key,!no-key,a=b"
        );
    }

    #[test]
    fn matching_table() {
        let s = Selector::parse("workload-type=gpu-ci,team!=infra,has-key,!no-key").unwrap();
        let cases: &[(&[(&str, &str)], bool)] = &[
            (&[("workload-type", "gpu-ci"), ("has-key", "")], true),
            (
                &[
                    ("workload-type", "gpu-ci"),
                    ("has-key", "x"),
                    ("team", "ml"),
                ],
                true,
            ),
            (
                &[
                    ("workload-type", "gpu-ci"),
                    ("has-key", "x"),
                    ("team", "infra"),
                ],
                false,
            ),
            (&[("workload-type", "other"), ("has-key", "x")], false),
            (&[("workload-type", "gpu-ci")], false),
            (
                &[
                    ("workload-type", "gpu-ci"),
                    ("has-key", "x"),
                    ("no-key", "y"),
                ],
                false,
            ),
        ];
        for (l, want) in cases {
            assert_eq!(s.matches(&labels(l)), *want, "labels {l:?}");
        }
        assert!(Selector::parse("").unwrap().matches(&labels(&[])));
    }

    #[test]
    fn prefixed_keys_are_accepted() {
        let s = Selector::parse("project.runner.gitlab.com/id=42").unwrap();
        assert!(s.matches(&labels(&[("project.runner.gitlab.com/id", "42")])));
    }

    #[test]
    fn bad_syntax_is_refused_with_the_term() {
        for bad in [
            "a=b,,c",
            "a=b,",
            "=x",
            "env in (prod)",
            "!a=b",
            "a=b c",
            "a=-bad",
            "Bad_Prefix/x=1",
            "/x",
            "x/",
            "a=b=c",
        ] {
            let e = Selector::parse(bad).unwrap_err();
            assert!(!e.reason.is_empty(), "{bad}");
            assert!(
                e.to_string().contains("invalid label selector term"),
                "{bad}: {e}"
            );
        }
    }
}
