//! `routing = "vxlan"`: a kernel VXLAN overlay, programmed by the lab
//! (statically, from the topology) the way flannel's vxlan backend does it
//! (the model compiles it, `model/compile.rs`, and `model::apply` makes it
//! with the lab and as a node joins or leaves; here: faults, diagnoses):
//!
//! - one VXLAN device per node (`vxlan0`, VNI and UDP port from `[vxlan]`,
//!   `local` = the node's underlay address, `dev eth0`, `nolearning`), with
//!   the node's pod CIDR network address as a /32 and MTU = uplink − 50;
//! - for every other node: a permanent neighbour entry (its VTEP address →
//!   its VTEP MAC), an FDB entry (its VTEP MAC → its underlay address) and a
//!   route `podCIDR via VTEP address dev vxlan0 onlink`;
//! - the pods' MTU is the underlay's less 50 bytes (outer IPv4 20 + UDP 8 +
//!   VXLAN 8 + inner Ethernet 14).
//!
//! The VXLAN packets travel over the lab's own underlay (eth0 in the node
//! namespaces), never over a host interface.

use super::base::{setup, LabError};
use super::built::Lab;
use super::facts::NodeFacts;
use super::topology::shapes::OVERHEAD;
use super::topology::shapes::{pod_mtu, VxlanSpec};
use super::topology::Routing;
use super::underlay::batch;
use crate::connectivity::Diagnosis;
use crate::connectivity::{ProbeOutcome, Proto};
use ipnet::IpNet;
use std::fmt::Write as _;
use std::net::IpAddr;

/// The VXLAN device in every node namespace.
pub const DEVICE: &str = "vxlan0";

/// The VTEP address of a node: its IPv4 pod CIDR's network address.
fn vtep_address(cidrs: &[IpNet]) -> Option<IpAddr> {
    cidrs
        .iter()
        .find(|c| c.addr().is_ipv4())
        .map(|c| c.trunc().addr())
}

/// Node `i`'s VTEP MAC, as the kernel chose it.
fn vtep_mac(lab: &Lab, i: usize) -> Result<String, LabError> {
    lab.nodes[i]
        .ns
        .links()?
        .into_iter()
        .find(|l| l.name == DEVICE)
        .and_then(|l| l.mac)
        .ok_or_else(|| setup(format!("{}: no {DEVICE}", lab.nodes[i].spec.name)))
}

/// Programs on node `i` the entries for peer `p` (neighbour, FDB, route).
fn program_peer(lab: &Lab, i: usize, p: usize, mac: &str) -> Result<(), LabError> {
    let peer = &lab.nodes[p].spec;
    let Some(vtep) = vtep_address(&peer.pod_cidr) else {
        return Ok(());
    };
    let mut ip = format!("neigh replace {vtep} lladdr {mac} dev {DEVICE} nud permanent\n");
    for c in peer.pod_cidr.iter().filter(|c| c.addr().is_ipv4()) {
        let _ = writeln!(
            ip,
            "route replace {} via {vtep} dev {DEVICE} onlink",
            c.trunc()
        );
    }
    let ns = &lab.nodes[i].ns;
    batch(
        ns,
        "bridge",
        &format!(
            "fdb replace {mac} dev {DEVICE} dst {} self permanent\n",
            peer.address
        ),
    )?;
    batch(ns, "ip", &ip)
}

/// Re-programs node `i`'s entries for every peer (the heal of a missed update).
pub fn reprogram(lab: &Lab, i: usize) -> Result<(), LabError> {
    for p in (0..lab.nodes.len()).filter(|p| *p != i) {
        let mac = vtep_mac(lab, p)?;
        program_peer(lab, i, p, &mac)?;
    }
    Ok(())
}

/// Node `i`'s FDB entries on its VXLAN device: `(mac, dst)`.
pub fn fdb(lab: &Lab, i: usize) -> Vec<(String, IpAddr)> {
    let out = lab.nodes[i]
        .ns
        .command("bridge")
        .args(["fdb", "show", "dev", DEVICE])
        .output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let mac = words.first()?.to_string();
            let dst = words
                .iter()
                .position(|w| *w == "dst")
                .and_then(|k| words.get(k + 1))?
                .parse()
                .ok()?;
            Some((mac, dst))
        })
        .collect()
}

