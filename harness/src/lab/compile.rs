//! A topology compiled into the model of the lab `Lab::up` makes (pure: no
//! IO, no root). `Lab::up` applies [`infrastructure`] of it (`model::apply`)
//! and leaves the pods, the agents' routes and the Services to its steps
//! after apply (plugin, agent); the root identity test
//! (`tests/tests/lab_model.rs`) checks that the built lab reads back as the
//! whole compiled model. The shapes' constants and the Services' ruleset
//! come from the floors below (`underlay.rs`, `vxlan.rs`, `services.rs`,
//! `routes.rs`), never from `build.rs`.
//!
//! Kernel facts the compiled model states because the kernel makes them
//! from what the builder asked: a bridge's MTU is its smallest port's (1500
//! without ports); a veth made without an MTU has 1500; an IPv6 route added
//! without a metric gets 1024; a route's device is the one its gateway is
//! connected through. MACs are left to the kernel (`None`).

use super::base::LabError;
use super::routes::{node_nat_ruleset, underlay_addresses};
use super::topology::shapes::{self, Shape};
use super::topology::{Masquerade, NodeSpec, Routing, Topology};
use super::underlay as shape;
use super::{services, vxlan};
use crate::model::placeholder::{pod_placeholder, POD_PLACEHOLDER};
use crate::model::{
    BridgePort, FdbEntry, LabModel, Link, LinkKind, Namespace, Neighbour, NftTable, Node, Route,
    RouteType, VethPeer, Vxlan, SCHEMA_VERSION,
};
use ipnet::IpNet;
use std::net::IpAddr;

/// The switch namespace's role.
pub(crate) const SWITCH: &str = "switch";
/// The external host's role.
pub(crate) const EXTERNAL: &str = "external";
/// The L2 underlay bridge in the switch.
pub(crate) const UNDERLAY_BRIDGE: &str = "underlay";
/// What `ping_group_range` reads after `probe::allow_ping_sockets`.
pub(crate) const PING_GROUP_RANGE: (&str, &str) = ("net/ipv4/ping_group_range", "0 2147483647");
/// The agent's route protocol (`agent/src/plan.rs`).
const AGENT_PROTO: &str = "199";

/// The pod names of a node, as the builder names them.
pub(crate) fn pod_name(node: &str, k: usize) -> String {
    format!("{node}-pod{k}")
}

/// What `Lab::up` applies of a compiled model: the lab's infrastructure.
/// The rest is made by the steps after apply, as on a real node: the pods
/// (attached by the plugin, through the runtime), the routes the agent
/// installs (`routing = "agent"`) and the tables bound to pod addresses
/// (the Services, whose backends the plugin's IPAM chooses).
pub fn infrastructure(mut model: LabModel) -> LabModel {
    for node in &mut model.nodes {
        node.pods.clear();
    }
    for ns in model.namespaces_mut() {
        ns.routes.retain(|r| r.proto != AGENT_PROTO);
        ns.nftables.retain(|t| !t.text.contains(POD_PLACEHOLDER));
    }
    model
}

