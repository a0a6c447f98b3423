//! Why the walk died where it did, where the kernel's answer alone does
//! not say: a route lookup the kernel refused (RTM_GETROUTE answered with
//! an error: a martian source, the source being the namespace's own or the
//! way back leaving by another device; a source nobody holds; forwarding
//! off; a policy rule; a route whose type refuses; a destination nobody
//! routes; no route), a next hop the packet did not reach (the route's
//! device leads elsewhere, or nobody there owns it), and two ends behind
//! one bridge that answer as one: two veth peers holding the same address
//! (the bridge's node reaches whichever answered ARP last) or the same MAC
//! (the bridge's FDB follows whichever sent last), or an end that does not
//! hold the address it is known by. The twins are asked where no port of a
//! bridge leads to a next hop, where a namespace sends from an address the
//! kernel says is not its own, and where a packet arrived behind a bridge
//! (the kernel may have taken it to the twin).

use super::route::{self, Answer, Question};
use super::world::link_local;
use super::{policy, Death, End, Hop, World};
use crate::model::{LinkKind, Route, RouteType};
use ipnet::IpNet;
use std::net::IpAddr;

/// Names a failed lookup: reverse path, forwarding off, the route whose
/// type refused it, or no route.
pub(super) fn refusal(world: &World, ns: &str, q: &Question, code: i32, asked: &str) -> Death {
    use nix::libc::{EACCES, EHOSTUNREACH, EINVAL, ENETUNREACH, EXDEV};
    let (iif, dst) = (q.iif, q.dst);
    let errno = format!("{asked}: {}", route::errno_text(code));
    if let (EINVAL | EXDEV, Some(iif), Some(src)) = (code, iif, q.src) {
        if let Some(death) = martian_source(world, ns, iif, src, &errno) {
            return death;
        }
    }
    if let (None, Some(src)) = (iif, q.src) {
        if let Some(mut death) = unheld_source(world, ns, src) {
            death.evidence.push_str(&format!(" ({errno})"));
            return death;
        }
    }
    if let (EHOSTUNREACH, Some(iif)) = (code, iif) {
        for key in forwarding_keys(dst, iif) {
            if world.sysctl(ns, &key) == "0" {
                return Death::new(ns, "forwarding-off", &key, &format!("{errno}; {key} = 0"));
            }
        }
    }
    if let Some(d) = world
        .namespace(ns)
        .and_then(|n| policy::refusal(ns, n, q, &errno))
    {
        return d;
    }
    if let Some(r) = refusing_route(world, ns, dst) {
        let kind = match &r.kind {
            RouteType::Blackhole => "blackhole",
            RouteType::Unreachable => "unreachable",
            RouteType::Prohibit => "prohibit",
            _ => "route-refused",
        };
        return Death::new(
            ns,
            kind,
            &format!("route {kind} {} table {}", r.dst, r.table),
            &errno,
        );
    }
    if code == ENETUNREACH {
        if let Some(mut death) = unrouted(world, ns, dst) {
            death.evidence.push_str(&format!(" ({errno})"));
            return death;
        }
    }
    let cause = match code {
        ENETUNREACH => "no-route",
        EINVAL => "blackhole",
        EHOSTUNREACH => "unreachable",
        EACCES => "prohibit",
        _ => "route-refused",
    };
    Death::new(ns, cause, &format!("route to {dst}"), &errno)
}

