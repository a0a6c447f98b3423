//! cnilab harness: throwaway namespaces, a CNI runtime that drives any plugin
//! binary, lifecycle and conformance checks, and a benchmark.
//!
//! Where things happen, floor by floor (a module uses only floors below it;
//! no subcommand imports another):
//! - below everything: [`assets`] (the repository files the binary ships:
//!   scenarios, topologies, templates, manifests, corpus; a file on disk
//!   overrides), [`util`] (scratch dirs, clipping, polling), [`rng`] (a
//!   seeded PRNG: soak's plans, conform's container IDs), [`verdict`],
//!   [`netns`] (throwaway namespaces), [`host_state`], [`accounting`],
//!   [`corpus`] (the hostile-input corpus), [`report`] (the one output
//!   convention: `-o table|json|junit`, JSON `schemaVersion`, the JUnit
//!   writer and XML escaper, the shell quoter, TTY progress, exit codes),
//!   [`interrupt`] (Ctrl-C: the watcher that removes what a run made, and
//!   exits 130);
//! - [`runtime`]: config loading, plugin exec, the result cache, and the
//!   one setup block (`runtime::session`) conform, soak and bench share;
//! - [`lifecycle`]: one pod's whole life as findings (conform builds on it);
//! - [`connectivity`]: probe specs, the pair matrix, diagnoses and node
//!   sanity rules, the report: shared by `lab` and `e2e`;
//! - [`trace`]: one packet followed through namespaces by path, with the
//!   kernel's own routing answers and nftables' own trace (it reads the
//!   types of `lab::model`, which hold a real node as well; `lab trace`
//!   only resolves FROM/TO and the namespaces);
//! - the subcommands: [`conform`], [`soak`], [`bench`], [`lab`], [`e2e`]
//!   (`lab::cri`: `lab --runtime containerd`, a containerd per node and pods
//!   through the CRI; its pause binary is built from `lab/cri/pause.c` by
//!   `build.rs`);
//! - on labs: [`scenario`] (bug scenarios replayed in a lab, with their
//!   faults) and [`sweep`] (what dead lab runs left behind);
//! - [`cli`] (and `main.rs`): parse, dispatch, print; one file per
//!   subcommand, shared flag groups in `cli/args.rs`.
//!
//! Namespaces, netlink, nft, CNI types and snapshots of what a namespace
//! holds come from `cnilab_net`: [`netns`] and [`testing`] here re-export
//! them (plus the harness's runtime fixture); [`host_state`] reads a
//! host-local store.

pub mod accounting;
pub mod assets;
pub mod bench;
pub mod cli;
pub mod conform;
pub mod connectivity;
pub mod corpus;
pub mod e2e;
pub mod host_state;
pub mod interrupt;
pub mod lab;
pub mod lifecycle;
pub mod netns;
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
