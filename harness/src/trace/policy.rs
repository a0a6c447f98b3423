//! Which policy rule decided a routing lookup: the namespace's rules (the
//! model keeps those that are not the kernel's defaults) in priority
//! order, matched against the packet as the kernel matches it (source,
//! destination, the interface it came in on, `lo` when sent from here,
//! mark 0), the first that refuses it (`blackhole`, `unreachable`,
//! `prohibit`) or whose table has a route to the destination. `None`: the
//! kernel's own rules decided (local, main, default), or no rule matched.

use super::route::Question;
use super::Death;
use crate::model::{Namespace, Route, RouteType, Rule};

/// The rule that decided, and the route of its table it chose (`None`:
/// the rule's own action refused the packet).
pub(super) struct Decided<'a> {
    pub rule: &'a Rule,
    pub route: Option<&'a Route>,
}

/// The main table's default rule: rules after it count only when main
/// has no route.
const MAIN_RULE: u32 = 32766;
const MAIN: u32 = 254;

pub(super) fn decided<'a>(ns: &'a Namespace, q: &Question) -> Option<Decided<'a>> {
    let mut rules: Vec<&Rule> = ns
        .rules
        .iter()
        .filter(|r| r.v6 == q.dst.is_ipv6())
        .collect();
    rules.sort_by_key(|r| r.priority);
    let main = best(ns, MAIN, q);
    for rule in rules {
        if rule.priority >= MAIN_RULE && main.is_some() {
            return None;
        }
        if !selects(rule, q) {
            continue;
        }
        match rule.action.as_str() {
            "blackhole" | "unreachable" | "prohibit" => return Some(Decided { rule, route: None }),
            "lookup" => {
                if let Some(route) = best(ns, rule.table, q) {
                    return Some(Decided {
                        rule,
                        route: Some(route),
                    });
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether `rule`'s selectors match the packet.
fn selects(rule: &Rule, q: &Question) -> bool {
    let src = match (rule.src, q.src) {
        (None, _) => true,
        (Some(net), Some(src)) => net.contains(&src),
        (Some(_), None) => false,
    };
    let dst = rule.dst.is_none_or(|net| net.contains(&q.dst));
    let iif = rule
        .iif
        .as_deref()
        .is_none_or(|i| i == q.iif.unwrap_or("lo"));
    // A forwarded packet has no output interface at lookup time, and one
    // sent from here is not bound to one.
    let oif = rule.oif.is_none();
    let mark = rule
        .fwmark
        .is_none_or(|m| q.mark & rule.fwmask.unwrap_or(u32::MAX) == m);
    (src && dst && iif && oif && mark) != rule.invert
}

/// The most specific route to the destination in `table` (a `throw` route
/// sends the lookup on: none).
fn best<'a>(ns: &'a Namespace, table: u32, q: &Question) -> Option<&'a Route> {
    ns.routes
        .iter()
        .filter(|r| r.table == table && r.dst.contains(&q.dst))
        .max_by_key(|r| r.dst.prefix_len())
        .filter(|r| r.kind != RouteType::Throw)
}

/// For a hop's evidence: the rule that chose `table` for the packet, when
/// it is not the kernel's own (`; chosen by rule 100: … lookup 100`).
pub(super) fn chosen_by(ns: Option<&Namespace>, q: &Question, table: u32) -> String {
    ns.and_then(|n| decided(n, q))
        .filter(|d| d.route.is_some_and(|r| r.table == table))
        .map(|d| format!("; chosen by {}", describe(d.rule)))
        .unwrap_or_default()
}

/// A refused lookup that a rule decided: the rule's own action, or a
/// refusing route of the table it chose, named with the rule. `None`: the
/// rule's route does not refuse (something else did).
pub(super) fn refusal(ns_name: &str, ns: &Namespace, q: &Question, errno: &str) -> Option<Death> {
    let d = decided(ns, q)?;
    let rule = describe(d.rule);
    let death = match d.route {
        None => Death::new(ns_name, &d.rule.action, &rule, errno),
        Some(r) => {
            let kind = match r.kind {
                RouteType::Blackhole => "blackhole",
                RouteType::Unreachable => "unreachable",
                RouteType::Prohibit => "prohibit",
                _ => return None,
            };
            Death::new(
                ns_name,
                kind,
                &format!("route {kind} {} table {}", r.dst, r.table),
                &format!("{errno}; chosen by {rule}"),
            )
        }
    };
    Some(death)
}

/// `rule 100: from 10.244.1.0/24 iif cni0 lookup 100`, as `ip rule` says it.
pub(super) fn describe(rule: &Rule) -> String {
    let mut s = format!("rule {}:", rule.priority);
    if rule.invert {
        s.push_str(" not");
    }
    match rule.src {
        Some(net) => s.push_str(&format!(" from {net}")),
        None => s.push_str(" from all"),
    }
    if let Some(net) = rule.dst {
        s.push_str(&format!(" to {net}"));
    }
    if let Some(i) = &rule.iif {
        s.push_str(&format!(" iif {i}"));
    }
    if let Some(m) = rule.fwmark {
        s.push_str(&format!(" fwmark {m:#x}"));
        if let Some(mask) = rule.fwmask.filter(|m| *m != u32::MAX) {
            s.push_str(&format!("/{mask:#x}"));
        }
    }
    match rule.action.as_str() {
        "lookup" => s.push_str(&format!(" lookup {}", rule.table)),
        other => s.push_str(&format!(" {other}")),
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(priority: u32, src: Option<&str>, iif: Option<&str>, action: &str, table: u32) -> Rule {
        Rule {
            priority,
            v6: false,
            src: src.map(|s| s.parse().expect("net")),
            dst: None,
            iif: iif.map(str::to_string),
            oif: None,
            fwmark: None,
            fwmask: None,
            invert: false,
            action: action.into(),
            table,
        }
    }

    fn route(table: u32, dst: &str, kind: RouteType) -> Route {
        Route {
            table,
            kind,
            dst: dst.parse().expect("net"),
            gateway: None,
            dev: None,
            onlink: false,
            scope: "universe".into(),
            proto: "static".into(),
            metric: 0,
            src: None,
            nexthops: Vec::new(),
        }
    }

    fn question<'a>(src: &str, iif: Option<&'a str>) -> Question<'a> {
        Question {
            dst: "10.244.2.2".parse().expect("ip"),
            src: Some(src.parse().expect("ip")),
            iif,
            mark: 0,
        }
    }

    #[test]
    fn the_first_matching_rule_with_a_route_decides() {
        let ns = Namespace {
            rules: vec![
                rule(200, Some("10.244.1.0/24"), None, "lookup", 100),
                rule(100, Some("10.244.9.0/24"), None, "blackhole", 0),
                rule(150, Some("10.244.1.0/24"), Some("cni0"), "lookup", 50),
            ],
            routes: vec![
                route(254, "10.244.2.0/24", RouteType::Unicast),
                route(100, "10.244.0.0/16", RouteType::Blackhole),
            ],
            ..Default::default()
        };
        // Table 50 has no route: its rule is passed; 100's decides.
        let d = decided(&ns, &question("10.244.1.2", Some("cni0"))).expect("a rule");
        assert_eq!(d.rule.priority, 200);
        assert_eq!(d.route.map(|r| r.table), Some(100));
        assert_eq!(describe(d.rule), "rule 200: from 10.244.1.0/24 lookup 100");
        // Another source: no rule but the kernel's own.
        assert!(decided(&ns, &question("10.250.0.1", None)).is_none());
        // The blackhole rule's own action, for its source.
        let d = decided(&ns, &question("10.244.9.5", None)).expect("a rule");
        assert!(d.route.is_none());
        assert_eq!(describe(d.rule), "rule 100: from 10.244.9.0/24 blackhole");
    }

    #[test]
    fn rules_after_main_count_only_when_main_has_no_route() {
        let mut ns = Namespace {
            rules: vec![rule(40000, None, None, "lookup", 100)],
            routes: vec![route(100, "10.244.2.0/24", RouteType::Unicast)],
            ..Default::default()
        };
        assert!(decided(&ns, &question("10.244.1.2", None)).is_some());
        ns.routes.push(route(254, "0.0.0.0/0", RouteType::Unicast));
        assert!(decided(&ns, &question("10.244.1.2", None)).is_none());
    }

    #[test]
    fn iif_lo_selects_what_is_sent_from_here() {
        let ns = Namespace {
            rules: vec![rule(100, None, Some("lo"), "prohibit", 0)],
            ..Default::default()
        };
        assert!(decided(&ns, &question("10.244.1.2", None)).is_some());
        assert!(decided(&ns, &question("10.244.1.2", Some("eth0"))).is_none());
    }
}
