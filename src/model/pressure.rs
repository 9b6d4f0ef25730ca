//! How close a GPU is to running out of memory: the none/soft/hard classification that
//! the metrics, the node annotation, `/state` and the guard all share.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How close a GPU is to running out of memory.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Pressure {
    /// Free memory is at or above the soft threshold (or unknown: no memory reading).
    #[default]
    None,
    /// Free memory is below soft but at or above hard.
    Soft,
    /// Free memory is below hard.
    Hard,
}

impl Pressure {
    /// The value of `gpu_warden_gpu_memory_pressure`: 0 none, 1 soft, 2 hard.
    pub fn as_metric(self) -> u8 {
        match self {
            Pressure::None => 0,
            Pressure::Soft => 1,
            Pressure::Hard => 2,
        }
    }

    /// The spelling in the `gpu-warden.io/vram` annotation JSON and /state: `none|soft|hard`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pressure::None => "none",
            Pressure::Soft => "soft",
            Pressure::Hard => "hard",
        }
    }
}

impl fmt::Display for Pressure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
