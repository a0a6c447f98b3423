//! The routing walk: at each namespace the kernel's own answer
//! ([`route::get`]) for the packet as it arrives there, then the link it
//! leaves by (a veth to its peer, a bridge to the port that leads to the
//! next hop's owner) to the next namespace, until the kernel answers
//! `local` (arrived) or names a death. What joins namespaces (veth peers,
//! bridge ports, who owns an address) comes from the [`World`], which reads
//! a namespace only when the walk gets there (a bridge's ports that lead
//! to an end other than the next hop's are passed by unread).

use super::nat::{Change, Rewrite};
use super::policy;
use super::ports::{died, isolation, peer_up, port_forwards};
use super::route::{self, Answer, Question};
use super::vxlan;
use super::why;
use super::{Death, End, Hop, World};
use crate::model::{LinkFlag, LinkKind};
use std::net::IpAddr;

/// More namespaces than any lab path crosses: a loop.
const MAX_HOPS: usize = 32;

/// The walk's result: its hops, how it ended and the source address the
/// kernel chose where the caller gave none.
pub struct Walk {
    pub hops: Vec<Hop>,
    pub end: End,
    pub src: Option<IpAddr>,
    /// The packet's size in bytes (IP header included), sent with DF.
    pub size: u32,
    /// The source the probe is sent from (given, or the kernel's choice).
    pub sent_src: Option<IpAddr>,
    /// Its destination, after the DNAT the walk applied.
    pub dst: IpAddr,
    /// The NAT rewrites to apply where they happen.
    nat: Vec<Rewrite>,
    /// The outer packets of the VXLAN devices it left by: source (when
    /// the device has one), remote VTEP and UDP port.
    pub outer: Vec<(Option<IpAddr>, IpAddr, u16)>,
}

/// Walks `dst` from the namespace `from` (by role), a packet of `size`
/// bytes with DF, rewritten by `nat` where it happens.
pub fn walk(
    world: &World,
    from: &str,
    (src, dst): (Option<IpAddr>, IpAddr),
    size: u32,
    nat: &[Rewrite],
) -> Walk {
    let mut w = Walk {
        hops: Vec::new(),
        end: End::Inconclusive(String::new()),
        src,
        sent_src: src,
        size,
        dst,
        nat: nat.to_vec(),
        outer: Vec::new(),
    };
    let mut ns = from.to_string();
    let mut iif: Option<String> = None;
    for _ in 0..MAX_HOPS {
        dnat(&mut w, &ns, iif.as_deref());
        if came_back(world, &w, from, (&ns, iif.as_deref())) {
            let why = format!("the packet comes back to {from}, which sent it");
            w.end = End::Died(Box::new(looped(world, &w, &ns, &why)));
            return w;
        }
        let dst = w.dst;
        match step(world, &mut w, &ns, iif.as_deref(), dst) {
            Ok(Some((next, link))) => {
                ns = next;
                iif = Some(link);
            }
            Ok(None) => return w,
            Err(end) => {
                w.end = end;
                return w;
            }
        }
    }
    let why = format!("more than {MAX_HOPS} hops");
    w.end = End::Died(Box::new(looped(world, &w, &ns, &why)));
    w
}

/// The packet enters again the namespace `from` that sent it, from its
/// source there and not to an address of its own: routed back, a loop (the
/// kernel drops it there as a martian source, but the loop is why).
fn came_back(world: &World, w: &Walk, from: &str, (ns, iif): (&str, Option<&str>)) -> bool {
    ns == from && iif.is_some() && w.src == w.sent_src && !world.owns(ns, w.dst)
}

/// A routing loop, named at the node of the destination's owner when the
/// packet passed through it (that node had the packet and routed it away
/// again), else at `fallback`, with that namespace's last routing decision.
fn looped(world: &World, w: &Walk, fallback: &str, why: &str) -> Death {
    let at = world
        .owner(w.dst)
        .and_then(|o| world.node_of(&o))
        .filter(|n| w.hops.iter().any(|h| &h.namespace == n))
        .unwrap_or_else(|| fallback.to_string());
    let decision = w
        .hops
        .iter()
        .rev()
        .find(|h| h.namespace == at && !h.crosses_bridge())
        .map(|h| format!("; {}: {}", h.namespace, h.decision))
        .unwrap_or_default();
    Death::new(
        &at,
        "routing-loop",
        &format!("route to {}", w.dst),
        &format!("{why}{decision}"),
    )
}

