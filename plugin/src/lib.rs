//! cnilab-bridge: a CNI 1.1.0 bridge plugin with built-in host-local-style IPAM.
//!
//! The library half is shared: the harness and the agent use `spec` (CNI
//! types) and `netns` (namespace-bound netlink) from here, so there is one
//! result type and one namespace helper in the whole project.

pub mod netns;
pub mod spec;
