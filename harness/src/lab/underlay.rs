//! Underlay shapes (`shape = "l2" | "routed" | "nat"` in a topology):
//!
//! - `l2`: one switch (a bridge in the switch namespace) for every node.
//! - `routed`: every /24 of the underlay is its own subnet (a bridge
//!   `rack<N>` in the switch namespace) and a router namespace joins them;
//!   the router has the first address of each /24. Nodes have a default
//!   route via their subnet's router. `routing = "static"` then puts the
//!   pod CIDR routes into the router (a cloud route table); host-gw routes
//!   between nodes (`podCIDR via nodeIP`) are refused by the kernel, as
//!   flannel's host-gw backend finds on an L3 underlay.
//! - `nat`: every node also has a VirtualBox-style NAT interface `eth1`
//!   with the same address 10.0.2.15 on every node and its default route
//!   via 10.0.2.2, a NAT namespace of its own (`<node>-nat`); the underlay
//!   is the host-only network. The classic Vagrant bug (every node's
//!   InternalIP is 10.0.2.15) is injected by the `nat-internal-ip` fault.
//!
//! Everything lives in lab namespaces; nothing is added to the host.

use super::base::{make_ns, netlink, setup, LabError};
use super::built::Lab;
use super::facts::NodeFacts;
use super::routes::install_static_routes;
use super::topology::shapes::{subnet_of, Shape};
use super::topology::{Routing, Topology};
use crate::connectivity::Diagnosis;
use crate::connectivity::ProbeOutcome;
use crate::netns::Netns;
use cnilab_net::{netns as plugin_netns, nl};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr};

/// The address VirtualBox gives every VM's NAT interface.
pub const NAT_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// VirtualBox's NAT gateway.
pub const NAT_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// VirtualBox's NAT engine in a node's NAT namespace.
pub(crate) const NAT_RULESET: &str = "table ip vbox_nat {\n  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n    ip saddr 10.0.2.0/24 masquerade\n  }\n}\n";
/// The node's NAT interface.
pub const NAT_LINK: &str = "eth1";
/// The router namespace's role name.
pub const ROUTER_ROLE: &str = "router";

/// The name of the bridge of `addr`'s subnet in the switch namespace.
pub(crate) fn rack_name(topo: &Topology, addr: IpAddr) -> String {
    let (IpAddr::V4(a), IpAddr::V4(base)) = (addr, topo.underlay.network()) else {
        return "underlay".into();
    };
    let n = (u32::from(a).wrapping_sub(u32::from(base))) >> 8;
    format!("rack{n}")
}

/// Runs `program -batch -` in `ns` with `script` on its stdin (iproute2's
/// `ip` or `bridge`: netlink requests, one per line).
pub fn batch(ns: &Netns, program: &str, script: &str) -> Result<(), LabError> {
    batch_with(ns, program, &["-batch", "-"], script)
}

/// [`batch`] that goes on after a failed line (`-force`).
pub fn batch_force(ns: &Netns, program: &str, script: &str) -> Result<(), LabError> {
    batch_with(ns, program, &["-force", "-batch", "-"], script)
}

/// Through the one command runner (`cnilab_net::nft::run`, any program):
/// a deadline, and no child left when this process dies.
fn batch_with(ns: &Netns, program: &str, args: &[&str], script: &str) -> Result<(), LabError> {
    use cnilab_net::nft::NftError;
    let path = std::path::Path::new(program);
    match cnilab_net::nft::run(path, Some(ns.file()), args, Some(script)) {
        Ok(_) => Ok(()),
        Err(NftError::Spawn { source, .. }) => Err(setup(format!(
            "{program} in {}: {source} (is iproute2 installed?)",
            ns.name()
        ))),
        Err(NftError::Failed { stderr, .. }) => Err(setup(format!(
            "{program} in {}: {stderr}\n{script}",
            ns.name()
        ))),
        Err(other) => Err(setup(format!("{program} in {}: {other}", ns.name()))),
    }
}

fn router_index(lab: &Lab) -> Option<usize> {
    lab.extra
        .iter()
        .position(|ns| ns.name().ends_with(&format!("-{ROUTER_ROLE}")))
}

