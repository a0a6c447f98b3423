//! The node rules: causes read from the nodes' own facts (routes,
//! sysctls, rulesets, neighbours, uplink MTU, pod addresses), for any set
//! of nodes: a namespace lab's (`lab/diagnose.rs` adds its shapes' rules)
//! or the VMs of `e2e vagrant`. Missing or stale routes, forwarding off,
//! FORWARD policy DROP, MTU mismatch, masquerade missing or too broad,
//! overlapping pod CIDRs, one address on two pods, stale ARP entries.

use super::{Diagnosis, ExpectSource, ProbeOutcome, ProbeSpec, Proto};
use crate::netns::Route;
use ipnet::IpNet;
use std::net::IpAddr;

/// What the diagnosis reads from a node.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    pub name: String,
    pub address: Option<IpAddr>,
    /// Its IPv6 underlay address (a dual-stack or IPv6 underlay).
    pub address6: Option<IpAddr>,
    /// Every address on the node's interfaces (its second addresses too).
    pub addresses: Vec<IpAddr>,
    pub pod_cidr: Vec<IpNet>,
    pub routes: Vec<Route>,
    pub ip_forward: String,
    pub rp_filter: String,
    pub uplink_mtu: Option<u32>,
    /// MAC of the node's underlay interface.
    pub uplink_mac: Option<String>,
    /// The node's ARP entries on its underlay interface.
    pub uplink_neighbours: Vec<crate::netns::Neighbour>,
    pub ruleset: String,
    /// MTU and MAC of the node's VXLAN device, and its FDB (`lab/vxlan.rs`).
    pub vxlan_mtu: Option<u32>,
    pub vxlan_mac: Option<String>,
    pub vxlan_fdb: Vec<(String, IpAddr)>,
}

/// The route the node would use for `dst` (longest prefix, main table).
fn lookup(routes: &[Route], dst: IpAddr) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| r.table == 254 && r.dst.contains(&dst))
        .max_by_key(|r| r.dst.prefix_len())
}

/// Every line of an `nft list ruleset` with the table and chain it is in:
/// `(table, chain, line)` (chain headers and policies included).
fn rules_in_place(ruleset: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut table = String::new();
    let mut chain = String::new();
    for line in ruleset.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("table ") {
            table = rest.trim_end_matches(" {").to_string();
        } else if let Some(rest) = t.strip_prefix("chain ") {
            chain = rest.trim_end_matches(" {").to_string();
        } else if !t.is_empty() && t != "}" {
            out.push((table.clone(), chain.clone(), t.to_string()));
        }
    }
    out
}

/// The forward-hook chains with policy drop that accept nothing: no rule
/// of theirs, nor of a chain they jump or go to (in the same table, at any
/// depth), accepts other than by conntrack state. An accept chain such as
/// flannel's `FLANNEL-FWD` (iptables-nft) clears its FORWARD chain. A
/// bridge-family chain is none of them: its forward hook is the bridge's
/// own, which routed traffic and `bridge-nf-call-iptables` never reach.
pub fn chains_with_drop_policy(ruleset: &str) -> Vec<String> {
    let lines = rules_in_place(ruleset);
    let accepts = |table: &str, start: &str| {
        let mut seen: Vec<String> = vec![start.to_string()];
        let mut k = 0;
        while k < seen.len() {
            let here = seen[k].clone();
            k += 1;
            for (_, _, t) in lines.iter().filter(|(tb, c, _)| tb == table && *c == here) {
                if t.ends_with("accept") && !t.contains("ct state") {
                    return true;
                }
                let target = t
                    .split_once("jump ")
                    .or_else(|| t.split_once("goto "))
                    .map(|(_, c)| c.trim().to_string());
                if let Some(c) = target.filter(|c| !seen.contains(c)) {
                    seen.push(c);
                }
            }
        }
        false
    };
    lines
        .iter()
        .filter(|(table, _, t)| {
            !table.starts_with("bridge ") && t.contains("hook forward") && t.contains("policy drop")
        })
        .filter(|(table, chain, _)| !accepts(table, chain))
        .map(|(table, chain, t)| format!("table {table} chain {chain}: {t}"))
        .collect()
}

fn masquerade_lines(ruleset: &str) -> Vec<String> {
    ruleset
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("masquerade") || l.contains("snat"))
        .map(str::to_string)
        .collect()
}

/// The SNAT rules that also take pod-to-pod traffic: a masquerade or snat
/// rule that excludes no destination (`daddr != …`), each as `table T
/// chain C: rule`. A rule that excludes the cluster CIDR is correct and
/// not named.
fn masquerade_without_exclusion(ruleset: &str) -> Vec<String> {
    rules_in_place(ruleset)
        .into_iter()
        .filter(|(_, _, t)| {
            (t.contains("masquerade") || t.contains("snat")) && !t.contains("daddr !=")
        })
        .map(|(table, chain, t)| format!("table {table} chain {chain}: {t}"))
        .collect()
}