/// A packet from `src` arriving on `iif` that the kernel refuses as a
/// martian source: `src` is an address of this namespace (accept_local
/// off), or the way back to `src` leaves by another device (rp_filter
/// strict) or by none (rp_filter loose).
fn martian_source(world: &World, ns: &str, iif: &str, src: IpAddr, errno: &str) -> Option<Death> {
    let file = world.file(ns)?;
    let back = route::get(
        file,
        &Question {
            dst: src,
            src: None,
            iif: None,
            mark: 0,
        },
    )
    .ok()?;
    let sysctl = |key: &str, dev: &str| world.sysctl(ns, &format!("net/ipv4/conf/{dev}/{key}"));
    let strictest = |key: &str| {
        let (all, dev) = (sysctl(key, "all"), sysctl(key, iif));
        (
            all.clone().max(dev.clone()),
            format!("all={all} {iif}={dev}"),
        )
    };
    if let Answer::Route { kind, .. } = &back {
        if kind == "local" {
            let key = format!("net/ipv4/conf/{iif}/accept_local");
            let (_, values) = strictest("accept_local");
            return Some(Death::new(
                ns,
                "accept-local",
                &key,
                &format!(
                    "{errno}; the source {src} is an address of {ns} itself and accept_local \
                     is off ({values})"
                ),
            ));
        }
    }
    let (rp, values) = strictest("rp_filter");
    let way_back = match &back {
        Answer::Route { oif, .. } => oif.clone(),
        Answer::Error(_) => None,
    };
    let refused = match rp.as_str() {
        "1" => way_back.as_deref() != Some(iif),
        "2" => way_back.is_none(),
        _ => false,
    };
    refused.then(|| {
        let back = way_back
            .map(|d| format!("leaves by {d}"))
            .unwrap_or_else(|| "has no route".into());
        let mut d = Death::new(
            ns,
            "reverse-path",
            &format!("rp_filter on {iif}"),
            &format!(
                "{errno}; the way back to {src} {back}, not {iif}, and rp_filter is {rp} ({values})"
            ),
        );
        d.check = format!("ip route get {src}");
        d
    })
}

/// The sysctls that must be 1 for `dst`'s family to be forwarded from `iif`.
fn forwarding_keys(dst: IpAddr, iif: &str) -> Vec<String> {
    if dst.is_ipv4() {
        vec![format!("net/ipv4/conf/{iif}/forwarding")]
    } else {
        vec![
            "net/ipv6/conf/all/forwarding".to_string(),
            format!("net/ipv6/conf/{iif}/forwarding"),
        ]
    }
}

/// The most specific route to `dst` of `ns`, when it is one that
/// refuses (blackhole, unreachable, prohibit).
fn refusing_route<'w>(world: &'w World, ns: &str, dst: IpAddr) -> Option<&'w Route> {
    let best = world
        .namespace(ns)?
        .routes
        .iter()
        .filter(|r| r.dst.contains(&dst))
        .max_by_key(|r| (r.table == 254, r.dst.prefix_len()))?;
    matches!(
        best.kind,
        RouteType::Blackhole | RouteType::Unreachable | RouteType::Prohibit
    )
    .then_some(best)
}

/// The next hop is not where the packet got: named at the namespace whose
/// route chose it (the last of the walk's `hops` to choose it, the packet
/// bound for `dst`), with who owns it, if anyone.
pub(super) fn wrong_next_hop(
    world: &World,
    (hops, dst): (&[Hop], IpAddr),
    nexthop: IpAddr,
    what: &str,
) -> End {
    let owner = world
        .owner(nexthop)
        .map(|o| format!("its owner is {o}"))
        .unwrap_or_else(|| "no namespace of the model owns it".into());
    let chose = hops.iter().rev().find(|h| h.next_hop == Some(nexthop));
    if let Some(d) = chose.and_then(|h| wrong_device(world, dst, h, nexthop)) {
        return End::Died(Box::new(d));
    }
    let (ns, route) = match chose {
        Some(h) => (h.namespace.as_str(), h.decision.as_str()),
        None => ("?", ""),
    };
    let mut d = Death::new(
        ns,
        "wrong-next-hop",
        &format!("next hop {nexthop}"),
        &format!("{ns} routes it {route}: {what}; {owner}"),
    );
    if let Some(h) = chose {
        d.check = h.evidence.split(':').next().unwrap_or_default().to_string();
    }
    End::Died(Box::new(d))
}

