//! The CUDA version a container image needs, read from its reference only where the
//! repository documents what its tags mean (docs/cuda.md, "How the need is found"). An
//! allowlist, never a pattern over any name: `myorg/cuda-tools:12.8` or a mirror's copy of
//! `nvidia/cuda` is not provably the image whose tags we know, so it is unknown, and an
//! unknown image is never "compatible" — it is not judged.
//!
//! References are split by the distribution/reference grammar (`reference.go`,
//! `normalize.go`): `[domain[:port]/]path[:tag][@digest]`; the first component is a domain
//! only when it holds a `.` or a `:` or is `localhost`; Docker Hub's names are normalised to
//! `docker.io/…` (`library/` for a single name). A digest wins over a tag (containerd pulls the
//! digest), so a digested reference is unknown.

use super::cuda::CudaVersion;

/// A reference split into its parts, the repository normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `docker.io/nvidia/cuda`, `nvcr.io/nvidia/pytorch`, `registry:5000/nvidia/cuda`.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

/// Splits `reference`; `None` when it is not a reference at all (empty, or a blank part).
pub fn parse_ref(reference: &str) -> Option<ImageRef> {
    let reference = reference.trim();
    let (name_tag, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d.to_string())),
        None => (reference, None),
    };
    // The tag is after the last ':' that follows the last '/': a registry's port is not a tag.
    let after_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_tag[after_slash..].rfind(':') {
        Some(i) => (
            &name_tag[..after_slash + i],
            Some(name_tag[after_slash + i + 1..].to_string()),
        ),
        None => (name_tag, None),
    };
    if name.is_empty() || name.split('/').any(str::is_empty) || tag.as_deref() == Some("") {
        return None;
    }
    let (first, rest) = name.split_once('/').unwrap_or(("", name));
    let is_domain = !first.is_empty()
        && (first.contains('.')
            || first.contains(':')
            || first == "localhost"
            || first.chars().any(|c| c.is_ascii_uppercase()));
    let repository = if is_domain {
        let domain = if first == "index.docker.io" {
            "docker.io"
        } else {
            first
        };
        format!("{domain}/{rest}")
    } else if first.is_empty() {
        format!("docker.io/library/{rest}")
    } else {
        format!("docker.io/{name}")
    };
    Some(ImageRef {
        repository,
        tag,
        digest,
    })
}

/// What an image reference says about the CUDA version it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageNeed {
    /// Read from a documented tag convention; `how` names the rule, for the message.
    Known {
        version: CudaVersion,
        how: &'static str,
    },
    /// Not an image whose tags we know (or a digest, `latest`, an unlisted release).
    Unknown,
}

/// nvidia/cuda (Docker Hub and NGC): `X.Y[.Z]-{base,runtime,devel,cudnn…}[-<os>]`; the image
/// sets `NVIDIA_REQUIRE_CUDA=cuda>=X.Y` (gitlab.com/nvidia/container-images/cuda).
const NVIDIA_CUDA: &[&str] = &["docker.io/nvidia/cuda", "nvcr.io/nvidia/cuda"];
/// pytorch/pytorch: `<torch>-cudaX.Y-cudnnN-{runtime,devel}` (pytorch's `docker.Makefile`).
const PYTORCH: &str = "docker.io/pytorch/pytorch";
/// Repositories documented to tag their CUDA builds with a `cuXYZ` token (PyTorch's wheel
/// index convention: `cu128` = 12.8). None of the images CI jobs commonly pull documents it
/// for its tags (third-party images write `cu1281` for 12.8.1), so the list is empty: a `cuXYZ`
/// tag elsewhere stays unknown. Adding a repository here needs its documentation cited.
const CU_TOKEN_REPOS: &[&str] = &[];

