//! The routing walk's end, corrected by what the firewall trace saw, by
//! the drop counters that moved and by where the probe was seen.

use super::nftrace::{self, Event, EventKind};
use super::text;
use super::{neighbour, Death, End, FirewallHop, Hop, Trace, World};

/// The routing walk's end, corrected by what the firewall trace saw and
/// by the drop counters that moved (qdiscs, legacy iptables).
pub(super) fn combine(
    world: &World,
    path: &[String],
    end: End,
    (traced, counted): (Result<nftrace::Traced, String>, Vec<Death>),
    to_ns: &str,
    trace: &mut Trace,
) -> End {
    let index = |ns: &str| path.iter().position(|p| p == ns).unwrap_or(path.len());
    let routing_at = match &end {
        End::Died(d) => index(&d.namespace),
        _ => path.len(),
    };
    let counted = counted
        .into_iter()
        .find(|d| index(&d.namespace) < routing_at);
    let traced = match traced {
        Ok(t) => t,
        Err(e) => {
            return match (counted, end) {
                (Some(c), _) => End::Died(Box::new(c)),
                (None, End::Arrived(ns)) => End::Inconclusive(format!(
                    "the kernel's routes deliver it to {ns}, but the firewall trace failed: {e}"
                )),
                (None, other) => other,
            }
        }
    };
    trace.firewall = traced
        .events
        .iter()
        .filter(|e| !matches!(e.what, EventKind::Packet(_)))
        .map(|e| FirewallHop {
            namespace: e.namespace.clone(),
            table: format!("{} {}", e.family, e.table),
            chain: e.chain.clone(),
            what: text::event(e),
        })
        .collect();
    let kill = traced
        .events
        .iter()
        .find(|e| e.kills())
        .filter(|kill| index(&kill.namespace) < routing_at);
    match (kill, counted) {
        (Some(k), Some(c)) if index(&c.namespace) < index(&k.namespace) => {
            return End::Died(Box::new(c))
        }
        (Some(k), _) => return End::Died(Box::new(firewall_death(k))),
        (None, Some(c)) => return End::Died(Box::new(c)),
        (None, None) => {}
    }
    match end {
        End::Arrived(ns) if !traced.seen.contains(&ns) => {
            let found = neighbour::unresolved(world, &trace.hops, trace.src)
                .or_else(|| link_hook(world, &trace.hops, &traced.seen));
            match found {
                Some(d) => End::Died(Box::new(d)),
                None => End::Inconclusive(format!(
            "the kernel's routes deliver it to {ns} and no firewall rule dropped it, but the probe \
             was never seen in {ns} (seen in: {}); what dropped it is something this trace does \
             not read yet (bridge filtering, eBPF off the links of its way)",
            if traced.seen.is_empty() {
                "none".to_string()
            } else {
                traced.seen.join(", ")
            }
        )),
            }
        }
        // The kernel's routes refuse it past the first namespace, in a
        // lookup only a packet that got in meets, but the probe never got
        // there: what stopped it on the way comes first.
        End::Died(d)
            if routing_at > 0
                && routing_at < path.len()
                && LOOKED_UP_INSIDE.contains(&d.cause.as_str())
                && !traced.seen.contains(&d.namespace) =>
        {
            match neighbour::unresolved(world, &trace.hops, trace.src) {
                Some(first) => End::Died(Box::new(first)),
                None => End::Died(d),
            }
        }
        End::Arrived(ns) if ns != to_ns => End::Inconclusive(format!(
            "the packet is delivered in {ns}, not in {to_ns} where {} is",
            trace.dst
        )),
        other => other,
    }
}

/// After a probe the routes deliver but that was never seen where it
/// should arrive: the first program or filter on a link hook on its way
/// past the last namespace it was seen in (a tc filter on the ingress of a
/// device it came in by, or on the egress of one it left by; an XDP
/// program on one it came in by). Such a hook runs before the firewall
/// and routing of the namespace it came into (or after those of the one
/// it left), so it can redirect, drop or rewrite the probe where neither
/// the walk nor the nft trace sees it.
fn link_hook(world: &World, hops: &[Hop], seen: &[String]) -> Option<Death> {
    let last_seen = hops.iter().rposition(|h| seen.contains(&h.namespace))?;
    let hooked = |ns: &str, dev: Option<&str>, sides: &[&str]| {
        let dev = dev?;
        world
            .namespace(ns)?
            .hooks
            .iter()
            .find(|k| k.dev == dev && sides.contains(&k.hook.as_str()))
            .cloned()
    };
    hops[last_seen..].iter().enumerate().find_map(|(i, h)| {
        let left = hooked(&h.namespace, h.oif.as_deref(), &["tc egress"]).map(|k| (h, k));
        let next = hops.get(last_seen + i + 1);
        let entered = next.and_then(|n| {
            hooked(&n.namespace, n.iif.as_deref(), &["tc ingress", "xdp"]).map(|k| (n, k))
        });
        let (hop, hook) = left.or(entered)?;
        let (cause, object, check) = match hook.hook.as_str() {
            "xdp" => (
                "xdp-program",
                format!("xdp program on {} ({} mode)", hook.dev, hook.kind),
                format!("ip -d link show {}", hook.dev),
            ),
            side => {
                let side = side.trim_start_matches("tc ");
                (
                    "tc-filter",
                    format!("tc {side} filter {} on {}", hook.kind, hook.dev),
                    format!("tc -s filter show dev {} {side}", hook.dev),
                )
            }
        };
        let evidence = format!(
            "the probe was last seen in {} and never where the routes deliver it; {object} \
             runs before the namespace's firewall sees it on the way in (after it, on the way \
             out) and can redirect, drop or rewrite it",
            hops[last_seen].namespace
        );
        let mut d = Death::new(&hop.namespace, cause, &object, &evidence);
        d.check = check;
        Some(d)
    })
}

/// The routing walk's deaths in a lookup of a namespace the packet entered
/// (a link down or a port blocked on its way in keeps it out).
const LOOKED_UP_INSIDE: &[&str] = &[
    "no-route",
    "blackhole",
    "unreachable",
    "prohibit",
    "route-refused",
    "reverse-path",
    "forwarding-off",
];

fn firewall_death(e: &Event) -> Death {
    let (cause, object, evidence, check) = match &e.what {
        EventKind::Rule {
            text,
            handle,
            verdict,
        } => {
            let reject = text.split_whitespace().any(|w| w == "reject");
            let handle = handle.map(|h| format!(" handle {h}")).unwrap_or_default();
            let invalid = text.contains("ct state invalid");
            (
                if invalid {
                    "conntrack-invalid"
                } else if reject {
                    "firewall-reject"
                } else {
                    "firewall-drop"
                },
                format!("{} {} {}{handle}", e.family, e.table, e.chain),
                format!(
                    "{}rule `{text}` (verdict {verdict})",
                    if invalid {
                        "conntrack classed the probe INVALID here: "
                    } else {
                        ""
                    }
                ),
                format!("nft -a list chain {} {} {}", e.family, e.table, e.chain),
            )
        }
        EventKind::Policy(p) => (
            "firewall-policy",
            format!("{} {} {} policy {p}", e.family, e.table, e.chain),
            format!("chain {} policy {p}: no rule accepted it", e.chain),
            format!("nft -a list chain {} {} {}", e.family, e.table, e.chain),
        ),
        _ => (
            "firewall-drop",
            e.table.clone(),
            String::new(),
            String::new(),
        ),
    };
    let mut d = Death::new(&e.namespace, cause, &object, &evidence);
    d.check = check;
    d
}
