//! Diagnoses that follow a probe's path through the kernel objects of each
//! node (and pod) it crosses: a pod without a route, a bridge that is down,
//! br_netfilter sending bridged traffic through a dropping FORWARD chain,
//! reverse-path filtering on the interface the packet enters, conntrack
//! INVALID drops, and routes that detour through a third node (a WARN: it
//! works, but is wrong). Each names the node, the object and the evidence.

use super::built::Lab;
use crate::connectivity::node_rules::{chains_with_drop_policy, NodeFacts};
use crate::connectivity::Diagnosis;
use crate::connectivity::ProbeOutcome;
use crate::netns::Route;
use std::collections::HashMap;
use std::net::IpAddr;

/// What these diagnoses read from a node, besides [`NodeFacts`].
#[derive(Clone, Debug, Default)]
pub struct PathFacts {
    /// Link index → (name, up, kind, controller).
    pub links: HashMap<u32, LinkInfo>,
    /// Every address of the node, with its link index.
    pub addresses: Vec<(u32, IpAddr)>,
    /// `rp_filter` of `all` and of each link, by name.
    pub rp_filter: HashMap<String, u8>,
    /// `net.bridge.bridge-nf-call-iptables` / `ip6tables` (`None`: no br_netfilter).
    pub bridge_nf: [Option<String>; 2],
    /// `net.ipv6.conf.all.forwarding`.
    pub ipv6_forwarding: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct LinkInfo {
    pub name: String,
    pub up: bool,
    pub kind: Option<String>,
    pub controller: Option<u32>,
}

/// The routes of pods, by (node, pod) index.
pub type PodRoutes = HashMap<(usize, usize), Vec<Route>>;

/// Reads [`PathFacts`] of every node, and the routes of the pods that
/// `failed` probes start or end in.
fn collect(lab: &Lab, failed: &[&ProbeOutcome]) -> (Vec<PathFacts>, PodRoutes) {
    let nodes = lab
        .nodes
        .iter()
        .map(|node| {
            let file = node.ns.file();
            let links: HashMap<u32, LinkInfo> = node
                .ns
                .links()
                .unwrap_or_default()
                .into_iter()
                .map(|l| {
                    (
                        l.index,
                        LinkInfo {
                            name: l.name,
                            up: l.up,
                            kind: l.kind,
                            controller: l.controller,
                        },
                    )
                })
                .collect();
            let mut rp_filter = HashMap::new();
            for name in std::iter::once("all").chain(links.values().map(|l| l.name.as_str())) {
                let key = format!("net/ipv4/conf/{name}/rp_filter");
                if let Ok(v) = cnilab_net::netns::read_sysctl(Some(file), &key) {
                    rp_filter.insert(name.to_string(), v.trim().parse().unwrap_or(0));
                }
            }
            let nf = |key: &str| cnilab_net::netns::read_sysctl(Some(file), key).ok();
            PathFacts {
                addresses: node
                    .ns
                    .addresses()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| (a.index, a.addr.addr()))
                    .collect(),
                links,
                rp_filter,
                bridge_nf: [
                    nf("net/bridge/bridge-nf-call-iptables"),
                    nf("net/bridge/bridge-nf-call-ip6tables"),
                ],
                ipv6_forwarding: nf("net/ipv6/conf/all/forwarding"),
            }
        })
        .collect();
    let mut pods = HashMap::new();
    for o in failed {
        for e in [&o.spec.from, &o.spec.to] {
            if let (Some(n), Some(p)) = (e.node, e.pod) {
                if let std::collections::hash_map::Entry::Vacant(slot) = pods.entry((n, p)) {
                    let routes = lab
                        .nodes
                        .get(n)
                        .and_then(|node| node.pods.get(p))
                        .and_then(|pod| pod.ns.routes().ok())
                        .unwrap_or_default();
                    slot.insert(routes);
                }
            }
        }
    }
    (nodes, pods)
}

/// The route used for `dst` (longest prefix of the main table, unicast).
fn lookup(routes: &[Route], dst: IpAddr) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| r.table == 254 && r.unicast && r.dst.contains(&dst))
        .max_by_key(|r| r.dst.prefix_len())
}

/// The lab node that has `addr` on one of its interfaces.
fn owner_of(paths: &[PathFacts], addr: IpAddr) -> Option<usize> {
    paths
        .iter()
        .position(|p| p.addresses.iter().any(|(_, a)| *a == addr))
}

/// The link of node `n` that holds `addr`.
fn link_with(path: &PathFacts, addr: IpAddr) -> Option<u32> {
    path.addresses
        .iter()
        .find(|(_, a)| *a == addr)
        .map(|(i, _)| *i)
}

