//! Why a node passed or failed, as the figures the judging found; its prose (the
//! `FailedAndUnresolvableNodes` text, the log example) is written only when something reads
//! it. Most nodes of a call pass and their prose is never read: formatting it for every node
//! was an eighth of a call's time (docs/performance.md, "The extender").

use crate::model::cuda::{too_old_line, CudaVersion};
use crate::model::pressure::Pressure;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// MiB as GiB with one decimal, `.0` dropped: `3276` → `3.2 GiB`, `4096` → `4 GiB`.
/// Integer arithmetic, rounding half away from zero as `f64::round` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gib(pub i64);

impl fmt::Display for Gib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let abs = self.0.unsigned_abs() as u128;
        // mib × 10 / 1024 is exact in binary, so f64's round saw the true value.
        let tenths = (abs * 10 + 512) / 1024;
        let sign = if self.0 < 0 && tenths > 0 { "-" } else { "" };
        if tenths % 10 == 0 {
            write!(f, "{sign}{} GiB", tenths / 10)
        } else {
            write!(f, "{sign}{}.{} GiB", tenths / 10, tenths % 10)
        }
    }
}

/// MiB as GiB with one decimal, `.0` dropped (see [`Gib`]).
pub fn gib(mib: i64) -> String {
    Gib(mib).to_string()
}

/// The GPU a verdict names, and how it was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Which {
    /// NVML index.
    pub index: u32,
    /// The device plugin's next GPU (else the fullest of any).
    pub known_next: bool,
    /// GPUs the pod asks for (at least 1).
    pub count: u32,
    /// GPUs with a reading on the node.
    pub node_gpus: usize,
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = self.index;
        match (self.known_next, self.count) {
            (true, 1) => write!(f, "GPU {i} (the one the device plugin hands out next)"),
            (true, n) => write!(
                f,
                "GPU {i} (the fullest of the {n} the device plugin hands out next)"
            ),
            (false, _) if self.node_gpus > 1 => write!(
                f,
                "GPU {i} (the fullest; which GPU the pod gets is not known)"
            ),
            (false, _) => write!(f, "GPU {i}"),
        }
    }
}

/// Why a node's figures cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Untrusted {
    /// No gpu-warden annotations.
    Missing,
    /// Unreadable; the text says what is wrong.
    Malformed(String),
    /// Too old.
    Stale {
        /// Seconds since the agent's poll.
        age_s: u64,
        /// When the agent polled.
        observed_at: SystemTime,
        /// `staleAfter`, seconds.
        trusted_s: u64,
    },
}

