//! Connectivity checks that the namespace lab and `e2e check` share.
//!
//! Where things happen: [`groups`] names the check groups (the one list
//! for `lab` and `e2e`), [`probe`] says what a probe is and how it ended,
//! [`matrix`] which pod probes which, [`diagnosis`] names causes (a failed probe
//! with its causes is a `diagnosis::Failure`) and holds the node sanity rules (overlapping pod CIDRs, NAT'd addresses),
//! [`node_rules`] finds causes in the nodes' facts (routes, sysctls, rulesets),
//! [`report`] renders the outcomes, with [`summary`] (failures grouped by
//! cause, the node × node matrix per family, what a diagnosis is about). Sending probes stays with each caller
//! (namespaces in `lab`, pod exec in `e2e`).

pub mod catalogue;
pub mod causes;
#[cfg(test)]
mod causes_tests;
pub mod diagnosis;
pub mod groups;
pub mod matrix;
pub mod node_rules;
pub mod probe;
pub mod report;
pub mod summary;

pub use diagnosis::Diagnosis;
pub use probe::{Endpoint, ExpectSource, ProbeOutcome, ProbeSpec, Proto, ServicePort};