/// The router namespace of a routed lab, made on first use.
fn router(lab: &mut Lab) -> Result<&Netns, LabError> {
    let i = match router_index(lab) {
        Some(i) => i,
        None => {
            let ns = make_ns(&lab.opts, ROUTER_ROLE)?;
            plugin_netns::write_sysctl(Some(ns.file()), "net/ipv4/ip_forward", "1")
                .map_err(|e| setup(format!("router ip_forward: {e}")))?;
            ns.set_lo_up()?;
            lab.extra.push(ns);
            lab.extra.len() - 1
        }
    };
    Ok(&lab.extra[i])
}

/// The NAT namespace's role name for a node.
pub fn nat_role(node: &str) -> String {
    format!("{node}-nat")
}

/// `routing = "static"` on a routed underlay: the pod CIDR routes live in
/// the router (a cloud route table), nodes reach them by their default route.
pub fn install_router_routes(lab: &mut Lab) -> Result<(), LabError> {
    let specs = lab.topo.nodes.clone();
    // The router is no node: every node's pod CIDR is routed via its address.
    let me = super::topology::NodeSpec {
        name: ROUTER_ROLE.into(),
        address: IpAddr::from([0, 0, 0, 0]),
        address6: None,
        pod_cidr: Vec::new(),
        mtu: None,
        sysctls: Default::default(),
    };
    install_static_routes(router(lab)?, &me, &specs)
}

/// Removes the router's pod CIDR routes (the `host-gw` fault).
pub fn delete_router_routes(lab: &mut Lab) -> Result<(), LabError> {
    let cidrs: Vec<IpNet> = lab
        .topo
        .nodes
        .iter()
        .flat_map(|n| n.pod_cidr.iter().map(|c| c.trunc()))
        .collect();
    let router = router(lab)?;
    netlink(router, "router pod routes", |h| async move {
        for c in cidrs {
            nl::delete_routes(&h, c).await?;
        }
        Ok(())
    })
}

/// Whether the lab uses the routed shape with router routes (static).
pub fn routes_in_router(topo: &Topology) -> bool {
    topo.shape == Shape::Routed && topo.routing == Routing::Static
}

/// Diagnoses of the shapes: host-gw routes across an L3 boundary, and
/// nodes whose InternalIP is the NAT address.
pub fn diagnose(lab: &Lab, facts: &[NodeFacts], o: &ProbeOutcome, out: &mut Vec<Diagnosis>) {
    let spec = &o.spec;
    let (Some(a), Some(b)) = (
        spec.from.node.and_then(|i| facts.get(i)),
        spec.to.node.and_then(|i| facts.get(i)),
    ) else {
        return;
    };
    if a.name == b.name {
        return;
    }
    if lab.topo.shape == Shape::Routed {
        host_gw_across_l3(lab, a, b, out);
        host_gw_across_l3(lab, b, a, out);
    }
    if lab.topo.shape == Shape::Nat {
        nat_internal_ip(lab, out);
    }
}

/// `from` has no route of its own to `to`'s pods and `to` is in another
/// subnet: host-gw cannot route via it, and the router does not either.
fn host_gw_across_l3(lab: &Lab, from: &NodeFacts, to: &NodeFacts, out: &mut Vec<Diagnosis>) {
    let (Some(from_addr), Some(to_addr)) = (from.address, to.address) else {
        return;
    };
    // Evidence from the node's own table: no connected route reaches the
    // peer, so the kernel refuses a route via it (ENETUNREACH).
    let connected = from
        .routes
        .iter()
        .any(|r| r.gateway.is_none() && r.dst.prefix_len() > 0 && r.dst.contains(&to_addr));
    if connected || subnet_of(from_addr) == subnet_of(to_addr) {
        return;
    }
    let Some(cidr) = to.pod_cidr.iter().find(|c| c.addr().is_ipv4()) else {
        return;
    };
    let own = from
        .routes
        .iter()
        .any(|r| r.table == 254 && r.dst.prefix_len() > 0 && r.dst.contains(&cidr.addr()));
    if own {
        return;
    }
    let router_routes = router_index(lab)
        .and_then(|i| lab.extra[i].routes().ok())
        .unwrap_or_default();
    let router_has = router_routes
        .iter()
        .any(|r| r.dst.prefix_len() > 0 && r.dst.contains(&cidr.addr()));
    if router_has {
        return;
    }
    out.push(Diagnosis {
        id: "host-gw-across-l3",
        message: format!(
            "{} ({from_addr}) and {} ({to_addr}) are in different subnets ({} and {}) joined by a router: a host-gw route \"{} via {to_addr}\" is refused by the kernel (Network is unreachable, the next hop is not on a connected subnet) and the router has no route to {} either; host-gw needs every node on one L2 segment (flannel: use the vxlan backend, or routes in the router)",
            from.name,
            to.name,
            subnet_of(from_addr).map(|s| s.to_string()).unwrap_or_default(),
            subnet_of(to_addr).map(|s| s.to_string()).unwrap_or_default(),
            cidr.trunc(),
            cidr.trunc(),
        ),
    });
}

