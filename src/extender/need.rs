//! A pod's VRAM need: its own declaration (`<prefix>/vram-request-mib`, the annotation the
//! guard ranks by; raised to the need learned for its GitLab project when that is higher),
//! else the need learned for its project (the p95 of the project's job peaks,
//! [`super::learned`]), else a default the operator configured for its namespace
//! or labels (e.g. one per GitLab runner), else "unknown", which a rule turns into "reserve
//! this much" (the shipped chart default) or "pass unchecked".

use super::learned::LearnedNeeds;
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
#[serde(try_from = "UnknownNeedFile")]
pub enum UnknownNeed {
    /// Let it through every node unchecked (the scheduler's own rules still apply).
    Pass,
    /// Treat it as needing this many MiB.
    Reserve {
        /// MiB to assume.
        mib: u64,
    },
    /// Treat it as needing a whole GPU, whatever the model: all the memory one with nothing
    /// on it shows, less the margin ([`Need::on_gpus_of`]).
    WholeGpu,
}

/// `unknownNeed` as written: serde's tagged enums let `{rule: pass, mib: 4096}` through with
/// the `mib` ignored, which the chart's schema refuses; this shape refuses it too (issue 39).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnknownNeedFile {
    rule: String,
    mib: Option<u64>,
}

impl TryFrom<UnknownNeedFile> for UnknownNeed {
    type Error = String;
    fn try_from(f: UnknownNeedFile) -> Result<Self, String> {
        match (f.rule.as_str(), f.mib) {
            ("reserve", Some(mib)) => Ok(UnknownNeed::Reserve { mib }),
            ("reserve", None) => Err("unknownNeed.mib is required with rule reserve".into()),
            (rule @ ("pass" | "wholeGpu"), Some(_)) => Err(format!(
                "unknownNeed.mib goes with rule reserve only; rule {rule} takes no mib"
            )),
            ("pass", None) => Ok(UnknownNeed::Pass),
            ("wholeGpu", None) => Ok(UnknownNeed::WholeGpu),
            (other, _) => Err(format!(
                "unknownNeed.rule {other:?}: expected wholeGpu, reserve or pass"
            )),
        }
    }
}

/// The need of a whole GPU before a node says how large its GPUs are: past any GPU, so
/// [`Need::on_gpus_of`] turns it into that node's GPU (a node that cannot be read is judged
/// by the `unknownNode` rule, never against this figure).
pub const WHOLE_GPU_MIB: u64 = 1 << 30;

/// The need rules, in the order they are tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeedRules {
    /// The pod annotation that declares a need (`<prefix>/vram-request-mib`).
    pub annotation: String,
    /// The pod label naming its GitLab project (learned needs are by project).
    pub project_label: String,
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
    /// Learned from this many of its GitLab project's job peaks.
    Learned(u64),
    /// The n-th configured default (0-based).
    Default(usize),
    /// The unknown rule's reservation.
    UnknownReserved,
    /// The unknown rule's whole GPU.
    UnknownWholeGpu,
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
    /// For a learned need, the lower bound of the histogram bucket its p95 lies in: the
    /// need is known only to within `(floor_mib, mib]`. A need whose bucket reaches past a
    /// GPU while its floor fits is judged as that whole GPU ([`Need::on_gpus_of`]).
    pub floor_mib: Option<u64>,
}

