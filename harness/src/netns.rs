//! Kept as a re-export so that the many `crate::netns::…` paths in the
//! harness (and `cnilab_harness::netns::…` in tests) keep working: the
//! throwaway namespaces live in `cnilab_net::netns`, their readings in
//! `cnilab_net::nl` and `cnilab_net::snapshot`.

pub use cnilab_net::netns::*;
pub use cnilab_net::nl::{Address, Link, Neighbour, Route};
pub use cnilab_net::snapshot::NetState;
