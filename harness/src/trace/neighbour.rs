//! After a probe that did not arrive: the next hop the kernel could not
//! resolve, and what on the neighbour's side keeps it from resolving
//! (`arp_ignore`, `arp_announce`, a queue that drops its requests).

use super::{counters, Death, Hop, World};
use std::net::IpAddr;

/// After a probe that did not arrive: the first hop whose next hop the
/// kernel could not resolve (its neighbour entry INCOMPLETE or FAILED).
pub(super) fn unresolved(world: &World, hops: &[Hop], src: Option<IpAddr>) -> Option<Death> {
    use rtnetlink::packet_route::neighbour::NeighbourState;
    hops.iter().enumerate().find_map(|(i, h)| {
        let (oif, next) = (h.oif.as_deref()?, h.next_hop?);
        let file = world.file(&h.namespace)?;
        let oif_name = oif.to_string();
        let state = cnilab_net::netns::netlink_job(file, move |handle| async move {
            let index = cnilab_net::nl::link_by_name(&handle, &oif_name)
                .await?
                .map(|l| l.index);
            let all = cnilab_net::nl::neighbours(&handle).await?;
            Ok(all
                .into_iter()
                .find(|n| n.addr == next && Some(n.index) == index)
                .map(|n| n.message.header.state))
        })
        .ok()??;
        let failed = matches!(state, NeighbourState::Incomplete | NeighbourState::Failed);
        failed.then(|| {
            let owner = world.owner(next).unwrap_or_else(|| "nobody".into());
            if let Some(d) = arp_ignored(world, &owner, next) {
                return d;
            }
            if let Some(d) = arp_announced(world, h, (&owner, next), src) {
                return d;
            }
            if let Some(d) = bridge_filtered(world, &hops[i..], next) {
                return d;
            }
            // The device and, for a bridge, its ports (where a request leaves).
            let devs: Vec<String> = std::iter::once(oif.to_string())
                .chain(
                    world
                        .ports(&h.namespace, oif)
                        .iter()
                        .map(|l| l.name.clone()),
                )
                .collect();
            if let Some(d) = dropping_queue(world, (&h.namespace, file), &devs, oif, next, state) {
                return d;
            }
            let announce = world.sysctl(&h.namespace, &format!("net/ipv4/conf/{oif}/arp_announce"));
            let mut d = Death::new(
                &h.namespace,
                "neighbour-failed",
                &format!("neighbour {next} dev {oif}"),
                &format!(
                    "{next} on {oif} is {state}: {owner} does not answer ARP/NDP for it \
                     (arp_announce on {oif}: {announce})"
                ),
            );
            d.check = format!("ip neigh show {next} dev {oif}");
            d
        })
    })
}

/// A queue that drops what resolving `next` on `oif` needs: on the way out
/// (`devs`: the device and, for a bridge, its ports, where the requests
/// leave) or on the way back (the veth peer of `oif`, where the answers
/// leave its owner's side).
fn dropping_queue(
    world: &World,
    (ns, file): (&str, &std::fs::File),
    devs: &[String],
    oif: &str,
    next: IpAddr,
    state: impl std::fmt::Display,
) -> Option<Death> {
    let out = counters::dropping_qdisc(ns, file, devs).map(|(object, drops, check)| {
        let why = format!(
            "{next} on {oif} stays {state}: {object} has dropped {drops} packets, \
             its ARP/NDP requests among them"
        );
        (ns.to_string(), object, why, check)
    });
    let back = || {
        let (peer_ns, peer) = world.peer(ns, oif)?;
        let peer_file = world.file(&peer_ns)?;
        let (object, drops, check) =
            counters::dropping_qdisc(&peer_ns, peer_file, std::slice::from_ref(&peer))?;
        let why = format!(
            "{next} on {oif} stays {state}: the answers leave {peer_ns} through {peer}, \
             where {object} has dropped {drops} packets"
        );
        Some((peer_ns, object, why, check))
    };
    let (at, object, why, check) = out.or_else(back)?;
    let mut d = Death::new(&at, "qdisc-drop", &object, &why);
    d.check = check;
    Some(d)
}

/// The owner of an IPv4 next hop that ignores every ARP request
/// (arp_ignore 8, on `all` or on its link): what keeps the neighbour from
/// resolving.
fn arp_ignored(world: &World, owner: &str, ip: IpAddr) -> Option<Death> {
    if !ip.is_ipv4() {
        return None;
    }
    let dev = world.holder(owner, ip)?.name.clone();
    let value = |on: &str| world.sysctl(owner, &format!("net/ipv4/conf/{on}/arp_ignore"));
    let (all, own) = (value("all"), value(&dev));
    let key = if all == "8" {
        "net/ipv4/conf/all/arp_ignore".to_string()
    } else if own == "8" {
        format!("net/ipv4/conf/{dev}/arp_ignore")
    } else {
        return None;
    };
    let mut d = Death::new(
        owner,
        "arp-ignore",
        &key,
        &format!("{owner} ignores every ARP request for {ip} (arp_ignore all={all} {dev}={own})"),
    );
    d.check = format!("sysctl {}", key.replace('/', "."));
    Some(d)
}

