//! A named likely cause of a failure, and the node sanity rules that the lab
//! and the in-cluster check share.

use super::probe::ProbeOutcome;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr};

/// One likely cause, with a stable id that scenarios assert on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnosis {
    pub id: &'static str,
    pub message: String,
}

impl Diagnosis {
    /// Id of the diagnosis given to a failed probe that no rule explains.
    pub const UNDIAGNOSED: &'static str = "undiagnosed";

    /// For a failed probe that no rule explains: says so, with the probe and
    /// its error, so that the failure is never reported without a cause line.
    pub fn undiagnosed(o: &ProbeOutcome) -> Diagnosis {
        Diagnosis {
            id: Self::UNDIAGNOSED,
            message: format!("no known cause matched: {}", o.describe()),
        }
    }
}

/// VirtualBox's NAT interface address: the same on every VM.
pub const VIRTUALBOX_NAT: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 2, 15));

/// Whether two networks share addresses.
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Every pair of nodes whose pod CIDRs overlap, with the two CIDRs: each
/// item is `(node a, cidr of a, node b, cidr of b)`, a before b.
pub fn overlapping_cidrs<'a>(
    nodes: &[(&'a str, &'a [IpNet])],
) -> Vec<(&'a str, IpNet, &'a str, IpNet)> {
    let mut out = Vec::new();
    for (i, (a, cas)) in nodes.iter().enumerate() {
        for (b, cbs) in &nodes[i + 1..] {
            for ca in cas.iter() {
                for cb in cbs.iter() {
                    if overlaps(ca, cb) {
                        out.push((*a, *ca, *b, *cb));
                    }
                }
            }
        }
    }
    out
}
