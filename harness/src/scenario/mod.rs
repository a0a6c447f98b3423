//! `cnilab scenario`: bug scenarios replayed in labs.
//!
//! A scenario is a topology plus steps (check, inject a fault, expect a
//! failure with a named diagnosis, heal, expect a pass), saved as TOML under
//! `lab/scenarios/`. It builds on the lab (`crate::lab`: the builder, the
//! checks, the diagnoses); the command line (`cli/scenario.rs`) prints.
//!
//! Where things happen, top down: [`run`] (a fresh lab, or the replayed
//! captures of a `[capture]` scenario (`crate::lab::replay`), each step in
//! turn, the lab torn down, or kept in its faulted state with `--keep`) →
//! [`faults`] (routes, sysctls, firewall, nodes and
//! agents; each fault with its undo) → [`shape_faults`] (the underlay
//! shapes', the VXLAN overlay's and the Services' faults) → [`file`] (the
//! file read and validated, every fault in words).

pub(crate) mod faults;
pub mod file;
pub(crate) mod run;
pub(crate) mod shape_faults;

pub use file::Scenario;
pub use run::{run, StepLog};
