//! A node's underlay addresses, its static routes to the other nodes' pod
//! CIDRs (`routing = "static"`), and the node list the agents read.

use super::base::{netlink, setup, LabError};
use super::topology::{shapes, NodeSpec, Topology};
use crate::netns::Netns;
use cnilab_net::nl;
use ipnet::IpNet;
use std::net::IpAddr;

/// The JSON node list the agent's file source reads.
pub fn nodes_file(nodes: &[NodeSpec]) -> String {
    let list: Vec<serde_json::Value> = nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "name": n.name,
                // One address, or both families' (the agent reads either).
                "internalIP": match n.addresses().as_slice() {
                    [one] => serde_json::json!(one),
                    all => serde_json::json!(all),
                },
                "podCIDRs": n.pod_cidr.iter().map(|c| c.trunc().to_string()).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::to_string_pretty(&list).unwrap_or_else(|_| "[]".into())
}

/// The nftables ruleset of `masquerade = "node"`: pod traffic that leaves
/// the cluster CIDR is masqueraded to the node's address (the chain the
/// agent's table holds too, `cnilab_net::masquerade`).
pub fn node_nat_ruleset(node: &NodeSpec, cluster: &[IpNet]) -> String {
    cnilab_net::masquerade::table("cnilab_lab_nat", &node.pod_cidr, cluster)
}

/// Each of `node`'s underlay addresses with the prefix of its underlay.
pub fn underlay_addresses(topo: &Topology, node: &NodeSpec) -> Result<Vec<IpNet>, LabError> {
    node.addresses()
        .into_iter()
        .map(|a| {
            // IPv4: the node's subnet (one per node in a routed underlay).
            let prefix = match topo.underlay6 {
                Some(u6) if a.is_ipv6() => u6.prefix_len(),
                _ => shapes::node_prefix(topo),
            };
            IpNet::new(a, prefix).map_err(|e| setup(e.to_string()))
        })
        .collect()
}

/// Installs `podCIDR via nodeIP` for every other node, in each family (the
/// next hop is the peer's underlay address of the pod CIDR's family).
pub fn install_static_routes(
    node: &Netns,
    me: &NodeSpec,
    all: &[NodeSpec],
) -> Result<(), LabError> {
    let others: Vec<(IpNet, IpAddr)> = all
        .iter()
        .filter(|n| n.name != me.name)
        .flat_map(|n| {
            n.pod_cidr
                .iter()
                .filter_map(move |c| n.address_of(c.addr().is_ipv6()).map(|via| (c.trunc(), via)))
        })
        .collect();
    netlink(node, &format!("routes on {}", me.name), |h| async move {
        for (dst, via) in others {
            let msg = nl::route_message(dst, Some(via), None, None)
                .map_err(|_| rtnetlink::Error::RequestFailed)?;
            nl::add_route(&h, msg, true).await?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_ruleset_excludes_the_cluster() {
        let topo = Topology::generated(1, 1).expect("topology");
        let rules = node_nat_ruleset(&topo.nodes[0], &topo.cluster_cidr);
        assert!(
            rules.contains("ip saddr 10.244.1.0/24 ip daddr != 10.244.0.0/16 counter masquerade"),
            "{rules}"
        );
    }

    #[test]
    fn nodes_file_has_the_agent_fields() {
        let topo = Topology::generated(2, 1).expect("topology");
        let v: serde_json::Value = serde_json::from_str(&nodes_file(&topo.nodes)).expect("json");
        assert_eq!(v[1]["internalIP"], "10.250.0.2");
        assert_eq!(v[1]["podCIDRs"][0], "10.244.2.0/24");
    }

    /// A dual-stack node publishes both underlay addresses, so an agent
    /// can route its IPv6 pod CIDR via its IPv6 address.
    #[test]
    fn nodes_file_names_both_families_of_a_dual_stack_node() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../lab/topologies/dual-stack.toml");
        let topo = Topology::load(&path).expect("topology");
        let v: serde_json::Value = serde_json::from_str(&nodes_file(&topo.nodes)).expect("json");
        assert_eq!(
            v[1]["internalIP"],
            serde_json::json!(["10.250.0.2", "fd00:10:250::2"])
        );
    }
}