impl Need {
    /// MiB to find room for on GPUs that give `usable_mib` each with nothing on them (what
    /// they show less the margin). A learned need rounded up past the GPU, whose bucket
    /// starts below it, asks for the whole GPU: the project's jobs were seen to fit one (a
    /// p95 between 16 and 24 GiB on a 23 GiB A10G) and judged on 24 GiB they could never be
    /// placed again once learned. A declared need past the GPU stays as it is: refused, with
    /// the reason.
    pub fn on_gpus_of(&self, usable_mib: u64) -> Option<u64> {
        let mib = self.mib?;
        Some(match self.floor_mib {
            Some(floor) if mib > usable_mib && floor < usable_mib => usable_mib,
            _ => mib,
        })
    }
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
    /// The need of `pod`, `learned` holding the projects' learned needs.
    pub fn need(&self, pod: &PodView, learned: &LearnedNeeds) -> Result<Need, BadDeclaration> {
        let labels = pod.labels();
        let learned = labels
            .get(&self.project_label)
            .and_then(|p| learned.get(pod.namespace(), p));
        if let Some(v) = pod.annotation(&self.annotation) {
            let Some(mib) = vram_request::parse_mib(v) else {
                return Err(BadDeclaration {
                    key: self.annotation.clone(),
                    value: v.to_string(),
                });
            };
            // A declaration below what the project's jobs are seen to peak at (p95) is
            // raised to it: a low declaration is the commonest way a job dies of OOM, and
            // the guard cannot stop an allocation that lands in one step.
            return Ok(match learned {
                Some(n) if n.mib > mib => Need {
                    mib: Some(n.mib),
                    source: NeedSource::Learned(n.jobs),
                    floor_mib: Some(n.floor_mib.max(mib)),
                },
                _ => Need {
                    mib: Some(mib),
                    source: NeedSource::Declared,
                    floor_mib: None,
                },
            });
        }
        if let Some(n) = learned {
            return Ok(Need {
                mib: Some(n.mib),
                source: NeedSource::Learned(n.jobs),
                floor_mib: Some(n.floor_mib),
            });
        }
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
                floor_mib: None,
            });
        }
        Ok(match self.unknown {
            UnknownNeed::Pass => Need {
                mib: None,
                source: NeedSource::UnknownPassed,
                floor_mib: None,
            },
            UnknownNeed::Reserve { mib } => Need {
                mib: Some(mib),
                source: NeedSource::UnknownReserved,
                floor_mib: None,
            },
            UnknownNeed::WholeGpu => Need {
                mib: Some(WHOLE_GPU_MIB),
                source: NeedSource::UnknownWholeGpu,
                floor_mib: Some(0),
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
            project_label: "project.runner.gitlab.com/id".into(),
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
                    floor_mib: None,
                }),
            ),
            (
                pod("gitlab", &[("project.runner.gitlab.com/id", "7")], &[]),
                reserve,
                Ok(Need {
                    mib: Some(12288),
                    source: NeedSource::Default(0),
                    floor_mib: None,
                }),
            ),
            (
                pod("gitlab", &[], &[]),
                reserve,
                Ok(Need {
                    mib: Some(4096),
                    source: NeedSource::Default(1),
                    floor_mib: None,
                }),
            ),
            (
                pod("ml", &[], &[]),
                reserve,
                Ok(Need {
                    mib: Some(2048),
                    source: NeedSource::UnknownReserved,
                    floor_mib: None,
                }),
            ),
            (
                pod("ml", &[], &[]),
                UnknownNeed::Pass,
                Ok(Need {
                    mib: None,
                    source: NeedSource::UnknownPassed,
                    floor_mib: None,
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
            assert_eq!(
                rules(unknown).need(&p, &LearnedNeeds::default()),
                want,
                "case {i}"
            );
        }
    }

    #[test]
    fn a_learned_need_comes_after_the_declaration_and_before_the_defaults() {
        use crate::extender::learned::LearnedNeed;
        let learned = LearnedNeeds::from_entries([(
            "gitlab".to_string(),
            "7".to_string(),
            LearnedNeed {
                mib: 6144,
                jobs: 120,
                floor_mib: 4096,
            },
        )]);
        let r = rules(UnknownNeed::Reserve { mib: 2048 });
        let p7 = pod("gitlab", &[("project.runner.gitlab.com/id", "7")], &[]);
        assert_eq!(
            r.need(&p7, &learned),
            Ok(Need {
                mib: Some(6144),
                source: NeedSource::Learned(120),
                floor_mib: Some(4096),
            })
        );
        // A declaration above the learned need stands; one below it is raised to it.
        let declared = |mib: &str| {
            pod(
                "gitlab",
                &[("project.runner.gitlab.com/id", "7")],
                &[("gpu-warden.io/vram-request-mib", mib)],
            )
        };
        assert_eq!(
            r.need(&declared("8192"), &learned),
            Ok(Need {
                mib: Some(8192),
                source: NeedSource::Declared,
                floor_mib: None,
            })
        );
        assert_eq!(
            r.need(&declared("1024"), &learned),
            Ok(Need {
                mib: Some(6144),
                source: NeedSource::Learned(120),
                floor_mib: Some(4096),
            })
        );
        // Same project ID in another namespace: not the same project's runner.
        let other_ns = pod("ml", &[("project.runner.gitlab.com/id", "7")], &[]);
        assert_eq!(
            r.need(&other_ns, &learned).unwrap().source,
            NeedSource::UnknownReserved
        );
        // Another project falls to the namespace default.
        let p8 = pod("gitlab", &[("project.runner.gitlab.com/id", "8")], &[]);
        assert_eq!(
            r.need(&p8, &learned).unwrap().source,
            NeedSource::Default(1)
        );
    }

    #[test]
    fn a_learned_need_rounded_up_past_the_gpu_asks_for_the_whole_gpu_a_declared_one_does_not() {
        use crate::extender::learned::LearnedNeed;
        // A project whose p95 lies in (16, 24] GiB, on A10Gs of 23028 MiB less a 512 margin.
        let learned = LearnedNeeds::from_entries([(
            "gitlab".to_string(),
            "9".to_string(),
            LearnedNeed {
                mib: 24576,
                jobs: 12,
                floor_mib: 16384,
            },
        )]);
        let r = rules(UnknownNeed::Reserve { mib: 2048 });
        let usable = 23028 - 512;
        let p9 = |ann: &[(&str, &str)]| {
            r.need(
                &pod("gitlab", &[("project.runner.gitlab.com/id", "9")], ann),
                &learned,
            )
            .unwrap()
        };
        assert_eq!(p9(&[]).on_gpus_of(usable), Some(usable), "the whole GPU");
        // On a GPU the bucket fits in (an 80 GiB one), the bucket's bound as learned.
        assert_eq!(p9(&[]).on_gpus_of(80 * 1024 - 512), Some(24576));
        // Declared below the learned need: raised to it, still the whole GPU.
        let low = p9(&[("gpu-warden.io/vram-request-mib", "8192")]);
        assert_eq!(low.on_gpus_of(usable), Some(usable));
        // Declared past the GPU: the pod's own word, refused rather than shrunk.
        let big = p9(&[("gpu-warden.io/vram-request-mib", "30720")]);
        assert_eq!(big.on_gpus_of(usable), Some(30720));
        // A floor at or past the GPU (the bucket starts past it): as learned.
        let past = LearnedNeeds::from_entries([(
            "gitlab".to_string(),
            "9".to_string(),
            LearnedNeed {
                mib: 32768,
                jobs: 12,
                floor_mib: 24576,
            },
        )]);
        let p = pod("gitlab", &[("project.runner.gitlab.com/id", "9")], &[]);
        assert_eq!(r.need(&p, &past).unwrap().on_gpus_of(usable), Some(32768));
        // Unknown, passed: still nothing to check.
        let pass = rules(UnknownNeed::Pass);
        let q = pod("elsewhere", &[], &[]);
        assert_eq!(pass.need(&q, &learned).unwrap().on_gpus_of(usable), None);
    }

    #[test]
    fn the_whole_gpu_rule_is_the_gpu_the_pod_would_get_whatever_its_model() {
        let r = rules(UnknownNeed::WholeGpu);
        let p = pod("elsewhere", &[], &[]);
        let n = r.need(&p, &LearnedNeeds::default()).unwrap();
        assert_eq!(n.source, NeedSource::UnknownWholeGpu);
        // An A10G showing 22784 MiB empty, an H200 showing 143360, less a 512 margin.
        assert_eq!(n.on_gpus_of(22784 - 512), Some(22272));
        assert_eq!(n.on_gpus_of(143360 - 512), Some(142848));
        // A project learned since: its need, not the GPU.
        let learned = LearnedNeeds::from_entries([(
            "elsewhere".to_string(),
            "3".to_string(),
            crate::extender::learned::LearnedNeed {
                mib: 4096,
                jobs: 3,
                floor_mib: 2048,
            },
        )]);
        let q = pod("elsewhere", &[("project.runner.gitlab.com/id", "3")], &[]);
        assert_eq!(r.need(&q, &learned).unwrap().on_gpus_of(22272), Some(4096));
    }
}