/// The route of `hop` sent the packet for `dst` out of a device that does
/// not lead to `nexthop`, while another link of the same namespace does:
/// named as that route (its prefix, from the model) and the device it
/// should use.
fn wrong_device(world: &World, dst: IpAddr, hop: &Hop, nexthop: IpAddr) -> Option<Death> {
    let ns = hop.namespace.as_str();
    let oif = hop.oif.as_deref()?;
    let owner = world.owner(nexthop)?;
    // The next hop itself, or (a pod's address) any address of its node.
    let node = world.node_of(&owner).filter(|n| *n != owner && n != ns);
    let mut targets = vec![nexthop];
    if let Some(n) = node.as_deref().and_then(|n| world.namespace(n)) {
        let same = |a: &&ipnet::IpNet| {
            let ip = a.addr();
            let link_local = ip.is_ipv6() && link_local(&ip);
            ip.is_ipv4() == nexthop.is_ipv4() && !ip.is_loopback() && !link_local
        };
        let on_node = n.links.iter().flat_map(|l| l.addresses.iter().filter(same));
        targets.extend(on_node.map(|a| a.addr()));
    }
    let leads = |link: &str| {
        world
            .peer(ns, link)
            .is_some_and(|(pn, pl)| targets.iter().any(|t| world.leads_to(&pn, &pl, *t, 0)))
    };
    let right = world.namespace(ns)?.links.iter().find(|l| {
        l.name != oif
            && l.up
            && match l.kind {
                LinkKind::Veth => l.controller.is_none() && leads(&l.name),
                LinkKind::Bridge => world.ports(ns, &l.name).iter().any(|p| leads(&p.name)),
                _ => false,
            }
    })?;
    let prefix = world
        .namespace(ns)?
        .routes
        .iter()
        .filter(|r| r.dst.contains(&dst))
        .max_by_key(|r| (r.table == 254, r.dst.prefix_len()))
        .map(|r| r.dst.to_string())
        .unwrap_or_else(|| dst.to_string());
    let mut d = Death::new(
        ns,
        "wrong-device",
        &format!("route {prefix} dev {oif}"),
        &format!(
            "{ns} routes {} out of {oif} ({}), but the next hop {nexthop} ({owner}) is \
             reached by {}, not {oif}",
            dst, hop.decision, right.name
        ),
    );
    d.check = hop
        .evidence
        .split(':')
        .next()
        .unwrap_or_default()
        .to_string();
    Some(d)
}

/// An end behind a port of a bridge: the veth peer of the port.
struct Behind {
    ns: String,
    link: String,
    port: String,
    addrs: Vec<IpAddr>,
    /// The subnets of those addresses.
    nets: Vec<IpNet>,
    mac: Option<String>,
}

impl Behind {
    fn named(&self) -> String {
        format!(
            "{}/{} (MAC {}, port {})",
            self.ns,
            self.link,
            self.mac.as_deref().unwrap_or("?"),
            self.port
        )
    }

    fn same_mac(&self, other: &Behind) -> bool {
        match (&self.mac, &other.mac) {
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            _ => false,
        }
    }
}

/// The ends behind the veth ports of `bridge` in `ns` (read all at once).
fn behind(world: &World, ns: &str, bridge: &str) -> Vec<Behind> {
    let ports: Vec<String> = world
        .ports(ns, bridge)
        .iter()
        .filter(|p| p.kind == LinkKind::Veth)
        .map(|p| p.name.clone())
        .collect();
    let far: Vec<String> = ports
        .iter()
        .filter_map(|p| world.peer_namespace(ns, p))
        .filter(|p| p != ns)
        .collect();
    world.read_all(&far);
    ports
        .into_iter()
        .filter_map(|port| {
            let (peer_ns, peer) = world.peer(ns, &port)?;
            let l = world.link(&peer_ns, &peer).filter(|_| peer_ns != ns)?;
            let own: Vec<&IpNet> = l
                .addresses
                .iter()
                .filter(|a| !link_local(&a.addr()))
                .collect();
            Some(Behind {
                addrs: own.iter().map(|a| a.addr()).collect(),
                nets: own.iter().map(|a| a.trunc()).collect(),
                mac: l.mac.clone(),
                ns: peer_ns,
                link: peer,
                port,
            })
        })
        .collect()
}

