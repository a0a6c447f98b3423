//! Node sanity rules that the agent, the lab and the in-cluster check share:
//! which addresses never identify a node, and which pod CIDRs collide. Pure.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr};

/// VirtualBox's NAT interface address: the same on every VM (Vagrant), so it
/// never identifies a node.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    #[test]
    fn overlap_is_symmetric_and_exact() {
        assert!(overlaps(&net("10.244.0.0/16"), &net("10.244.1.0/24")));
        assert!(overlaps(&net("10.244.1.0/24"), &net("10.244.0.0/16")));
        assert!(!overlaps(&net("10.244.0.0/24"), &net("10.244.1.0/24")));
        assert!(!overlaps(&net("10.244.0.0/24"), &net("fd00::/64")));
    }

    #[test]
    fn overlapping_pairs_name_both_nodes() {
        let a = [net("10.244.0.0/24")];
        let b = [net("10.244.0.0/23")];
        let c = [net("10.244.2.0/24")];
        let pairs = overlapping_cidrs(&[("a", &a), ("b", &b), ("c", &c)]);
        assert_eq!(pairs, vec![("a", a[0], "b", b[0])]);
    }
}
