//! cnilab harness: throwaway namespaces, a CNI runtime that drives any plugin
//! binary, lifecycle and conformance checks, and a benchmark.
//!
//! Namespaces, netlink, nft, CNI types and snapshots of what a namespace
//! holds come from `cnilab_net`: [`netns`] and [`testing`] here re-export
//! them (plus the harness's runtime fixture); [`host_state`] reads a
//! host-local store.
//!
//! - `cli/`: the `cnilab` command line, one file per subcommand (its flags,
//!   examples and what it runs); shared flag groups in `cli/args.rs`.
//! - `report/`: the one output convention (`-o table|json|junit`, JSON
//!   `schemaVersion`, the JUnit writer and XML escaper, the shell quoter,
//!   TTY progress, exit codes 0/1/2/3).

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
