//! Who owns each GPU process: a pure cgroup parser, the pod view, and the `/proc` shell
//! that joins them.

// The rooms this crate may use (its Cargo.toml), under their room names, so a path reads
// `crate::model::…` in every room alike (docs/architecture.md, "Crates").
use crate as attribute;
use gpu_warden_kubeapi as kubeapi;
use gpu_warden_model as model;

pub mod attributor;
pub mod cgroup;
pub mod podresources;
pub mod pods;
pub mod ports;
pub mod procfs;
pub mod resolve;
pub mod view_bounds;
pub mod watch;