/// The NGC framework containers' `YY.MM` releases and the CUDA each is based on, from each
/// product's own release notes ("Release YY.MM is based on CUDA A.B.C"): Triton's at
/// https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-YY-MM.html,
/// PyTorch's at https://docs.nvidia.com/deeplearning/frameworks/pytorch-release-notes/rel-YY-MM.html.
/// Products differ within one release (PyTorch 25.12 is CUDA 13.1, Triton's TensorRT-LLM
/// variant 25.12 is 13.0), so each product has its own rows and only the plain `-py3` tag is
/// listed; a release or a variant not listed (`-trtllm-python-py3`, `-vllm-python-py3`,
/// `-igpu`) is unknown. Never extrapolated.
const NGC_RELEASES: &[(&str, &str, u32, u32)] = &[
    ("nvcr.io/nvidia/tritonserver", "22.09", 11, 8),
    ("nvcr.io/nvidia/tritonserver", "22.10", 11, 8),
    ("nvcr.io/nvidia/tritonserver", "22.12", 11, 8),
    ("nvcr.io/nvidia/tritonserver", "23.03", 12, 1),
    ("nvcr.io/nvidia/tritonserver", "23.04", 12, 1),
    ("nvcr.io/nvidia/tritonserver", "23.05", 12, 1),
    ("nvcr.io/nvidia/tritonserver", "23.06", 12, 1),
    ("nvcr.io/nvidia/tritonserver", "23.07", 12, 1),
    ("nvcr.io/nvidia/tritonserver", "23.08", 12, 2),
    ("nvcr.io/nvidia/tritonserver", "23.09", 12, 2),
    ("nvcr.io/nvidia/tritonserver", "23.10", 12, 2),
    ("nvcr.io/nvidia/tritonserver", "23.11", 12, 3),
    ("nvcr.io/nvidia/tritonserver", "23.12", 12, 3),
    ("nvcr.io/nvidia/tritonserver", "24.01", 12, 3),
    ("nvcr.io/nvidia/tritonserver", "24.02", 12, 3),
    ("nvcr.io/nvidia/tritonserver", "24.03", 12, 4),
    ("nvcr.io/nvidia/tritonserver", "24.04", 12, 4),
    ("nvcr.io/nvidia/tritonserver", "24.05", 12, 4),
    ("nvcr.io/nvidia/tritonserver", "24.06", 12, 5),
    ("nvcr.io/nvidia/tritonserver", "24.07", 12, 5),
    ("nvcr.io/nvidia/tritonserver", "24.08", 12, 6),
    ("nvcr.io/nvidia/tritonserver", "24.10", 12, 6),
    ("nvcr.io/nvidia/tritonserver", "24.12", 12, 6),
    ("nvcr.io/nvidia/tritonserver", "25.01", 12, 8),
    ("nvcr.io/nvidia/tritonserver", "25.02", 12, 8),
    ("nvcr.io/nvidia/tritonserver", "25.03", 12, 8),
    ("nvcr.io/nvidia/tritonserver", "25.04", 12, 9),
    ("nvcr.io/nvidia/tritonserver", "25.06", 12, 9),
    ("nvcr.io/nvidia/tritonserver", "25.08", 13, 0),
    ("nvcr.io/nvidia/tritonserver", "25.10", 13, 0),
    ("nvcr.io/nvidia/tritonserver", "26.04", 13, 2),
    ("nvcr.io/nvidia/pytorch", "25.12", 13, 1),
];

/// The CUDA version `reference` needs, when its repository and tag follow a documented
/// convention; [`ImageNeed::Unknown`] otherwise.
pub fn need_from_image(reference: &str) -> ImageNeed {
    need_with(reference, CU_TOKEN_REPOS)
}

fn need_with(reference: &str, cu_token_repos: &[&str]) -> ImageNeed {
    let Some(r) = parse_ref(reference) else {
        return ImageNeed::Unknown;
    };
    let (None, Some(tag)) = (&r.digest, r.tag.as_deref()) else {
        return ImageNeed::Unknown;
    };
    let repo = r.repository.as_str();
    let found = if NVIDIA_CUDA.contains(&repo) {
        nvidia_cuda_tag(tag).map(|v| (v, "the nvidia/cuda tag X.Y.Z-<flavor>"))
    } else if repo == PYTORCH {
        pytorch_tag(tag).map(|v| (v, "the pytorch/pytorch tag <torch>-cudaX.Y-cudnnN-<flavor>"))
    } else if let Some(release) = tag.strip_suffix("-py3") {
        NGC_RELEASES
            .iter()
            .find(|(r, rel, _, _)| *r == repo && *rel == release)
            .map(|&(_, _, major, minor)| {
                let v = CudaVersion { major, minor };
                (v, "NVIDIA's release notes for this NGC YY.MM-py3 release")
            })
    } else if cu_token_repos.contains(&repo) {
        cu_token(tag).map(|v| (v, "the tag's cuXYZ token"))
    } else {
        None
    };
    match found {
        Some((version, how)) => ImageNeed::Known { version, how },
        None => ImageNeed::Unknown,
    }
}

