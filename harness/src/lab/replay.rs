//! `lab up --capture FILE...` and `lab run --capture`: captured nodes
//! (`cnilab capture`) stood up as a lab, each node and its pods holding
//! what the capture holds (no plugin runs), joined by an underlay derived
//! from the nodes' uplinks.
//!
//! Where things happen: [`load`] reads and validates the files (schema,
//! JSON position, two nodes of one name or uplink address, an object whose
//! device is missing: the error names the file and the object); [`compose`]
//! renames the pods `<node>-pod<k>`, turns each node's uplink (the link of
//! its routes via another node's address, else the device of its default
//! route, else its first addressed link that is no pod's; never an address
//! another node holds) into a veth to the switch, every other NIC of the
//! node (a VM's NAT or management interface: VirtualBox gives every VM
//! 10.0.2.15) into a veth to a stub of the node's own (`<node>-nat`, a
//! segment per node, never one shared segment of duplicate addresses), and
//! derives the underlay: one switch bridge for a
//! shared subnet, a bridge per subnet and a `router` with a leg on each
//! (the nodes' gateway address) and routes to the nodes' pod CIDRs
//! otherwise), stands the outside world (the external host `pod-to-external`
//! probes) where the nodes' default routes lead (`lab/outside.rs`: at
//! their gateway on a shared subnet, behind the router otherwise, with no
//! route to any pod), and marks a captured VXLAN overlay's routing and a captured
//! kube-proxy table's Service and real kube-proxy chains' Services
//! (`kube_proxy::merge`); [`build`] applies the model (`model::apply`, namespaces
//! `cnilab-lab-<lab>-<role>` for a standing lab, recorded in its ledger)
//! and returns a [`Lab`] like any other, so `lab check`, `status`, `show`,
//! `trace` and `down` work on it. A replayed node has no plugin: its
//! `net.conflist` names the plugin type `cnilab-replay-none`, so a DEL on
//! `lab down` fails harmlessly and the namespaces go with the lab.
//!
//! For the probes, as in a lab: every replayed namespace opens
//! `ping_group_range`, and the topology's MTU is the pods' smallest (the DF
//! probe's size). An uplink that was a veth to another link of the node
//! ([`drop_own_peer`]) loses that other end. `lab check` of a replay
//! reports the groups it has nothing for as skipped (`tally::report`).

use super::base::{LabError, UpOptions};
use super::built::{Lab, Node, Pod};
use super::compile::EXTERNAL;
pub use super::state::{FoundPod, Replayed};
use super::topology::shapes::Shape;
use super::topology::{NodeSpec, Topology};
use crate::capture;
pub use crate::capture::Loaded;
use crate::model::apply::{self, Applied, NotMade};
use crate::model::{
    BridgePort, LabModel, Link, LinkKind, Namespace, Node as ModelNode, Route, VethPeer,
};
use crate::runtime::{NetworkConfig, Runtime};
use ipnet::IpNet;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The plugin type a replayed node's config names (no such plugin exists).
pub const NO_PLUGIN: &str = "cnilab-replay-none";
/// The network name of a replayed node's config.
pub const NET_NAME: &str = "cnilab-replay";

fn setup(msg: impl Into<String>) -> LabError {
    LabError::Setup(msg.into())
}

/// An uplink subnet: its gateway (a node's default route's) and its nodes
/// (name, uplink address, pod CIDRs).
type Subnet = (IpNet, Option<IpAddr>, Vec<(String, IpAddr, Vec<IpNet>)>);

/// Reads every file (a node's capture, or a cluster's bundle of them);
/// refuses a newer schema, JSON that does not parse
/// (with its line and column), two nodes of one name or one uplink
/// address, and a node or pod whose objects name a missing device.
pub fn load(paths: &[PathBuf]) -> Result<Vec<Loaded>, LabError> {
    let mut out: Vec<Loaded> = Vec::new();
    for path in paths {
        for capture in capture::load_all(path).map_err(setup)? {
            let name = capture.node.net.name.clone();
            let ok = !name.is_empty()
                && name.len() <= 30
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if !ok {
                return Err(setup(format!(
                "{}: node name {name:?}: use 1-30 characters of [A-Za-z0-9-] (capture again with --node-name)",
                path.display()
            )));
            }
            if let Some(other) = out.iter().find(|o| o.capture.node.net.name == name) {
                return Err(setup(format!(
                "{}: node {name} is also the node of {}; capture one of them again with another --node-name",
                path.display(),
                other.path.display()
            )));
            }
            let single = LabModel {
                schema_version: crate::model::SCHEMA_VERSION,
                name: name.clone(),
                underlay: Vec::new(),
                nodes: vec![capture.node.clone()],
            };
            apply::check(&single).map_err(|e| setup(format!("{}: {e}", path.display())))?;
            let loaded = Loaded {
                path: path.clone(),
                capture,
            };
            out.push(loaded);
        }
    }
    super::uplinks::uplinks(&out)?;
    Ok(out)
}

