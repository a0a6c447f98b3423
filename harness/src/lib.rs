//! cnilab harness: throwaway namespaces, a CNI runtime that drives any plugin
//! binary, lifecycle and conformance checks, labs of simulated nodes,
//! capture and replay of real nodes, and a packet tracer.
//!
//! Where things happen, floor by floor (the README's floor table is the
//! rule, and `tests/layout.rs` holds the code to it): a module imports only
//! from its own floor and the floors below; no subcommand imports another.
//! - base: [`assets`] (the repository files the binary ships; a file on disk
//!   overrides), [`util`], [`rng`], [`netns`] (throwaway namespaces),
//!   [`host_state`], [`report`] (the one output convention: `-o
//!   table|json|junit`, schemas, JUnit, the shell quoter, TTY progress, exit
//!   codes), [`interrupt`] (Ctrl-C), [`cri`] (the CRI client and the
//!   offline pause image);
//! - [`model`]: networks as data, read from live namespaces and applied to
//!   new ones; [`capture`]: a real node read into it;
//! - [`runtime`]: config loading, plugin exec, the result cache, the one
//!   setup block conform, soak and bench share; then what a call means:
//!   [`verdict`], [`accounting`], [`corpus`] (the hostile-input corpus),
//!   [`testing`] (root-test fixtures);
//! - [`lifecycle`]: one pod's whole life as findings;
//! - [`connectivity`]: probe specs, the pair matrix, the node rules, the
//!   report: shared by `lab` and `e2e`;
//! - [`trace`]: one packet followed through namespaces with the kernel's
//!   own routing answers and nftables' own trace;
//! - the subcommands: [`conform`], [`soak`], [`bench`], [`lab`], [`e2e`];
//! - on labs: [`scenario`] and `sweep` (what dead runs left behind);
//! - [`cli`] (and `main.rs`): parse, dispatch, compose, print.
//!
//! Namespaces, netlink, nft, CNI types and snapshots of what a namespace
//! holds come from `cnilab_net`: [`netns`] and [`testing`] re-export them.

pub mod accounting;
pub mod assets;
pub mod bench;
pub mod capture;
pub mod cli;
pub mod conform;
pub mod connectivity;
pub mod corpus;
pub mod cri;
pub mod e2e;
pub mod host_state;
pub mod interrupt;
pub mod lab;
pub mod lifecycle;
pub mod model;
pub mod netns;
pub mod perf;
pub mod report;
pub mod rng;
pub mod runtime;
pub mod scenario;
pub mod soak;
pub(crate) mod sweep;
pub mod testing;
pub mod trace;
pub mod util;
pub mod verdict;
pub mod vm;