fn link_name(path: &PathFacts, index: Option<u32>) -> String {
    index
        .and_then(|i| path.links.get(&i))
        .map(|l| l.name.clone())
        .unwrap_or_else(|| "?".into())
}

/// Where a packet from node `a` to `dst` (owned by node `b`) enters `b`: the
/// link holding the next hop `a` uses, else `b`'s link toward `a`.
fn ingress(
    facts: &[NodeFacts],
    paths: &[PathFacts],
    a: usize,
    b: usize,
    dst: IpAddr,
) -> Option<u32> {
    let gw = lookup(&facts[a].routes, dst).and_then(|r| r.gateway);
    gw.and_then(|g| link_with(&paths[b], g)).or_else(|| {
        facts[a]
            .address
            .and_then(|addr| lookup(&facts[b].routes, addr))
            .and_then(|r| r.oif)
    })
}

/// Strict (1) or loose (2) reverse-path filtering dropping a packet from
/// `src` (on node `a`) that enters node `b` on `ingress`: the effective
/// value is max(all, interface). The message names the route back, not
/// `src`: every source behind that route is one cause, one line.
fn rp_filter(
    out: &mut Vec<Diagnosis>,
    facts: &[NodeFacts],
    paths: &[PathFacts],
    (a, b): (usize, usize),
    ingress: Option<u32>,
    src: IpAddr,
) {
    if src.is_ipv6() {
        return; // rp_filter is IPv4 only
    }
    let Some(ingress) = ingress else { return };
    let p = &paths[b];
    let name = link_name(p, Some(ingress));
    let all = p.rp_filter.get("all").copied().unwrap_or(0);
    let own = p.rp_filter.get(&name).copied().unwrap_or(0);
    let effective = all.max(own);
    let back = lookup(&facts[b].routes, src);
    let drops = match effective {
        1 => back.and_then(|r| r.oif) != Some(ingress),
        2 => back.is_none(),
        _ => false,
    };
    if drops {
        out.push(Diagnosis {
            id: "rp-filter",
            message: format!(
                "{} drops packets from {} arriving on {name}: rp_filter on {name} is {effective} ({}; max of net.ipv4.conf.all.rp_filter = {all} and net.ipv4.conf.{name}.rp_filter = {own}), but {}",
                facts[b].name,
                facts[a].name,
                if effective == 1 { "strict" } else { "loose" },
                match back {
                    Some(r) => format!("the route back to {} leaves via {}", r.dst.trunc(), link_name(p, r.oif)),
                    None => format!("it has no route back to {}'s addresses", facts[a].name),
                }
            ),
        });
    }
}

