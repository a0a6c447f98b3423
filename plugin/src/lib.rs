//! cnilab-bridge: a CNI 1.1.0 bridge plugin with built-in host-local-style IPAM.
//!
//! The library half is shared: the harness and the agent use `spec` (CNI
//! types), `netns` (namespace-bound netlink) and `nl` (netlink readers) from
//! here, so there is one result type and one namespace helper in the project.

pub mod commands;
pub mod config;
pub mod env;
pub mod error;
pub mod ipam;
pub mod masq;
pub mod netns;
pub mod nl;
pub mod spec;