/// The model and topology of the replayed lab `name`, and what each
/// captured pod became (its namespace role, its evidence, whether probed).
pub fn compose(
    name: &str,
    loaded: &[Loaded],
) -> Result<(LabModel, Topology, Vec<FoundPod>), LabError> {
    let mut topo = Topology::generated(1, 1).map_err(|e| setup(e.to_string()))?;
    topo.nodes.clear();
    topo.name = name.to_string();
    topo.external = None;
    let mut model = LabModel {
        schema_version: crate::model::SCHEMA_VERSION,
        name: name.to_string(),
        underlay: Vec::new(),
        nodes: Vec::new(),
    };
    let mut switch = Namespace::new("switch");
    switch
        .links
        .push(Link::new("lo", LinkKind::Loopback, false));
    let mut subnets: Vec<Subnet> = Vec::new();
    let mut found: Vec<FoundPod> = Vec::new();
    for (l, (up, addr, gateway)) in loaded.iter().zip(super::uplinks::uplinks(loaded)?) {
        let (mut node, roles) = super::replay_pods::renamed(&l.capture.node);
        let judged = super::replay_pods::judged(l, &roles);
        let subnet = addr.trunc();
        let k = match subnets.iter().position(|(s, _, _)| *s == subnet) {
            Some(k) => k,
            None => {
                subnets.push((subnet, None, Vec::new()));
                subnets.len() - 1
            }
        };
        let bridge = if k == 0 {
            super::compile::UNDERLAY_BRIDGE.to_string()
        } else {
            format!("rack{k}")
        };
        let port = cnilab_net::naming::fitted_ifname("p-", &node.net.name);
        drop_own_peer(&mut node.net, &up);
        let link = node
            .net
            .link_mut(&up)
            .ok_or_else(|| setup("uplink vanished"))?;
        link.kind = LinkKind::Veth;
        link.controller = None;
        link.port = None;
        link.vxlan = None;
        link.bridge = None;
        link.lower = None;
        link.veth = Some(VethPeer {
            namespace: Some("switch".into()),
            name: port.clone(),
        });
        let mut p = Link::new(&port, LinkKind::Veth, true);
        p.mtu = link.mtu;
        p.controller = Some(bridge);
        p.port = Some(BridgePort {
            hairpin: false,
            isolated: false,
            learning: true,
            state: None,
        });
        p.veth = Some(VethPeer {
            namespace: Some(node.net.name.clone()),
            name: up.clone(),
        });
        switch.links.push(p);
        super::uplinks::own_segments(&mut node.net, &up);
        if let Some(stub) = stub_peers(&mut node, &up) {
            model.underlay.push(stub);
        }
        node.pod_cidrs = pod_cidrs(&node);
        super::replay_pods::open_ping(&mut node, &judged);
        let address6 = node
            .net
            .link(&up)
            .and_then(|l| {
                l.addresses
                    .iter()
                    .find(|a| a.addr().is_ipv6())
                    .map(|a| a.addr())
            })
            .filter(|_| addr.addr().is_ipv4());
        topo.nodes.push(NodeSpec {
            name: node.net.name.clone(),
            address: addr.addr(),
            address6,
            pod_cidr: node.pod_cidrs.clone(),
            mtu: None,
            sysctls: BTreeMap::new(),
        });
        topo.pods_per_node = topo.pods_per_node.max(node.pods.len());
        found.extend(judged);
        let group = &mut subnets[k];
        group.1 = group.1.or(gateway.filter(|g| subnet.contains(g)));
        group
            .2
            .push((node.net.name.clone(), addr.addr(), node.pod_cidrs.clone()));
        model.nodes.push(node);
    }
    // The DF probe goes at the pods' MTU (a flannel pod's is the VXLAN's).
    let pod_mtus = model.nodes.iter().flat_map(|n| &n.pods).flat_map(|p| {
        p.links
            .iter()
            .filter(|l| l.kind != LinkKind::Loopback)
            .filter_map(|l| l.mtu)
    });
    if let Some(mtu) = pod_mtus.min() {
        topo.mtu = mtu;
    }
    for k in 0..subnets.len() {
        let name = if k == 0 {
            super::compile::UNDERLAY_BRIDGE.to_string()
        } else {
            format!("rack{k}")
        };
        let mut b = Link::new(&name, LinkKind::Bridge, true);
        b.bridge = Some(Default::default());
        switch.links.push(b);
    }
    let mut derived = (subnets.len() > 1).then(|| router(&mut switch, &subnets));
    if derived.is_some() {
        topo.shape = Shape::Routed;
    }
    let gateways: Vec<_> = subnets.iter().map(|(s, g, _)| (*s, *g)).collect();
    let outside = super::outside::place(&model.nodes, &gateways, &mut switch, derived.as_mut());
    if let Some((spec, external)) = outside {
        topo.external = Some(spec);
        model.underlay.push(external);
    }
    model.underlay.extend(derived);
    if let Some((subnet, _, _)) = subnets.first() {
        if subnet.addr().is_ipv4() {
            topo.underlay = *subnet;
        }
    }
    overlay(&mut topo, &model.nodes);
    topo.service = service(&model.nodes);
    let captured: Vec<_> = model
        .nodes
        .iter()
        .map(|n| super::kube_proxy::of_namespace(&n.net))
        .collect();
    topo.kube_services = super::kube_proxy::merge(&captured);
    model.underlay.push(switch);
    Ok((model, topo, found))
}