/// A DNAT in `ns` (before its routing decision): the walk goes on to the
/// new destination; the rewrite is a hop.
fn dnat(w: &mut Walk, ns: &str, iif: Option<&str>) {
    let Some(i) = w
        .nat
        .iter()
        .position(|r| r.namespace == ns && matches!(r.change, Change::Dnat(..)))
    else {
        return;
    };
    let r = w.nat.remove(i);
    let Change::Dnat(to, port) = r.change else {
        return;
    };
    let port = port.map(|p| format!(" port {p}")).unwrap_or_default();
    w.hops.push(Hop {
        namespace: ns.to_string(),
        iif: iif.map(str::to_string),
        oif: None,
        next_hop: None,
        decision: format!("dnat: {} → {to}{port}", w.dst),
        evidence: r.evidence,
    });
    w.dst = to;
}

/// A SNAT in `ns` (after its routing decision, the packet leaving by
/// `oif`): the walk goes on from the new source; the rewrite is a hop.
fn snat(world: &World, w: &mut Walk, ns: &str, oif: &str) {
    let Some(i) = w
        .nat
        .iter()
        .position(|r| r.namespace == ns && matches!(r.change, Change::Snat(_)))
    else {
        return;
    };
    let r = w.nat.remove(i);
    let to = match r.change {
        Change::Snat(Some(to)) => Some(to),
        _ => world.file(ns).and_then(|f| {
            let q = Question {
                dst: w.dst,
                src: None,
                iif: None,
                mark: 0,
            };
            match route::get(f, &q) {
                Ok(Answer::Route { prefsrc, .. }) => prefsrc,
                _ => None,
            }
        }),
    };
    let Some(to) = to else {
        return;
    };
    let from = w.src.map(|s| s.to_string()).unwrap_or_else(|| "?".into());
    w.hops.push(Hop {
        namespace: ns.to_string(),
        iif: None,
        oif: Some(oif.to_string()),
        next_hop: None,
        decision: format!("snat: {from} → {to}"),
        evidence: r.evidence,
    });
    w.src = Some(to);
}

