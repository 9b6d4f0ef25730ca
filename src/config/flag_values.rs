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

/// Another room's enum as a flag's value, spelled and explained here: `(value, spelling,
/// help)` per choice. The domain's own types are the flags' fields (no mirrored copies), and
/// since those rooms are their own crates, clap's `ValueEnum` cannot be implemented for them
/// here (the orphan rule); this parser gives the same `--help` list and the same refusal.
#[derive(Debug, Clone, Copy)]
pub struct Choices<T: 'static>(pub &'static [(T, &'static str, &'static str)]);

impl<T: Clone + Send + Sync + 'static> Choices<T> {
    fn possible(&self) -> impl Iterator<Item = clap::builder::PossibleValue> + '_ {
        self.0
            .iter()
            .map(|(_, name, help)| clap::builder::PossibleValue::new(*name).help(*help))
    }
}

impl<T: Clone + Send + Sync + 'static> clap::builder::TypedValueParser for Choices<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        // clap's own parser does the matching and words the refusal, as for `value_enum`.
        let name =
            clap::builder::PossibleValuesParser::new(self.possible()).parse_ref(cmd, arg, value)?;
        let ignore_case = arg.is_some_and(clap::Arg::is_ignore_case_set);
        self.0
            .iter()
            .find(|(_, n, _)| *n == name || (ignore_case && n.eq_ignore_ascii_case(&name)))
            .map(|(v, _, _)| v.clone())
            .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::InvalidValue).with_cmd(cmd))
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(self.possible()))
    }
}
