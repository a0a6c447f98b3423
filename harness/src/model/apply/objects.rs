//! Routes, policy rules, permanent neighbours, FDB entries and qdiscs of
//! one namespace, in one netlink session inside it (step 4 of `apply`).

use super::links::{indexes, mac_bytes, Made};
use super::{object_error, ApplyError, NotMade, Target};
use crate::model::{FdbEntry, LinkKind, Neighbour, Qdisc, Route, RouteType, Rule};
use rtnetlink::packet_core::{NetlinkMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
use rtnetlink::packet_route::neighbour::{NeighbourFlags, NeighbourState};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteNextHop,
    RouteNextHopFlags, RouteProtocol, RouteScope, RouteType as NlRouteType,
};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use std::collections::BTreeMap;
use std::net::IpAddr;

const EEXIST: i32 = 17;

/// A route as `ip route` would show it (for messages).
pub(crate) fn route_text(r: &Route) -> String {
    let mut s = format!("{:?} {}", r.kind, r.dst).to_lowercase();
    if let Some(g) = r.gateway {
        s.push_str(&format!(" via {g}"));
    }
    if let Some(d) = &r.dev {
        s.push_str(&format!(" dev {d}"));
    }
    if r.table != cnilab_net::nl::MAIN_TABLE {
        s.push_str(&format!(" table {}", r.table));
    }
    s
}

/// The objects of `t` a netlink session adds (or removes), their MACs
/// resolved and each FDB entry's table known.
pub(super) struct Resolved {
    routes: Vec<Route>,
    rules: Vec<Rule>,
    neighbours: Vec<(Neighbour, Option<Vec<u8>>)>,
    /// An entry, its MAC, and whether its device is a bridge port.
    fdb: Vec<(FdbEntry, Vec<u8>, bool)>,
}

/// Routes, rules, neighbours and FDB entries of `t`, in the order they are
/// added. Objects on a link that was not made are not made either.
pub(super) fn resolve_objects(
    t: &Target,
    made: &Made,
    macs: &BTreeMap<String, String>,
) -> Result<(Resolved, Vec<NotMade>), ApplyError> {
    let ns = t.model.name.clone();
    let mut not_made = Vec::new();
    let missing = |dev: &str| !made.contains(&(ns.clone(), dev.to_string()));
    let mut skip = |what: String, dev: &str| {
        not_made.push(NotMade {
            namespace: ns.clone(),
            object: what,
            reason: format!("its device {dev} was not made"),
        })
    };
    let mut routes: Vec<&Route> = Vec::new();
    for r in &t.model.routes {
        let devs = r
            .dev
            .iter()
            .chain(r.nexthops.iter().filter_map(|h| h.dev.as_ref()));
        match devs.clone().find(|d| missing(d)) {
            Some(d) => skip(format!("route {}", route_text(r)), d),
            None => routes.push(r),
        }
    }
    // Routes without a gateway first: a gateway is reached through them.
    routes.sort_by_key(|r| r.gateway.is_some() || !r.nexthops.is_empty());
    let mut neighbours: Vec<(Neighbour, Option<Vec<u8>>)> = Vec::new();
    for n in &t.model.neighbours {
        if missing(&n.dev) {
            skip(format!("neighbour {} dev {}", n.addr, n.dev), &n.dev);
            continue;
        }
        let mac = match &n.mac {
            Some(m) => Some(resolve(m, macs).ok_or_else(|| {
                object_error(
                    &ns,
                    format!("neighbour {} dev {}", n.addr, n.dev),
                    format!("MAC {m}: no such link or MAC"),
                )
            })?),
            None => None,
        };
        neighbours.push((n.clone(), mac));
    }
    let mut fdb: Vec<(FdbEntry, Vec<u8>, bool)> = Vec::new();
    for f in &t.model.fdb {
        if missing(&f.dev) {
            skip(format!("fdb entry {} dev {}", f.mac, f.dev), &f.dev);
            continue;
        }
        let mac = resolve(&f.mac, macs).ok_or_else(|| {
            object_error(
                &ns,
                format!("fdb entry {} dev {}", f.mac, f.dev),
                "no such link or MAC",
            )
        })?;
        // A port's entry goes to its bridge's table; a bridge's or
        // VXLAN device's to its own.
        let port = t
            .whole
            .link(&f.dev)
            .is_some_and(|l| l.controller.is_some() && l.kind != LinkKind::Vxlan);
        fdb.push((f.clone(), mac, port));
    }
    let resolved = Resolved {
        routes: routes.into_iter().cloned().collect(),
        rules: t.model.rules.clone(),
        neighbours,
        fdb,
    };
    Ok((resolved, not_made))
}

