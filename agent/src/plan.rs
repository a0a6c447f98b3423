//! The pure part of reconciling routes: from the nodes and the routes now in
//! the kernel's main table, decide what to add, replace and delete.
//!
//! Routes this agent makes carry [`ROUTE_PROTOCOL`] (`proto 199` in `ip
//! route`); any route without it is foreign and is never changed or deleted.

use crate::nodes::NodeInfo;
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

/// Route protocol number that marks routes made by cnilab-agent. 199 is not
/// assigned in iproute2's `rt_protos` and not used by the common routing
/// daemons or CNI agents (bird 12, zebra 11, bgp 186 .. eigrp 192).
pub const ROUTE_PROTOCOL: u8 = 199;

use cnilab_net::cluster::{overlaps, VIRTUALBOX_NAT as VAGRANT_NAT_ADDRESS};

/// `dst via gateway`, the route to another node's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeRoute {
    pub dst: IpNet,
    pub gateway: IpAddr,
}

impl fmt::Display for NodeRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} via {}", self.dst, self.gateway)
    }
}

/// A unicast route found in the main table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstalledRoute {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub priority: u32,
    /// Carries [`ROUTE_PROTOCOL`].
    pub ours: bool,
}

impl fmt::Display for InstalledRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if self.priority != 0 {
            write!(f, " metric {}", self.priority)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteAction {
    Add(NodeRoute),
    /// An own route whose next hop changed (the node's InternalIP moved).
    Replace {
        old: InstalledRoute,
        new: NodeRoute,
    },
    /// An own route no node wants any more.
    Delete(InstalledRoute),
}

impl fmt::Display for RouteAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteAction::Add(r) => write!(f, "add {r}"),
            RouteAction::Replace { old, new } => write!(f, "replace {old} with {new}"),
            RouteAction::Delete(r) => write!(f, "delete {r}"),
        }
    }
}

/// Something in the node list that looks wrong; the affected route is skipped
/// unless said otherwise.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Warning {
    /// The InternalIP is a NAT address (Vagrant's 10.0.2.15). Used anyway when
    /// no other node has it.
    NatAddress { node: String, ip: IpAddr },
    /// Several nodes claim the same InternalIP: no route goes via it.
    SharedInternalIp { ip: IpAddr, nodes: Vec<String> },
    /// The node has no usable InternalIP of this pod CIDR's family.
    NoNextHop { node: String, dst: IpNet },
    /// The node has no podCIDR yet.
    NoPodCidr { node: String },
    /// The CIDR overlaps this node's own pod CIDR.
    OverlapsOwnPodCidr { node: String, dst: IpNet },
    /// The CIDR covers a node's InternalIP (this node's or another's):
    /// routing it would send node traffic to a peer.
    CoversNodeAddress {
        node: String,
        dst: IpNet,
        ip: IpAddr,
    },
    /// The CIDR overlaps a network this node is attached to (the underlay):
    /// routing it would hijack that network's traffic.
    CoversAttachedNetwork {
        node: String,
        dst: IpNet,
        network: IpNet,
    },
    /// Several nodes claim overlapping pod CIDRs: none of them is routed.
    OverlappingPodCidrs { dst: IpNet, nodes: Vec<String> },
    /// A route we did not make already exists for this destination.
    ForeignRouteConflict {
        dst: IpNet,
        existing: InstalledRoute,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::NatAddress { node, ip } => write!(
                f,
                "node {node} has InternalIP {ip}, a NAT address (Vagrant/VirtualBox): pin kubelet --node-ip to the private network address"
            ),
            Warning::SharedInternalIp { ip, nodes } => write!(
                f,
                "InternalIP {ip} is claimed by several nodes ({}): not routing via it; pin kubelet --node-ip on each node",
                nodes.join(", ")
            ),
            Warning::NoNextHop { node, dst } => write!(
                f,
                "node {node} has no usable InternalIP of {dst}'s address family: {dst} is not routed"
            ),
            Warning::NoPodCidr { node } => write!(f, "node {node} has no podCIDR yet: no route to it"),
            Warning::OverlapsOwnPodCidr { node, dst } => write!(
                f,
                "node {node}'s podCIDR {dst} overlaps this node's podCIDR: not routed"
            ),
            Warning::CoversNodeAddress { node, dst, ip } => write!(
                f,
                "node {node}'s podCIDR {dst} covers the node address {ip}: refused, not routed"
            ),
            Warning::CoversAttachedNetwork { node, dst, network } => write!(
                f,
                "node {node}'s podCIDR {dst} overlaps the attached network {network} (the underlay?): refused, not routed"
            ),
            Warning::OverlappingPodCidrs { dst, nodes } => write!(
                f,
                "podCIDR {dst} overlaps between nodes {}: not routed",
                nodes.join(", ")
            ),
            Warning::ForeignRouteConflict { dst, existing } => write!(
                f,
                "a route not made by cnilab-agent already exists for {dst} ({existing}): leaving it alone"
            ),
        }
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    pub desired: Vec<NodeRoute>,
    pub actions: Vec<RouteAction>,
    pub warnings: Vec<Warning>,
}