/// The node list the lab published (agent routing) names the NAT address.
fn nat_internal_ip(lab: &Lab, out: &mut Vec<Diagnosis>) {
    let Ok(text) = std::fs::read_to_string(lab.nodes_file_path()) else {
        return;
    };
    let Ok(list) = serde_json::from_str::<Vec<serde_json::Value>>(&text) else {
        return;
    };
    let nat = NAT_ADDRESS.to_string();
    let named: Vec<String> = list
        .iter()
        .filter(|n| {
            let ip = &n["internalIP"];
            ip.as_str() == Some(nat.as_str())
                || ip
                    .as_array()
                    .is_some_and(|all| all.iter().any(|a| a.as_str() == Some(nat.as_str())))
        })
        .filter_map(|n| n["name"].as_str().map(str::to_string))
        .collect();
    if named.is_empty() {
        return;
    }
    let warning = lab
        .nodes
        .iter()
        .filter_map(|n| {
            std::fs::read_to_string(lab.opts.run_dir.join(&n.spec.name).join("agent.log")).ok()
        })
        .flat_map(|log| {
            log.lines()
                .filter(|l| l.contains(&nat) && l.contains("WARN"))
                .map(log_message)
                .collect::<Vec<_>>()
        })
        .last();
    out.push(Diagnosis {
        id: "nat-internal-ip",
        message: format!(
            "InternalIP of {} is {nat}, the VirtualBox NAT address every node has on {NAT_LINK} (the Vagrant bug): no route to another node's pods can use it; pin kubelet --node-ip to the host-only address{}",
            named.join(", "),
            warning
                .map(|w| format!(" (agent: {})", w.trim()))
                .unwrap_or_default()
        ),
    });
}

/// The message of an agent log line, without colours, time and level.
fn log_message(line: &str) -> String {
    let mut plain = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An ANSI colour sequence: ESC [ … m.
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    let rest = plain.split_once("WARN").map_or(plain.as_str(), |(_, r)| r);
    rest.split_once(": ")
        .map_or(rest, |(_, m)| m)
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::topology::shapes::{check_node_address, router_address};

    #[test]
    fn agent_log_lines_lose_colours_time_and_level() {
        let line = "\u{1b}[2m2026-11-22T20:04:23Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m \u{1b}[2mcnilab_agent::reconcile\u{1b}[0m\u{1b}[2m:\u{1b}[0m InternalIP 10.0.2.15 is claimed by several nodes";
        assert_eq!(
            log_message(line),
            "InternalIP 10.0.2.15 is claimed by several nodes"
        );
    }

    #[test]
    fn routed_subnets_and_router_addresses() {
        let a: IpAddr = "10.250.2.10".parse().expect("ip");
        assert_eq!(
            subnet_of(a).map(|s| s.to_string()).as_deref(),
            Some("10.250.2.0/24")
        );
        assert_eq!(router_address(a), Some("10.250.2.1".parse().expect("ip")));
        let mut topo = Topology::generated(2, 1).expect("topology");
        topo.shape = Shape::Routed;
        topo.underlay = "10.250.0.0/16".parse().expect("net");
        assert_eq!(rack_name(&topo, a), "rack2");
        assert!(check_node_address(&topo, "10.250.2.1".parse().expect("ip")).is_err());
        assert!(check_node_address(&topo, a).is_ok());
    }
}