/// Adds the routes, rules, neighbours and FDB entries of `t`; a route
/// that exists is replaced with `replace`, else left as it is.
pub(super) fn add(
    t: &Target,
    made: &Made,
    macs: &BTreeMap<String, String>,
    replace: bool,
) -> Result<Vec<NotMade>, ApplyError> {
    let ns = t.model.name.clone();
    let (objects, not_made) = resolve_objects(t, made, macs)?;
    let done = t
        .netns
        .netlink(|h| async move { Ok::<_, rtnetlink::Error>(add_in(&h, &objects, replace).await) });
    match done {
        Ok(Ok(())) => Ok(not_made),
        Ok(Err((object, reason))) => Err(object_error(&ns, object, reason)),
        Err(e) => Err(object_error(&ns, "routes", e)),
    }
}

/// Removes the routes, rules, neighbours and FDB entries of `t` (the
/// reverse of [`add`], with the same requests); one already gone is not
/// an error.
pub(super) fn remove(
    t: &Target,
    made: &Made,
    macs: &BTreeMap<String, String>,
) -> Result<Vec<NotMade>, ApplyError> {
    let ns = t.model.name.clone();
    let (objects, not_made) = resolve_objects(t, made, macs)?;
    let done = t
        .netns
        .netlink(|h| async move { Ok::<_, rtnetlink::Error>(remove_in(&h, &objects).await) });
    match done {
        Ok(Ok(())) => Ok(not_made),
        Ok(Err((object, reason))) => Err(object_error(&ns, object, reason)),
        Err(e) => Err(object_error(&ns, "routes", e)),
    }
}

/// A MAC, or `@<namespace>/<link>`'s.
fn resolve(mac: &str, macs: &BTreeMap<String, String>) -> Option<Vec<u8>> {
    match mac.starts_with('@') {
        true => macs.get(mac).and_then(|m| mac_bytes(m)),
        false => mac_bytes(mac),
    }
}

type Failed = (String, String);

