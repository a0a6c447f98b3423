//! What TOML cannot check in a topology: names, address families, sizes,
//! overlaps that are not deliberate, and what the shapes require
//! ([`super::shapes`]). Each part says which field is at fault.

use super::{shapes, Invalid, NodeSpec, Routing, Seg, Topology};
use crate::connectivity::diagnosis::overlaps;
use ipnet::IpNet;
use std::net::IpAddr;

/// An error of a top-level field.
fn top(key: &'static str, message: String) -> Invalid {
    Invalid {
        field: vec![Seg::Key(key)],
        message,
    }
}

/// An error of field `key` of node `i`.
fn of_node(i: usize, node: &NodeSpec, key: &'static str, message: String) -> Invalid {
    Invalid {
        field: vec![Seg::Key("node"), Seg::Index(i), Seg::Key(key)],
        message: format!("node[{i}] ({}): {message}", node.name),
    }
}

/// The whole topology, part by part.
pub(super) fn check(t: &Topology) -> Result<(), Invalid> {
    limits(t)?;
    let underlays = underlays(t)?;
    let seen_addrs = nodes(t, &underlays)?;
    external(t, &seen_addrs)?;
    if t.routing == Routing::Agent && t.agent.is_none() {
        return Err(top(
            "routing",
            "routing = \"agent\" needs an [agent] command".into(),
        ));
    }
    shapes::check_topology(t).map_err(|(key, message)| top(key, message))?;
    if let Some(agent) = &t.agent {
        if agent.command.is_empty() {
            return Err(Invalid {
                field: vec![Seg::Key("agent"), Seg::Key("command")],
                message: "[agent] command is empty".into(),
            });
        }
    }
    Ok(())
}

/// Counts and sizes: nodes, MTU, pods per node, probe timeout.
fn limits(t: &Topology) -> Result<(), Invalid> {
    if t.nodes.is_empty() {
        return Err(top(
            "node",
            "no [[node]]: a lab needs at least one node".into(),
        ));
    }
    if t.nodes.len() > 200 {
        return Err(top("node", format!("{} nodes: at most 200", t.nodes.len())));
    }
    if !(576..=9000).contains(&t.mtu) {
        return Err(top("mtu", format!("mtu = {}: use 576..9000", t.mtu)));
    }
    let ipv6_pods = t
        .nodes
        .iter()
        .any(|n| n.pod_cidr.iter().any(|c| c.addr().is_ipv6()));
    if ipv6_pods && t.mtu < 1280 {
        return Err(top(
            "mtu",
            format!(
                "mtu = {}: the pods have IPv6 addresses, and IPv6 needs an MTU of at least 1280",
                t.mtu
            ),
        ));
    }
    if !(1..=250).contains(&t.pods_per_node) {
        return Err(top(
            "pods_per_node",
            format!(
                "pods_per_node = {}: use 1..250 ({})",
                t.pods_per_node,
                if t.pods_per_node == 0 {
                    "a lab without pods checks nothing"
                } else {
                    "a lab node holds at most 250 pods, what a /24 pod CIDR gives; spread more pods over more nodes"
                }
            ),
        ));
    }
    if !(1..=60_000).contains(&t.probe_timeout_ms) {
        return Err(top(
            "probe_timeout_ms",
            format!(
                "probe_timeout_ms = {}: use 1..60000 (0 would fail every probe)",
                t.probe_timeout_ms
            ),
        ));
    }
    Ok(())
}