/// A VXLAN overlay the captures hold (a node's `vxlan0`, as the lab and
/// flannel name it) marks the replay's routing VXLAN, with the pods' MTU
/// as captured, so the overlay's diagnoses (`vxlan-mtu-overhead`,
/// `vxlan-fdb-missing`) judge the replay as they judge the captured lab.
fn overlay(topo: &mut Topology, nodes: &[ModelNode]) {
    let vxlan = nodes.iter().find_map(|n| {
        n.net
            .link(super::vxlan::DEVICE)
            .and_then(|l| l.vxlan.as_ref())
    });
    let Some(v) = vxlan else { return };
    let pod_mtu = nodes
        .iter()
        .flat_map(|n| &n.pods)
        .filter_map(|p| p.link("eth0").and_then(|l| l.mtu))
        .max();
    topo.routing = super::topology::Routing::Vxlan;
    topo.vxlan = Some(super::topology::shapes::VxlanSpec {
        vni: v.vni,
        port: v.port,
        pod_mtu,
    });
}

/// The lab's Service as its kube-proxy table holds it on any captured node
/// (`table ip kube-proxy`, `crate::lab::services`): the ClusterIP the
/// `services` map sends to `service-web`, and one backend per
/// `service-web-<node>`; so the replay's Service groups probe what the
/// captured rules hold (or lack, on a node that lost them).
fn service(nodes: &[ModelNode]) -> Option<super::topology::shapes::ServiceSpec> {
    let (family, name) = super::services::TABLE.split_once(' ')?;
    let mut cluster_ip = None;
    let mut backends: Vec<&str> = Vec::new();
    let tables = nodes.iter().flat_map(|n| &n.net.nftables);
    for t in tables.filter(|t| t.family == family && t.name == name) {
        for entry in t.text.split([',', '{', '}']) {
            let Some((key, target)) = entry.split_once(": goto ") else {
                continue;
            };
            let target = target.trim();
            match target.strip_prefix("service-web-") {
                Some(node) if !backends.contains(&node) => backends.push(node),
                Some(_) => {}
                None if target == "service-web" => {
                    let ip = key.split(" . ").next().unwrap_or_default().trim();
                    cluster_ip = cluster_ip.or(ip.parse().ok());
                }
                None => {}
            }
        }
    }
    Some(super::topology::shapes::ServiceSpec {
        cluster_ip: cluster_ip?,
        backends: Some(backends.len()),
    })
}