fn usable_next_hop(ip: &IpAddr) -> bool {
    let special = match ip {
        IpAddr::V4(v4) => v4.is_broadcast() || v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    !(special || ip.is_unspecified() || ip.is_loopback() || ip.is_multicast())
}

/// The routes this node should have: every other node's pod CIDRs via its
/// InternalIP of the same family.
pub fn desired_routes(self_name: &str, nodes: &[NodeInfo]) -> (Vec<NodeRoute>, Vec<Warning>) {
    let mut warnings = Vec::new();

    let mut owners_by_ip: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for node in nodes {
        for ip in node.internal_ips.iter().collect::<BTreeSet<_>>() {
            owners_by_ip.entry(*ip).or_default().push(node.name.clone());
        }
    }
    let shared: BTreeSet<IpAddr> = owners_by_ip
        .iter()
        .filter(|(_, owners)| owners.len() > 1)
        .map(|(ip, _)| *ip)
        .collect();
    for ip in &shared {
        warnings.push(Warning::SharedInternalIp {
            ip: *ip,
            nodes: owners_by_ip[ip].clone(),
        });
    }
    for node in nodes {
        if node.internal_ips.contains(&VAGRANT_NAT_ADDRESS)
            && !shared.contains(&VAGRANT_NAT_ADDRESS)
        {
            warnings.push(Warning::NatAddress {
                node: node.name.clone(),
                ip: VAGRANT_NAT_ADDRESS,
            });
        }
    }

    let own_cidrs = own_pod_cidrs(self_name, nodes);

    let node_ips: BTreeSet<IpAddr> = owners_by_ip.keys().copied().collect();
    let mut candidates: Vec<(String, NodeRoute)> = Vec::new();
    for node in nodes.iter().filter(|n| n.name != self_name) {
        if node.pod_cidrs.is_empty() {
            warnings.push(Warning::NoPodCidr {
                node: node.name.clone(),
            });
        }
        for dst in &node.pod_cidrs {
            if own_cidrs.iter().any(|own| overlaps(own, dst)) {
                warnings.push(Warning::OverlapsOwnPodCidr {
                    node: node.name.clone(),
                    dst: *dst,
                });
                continue;
            }
            if let Some(ip) = node_ips.iter().find(|ip| dst.contains(*ip)) {
                warnings.push(Warning::CoversNodeAddress {
                    node: node.name.clone(),
                    dst: *dst,
                    ip: *ip,
                });
                continue;
            }
            let gateway = node.internal_ips.iter().find(|ip| {
                ip.is_ipv4() == dst.addr().is_ipv4() && usable_next_hop(ip) && !shared.contains(ip)
            });
            match gateway {
                Some(gateway) => candidates.push((
                    node.name.clone(),
                    NodeRoute {
                        dst: *dst,
                        gateway: *gateway,
                    },
                )),
                None => warnings.push(Warning::NoNextHop {
                    node: node.name.clone(),
                    dst: *dst,
                }),
            }
        }
    }

    // Two nodes with overlapping pod CIDRs cannot both be right; routing to
    // either would send some pods' traffic to the wrong node.
    let mut rejected = BTreeSet::new();
    for (i, (node_a, a)) in candidates.iter().enumerate() {
        for (node_b, b) in candidates.iter().skip(i + 1) {
            if node_a != node_b && overlaps(&a.dst, &b.dst) {
                rejected.insert(a.dst);
                rejected.insert(b.dst);
                let mut names = vec![node_a.clone(), node_b.clone()];
                names.sort();
                warnings.push(Warning::OverlappingPodCidrs {
                    dst: a.dst,
                    nodes: names,
                });
            }
        }
    }
    let mut routes: Vec<NodeRoute> = candidates
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| !rejected.contains(&r.dst))
        .collect();
    routes.sort();
    routes.dedup();
    warnings.sort();
    warnings.dedup();
    (routes, warnings)
}

