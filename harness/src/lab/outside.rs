//! The outside world of a replay (`lab up --capture`): a real node reaches
//! the internet through its default route's gateway, so the replay stands
//! its external host (what `pod-to-external` probes) there.
//!
//! Where things happen: [`place`] decides. With the nodes on one shared
//! subnet, the external host takes the gateway address of the nodes'
//! default routes (on the `underlay` bridge), unless a captured namespace
//! holds that address. With the nodes on several subnets the gateways are
//! the derived router's legs, so the external host sits behind that router,
//! on a network of its own (the first documentation range, RFC 5737, that
//! nothing captured uses), as the internet sits behind a cluster's router.
//! Either way it has no route to any pod CIDR: like the internet, it can
//! answer only traffic masqueraded to a node's address, so a node that lost
//! its masquerade rules fails `pod-to-external` as the live node does.
//! Without a default route through a node's uplink there is no external
//! host, and `lab check` says so (`tally::report`).

use super::compile::{EXTERNAL, PING_GROUP_RANGE, UNDERLAY_BRIDGE};
use super::topology::ExternalSpec;
use crate::model::{Link, LinkKind, Namespace, Node, Route, RouteType, VethPeer};
use ipnet::IpNet;
use std::net::IpAddr;

/// Where the outside world of a multi-subnet replay may go: the first of
/// these networks that no captured address nor route touches.
const BEHIND_ROUTER: [&str; 3] = ["198.51.100.0/24", "203.0.113.0/24", "192.0.2.0/24"];

/// Why a replay has no external host (`tally::report` says it).
pub const NO_GATEWAY: &str =
    "no external host: no captured node has a default route through its uplink to a gateway no captured namespace holds (the replay puts the outside world at that gateway)";

/// The external host of a replay whose nodes are `nodes`, on uplink
/// subnets `subnets` (each with its nodes' default gateway): its spec and
/// namespace; links to it are added to `switch`, or to `router` (the
/// derived router of several subnets). `None` when the nodes name no
/// gateway, or a captured namespace holds it.
pub fn place(
    nodes: &[Node],
    subnets: &[(IpNet, Option<IpAddr>)],
    switch: &mut Namespace,
    router: Option<&mut Namespace>,
) -> Option<(ExternalSpec, Namespace)> {
    let (subnet, gateway) = subnets.first()?;
    let gateway = (*gateway)?;
    let held = |a: IpAddr| {
        nodes
            .iter()
            .flat_map(|n| std::iter::once(&n.net).chain(&n.pods))
            .flat_map(|ns| &ns.links)
            .any(|l| l.addresses.iter().any(|x| x.addr() == a))
    };
    // The networks behind a router are IPv4 ones.
    if held(gateway) || (gateway.is_ipv6() && router.is_some()) {
        return None;
    }
    let mut ns = Namespace::new(EXTERNAL);
    ns.links.push(Link::new("lo", LinkKind::Loopback, true));
    for (key, value) in [PING_GROUP_RANGE, ("net/ipv6/conf/default/accept_dad", "0")] {
        ns.sysctls.insert(key.into(), value.into());
    }
    let address = match router {
        None => {
            let port = "p-external";
            let mut p = veth(port, EXTERNAL, "eth0");
            p.controller = Some(UNDERLAY_BRIDGE.into());
            switch.links.push(p);
            let mut eth0 = veth("eth0", "switch", port);
            eth0.addresses = IpNet::new(gateway, subnet.prefix_len())
                .ok()
                .into_iter()
                .collect();
            ns.links.push(eth0);
            gateway
        }
        Some(r) => {
            let net = free_network(nodes)?;
            let mut hosts = net.hosts();
            let (leg_addr, ext_addr) = (hosts.next()?, hosts.next()?);
            let mut leg = veth("outside", EXTERNAL, "eth0");
            leg.addresses = IpNet::new(leg_addr, net.prefix_len())
                .ok()
                .into_iter()
                .collect();
            r.links.push(leg);
            let mut eth0 = veth("eth0", &r.name, "outside");
            eth0.addresses = IpNet::new(ext_addr, net.prefix_len())
                .ok()
                .into_iter()
                .collect();
            ns.links.push(eth0);
            // Back to the nodes' own addresses only, never to their pods.
            for (s, _) in subnets.iter().filter(|(s, _)| s.addr().is_ipv4()) {
                ns.routes.push(route(*s, leg_addr));
            }
            ext_addr
        }
    };
    let spec = ExternalSpec {
        address,
        address6: None,
        gateway: true,
    };
    Some((spec, ns))
}

