//! The pure part of reconciling routes: from the nodes and the routes now in
//! the kernel's main table, decide what to add, replace and delete.
//!
//! Routes this agent makes carry [`ROUTE_PROTOCOL`] (`proto 199` in `ip
//! route`); any route without it is foreign and is never changed or deleted.

use crate::cidrs::{self, NetSet, OutOfScope};
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
    /// The CIDR overlaps a special-purpose block (loopback, link-local and
    /// the metadata address, multicast, broadcast): never routed.
    SpecialPurposeCidr {
        node: String,
        dst: IpNet,
        block: IpNet,
    },
    /// The CIDR is outside every `--cluster-cidr`: never routed.
    OutsideClusterCidrs { node: String, dst: IpNet },
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
            Warning::SpecialPurposeCidr { node, dst, block } => write!(
                f,
                "node {node}'s podCIDR {dst} overlaps the special-purpose block {block}: refused, not routed (the node's last good route stays)"
            ),
            Warning::OutsideClusterCidrs { node, dst } => write!(
                f,
                "node {node}'s podCIDR {dst} is outside every --cluster-cidr: refused, not routed (the node's last good route stays)"
            ),
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

impl Warning {
    /// The node whose pod CIDR this warning refuses as out of scope (outside
    /// the cluster CIDRs or special-purpose).
    pub fn refused_out_of_scope(&self) -> Option<&str> {
        match self {
            Warning::SpecialPurposeCidr { node, .. }
            | Warning::OutsideClusterCidrs { node, .. } => Some(node),
            _ => None,
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
/// InternalIP of the same family, each with the node that claims it. A pod
/// CIDR outside every cluster CIDR, or overlapping a special-purpose block,
/// is refused. O(n log n) in the number of nodes.
pub fn desired_routes(
    self_name: &str,
    nodes: &[NodeInfo],
    cluster_cidrs: &[IpNet],
) -> (Vec<(String, NodeRoute)>, Vec<Warning>) {
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
    let mut candidates: Vec<(String, IpNet, IpAddr)> = Vec::new();
    for node in nodes.iter().filter(|n| n.name != self_name) {
        if node.pod_cidrs.is_empty() {
            warnings.push(Warning::NoPodCidr {
                node: node.name.clone(),
            });
        }
        for dst in &node.pod_cidrs {
            let name = node.name.clone();
            match cidrs::scope(dst, cluster_cidrs) {
                Some(OutOfScope::Special(block)) => {
                    warnings.push(Warning::SpecialPurposeCidr {
                        node: name,
                        dst: *dst,
                        block,
                    });
                    continue;
                }
                Some(OutOfScope::OutsideCluster) => {
                    warnings.push(Warning::OutsideClusterCidrs {
                        node: name,
                        dst: *dst,
                    });
                    continue;
                }
                None => {}
            }
            if own_cidrs.iter().any(|own| overlaps(own, dst)) {
                warnings.push(Warning::OverlapsOwnPodCidr {
                    node: name,
                    dst: *dst,
                });
                continue;
            }
            if let Some(ip) = cidrs::contains_any(&node_ips, dst) {
                warnings.push(Warning::CoversNodeAddress {
                    node: name,
                    dst: *dst,
                    ip,
                });
                continue;
            }
            let gateway = node.internal_ips.iter().find(|ip| {
                ip.is_ipv4() == dst.addr().is_ipv4() && usable_next_hop(ip) && !shared.contains(ip)
            });
            match gateway {
                Some(gateway) => candidates.push((name, *dst, *gateway)),
                None => warnings.push(Warning::NoNextHop {
                    node: name,
                    dst: *dst,
                }),
            }
        }
    }

    // Two nodes with overlapping pod CIDRs cannot both be right; routing to
    // either would send some pods' traffic to the wrong node.
    let keyed: Vec<(&str, IpNet)> = candidates
        .iter()
        .map(|(node, dst, _)| (node.as_str(), *dst))
        .collect();
    let mut rejected = BTreeSet::new();
    for (outer, inner) in cidrs::overlapping_pairs(&keyed) {
        let ((node_a, a), (node_b, b)) = (keyed[outer], keyed[inner]);
        if node_a != node_b {
            rejected.insert(a);
            rejected.insert(b);
            let mut names = vec![node_a.to_string(), node_b.to_string()];
            names.sort();
            warnings.push(Warning::OverlappingPodCidrs {
                dst: a,
                nodes: names,
            });
        }
    }
    let mut routes: Vec<(String, NodeRoute)> = candidates
        .into_iter()
        .filter(|(_, dst, _)| !rejected.contains(dst))
        .map(|(node, dst, gateway)| (node, NodeRoute { dst, gateway }))
        .collect();
    routes.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    routes.dedup_by(|a, b| a.1 == b.1);
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

/// The next hops of nodes that have a pod CIDR refused as out of scope: an
/// own route via one of them that no node wants any more is the node's last
/// good route, kept while its new CIDR is refused.
fn refused_gateways(nodes: &[NodeInfo], warnings: &[Warning]) -> BTreeSet<IpAddr> {
    let refused: BTreeSet<&str> = warnings
        .iter()
        .filter_map(Warning::refused_out_of_scope)
        .collect();
    nodes
        .iter()
        .filter(|n| refused.contains(n.name.as_str()))
        .flat_map(|n| n.internal_ips.iter().copied())
        .collect()
}

/// Compares the desired routes with the installed ones. Only routes marked
/// ours are replaced or deleted; a foreign route on a wanted destination
/// wins and is reported. A peer pod CIDR that overlaps a network this node
/// is attached to (the underlay) is refused and reported; so is one outside
/// every `cluster_cidrs` entry or in a special-purpose block, and then the
/// node's last good route stays. O(n log n) in nodes and routes.
pub fn plan(
    self_name: &str,
    nodes: &[NodeInfo],
    installed: &[InstalledRoute],
    cluster_cidrs: &[IpNet],
) -> Plan {
    let (claimed, mut warnings) = desired_routes(self_name, nodes, cluster_cidrs);
    let own_cidrs = own_pod_cidrs(self_name, nodes);
    let attached = NetSet::new(attached_networks(&own_cidrs, installed));
    let mut desired = Vec::with_capacity(claimed.len());
    for (node, route) in claimed {
        match attached.overlapping(&route.dst) {
            Some(network) => warnings.push(Warning::CoversAttachedNetwork {
                node,
                dst: route.dst,
                network,
            }),
            None => desired.push(route),
        }
    }
    warnings.sort();
    warnings.dedup();
    let wanted: BTreeMap<IpNet, NodeRoute> = desired.iter().map(|r| (r.dst, *r)).collect();
    let wanted_nets = NetSet::new(wanted.keys().copied());
    let keep_via = refused_gateways(nodes, &warnings);
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
            None if route.gateway.is_some_and(|gw| keep_via.contains(&gw))
                && cidrs::scope(&route.dst, cluster_cidrs).is_none()
                && wanted_nets.overlapping(&route.dst).is_none()
                && attached.overlapping(&route.dst).is_none()
                && !own_cidrs.iter().any(|own| overlaps(own, &route.dst)) => {}
            _ => actions.push(RouteAction::Delete(*route)),
        }
    }
    let mut foreign: BTreeMap<IpNet, &InstalledRoute> = BTreeMap::new();
    for route in installed.iter().filter(|r| !r.ours) {
        foreign.entry(route.dst).or_insert(route);
    }
    for want in &desired {
        if satisfied.contains(&want.dst) {
            continue;
        }
        if let Some(existing) = foreign.get(&want.dst) {
            warnings.push(Warning::ForeignRouteConflict {
                dst: want.dst,
                existing: **existing,
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