/// Neither a default route (a routed underlay's router) nor an overlay
/// route via the owner's VTEP address (inside its pod CIDR) is stale.
fn overlay_or_default(r: &Route, cidr: &IpNet) -> bool {
    r.dst.prefix_len() == 0 || r.gateway.is_some_and(|g| cidr.contains(&g))
}

/// Route check: `node` must reach `dst` (a pod on `owner`) via `owner`'s
/// address. A next hop that is any address of `owner` (its second
/// address) is not stale, nor one of another lab node (a detour, reported
/// as a warning), nor an overlay or default route ([`overlay_or_default`]).
fn check_route(
    out: &mut Vec<Diagnosis>,
    node: &NodeFacts,
    dst: IpAddr,
    owner: &NodeFacts,
    direction: &str,
    all: &[NodeFacts],
    default_ok: bool,
) {
    let a_node_address =
        |gw: Option<IpAddr>| gw.is_some_and(|g| all.iter().any(|f| f.addresses.contains(&g)));
    let Some(cidr) = owner.pod_cidr.iter().find(|c| c.contains(&dst)) else {
        return;
    };
    // A default route carries pod traffic only where a router holds the
    // pod routes (a routed underlay); elsewhere it leads out of the cluster.
    let found = lookup(&node.routes, dst).filter(|r| default_ok || r.dst.prefix_len() > 0);
    // The next hop is the owner's underlay address of the pod's family.
    let via = match (dst.is_ipv6(), owner.address6) {
        (true, Some(v6)) => Some(v6),
        _ => owner.address,
    };
    match found {
        None => out.push(Diagnosis {
            id: "missing-route",
            message: format!(
                "{} has no route to {cidr} ({}'s podCIDR) for the {direction} path; expected \"{} via {}\"",
                node.name,
                owner.name,
                cidr.trunc(),
                via.map(|a| a.to_string()).unwrap_or_default()
            ),
        }),
        Some(r)
            if r.gateway.is_some()
                && r.gateway != via
                && !a_node_address(r.gateway)
                && !overlay_or_default(r, cidr) =>
        {
            out.push(Diagnosis {
            id: "stale-route",
            message: format!(
                "{} routes {} via {} but {} is {}: a stale route (podCIDR reused, or the node's address changed)",
                node.name,
                r.dst,
                r.gateway.map(|g| g.to_string()).unwrap_or_default(),
                owner.name,
                via.map(|a| a.to_string()).unwrap_or_default()
            ),
        })
        }
        Some(_) => {}
    }
}

fn stale_neighbour(out: &mut Vec<Diagnosis>, from: &NodeFacts, to: &NodeFacts) {
    let (Some(addr), Some(mac)) = (to.address, to.uplink_mac.as_deref()) else {
        return;
    };
    let stale = from
        .uplink_neighbours
        .iter()
        .filter(|n| n.addr == addr)
        .find_map(|n| n.mac.as_deref().filter(|m| *m != mac));
    if let Some(old) = stale {
        out.push(Diagnosis {
            id: "stale-neighbour",
            message: format!(
                "{} maps {}'s address {addr} to MAC {old}, but {}'s uplink has MAC {mac}: a stale ARP entry (a re-created node whose gratuitous ARP was lost); `ip neigh flush to {addr} nud all` on {}",
                from.name, to.name, to.name, from.name
            ),
        });
    }
}

fn node_of(facts: &[NodeFacts], i: Option<usize>) -> Option<&NodeFacts> {
    facts.get(i?)
}

/// What the node rules need to know of the network besides each node's
/// facts (a namespace lab's topology, or the VMs of `e2e vagrant`).
pub struct Network<'a> {
    /// A router holds the pod routes: a default route may carry pod traffic.
    pub routes_in_router: bool,
    /// The pods' MTU.
    pub mtu: u32,
    pub cluster_cidr: &'a [IpNet],
    /// Every pod (`node/pod`) with its addresses.
    pub pods: Vec<(String, Vec<IpAddr>)>,
}