/// The model of the lab `Lab::up` builds from `topo`, with either runtime
/// (the pod's `lo` is brought up by the lab, or by containerd; the rest of a
/// pod is the plugin's).
pub fn compile(topo: &Topology) -> Result<LabModel, LabError> {
    let mut switch = Namespace::new(SWITCH);
    switch.links.push(lo(false));
    // `LinkBridge::new` asks for the bridge up.
    switch.links.push(bridge(UNDERLAY_BRIDGE, true));
    let mut model = LabModel {
        schema_version: SCHEMA_VERSION,
        name: topo.name.clone(),
        underlay: Vec::new(),
        nodes: Vec::new(),
    };
    let mut router = (topo.shape == Shape::Routed).then(|| {
        let mut r = Namespace::new(shape::ROUTER_ROLE);
        r.links.push(lo_up());
        r.sysctls.insert("net/ipv4/ip_forward".into(), "1".into());
        r
    });
    if let Some(ext) = &topo.external {
        let as_node = NodeSpec {
            name: EXTERNAL.into(),
            address: ext.address,
            address6: ext.address6,
            pod_cidr: Vec::new(),
            mtu: None,
            sysctls: Default::default(),
        };
        let mut ns = Namespace::new(EXTERNAL);
        ns.sysctls
            .insert("net/ipv6/conf/default/accept_dad".into(), "0".into());
        ns.sysctls
            .insert(PING_GROUP_RANGE.0.into(), PING_GROUP_RANGE.1.into());
        plug(topo, &mut switch, &mut ns, &as_node, topo.mtu)?;
        if let Some(r) = router.as_mut() {
            routed_leg(topo, &mut switch, r, &mut ns, ext.address);
        }
        model.underlay.push(ns);
    }
    for spec in &topo.nodes {
        let mut node = compile_node(topo, spec, &mut switch)?;
        if let Some(r) = router.as_mut() {
            routed_leg(topo, &mut switch, r, &mut node.net, spec.address);
        }
        if topo.shape == Shape::Nat {
            model.underlay.push(nat_box(&mut node.net));
        }
        if let Some(ext) = topo.external.as_ref().filter(|e| e.gateway) {
            // The outside world is the nodes' gateway, as a real node's.
            for v6 in [false, true] {
                if let (Some(gw), Some(_)) = (ext.address_of(v6), spec.address_of(v6)) {
                    node.net
                        .routes
                        .push(route(default_dst(v6), Some(gw), "eth0", "static"));
                }
            }
        }
        model.nodes.push(node);
    }
    routing(topo, &mut model, router.as_mut());
    services_table(topo, &mut model);
    bridge_mtus(&mut switch);
    model.underlay.push(switch);
    model.underlay.extend(router);
    model.sort();
    Ok(model)
}

fn lo(up: bool) -> Link {
    let mut lo = Link::new("lo", LinkKind::Loopback, up);
    lo.mtu = Some(65536);
    lo
}

fn lo_up() -> Link {
    lo(true)
}

fn bridge(name: &str, up: bool) -> Link {
    let mut b = Link::new(name, LinkKind::Bridge, up);
    b.bridge = Some(crate::model::Bridge::default());
    b
}

/// `plug` in `build.rs`: port `p-<name>` on its bridge (shortened to fit,
/// [`cnilab_net::naming::fitted_ifname`]), `eth0` in `ns`.
fn plug(
    topo: &Topology,
    switch: &mut Namespace,
    ns: &mut Namespace,
    spec: &NodeSpec,
    mtu: u32,
) -> Result<(), LabError> {
    let port_name = cnilab_net::naming::fitted_ifname("p-", &spec.name);
    let bridge_name = match topo.shape {
        Shape::Routed => rack_bridge(topo, switch, spec.address),
        _ => UNDERLAY_BRIDGE.to_string(),
    };
    let (port, mut eth0) = veth_pair(
        (&port_name, SWITCH),
        ("eth0", &ns.name),
        Some(mtu),
        Some(bridge_name),
    );
    eth0.addresses = underlay_addresses(topo, spec)?;
    switch.links.push(port);
    ns.links.push(eth0);
    ns.links.push(lo_up());
    ns.sysctls
        .insert("net/ipv6/conf/default/accept_dad".into(), "0".into());
    Ok(())
}

/// A veth pair, both ends up (as `nl::veth_message` makes it), the first
/// end a port of `controller` when given.
fn veth_pair(
    (name, ns): (&str, &str),
    (peer, peer_ns): (&str, &str),
    mtu: Option<u32>,
    controller: Option<String>,
) -> (Link, Link) {
    let end = |name: &str, other: &str, other_ns: &str| {
        let mut l = Link::new(name, LinkKind::Veth, true);
        l.mtu = Some(mtu.unwrap_or(1500));
        l.veth = Some(VethPeer {
            namespace: Some(other_ns.to_string()),
            name: other.to_string(),
        });
        l
    };
    let mut a = end(name, peer, peer_ns);
    if controller.is_some() {
        a.port = Some(BridgePort {
            hairpin: false,
            isolated: false,
            learning: true,
            state: None,
        });
    }
    a.controller = controller;
    (a, end(peer, name, ns))
}