/// The underlay subnets (one per family), checked against each other and
/// the cluster CIDRs.
fn underlays(t: &Topology) -> Result<Vec<IpNet>, Invalid> {
    // The routed and nat shapes and the VXLAN overlay are built on an
    // IPv4 underlay (a /24 per node, 10.0.2.15, IPv4 VTEPs).
    if t.underlay.addr().is_ipv6() && (t.shape != shapes::Shape::L2 || t.routing == Routing::Vxlan)
    {
        return Err(top(
            "underlay",
            format!(
                "underlay = {}: shape = \"{}\" and routing = \"vxlan\" need an IPv4 underlay (add underlay6 for IPv6 next to it)",
                t.underlay,
                format!("{:?}", t.shape).to_lowercase()
            ),
        ));
    }
    if t.underlay.addr().is_ipv4() && t.underlay.prefix_len() > 30
        || t.underlay.addr().is_ipv6() && t.underlay.prefix_len() > 126
    {
        return Err(top(
            "underlay",
            format!(
                "underlay = {}: use a subnet of at least 4 addresses (/30 or larger for IPv4, /126 for IPv6)",
                t.underlay
            ),
        ));
    }
    if let Some(u6) = &t.underlay6 {
        if !u6.addr().is_ipv6() || u6.prefix_len() > 126 || t.underlay.addr().is_ipv6() {
            return Err(top(
                "underlay6",
                format!(
                    "underlay6 = {u6}: a second underlay must be an IPv6 subnet (/126 or larger) next to an IPv4 `underlay`"
                ),
            ));
        }
    }
    let underlays: Vec<IpNet> = std::iter::once(t.underlay).chain(t.underlay6).collect();
    for c in &t.cluster_cidr {
        if let Some(u) = underlays.iter().find(|u| overlaps(c, u)) {
            return Err(top(
                "cluster_cidr",
                format!("cluster_cidr {c} overlaps the underlay {u}"),
            ));
        }
    }
    Ok(underlays)
}

/// The underlay's network and broadcast addresses belong to no host.
fn reserved(t: &Topology) -> [IpAddr; 2] {
    [t.underlay.network(), t.underlay.broadcast()]
}

/// Every node; returns the underlay addresses they take.
fn nodes(t: &Topology, underlays: &[IpNet]) -> Result<Vec<IpAddr>, Invalid> {
    let mut seen_names = Vec::new();
    let mut seen_addrs = Vec::new();
    for (i, node) in t.nodes.iter().enumerate() {
        let bad = |key: &'static str, message: String| of_node(i, node, key, message);
        names_and_addresses(t, node, &bad, &mut seen_names, &mut seen_addrs)?;
        cidrs_and_settings(node, underlays, &bad)?;
    }
    Ok(seen_addrs)
}

