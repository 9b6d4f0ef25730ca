//! The policy's thresholds resolved against one GPU's total, and the classification of
//! its free memory into [`Pressure`].

use super::policy::Policy;
pub use crate::model::pressure::Pressure;
use crate::model::snapshot::MIB;
use serde::Serialize;

/// The policy's thresholds in bytes for one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Levels {
    /// Free below this is hard pressure.
    pub hard: u64,
    /// Free below this is soft pressure. With mixed units it may resolve at or below
    /// `hard`; the GPU then has no soft band.
    pub soft: u64,
    /// Free memory a decision aims to restore: `max(soft, hard) + reclaimMargin`.
    pub target: u64,
}

/// Why a GPU has no thresholds now: no memory reading to resolve them against, or a policy
/// that does not fit it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NoLevels {
    /// No reading yet since the guard began.
    #[error("no memory reading yet")]
    NotYetRead,
    /// The last reading failed (or the GPU is not healthy).
    #[error("no memory reading")]
    NoReading,
    /// The thresholds do not fit the GPU.
    #[error(transparent)]
    Unfit(#[from] LevelsError),
}

/// Why a policy's thresholds do not fit a GPU.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LevelsError {
    #[error("threshold `hard` ({hard}) is not below this GPU's total ({gib:.1} GiB)")]
    HardTooHigh { hard: String, gib: f64 },
    #[error("threshold `soft` ({soft}) is not below this GPU's total ({gib:.1} GiB)")]
    SoftTooHigh { soft: String, gib: f64 },
    #[error("`soft` ({soft}) plus `reclaimMargin` ({margin}) is not below this GPU's total ({gib:.1} GiB)")]
    TargetTooHigh {
        soft: String,
        margin: String,
        gib: f64,
    },
}

impl Levels {
    /// Resolves the policy against a GPU of `total` bytes. Fails when an absolute threshold
    /// does not fit the GPU (e.g. `hard: 32Gi` on a 24 GiB A10G in a mixed node group):
    /// such a GPU would be under pressure forever and lose every pod, so the guard reports
    /// it instead of acting on it.
    pub fn resolve(policy: &Policy, total: u64) -> Result<Levels, LevelsError> {
        let hard = policy.hard.resolve(total);
        let soft = policy.soft.resolve(total);
        let target = hard
            .max(soft)
            .saturating_add(policy.reclaim_margin.resolve(total));
        let gib = total as f64 / (1024.0 * MIB as f64);
        if hard >= total {
            return Err(LevelsError::HardTooHigh {
                hard: policy.hard.to_string(),
                gib,
            });
        }
        if soft >= total {
            return Err(LevelsError::SoftTooHigh {
                soft: policy.soft.to_string(),
                gib,
            });
        }
        if target >= total {
            return Err(LevelsError::TargetTooHigh {
                soft: policy.soft.to_string(),
                margin: policy.reclaim_margin.to_string(),
                gib,
            });
        }
        Ok(Levels { hard, soft, target })
    }

    /// The pressure at this much free memory.
    pub fn classify(&self, free: u64) -> Pressure {
        if free < self.hard {
            Pressure::Hard
        } else if free < self.soft {
            Pressure::Soft
        } else {
            Pressure::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::policy::Threshold;

    #[test]
    fn spellings() {
        let table = [
            (Pressure::None, 0, "none"),
            (Pressure::Soft, 1, "soft"),
            (Pressure::Hard, 2, "hard"),
        ];
        for (p, m, s) in table {
            assert_eq!(p.as_metric(), m);
            assert_eq!(p.as_str(), s);
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{s}\""));
        }
        assert!(Pressure::Hard > Pressure::Soft && Pressure::Soft > Pressure::None);
    }

    /// Free MiB on a 10000 MiB GPU against the default 5% / 10% policy, and against MiB thresholds.
    #[test]
    fn classification_table() {
        let total = 10_000 * MIB;
        let pct = Levels::resolve(&Policy::default(), total).unwrap();
        let mib = Levels::resolve(
            &Policy {
                hard: Threshold::mib(1024),
                soft: Threshold::mib(2048),
                reclaim_margin: Threshold::mib(256),
                ..Policy::default()
            },
            total,
        )
        .unwrap();
        assert_eq!(pct.target, 1200 * MIB);
        assert_eq!(mib.target, 2304 * MIB);
        let rows: &[(u64, Pressure, Pressure)] = &[
            // free MiB, with %, with MiB
            (5000, Pressure::None, Pressure::None),
            (1000, Pressure::None, Pressure::Hard),
            (999, Pressure::Soft, Pressure::Hard),
            (2048, Pressure::None, Pressure::None),
            (2047, Pressure::None, Pressure::Soft),
            (1024, Pressure::None, Pressure::Soft),
            (1023, Pressure::None, Pressure::Hard),
            (500, Pressure::Soft, Pressure::Hard),
            (499, Pressure::Hard, Pressure::Hard),
            (0, Pressure::Hard, Pressure::Hard),
        ];
        for &(free, want_pct, want_mib) in rows {
            assert_eq!(pct.classify(free * MIB), want_pct, "{free} MiB free, %");
            assert_eq!(mib.classify(free * MIB), want_mib, "{free} MiB free, MiB");
        }
    }

    #[test]
    fn mixed_units_with_hard_above_soft_have_no_soft_band() {
        let p = Policy {
            hard: Threshold::mib(2048),
            soft: Threshold::Percent(10.0),
            ..Policy::default()
        };
        // 10% of 10000 MiB is 1000 MiB, below hard's 2048 MiB.
        let l = Levels::resolve(&p, 10_000 * MIB).unwrap();
        assert_eq!(l.classify(1500 * MIB), Pressure::Hard);
        assert_eq!(l.classify(2048 * MIB), Pressure::None);
        assert_eq!(l.target, 2248 * MIB);
    }

    #[test]
    fn absolute_thresholds_that_do_not_fit_the_gpu_are_refused() {
        let total = 24 * 1024 * MIB;
        let cases = [
            (
                Threshold::mib(32 * 1024),
                Threshold::mib(40 * 1024),
                "`hard` (32Gi)",
            ),
            (
                Threshold::Percent(5.0),
                Threshold::mib(24 * 1024),
                "`soft` (24Gi)",
            ),
        ];
        for (hard, soft, needle) in cases {
            let p = Policy {
                hard,
                soft,
                ..Policy::default()
            };
            let e = Levels::resolve(&p, total).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("24.0 GiB"), "{e}");
        }
        let p = Policy {
            soft: Threshold::mib(23 * 1024),
            reclaim_margin: Threshold::mib(1024),
            ..Policy::default()
        };
        assert!(Levels::resolve(&p, total)
            .unwrap_err()
            .to_string()
            .contains("reclaimMargin"));
    }
}
