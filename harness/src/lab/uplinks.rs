//! A replayed node's links toward the others (`lab up --capture`,
//! [`super::replay`]): which link is its uplink, joined to the switch, and
//! what becomes of its other NICs.
//!
//! Where things happen: [`uplinks`] picks each node's uplink among its
//! candidates (`candidates`: the default route's device, then every
//! addressed link that is no pod's), the links toward another captured node
//! first (`toward_peers`), never an address another node holds (a Vagrant
//! VM's NAT: 10.0.2.15 on every VM); [`own_segments`] makes every other NIC
//! a veth to the node's own stub, a segment per node.

use super::base::LabError;
use crate::capture::Loaded;
use crate::model::{Link, LinkKind, Namespace, VethPeer};
use ipnet::IpNet;
use std::net::IpAddr;

/// A node's uplink: its link, its first address (IPv4 first) and the
/// default route's gateway when the default route leaves through it.
type Uplink = (String, IpNet, Option<IpAddr>);

/// Every node's uplink: the first of its candidates ([`candidates`], the
/// links toward another node first: [`toward_peers`]) whose
/// address no other node has (a Vagrant-style NAT interface has the same
/// address on every node); two nodes left with one address are an error.
pub(super) fn uplinks(loaded: &[Loaded]) -> Result<Vec<Uplink>, LabError> {
    let mut all: Vec<Vec<Uplink>> = loaded.iter().map(candidates).collect::<Result<_, _>>()?;
    for (me, c) in all.iter_mut().enumerate() {
        let toward = toward_peers(loaded, me);
        c.sort_by_key(|(name, _, _)| !toward.contains(name));
    }
    let shared = |me: usize, a: &IpNet| {
        all.iter()
            .enumerate()
            .any(|(k, c)| k != me && c.iter().any(|(_, b, _)| b.addr() == a.addr()))
    };
    let mut out: Vec<Uplink> = Vec::new();
    for (me, c) in all.iter().enumerate() {
        let pick = c
            .iter()
            .find(|(_, a, _)| !shared(me, a))
            .unwrap_or(&c[0])
            .clone();
        if let Some(k) = out.iter().position(|(_, a, _)| a.addr() == pick.1.addr()) {
            return Err(LabError::Setup(format!(
                "{}: node {}'s uplink address {} is also node {}'s ({})",
                loaded[me].path.display(),
                loaded[me].capture.node.net.name,
                pick.1.addr(),
                loaded[k].capture.node.net.name,
                loaded[k].path.display()
            )));
        }
        out.push(pick);
    }
    Ok(out)
}

/// The node's NICs and veths that lead to another captured node: the
/// devices of its routes via an address another node holds, and the links
/// holding an address another node routes via (so that a node which lost
/// its routes still joins the others on the network they reach it by). A
/// VM's node network is one of them, while its default route may leave
/// through a NAT or management interface (libvirt's, VirtualBox's
/// 10.0.2.15).
fn toward_peers(loaded: &[Loaded], me: usize) -> Vec<String> {
    let nets = || loaded.iter().map(|l| &l.capture.node.net).enumerate();
    let held = |ns: &Namespace| -> Vec<IpAddr> {
        let links = ns.links.iter();
        links
            .flat_map(|k| k.addresses.iter().map(IpNet::addr))
            .collect()
    };
    let gateways = |ns: &Namespace| -> Vec<IpAddr> {
        let main = ns.routes.iter();
        main.filter(|r| r.table == cnilab_net::nl::MAIN_TABLE)
            .filter_map(|r| r.gateway)
            .collect()
    };
    let net = &loaded[me].capture.node.net;
    let own = held(net);
    let others = nets().filter(|(k, _)| *k != me);
    let others_hold: Vec<IpAddr> = others.clone().flat_map(|(_, n)| held(n)).collect();
    let others_via: Vec<IpAddr> = others.flat_map(|(_, n)| gateways(n)).collect();
    let mine = |a: &IpAddr| own.contains(a);
    let routed = net
        .routes
        .iter()
        .filter(|r| r.table == cnilab_net::nl::MAIN_TABLE)
        .filter(|r| {
            r.gateway
                .is_some_and(|g| others_hold.contains(&g) && !mine(&g))
        })
        .filter_map(|r| r.dev.clone());
    let reached = net
        .links
        .iter()
        .filter(|l| l.addresses.iter().any(|a| others_via.contains(&a.addr())))
        .map(|l| l.name.clone());
    routed
        .chain(reached)
        .filter(|d| {
            net.link(d)
                .is_some_and(|l| matches!(l.kind, LinkKind::Device | LinkKind::Veth))
        })
        .collect()
}

/// The links that may be a node's uplink, best first: the default route's
/// device, then every addressed link that is no pod's (nor their bridge).
fn candidates(l: &Loaded) -> Result<Vec<Uplink>, LabError> {
    let node = &l.capture.node;
    let pods: Vec<&str> = node.pods.iter().map(|p| p.name.as_str()).collect();
    let default = |v6: bool| {
        node.net.routes.iter().find(|r| {
            r.table == cnilab_net::nl::MAIN_TABLE
                && r.dst.prefix_len() == 0
                && r.dst.addr().is_ipv6() == v6
                && r.dev.is_some()
        })
    };
    let via_default = default(false).or_else(|| default(true));
    let is_pods = |link: &Link| {
        link.veth
            .as_ref()
            .and_then(|p| p.namespace.as_deref())
            .is_some_and(|ns| pods.contains(&ns))
    };
    let bridges_of_pods: Vec<&str> = node
        .net
        .links
        .iter()
        .filter(|l| is_pods(l))
        .filter_map(|l| l.controller.as_deref())
        .collect();
    let first = via_default.and_then(|r| r.dev.as_deref());
    let mut links: Vec<&Link> = first.and_then(|d| node.net.link(d)).into_iter().collect();
    links.extend(node.net.links.iter().filter(|link| {
        Some(link.name.as_str()) != first
            && link.kind != LinkKind::Loopback
            && !is_pods(link)
            && !bridges_of_pods.contains(&link.name.as_str())
    }));
    let out: Vec<Uplink> = links
        .into_iter()
        .filter_map(|link| {
            let mut addrs = link.addresses.clone();
            addrs.sort_by_key(|a| a.addr().is_ipv6());
            let gw = via_default
                .filter(|r| r.dev.as_deref() == Some(link.name.as_str()))
                .and_then(|r| r.gateway);
            addrs.first().map(|a| (link.name.clone(), *a, gw))
        })
        .collect();
    if out.is_empty() {
        return Err(LabError::Setup(format!(
            "{}: node {}: no uplink (no addressed link besides the pods')",
            l.path.display(),
            node.net.name
        )));
    }
    Ok(out)
}

/// Every NIC of the node but its uplink (a VM's NAT or management
/// interface, whose address every node may hold) becomes a veth to the
/// node's stub (`replay::stub_peers`): a segment of its own, with its addresses
/// and the routes through it, never joined to another node's.
pub(super) fn own_segments(net: &mut Namespace, uplink: &str) {
    let nics = net.links.iter_mut().filter(|l| l.kind == LinkKind::Device);
    for link in nics.filter(|l| l.name != uplink) {
        link.kind = LinkKind::Veth;
        link.veth = Some(VethPeer {
            namespace: None,
            name: String::new(),
        });
    }
}
