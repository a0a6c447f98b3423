//! A named likely cause of a failure, and a failed probe with its causes
//! ([`Failure`], which the report and the summary both read). The node sanity rules that the lab,
//! the in-cluster check and the agent share live in `cnilab_net::cluster`
//! (re-exported here).

use super::probe::ProbeOutcome;

/// A failed probe and the likely causes found for it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Failure {
    /// Position of the probe in the plan.
    pub index: usize,
    pub outcome: ProbeOutcome,
    pub diagnoses: Vec<Diagnosis>,
}

impl Failure {
    /// Probe `index` of the plan, failed as `outcome`, with its
    /// `diagnoses`, or "undiagnosed" where no rule explains it: a failure
    /// never passes silently.
    pub fn new(index: usize, outcome: &ProbeOutcome, mut diagnoses: Vec<Diagnosis>) -> Failure {
        if diagnoses.is_empty() {
            diagnoses.push(Diagnosis::undiagnosed(outcome));
        }
        Failure {
            index,
            outcome: outcome.clone(),
            diagnoses,
        }
    }
}

/// One likely cause, with a stable id that scenarios assert on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnosis {
    pub id: &'static str,
    pub message: String,
}

impl Diagnosis {
    /// Id of the diagnosis given to a failed probe that no rule explains.
    pub const UNDIAGNOSED: &'static str = "undiagnosed";

    /// Whether a host limit (the host's neighbour table full, a backlog
    /// dropping, ENOBUFS) could be what this diagnosis saw: none, an
    /// unresolved neighbour, or the kernel's drop for one (`NEIGH_*`).
    pub fn could_be_host_limit(&self) -> bool {
        matches!(
            self.id,
            Diagnosis::UNDIAGNOSED | "neighbour-failed" | "neighbour-missing" | "stale-neighbour"
        ) || (self.id == "kernel-drop" && self.message.contains("NEIGH_"))
    }

    /// For a failed probe that no rule explains: says so, with the probe and
    /// its error, so that the failure is never reported without a cause line.
    pub fn undiagnosed(o: &ProbeOutcome) -> Diagnosis {
        Diagnosis {
            id: Self::UNDIAGNOSED,
            message: format!("no known cause matched: {}", o.describe()),
        }
    }
}

pub use cnilab_net::cluster::{overlapping_cidrs, overlaps, VIRTUALBOX_NAT};