/// An uplink that was a veth to another link of the node itself (a test
/// bed's stand-in for a NIC) becomes the veth to the switch: its old other
/// end goes, with what names it as device.
fn drop_own_peer(net: &mut Namespace, uplink: &str) {
    let me = net.name.clone();
    let Some(peer) = net.link(uplink).and_then(|l| l.veth.clone()) else {
        return;
    };
    if peer.namespace.as_ref().is_some_and(|n| *n != me) || peer.name == uplink {
        return;
    }
    let gone = peer.name;
    net.links.retain(|l| l.name != gone);
    net.routes
        .retain(|r| r.dev.as_deref() != Some(gone.as_str()));
    net.neighbours.retain(|n| n.dev != gone);
    net.fdb.retain(|f| f.dev != gone);
    net.qdiscs.retain(|q| q.dev != gone);
    let conf = format!("/conf/{gone}/");
    net.sysctls.retain(|k, _| !k.contains(&conf));
}

/// A router with a leg in every subnet that names a gateway, and routes to
/// every node's pod CIDRs via the node.
fn router(switch: &mut Namespace, subnets: &[Subnet]) -> Namespace {
    let mut r = Namespace::new(super::underlay::ROUTER_ROLE);
    r.links.push(Link::new("lo", LinkKind::Loopback, true));
    r.sysctls.insert("net/ipv4/ip_forward".into(), "1".into());
    for (k, (subnet, gateway, nodes)) in subnets.iter().enumerate() {
        let Some(gw) = gateway else { continue };
        let bridge = if k == 0 {
            super::compile::UNDERLAY_BRIDGE.to_string()
        } else {
            format!("rack{k}")
        };
        let leg = format!("leg{k}");
        let port = format!("p-r-{leg}");
        let mut l = Link::new(&leg, LinkKind::Veth, true);
        l.addresses = IpNet::new(*gw, subnet.prefix_len()).into_iter().collect();
        l.veth = Some(VethPeer {
            namespace: Some("switch".into()),
            name: port.clone(),
        });
        let mut p = Link::new(&port, LinkKind::Veth, true);
        p.controller = Some(bridge);
        p.veth = Some(VethPeer {
            namespace: Some(r.name.clone()),
            name: leg.clone(),
        });
        switch.links.push(p);
        r.links.push(l);
        for (_, via, cidrs) in nodes {
            for c in cidrs.iter().filter(|c| c.addr().is_ipv4() == via.is_ipv4()) {
                r.routes.push(Route {
                    table: cnilab_net::nl::MAIN_TABLE,
                    kind: crate::model::RouteType::Unicast,
                    dst: *c,
                    gateway: Some(*via),
                    dev: Some(leg.clone()),
                    onlink: false,
                    scope: "universe".into(),
                    proto: "static".into(),
                    metric: if c.addr().is_ipv6() { 1024 } else { 0 },
                    src: None,
                    nexthops: Vec::new(),
                });
            }
        }
    }
    r
}

/// The other ends of the node's veths that the capture does not hold (a
/// NAT box's, a second network's) in one namespace `<node>-nat`, so the
/// links, their addresses and the routes through them exist; nothing
/// answers behind them.
fn stub_peers(node: &mut ModelNode, uplink: &str) -> Option<Namespace> {
    let mut known: Vec<String> = node.pods.iter().map(|p| p.name.clone()).collect();
    known.push(node.net.name.clone());
    let mut stub = Namespace::new(&super::underlay::nat_role(&node.net.name));
    for (k, l) in node.net.links.iter_mut().enumerate() {
        let Some(peer) = l.veth.as_mut() else {
            continue;
        };
        let captured = peer.namespace.as_ref().is_some_and(|n| known.contains(n));
        if l.name == uplink || captured {
            continue;
        }
        let name = match peer.name.starts_with('#')
            || peer.name.is_empty()
            || stub.link(&peer.name).is_some()
        {
            true => format!("peer{k}"),
            false => peer.name.clone(),
        };
        *peer = VethPeer {
            namespace: Some(stub.name.clone()),
            name: name.clone(),
        };
        let mut end = Link::new(&name, LinkKind::Veth, true);
        end.mtu = l.mtu;
        end.veth = Some(VethPeer {
            namespace: Some(node.net.name.clone()),
            name: l.name.clone(),
        });
        stub.links.push(end);
    }
    if stub.links.is_empty() {
        return None;
    }
    stub.links.push(Link::new("lo", LinkKind::Loopback, true));
    Some(stub)
}