fn number(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 4 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `X.Y[.Z]-<flavor>[-<os>]`, flavor one of base, runtime, devel, cudnn[N]-runtime,
/// cudnn[N]-devel; os letters then digits and dots (`ubuntu22.04`, `ubi8`, `rockylinux9`).
fn nvidia_cuda_tag(tag: &str) -> Option<CudaVersion> {
    let (version, rest) = tag.split_once('-')?;
    let mut parts = version.split('.');
    let major = number(parts.next()?)?;
    let minor = number(parts.next()?)?;
    if let Some(patch) = parts.next() {
        number(patch)?;
    }
    if parts.next().is_some() {
        return None;
    }
    let mut words = rest.split('-');
    let first = words.next()?;
    let flavor_ok = match first {
        "base" | "runtime" | "devel" => true,
        cudnn if cudnn.starts_with("cudnn") => {
            let n = &cudnn["cudnn".len()..];
            (n.is_empty() || number(n).is_some())
                && matches!(words.next(), Some("runtime" | "devel"))
        }
        _ => false,
    };
    let os_ok = match (words.next(), words.next()) {
        (None, _) => true,
        (Some(os), None) => {
            let letters = os.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
            !letters.is_empty()
                && letters.bytes().all(|b| b.is_ascii_lowercase())
                && letters.len() < os.len()
        }
        _ => false,
    };
    (flavor_ok && os_ok).then_some(CudaVersion { major, minor })
}

/// `<a.b.c>-cudaX.Y-cudnnN-{runtime,devel}`.
fn pytorch_tag(tag: &str) -> Option<CudaVersion> {
    let w: Vec<&str> = tag.split('-').collect();
    let [torch, cuda, cudnn, flavor] = w.as_slice() else {
        return None;
    };
    let torch_ok = torch.split('.').count() == 3 && torch.split('.').all(|p| number(p).is_some());
    let cudnn_ok = cudnn.strip_prefix("cudnn").and_then(number).is_some();
    if !torch_ok || !cudnn_ok || !matches!(*flavor, "runtime" | "devel") {
        return None;
    }
    let (major, minor) = cuda.strip_prefix("cuda")?.split_once('.')?;
    Some(CudaVersion {
        major: number(major)?,
        minor: number(minor)?,
    })
}

/// A `cuXYZ` token bounded by `-`, `_` or the ends, exactly three digits: the last is the
/// minor (`cu121` = 12.1, `cu118` = 11.8). `cu1281` (four digits) is not read.
fn cu_token(tag: &str) -> Option<CudaVersion> {
    tag.split(['-', '_']).find_map(|w| {
        let d = w.strip_prefix("cu")?;
        (d.len() == 3 && d.bytes().all(|b| b.is_ascii_digit())).then(|| CudaVersion {
            major: number(&d[..2]).unwrap_or(0),
            minor: number(&d[2..]).unwrap_or(0),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> Option<CudaVersion> {
        Some(CudaVersion { major, minor })
    }

    fn known(reference: &str) -> Option<CudaVersion> {
        match need_from_image(reference) {
            ImageNeed::Known { version, .. } => Some(version),
            ImageNeed::Unknown => None,
        }
    }

    #[test]
    fn references_split_by_the_distribution_grammar() {
        let r = parse_ref("registry:5000/nvidia/cuda:12.8.1-base").unwrap();
        assert_eq!(r.repository, "registry:5000/nvidia/cuda");
        assert_eq!(r.tag.as_deref(), Some("12.8.1-base"));
        let r = parse_ref("nvidia/cuda:12.8.1-base-ubuntu22.04@sha256:abc").unwrap();
        assert_eq!(r.repository, "docker.io/nvidia/cuda");
        assert_eq!(r.digest.as_deref(), Some("sha256:abc"));
        assert_eq!(
            parse_ref("ubuntu").unwrap().repository,
            "docker.io/library/ubuntu"
        );
        assert_eq!(
            parse_ref("localhost/x:1").unwrap().repository,
            "localhost/x"
        );
        assert_eq!(
            parse_ref("index.docker.io/nvidia/cuda:12.8.0-base")
                .unwrap()
                .repository,
            "docker.io/nvidia/cuda"
        );
        for bad in ["", "a//b", "x:", "/x"] {
            assert_eq!(parse_ref(bad), None, "{bad:?}");
        }
    }

    /// Real tags (docs/cuda.md cites where each was seen) and the look-alikes that must stay
    /// unknown.
    #[test]
    fn image_references_to_cuda_need() {
        let cases: &[(&str, Option<CudaVersion>)] = &[
            // nvidia/cuda, Docker Hub and NGC.
            ("nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04", v(12, 8)),
            ("nvidia/cuda:12.8.0-runtime-ubuntu24.04", v(12, 8)),
            ("nvidia/cuda:12.0.0-base-ubuntu22.04", v(12, 0)),
            ("nvcr.io/nvidia/cuda:12.9.0-base-ubi8", v(12, 9)),
            ("nvcr.io/nvidia/cuda:13.0.3-base-ubi8", v(13, 0)),
            ("docker.io/nvidia/cuda:12.4.1-devel-ubuntu22.04", v(12, 4)),
            ("nvidia/cuda:11.8.0-base-ubuntu20.04", v(11, 8)),
            ("nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04", v(11, 8)),
            ("nvidia/cuda:10.2-base", v(10, 2)),
            // pytorch/pytorch.
            ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", v(12, 4)),
            ("pytorch/pytorch:2.1.0-cuda11.8-cudnn8-devel", v(11, 8)),
            ("pytorch/pytorch:2.0.1-cuda11.7-cudnn8-devel", v(11, 7)),
            (
                "docker.io/pytorch/pytorch:1.13.1-cuda11.6-cudnn8-runtime",
                v(11, 6),
            ),
            // NGC framework releases in the table, and one that is not.
            ("nvcr.io/nvidia/tritonserver:24.10-py3", v(12, 6)),
            ("nvcr.io/nvidia/tritonserver:25.03-py3", v(12, 8)),
            ("nvcr.io/nvidia/tritonserver:25.08-py3", v(13, 0)),
            ("nvcr.io/nvidia/pytorch:25.12-py3", v(13, 1)),
            ("nvcr.io/nvidia/tritonserver:24.09-py3", None),
            ("nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3", None),
            ("nvcr.io/nvidia/pytorch:24.10-py3", None),
            ("nvcr.io/nvidia/tensorflow:24.10-tf2-py3", None),
            // Look-alikes and references whose tag is not what is pulled.
            ("myorg/cuda-tools:12.8", None),
            ("tensorflow/tensorflow:2.15.0-gpu", None),
            ("nvidia/cuda@sha256:0123abcd", None),
            ("nvidia/cuda:12.8.1-base-ubuntu22.04@sha256:0123abcd", None),
            ("registry:5000/nvidia/cuda:12.8.1-base", None),
            ("ghcr.io/foo/cuda:12.8.1-base-ubuntu22.04", None),
            (
                "mirror.example.com/nvidia/cuda:12.8.1-base-ubuntu22.04",
                None,
            ),
            ("nvidia/cuda:latest", None),
            ("nvidia/cuda", None),
            ("nvidia/cuda:12.8.1-weird-ubuntu22.04", None),
            ("nvidia/cuda:12.8.1-base-ubuntu22.04-extra", None),
            ("nvidia/cudagl:11.4.2-base-ubuntu20.04", None),
            ("pytorch/pytorch:2.5.1-runtime", None),
            ("pytorch/pytorch:latest", None),
            ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime-extra", None),
            ("runpod/pytorch:1.0.3-cu1281-torch291-ubuntu2204", None),
            ("someone/torch:2.3-cu121", None),
        ];
        for (reference, want) in cases {
            assert_eq!(known(reference), *want, "{reference}");
        }
    }

    #[test]
    fn cu_tokens_only_for_listed_repositories() {
        let listed = ["docker.io/example/torch"];
        let read = |r| match need_with(r, &listed) {
            ImageNeed::Known { version, .. } => Some(version),
            ImageNeed::Unknown => None,
        };
        assert_eq!(read("example/torch:2.3.0-cu121"), v(12, 1));
        assert_eq!(read("example/torch:2.9.1_cu128_py3"), v(12, 8));
        assert_eq!(read("example/torch:1.0.3-cu1281-torch291"), None);
        assert_eq!(read("other/torch:2.3.0-cu121"), None);
    }
}
