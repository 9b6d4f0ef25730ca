//! CUDA versions: what a node's driver supports (NVML's `cuDriverGetVersion` figure, 12080 =
//! 12.8), what a pod needs (its `<prefix>/cuda-min` annotation, else its image's documented
//! tag, `model::cuda_images`), and whether the one can run the other (docs/cuda.md).
//!
//! The rule is the one NVIDIA's container toolkit applies to an image's
//! `NVIDIA_REQUIRE_CUDA=cuda>=X.Y`: libnvidia-container (its `dsl_evaluate` and `driver_get_cuda_version`)
//! compares the driver's CUDA major.minor with the image's, number by number, and refuses a
//! container whose need is higher ("unsatisfied condition: cuda>=12.8, please update your
//! driver to a newer version, or use an earlier cuda container"). CUDA's minor-version
//! compatibility (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html:
//! from CUDA 11 on, an application built with a newer toolkit of the same major release "can
//! run, with limited feature set") may still let such a job run — not when it JIT-compiles
//! PTX or calls an API the older driver lacks — so [`CudaPolicy::MinorCompatible`] lets
//! an operator follow it instead; the default follows the toolkit's check.

use super::cuda_images::{need_from_image, ImageNeed};
use std::collections::BTreeMap;
use std::fmt;

/// A CUDA version as the driver API numbers it, major.minor (the patch level never decides
/// whether a driver can run a toolkit's code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    /// From NVML's (and `cuDriverGetVersion`'s) integer, `1000 × major + 10 × minor`;
    /// `None` for a value that is not a version (0 or negative).
    pub fn from_nvml(v: i32) -> Option<CudaVersion> {
        let v = u32::try_from(v).ok().filter(|v| *v >= 1000)?;
        Some(CudaVersion {
            major: v / 1000,
            minor: (v % 1000) / 10,
        })
    }

    /// The integer DCGM and NVML encode it as (`DCGM_FI_CUDA_DRIVER_VERSION`: 12.8 = 12080).
    pub fn as_nvml(self) -> u64 {
        u64::from(self.major) * 1000 + u64::from(self.minor) * 10
    }

    /// Parses `"12.8"`: two whole numbers, nothing else (surrounding blanks ignored).
    pub fn parse(text: &str) -> Result<CudaVersion, BadCudaVersion> {
        let bad = || BadCudaVersion(text.to_string());
        let (major, minor) = text.trim().split_once('.').ok_or_else(bad)?;
        let num = |s: &str| -> Result<u32, BadCudaVersion> {
            if s.is_empty() || s.len() > 3 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        Ok(CudaVersion {
            major: num(major)?,
            minor: num(minor)?,
        })
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl serde::Serialize for CudaVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A text that is not `major.minor`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a CUDA version major.minor such as \"12.8\"")]
pub struct BadCudaVersion(pub String);

/// The pod annotation key under `prefix` (`--annotation-prefix`, default `gpu-warden.io`).
pub fn key(prefix: &str) -> String {
    format!("{prefix}/cuda-min")
}

/// How a pod's need was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The pod's `cuda-min` annotation.
    Declared,
    /// The image's tag, by the rule `how`.
    Image { image: String, how: &'static str },
}

/// What a pod needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Known: declared, or read with confidence from a documented tag.
    Known {
        version: CudaVersion,
        source: Source,
    },
    /// Not known; `bad` says why the pod's declaration could not be read, when that is why.
    /// Never judged: an unknown need is not "compatible", it is unchecked.
    Unknown { bad: Option<String> },
}