/// The node's pod CIDRs: for each pod address, the node's own connected
/// network that holds it (the plugin's bridge address), else its /24 or
/// /64.
fn pod_cidrs(node: &ModelNode) -> Vec<IpNet> {
    if !node.pod_cidrs.is_empty() {
        return node.pod_cidrs.clone();
    }
    let own: Vec<IpNet> = node
        .net
        .links
        .iter()
        .flat_map(|l| l.addresses.iter().map(IpNet::trunc))
        .collect();
    let mut out: Vec<IpNet> = Vec::new();
    for a in pod_addresses(node.pods.iter()) {
        let cidr = own
            .iter()
            .find(|n| n.contains(&a.addr()) && n.prefix_len() < a.max_prefix_len())
            .copied()
            .or_else(|| {
                IpNet::new(a.addr(), if a.addr().is_ipv4() { 24 } else { 64 })
                    .ok()
                    .map(|n| n.trunc())
            });
        if let Some(c) = cidr {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

fn pod_addresses<'a>(pods: impl Iterator<Item = &'a Namespace>) -> Vec<IpNet> {
    pods.flat_map(|p| p.links.iter().filter(|l| l.kind != LinkKind::Loopback))
        .flat_map(|l| l.addresses.iter().copied())
        .collect()
}

/// Applies the model and makes it a [`Lab`] (standing when
/// `opts.persistent` names it). On error nothing is left behind.
/// `origin` names the capture file a namespace's objects came from.
pub fn build(
    model: &LabModel,
    topo: Topology,
    found: &[FoundPod],
    opts: UpOptions,
    origin: &dyn Fn(&str) -> Option<PathBuf>,
) -> Result<(Lab, Vec<NotMade>), LabError> {
    super::base::make_run_dir(&opts.run_dir)?;
    // The node dirs before any namespace: a run killed mid-apply leaves
    // the node names that `sweep` and `lab down` need to recognise the
    // nodes' namespaces.
    for node in &model.nodes {
        let dir = opts.run_dir.join(&node.net.name);
        std::fs::create_dir_all(&dir).map_err(|e| setup(format!("{}: {e}", dir.display())))?;
    }
    let make = super::base::ns_maker(&opts);
    let started = std::time::Instant::now();
    let applied = apply::apply(
        model,
        &apply::Options {
            make_ns: Some(&make),
        },
    )
    .map_err(|e| {
        let file = match &e {
            apply::ApplyError::Object { namespace, .. } => origin(namespace),
            _ => None,
        };
        match file {
            Some(f) => setup(format!("{}: {e}", f.display())),
            None => setup(format!("replay: {e}")),
        }
    })?;
    // Probes right after `lab up` need every port forwarding: a bridge
    // port whose veth peer has its own ifindex in the other namespace
    // (the external host's `p-external`, both index 2) gets its carrier
    // from the kernel's link watcher up to a second late, and until then
    // the switch floods nothing to it (lab_replay's masquerade-missing
    // replay lost node2's first ARP for the gateway that way).
    let veths = super::base::veths_of(model.namespaces(), |role| applied.namespace(role));
    super::base::wait_oper_up(&veths, "replay")?;
    let elapsed = started.elapsed();
    let plugin_dir = opts.plugin_dir.clone().unwrap_or_else(|| {
        super::base::own_dir()
            .unwrap_or_default()
            .display()
            .to_string()
    });
    let not_made = applied.not_made.clone();
    let mut lab = into_lab(applied, topo, opts, &plugin_dir, (model, found))?;
    lab.phases.push(("apply".into(), elapsed));
    Ok((lab, not_made))
}

fn into_lab(
    applied: Applied,
    topo: Topology,
    opts: UpOptions,
    plugin_dir: &str,
    (model, found): (&LabModel, &[FoundPod]),
) -> Result<Lab, LabError> {
    let (mut switch, mut external) = (None, None);
    let mut extra = Vec::new();
    for (role, ns) in applied.underlay {
        match role.as_str() {
            "switch" => switch = Some(ns),
            EXTERNAL => external = Some(ns),
            _ => extra.push(ns),
        }
    }
    let switch = switch.ok_or_else(|| setup("replay: no switch"))?;
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NET_NAME,
        "plugins": [{"type": NO_PLUGIN}],
    })
    .to_string();
    let mut nodes = Vec::new();
    for n in applied.nodes {
        let spec = topo
            .node(&n.name)
            .cloned()
            .ok_or_else(|| setup(format!("replay: node {} not planned", n.name)))?;
        let node_dir = opts.run_dir.join(&n.name);
        std::fs::create_dir_all(&node_dir)
            .map_err(|e| setup(format!("{}: {e}", node_dir.display())))?;
        let conf_path = node_dir.join("net.conflist");
        std::fs::write(&conf_path, &conf)
            .map_err(|e| setup(format!("{}: {e}", conf_path.display())))?;
        let net = NetworkConfig::parse(&conf, &conf_path)?;
        let runtime = Runtime::new(plugin_dir)
            .in_netns(&n.ns)?
            .with_cache_dir(&node_dir.join("results"));
        // A pod keeps its captured name; what evidence does not make a
        // pod (a NAT box with a veth to the node) stands beside the lab,
        // not probed.
        let mut pods = Vec::new();
        for (role, ns) in n.pods {
            let pod = found
                .iter()
                .find(|f| f.node == n.name && f.role == role && f.skipped.is_none());
            // The pod's addresses, as a lab's pods carry them (probes go
            // to them).
            let ips = || {
                let captured = model.nodes.iter().filter(|m| m.net.name == n.name);
                pod_addresses(captured.flat_map(|m| &m.pods).filter(|p| p.name == role))
            };
            match pod {
                Some(f) => pods.push(Pod {
                    container_id: format!("cnilab-{role}"),
                    ips: ips(),
                    name: f.name.clone(),
                    ns,
                }),
                None => extra.push(ns),
            }
        }
        nodes.push(Node {
            spec,
            ns: n.ns,
            runtime,
            net,
            pods,
            agent: None,
            cri: None,
        });
    }
    Ok(Lab {
        topo,
        opts,
        plugin_dir: plugin_dir.to_string(),
        switch,
        external,
        nodes,
        phases: Vec::new(),
        extra,
        containerd: None,
    })
}