/// The first of [`BEHIND_ROUTER`] that no captured address or route
/// (but a default one) overlaps.
fn free_network(nodes: &[Node]) -> Option<IpNet> {
    let used: Vec<IpNet> = nodes
        .iter()
        .flat_map(|n| std::iter::once(&n.net).chain(&n.pods))
        .flat_map(|ns| {
            ns.links
                .iter()
                .flat_map(|l| l.addresses.iter().copied())
                .chain(
                    ns.routes
                        .iter()
                        .map(|r| r.dst)
                        .filter(|d| d.prefix_len() > 0),
                )
        })
        .collect();
    BEHIND_ROUTER
        .iter()
        .filter_map(|n| n.parse::<IpNet>().ok())
        .find(|n| !used.iter().any(|u| u.contains(n) || n.contains(u)))
}

fn veth(name: &str, peer_ns: &str, peer: &str) -> Link {
    let mut l = Link::new(name, LinkKind::Veth, true);
    l.veth = Some(VethPeer {
        namespace: Some(peer_ns.into()),
        name: peer.into(),
    });
    l
}

fn route(dst: IpNet, via: IpAddr) -> Route {
    Route {
        table: cnilab_net::nl::MAIN_TABLE,
        kind: RouteType::Unicast,
        dst,
        gateway: Some(via),
        dev: Some("eth0".into()),
        onlink: false,
        scope: "universe".into(),
        proto: "static".into(),
        metric: 0,
        src: None,
        nexthops: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(addr: &str) -> Node {
        let mut net = Namespace::new("n");
        let mut eth0 = Link::new("eth0", LinkKind::Veth, true);
        eth0.addresses = vec![addr.parse().expect("net")];
        net.links.push(eth0);
        Node {
            net,
            pod_cidrs: Vec::new(),
            pods: Vec::new(),
        }
    }

    fn subnet(s: &str, gw: Option<&str>) -> (IpNet, Option<IpAddr>) {
        (s.parse().expect("net"), gw.map(|g| g.parse().expect("ip")))
    }

    #[test]
    fn on_one_subnet_the_external_host_is_the_free_gateway() {
        let nodes = [node("10.9.0.1/24"), node("10.9.0.2/24")];
        let mut switch = Namespace::new("switch");
        let (spec, ns) = place(
            &nodes,
            &[subnet("10.9.0.0/24", Some("10.9.0.254"))],
            &mut switch,
            None,
        )
        .expect("placed");
        assert_eq!(spec.address.to_string(), "10.9.0.254");
        assert_eq!(
            ns.link("eth0").map(|l| l.addresses.clone()),
            Some(vec!["10.9.0.254/24".parse().expect("net")])
        );
        assert!(
            ns.routes.is_empty(),
            "no route back to any pod: {:?}",
            ns.routes
        );
        assert!(switch.link("p-external").is_some());
        // A gateway a node holds is that node, not the outside world.
        let mut switch = Namespace::new("switch");
        let held = [subnet("10.9.0.0/24", Some("10.9.0.2"))];
        assert!(place(&nodes, &held, &mut switch, None).is_none());
        let none = [subnet("10.9.0.0/24", None)];
        assert!(place(&nodes, &none, &mut switch, None).is_none());
        let v6 = [node("fd00:9::1/64"), node("fd00:9::2/64")];
        let gw6 = [subnet("fd00:9::/64", Some("fd00:9::fe"))];
        let (spec, _) = place(&v6, &gw6, &mut switch, None).expect("IPv6 placed");
        assert_eq!(spec.address.to_string(), "fd00:9::fe");
    }

    #[test]
    fn across_subnets_the_external_host_is_behind_the_router_on_a_free_network() {
        let mut n1 = node("10.9.1.1/24");
        n1.net.links[0]
            .addresses
            .push("198.51.100.7/24".parse().expect("net"));
        let nodes = [n1, node("10.9.2.1/24")];
        let (mut switch, mut router) = (Namespace::new("switch"), Namespace::new("router"));
        let subnets = [
            subnet("10.9.1.0/24", Some("10.9.1.254")),
            subnet("10.9.2.0/24", Some("10.9.2.254")),
        ];
        let (spec, ns) = place(&nodes, &subnets, &mut switch, Some(&mut router)).expect("placed");
        assert_eq!(spec.address.to_string(), "203.0.113.2");
        assert!(router.link("outside").is_some());
        let back: Vec<String> = ns.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(back, ["10.9.1.0/24", "10.9.2.0/24"]);
    }
}