/// The `rack<N>` bridge of a routed underlay (made on first use, up).
fn rack_bridge(topo: &Topology, switch: &mut Namespace, addr: IpAddr) -> String {
    let name = shape::rack_name(topo, addr);
    if switch.link(&name).is_none() {
        switch.links.push(bridge(&name, true));
    }
    name
}

/// Routed shape: the router's leg in `addr`'s subnet and the default route
/// of the host `ns` via it.
fn routed_leg(
    topo: &Topology,
    switch: &mut Namespace,
    router: &mut Namespace,
    ns: &mut Namespace,
    addr: IpAddr,
) {
    let Some(gw) = shapes::router_address(addr) else {
        return;
    };
    let rack = shape::rack_name(topo, addr);
    if router.link(&rack).is_none() {
        let (port, mut leg) = veth_pair(
            (&format!("p-r-{rack}"), SWITCH),
            (&rack, &router.name),
            Some(topo.mtu),
            Some(rack.clone()),
        );
        leg.addresses = IpNet::new(gw, shapes::SUBNET_PREFIX).into_iter().collect();
        switch.links.push(port);
        router.links.push(leg);
    }
    ns.routes
        .push(route(default_dst(false), Some(gw), "eth0", "static"));
}

fn default_dst(v6: bool) -> IpNet {
    let any = if v6 {
        IpAddr::from([0u16; 8])
    } else {
        IpAddr::from([0u8; 4])
    };
    IpNet::new(any, 0).unwrap_or_default()
}

/// A unicast main-table route (metric as the kernel fills it in).
fn route(dst: IpNet, gateway: Option<IpAddr>, dev: &str, proto: &str) -> Route {
    Route {
        table: cnilab_net::nl::MAIN_TABLE,
        kind: RouteType::Unicast,
        dst,
        gateway,
        dev: Some(dev.to_string()),
        onlink: false,
        scope: "universe".into(),
        proto: proto.into(),
        metric: if dst.addr().is_ipv6() { 1024 } else { 0 },
        src: None,
        nexthops: Vec::new(),
    }
}

fn compile_node(
    topo: &Topology,
    spec: &NodeSpec,
    switch: &mut Namespace,
) -> Result<Node, LabError> {
    let mut ns = Namespace::new(&spec.name);
    for (key, value) in [
        ("net/ipv4/conf/default/arp_notify", "1"),
        ("net/ipv4/ip_forward", "1"),
        ("net/ipv6/conf/all/forwarding", "1"),
        PING_GROUP_RANGE,
    ] {
        ns.sysctls.insert(key.into(), value.into());
    }
    plug(topo, switch, &mut ns, spec, spec.mtu.unwrap_or(topo.mtu))?;
    ns.sysctls.extend(spec.sysctls.clone());
    if topo.masquerade == Masquerade::Node {
        ns.nftables.push(NftTable {
            family: "inet".into(),
            name: "cnilab_lab_nat".into(),
            text: node_nat_ruleset(spec, &topo.cluster_cidr),
        });
    }
    let pods = (0..topo.pods_per_node)
        .map(|k| {
            let mut pod = Namespace::new(&pod_name(&spec.name, k));
            pod.links.push(lo_up());
            pod.sysctls
                .insert(PING_GROUP_RANGE.0.into(), PING_GROUP_RANGE.1.into());
            pod
        })
        .collect();
    Ok(Node {
        net: ns,
        pod_cidrs: spec.pod_cidr.iter().map(IpNet::trunc).collect(),
        pods,
    })
}

