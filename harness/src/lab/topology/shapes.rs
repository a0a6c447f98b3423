//! The topology side of the underlay shapes (`lab/underlay.rs`), the VXLAN
//! overlay (`lab/vxlan.rs`) and the Service (`lab/services.rs`): their
//! settings, the addresses and MTUs they imply, what they require of a
//! topology, and the `--shape`/`--vxlan`/`--service` flags applied to one. Pure: the builders of those parts import from here, never the
//! other way round.

use super::{Routing, Topology};
use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// One L2 switch for every node.
    #[default]
    L2,
    /// Nodes in different /24 subnets joined by a router namespace.
    Routed,
    /// A VirtualBox-style NAT interface (10.0.2.15 on every node) next to
    /// the host-only underlay.
    Nat,
}

/// The NAT network.
pub fn nat_network() -> IpNet {
    IpNet::V4(Ipv4Net::new(Ipv4Addr::new(10, 0, 2, 0), 24).unwrap_or_default())
}

/// Prefix length of one subnet of a routed underlay.
pub const SUBNET_PREFIX: u8 = 24;

/// `--shape`, `--vxlan`, `--service`: a generated lab gets the shape (a
/// routed one a /24 per node: node N at 10.250.N.10 in 10.250.0.0/16).
pub fn apply_flags(
    topo: &mut Topology,
    shape: Option<Shape>,
    vxlan: bool,
    service: bool,
) -> Result<(), super::TopologyError> {
    if let Some(shape) = shape {
        topo.shape = shape;
        if shape == Shape::Routed {
            topo.underlay =
                IpNet::V4(Ipv4Net::new(Ipv4Addr::new(10, 250, 0, 0), 16).unwrap_or_default());
            for (i, node) in topo.nodes.iter_mut().enumerate() {
                let n = u8::try_from(i + 1).unwrap_or(u8::MAX);
                node.address = IpAddr::from([10, 250, n, 10]);
            }
        }
    }
    if vxlan {
        topo.routing = Routing::Vxlan;
    }
    if service && topo.service.is_none() {
        topo.service = Some(ServiceSpec::default());
    }
    topo.validate(std::path::Path::new("--shape/--vxlan/--service"))
}

/// Checks what the shape, the overlay and the Service require of the whole
/// topology: `(field, message)`.
pub fn check_topology(topo: &Topology) -> Result<(), (&'static str, String)> {
    match topo.shape {
        Shape::L2 => {}
        Shape::Routed => {
            if topo.underlay.prefix_len() > SUBNET_PREFIX - 1 {
                return Err((
                    "underlay",
                    format!(
                        "shape = \"routed\" with underlay = {}: use a /23 or larger (e.g. 10.250.0.0/16); each /24 in it is a subnet behind the router",
                        topo.underlay
                    ),
                ));
            }
            if let Some(ext) = &topo.external {
                check_node_address(topo, ext.address).map_err(|m| ("external", m))?;
            }
        }
        Shape::Nat => {
            let nat = nat_network();
            let clash = std::iter::once(&topo.underlay)
                .chain(topo.cluster_cidr.iter())
                .chain(topo.nodes.iter().flat_map(|n| n.pod_cidr.iter()))
                .find(|c| crate::connectivity::diagnosis::overlaps(c, &nat));
            if let Some(c) = clash {
                return Err((
                    "shape",
                    format!("shape = \"nat\": {c} overlaps the NAT network {nat}"),
                ));
            }
        }
    }
    check_vxlan(topo)?;
    check_service(topo)?;
    Ok(())
}

/// In a routed underlay the first address of each /24 is the router's.
pub fn check_node_address(topo: &Topology, addr: IpAddr) -> Result<(), String> {
    if topo.shape == Shape::Routed {
        if let Some(router) = router_address(addr) {
            if router == addr {
                return Err(format!(
                    "address {addr} is the router's address in its subnet {} (shape = \"routed\")",
                    subnet_of(addr).map(|s| s.to_string()).unwrap_or_default()
                ));
            }
        }
    }
    Ok(())
}

/// The /24 an address is in (routed underlays).
pub fn subnet_of(addr: IpAddr) -> Option<IpNet> {
    IpNet::new(addr, SUBNET_PREFIX).ok().map(|n| n.trunc())
}

/// The router's address in `addr`'s /24.
pub fn router_address(addr: IpAddr) -> Option<IpAddr> {
    let net = subnet_of(addr)?;
    net.hosts().next()
}

/// The prefix length of node (and external) addresses.
pub fn node_prefix(topo: &Topology) -> u8 {
    match topo.shape {
        Shape::Routed => SUBNET_PREFIX,
        _ => topo.underlay.prefix_len(),
    }
}

/// Bytes VXLAN adds to every packet on an IPv4 underlay.
pub const OVERHEAD: u32 = 50;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VxlanSpec {
    /// VXLAN network identifier (flannel's default: 1).
    #[serde(default = "default_vni")]
    pub vni: u32,
    /// UDP port (flannel's and Linux's default: 8472; IANA: 4789).
    #[serde(default = "default_port")]
    pub port: u16,
    /// The pods' MTU (default: the underlay MTU less 50). Setting it to the
    /// underlay MTU reproduces an overlay whose pod MTU was not reduced.
    #[serde(default)]
    pub pod_mtu: Option<u32>,
}

impl Default for VxlanSpec {
    fn default() -> Self {
        VxlanSpec {
            vni: default_vni(),
            port: default_port(),
            pod_mtu: None,
        }
    }
}

fn default_vni() -> u32 {
    1
}
fn default_port() -> u16 {
    8472
}