/// One namespace: `Ok(Some(next))` where the packet goes, `Ok(None)` when
/// it arrived (`w.end` set), `Err` when it died or the walk cannot tell.
fn step(
    world: &World,
    w: &mut Walk,
    ns: &str,
    iif: Option<&str>,
    dst: IpAddr,
) -> Result<Option<(String, String)>, End> {
    let file = world.file(ns).ok_or_else(|| {
        End::Inconclusive(format!("namespace {ns} is not one the trace can open"))
    })?;
    let q = Question {
        dst,
        src: w.src,
        iif,
        mark: 0,
    };
    let asked = ip_route_get(&q);
    let answer = route::get(file, &q)
        .map_err(|e| End::Inconclusive(format!("{ns}: RTM_GETROUTE failed: {e}")))?;
    let mut hop = Hop {
        namespace: ns.to_string(),
        iif: iif.map(str::to_string),
        oif: None,
        next_hop: None,
        decision: String::new(),
        evidence: String::new(),
    };
    let (kind, oif, gateway, prefsrc, table, mtu) = match answer {
        Answer::Error(code) => {
            let mut death = why::refusal(world, ns, &q, code, &asked);
            if death.check.is_empty() {
                death.check = asked.clone();
            }
            hop.decision = format!("died: {}", death.cause);
            hop.evidence = format!("{asked}: {}", route::errno_text(code));
            w.hops.push(hop);
            return Err(End::Died(Box::new(death)));
        }
        Answer::Route {
            kind,
            oif,
            gateway,
            prefsrc,
            table,
            mtu,
        } => (kind, oif, gateway, prefsrc, table, mtu),
    };
    if w.src.is_none() {
        w.src = prefsrc;
        w.sent_src = prefsrc;
    }
    hop.oif = oif.clone();
    if kind == "local" {
        hop.decision = "local: delivered here".into();
        hop.evidence = format!("{asked}: local {dst}");
        w.hops.push(hop);
        w.end = End::Arrived(ns.to_string());
        return Ok(None);
    }
    let Some(oif) = oif.filter(|_| kind == "unicast") else {
        hop.decision = format!("route type {kind}");
        hop.evidence = format!("{asked}: {kind} (table {table})");
        w.hops.push(hop);
        return Err(End::Inconclusive(format!(
            "{ns}: the kernel answers a {kind} route for {dst}, which the trace does not follow"
        )));
    };
    // IPv6 routes a packet to forward even with forwarding off; ip6_forward
    // then drops it.
    let v6_forwarding = "net/ipv6/conf/all/forwarding";
    if iif.is_some() && dst.is_ipv6() && world.sysctl(ns, v6_forwarding) == "0" {
        hop.decision = "died: forwarding-off".into();
        hop.evidence = format!("{asked}: {dst} dev {oif}; {v6_forwarding} = 0");
        w.hops.push(hop);
        let mut d = Death::new(
            ns,
            "forwarding-off",
            v6_forwarding,
            &format!("{v6_forwarding} = 0: {ns} forwards no IPv6 packet"),
        );
        d.check = format!("sysctl {}", v6_forwarding.replace('/', "."));
        return Err(End::Died(Box::new(d)));
    }
    let nexthop = gateway.unwrap_or(dst);
    hop.next_hop = Some(nexthop);
    hop.decision = match gateway {
        Some(g) => format!("forward via {g} dev {oif}"),
        None => format!("forward dev {oif} (connected)"),
    };
    let via = gateway.map(|g| format!(" via {g}")).unwrap_or_default();
    let with_mtu = mtu.map(|m| format!(" mtu {m}")).unwrap_or_default();
    let rule = policy::chosen_by(world.namespace(ns), &q, table);
    hop.evidence = format!("{asked}: {dst}{via} dev {oif} table {table}{with_mtu}{rule}");
    if let Some(death) = route_mtu((ns, file), &q, w.size, mtu, &asked) {
        hop.decision = "died: mtu".into();
        w.hops.push(hop);
        return Err(End::Died(Box::new(death)));
    }
    if mtu.is_some_and(|m| w.size > m) {
        hop.evidence
            .push_str(" (a path MTU learned from ICMP, not this route's: the walk goes on)");
    }
    w.hops.push(hop);
    snat(world, w, ns, &oif);
    leave(world, w, ns, &oif, nexthop).map(Some)
}

/// The matched route's own MTU (RTAX_MTU, `ip route … mtu N`) when the
/// packet with DF does not fit it: the death, named as that route (`ip
/// route get fibmatch`). A path MTU the kernel only learned (an ICMP
/// "fragmentation needed" from further on, `mtu` in the answer but not
/// in the route) is no cause here: the walk goes on to where it comes from.
fn route_mtu(
    (ns, file): (&str, &std::fs::File),
    q: &Question,
    size: u32,
    answered: Option<u32>,
    asked: &str,
) -> Option<Death> {
    answered.filter(|m| size > *m)?;
    let (prefix, own) = route::matched(file, q).ok()??;
    let own = own.filter(|m| size > *m)?;
    let mut d = Death::new(
        ns,
        "mtu",
        &format!("route {prefix} mtu {own}"),
        &format!(
            "a {size}-byte packet with DF does not fit the route to {prefix} (mtu {own}): \
             {asked} answers mtu {own}"
        ),
    );
    d.check = asked.replacen("ip route get ", "ip route get fibmatch ", 1);
    Some(d)
}

/// `ip route get …` for the question (the evidence, and how to reproduce).
fn ip_route_get(q: &Question) -> String {
    let mut s = format!("ip route get {}", q.dst);
    if let Some(src) = q.src {
        s.push_str(&format!(" from {src}"));
    }
    if let Some(iif) = q.iif {
        s.push_str(&format!(" iif {iif}"));
    }
    if q.mark != 0 {
        s.push_str(&format!(" mark {:#x}", q.mark));
    }
    s
}