/// Shape `nat`: the node's `eth1` to its NAT box, default route via it.
fn nat_box(node: &mut Namespace) -> Namespace {
    let mut nat = Namespace::new(&shape::nat_role(&node.name));
    nat.links.push(lo_up());
    nat.sysctls.insert("net/ipv4/ip_forward".into(), "1".into());
    let (mut eth1, mut eth0) = veth_pair(
        (shape::NAT_LINK, &node.name),
        ("eth0", &nat.name),
        None,
        None,
    );
    let net = |a: std::net::Ipv4Addr| IpNet::new(IpAddr::V4(a), 24).into_iter().collect();
    eth1.addresses = net(shape::NAT_ADDRESS);
    eth0.addresses = net(shape::NAT_GATEWAY);
    node.links.push(eth1);
    nat.links.push(eth0);
    nat.nftables.push(NftTable {
        family: "ip".into(),
        name: "vbox_nat".into(),
        text: shape::NAT_RULESET.into(),
    });
    node.routes.push(route(
        default_dst(false),
        Some(IpAddr::V4(shape::NAT_GATEWAY)),
        shape::NAT_LINK,
        "static",
    ));
    nat
}

/// Routes to the other nodes' pods: static (in the nodes, or in the
/// router of a routed underlay), by the agent, or over VXLAN.
fn routing(topo: &Topology, model: &mut LabModel, router: Option<&mut Namespace>) {
    let peers = |me: &str| -> Vec<(IpNet, IpAddr)> {
        topo.nodes
            .iter()
            .filter(|n| n.name != me)
            .flat_map(|n| {
                n.pod_cidr.iter().filter_map(move |c| {
                    n.address_of(c.addr().is_ipv6()).map(|via| (c.trunc(), via))
                })
            })
            .collect()
    };
    match (topo.routing, router) {
        (Routing::Static, Some(router)) => {
            for (dst, via) in peers(shape::ROUTER_ROLE) {
                let rack = shape::rack_name(topo, via);
                router.routes.push(route(dst, Some(via), &rack, "static"));
            }
        }
        (Routing::Static | Routing::Agent, _) => {
            let proto = if topo.routing == Routing::Agent {
                AGENT_PROTO
            } else {
                "static"
            };
            for node in &mut model.nodes {
                for (dst, via) in peers(&node.net.name) {
                    node.net.routes.push(route(dst, Some(via), "eth0", proto));
                }
            }
        }
        (Routing::Vxlan, _) => vxlan_overlay(topo, model),
    }
}

/// `vxlan.rs`: `vxlan0` per node, and per peer a neighbour, an FDB entry
/// and an onlink route (the peer's VTEP MAC by reference).
fn vxlan_overlay(topo: &Topology, model: &mut LabModel) {
    let spec = topo.vxlan.clone().unwrap_or_default();
    let vtep = |n: &NodeSpec| {
        n.pod_cidr
            .iter()
            .find(|c| c.addr().is_ipv4())
            .map(IpNet::trunc)
    };
    for (node, me) in model.nodes.iter_mut().zip(&topo.nodes) {
        let mut dev = Link::new(vxlan::DEVICE, LinkKind::Vxlan, true);
        dev.mtu = Some(me.mtu.unwrap_or(topo.mtu).saturating_sub(shapes::OVERHEAD));
        dev.addresses = vtep(me)
            .and_then(|c| IpNet::new(c.addr(), 32).ok())
            .into_iter()
            .collect();
        dev.vxlan = Some(Vxlan {
            vni: spec.vni,
            local: Some(me.address),
            port: spec.port,
            dev: Some("eth0".into()),
            learning: false,
        });
        node.net.links.push(dev);
        for peer in topo.nodes.iter().filter(|p| p.name != me.name) {
            let Some(peer_vtep) = vtep(peer) else {
                continue;
            };
            let mac = format!("@{}/{}", peer.name, vxlan::DEVICE);
            node.net.neighbours.push(Neighbour {
                dev: vxlan::DEVICE.into(),
                addr: peer_vtep.addr(),
                mac: Some(mac.clone()),
                state: "permanent".into(),
            });
            node.net.fdb.push(FdbEntry {
                dev: vxlan::DEVICE.into(),
                mac,
                dst: Some(peer.address),
                state: "permanent".into(),
            });
            for c in peer.pod_cidr.iter().filter(|c| c.addr().is_ipv4()) {
                let mut r = route(c.trunc(), Some(peer_vtep.addr()), vxlan::DEVICE, "boot");
                r.onlink = true;
                node.net.routes.push(r);
            }
        }
    }
}