/// The nodes a probe crosses: its source's and destination's nodes, and a
/// third node the source's route sends it through.
fn path_nodes(facts: &[NodeFacts], paths: &[PathFacts], o: &ProbeOutcome) -> Vec<usize> {
    let mut out: Vec<usize> = [o.spec.from.node, o.spec.to.node]
        .into_iter()
        .flatten()
        .collect();
    if let Some(a) = o.spec.from.node {
        let via = lookup(&facts[a].routes, o.spec.to.ip)
            .and_then(|r| r.gateway)
            .and_then(|g| owner_of(paths, g));
        out.extend(via);
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Rules that drop conntrack INVALID packets and have counted some.
fn invalid_drops(ruleset: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut where_ = String::new();
    for line in ruleset.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("table ") {
            where_ = format!("table {}", rest.trim_end_matches(" {"));
        } else if let Some(rest) = line.strip_prefix("chain ") {
            let table = where_
                .split(" chain ")
                .next()
                .unwrap_or_default()
                .to_string();
            where_ = format!("{table} chain {}", rest.trim_end_matches(" {"));
        } else if line.contains("ct state invalid") && line.contains("drop") {
            let packets = line
                .split_whitespace()
                .skip_while(|w| *w != "packets")
                .nth(1)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            if packets > 0 {
                out.push((format!("{where_}: {line}"), packets));
            }
        }
    }
    out
}

/// A pod without a route to where the probe goes (or back).
fn pod_no_route(
    out: &mut Vec<Diagnosis>,
    lab: &Lab,
    facts: &[NodeFacts],
    pod_routes: &PodRoutes,
    spec: &crate::connectivity::ProbeSpec,
) {
    for (pod_end, other) in [(&spec.from, &spec.to), (&spec.to, &spec.from)] {
        let (Some(n), Some(p)) = (pod_end.node, pod_end.pod) else {
            continue;
        };
        let Some(routes) = pod_routes.get(&(n, p)) else {
            continue;
        };
        if lookup(routes, other.ip).is_none() {
            let v6 = other.ip.is_ipv6();
            let cluster = lab
                .topo
                .cluster_cidr
                .iter()
                .find(|c| c.addr().is_ipv6() == v6 && c.contains(&other.ip));
            let what = match cluster {
                Some(c) => format!("no route to the cluster CIDR {c} (and no default route)"),
                None => "no default route".to_string(),
            };
            let has: Vec<String> = routes
                .iter()
                .filter(|r| r.table == 254 && r.unicast && r.dst.addr().is_ipv6() == v6)
                .map(|r| r.dst.to_string())
                .collect();
            // "pods on node2" only when every pod there lacks it; else the pod.
            let node_pods = lab.nodes.get(n).map_or(0, |x| x.pods.len());
            let lacking = (0..node_pods)
                .filter(|q| {
                    pod_routes
                        .get(&(n, *q))
                        .is_some_and(|r| lookup(r, other.ip).is_none())
                })
                .count();
            let (who, their) = if node_pods > 1 && lacking == node_pods {
                let node = facts.get(n).map(|f| f.name.as_str()).unwrap_or("?");
                (format!("pods on {node} have"), "their")
            } else {
                (format!("pod {} has", pod_end.name), "its")
            };
            out.push(Diagnosis {
                id: "pod-no-route",
                message: format!(
                    "{who} {what} in {} ({their} routes: {}): give the plugin a default route (IPAM `routes`, or isDefaultGateway)",
                    crate::connectivity::probe::family(&other.ip),
                    if has.is_empty() { "none".to_string() } else { has.join(", ") },
                ),
            });
        }
    }
}

/// The likely causes that follow the path of each probe of `failed`, in
/// its order (the nodes' path facts and the pods' routes are read once for
/// all, and only when a probe failed), and the lab's [`detours`].
pub fn diagnose_all(
    lab: &Lab,
    facts: &[NodeFacts],
    failed: &[&ProbeOutcome],
) -> (Vec<Vec<Diagnosis>>, Vec<Diagnosis>) {
    let on_path = if failed.is_empty() {
        Vec::new()
    } else {
        let (paths, pod_routes) = collect(lab, failed);
        failed
            .iter()
            .map(|o| diagnose(lab, facts, &paths, &pod_routes, o))
            .collect()
    };
    (on_path, detours(lab))
}

/// The likely causes of one failed probe that follow its path.
fn diagnose(
    lab: &Lab,
    facts: &[NodeFacts],
    paths: &[PathFacts],
    pod_routes: &PodRoutes,
    o: &ProbeOutcome,
) -> Vec<Diagnosis> {
    let mut out = Vec::new();
    let spec = &o.spec;
    if facts.len() != paths.len() {
        return out;
    }
    pod_no_route(&mut out, lab, facts, pod_routes, spec);
    // A bridge that is down on a node whose pod is on the path.
    for e in [&spec.from, &spec.to] {
        let (Some(n), Some(_)) = (e.node, e.pod) else {
            continue;
        };
        for (index, link) in &paths[n].links {
            if link.kind.as_deref() == Some("bridge") && !link.up {
                let ports = paths[n]
                    .links
                    .values()
                    .filter(|l| l.controller == Some(*index))
                    .count();
                if ports > 0 {
                    out.push(Diagnosis {
                        id: "bridge-down",
                        message: format!(
                            "{}: bridge {} is down (administratively) with {ports} pod port(s) attached: the pods on {} reach neither their gateway nor each other",
                            facts[n].name, link.name, facts[n].name
                        ),
                    });
                }
            }
        }
    }
    // Same-node pod traffic that br_netfilter hands to a dropping FORWARD chain.
    if let (Some(a), Some(b), Some(_), Some(_)) =
        (spec.from.node, spec.to.node, spec.from.pod, spec.to.pod)
    {
        if a == b {
            let v6 = spec.to.ip.is_ipv6();
            let key = if v6 {
                "bridge-nf-call-ip6tables"
            } else {
                "bridge-nf-call-iptables"
            };
            if paths[a].bridge_nf[v6 as usize].as_deref().map(str::trim) == Some("1") {
                for chain in chains_with_drop_policy(&facts[a].ruleset) {
                    out.push(Diagnosis {
                        id: "br-netfilter-forward-drop",
                        message: format!(
                            "{}: net.bridge.{key} = 1 passes bridged pod-to-pod traffic through the FORWARD hook, and {chain} drops it: same-node pods cannot talk (accept the pod CIDR in FORWARD, or set {key} = 0)",
                            facts[a].name
                        ),
                    });
                }
            }
        }
    }
    // IPv6 forwarding off on a node that routes the probe's pod traffic
    // (the IPv4 switch is diagnosed as ip-forward-off by the node rules).
    if spec.to.ip.is_ipv6() {
        let crosses = |e: &crate::connectivity::Endpoint, other: &crate::connectivity::Endpoint| {
            e.pod.is_some() && (other.external || other.node != e.node)
        };
        for (e, other) in [(&spec.from, &spec.to), (&spec.to, &spec.from)] {
            let Some(n) = e.node.filter(|_| crosses(e, other)) else {
                continue;
            };
            let value = paths[n].ipv6_forwarding.as_deref().map(str::trim);
            if value.is_some_and(|v| v != "1") {
                out.push(Diagnosis {
                    id: "ip-forward-off",
                    message: format!(
                        "net.ipv6.conf.all.forwarding = {} on {}: the node does not route IPv6 pod traffic",
                        value.unwrap_or_default(),
                        facts[n].name
                    ),
                });
            }
        }
    }
    // Reverse-path filtering where the packet (or its reply) enters a node.
    if let (Some(a), Some(b)) = (spec.from.node, spec.to.node) {
        if a != b {
            let in_b = ingress(facts, paths, a, b, spec.to.ip);
            rp_filter(&mut out, facts, paths, (a, b), in_b, spec.from.ip);
            let in_a = ingress(facts, paths, b, a, spec.from.ip);
            rp_filter(&mut out, facts, paths, (b, a), in_a, spec.to.ip);
        }
    }
    // Conntrack INVALID drops on any node the probe crosses.
    for n in path_nodes(facts, paths, o) {
        for (rule, packets) in invalid_drops(&facts[n].ruleset) {
            out.push(Diagnosis {
                id: "conntrack-invalid",
                message: format!(
                    "{} drops conntrack INVALID packets ({packets} so far): {rule}; asymmetric routing (one direction through another node) or a lost conntrack entry makes pod traffic INVALID",
                    facts[n].name
                ),
            });
        }
    }
    out
}

/// Routes that work but are wrong: node A reaches node B's pod CIDR
/// through a third node C (every packet crosses C, which may filter,
/// NAT or drop it). Read from the routes alone, also when every probe passed.
fn detours(lab: &Lab) -> Vec<Diagnosis> {
    let mut out = Vec::new();
    let routes: Vec<Vec<Route>> = lab
        .nodes
        .iter()
        .map(|n| n.ns.routes().unwrap_or_default())
        .collect();
    for (a, node) in lab.nodes.iter().enumerate() {
        for (b, peer) in lab.nodes.iter().enumerate() {
            if a == b {
                continue;
            }
            for cidr in &peer.spec.pod_cidr {
                let Some(gw) = lookup(&routes[a], cidr.network()).and_then(|r| r.gateway) else {
                    continue;
                };
                let via = lab
                    .nodes
                    .iter()
                    .position(|c| c.spec.addresses().contains(&gw));
                if let Some(c) = via.filter(|c| *c != a && *c != b) {
                    out.push(Diagnosis {
                        id: "detour",
                        message: format!(
                            "{} reaches {}'s podCIDR {} via {} ({gw}): a detour through a third node (it works, but every packet crosses {}; expected via {})",
                            node.spec.name,
                            peer.spec.name,
                            cidr.trunc(),
                            lab.nodes[c].spec.name,
                            lab.nodes[c].spec.name,
                            peer.spec
                                .address_of(cidr.addr().is_ipv6())
                                .map(|x| x.to_string())
                                .unwrap_or_default()
                        ),
                    });
                }
            }
        }
    }
    out
}

/// Whether `gw` is one of `owner`'s own addresses (any interface): a route
/// via the node's second address is not stale.
pub fn is_own_address(paths: &[PathFacts], owner: usize, gw: IpAddr) -> bool {
    paths
        .get(owner)
        .is_some_and(|p| p.addresses.iter().any(|(_, a)| *a == gw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_invalid_drops_that_counted() {
        let ruleset = "table inet t {\n\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tct state invalid counter packets 7 bytes 420 drop\n\t\tct state invalid counter packets 0 bytes 0 drop\n\t}\n}\n";
        let found = invalid_drops(ruleset);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].1, 7);
        assert!(
            found[0].0.contains("table inet t chain forward"),
            "{found:?}"
        );
    }
}