/// The rules that read only the nodes' facts (routes, sysctls, rulesets,
/// neighbours, uplink MTU): for any set of nodes, not only a lab's.
pub fn diagnose_nodes(network: &Network, facts: &[NodeFacts], o: &ProbeOutcome) -> Vec<Diagnosis> {
    let mut out = Vec::new();
    let spec = &o.spec;
    let src = node_of(facts, spec.from.node);
    let dst = node_of(facts, spec.to.node);

    // A node that maps a peer node's address to a MAC the peer does not
    // have: a stale ARP entry (a re-created node whose gratuitous ARP was
    // lost), so packets to that peer go to a MAC nobody has.
    if let (Some(a), Some(b)) = (src, dst) {
        if a.name != b.name {
            for (from, to) in [(a, b), (b, a)] {
                stale_neighbour(&mut out, from, to);
            }
        }
    }

    address_rules(&mut out, network, facts, spec);
    forwarding_rules(&mut out, network, facts, spec, (src, dst));
    // rp_filter: see diagnose_path (the interface the packet enters).
    if spec.proto == Proto::Df {
        for n in [src, dst].into_iter().flatten() {
            if let Some(mtu) = n.uplink_mtu {
                if mtu < network.mtu {
                    out.push(Diagnosis {
                        id: "mtu-mismatch",
                        message: format!(
                            "pods use MTU {} but {}'s uplink eth0 has MTU {mtu}: full-size packets with DF set are dropped (small pings still work)",
                            network.mtu, n.name
                        ),
                    });
                }
            }
        }
    }
    masquerade_rules(&mut out, network, o, (src, dst));
    out
}

/// Two nodes' overlapping pod CIDRs, or one address on two pods.
fn address_rules(
    out: &mut Vec<Diagnosis>,
    network: &Network,
    facts: &[NodeFacts],
    spec: &ProbeSpec,
) {
    // Overlapping pod CIDRs: two nodes claim the same addresses.
    let cidrs: Vec<(&str, &[IpNet])> = facts
        .iter()
        .map(|f| (f.name.as_str(), f.pod_cidr.as_slice()))
        .collect();
    for (a, ca, b, cb) in super::diagnosis::overlapping_cidrs(&cidrs) {
        let involved = [spec.from.ip, spec.to.ip]
            .iter()
            .any(|ip| ca.contains(ip) || cb.contains(ip));
        if involved {
            out.push(Diagnosis {
                id: "podcidr-overlap",
                message: format!("{a} has podCIDR {ca} and {b} has {cb}: they overlap, so one node's pods are unreachable from the other"),
            });
        }
    }

    // The same address on two pods (overlapping ranges, or a broken IPAM).
    let holders: Vec<String> = network
        .pods
        .iter()
        .filter(|(_, ips)| ips.contains(&spec.to.ip))
        .map(|(name, _)| name.clone())
        .collect();
    if holders.len() > 1 {
        out.push(Diagnosis {
            id: "duplicate-address",
            message: format!(
                "{} is assigned to {} pods: {}",
                spec.to.ip,
                holders.len(),
                holders.join(", ")
            ),
        });
    }
}

/// The routes between the two nodes, forwarding and FORWARD policies on
/// the nodes that route the probe.
fn forwarding_rules(
    out: &mut Vec<Diagnosis>,
    network: &Network,
    facts: &[NodeFacts],
    spec: &ProbeSpec,
    (src, dst): (Option<&NodeFacts>, Option<&NodeFacts>),
) {
    let src_is_pod = spec.from.pod.is_some();
    let dst_is_pod = spec.to.pod.is_some();
    let default_ok = network.routes_in_router;
    if let (Some(a), Some(b)) = (src, dst) {
        if a.name != b.name {
            if dst_is_pod {
                check_route(out, a, spec.to.ip, b, "forward", facts, default_ok);
            }
            if src_is_pod {
                check_route(out, b, spec.from.ip, a, "return", facts, default_ok);
            }
        }
    }
    let mut forwarding_nodes: Vec<&NodeFacts> = Vec::new();
    if let Some(a) = src.filter(|_| src_is_pod) {
        if spec.to.external || dst.is_some_and(|b| b.name != a.name) {
            forwarding_nodes.push(a);
        }
    }
    if let Some(b) = dst.filter(|_| dst_is_pod) {
        if spec.from.external || src.is_some_and(|a| a.name != b.name) {
            forwarding_nodes.push(b);
        }
    }
    for n in &forwarding_nodes {
        if n.ip_forward != "1" {
            out.push(Diagnosis {
                id: "ip-forward-off",
                message: format!(
                    "net.ipv4.ip_forward = {} on {}: the node does not route pod traffic",
                    n.ip_forward, n.name
                ),
            });
        }
        for chain in chains_with_drop_policy(&n.ruleset) {
            out.push(Diagnosis {
                id: "forward-drop",
                message: format!("{} has a FORWARD chain with policy drop and no accept for the pod CIDRs ({chain})", n.name),
            });
        }
    }
}