/// The pods' MTU of a topology.
pub fn pod_mtu(topo: &Topology) -> u32 {
    if topo.routing != Routing::Vxlan {
        return topo.mtu;
    }
    topo.vxlan
        .as_ref()
        .and_then(|v| v.pod_mtu)
        .unwrap_or(topo.mtu.saturating_sub(OVERHEAD))
}

/// What `routing = "vxlan"` and `[vxlan]` require.
fn check_vxlan(topo: &Topology) -> Result<(), (&'static str, String)> {
    let spec = topo.vxlan.clone().unwrap_or_default();
    if !(1..=0xff_ffff).contains(&spec.vni) {
        return Err((
            "vxlan",
            format!("vxlan vni = {}: use 1..16777215", spec.vni),
        ));
    }
    if spec.port == 0 {
        return Err(("vxlan", "vxlan port = 0: use 1..65535".into()));
    }
    if topo.routing == Routing::Vxlan {
        let mtu = pod_mtu(topo);
        if !(576..=9000).contains(&mtu) {
            return Err((
                "mtu",
                format!("routing = \"vxlan\": the pods' MTU would be {mtu}; use an underlay mtu of 626 or more"),
            ));
        }
        if topo
            .nodes
            .iter()
            .any(|n| n.pod_cidr.iter().any(|c| c.addr().is_ipv6()))
        {
            return Err((
                "routing",
                "routing = \"vxlan\" carries IPv4 pod CIDRs only (the lab's VXLAN underlay is IPv4)".into(),
            ));
        }
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// The ClusterIP of `web`; the per-backend Services take the next ones.
    #[serde(default = "default_cluster_ip")]
    pub cluster_ip: Ipv4Addr,
    /// How many nodes carry a backend (their first pod); default: all.
    #[serde(default)]
    pub backends: Option<usize>,
}

impl Default for ServiceSpec {
    fn default() -> Self {
        ServiceSpec {
            cluster_ip: default_cluster_ip(),
            backends: None,
        }
    }
}

fn default_cluster_ip() -> Ipv4Addr {
    Ipv4Addr::new(10, 96, 0, 10)
}

/// What `[service]` requires.
fn check_service(topo: &Topology) -> Result<(), (&'static str, String)> {
    let Some(spec) = &topo.service else {
        return Ok(());
    };
    let ip = IpAddr::V4(spec.cluster_ip);
    let last = u32::from(spec.cluster_ip).checked_add(topo.nodes.len() as u32 + 1);
    if last.is_none() || ip.is_unspecified() {
        return Err((
            "service",
            format!("cluster_ip {ip}: no room for the Services"),
        ));
    }
    let clash = std::iter::once(&topo.underlay)
        .chain(topo.cluster_cidr.iter())
        .find(|c| c.contains(&ip));
    if let Some(c) = clash {
        return Err((
            "service",
            format!("cluster_ip {ip} is inside {c}: ClusterIPs come from a range of their own"),
        ));
    }
    if spec.backends == Some(0) {
        return Err(("service", "backends = 0: a Service needs a backend".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_mtu_leaves_room_for_the_encapsulation() {
        let mut topo = Topology::generated(2, 1).expect("topology");
        assert_eq!(pod_mtu(&topo), 1500);
        topo.routing = Routing::Vxlan;
        assert_eq!(pod_mtu(&topo), 1450);
        topo.vxlan = Some(VxlanSpec {
            pod_mtu: Some(1500),
            ..VxlanSpec::default()
        });
        assert_eq!(pod_mtu(&topo), 1500);
    }

    #[test]
    fn vni_is_checked() {
        let text = "routing = \"vxlan\"\n[vxlan]\nvni = 0\n[[node]]\nname = \"a\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n";
        let err = Topology::parse(text, std::path::Path::new("t.toml")).expect_err("refused");
        assert!(err.to_string().contains("vni"), "{err}");
    }

    #[test]
    fn a_cluster_ip_inside_the_cluster_cidr_is_refused() {
        let text = "[service]\ncluster_ip = \"10.244.9.9\"\n[[node]]\nname = \"a\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n";
        let err = Topology::parse(text, std::path::Path::new("t.toml")).expect_err("refused");
        assert!(err.to_string().contains("cluster_ip"), "{err}");
    }

    #[test]
    fn routed_needs_room_for_subnets() {
        let text = "shape = \"routed\"\n[[node]]\nname = \"a\"\naddress = \"10.250.0.2\"\npod_cidr = [\"10.244.1.0/24\"]\n";
        let err = Topology::parse(text, std::path::Path::new("t.toml")).expect_err("refused");
        assert!(err.to_string().contains("/23 or larger"), "{err}");
    }
}

/// A Service as kube-proxy's iptables chains hold it on a captured node
/// (`KUBE-SERVICES` → `KUBE-SVC-…` → `KUBE-SEP-…` DNAT), read by
/// `lab/kube_proxy.rs`; a replay (`lab up --capture`) keeps the union over
/// its nodes here, and `service/cluster-ip` probes each one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeService {
    /// `namespace/name:port` from kube-proxy's comment, else the
    /// `KUBE-SVC-…` chain's name (nft prints no comments).
    pub name: String,
    /// The `KUBE-SVC-…` chain.
    pub chain: String,
    pub cluster_ip: IpAddr,
    /// `tcp`, `udp` or `sctp`.
    pub proto: String,
    pub port: u16,
    /// In the order the `KUBE-SVC-…` chain jumps to them.
    pub endpoints: Vec<KubeEndpoint>,
}

/// One `KUBE-SEP-…` chain of a [`KubeService`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeEndpoint {
    pub chain: String,
    /// Its DNAT target; `None`: the chain has no DNAT rule.
    pub dnat: Option<std::net::SocketAddr>,
}
