//! The OOM guard's pure core: policy, levels and trend, eligibility and ranking, the
//! decision state machine, Event prose and the port decisions go out through. The enforcer
//! shell that carries them out is `act::enforce`.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
use crate as guard;
use gpu_warden_model as model;
#[cfg(test)]
mod testkit {
    pub use gpu_warden_fixtures as fixtures;
}

pub mod carry;
pub mod decision;
pub mod growth;
pub mod history;
pub mod hold;
pub mod levels;
pub mod notes;
pub mod policy;
pub mod ports;
pub mod rank;
pub mod read_cadence;
pub mod recheck;
pub mod selector;
pub mod session;
pub mod state;
pub mod status;
pub mod stop;
pub mod trend;