/// `[service]`: the kube-proxy-like table on every node, its backends the
/// first pod of each of the first `backends` nodes (their addresses are the
/// plugin's: placeholders).
fn services_table(topo: &Topology, model: &mut LabModel) {
    let Some(spec) = &topo.service else { return };
    if topo.pods_per_node == 0 {
        return;
    }
    let count = spec.backends.unwrap_or(topo.nodes.len());
    let backends: Vec<(usize, String, String)> = topo
        .nodes
        .iter()
        .enumerate()
        .take(count)
        .map(|(i, n)| (i, n.name.clone(), pod_placeholder(&pod_name(&n.name, 0))))
        .collect();
    let text = services::ruleset_for(spec, &backends, true);
    let (family, name) = services::TABLE
        .split_once(' ')
        .unwrap_or(("ip", "kube-proxy"));
    for node in &mut model.nodes {
        node.net.nftables.push(NftTable {
            family: family.into(),
            name: name.into(),
            text: text.clone(),
        });
    }
}

/// A bridge's MTU follows its smallest port (1500 without ports).
fn bridge_mtus(switch: &mut Namespace) {
    let mtus: Vec<(String, u32)> = switch
        .links
        .iter()
        .filter(|l| l.kind == LinkKind::Bridge)
        .map(|b| {
            let min = switch
                .links
                .iter()
                .filter(|p| p.controller.as_deref() == Some(b.name.as_str()))
                .filter_map(|p| p.mtu)
                .min()
                .unwrap_or(1500);
            (b.name.clone(), min)
        })
        .collect();
    for (name, mtu) in mtus {
        if let Some(b) = switch.link_mut(&name) {
            b.mtu = Some(mtu);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rstest::rstest;
    use std::path::{Path, PathBuf};

    /// Every shipped topology compiles; every veth's peer exists and names
    /// it back; every controller exists; every route's device exists.
    /// The compiled model of `lab/topologies/<file>` (for the tests of
    /// `model/`).
    pub(crate) fn shipped(file: &str) -> LabModel {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../lab/topologies")
            .join(file);
        compile(&Topology::load(&path).expect("topology")).expect("compiles")
    }

    #[rstest]
    fn every_shipped_topology_compiles_into_a_consistent_model(
        #[files("../lab/topologies/*.toml")] path: PathBuf,
    ) {
        let topo = Topology::load(&path).expect("topology");
        let model = compile(&topo).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(model.schema_version, SCHEMA_VERSION);
        assert_eq!(model.nodes.len(), topo.nodes.len());
        let ns_of = |name: &str| model.namespaces().find(|n| n.name == name);
        for ns in model.namespaces() {
            for link in &ns.links {
                if let Some(peer) = &link.veth {
                    let other = peer
                        .namespace
                        .as_deref()
                        .and_then(ns_of)
                        .and_then(|o| o.link(&peer.name))
                        .unwrap_or_else(|| {
                            panic!("{}: {}/{}: no peer", path.display(), ns.name, link.name)
                        });
                    let back = other.veth.as_ref().expect("peer is a veth");
                    assert_eq!(back.namespace.as_deref(), Some(ns.name.as_str()));
                    assert_eq!(back.name, link.name);
                    assert_eq!(other.mtu, link.mtu, "both ends share the MTU");
                }
                if let Some(c) = &link.controller {
                    assert!(ns.link(c).is_some(), "{}: no controller {c}", ns.name);
                }
            }
            for r in &ns.routes {
                let dev = r.dev.as_deref().expect("dev");
                assert!(ns.link(dev).is_some(), "{}: route dev {dev}", ns.name);
            }
        }
        let json = serde_json::to_string(&model).expect("json");
        let back: LabModel = serde_json::from_str(&json).expect("parses back");
        assert_eq!(back, model, "{}: the JSON form round-trips", path.display());
    }

    #[rstest]
    #[case::l2_static("two-node.toml", "node1", &["10.244.2.0/24 via 10.250.0.2 dev eth0 static"])]
    #[case::v6_metric("ipv6-only.toml", "node2", &["fd00:10:244:1::/64 via fd00:10:250::1 dev eth0 static metric 1024"])]
    #[case::agent_proto("agent.toml", "node2", &["10.244.1.0/24 via 10.250.0.1 dev eth0 199"])]
    #[case::routed_default("routed.toml", "node1", &["0.0.0.0/0 via 10.250.1.1 dev eth0 static"])]
    #[case::nat_default("nat.toml", "node1", &["0.0.0.0/0 via 10.0.2.2 dev eth1 static", "10.244.2.0/24 via 10.250.0.2 dev eth0 199"])]
    #[case::vxlan_onlink("vxlan.toml", "node3", &["10.244.1.0/24 via 10.244.1.0 dev vxlan0 boot onlink", "10.244.2.0/24 via 10.244.2.0 dev vxlan0 boot onlink"])]
    fn node_routes_are_the_builders(
        #[case] file: &str,
        #[case] node: &str,
        #[case] expected: &[&str],
    ) {
        let model = shipped(file);
        let ns = model.namespaces().find(|n| n.name == node).expect("node");
        let shown: Vec<String> = ns
            .routes
            .iter()
            .map(|r| {
                let mut s = format!(
                    "{} via {} dev {} {}",
                    r.dst,
                    r.gateway.map(|g| g.to_string()).unwrap_or_default(),
                    r.dev.clone().unwrap_or_default(),
                    r.proto
                );
                if r.metric != 0 {
                    s.push_str(&format!(" metric {}", r.metric));
                }
                if r.onlink {
                    s.push_str(" onlink");
                }
                s
            })
            .collect();
        assert_eq!(shown, expected);
    }

    /// `[external] gateway = true`: every node's default route goes via
    /// the external host, in each family both have an address of.
    #[test]
    fn an_external_gateway_is_the_nodes_default_route() {
        let text = "underlay6 = \"fd00:250::/64\"\n[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\naddress6 = \"fd00:250::1\"\npod_cidr = [\"10.244.1.0/24\"]\n[external]\naddress = \"10.250.0.254\"\naddress6 = \"fd00:250::fe\"\ngateway = true\n";
        let topo = Topology::parse(text, Path::new("t.toml")).expect("topology");
        let model = compile(&topo).expect("compiles");
        let node = model
            .namespaces()
            .find(|n| n.name == "node1")
            .expect("node");
        let defaults: Vec<String> = node
            .routes
            .iter()
            .filter(|r| r.dst.prefix_len() == 0)
            .map(|r| format!("{} via {:?} dev {:?}", r.dst, r.gateway, r.dev))
            .collect();
        assert_eq!(
            defaults,
            [
                "0.0.0.0/0 via Some(10.250.0.254) dev Some(\"eth0\")",
                "::/0 via Some(fd00:250::fe) dev Some(\"eth0\")"
            ]
        );
        let without = Topology::parse(&text.replace("gateway = true\n", ""), Path::new("t.toml"))
            .expect("topology");
        let model = compile(&without).expect("compiles");
        assert!(model
            .namespaces()
            .flat_map(|n| &n.routes)
            .all(|r| r.dst.prefix_len() > 0));
    }

    #[test]
    fn the_routed_underlay_has_a_router_leg_per_subnet_and_routes_in_the_router() {
        let model = shipped("routed.toml");
        let router = model
            .namespaces()
            .find(|n| n.name == "router")
            .expect("router");
        let legs: Vec<(&str, Vec<String>)> = router
            .links
            .iter()
            .filter(|l| l.kind == LinkKind::Veth)
            .map(|l| {
                (
                    l.name.as_str(),
                    l.addresses.iter().map(|a| a.to_string()).collect(),
                )
            })
            .collect();
        assert_eq!(
            legs,
            vec![
                ("rack0", vec!["10.250.0.1/24".to_string()]),
                ("rack1", vec!["10.250.1.1/24".to_string()]),
                ("rack2", vec!["10.250.2.1/24".to_string()]),
            ]
        );
        let routes: Vec<String> = router
            .routes
            .iter()
            .map(|r| format!("{} {:?}", r.dst, r.dev))
            .collect();
        assert_eq!(
            routes,
            vec![
                "10.244.1.0/24 Some(\"rack1\")",
                "10.244.2.0/24 Some(\"rack2\")"
            ]
        );
        let switch = model
            .namespaces()
            .find(|n| n.name == SWITCH)
            .expect("switch");
        let p1 = switch.link("p-node1").expect("port");
        assert_eq!(p1.controller.as_deref(), Some("rack1"));
    }

    #[test]
    fn vxlan_peers_are_named_by_reference_and_services_by_placeholder() {
        let model = shipped("vxlan.toml");
        let node1 = &model.nodes[0].net;
        let dev = node1.link("vxlan0").expect("vxlan0");
        assert_eq!(dev.mtu, Some(1450));
        assert_eq!(
            dev.vxlan.as_ref().map(|v| (v.vni, v.port, v.learning)),
            Some((1, 8472, false))
        );
        let fdb: Vec<String> = node1
            .fdb
            .iter()
            .map(|f| format!("{} {:?}", f.mac, f.dst))
            .collect();
        assert_eq!(
            fdb,
            vec![
                "@node2/vxlan0 Some(10.250.0.2)".to_string(),
                "@node3/vxlan0 Some(10.250.0.3)".to_string()
            ]
        );
        let table = node1
            .nftables
            .iter()
            .find(|t| t.name == "kube-proxy")
            .expect("kube-proxy");
        assert!(
            table.text.contains("{{pod:node3-pod0:ipv4}}"),
            "{}",
            table.text
        );
    }

    #[test]
    fn the_infrastructure_leaves_pods_agent_routes_and_services_to_the_runtime() {
        let agent = shipped("agent.toml");
        assert!(agent.nodes.iter().all(|n| !n.pods.is_empty()));
        assert!(agent.nodes[1]
            .net
            .routes
            .iter()
            .any(|r| r.proto == AGENT_PROTO));
        let infra = infrastructure(agent.clone());
        assert!(infra.nodes.iter().all(|n| n.pods.is_empty()));
        assert!(infra
            .namespaces()
            .all(|n| n.routes.iter().all(|r| r.proto != AGENT_PROTO)));
        assert_eq!(infra.underlay, agent.underlay, "the underlay is apply's");
        let links = |m: &LabModel| -> Vec<Vec<Link>> {
            m.nodes.iter().map(|n| n.net.links.clone()).collect()
        };
        assert_eq!(links(&infra), links(&agent), "the nodes' links are apply's");
        let vxlan = infrastructure(shipped("vxlan.toml"));
        let node1 = &vxlan.nodes[0].net;
        assert!(node1.nftables.iter().all(|t| t.name != "kube-proxy"));
        assert_eq!(node1.fdb.len(), 2, "the overlay is apply's");
        assert!(node1.routes.iter().any(|r| r.onlink));
    }

    #[test]
    fn flags_and_generated_labs_compile_like_files() {
        let mut topo = Topology::generated(3, 2).expect("topology");
        shapes::apply_flags(&mut topo, Some(Shape::Routed), false, true).expect("flags");
        let model = compile(&topo).expect("compiles");
        let names: Vec<&str> = model.underlay.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, vec!["external", "router", "switch"]);
        assert!(model
            .nodes
            .iter()
            .all(|n| n.net.nftables.iter().any(|t| t.name == "kube-proxy")));
        assert_eq!(model.nodes[2].pods.len(), 2);
    }
}