/// The packet leaves `ns` by `oif` toward `nexthop`: where it enters next.
fn leave(
    world: &World,
    w: &mut Walk,
    ns: &str,
    oif: &str,
    nexthop: IpAddr,
) -> Result<(String, String), End> {
    let link = live(
        world,
        ns,
        oif,
        "link",
        &format!("{oif} is down (ip link set {oif} up)"),
    )?;
    fits(ns, link, w.size)?;
    if link.flags.contains(&LinkFlag::Noarp) {
        return Err(died(
            ns,
            "noarp",
            &format!("link {oif}"),
            &format!("{oif} has NOARP: the next hop {nexthop} is never resolved"),
        ));
    }
    if let Some(wrong) = world.wrong_permanent_neighbour(ns, oif, nexthop) {
        return Err(End::Died(Box::new(wrong)));
    }
    let left = || super::Exit::end(ns, oif, nexthop);
    match link.kind {
        LinkKind::Veth => match world.peer(ns, oif) {
            Some((to, peer)) if world.file(&to).is_some() => {
                enter(world, w, &to, &peer, nexthop, 0)
            }
            _ if world.is_one_node() => Err(left()),
            _ => Err(End::Inconclusive(format!(
                "{ns}: the other end of veth {oif} is in no namespace the model holds"
            ))),
        },
        LinkKind::Bridge => switch(world, w, ns, oif, None, nexthop, 0),
        LinkKind::Vxlan => {
            let encap = vxlan::encapsulate(world, ns, link, nexthop)?;
            w.hops.push(encap.hop);
            let outer = walk(
                world,
                ns,
                (encap.local, encap.vtep),
                w.size + VXLAN_OVERHEAD,
                &[],
            );
            w.outer.push((encap.local, encap.vtep, encap.port));
            w.outer.extend(outer.outer);
            for mut h in outer.hops {
                h.decision = format!("outer: {}", h.decision);
                w.hops.push(h);
            }
            match outer.end {
                End::Arrived(remote) => vxlan::decapsulate(&remote, world, (encap.vni, encap.port)),
                End::Left(mut exit) => {
                    exit.encapsulated_by = Some(oif.to_string());
                    Err(End::Left(exit))
                }
                other => Err(other),
            }
        }
        _ if world.is_one_node() => Err(left()),
        ref other => Err(End::Inconclusive(format!(
            "{ns}: the packet leaves by {oif} (kind {other:?}), which the trace does not follow yet"
        ))),
    }
}

/// What VXLAN adds around the inner packet: outer IPv4, UDP, VXLAN and
/// the inner Ethernet header.
const VXLAN_OVERHEAD: u32 = 50;

/// A packet of `size` bytes with DF does not leave or enter by a link of a
/// smaller MTU (a veth drops what is larger than its MTU).
fn fits(ns: &str, link: &crate::model::Link, size: u32) -> Result<(), End> {
    match link.mtu {
        Some(mtu) if size > mtu => Err(died(
            ns,
            "mtu",
            &format!("link {} mtu {mtu}", link.name),
            &format!(
                "a {size}-byte packet with DF does not fit {} (mtu {mtu})",
                link.name
            ),
        )),
        _ => Ok(()),
    }
}

/// Bridges deeper than this are a loop in the model.
const MAX_BRIDGES: usize = 8;

