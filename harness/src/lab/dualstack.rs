//! IPv6-only causes of a failed IPv6 probe in a dual-stack lab (the IPv6
//! matrix itself is [`super::checks`]'s, on a dual-stack underlay).

use super::build::Lab;
use super::diagnose::{Diagnosis, NodeFacts};
use crate::connectivity::ProbeOutcome;
use std::fmt::Write as _;

/// An IPv6 probe failed: is IPv6 forwarding off on a node on its path?
pub fn diagnose(lab: &Lab, facts: &[NodeFacts], o: &ProbeOutcome, out: &mut Vec<Diagnosis>) {
    if !o.spec.to.ip.is_ipv6() {
        return;
    }
    let mut text = String::new();
    for i in [o.spec.from.node, o.spec.to.node].into_iter().flatten() {
        let (Some(node), Some(f)) = (lab.nodes.get(i), facts.get(i)) else {
            continue;
        };
        let value =
            cnilab_net::netns::read_sysctl(Some(node.ns.file()), "net/ipv6/conf/all/forwarding")
                .unwrap_or_default();
        if value.trim() == "0" && !text.contains(&f.name) {
            let _ = write!(text, "{}", f.name);
            out.push(Diagnosis {
                id: "ipv6-forward-off",
                message: format!(
                    "net.ipv6.conf.all.forwarding = 0 on {} (net.ipv4.ip_forward = {}): the node routes its pods' IPv4 traffic but not their IPv6 traffic, so a dual-stack pod is reachable over IPv4 only",
                    f.name, f.ip_forward
                ),
            });
        }
    }
}
