//! The OOM guard: pure policy and trend, and the enforcer shell.