/// What behind `bridge` of `ns` makes `ip` answer as another end, or not
/// at all: two ends holding it (`duplicate-address`); its one holder
/// sharing its MAC with another end (`duplicate-mac`); nobody holding it,
/// while the end known by it is behind the bridge holding an address
/// another end holds (`duplicate-address`) or not (`address-missing`).
pub(super) fn on_bridge(world: &World, ns: &str, bridge: &str, ip: IpAddr) -> Option<Death> {
    let ends = behind(world, ns, bridge);
    let holders: Vec<&Behind> = ends.iter().filter(|b| b.addrs.contains(&ip)).collect();
    match holders.as_slice() {
        [] => missing(world, (ns, bridge), &ends, ip),
        [one] => {
            let twin = ends
                .iter()
                .find(|b| b.port != one.port && one.same_mac(b))?;
            let mac = one.mac.as_deref().unwrap_or_default();
            let mut d = Death::new(
                ns,
                "duplicate-mac",
                &format!("MAC {mac} on bridge {bridge}"),
                &format!(
                    "{ip} is on {}, and {} has the same MAC: {bridge} learns the MAC on \
                     whichever port sent last and delivers every frame for it there",
                    one.named(),
                    twin.named()
                ),
            );
            d.check = format!("bridge fdb show br {bridge}");
            Some(d)
        }
        many => Some(duplicate(ns, bridge, ip, many, "")),
    }
}

fn duplicate(ns: &str, bridge: &str, ip: IpAddr, holders: &[&Behind], why: &str) -> Death {
    let named: Vec<String> = holders.iter().map(|b| b.named()).collect();
    let mut d = Death::new(
        ns,
        "duplicate-address",
        &format!("address {ip} on bridge {bridge}"),
        &format!(
            "{ip} is held by {}: {ns} reaches whichever answered ARP last{why}",
            named.join(" and ")
        ),
    );
    d.check = format!("ip neigh show {ip} dev {bridge}");
    d
}

/// Nobody behind the bridge holds `ip`: the end known by it, if it is
/// behind the bridge, either took another end's address or has none.
fn missing(
    world: &World,
    (ns, bridge): (&str, &str),
    ends: &[Behind],
    ip: IpAddr,
) -> Option<Death> {
    let Some(end) = world
        .expected(ip)
        .and_then(|known| ends.iter().find(|b| b.ns == known))
    else {
        // No end is known by it: an address on the ends' subnet (their
        // gateway, say) that the bridge itself holds, or should, where
        // the bridge's namespace routes (a node; a switch holds none).
        if !routes_beyond(world, ns, bridge) {
            return None;
        }
        let net = ends
            .iter()
            .flat_map(|b| &b.nets)
            .find(|n| n.contains(&ip))?;
        let why = format!("{ip} is on {net}, where the ends behind it are");
        return unaddressed(world, (ns, bridge), *net, &why)
            .or_else(|| nobody_holds(world, (ns, bridge), ip, net));
    };
    let known = end.ns.as_str();
    for held in &end.addrs {
        let holders: Vec<&Behind> = ends.iter().filter(|b| b.addrs.contains(held)).collect();
        if holders.len() > 1 {
            let why = format!("; {known} is known by {ip}, which it does not hold");
            return Some(duplicate(ns, bridge, *held, &holders, &why));
        }
    }
    Some(unheld(&end.ns, &end.link, ip, &end.addrs))
}

