//! The OOM guard's pure core: policy, levels and trend, eligibility and ranking, the
//! decision state machine, Event prose and the port decisions go out through. The enforcer
//! shell that carries them out is `act::enforce`.

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