async fn add_in(h: &rtnetlink::Handle, o: &Resolved, replace: bool) -> Result<(), Failed> {
    let index = indexes(h).await.map_err(|e| ("links".to_string(), e))?;
    let idx = |name: &str| index.get(name).copied().unwrap_or(0);
    // A route whose gateway is reached through another route is retried
    // once the others are in.
    let mut pending: Vec<&Route> = o.routes.iter().collect();
    loop {
        let mut failed = Vec::new();
        for r in &pending {
            let msg =
                route_message(r, &idx).map_err(|e| (format!("route {}", route_text(r)), e))?;
            // Replace: an address's own (protocol kernel) route may have
            // the same key (a ptp pod's `/24 via` its gateway).
            match cnilab_net::nl::add_route(h, msg, replace).await {
                Ok(()) => {}
                Err(e) if cnilab_net::nl::errno(&e) == Some(EEXIST) => {}
                Err(e) => failed.push((*r, e.to_string())),
            }
        }
        if failed.is_empty() {
            break;
        }
        if failed.len() == pending.len() {
            let (r, e) = &failed[0];
            return Err((
                format!("route {}", route_text(r)),
                format!("the kernel refused it: {e}"),
            ));
        }
        pending = failed.into_iter().map(|(r, _)| r).collect();
    }
    for rule in &o.rules {
        let what = format!("rule {} priority {}", rule.action, rule.priority);
        let msg = rule_message(rule).map_err(|e| (what.clone(), e))?;
        let mut req = h.rule().add();
        *req.message_mut() = msg;
        match req.execute().await {
            Err(e) if cnilab_net::nl::errno(&e) != Some(EEXIST) => {
                return Err((what, format!("the kernel refused it: {e}")))
            }
            _ => {}
        }
    }
    for (n, mac) in &o.neighbours {
        let req = neighbour_request(h, idx(&n.dev), n, mac.as_deref());
        if let Err(e) = req.replace().execute().await {
            return Err((format!("neighbour {} dev {}", n.addr, n.dev), e.to_string()));
        }
    }
    for (f, mac, port) in &o.fdb {
        match fdb_request(h, idx(&f.dev), f, mac, *port).execute().await {
            Err(e) if cnilab_net::nl::errno(&e) != Some(EEXIST) => {
                return Err((format!("fdb entry {} dev {}", f.mac, f.dev), e.to_string()))
            }
            _ => {}
        }
    }
    Ok(())
}

/// [`add_in`] backwards: FDB entries, neighbours, rules, then routes.
async fn remove_in(h: &rtnetlink::Handle, o: &Resolved) -> Result<(), Failed> {
    let index = indexes(h).await.map_err(|e| ("links".to_string(), e))?;
    let idx = |name: &str| index.get(name).copied().unwrap_or(0);
    let gone = |r: Result<(), rtnetlink::Error>, what: String| match r {
        Err(e) if !cnilab_net::nl::is_not_found(&e) => Err((what, e.to_string())),
        _ => Ok(()),
    };
    for (f, mac, port) in &o.fdb {
        let mut req = fdb_request(h, idx(&f.dev), f, mac, *port);
        let msg = req.message_mut().clone();
        let what = format!("fdb entry {} dev {}", f.mac, f.dev);
        gone(h.neighbours().del(msg).execute().await, what)?;
    }
    for (n, mac) in &o.neighbours {
        let mut req = neighbour_request(h, idx(&n.dev), n, mac.as_deref());
        let msg = req.message_mut().clone();
        let what = format!("neighbour {} dev {}", n.addr, n.dev);
        gone(h.neighbours().del(msg).execute().await, what)?;
    }
    for rule in &o.rules {
        let what = format!("rule {} priority {}", rule.action, rule.priority);
        let msg = rule_message(rule).map_err(|e| (what.clone(), e))?;
        gone(h.rule().del(msg).execute().await, what)?;
    }
    for r in o.routes.iter().rev() {
        let what = format!("route {}", route_text(r));
        let msg = route_message(r, &idx).map_err(|e| (what.clone(), e))?;
        gone(h.route().del(msg).execute().await, what)?;
    }
    Ok(())
}

/// The request that adds a permanent neighbour (its message deletes it).
fn neighbour_request(
    h: &rtnetlink::Handle,
    index: u32,
    n: &Neighbour,
    mac: Option<&[u8]>,
) -> rtnetlink::NeighbourAddRequest {
    let req = h
        .neighbours()
        .add(index, n.addr)
        .state(NeighbourState::Permanent);
    match mac {
        Some(mac) => req.link_layer_address(mac),
        None => req,
    }
}

/// The request that adds an FDB entry: to its bridge's table for a port,
/// to the device's own otherwise (its message deletes it).
fn fdb_request(
    h: &rtnetlink::Handle,
    index: u32,
    f: &FdbEntry,
    mac: &[u8],
    port: bool,
) -> rtnetlink::NeighbourAddRequest {
    let state = match f.state.as_str() {
        "static" => NeighbourState::Noarp,
        _ => NeighbourState::Permanent,
    };
    let flags = if port {
        NeighbourFlags::Controller
    } else {
        NeighbourFlags::Own
    };
    let req = h
        .neighbours()
        .add_bridge(index, mac)
        .state(state)
        .flags(flags);
    match f.dst {
        Some(dst) => req.destination(dst),
        None => req,
    }
}

