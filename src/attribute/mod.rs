//! Who owns each GPU process: a pure cgroup parser, the pod view, and the `/proc` shell
//! that joins them.

pub mod attributor;
pub mod cgroup;
pub mod podresources;
pub mod pods;
pub mod ports;
pub mod procfs;
pub mod resolve;
pub mod view_bounds;
pub mod watch;