/// Removes node `i`'s FDB entries that send to `dst`.
pub fn forget_fdb(lab: &Lab, i: usize, dst: IpAddr) -> Result<(), LabError> {
    let script: String = fdb(lab, i)
        .into_iter()
        .filter(|(_, d)| *d == dst)
        .map(|(mac, d)| format!("fdb del {mac} dev {DEVICE} dst {d} self\n"))
        .collect();
    if script.is_empty() {
        return Ok(());
    }
    batch(&lab.nodes[i].ns, "bridge", &script)
}

/// Sets the MTU of every pod interface (and the node side: veths and
/// bridge) on every node: what a plugin configured with `mtu`.
pub fn set_pod_mtu(lab: &mut Lab, mtu: u32) -> Result<(), LabError> {
    for node in &lab.nodes {
        let links = node.ns.links()?;
        let mut script = String::new();
        let veths: Vec<&str> = links
            .iter()
            .filter(|l| l.name != "eth0" && l.name != "lo" && l.name != DEVICE)
            .filter(|l| l.name != super::underlay::NAT_LINK)
            .map(|l| l.name.as_str())
            .collect();
        // Twice: a bridge follows its ports, so the order matters on the
        // way up; the second pass sets whatever the first could not.
        for name in veths.iter().chain(veths.iter()) {
            let _ = writeln!(script, "link set {name} mtu {mtu}");
        }
        super::underlay::batch_force(&node.ns, "ip", &script)?;
        for pod in &node.pods {
            batch(&pod.ns, "ip", &format!("link set eth0 mtu {mtu}\n"))?;
        }
    }
    let spec = lab.topo.vxlan.get_or_insert_with(VxlanSpec::default);
    spec.pod_mtu = Some(mtu);
    Ok(())
}

/// Diagnoses of the overlay: a pod MTU that leaves no room for the
/// encapsulation, and a peer's VTEP MAC without an FDB entry.
pub fn diagnose(lab: &Lab, facts: &[NodeFacts], o: &ProbeOutcome, out: &mut Vec<Diagnosis>) {
    if lab.topo.routing != Routing::Vxlan {
        return;
    }
    let spec = &o.spec;
    let (Some(a), Some(b)) = (spec.from.node, spec.to.node) else {
        return;
    };
    if a == b {
        return;
    }
    let pods = pod_mtu(&lab.topo);
    if spec.proto == Proto::Df {
        for f in [facts.get(a), facts.get(b)].into_iter().flatten() {
            let Some(dev) = f.vxlan_mtu else { continue };
            if pods > dev {
                out.push(Diagnosis {
                    id: "vxlan-mtu-overhead",
                    message: format!(
                        "pods use MTU {pods} but VXLAN encapsulation adds {OVERHEAD} bytes (outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14): {}'s {DEVICE} has MTU {dev} over eth0 MTU {}; full-size packets with DF set are dropped; set the pods' MTU to {dev} (flannel: FLANNEL_MTU)",
                        f.name,
                        f.uplink_mtu.map(|m| m.to_string()).unwrap_or_default()
                    ),
                });
            }
        }
    }
    for (from, to) in [(a, b), (b, a)] {
        let (Some(ff), Some(tf)) = (facts.get(from), facts.get(to)) else {
            continue;
        };
        let (Some(mac), Some(addr)) = (tf.vxlan_mac.as_deref(), tf.address) else {
            continue;
        };
        let has = ff
            .vxlan_fdb
            .iter()
            .any(|(m, d)| m.eq_ignore_ascii_case(mac) && *d == addr);
        if !has {
            out.push(Diagnosis {
                id: "vxlan-fdb-missing",
                message: format!(
                    "{} has no VXLAN FDB entry for {}'s VTEP MAC {mac} (dst {addr}) on {DEVICE}: encapsulated frames to {}'s pods have no underlay destination (a node that re-joined with a new VTEP and the update was missed); `bridge fdb append {mac} dev {DEVICE} dst {addr}` on {}",
                    ff.name, tf.name, tf.name, ff.name
                ),
            });
        }
    }
}

/// The VXLAN facts of node `i` (device MTU and MAC, FDB), empty without VXLAN.
pub fn facts(lab: &Lab, i: usize, f: &mut NodeFacts) {
    if lab.topo.routing != Routing::Vxlan {
        return;
    }
    let dev = lab.nodes[i]
        .ns
        .links()
        .ok()
        .and_then(|l| l.into_iter().find(|l| l.name == DEVICE));
    f.vxlan_mtu = dev.as_ref().and_then(|d| d.mtu);
    f.vxlan_mac = dev.and_then(|d| d.mac);
    f.vxlan_fdb = fdb(lab, i);
}
