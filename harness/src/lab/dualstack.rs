//! The minimum of dual-stack the lab's IPv6 scenario needs (additive; the
//! lab's full IPv6 support is separate work): when pods have IPv6 addresses
//! and routing is static on an `l2` underlay, every node's uplink gets an
//! IPv6 address derived from its IPv4 one (`fd0c:11ab::<IPv4>`, no DAD) and
//! routes to the other nodes' IPv6 pod CIDRs via those addresses; the check
//! group `pod-to-pod/ipv6-cross-node` pings (ICMPv6, answered by the kernel)
//! every pod's IPv6 address from a pod on the previous node.

use super::build::{Lab, LabError};
use super::diagnose::{Diagnosis, NodeFacts};
use super::topology::{Routing, Topology};
use super::underlay::{batch, Shape};
use crate::connectivity::{Endpoint, ProbeOutcome, ProbeSpec, Proto};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};

pub const GROUP: &str = "pod-to-pod/ipv6-cross-node";

/// Whether the lab routes IPv6 pod CIDRs itself (static, `l2`, IPv6 pods).
pub fn active(topo: &Topology) -> bool {
    topo.routing == Routing::Static
        && topo.shape == Shape::L2
        && topo
            .nodes
            .iter()
            .any(|n| n.pod_cidr.iter().any(|c| c.addr().is_ipv6()))
}

/// A node's IPv6 underlay address, derived from its IPv4 one.
pub fn underlay_address(v4: IpAddr) -> Option<Ipv6Addr> {
    let IpAddr::V4(a) = v4 else { return None };
    let [a, b, c, d] = a.octets();
    Some(Ipv6Addr::new(
        0xfd0c,
        0x11ab,
        0,
        0,
        0,
        0,
        u16::from_be_bytes([a, b]),
        u16::from_be_bytes([c, d]),
    ))
}

/// Node `i`'s IPv6 uplink address and its routes to every other node's
/// IPv6 pod CIDR; with `peers`, also the other nodes' routes to node `i`.
pub fn install(lab: &Lab, i: usize, peers: bool) -> Result<(), LabError> {
    if !active(&lab.topo) {
        return Ok(());
    }
    let me = &lab.nodes[i];
    if let Some(addr) = underlay_address(me.spec.address) {
        batch(
            &me.ns,
            "ip",
            &format!("address replace {addr}/64 dev eth0 nodad\n"),
        )?;
    }
    for (k, node) in lab.nodes.iter().enumerate() {
        let script: String = lab
            .nodes
            .iter()
            .enumerate()
            .filter(|(p, _)| *p != k && (k == i || (peers && *p == i)))
            .flat_map(|(_, peer)| {
                let via = underlay_address(peer.spec.address);
                peer.spec
                    .pod_cidr
                    .iter()
                    .filter(|c| c.addr().is_ipv6())
                    .filter_map(move |c| {
                        via.map(|v| format!("route replace {} via {v} dev eth0\n", c.trunc()))
                    })
            })
            .collect();
        if !script.is_empty() {
            batch(&node.ns, "ip", &script)?;
        }
    }
    Ok(())
}

/// Every node's addresses and routes.
pub fn install_all(lab: &Lab) -> Result<(), LabError> {
    for i in 0..lab.nodes.len() {
        install(lab, i, false)?;
    }
    Ok(())
}

/// Node `n`'s pod `p` as a probe endpoint, by its address of one family.
pub fn pod_endpoint(lab: &Lab, n: usize, p: usize, v6: bool) -> Option<Endpoint> {
    let node = &lab.nodes[n];
    let pod = node.pods.get(p)?;
    Some(Endpoint {
        name: format!("{}/{}", node.spec.name, pod.name),
        node: Some(n),
        pod: Some(p),
        ip: pod.ips.iter().find(|ip| ip.addr().is_ipv6() == v6)?.addr(),
        external: false,
    })
}

fn v6_pod(lab: &Lab, n: usize, p: usize) -> Option<Endpoint> {
    pod_endpoint(lab, n, p, true)
}

/// ICMPv6 from every pod with an IPv6 address to the pod at the same
/// position (or the first) on the next node, in labs whose IPv6 pod routes
/// the lab itself installs.
pub fn plan(lab: &Lab, wanted: &dyn Fn(&str) -> bool, out: &mut Vec<ProbeSpec>) {
    let nodes = lab.nodes.len();
    if !wanted(GROUP) || nodes < 2 || !active(&lab.topo) {
        return;
    }
    for n in 0..nodes {
        let next = (n + 1) % nodes;
        for p in 0..lab.nodes[n].pods.len() {
            let Some(from) = v6_pod(lab, n, p) else {
                continue;
            };
            let Some(to) = v6_pod(lab, next, p).or_else(|| v6_pod(lab, next, 0)) else {
                continue;
            };
            out.push(ProbeSpec {
                group: GROUP,
                from,
                to,
                proto: Proto::Icmp,
                expect_source: None,
            });
        }
    }
}

/// An IPv6 probe failed: is IPv6 forwarding off on a node on its path?
pub fn diagnose(lab: &Lab, facts: &[NodeFacts], o: &ProbeOutcome, out: &mut Vec<Diagnosis>) {
    if o.spec.group != GROUP {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn underlay_address_embeds_the_ipv4_one() {
        let a = underlay_address("10.250.0.2".parse().expect("ip")).expect("v6");
        assert_eq!(a.to_string(), "fd0c:11ab::afa:2");
        assert!(underlay_address("::1".parse().expect("ip")).is_none());
    }
}
