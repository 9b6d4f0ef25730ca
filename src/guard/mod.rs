//! The OOM guard: pure policy and trend, and the enforcer shell.

pub mod decision;
pub mod levels;
pub mod notes;
pub mod policy;
pub mod ports;
pub mod rank;
pub mod read_cadence;
pub mod recheck;
pub mod selector;
pub mod state;
pub mod status;
pub mod trend;