/// A node's name and underlay addresses (each used once).
fn names_and_addresses(
    t: &Topology,
    node: &NodeSpec,
    bad: &dyn Fn(&'static str, String) -> Invalid,
    seen_names: &mut Vec<String>,
    seen_addrs: &mut Vec<IpAddr>,
) -> Result<(), Invalid> {
    let reserved = reserved(t);
    let ok_name = !node.name.is_empty()
        && node.name.len() <= 10
        && node
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !ok_name {
        return Err(bad(
            "name",
            "name must be 1-10 characters of [A-Za-z0-9-] (it names namespaces and links)".into(),
        ));
    }
    if seen_names.contains(&node.name) {
        return Err(bad("name", "duplicate node name".into()));
    }
    seen_names.push(node.name.clone());
    if let Err(message) = shapes::check_node_address(t, node.address) {
        return Err(bad("address", message));
    }
    if !t.underlay.contains(&node.address) {
        return Err(bad(
            "address",
            format!(
                "address {} is not an address in underlay {}",
                node.address, t.underlay
            ),
        ));
    }
    match (&t.underlay6, node.address6) {
        (Some(u6), Some(a6)) if !u6.contains(&a6) || a6 == u6.network() => {
            return Err(bad(
                "address6",
                format!("address6 {a6} is not a host address in underlay6 {u6}"),
            ))
        }
        (Some(u6), None) => {
            return Err(bad(
                "address",
                format!("underlay6 {u6} is set: give this node an address6 in it"),
            ))
        }
        (None, Some(a6)) => {
            return Err(bad(
                "address6",
                format!("address6 {a6} needs an `underlay6` subnet"),
            ))
        }
        _ => {}
    }
    if let Some(a6) = node.address6 {
        if seen_addrs.contains(&a6) {
            return Err(bad("address6", format!("address {a6} is used twice")));
        }
        seen_addrs.push(a6);
    }
    if reserved.contains(&node.address) {
        return Err(bad(
            "address",
            format!(
                "address {} is the network or broadcast address of underlay {}",
                node.address, t.underlay
            ),
        ));
    }
    if seen_addrs.contains(&node.address) {
        return Err(bad(
            "address",
            format!("address {} is used twice", node.address),
        ));
    }
    seen_addrs.push(node.address);
    Ok(())
}

/// A node's pod CIDRs, MTU and sysctls.
fn cidrs_and_settings(
    node: &NodeSpec,
    underlays: &[IpNet],
    bad: &dyn Fn(&'static str, String) -> Invalid,
) -> Result<(), Invalid> {
    let underlay_of = |v6: bool| underlays.iter().find(|u| u.addr().is_ipv6() == v6);
    if node.pod_cidr.is_empty() {
        return Err(bad(
            "pod_cidr",
            "pod_cidr is empty; give one CIDR per family".into(),
        ));
    }
    if node.pod_cidr.iter().filter(|c| c.addr().is_ipv4()).count() > 1
        || node.pod_cidr.iter().filter(|c| c.addr().is_ipv6()).count() > 1
    {
        return Err(bad(
            "pod_cidr",
            "pod_cidr has two CIDRs of one family".into(),
        ));
    }
    for c in &node.pod_cidr {
        if c.addr().is_ipv4() && c.prefix_len() > 29 || c.addr().is_ipv6() && c.prefix_len() > 120 {
            return Err(bad(
                "pod_cidr",
                format!("pod_cidr {c} is too small for pods"),
            ));
        }
        if let Some(u) = underlays.iter().find(|u| overlaps(c, u)) {
            return Err(bad(
                "pod_cidr",
                format!("pod_cidr {c} overlaps the underlay {u}: pods would take node addresses"),
            ));
        }
        if underlay_of(c.addr().is_ipv6()).is_none() {
            let fam = crate::connectivity::probe::family(&c.addr());
            return Err(bad(
                "pod_cidr",
                format!(
                    "pod_cidr {c} is {fam} but the underlay has no {fam} subnet: nodes could not route it (add `underlay6` and `address6` for a dual-stack underlay)"
                ),
            ));
        }
    }
    if let Some(mtu) = node.mtu {
        if !(576..=9000).contains(&mtu) {
            return Err(bad("mtu", format!("mtu = {mtu}: use 576..9000")));
        }
    }
    for key in node.sysctls.keys() {
        if !key.starts_with("net/") || key.contains("..") {
            return Err(bad(
                "sysctls",
                format!("sysctl {key:?} must be a net/... key"),
            ));
        }
    }
    Ok(())
}

/// The external host: a free address in each underlay it is on.
fn external(t: &Topology, seen_addrs: &[IpAddr]) -> Result<(), Invalid> {
    let reserved = reserved(t);
    if let Some(ext) = &t.external {
        if ext.gateway && t.shape != shapes::Shape::L2 {
            return Err(Invalid {
                field: vec![Seg::Key("external"), Seg::Key("gateway")],
                message: format!(
                    "external gateway = true needs shape = \"l2\" (shape \"{}\" gives the nodes their default route: via the router, or the NAT box); remove gateway",
                    format!("{:?}", t.shape).to_lowercase()
                ),
            });
        }
        let bad6 = match (ext.address6, &t.underlay6) {
            (Some(a6), Some(u6)) => !u6.contains(&a6) || seen_addrs.contains(&a6),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if bad6 {
            return Err(Invalid {
                field: vec![Seg::Key("external"), Seg::Key("address6")],
                message: format!(
                    "external address6 {} must be a free host address in underlay6 ({})",
                    ext.address6.map(|a| a.to_string()).unwrap_or_default(),
                    t.underlay6
                        .map(|u| u.to_string())
                        .unwrap_or_else(|| "not set".into())
                ),
            });
        }
        if !t.underlay.contains(&ext.address)
            || seen_addrs.contains(&ext.address)
            || reserved.contains(&ext.address)
        {
            return Err(Invalid {
                field: vec![Seg::Key("external"), Seg::Key("address")],
                message: format!(
                    "external address {} must be a free host address in underlay {}",
                    ext.address, t.underlay
                ),
            });
        }
    }
    Ok(())
}
