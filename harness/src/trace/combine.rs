//! The routing walk's end, corrected by what the firewall trace saw, by
//! the drop counters that moved and by where the probe was seen.

use super::nftrace::{self, Event, EventKind};
use super::text;
use super::{neighbour, Death, End, FirewallHop, Trace, World};

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
            match neighbour::unresolved(world, &trace.hops, trace.src) {
                Some(d) => End::Died(Box::new(d)),
                None => End::Inconclusive(format!(
            "the kernel's routes deliver it to {ns} and no firewall rule dropped it, but the probe \
             was never seen in {ns} (seen in: {}); what dropped it is something this trace does \
             not read yet (bridge filtering, tc actions other than drop, eBPF)",
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