/// What a verdict found, in figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// The figures cannot be trusted; `passed` per `unknownNode`.
    Untrusted {
        /// What is wrong with them.
        what: Untrusted,
        /// Whether the rule let the pod through.
        passed: bool,
    },
    /// Fewer than `count` GPUs have a replica left.
    NoReplica {
        /// GPUs asked for.
        count: u32,
    },
    /// The node has fewer GPUs with a reading than the pod asks for.
    TooFewGpus {
        /// GPUs with a reading.
        has: usize,
        /// GPUs asked for.
        asks: u32,
    },
    /// No GPU with a reading.
    NoGpuReading,
    /// No GPU came out of the device plugin's choice.
    NoGpuJudged,
    /// The need is unknown and passed unchecked.
    Unchecked(Which),
    /// A GPU the pod may get is under pressure.
    Pressure {
        /// Its index.
        index: u32,
        /// Its pressure.
        pressure: Pressure,
    },
    /// Room left after the pod.
    Fits {
        /// The GPU judged.
        which: Which,
        /// MiB left after the pod.
        after_mib: i64,
    },
    /// Too little room.
    Short {
        /// The GPU judged.
        which: Which,
        /// Its free MiB.
        free_mib: u64,
        /// MiB committed there but unused.
        committed_mib: u64,
        /// The pod's need.
        need_mib: u64,
        /// The policy's margin.
        margin_mib: u64,
        /// MiB missing.
        short_mib: i64,
    },
    /// The pod's declaration is unreadable (one text per call, shared by every node).
    BadDeclaration(Arc<str>),
    /// The node's driver supports an older CUDA than the pod needs.
    CudaTooOld {
        /// The pod's need.
        need: CudaVersion,
        /// What the node's driver supports.
        node: CudaVersion,
        /// Same major release, CUDA 11 or later (minor-version compatibility may apply).
        minor_compatible: bool,
        /// How the need is known (one text per call, shared by every node).
        how: Arc<str>,
    },
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Untrusted::Missing => f.write_str("no gpu-warden VRAM annotations"),
            Untrusted::Malformed(why) => f.write_str(why),
            Untrusted::Stale {
                age_s,
                observed_at,
                trusted_s,
            } => write!(
                f,
                "VRAM figures are {age_s}s old (observed at {}; trusted for {trusted_s}s)",
                humantime::format_rfc3339_seconds(*observed_at),
            ),
        }
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Untrusted { what, passed } => {
                let rule = if *passed {
                    "passed unchecked (unknownNode: pass)"
                } else {
                    "refused (unknownNode: fail)"
                };
                write!(f, "{what}: {rule}")
            }
            Why::NoReplica { count: 1 } => {
                f.write_str("every GPU replica on the node is allocated or reserved")
            }
            Why::NoReplica { count } => {
                write!(f, "fewer than {count} GPUs on the node have a replica left")
            }
            Why::TooFewGpus { has, asks } => write!(
                f,
                "the node reports {has} GPUs with a memory reading; the pod asks for {asks}"
            ),
            Why::NoGpuReading => f.write_str("the node reports no GPU with a memory reading"),
            Why::NoGpuJudged => f.write_str("no GPU judged"),
            Why::Unchecked(which) => {
                write!(f, "the pod's VRAM need is unknown: {which} not checked")
            }
            Why::Pressure { index, pressure } => write!(
                f,
                "GPU {index} is under {pressure} memory pressure (the OOM guard may evict there)"
            ),
            Why::Fits { which, after_mib } => {
                write!(
                    f,
                    "{which} has room: {} left after the pod",
                    Gib(*after_mib)
                )
            }
            // Worded so it cannot be read as a fit: what is missing comes first and last.
            Why::Short {
                which,
                free_mib,
                committed_mib,
                need_mib,
                margin_mib,
                short_mib,
            } => {
                write!(
                    f,
                    "{which} has too little VRAM: {} free",
                    Gib(*free_mib as i64)
                )?;
                if *committed_mib > 0 {
                    write!(f, ", {} committed", Gib(*committed_mib as i64))?;
                }
                write!(f, "; the pod needs {}", Gib(*need_mib as i64))?;
                if which.count > 1 {
                    f.write_str(" on each GPU")?;
                }
                if *margin_mib > 0 {
                    write!(f, " plus a {} margin", Gib(*margin_mib as i64))?;
                }
                write!(f, " ({short_mib} MiB short)")
            }
            Why::BadDeclaration(text) => f.write_str(text),
            Why::CudaTooOld {
                need,
                node,
                minor_compatible,
                how,
            } => write!(
                f,
                "the pod {}",
                too_old_line(*need, *node, *minor_compatible, how)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The formatting the reasons used before [`Gib`]: f64, `{:.1}`.
    fn gib_f64(mib: i64) -> String {
        let tenths = (mib as f64 / 1024.0 * 10.0).round() as i64;
        if tenths % 10 == 0 {
            format!("{} GiB", tenths / 10)
        } else {
            format!("{:.1} GiB", tenths as f64 / 10.0)
        }
    }

    fn which(known_next: bool, count: u32, node_gpus: usize) -> Which {
        Which {
            index: 1,
            known_next,
            count,
            node_gpus,
        }
    }

    #[test]
    fn the_prose_of_passes_and_refusals_reads_as_before() {
        // Texts the verdicts carried as Strings before they became figures.
        let cases = [
            (
                Why::Fits {
                    which: which(true, 1, 2),
                    after_mib: 3276,
                },
                "GPU 1 (the one the device plugin hands out next) has room: 3.2 GiB left after the pod",
            ),
            (
                Why::Unchecked(which(false, 1, 2)),
                "the pod's VRAM need is unknown: GPU 1 (the fullest; which GPU the pod gets is not known) not checked",
            ),
            (
                Why::Unchecked(which(false, 1, 1)),
                "the pod's VRAM need is unknown: GPU 1 not checked",
            ),
            (
                Why::Untrusted {
                    what: Untrusted::Stale {
                        age_s: 600,
                        observed_at: SystemTime::UNIX_EPOCH
                            + std::time::Duration::from_secs(1_780_000_000),
                        trusted_s: 120,
                    },
                    passed: true,
                },
                "VRAM figures are 600s old (observed at 2026-05-28T20:26:40Z; trusted for 120s): passed unchecked (unknownNode: pass)",
            ),
            (
                Why::Untrusted {
                    what: Untrusted::Missing,
                    passed: false,
                },
                "no gpu-warden VRAM annotations: refused (unknownNode: fail)",
            ),
            (
                Why::Short {
                    which: which(true, 2, 4),
                    free_mib: 6000,
                    committed_mib: 0,
                    need_mib: 8192,
                    margin_mib: 0,
                    short_mib: 2192,
                },
                "GPU 1 (the fullest of the 2 the device plugin hands out next) has too little VRAM: 5.9 GiB free; the pod needs 8 GiB on each GPU (2192 MiB short)",
            ),
            (
                Why::NoReplica { count: 3 },
                "fewer than 3 GPUs on the node have a replica left",
            ),
            (
                Why::TooFewGpus { has: 1, asks: 2 },
                "the node reports 1 GPUs with a memory reading; the pod asks for 2",
            ),
        ];
        for (why, text) in cases {
            assert_eq!(why.to_string(), text);
        }
    }

    #[test]
    fn gib_writes_what_the_float_formatting_wrote() {
        for mib in (-300_000..300_000).chain([i64::from(u32::MAX), 1 << 40]) {
            assert_eq!(gib(mib), gib_f64(mib), "{mib} MiB");
        }
        assert_eq!(gib(3276), "3.2 GiB");
        assert_eq!(gib(4096), "4 GiB");
        assert_eq!(gib(512), "0.5 GiB");
        assert_eq!(gib(-1024), "-1 GiB");
    }
}