/// The packet enters `ns` by `link`: the L3 interface it arrives on there,
/// or on through a bridge.
fn enter(
    world: &World,
    w: &mut Walk,
    ns: &str,
    link: &str,
    nexthop: IpAddr,
    depth: usize,
) -> Result<(String, String), End> {
    let l = live(
        world,
        ns,
        link,
        "link",
        &format!("{link} (the veth's other end) is down: nothing it receives goes on (ip link set {link} up)"),
    )?;
    fits(ns, l, w.size)?;
    if let Some(bridge) = &l.controller {
        port_forwards(ns, bridge, l)?;
        if world.owns(ns, nexthop) {
            return Ok((ns.to_string(), bridge.clone()));
        }
        return switch(world, w, ns, bridge, Some(link), nexthop, depth + 1);
    }
    if world.owns(ns, nexthop) {
        return Ok((ns.to_string(), link.to_string()));
    }
    // Calico's pods reach their gateway 169.254.1.1 by the proxy ARP of
    // the node's `cali*` veth (the kernel answers when the link's or `all`'s
    // proxy_arp is on): on, the packet enters there; off, nothing answers
    // for the next hop.
    let sysctl = |dev: &str| {
        world
            .namespace(ns)
            .and_then(|n| n.sysctls.get(&format!("net/ipv4/conf/{dev}/proxy_arp")))
            .map(String::as_str)
    };
    if nexthop.is_ipv4() && (sysctl(link) == Some("1") || sysctl("all") == Some("1")) {
        return Ok((ns.to_string(), link.to_string()));
    }
    let proxy_arp = sysctl(link)
        .filter(|v| *v == "0" && nexthop.is_ipv4())
        .map(|_| format!("; proxy_arp is off on {ns}/{link} (net.ipv4.conf.{link}.proxy_arp = 0), so nothing answers ARP for {nexthop} there"))
        .unwrap_or_default();
    Err(why::wrong_next_hop(
        world,
        (&w.hops, w.dst),
        nexthop,
        &format!(
            "the packet reaches {ns}/{link}, which does not own the next hop {nexthop}{proxy_arp}"
        ),
    ))
}

/// Through bridge `bridge` of `ns` (entered by `in_port`, or sent by `ns`
/// itself) to the port that leads to `nexthop`'s owner.
fn switch(
    world: &World,
    w: &mut Walk,
    ns: &str,
    bridge: &str,
    in_port: Option<&str>,
    nexthop: IpAddr,
    depth: usize,
) -> Result<(String, String), End> {
    if depth > MAX_BRIDGES {
        return Err(died(
            ns,
            "bridge-loop",
            &format!("bridge {bridge}"),
            "bridges join in a loop",
        ));
    }
    live(world, ns, bridge, "bridge", &format!("{bridge} is down"))?;
    for port in world.ports(ns, bridge) {
        if Some(port.name.as_str()) == in_port
            || port.kind != LinkKind::Veth
            || !world.may_lead_to(ns, &port.name, nexthop)
        {
            continue;
        }
        let Some((peer_ns, peer)) = world.peer(ns, &port.name) else {
            continue;
        };
        if !world.leads_to(&peer_ns, &peer, nexthop, depth) {
            continue;
        }
        w.hops.push(Hop {
            namespace: ns.to_string(),
            iif: in_port.map(str::to_string),
            oif: Some(port.name.clone()),
            next_hop: None,
            decision: format!("bridge {bridge}: to port {}", port.name),
            evidence: format!(
                "{nexthop} is owned behind {}/{} (veth peer {peer_ns}/{peer})",
                ns, port.name
            ),
        });
        if !port.up {
            return Err(died(
                ns,
                "link-down",
                &format!("port {} of {bridge}", port.name),
                &format!("{} is down", port.name),
            ));
        }
        peer_up(world, (ns, &port.name), (&peer_ns, &peer))?;
        port_forwards(ns, bridge, port)?;
        isolation(world, ns, bridge, in_port, port)?;
        super::fdb::reaches(world, ns, bridge, port, nexthop)?;
        fits(ns, port, w.size)?;
        return enter(world, w, &peer_ns, &peer, nexthop, depth);
    }
    if let Some(d) = why::on_bridge(world, ns, bridge, nexthop) {
        return Err(End::Died(Box::new(d)));
    }
    Err(why::wrong_next_hop(
        world,
        (&w.hops, w.dst),
        nexthop,
        &format!("no port of bridge {bridge} in {ns} leads to the next hop {nexthop}"),
    ))
}

/// The link `name` of `ns`, when it is up; `what` names it in a death.
fn live<'a>(
    world: &'a World,
    ns: &str,
    name: &str,
    what: &str,
    down: &str,
) -> Result<&'a crate::model::Link, End> {
    let l = world
        .link(ns, name)
        .ok_or_else(|| End::Inconclusive(format!("{ns}: {what} {name} is not in the model")))?;
    if !l.up {
        return Err(died(ns, "link-down", &format!("{what} {name}"), down));
    }
    Ok(l)
}
