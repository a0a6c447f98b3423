//! The routing walk: at each namespace the kernel's own answer
//! ([`route::get`]) for the packet as it arrives there, then the link it
//! leaves by (a veth to its peer, a bridge to the port that leads to the
//! next hop's owner) to the next namespace, until the kernel answers
//! `local` (arrived) or names a death. What joins namespaces (veth peers,
//! bridge ports, who owns an address) comes from the [`World`]'s model.

use super::route::{self, Answer, Question};
use super::vxlan;
use super::{Death, End, Hop, World};
use crate::lab::model::{LinkFlag, LinkKind, RouteType};
use std::net::IpAddr;

/// More namespaces than any lab path crosses: a loop.
const MAX_HOPS: usize = 32;

/// The walk's result: its hops, how it ended and the source address the
/// kernel chose where the caller gave none.
pub struct Walk {
    pub hops: Vec<Hop>,
    pub end: End,
    pub src: Option<IpAddr>,
}

/// Walks `dst` from the namespace `from` (by role).
pub fn walk(world: &World, from: &str, src: Option<IpAddr>, dst: IpAddr) -> Walk {
    let mut w = Walk {
        hops: Vec::new(),
        end: End::Inconclusive(String::new()),
        src,
    };
    let mut ns = from.to_string();
    let mut iif: Option<String> = None;
    for _ in 0..MAX_HOPS {
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
    w.end = End::Died(Box::new(Death::new(
        &ns,
        "routing-loop",
        &format!("route to {dst}"),
        &format!("more than {MAX_HOPS} hops"),
    )));
    w
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
    let (kind, oif, gateway, prefsrc, table) = match answer {
        Answer::Error(code) => {
            let mut death = refusal(world, ns, iif, dst, code, &asked);
            death.check = asked.clone();
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
        } => (kind, oif, gateway, prefsrc, table),
    };
    if w.src.is_none() {
        w.src = prefsrc;
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
    let nexthop = gateway.unwrap_or(dst);
    hop.next_hop = Some(nexthop);
    hop.decision = match gateway {
        Some(g) => format!("forward via {g} dev {oif}"),
        None => format!("forward dev {oif} (connected)"),
    };
    let via = gateway.map(|g| format!(" via {g}")).unwrap_or_default();
    hop.evidence = format!("{asked}: {dst}{via} dev {oif} table {table}");
    w.hops.push(hop);
    leave(world, w, ns, &oif, nexthop).map(Some)
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

/// Names a failed lookup: reverse path, forwarding off, the route whose
/// type refused it, or no route.
fn refusal(
    world: &World,
    ns: &str,
    iif: Option<&str>,
    dst: IpAddr,
    code: i32,
    asked: &str,
) -> Death {
    use nix::libc::{EACCES, EHOSTUNREACH, EINVAL, ENETUNREACH, EXDEV};
    let errno = format!("{asked}: {}", route::errno_text(code));
    if let (EXDEV, Some(iif)) = (code, iif) {
        let rp = |dev: &str| world.sysctl(ns, &format!("net/ipv4/conf/{dev}/rp_filter"));
        return Death::new(
            ns,
            "reverse-path",
            &format!("rp_filter on {iif}"),
            &format!("{errno}; rp_filter all={} {iif}={}", rp("all"), rp(iif)),
        );
    }
    if let (EHOSTUNREACH, Some(iif)) = (code, iif) {
        for key in forwarding_keys(dst, iif) {
            if world.sysctl(ns, &key) == "0" {
                return Death::new(ns, "forwarding-off", &key, &format!("{errno}; {key} = 0"));
            }
        }
    }
    if let Some(r) = world.refusing_route(ns, dst) {
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
    let cause = match code {
        ENETUNREACH => "no-route",
        EINVAL => "blackhole",
        EHOSTUNREACH => "unreachable",
        EACCES => "prohibit",
        _ => "route-refused",
    };
    Death::new(ns, cause, &format!("route to {dst}"), &errno)
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
    match link.kind {
        LinkKind::Veth => {
            let (peer_ns, peer) = world.peer(ns, oif).ok_or_else(|| {
                End::Inconclusive(format!(
                    "{ns}: the other end of veth {oif} is in no namespace the model holds"
                ))
            })?;
            enter(world, w, &peer_ns, &peer, nexthop, 0)
        }
        LinkKind::Bridge => switch(world, w, ns, oif, None, nexthop, 0),
        LinkKind::Vxlan => {
            let encap = vxlan::encapsulate(world, ns, link, nexthop)?;
            w.hops.push(encap.hop);
            let outer = walk(world, ns, encap.local, encap.vtep);
            for mut h in outer.hops {
                h.decision = format!("outer: {}", h.decision);
                w.hops.push(h);
            }
            match outer.end {
                End::Arrived(remote) => vxlan::decapsulate(&remote, world, encap.vni),
                other => Err(other),
            }
        }
        ref other => Err(End::Inconclusive(format!(
            "{ns}: the packet leaves by {oif} (kind {other:?}), which the trace does not follow yet"
        ))),
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
    Err(wrong_next_hop(
        world,
        ns,
        nexthop,
        &format!("the packet reaches {ns}/{link}, which does not own the next hop {nexthop}"),
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
        if Some(port.name.as_str()) == in_port || port.kind != LinkKind::Veth {
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
        port_forwards(ns, bridge, port)?;
        return enter(world, w, &peer_ns, &peer, nexthop, depth);
    }
    Err(wrong_next_hop(
        world,
        ns,
        nexthop,
        &format!("no port of bridge {bridge} in {ns} leads to the next hop {nexthop}"),
    ))
}

/// The next hop is not where the packet got: who owns it, if anyone.
fn wrong_next_hop(world: &World, ns: &str, nexthop: IpAddr, what: &str) -> End {
    let owner = world
        .owner(nexthop)
        .map(|o| format!("its owner is {o}"))
        .unwrap_or_else(|| "no namespace of the model owns it".into());
    died(
        ns,
        "wrong-next-hop",
        &format!("next hop {nexthop}"),
        &format!("{what}; {owner}"),
    )
}

/// The link `name` of `ns`, when it is up; `what` names it in a death.
fn live<'a>(
    world: &'a World,
    ns: &str,
    name: &str,
    what: &str,
    down: &str,
) -> Result<&'a crate::lab::model::Link, End> {
    let l = world
        .link(ns, name)
        .ok_or_else(|| End::Inconclusive(format!("{ns}: {what} {name} is not in the model")))?;
    if !l.up {
        return Err(died(ns, "link-down", &format!("{what} {name}"), down));
    }
    Ok(l)
}

/// A bridge port whose STP state is not `forwarding` drops what it gets.
fn port_forwards(ns: &str, bridge: &str, port: &crate::lab::model::Link) -> Result<(), End> {
    match port.port.as_ref().and_then(|p| p.state.as_deref()) {
        Some(state) if state != "forwarding" => Err(died(
            ns,
            "bridge-port-blocked",
            &format!("port {} of {bridge}", port.name),
            &format!("STP state {state}"),
        )),
        _ => Ok(()),
    }
}

fn died(ns: &str, cause: &str, object: &str, evidence: &str) -> End {
    End::Died(Box::new(Death::new(ns, cause, object, evidence)))
}