fn own_pod_cidrs(self_name: &str, nodes: &[NodeInfo]) -> Vec<IpNet> {
    nodes
        .iter()
        .filter(|n| n.name == self_name)
        .flat_map(|n| n.pod_cidrs.iter().copied())
        .collect()
}

/// Networks this node is attached to: foreign routes without a next hop
/// (the kernel's connected routes, such as the underlay's), except the
/// default route and this node's own pod CIDRs.
fn attached_networks(own_cidrs: &[IpNet], installed: &[InstalledRoute]) -> Vec<IpNet> {
    installed
        .iter()
        .filter(|r| !r.ours && r.gateway.is_none() && r.dst.prefix_len() > 0)
        .map(|r| r.dst)
        .filter(|dst| !own_cidrs.iter().any(|own| overlaps(own, dst)))
        .collect()
}

/// Compares the desired routes with the installed ones. Only routes marked
/// ours are replaced or deleted; a foreign route on a wanted destination
/// wins and is reported. A peer pod CIDR that overlaps a network this node
/// is attached to (the underlay) is refused and reported.
pub fn plan(self_name: &str, nodes: &[NodeInfo], installed: &[InstalledRoute]) -> Plan {
    let (mut desired, mut warnings) = desired_routes(self_name, nodes);
    let own_cidrs = own_pod_cidrs(self_name, nodes);
    let attached = attached_networks(&own_cidrs, installed);
    desired.retain(|r| {
        let Some(network) = attached.iter().find(|a| overlaps(a, &r.dst)) else {
            return true;
        };
        let node = nodes
            .iter()
            .find(|n| n.name != self_name && n.pod_cidrs.contains(&r.dst))
            .map(|n| n.name.clone())
            .unwrap_or_default();
        warnings.push(Warning::CoversAttachedNetwork {
            node,
            dst: r.dst,
            network: *network,
        });
        false
    });
    warnings.sort();
    warnings.dedup();
    let wanted: BTreeMap<IpNet, NodeRoute> = desired.iter().map(|r| (r.dst, *r)).collect();
    let mut actions = Vec::new();
    let mut satisfied = BTreeSet::new();

    let mut ours: Vec<&InstalledRoute> = installed.iter().filter(|r| r.ours).collect();
    // Of several own routes to one destination, keep one already right.
    ours.sort_by_key(|r| {
        let wrong = wanted.get(&r.dst).map(|w| Some(w.gateway) != r.gateway);
        (wrong, **r)
    });
    for route in ours {
        match wanted.get(&route.dst) {
            Some(want) if !satisfied.contains(&route.dst) => {
                satisfied.insert(route.dst);
                if route.gateway != Some(want.gateway) {
                    actions.push(RouteAction::Replace {
                        old: *route,
                        new: *want,
                    });
                }
            }
            _ => actions.push(RouteAction::Delete(*route)),
        }
    }
    for want in &desired {
        if satisfied.contains(&want.dst) {
            continue;
        }
        if let Some(existing) = installed.iter().find(|r| !r.ours && r.dst == want.dst) {
            warnings.push(Warning::ForeignRouteConflict {
                dst: want.dst,
                existing: *existing,
            });
            continue;
        }
        actions.push(RouteAction::Add(*want));
    }
    Plan {
        desired,
        actions,
        warnings,
    }
}
