//! Who owns each GPU process: a pure cgroup parser and the pod view.
pub mod cgroup;
