//! The OOM guard: pure policy and trend, and the enforcer shell.

pub mod enforce;
pub mod events;
pub mod policy;
pub mod pressure;
pub mod rank;
pub mod selector;
pub mod state;
pub mod trend;

#[cfg(test)]
pub mod fixtures;
