//! Label and field selectors, with the API server's syntax.
//!
//! Label selectors: `a=b`, `a==b`, `a!=b`, `a` (exists), `!a` (does not exist),
//! `a in (x,y)`, `a notin (x,y)`, comma-joined (all must hold).
//!
//! Field selectors: `path=v`, `path==v`, `path!=v`, comma-joined, where `path` is any dotted
//! path into the object (`spec.nodeName`, `metadata.name`, `metadata.namespace`,
//! `status.phase`, …). A missing field compares as the empty string, so `spec.nodeName=`
//! selects unscheduled pods. (The real API server only allows a fixed set of fields per
//! resource; the double is more permissive.)

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelRequirement {
    /// `key=value` / `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the label is absent).
    NotEquals(String, String),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
    /// `key in (v1,v2)`.
    In(String, Vec<String>),
    /// `key notin (v1,v2)` (also true when the label is absent).
    NotIn(String, Vec<String>),
}

/// Why a selector does not parse (the double answers 400 with it, as kube-apiserver does).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label requirement that is none of `k`, `!k`, `k=v`, `k!=v`, `k in (…)`, `k notin (…)`.
    #[error("unable to parse requirement: {0:?}")]
    Requirement(String),
    /// A field term without `=`, `==` or `!=`.
    #[error("invalid field selector term {0:?}: expected key=value")]
    NoOperator(String),
    /// A field term with nothing before its operator.
    #[error("invalid field selector term {0:?}: empty field")]
    EmptyField(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelRequirement>);

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in split_top_level(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_label_term(term)?);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether an object's `metadata.labels` satisfies every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::DoesNotExist(k) => get(k).is_none(),
            LabelRequirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelRequirement::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        })
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_label_term(term: &str) -> Result<LabelRequirement, SelectorError> {
    let bad = || SelectorError::Requirement(term.to_string());
    if let Some(k) = term.strip_prefix('!') {
        let k = k.trim();
        return if valid_key(k) {
            Ok(LabelRequirement::DoesNotExist(k.to_string()))
        } else {
            Err(bad())
        };
    }
    if let Some(open) = term.find('(') {
        let close = term.rfind(')').ok_or_else(bad)?;
        if close != term.len() - 1 || close < open {
            return Err(bad());
        }
        let mut head = term[..open].split_whitespace();
        let key = head.next().ok_or_else(bad)?;
        let op = head.next().ok_or_else(bad)?;
        if head.next().is_some() || !valid_key(key) {
            return Err(bad());
        }
        let values: Vec<String> = term[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_string())
            .collect();
        return match op {
            "in" => Ok(LabelRequirement::In(key.to_string(), values)),
            "notin" => Ok(LabelRequirement::NotIn(key.to_string(), values)),
            _ => Err(bad()),
        };
    }
    for (op, neg) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = term.split_once(op) {
            let (k, v) = (k.trim(), v.trim());
            if !valid_key(k) {
                return Err(bad());
            }
            return Ok(if neg {
                LabelRequirement::NotEquals(k.to_string(), v.to_string())
            } else {
                LabelRequirement::Equals(k.to_string(), v.to_string())
            });
        }
    }
    if valid_key(term) {
        Ok(LabelRequirement::Exists(term.to_string()))
    } else {
        Err(bad())
    }
}

/// One field requirement: a dotted path compared with a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The dotted path, e.g. `spec.nodeName`.
    pub path: String,
    /// The value compared against (missing fields compare as `""`).
    pub value: String,
    /// `true` for `!=`.
    pub negated: bool,
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldRequirement>);

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in s.split(',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (path, value, negated) = if let Some((p, v)) = term.split_once("!=") {
                (p, v, true)
            } else if let Some((p, v)) = term.split_once("==") {
                (p, v, false)
            } else if let Some((p, v)) = term.split_once('=') {
                (p, v, false)
            } else {
                return Err(SelectorError::NoOperator(term.to_string()));
            };
            let path = path.trim();
            if path.is_empty() {
                return Err(SelectorError::EmptyField(term.to_string()));
            }
            reqs.push(FieldRequirement {
                path: path.to_string(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether the object satisfies every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let actual = field_value(obj, &r.path);
            (actual == r.value) != r.negated
        })
    }
}

/// The value at a dotted path, rendered as a string; `""` when missing or null.
fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"metadata": {"name": "p1", "namespace": "ci",
                "labels": {"app": "gpu", "tier": "ci", "workload-type": "gpu-ci"}},
               "spec": {"nodeName": "n1", "priority": 10}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_selectors() {
        let p = pod();
        let m = |s: &str| LabelSelector::parse(s).map(|l| l.matches(&p));
        assert_eq!(m(""), Ok(true));
        assert_eq!(m("app=gpu"), Ok(true));
        assert_eq!(m("app==gpu,tier=ci"), Ok(true));
        assert_eq!(m("app!=gpu"), Ok(false));
        assert_eq!(m("missing!=x"), Ok(true));
        assert_eq!(m("app"), Ok(true));
        assert_eq!(m("!app"), Ok(false));
        assert_eq!(m("!nope"), Ok(true));
        assert_eq!(m("tier in (ci, prod)"), Ok(true));
        assert_eq!(m("tier in (prod),app=gpu"), Ok(false));
        assert_eq!(m("tier notin (prod)"), Ok(true));
        assert_eq!(m("nope notin (prod)"), Ok(true));
        assert_eq!(m("workload-type=gpu-ci"), Ok(true));
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("a in x").is_err());
    }

    #[test]
    fn field_selectors() {
        let p = pod();
        let m = |s: &str| FieldSelector::parse(s).map(|f| f.matches(&p));
        assert_eq!(m("spec.nodeName=n1"), Ok(true));
        assert_eq!(m("spec.nodeName==n2"), Ok(false));
        assert_eq!(m("spec.nodeName!=n2,metadata.namespace=ci"), Ok(true));
        assert_eq!(m("metadata.name=p1,status.phase!=Running"), Ok(false));
        assert_eq!(m("spec.priority=10"), Ok(true));
        assert_eq!(m("spec.missing="), Ok(true));
        assert!(FieldSelector::parse("spec.nodeName").is_err());
    }
}
