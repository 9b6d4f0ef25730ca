//! A pod's VRAM need: its own declaration (`<prefix>/vram-request-mib`, the annotation the
//! guard ranks by), else a default the operator configured for its namespace or labels
//! (e.g. one per GitLab runner), else "unknown", which a rule turns into "pass unchecked"
//! or "reserve this much".

use super::wire::PodView;
use crate::guard::selector::Selector;
use crate::model::vram_request;
use serde::Deserialize;

/// A configured default need, for pods matching a namespace and/or a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DefaultNeed {
    /// Only pods in this namespace (any namespace when unset).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Only pods whose labels match (equality-based syntax; every pod when unset).
    #[serde(default)]
    pub selector: Option<Selector>,
    /// The need, MiB.
    pub mib: u64,
}

/// What to do with a pod whose need is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", tag = "rule")]
pub enum UnknownNeed {
    /// Let it through every node unchecked (the scheduler's own rules still apply).
    Pass,
    /// Treat it as needing this many MiB.
    Reserve {
        /// MiB to assume.
        mib: u64,
    },
}

/// The need rules, in the order they are tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeedRules {
    /// The pod annotation that declares a need (`<prefix>/vram-request-mib`).
    pub annotation: String,
    /// Defaults, first match wins.
    pub defaults: Vec<DefaultNeed>,
    /// The rule for the rest.
    pub unknown: UnknownNeed,
}

/// Where a need came from, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeedSource {
    /// The pod's own annotation.
    Declared,
    /// The n-th configured default (0-based).
    Default(usize),
    /// The unknown rule's reservation.
    UnknownReserved,
    /// Unknown, passed unchecked.
    UnknownPassed,
}

/// A pod's resolved need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// MiB to find room for; `None`: do not check (unknown need, rule `pass`).
    pub mib: Option<u64>,
    /// Where it came from.
    pub source: NeedSource,
}

/// A declaration the extender cannot read: the pod is refused everywhere with this reason,
/// so the mistake is visible in its events instead of silently ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key}={value:?} is not a whole number of MiB")]
pub struct BadDeclaration {
    /// The annotation key.
    pub key: String,
    /// What it holds.
    pub value: String,
}

impl NeedRules {
    /// The need of `pod`.
    pub fn need(&self, pod: &PodView) -> Result<Need, BadDeclaration> {
        if let Some(v) = pod.annotation(&self.annotation) {
            return match vram_request::parse_mib(v) {
                Some(mib) => Ok(Need {
                    mib: Some(mib),
                    source: NeedSource::Declared,
                }),
                None => Err(BadDeclaration {
                    key: self.annotation.clone(),
                    value: v.to_string(),
                }),
            };
        }
        let labels = pod.labels();
        let hit = self.defaults.iter().position(|d| {
            d.namespace
                .as_deref()
                .is_none_or(|ns| ns == pod.namespace())
                && d.selector.as_ref().is_none_or(|s| s.matches(&labels))
        });
        if let Some(i) = hit {
            return Ok(Need {
                mib: Some(self.defaults[i].mib),
                source: NeedSource::Default(i),
            });
        }
        Ok(match self.unknown {
            UnknownNeed::Pass => Need {
                mib: None,
                source: NeedSource::UnknownPassed,
            },
            UnknownNeed::Reserve { mib } => Need {
                mib: Some(mib),
                source: NeedSource::UnknownReserved,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, labels: &[(&str, &str)], ann: &[(&str, &str)]) -> PodView {
        let j = serde_json::json!({"metadata": {"name": "p", "namespace": ns,
            "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            "annotations": ann.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>()}});
        serde_json::from_value(j).unwrap()
    }

    fn rules(unknown: UnknownNeed) -> NeedRules {
        NeedRules {
            annotation: "gpu-warden.io/vram-request-mib".into(),
            defaults: vec![
                DefaultNeed {
                    namespace: Some("gitlab".into()),
                    selector: Some(Selector::parse("project.runner.gitlab.com/id=7").unwrap()),
                    mib: 12288,
                },
                DefaultNeed {
                    namespace: Some("gitlab".into()),
                    selector: None,
                    mib: 4096,
                },
            ],
            unknown,
        }
    }

    #[test]
    fn table() {
        let key = "gpu-warden.io/vram-request-mib";
        let reserve = UnknownNeed::Reserve { mib: 2048 };
        let cases: Vec<(PodView, UnknownNeed, Result<Need, BadDeclaration>)> = vec![
            (
                pod(
                    "gitlab",
                    &[("project.runner.gitlab.com/id", "7")],
                    &[(key, "8192")],
                ),
                reserve,
                Ok(Need {
                    mib: Some(8192),
                    source: NeedSource::Declared,
                }),
            ),
            (
                pod("gitlab", &[("project.runner.gitlab.com/id", "7")], &[]),
                reserve,
                Ok(Need {
                    mib: Some(12288),
                    source: NeedSource::Default(0),
                }),
            ),
            (
                pod("gitlab", &[], &[]),
                reserve,
                Ok(Need {
                    mib: Some(4096),
                    source: NeedSource::Default(1),
                }),
            ),
            (
                pod("ml", &[], &[]),
                reserve,
                Ok(Need {
                    mib: Some(2048),
                    source: NeedSource::UnknownReserved,
                }),
            ),
            (
                pod("ml", &[], &[]),
                UnknownNeed::Pass,
                Ok(Need {
                    mib: None,
                    source: NeedSource::UnknownPassed,
                }),
            ),
            (
                pod("ml", &[], &[(key, "8Gi")]),
                UnknownNeed::Pass,
                Err(BadDeclaration {
                    key: key.into(),
                    value: "8Gi".into(),
                }),
            ),
        ];
        for (i, (p, unknown, want)) in cases.into_iter().enumerate() {
            assert_eq!(rules(unknown).need(&p), want, "case {i}");
        }
    }
}
