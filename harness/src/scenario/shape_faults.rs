//! Scenario faults of the underlay shapes, the VXLAN overlay and the
//! Services (see `lab/scenarios/`), each with its undo.

use super::file::Fault;
use crate::lab::topology::{NodeSpec, Routing};
use crate::lab::{
    base::LabError,
    built::Lab,
    routes::{install_static_routes, nodes_file},
};
use crate::lab::{services, vxlan};
use crate::lab::{topology::shapes::Shape, underlay};
use std::net::IpAddr;

/// How to undo one of these faults.
pub(crate) enum ShapeUndo {
    /// Restore the router's routes (host-gw attempted).
    RouterRoutes,
    /// Republish the real node list.
    NodesFile,
    /// Back to the pods' previous MTU.
    PodMtu { mtu: u32, spec: Option<u32> },
    /// Re-program the VXLAN entries of these nodes.
    VxlanReprogram { nodes: Vec<String> },
    /// Re-install the Service rules (with hairpin masquerade) on a node.
    Services { node: String },
    /// Hairpin mode back on a bridge port.
    HairpinOn { node: String, port: String },
}

fn index(lab: &Lab, node: &str) -> Result<usize, LabError> {
    lab.node_index(node)
}

fn require(ok: bool, what: &str) -> Result<(), LabError> {
    if ok {
        Ok(())
    } else {
        Err(LabError::Setup(what.to_string()))
    }
}

/// The first pod's bridge port on node `i` (the Service backend's).
fn backend_port(lab: &Lab, i: usize) -> Result<String, LabError> {
    services::bridge_port(lab, i, 0).ok_or_else(|| {
        LabError::Unsupported(format!(
            "the fault needs a bridge port for the first pod on {} and the plugin attached it without a bridge (the bundled cnilab-bridge has one)",
            lab.nodes[i].spec.name
        ))
    })
}

pub(crate) fn apply(lab: &mut Lab, fault: &Fault) -> Result<ShapeUndo, LabError> {
    Ok(match fault {
        Fault::HostGw {} => {
            require(
                lab.topo.shape == Shape::Routed && lab.topo.routing == Routing::Static,
                "fault host-gw needs shape = \"routed\" and routing = \"static\"",
            )?;
            underlay::delete_router_routes(lab)?;
            // What flannel's host-gw backend does: a route via each peer's
            // address. Across the router the kernel refuses every one
            // (ENETUNREACH); flannel logs the error and keeps running.
            let specs = lab.topo.nodes.clone();
            for node in &lab.nodes {
                let _ = install_static_routes(&node.ns, &node.spec, &specs);
            }
            ShapeUndo::RouterRoutes
        }
        Fault::NatInternalIp {} => {
            require(
                lab.topo.shape == Shape::Nat && lab.topo.routing == Routing::Agent,
                "fault nat-internal-ip needs shape = \"nat\" and routing = \"agent\"",
            )?;
            let natted: Vec<NodeSpec> = lab
                .topo
                .nodes
                .iter()
                .map(|n| NodeSpec {
                    address: IpAddr::V4(underlay::NAT_ADDRESS),
                    ..n.clone()
                })
                .collect();
            let path = lab.nodes_file_path();
            crate::util::write_replacing(&path, nodes_file(&natted).as_bytes())
                .map_err(|e| LabError::Setup(format!("{}: {e}", path.display())))?;
            ShapeUndo::NodesFile
        }
        Fault::PodMtu { mtu } => {
            require(
                (576..=9000).contains(mtu),
                "fault pod-mtu: mtu must be in 576..9000",
            )?;
            let before = lab.topo.pod_mtu();
            let spec = lab.topo.vxlan.as_ref().and_then(|v| v.pod_mtu);
            vxlan::set_pod_mtu(lab, *mtu)?;
            ShapeUndo::PodMtu { mtu: before, spec }
        }
        Fault::VxlanRejoin { node, missed_by } => {
            require(
                lab.topo.routing == Routing::Vxlan,
                "fault vxlan-rejoin needs routing = \"vxlan\"",
            )?;
            let i = index(lab, node)?;
            let spec = lab.nodes[i].spec.clone();
            let pods = lab.nodes[i].pods.len();
            lab.remove_node(node)?;
            lab.add_node(spec.clone(), pods)?;
            // The nodes that missed the update have the neighbour entry (a
            // new MAC) but no FDB entry sending it to the node's address.
            for m in missed_by {
                let k = index(lab, m)?;
                vxlan::forget_fdb(lab, k, spec.address)?;
            }
            ShapeUndo::VxlanReprogram {
                nodes: missed_by.clone(),
            }
        }
        Fault::DnatMissing { node } => {
            require(
                lab.topo.service.is_some(),
                "fault dnat-missing needs a [service]",
            )?;
            let i = index(lab, node)?;
            services::remove_node(lab, i)?;
            ShapeUndo::Services { node: node.clone() }
        }
        Fault::HairpinOff { node } => {
            let i = index(lab, node)?;
            let port = backend_port(lab, i)?;
            underlay::batch(
                &lab.nodes[i].ns,
                "ip",
                &format!("link set {port} type bridge_slave hairpin off\n"),
            )?;
            ShapeUndo::HairpinOn {
                node: node.clone(),
                port,
            }
        }
        Fault::HairpinMasqueradeMissing { node } => {
            require(
                lab.topo.service.is_some(),
                "fault hairpin-masquerade-missing needs a [service]",
            )?;
            let i = index(lab, node)?;
            services::install_node(lab, i, false)?;
            ShapeUndo::Services { node: node.clone() }
        }
        other => return Err(LabError::Setup(format!("not a shape fault: {other:?}"))),
    })
}

pub(crate) fn undo(lab: &mut Lab, u: ShapeUndo) -> Result<(), LabError> {
    match u {
        ShapeUndo::RouterRoutes => underlay::install_router_routes(lab),
        ShapeUndo::NodesFile => {
            let specs = lab.topo.nodes.clone();
            lab.write_nodes_file(&specs)
        }
        ShapeUndo::PodMtu { mtu, spec } => {
            vxlan::set_pod_mtu(lab, mtu)?;
            if let Some(v) = lab.topo.vxlan.as_mut() {
                v.pod_mtu = spec;
            }
            Ok(())
        }
        ShapeUndo::VxlanReprogram { nodes } => {
            for n in nodes {
                let i = index(lab, &n)?;
                vxlan::reprogram(lab, i)?;
            }
            Ok(())
        }
        ShapeUndo::Services { node } => {
            let i = index(lab, &node)?;
            services::install_node(lab, i, true)
        }
        ShapeUndo::HairpinOn { node, port } => {
            let i = index(lab, &node)?;
            underlay::batch(
                &lab.nodes[i].ns,
                "ip",
                &format!("link set {port} type bridge_slave hairpin on\n"),
            )
        }
    }
}