/// A replay prepared, not yet built: what [`load`] read, what [`compose`]
/// made of it, and how its neighbour entries fit the host's tables (as a
/// compiled lab's do, `super::neighbours::fit`).
pub struct Prepared {
    loaded: Vec<Loaded>,
    model: LabModel,
    topo: Topology,
    found: Vec<FoundPod>,
    pub host: super::neighbours::HostFit,
}

impl Prepared {
    /// The replayed nodes' names, as the captures give them.
    pub fn node_names(&self) -> Vec<String> {
        self.loaded
            .iter()
            .map(|l| l.capture.node.net.name.clone())
            .collect()
    }
}

/// Loads and plans the replay `name`; refuses, with the numbers and the
/// remedies, one the host's neighbour tables cannot hold even with the
/// bulk probe paths pinned (unless `tune_host` may raise them).
pub fn prepare(name: &str, paths: &[PathBuf], tune_host: bool) -> Result<Prepared, LabError> {
    let loaded = load(paths)?;
    let (model, topo, found) = compose(name, &loaded)?;
    let host = super::neighbours::fit(&topo, tune_host).map_err(setup)?;
    if host.pin || !host.tune.is_empty() || host.unchecked {
        eprintln!("🧮 {}", host.summary);
    }
    Ok(Prepared {
        loaded,
        model,
        topo,
        found,
        host,
    })
}

/// Builds a prepared replay and pins its bulk probe paths when its fit
/// says so: the replayed lab, what was not made and what each captured
/// pod became.
pub fn build_prepared(prepared: Prepared, opts: UpOptions) -> Result<(Lab, Replayed), LabError> {
    let Prepared {
        loaded,
        model,
        topo,
        found,
        host,
    } = prepared;
    let origin = |ns: &str| {
        model
            .nodes
            .iter()
            .zip(&loaded)
            .find(|(n, _)| {
                n.net.name == ns
                    || n.pods.iter().any(|p| p.name == ns)
                    || super::underlay::nat_role(&n.net.name) == ns
            })
            .map(|(_, l)| l.path.clone())
    };
    let (mut lab, not_made) = build(&model, topo, &found, opts, &origin)?;
    super::pin_if_needed(&mut lab, &host)?;
    Ok((
        lab,
        Replayed {
            not_made,
            pods: found,
        },
    ))
}

/// Loads, plans and builds (no host tuning): the replayed lab, what was
/// not made and what each captured pod became.
pub fn replay(name: &str, paths: &[PathBuf], opts: UpOptions) -> Result<(Lab, Replayed), LabError> {
    build_prepared(prepare(name, paths, false)?, opts)
}

/// The run directory must not outlive a failed standing replay.
pub fn forget_run_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
