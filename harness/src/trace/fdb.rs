//! A bridge port that does not learn: the frame for the next hop goes out
//! of it only by its FDB entry or, lacking one, by unknown-unicast
//! flooding; with flooding off too, the bridge sends it nowhere. Read live
//! (the FDB's learned entries and the port's flood flag are operational
//! state, not in the model).

use super::{Death, End, World};
use crate::model::Link;
use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::{InfoBridgePort, InfoPortData, LinkAttribute, LinkInfo};
use rtnetlink::packet_route::neighbour::NeighbourAttribute;
use std::net::IpAddr;

/// Whether `bridge` of `ns` can send the frame for `nexthop` out of
/// `port`: always, unless the port neither learns nor floods and the FDB
/// has no entry there for the next hop's MAC.
pub(crate) fn reaches(
    world: &World,
    ns: &str,
    bridge: &str,
    port: &Link,
    nexthop: IpAddr,
) -> Result<(), End> {
    if port.port.as_ref().is_none_or(|p| p.learning) {
        return Ok(());
    }
    let Some((_, mac)) = world.mac_of(nexthop) else {
        return Ok(());
    };
    let Some(file) = world.file(ns) else {
        return Ok(());
    };
    let (name, wanted) = (port.name.clone(), mac.clone());
    let live = cnilab_net::netns::netlink_job(file, move |h| async move {
        let Some(msg) = h.link().get().match_name(name).execute().try_next().await? else {
            return Ok(None);
        };
        let flood = unicast_flood(&msg.attributes);
        let index = msg.header.index;
        let entries = crate::model::read::fdb_messages(&h).await?;
        let known = entries.iter().any(|m| {
            m.header.ifindex == index
                && m.attributes.iter().any(|a| {
                    matches!(a, NeighbourAttribute::LinkLayerAddress(b)
                        if cnilab_net::nl::mac_string(b).eq_ignore_ascii_case(&wanted))
                })
        });
        Ok(Some((flood, known)))
    });
    match live {
        Ok(Some((false, false))) => {
            let mut d = Death::new(
                ns,
                "bridge-fdb-missing",
                &format!("port {} of {bridge}", port.name),
                &format!(
                    "{} neither learns nor floods unknown unicast, and {bridge}'s FDB has no \
                     entry for {mac} (the next hop {nexthop}) on it: the frame goes nowhere",
                    port.name
                ),
            );
            d.check = format!(
                "bridge -d link show dev {}; bridge fdb show br {bridge}",
                port.name
            );
            Err(End::Died(Box::new(d)))
        }
        _ => Ok(()),
    }
}

/// A bridge port's unknown-unicast flood flag (on when not said).
fn unicast_flood(attrs: &[LinkAttribute]) -> bool {
    attrs
        .iter()
        .filter_map(|a| match a {
            LinkAttribute::LinkInfo(infos) => Some(infos),
            _ => None,
        })
        .flatten()
        .filter_map(|i| match i {
            LinkInfo::PortData(InfoPortData::BridgePort(p)) => Some(p),
            _ => None,
        })
        .flatten()
        .find_map(|a| match a {
            InfoBridgePort::UnicastFlood(on) => Some(*on),
            _ => None,
        })
        .unwrap_or(true)
}
