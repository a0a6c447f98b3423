//! What the diagnosis reads from a node: its routes, sysctls, uplink,
//! neighbours and firewall ruleset ([`NodeFacts`]). The shapes add their
//! own (`vxlan::facts`); `diagnose.rs` judges them.

use super::built::{Lab, Node};
pub use crate::connectivity::node_rules::NodeFacts;

/// A node's ARP entries on its underlay interface.
fn uplink_neighbours(node: &Node) -> Vec<crate::netns::Neighbour> {
    let Some(eth0) = node
        .ns
        .links()
        .ok()
        .and_then(|l| l.into_iter().find(|l| l.name == "eth0"))
    else {
        return Vec::new();
    };
    node.ns
        .neighbours()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.index == eth0.index)
        .collect()
}

/// Every node's ARP entries on its underlay interface, taken before the
/// probes run: a stale entry is corrected by the first ARP request from the
/// peer, so after the probes it may be gone while the failures it caused stay.
pub fn neighbours_before(lab: &Lab) -> Vec<Vec<crate::netns::Neighbour>> {
    lab.nodes.iter().map(uplink_neighbours).collect()
}

/// Every node's facts, without the shapes' own.
pub(super) fn collect_nodes(lab: &Lab) -> Vec<NodeFacts> {
    lab.nodes
        .iter()
        .map(|node| {
            let file = node.ns.file();
            let sysctl = |key: &str| {
                cnilab_net::netns::read_sysctl(Some(file), key)
                    .unwrap_or_else(|e| format!("unreadable: {e}"))
            };
            let ruleset = node
                .ns
                .command("nft")
                .args(["list", "ruleset"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let uplink = node
                .ns
                .links()
                .ok()
                .and_then(|l| l.into_iter().find(|l| l.name == "eth0"));
            let rp_all = sysctl("net/ipv4/conf/all/rp_filter");
            let rp_eth0 = sysctl("net/ipv4/conf/eth0/rp_filter");
            NodeFacts {
                name: node.spec.name.clone(),
                address: Some(node.spec.address),
                address6: node.spec.address_of(true),
                addresses: node
                    .ns
                    .addresses()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| a.addr.addr())
                    .collect(),
                pod_cidr: node.spec.pod_cidr.clone(),
                routes: node.ns.routes().unwrap_or_default(),
                ip_forward: sysctl("net/ipv4/ip_forward"),
                // The kernel uses the larger of "all" and the interface's value.
                rp_filter: if rp_all == "1" || rp_eth0 == "1" {
                    "1".into()
                } else {
                    rp_all.max(rp_eth0)
                },
                uplink_mtu: uplink.as_ref().and_then(|l| l.mtu),
                uplink_mac: uplink.as_ref().and_then(|l| l.mac.clone()),
                uplink_neighbours: uplink_neighbours(node),
                ruleset,
                ..NodeFacts::default()
            }
        })
        .collect()
}