fn route_address(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }
}

/// A scope or protocol as the reader names it (`link`, `boot`, or the
/// number), back to its number.
fn number_of(table: &[(u8, &str)], what: &str, name: &str) -> Result<u8, String> {
    match table.iter().find(|(_, n)| *n == name) {
        Some((k, _)) => Ok(*k),
        None => name.parse().map_err(|_| format!("{what} {name}")),
    }
}

fn scope_of(name: &str) -> Result<u8, String> {
    number_of(crate::model::read::SCOPES, "scope", name)
}

fn proto_of(name: &str) -> Result<u8, String> {
    number_of(crate::model::read::PROTOCOLS, "protocol", name)
}

fn route_message(r: &Route, idx: &impl Fn(&str) -> u32) -> Result<RouteMessage, String> {
    let mut msg = RouteMessage::default();
    let h = &mut msg.header;
    h.address_family = if r.dst.addr().is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    h.destination_prefix_length = r.dst.prefix_len();
    h.table = u8::try_from(r.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    h.protocol = RouteProtocol::from(proto_of(&r.proto)?);
    h.scope = RouteScope::from(scope_of(&r.scope)?);
    h.kind = match &r.kind {
        RouteType::Unicast => NlRouteType::Unicast,
        RouteType::Blackhole => NlRouteType::BlackHole,
        RouteType::Unreachable => NlRouteType::Unreachable,
        RouteType::Prohibit => NlRouteType::Prohibit,
        RouteType::Throw => NlRouteType::Throw,
        RouteType::Other(k) => return Err(format!("route type {k} is not one apply makes")),
    };
    if r.onlink {
        h.flags = RouteFlags::Onlink;
    }
    let a = &mut msg.attributes;
    a.push(RouteAttribute::Table(r.table));
    if r.dst.prefix_len() > 0 {
        a.push(RouteAttribute::Destination(route_address(r.dst.network())));
    }
    if let Some(g) = r.gateway {
        a.push(RouteAttribute::Gateway(route_address(g)));
    }
    if let Some(d) = &r.dev {
        a.push(RouteAttribute::Oif(idx(d)));
    }
    if r.metric != 0 {
        a.push(RouteAttribute::Priority(r.metric));
    }
    if let Some(s) = r.src {
        a.push(RouteAttribute::PrefSource(route_address(s)));
    }
    if !r.nexthops.is_empty() {
        let hops = r
            .nexthops
            .iter()
            .map(|n| {
                let mut hop = RouteNextHop::default();
                if n.onlink {
                    hop.flags = RouteNextHopFlags::Onlink;
                }
                hop.hops = u8::try_from(n.weight.saturating_sub(1)).unwrap_or(u8::MAX);
                hop.interface_index = n.dev.as_deref().map(idx).unwrap_or(0);
                hop.attributes = n
                    .gateway
                    .map(|g| vec![RouteAttribute::Gateway(route_address(g))])
                    .unwrap_or_default();
                hop
            })
            .collect();
        a.push(RouteAttribute::MultiPath(hops));
    }
    Ok(msg)
}

fn rule_message(r: &Rule) -> Result<RuleMessage, String> {
    let mut msg = RuleMessage::default();
    let h = &mut msg.header;
    h.family = if r.v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    h.table = u8::try_from(r.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    h.action = match r.action.as_str() {
        "lookup" => RuleAction::ToTable,
        "nop" => RuleAction::Nop,
        "blackhole" => RuleAction::Blackhole,
        "unreachable" => RuleAction::Unreachable,
        "prohibit" => RuleAction::Prohibit,
        other => return Err(format!("rule action {other} is not one apply makes")),
    };
    if r.invert {
        h.flags = RuleFlags::Invert;
    }
    h.src_len = r.src.map_or(0, |n| n.prefix_len());
    h.dst_len = r.dst.map_or(0, |n| n.prefix_len());
    let a = &mut msg.attributes;
    a.push(RuleAttribute::Priority(r.priority));
    if r.action == "lookup" {
        a.push(RuleAttribute::Table(r.table));
    }
    if let Some(n) = &r.src {
        a.push(RuleAttribute::Source(n.network()));
    }
    if let Some(n) = &r.dst {
        a.push(RuleAttribute::Destination(n.network()));
    }
    if let Some(i) = &r.iif {
        a.push(RuleAttribute::Iifname(i.clone()));
    }
    if let Some(o) = &r.oif {
        a.push(RuleAttribute::Oifname(o.clone()));
    }
    if let Some(m) = r.fwmark {
        a.push(RuleAttribute::FwMark(m));
    }
    if let Some(m) = r.fwmask {
        a.push(RuleAttribute::FwMask(m));
    }
    Ok(msg)
}

/// The qdiscs of `t`, by kind only: a kind this kernel lacks, or one that
/// needs options the model does not hold, is not made.
pub(super) fn qdiscs(t: &Target, made: &Made) -> Result<Vec<NotMade>, ApplyError> {
    let ns = t.model.name.clone();
    let wanted: Vec<Qdisc> = t.model.qdiscs.clone();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let made_here: Vec<bool> = wanted
        .iter()
        .map(|q| made.contains(&(ns.clone(), q.dev.clone())))
        .collect();
    let done = t.netns.netlink(|h| async move {
        let index = indexes(&h).await.unwrap_or_default();
        let mut out = Vec::new();
        for (q, ok) in wanted.iter().zip(made_here) {
            let reason = match (ok, index.get(&q.dev)) {
                (true, Some(i)) => qdisc(&h, *i, q).await.err(),
                _ => Some(format!("its device {} was not made", q.dev)),
            };
            if let Some(reason) = reason {
                out.push((
                    format!("qdisc {} {} dev {}", q.kind, q.handle, q.dev),
                    reason,
                ));
            }
        }
        Ok::<_, rtnetlink::Error>(out)
    });
    match done {
        Ok(out) => Ok(out
            .into_iter()
            .map(|(object, reason)| NotMade {
                namespace: ns.clone(),
                object,
                reason,
            })
            .collect()),
        Err(e) => Err(object_error(&ns, "qdiscs", e)),
    }
}

async fn qdisc(h: &rtnetlink::Handle, index: u32, q: &Qdisc) -> Result<(), String> {
    use futures_util::StreamExt;
    use rtnetlink::packet_core::NetlinkPayload;
    use rtnetlink::packet_route::tc::{TcAttribute, TcHandle, TcMessage};
    let hex = |s: &str| u16::from_str_radix(s, 16).map_err(|_| format!("handle {s}"));
    let (major, _) = q.handle.split_once(':').unwrap_or((&q.handle, ""));
    let mut msg = TcMessage::default();
    msg.header.index = i32::try_from(index).map_err(|e| e.to_string())?;
    msg.header.handle = TcHandle {
        major: hex(major)?,
        minor: 0,
    };
    msg.header.parent = match q.parent.split_once(':') {
        _ if q.parent == "root" => TcHandle::ROOT,
        Some((maj, min)) => TcHandle {
            major: hex(maj)?,
            minor: hex(min)?,
        },
        None => return Err(format!("parent {}", q.parent)),
    };
    msg.attributes.push(TcAttribute::Kind(q.kind.clone()));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    let mut answers = h.clone().request(req).map_err(|e| e.to_string())?;
    while let Some(m) = answers.next().await {
        if let NetlinkPayload::Error(e) = m.payload {
            if e.code.is_some() {
                return Err(format!("the kernel refused it: {e}"));
            }
        }
    }
    Ok(())
}