/// A pod's need: its `<prefix>/cuda-min` annotation (looked up as `annotation_key`) wins;
/// else the highest need among `images` (the images of the containers that use a GPU) whose
/// tags are documented. A malformed annotation leaves the need unknown, with the reason.
pub fn pod_need<'a>(
    annotations: &BTreeMap<String, String>,
    annotation_key: &str,
    images: impl IntoIterator<Item = &'a str>,
) -> Need {
    if let Some(value) = annotations.get(annotation_key) {
        return match CudaVersion::parse(value) {
            Ok(version) => Need::Known {
                version,
                source: Source::Declared,
            },
            Err(e) => Need::Unknown {
                bad: Some(format!("{annotation_key}: {e}")),
            },
        };
    }
    let mut best: Option<(CudaVersion, &str, &'static str)> = None;
    for image in images {
        if let ImageNeed::Known { version, how } = need_from_image(image) {
            if best.is_none_or(|(v, _, _)| version > v) {
                best = Some((version, image, how));
            }
        }
    }
    match best {
        Some((version, image, how)) => Need::Known {
            version,
            source: Source::Image {
                image: image.to_string(),
                how,
            },
        },
        None => Need::Unknown { bad: None },
    }
}

/// Which rule decides that a driver is too old.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CudaPolicy {
    /// NVIDIA's container toolkit's `cuda>=X.Y` check: a need above the driver's
    /// major.minor is too old (the default: what the runtime itself refuses).
    #[default]
    Strict,
    /// CUDA's minor-version compatibility: from CUDA 11 on, a need of the driver's own major
    /// release passes; only a newer major is too old.
    MinorCompatible,
    /// No CUDA check.
    Off,
}

/// Whether a node can run a pod's need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaVerdict {
    /// The driver supports the need.
    Fits,
    /// The driver's CUDA version is older than the need. `minor_compatible`: same major
    /// release, CUDA 11 or later, so minor-version compatibility may still let it run.
    TooOld {
        need: CudaVersion,
        node: CudaVersion,
        minor_compatible: bool,
    },
    /// Not judged: the need or the node's version is unknown, or the policy is off.
    Unchecked,
}

/// Judges `need` on a node whose driver supports `node` (None: not published).
pub fn judge(node: Option<CudaVersion>, need: &Need, policy: CudaPolicy) -> CudaVerdict {
    let (Some(node), Need::Known { version: need, .. }) = (node, need) else {
        return CudaVerdict::Unchecked;
    };
    let need = *need;
    if policy == CudaPolicy::Off {
        return CudaVerdict::Unchecked;
    }
    if need <= node {
        return CudaVerdict::Fits;
    }
    let minor_compatible = need.major == node.major && node.major >= 11;
    if minor_compatible && policy == CudaPolicy::MinorCompatible {
        return CudaVerdict::Fits;
    }
    CudaVerdict::TooOld {
        need,
        node,
        minor_compatible,
    }
}

impl Need {
    /// "declared in <key>" or "from the image <image> (<rule>)": how the need is known.
    pub fn how(&self, annotation_key: &str) -> String {
        match self {
            Need::Known {
                source: Source::Declared,
                ..
            } => format!("declared in {annotation_key}"),
            Need::Known {
                source: Source::Image { image, how },
                ..
            } => format!("read from the image {image} ({how})"),
            Need::Unknown { .. } => "unknown".to_string(),
        }
    }
}