/// Masquerade missing towards the external host, or applied to pod-to-pod
/// traffic.
fn masquerade_rules(
    out: &mut Vec<Diagnosis>,
    network: &Network,
    o: &ProbeOutcome,
    (src, dst): (Option<&NodeFacts>, Option<&NodeFacts>),
) {
    let spec = &o.spec;
    if spec.to.external {
        if let Some(a) = src {
            let masq = masquerade_lines(&a.ruleset);
            let seen_pod = matches!((spec.expect_source, o.seen_source), (Some(ExpectSource::Masqueraded(_)), Some(seen)) if seen == spec.from.ip);
            if masq.is_empty() || seen_pod {
                out.push(Diagnosis {
                    id: "masquerade-missing",
                    message: format!(
                        "traffic from {}'s pods to the external host {} is not masqueraded on {}: {}",
                        a.name,
                        spec.to.ip,
                        a.name,
                        if masq.is_empty() {
                            "no masquerade rule in its ruleset".to_string()
                        } else {
                            format!(
                                "the external host saw the pod address; rules: {}",
                                masq.join(" | ")
                            )
                        }
                    ),
                });
            }
        }
    }
    if let (Some(ExpectSource::Unchanged(want)), Some(seen)) = (spec.expect_source, o.seen_source) {
        // Another pod's own address is no masquerade: the probe left from
        // (or its answer went to) the wrong pod.
        let a_pods = network.pods.iter().any(|(_, ips)| ips.contains(&seen));
        if seen != want && !a_pods {
            // One line per cause: the node and its rules at fault, not the
            // probe (each probe's addresses are in its failure).
            let cluster: Vec<String> = network.cluster_cidr.iter().map(|c| c.to_string()).collect();
            // The source's node, unless only the peer's node has a rule
            // that rewrites pod traffic (a masquerade on the way in).
            let at_fault = [src, dst]
                .into_iter()
                .flatten()
                .find(|n| !masquerade_without_exclusion(&n.ruleset).is_empty());
            let (node, rules) = match at_fault.or(src) {
                Some(a) => {
                    let faulty = masquerade_without_exclusion(&a.ruleset);
                    let rules = if faulty.is_empty() {
                        format!(
                            "its SNAT rules: {}",
                            masquerade_lines(&a.ruleset).join(" | ")
                        )
                    } else {
                        format!("{} does not exclude it", faulty.join("; "))
                    };
                    (a.name.clone(), rules)
                }
                None => (
                    spec.from.name.clone(),
                    "its SNAT rules are unknown".to_string(),
                ),
            };
            out.push(Diagnosis {
                id: "masquerade-too-broad",
                message: format!(
                    "{node} masquerades pod-to-pod traffic (peers see {seen} instead of the pod's address): masquerade must exclude the cluster CIDR {}; {rules}",
                    cluster.join(", ")
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_forward_chains_with_drop_policy() {
        let ruleset = "table ip filter {\n\tchain FORWARD {\n\t\ttype filter hook forward priority filter; policy drop;\n\t}\n}\ntable inet x {\n\tchain f {\n\t\ttype filter hook forward priority 0; policy accept;\n\t}\n}\n";
        let found = chains_with_drop_policy(ruleset);
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("table ip filter chain FORWARD"));
    }

    #[test]
    fn a_bridge_family_forward_chain_is_no_forward_chain() {
        let ruleset = "table bridge f {\n\tchain forward {\n\t\ttype filter hook forward priority filter; policy drop;\n\t}\n}\n";
        assert_eq!(chains_with_drop_policy(ruleset), Vec::<String>::new());
        let inet = ruleset.replace("table bridge f", "table inet f");
        assert_eq!(chains_with_drop_policy(&inet).len(), 1);
    }

    #[test]
    fn a_drop_policy_cleared_by_a_jump_to_an_accept_chain_is_not_named() {
        let ruleset = "table ip filter {\n\tchain FORWARD {\n\t\ttype filter hook forward priority filter; policy drop;\n\t\tct state established accept\n\t\tcounter packets 0 bytes 0 jump FLANNEL-FWD\n\t}\n\tchain FLANNEL-FWD {\n\t\tip saddr 10.244.0.0/16 counter packets 0 bytes 0 accept\n\t}\n}\n";
        assert_eq!(chains_with_drop_policy(ruleset), Vec::<String>::new());
        let emptied = ruleset.replace(
            "ip saddr 10.244.0.0/16 counter packets 0 bytes 0 accept",
            "",
        );
        assert_eq!(chains_with_drop_policy(&emptied).len(), 1, "{emptied}");
    }

    #[test]
    fn longest_prefix_wins() {
        let r = |dst: &str, gw: Option<&str>| {
            Route::new(
                dst.parse().expect("net"),
                gw.map(|g| g.parse().expect("ip")),
            )
        };
        let routes = vec![
            r("10.244.0.0/16", Some("10.250.0.9")),
            r("10.244.2.0/24", Some("10.250.0.2")),
        ];
        let hit = lookup(&routes, "10.244.2.7".parse().expect("ip")).expect("route");
        assert_eq!(hit.gateway, Some("10.250.0.2".parse().expect("ip")));
        assert!(lookup(&routes, "10.9.0.1".parse().expect("ip")).is_none());
    }
}