/// `bridge` of `ns` holds no address on `net`, where ends behind it are:
/// nothing in `ns` reaches them, nor they their gateway.
fn unaddressed(world: &World, (ns, bridge): (&str, &str), net: IpNet, why: &str) -> Option<Death> {
    let held = &world.link(ns, bridge)?.addresses;
    if held.iter().any(|a| a.trunc() == net) {
        return None;
    }
    let held: Vec<String> = held
        .iter()
        .filter(|a| !link_local(&a.addr()))
        .map(IpNet::to_string)
        .collect();
    let held = if held.is_empty() {
        "it holds none".to_string()
    } else {
        format!("it holds {}", held.join(", "))
    };
    let mut d = Death::new(
        ns,
        "bridge-address-missing",
        &format!("bridge {bridge}"),
        &format!(
            "{bridge} holds no address on {net} ({held}), so {ns} has no connected route to \
             it: {why}"
        ),
    );
    d.check = format!("ip address show dev {bridge}");
    Some(d)
}

/// Whether `ns` has an addressed link other than `bridge` and its ports
/// (and loopback): somewhere to route the ends' packets to.
fn routes_beyond(world: &World, ns: &str, bridge: &str) -> bool {
    world.namespace(ns).is_some_and(|n| {
        n.links.iter().any(|l| {
            l.name != bridge
                && l.name != "lo"
                && l.controller.as_deref() != Some(bridge)
                && l.addresses.iter().any(|a| !link_local(&a.addr()))
        })
    })
}

/// `ip`, on the subnet of the ends behind `bridge`, is held by none of
/// them nor by the bridge, which is on that subnet with another address.
fn nobody_holds(
    world: &World,
    (ns, bridge): (&str, &str),
    ip: IpAddr,
    net: &IpNet,
) -> Option<Death> {
    let held: Vec<String> = world
        .link(ns, bridge)?
        .addresses
        .iter()
        .filter(|a| a.trunc() == *net)
        .map(IpNet::to_string)
        .collect();
    let mut d = Death::new(
        ns,
        "address-missing",
        &format!("address {ip} on bridge {bridge}"),
        &format!(
            "the packet is sent to {ip} on {net}, which neither {bridge} (it holds {}) nor any \
             end behind it holds",
            held.join(", ")
        ),
    );
    d.check = format!("ip address show dev {bridge}");
    Some(d)
}

/// `ns` has no route to `dst`, which an end behind one of its bridges
/// holds: the bridge without an address on that end's subnet.
pub(super) fn unrouted(world: &World, ns: &str, dst: IpAddr) -> Option<Death> {
    let bridges: Vec<String> = world
        .namespace(ns)?
        .links
        .iter()
        .filter(|l| l.kind == LinkKind::Bridge)
        .map(|l| l.name.clone())
        .collect();
    bridges.iter().find_map(|bridge| {
        let ends = behind(world, ns, bridge);
        let end = ends.iter().find(|b| b.addrs.contains(&dst))?;
        let net = end.nets.iter().find(|n| n.contains(&dst))?;
        let why = format!("{dst} is on {} behind it", end.named());
        unaddressed(world, (ns, bridge), *net, &why)
    })
}

fn unheld(ns: &str, link: &str, ip: IpAddr, held: &[IpAddr]) -> Death {
    let held: Vec<String> = held.iter().map(IpAddr::to_string).collect();
    let mut d = Death::new(
        ns,
        "address-missing",
        &format!("address {ip}"),
        &format!(
            "{ns} is known by {ip}, but no link of it holds it ({link} holds: {})",
            if held.is_empty() {
                "nothing".to_string()
            } else {
                held.join(", ")
            }
        ),
    );
    d.check = "ip -br address show".into();
    d
}

/// `ns` sends from `src`, which the kernel says is not its own: a twin
/// behind the bridge its veth leads to, or the address missing.
pub(super) fn unheld_source(world: &World, ns: &str, src: IpAddr) -> Option<Death> {
    if world.owns(ns, src) {
        return None;
    }
    let links = &world.namespace(ns)?.links;
    for l in links.iter().filter(|l| l.veth.is_some()) {
        let Some((node, port)) = world.peer(ns, &l.name) else {
            continue;
        };
        let Some(bridge) = world.link(&node, &port).and_then(|p| p.controller.clone()) else {
            continue;
        };
        if let Some(d) = on_bridge(world, &node, &bridge, src) {
            return Some(d);
        }
    }
    let (link, held) = links
        .iter()
        .find(|l| l.veth.is_some())
        .map(|l| {
            (
                l.name.as_str(),
                l.addresses.iter().map(|a| a.addr()).collect(),
            )
        })
        .unwrap_or(("eth0", Vec::new()));
    Some(unheld(ns, link, src, &held))
}

