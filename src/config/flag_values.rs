//! Values the flags take that other rooms share (the on/off switch, the interval rule): pure,
//! so the flag groups in their own files (`lease.rs`) can use them without naming the shell.

use clap::ValueEnum;
use std::time::Duration;

/// On/off switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// An interval flag that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    #[error(transparent)]
    Duration(#[from] crate::model::units::DurationError),
    #[error("must be at least 1ms")]
    TooShort,
    #[error("must be at most 1h")]
    TooLong,
}

/// Parses a duration flag: `1s`, `250ms`, `2m`. Zero and sub-millisecond values are
/// refused because every interval here paces a loop.
pub fn parse_interval(s: &str) -> Result<Duration, IntervalError> {
    let d = crate::model::units::parse_duration(s)?;
    if d < Duration::from_millis(1) {
        return Err(IntervalError::TooShort);
    }
    if d > Duration::from_secs(3600) {
        return Err(IntervalError::TooLong);
    }
    Ok(d)
}
