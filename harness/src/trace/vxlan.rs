//! A packet that leaves by a VXLAN device: the next hop's MAC (a
//! permanent neighbour, as flannel makes) and the FDB entry that give the
//! remote VTEP ([`encapsulate`]); the routing walk (`walk.rs`) walks the
//! outer packet like any other (its hops marked `outer`) to the namespace
//! that owns the VTEP, where the inner packet arrives on that namespace's
//! VXLAN device of the same VNI and port ([`decapsulate`]). This file
//! calls nothing of the walk but [`super::ports::died`], the end every
//! named death takes.

use super::{ports, End, Hop, World};
use crate::model::{Link, LinkKind};
use std::net::IpAddr;

/// What the VXLAN device of the sending namespace does with the inner
/// packet: its hop, and the outer packet to walk (from `local` to `vtep`).
pub(crate) struct Encapsulation {
    pub hop: Hop,
    pub local: Option<IpAddr>,
    pub vtep: IpAddr,
    pub vni: u32,
    /// The outer packet's UDP destination port.
    pub port: u16,
}

/// The inner packet leaves `ns` by the VXLAN device `dev` toward `nexthop`:
/// the remote VTEP, or the neighbour or FDB entry that is missing or wrong.
pub(crate) fn encapsulate(
    world: &World,
    ns: &str,
    dev: &Link,
    nexthop: IpAddr,
) -> Result<Encapsulation, End> {
    let vx = dev.vxlan.as_ref().ok_or_else(|| {
        End::Inconclusive(format!(
            "{ns}: {} has no VXLAN attributes in the model",
            dev.name
        ))
    })?;
    let here = world
        .namespace(ns)
        .ok_or_else(|| End::Inconclusive(format!("{ns} is not in the model")))?;
    let Some(mac) = here
        .neighbours
        .iter()
        .find(|n| n.dev == dev.name && n.addr == nexthop)
        .and_then(|n| n.mac.clone())
    else {
        return Err(ports::died(
            ns,
            "neighbour-missing",
            &format!("neighbour {nexthop} dev {}", dev.name),
            &format!("no permanent neighbour for {nexthop} on {} (nolearning VXLAN: nothing resolves it)", dev.name),
        ));
    };
    let zeros = "00:00:00:00:00:00";
    let fdb = here
        .fdb
        .iter()
        .filter(|f| f.dev == dev.name)
        .find(|f| f.mac.eq_ignore_ascii_case(&mac))
        .or_else(|| {
            here.fdb
                .iter()
                .find(|f| f.dev == dev.name && f.mac == zeros)
        });
    let Some(vtep) = fdb.and_then(|f| f.dst) else {
        return Err(ports::died(
            ns,
            "vxlan-fdb-missing",
            &format!("fdb {mac} dev {}", dev.name),
            &format!(
                "no FDB entry on {} gives a remote VTEP for {mac} (next hop {nexthop})",
                dev.name
            ),
        ));
    };
    let inner_owner = world.owner(nexthop);
    let vtep_owner = world.owner(vtep);
    if inner_owner.is_some() && vtep_owner != inner_owner {
        return Err(ports::died(
            ns,
            "vxlan-fdb-wrong",
            &format!("fdb {mac} dev {} dst {vtep}", dev.name),
            &format!(
                "the next hop {nexthop} is on {}, but the FDB sends {mac} to {vtep} ({})",
                inner_owner.as_deref().unwrap_or("?"),
                vtep_owner.as_deref().unwrap_or("nobody's")
            ),
        ));
    }
    let hop = Hop {
        namespace: ns.to_string(),
        iif: None,
        oif: Some(dev.name.clone()),
        next_hop: None,
        decision: format!(
            "vxlan {} vni {}: encapsulate to VTEP {vtep}",
            dev.name, vx.vni
        ),
        evidence: format!("neighbour {nexthop} lladdr {mac}; fdb {mac} dst {vtep}"),
    };
    Ok(Encapsulation {
        hop,
        local: vx.local,
        vtep,
        vni: vx.vni,
        port: vx.port,
    })
}

/// The outer packet arrived in `remote`: the VXLAN device of the same VNI
/// and UDP port there, where the inner packet enters; or the device that
/// differs in one of them (the kernel hands the packet to the device
/// listening on its port, which drops a VNI not its own), or none at all.
pub(crate) fn decapsulate(
    remote: &str,
    world: &World,
    (vni, port): (u32, u16),
) -> Result<(String, String), End> {
    let vxlans: Vec<(&Link, &crate::model::Vxlan)> = world
        .namespace(remote)
        .map(|n| {
            n.links
                .iter()
                .filter(|l| l.kind == LinkKind::Vxlan)
                .filter_map(|l| Some((l, l.vxlan.as_ref()?)))
                .collect()
        })
        .unwrap_or_default();
    let matching = vxlans.iter().find(|(_, x)| x.vni == vni && x.port == port);
    let inner_dev = match matching {
        Some((l, _)) => *l,
        None => {
            let on_port = vxlans.iter().find(|(_, x)| x.port == port);
            let of_vni = vxlans.iter().find(|(_, x)| x.vni == vni);
            return Err(match (on_port, of_vni) {
                (Some((l, x)), _) => ports::died(
                    remote,
                    "vxlan-vni-mismatch",
                    &format!("link {} vni {}", l.name, x.vni),
                    &format!(
                        "the outer packet carries VNI {vni} to UDP port {port}, where {remote}'s \
                         {} listens with VNI {}: it takes no other VNI",
                        l.name, x.vni
                    ),
                ),
                (None, Some((l, x))) => ports::died(
                    remote,
                    "vxlan-port-mismatch",
                    &format!("link {} dstport {}", l.name, x.port),
                    &format!(
                        "the outer packet is sent to UDP port {port}, but {remote}'s {} of VNI \
                         {vni} listens on port {}",
                        l.name, x.port
                    ),
                ),
                (None, None) => ports::died(
                    remote,
                    "vxlan-no-device",
                    &format!("vni {vni}"),
                    &format!(
                        "the outer packet reaches {remote}, which has no VXLAN device of VNI {vni}"
                    ),
                ),
            });
        }
    };
    if !inner_dev.up {
        return Err(ports::died(
            remote,
            "link-down",
            &format!("link {}", inner_dev.name),
            &format!("{} is down", inner_dev.name),
        ));
    }
    Ok((remote.to_string(), inner_dev.name.clone()))
}