/// An IPv4 next hop whose owner answers only ARP requests from its own
/// subnet (arp_ignore 2), asked by `hop`'s namespace with a sender address
/// outside it (`src`, the packet's source, when that namespace holds it):
/// the namespace's arp_announce below 2 lets the request carry the
/// packet's own source (a route's `src` on another link) instead of an
/// address of the link it leaves by.
fn arp_announced(
    world: &World,
    hop: &Hop,
    (owner, ip): (&str, IpAddr),
    src: Option<IpAddr>,
) -> Option<Death> {
    let (ns, oif, src) = (&hop.namespace, hop.oif.as_deref()?, src?);
    let dev = world.holder(owner, ip)?;
    let subnet = dev.addresses.iter().find(|a| a.addr() == ip)?.trunc();
    let number = |v: String| v.parse::<u8>().unwrap_or(0);
    let ignore = |on: &str| number(world.sysctl(owner, &format!("net/ipv4/conf/{on}/arp_ignore")));
    let announce = |on: &str| number(world.sysctl(ns, &format!("net/ipv4/conf/{on}/arp_announce")));
    let outside = !subnet.contains(&src) && world.owns(ns, src);
    let (all, own) = (announce("all"), announce(oif));
    if !ip.is_ipv4() || !outside || ignore("all").max(ignore(&dev.name)) != 2 || all.max(own) >= 2 {
        return None;
    }
    let key = format!("net/ipv4/conf/{oif}/arp_announce");
    let mut d = Death::new(
        ns,
        "arp-announce",
        &key,
        &format!(
            "{ns} asks for {ip} on {oif} from {src} (arp_announce all={all} {oif}={own}), and \
             {owner} answers only requests from {subnet} (arp_ignore 2 on {})",
            dev.name
        ),
    );
    d.check = format!("sysctl {}", key.replace('/', "."));
    Some(d)
}

/// A bridge the ARP/NDP requests cross (a bridge hop of the walk from the
/// asking namespace on) whose bridge-family chain on the forward or
/// prerouting hook has policy drop and no rule that accepts: it drops the
/// requests, and the probe behind them. Named as the chain's policy, as
/// the firewall trace names the probe's own drop there.
fn bridge_filtered(world: &World, hops: &[Hop], next: IpAddr) -> Option<Death> {
    hops.iter().filter(|h| h.crosses_bridge()).find_map(|h| {
        let tables = &world.namespace(&h.namespace)?.nftables;
        tables
            .iter()
            .filter(|t| t.family == "bridge")
            .find_map(|t| {
                let (chain, policy) = dropping_chain(&t.text)?;
                let object = format!("bridge {} {chain} policy {policy}", t.name);
                let mut d = Death::new(
                    &h.namespace,
                    "firewall-policy",
                    &object,
                    &format!(
                        "chain {chain} policy {policy}: no rule accepted the ARP/NDP requests \
                         for {next}, which cross its bridge, so {next} never resolves"
                    ),
                );
                d.check = format!("nft -a list chain bridge {} {chain}", t.name);
                Some(d)
            })
    })
}

/// The first chain of a table's text on the forward or prerouting hook
/// whose policy drops and none of whose rules accepts: (chain, policy).
fn dropping_chain(text: &str) -> Option<(String, &'static str)> {
    let mut chain: Option<String> = None;
    let mut dropping = false;
    let mut accepts = false;
    for line in text
        .lines()
        .map(str::trim)
        .chain(std::iter::once("chain -"))
    {
        if let Some(name) = line.strip_prefix("chain ") {
            if let (Some(c), true, false) = (&chain, dropping, accepts) {
                return Some((c.clone(), "drop"));
            }
            chain = Some(name.trim_end_matches(" {").to_string());
            (dropping, accepts) = (false, false);
        } else if line.starts_with("type filter hook") {
            let hooked = line.contains("hook forward") || line.contains("hook prerouting");
            dropping = hooked && line.contains("policy drop");
        } else if line.ends_with("accept") {
            accepts = true;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::dropping_chain;

    #[test]
    fn a_forward_chain_that_drops_and_accepts_nothing_is_found() {
        let text = "table bridge f {\n\tchain input {\n\t\ttype filter hook input priority filter; policy drop;\n\t}\n\tchain forward {\n\t\ttype filter hook forward priority filter; policy drop;\n\t}\n}\n";
        assert_eq!(dropping_chain(text), Some(("forward".into(), "drop")));
        let accepting = text.replace(
            "policy drop;\n\t}\n}",
            "policy drop;\n\t\tether type arp accept\n\t}\n}",
        );
        assert_eq!(dropping_chain(&accepting), None);
        let open = text.replace(
            "forward priority filter; policy drop",
            "forward priority filter; policy accept",
        );
        assert_eq!(dropping_chain(&open), None);
    }
}