/// The last bridge the walk crossed, and the address it delivered to
/// there (the next hop the route before it chose).
fn last_bridge(world: &World, hops: &[Hop], dst: IpAddr) -> Option<(String, String, IpAddr)> {
    let i = hops.iter().rposition(Hop::crosses_bridge)?;
    let h = &hops[i];
    let port = world.link(&h.namespace, h.oif.as_deref()?)?;
    let bridge = port.controller.clone()?;
    let to = hops[..i]
        .iter()
        .rev()
        .find_map(|h| h.next_hop)
        .unwrap_or(dst);
    Some((h.namespace.clone(), bridge, to))
}

/// A walk that reached `dst` behind a bridge (or ended where the trace
/// cannot tell, where the kernel dropped it unexplained, or where the
/// next hop never answered ARP) dies at a twin of the end it reached,
/// when there is one.
pub(super) fn settle(world: &World, end: End, hops: &[Hop], dst: IpAddr) -> End {
    let open = match &end {
        End::Arrived(_) | End::Inconclusive(_) => true,
        // What a twin makes happen: the kernel drops what reached the
        // wrong one, and an ARP answer sent to a MAC the asker shares
        // never gets back to it.
        End::Died(d) => {
            [super::reasons::KERNEL_DROP, "neighbour-failed"].contains(&d.cause.as_str())
        }
        End::Left(_) => false,
    };
    if !open {
        return end;
    }
    match last_bridge(world, hops, dst).and_then(|(ns, br, to)| on_bridge(world, &ns, &br, to)) {
        Some(d) => End::Died(Box::new(d)),
        None => end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(ns: &str, port: &str, addrs: &[&str], mac: &str) -> Behind {
        Behind {
            ns: ns.into(),
            link: "eth0".into(),
            port: port.into(),
            addrs: addrs.iter().filter_map(|a| a.parse().ok()).collect(),
            nets: Vec::new(),
            mac: Some(mac.into()),
        }
    }

    #[test]
    fn link_local_addresses_are_no_twins() {
        assert!(link_local(&"fe80::1".parse().unwrap()));
        assert!(link_local(&"169.254.1.1".parse().unwrap()));
        assert!(!link_local(&"fd00::1".parse().unwrap()));
        assert!(!link_local(&"10.244.2.3".parse().unwrap()));
    }

    #[test]
    fn macs_match_whatever_their_case() {
        let a = end("cni-1", "veth1", &["10.0.0.2"], "0a:58:0a:00:00:02");
        let b = end("cni-2", "veth2", &["10.0.0.3"], "0A:58:0A:00:00:02");
        let c = end("cni-3", "veth3", &["10.0.0.4"], "0a:58:0a:00:00:04");
        assert!(a.same_mac(&b));
        assert!(!a.same_mac(&c));
    }

    #[test]
    fn a_duplicate_names_both_holders_and_the_bridge() {
        let a = end("cni-1", "veth1", &["10.0.0.2"], "0a:58:0a:00:00:02");
        let b = end("cni-2", "veth2", &["10.0.0.2"], "0a:58:0a:00:00:03");
        let d = duplicate("node", "cni0", "10.0.0.2".parse().unwrap(), &[&a, &b], "");
        assert_eq!(d.cause, "duplicate-address");
        assert_eq!(d.object, "address 10.0.0.2 on bridge cni0");
        assert!(d
            .evidence
            .contains("cni-1/eth0 (MAC 0a:58:0a:00:00:02, port veth1)"));
        assert!(d
            .evidence
            .contains("cni-2/eth0 (MAC 0a:58:0a:00:00:03, port veth2)"));
        assert_eq!(d.check, "ip neigh show 10.0.0.2 dev cni0");
    }
}
