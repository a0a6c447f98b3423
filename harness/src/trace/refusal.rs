//! Why the kernel refused a route lookup (RTM_GETROUTE answered with an
//! error): a martian source (the source is the namespace's own, or the
//! way back leaves by another device), a source nobody holds, forwarding
//! off, a policy rule, a route whose type refuses, a destination nobody
//! routes, or no route.

use super::route::{self, Answer, Question};
use super::{policy, Death, World};
use crate::model::{Route, RouteType};
use std::net::IpAddr;

/// Names a failed lookup: reverse path, forwarding off, the route whose
/// type refused it, or no route.
pub fn name(world: &World, ns: &str, q: &Question, code: i32, asked: &str) -> Death {
    use nix::libc::{EACCES, EHOSTUNREACH, EINVAL, ENETUNREACH, EXDEV};
    let (iif, dst) = (q.iif, q.dst);
    let errno = format!("{asked}: {}", route::errno_text(code));
    if let (EINVAL | EXDEV, Some(iif), Some(src)) = (code, iif, q.src) {
        if let Some(death) = martian_source(world, ns, iif, src, &errno) {
            return death;
        }
    }
    if let (None, Some(src)) = (iif, q.src) {
        if let Some(mut death) = super::twins::unheld_source(world, ns, src) {
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
        if let Some(mut death) = super::twins::unrouted(world, ns, dst) {
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