/// One line for a person: what is wrong and what to change. `how` is [`Need::how`].
pub fn too_old_line(
    need: CudaVersion,
    node: CudaVersion,
    minor_compatible: bool,
    how: &str,
) -> String {
    let mvc = if minor_compatible {
        format!(
            " (CUDA minor-version compatibility may run some {}.x code on it, not PTX JIT or newer APIs, and the NVIDIA container toolkit's cuda>={need} check refuses it)",
            node.major
        )
    } else {
        String::new()
    };
    format!(
        "needs CUDA {need} ({how}) but the node's driver supports CUDA {node}{mvc}: use an image built for CUDA <= {node}, or a node group with a newer driver"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cv(major: u32, minor: u32) -> CudaVersion {
        CudaVersion { major, minor }
    }

    #[test]
    fn versions_parse_display_and_encode_like_nvml() {
        assert_eq!(CudaVersion::from_nvml(12080), Some(cv(12, 8)));
        assert_eq!(CudaVersion::from_nvml(13000), Some(cv(13, 0)));
        assert_eq!(CudaVersion::from_nvml(11020), Some(cv(11, 2)));
        assert_eq!(CudaVersion::from_nvml(0), None);
        assert_eq!(CudaVersion::from_nvml(-1), None);
        assert_eq!(cv(12, 8).as_nvml(), 12080);
        assert_eq!(cv(12, 8).to_string(), "12.8");
        assert_eq!(CudaVersion::parse(" 12.8 "), Ok(cv(12, 8)));
        assert_eq!(CudaVersion::parse("13.10"), Ok(cv(13, 10)));
        for bad in [
            "", "12", "12.8.1", "v12.8", "12.x", "-1.0", "12.", ".8", "1234.0",
        ] {
            assert!(CudaVersion::parse(bad).is_err(), "{bad:?}");
        }
        assert!(cv(12, 10) > cv(12, 9) && cv(13, 0) > cv(12, 9));
        assert_eq!(
            CudaVersion::parse("12").unwrap_err().to_string(),
            r#""12" is not a CUDA version major.minor such as "12.8""#
        );
    }

    #[test]
    fn the_annotation_wins_and_a_bad_one_is_unknown_with_a_reason() {
        let key = key("gpu-warden.io");
        assert_eq!(key, "gpu-warden.io/cuda-min");
        let ann = |v: &str| BTreeMap::from([(key.clone(), v.to_string())]);
        let image = ["nvidia/cuda:12.8.1-base-ubuntu22.04"];
        assert_eq!(
            pod_need(&ann("12.4"), &key, image),
            Need::Known {
                version: cv(12, 4),
                source: Source::Declared
            }
        );
        let Need::Unknown { bad: Some(why) } = pod_need(&ann("12.8.1"), &key, image) else {
            panic!("a malformed declaration is unknown");
        };
        assert!(
            why.starts_with("gpu-warden.io/cuda-min: \"12.8.1\""),
            "{why}"
        );
        let none = BTreeMap::new();
        let Need::Known { version, source } = pod_need(
            &none,
            &key,
            [
                "busybox",
                "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                image[0],
            ],
        ) else {
            panic!("known from the images");
        };
        assert_eq!(version, cv(12, 8), "the highest need of the GPU containers");
        assert!(
            matches!(source, Source::Image { image, .. } if image == "nvidia/cuda:12.8.1-base-ubuntu22.04")
        );
        assert_eq!(
            pod_need(&none, &key, ["myorg/cuda-tools:12.8"]),
            Need::Unknown { bad: None }
        );
    }

    #[test]
    fn the_container_toolkits_rule_and_the_minor_version_switch() {
        let need = |major, minor| Need::Known {
            version: cv(major, minor),
            source: Source::Declared,
        };
        let strict = CudaPolicy::Strict;
        let mvc = CudaPolicy::MinorCompatible;
        assert_eq!(
            judge(Some(cv(12, 8)), &need(12, 8), strict),
            CudaVerdict::Fits
        );
        assert_eq!(
            judge(Some(cv(13, 0)), &need(12, 8), strict),
            CudaVerdict::Fits
        );
        assert_eq!(
            judge(Some(cv(12, 4)), &need(12, 8), strict),
            CudaVerdict::TooOld {
                need: cv(12, 8),
                node: cv(12, 4),
                minor_compatible: true
            }
        );
        assert_eq!(judge(Some(cv(12, 4)), &need(12, 8), mvc), CudaVerdict::Fits);
        assert!(matches!(
            judge(Some(cv(12, 8)), &need(13, 0), mvc),
            CudaVerdict::TooOld {
                minor_compatible: false,
                ..
            }
        ));
        // Before CUDA 11 there was no minor-version compatibility.
        assert!(matches!(
            judge(Some(cv(10, 1)), &need(10, 2), mvc),
            CudaVerdict::TooOld {
                minor_compatible: false,
                ..
            }
        ));
        let unknown = Need::Unknown { bad: None };
        assert_eq!(
            judge(Some(cv(11, 0)), &unknown, strict),
            CudaVerdict::Unchecked
        );
        assert_eq!(judge(None, &need(13, 0), strict), CudaVerdict::Unchecked);
        assert_eq!(
            judge(Some(cv(11, 0)), &need(13, 0), CudaPolicy::Off),
            CudaVerdict::Unchecked
        );
    }

    #[test]
    fn the_line_says_what_to_change() {
        let line = too_old_line(
            cv(12, 8),
            cv(12, 4),
            true,
            "declared in gpu-warden.io/cuda-min",
        );
        assert_eq!(
            line,
            "needs CUDA 12.8 (declared in gpu-warden.io/cuda-min) but the node's driver supports CUDA 12.4 (CUDA minor-version compatibility may run some 12.x code on it, not PTX JIT or newer APIs, and the NVIDIA container toolkit's cuda>=12.8 check refuses it): use an image built for CUDA <= 12.4, or a node group with a newer driver"
        );
        assert!(!too_old_line(cv(13, 0), cv(12, 8), false, "x").contains("minor-version"));
    }
}
