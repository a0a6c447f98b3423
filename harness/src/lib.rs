//! cnilab harness: throwaway namespaces, a CNI runtime that drives any plugin
//! binary, lifecycle and conformance checks, and a benchmark.

pub mod accounting;
pub mod bench;
pub mod cli;
pub mod conform;
pub mod corpus;
pub mod e2e;
pub mod host_state;
pub mod lab;
pub mod lifecycle;
pub mod netns;
pub mod report;
pub mod runtime;
pub mod soak;
pub mod testing;
pub mod util;
pub mod verdict;
