//! Address rewrites the firewall's own trace shows: a rule that did
//! `dnat to ADDR[:PORT]` (a Service VIP to its backend), `snat to ADDR` or
//! `masquerade` for the probe, in the namespace where it matched. The
//! routing walk applies them where they happen (DNAT before that
//! namespace's routing decision, SNAT after it) and goes on with the
//! rewritten addresses; each rewrite is a hop with the rule as evidence.

use super::nftrace::{Event, EventKind};
use std::net::IpAddr;

/// What a NAT rule did to the probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The destination (and port) became this.
    Dnat(IpAddr, Option<u16>),
    /// The source became this (`None`: masquerade, the address the
    /// namespace would choose for the way out).
    Snat(Option<IpAddr>),
}

/// One rewrite in one namespace, with the rule that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewrite {
    pub namespace: String,
    pub change: Change,
    /// `ip kube-proxy endpoint-web-node2: meta l4proto tcp dnat to …`
    pub evidence: String,
}

/// The rewrites among the trace's events: the first DNAT and the first
/// SNAT of each namespace.
pub fn rewrites(events: &[Event]) -> Vec<Rewrite> {
    let mut out: Vec<Rewrite> = Vec::new();
    for e in events {
        let EventKind::Rule { text, .. } = &e.what else {
            continue;
        };
        let Some(change) = change(text) else {
            continue;
        };
        let same = |r: &Rewrite| {
            r.namespace == e.namespace
                && matches!(
                    (&r.change, &change),
                    (Change::Dnat(..), Change::Dnat(..)) | (Change::Snat(_), Change::Snat(_))
                )
        };
        if !out.iter().any(same) {
            out.push(Rewrite {
                namespace: e.namespace.clone(),
                change,
                evidence: format!("{} {} {}: {text}", e.family, e.table, e.chain),
            });
        }
    }
    out
}

/// Whether two probes' rewrites sent them to the same place (the same
/// DNATs in the same namespaces).
pub fn same_dnats(a: &[Rewrite], b: &[Rewrite]) -> bool {
    let dnats = |l: &[Rewrite]| -> Vec<(String, Change)> {
        l.iter()
            .filter(|r| matches!(r.change, Change::Dnat(..)))
            .map(|r| (r.namespace.clone(), r.change.clone()))
            .collect()
    };
    dnats(a) == dnats(b)
}

/// The change a rule's text makes (`… dnat to 10.244.2.2:7777`, `… dnat ip
/// to [fd00::2]:80`, `… snat to 10.0.0.1`, `… masquerade …`).
fn change(text: &str) -> Option<Change> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let at = |verb: &str| {
        let i = words.iter().position(|w| *w == verb)?;
        let rest = &words[i + 1..];
        let to = rest.iter().position(|w| *w == "to")?;
        rest.get(to + 1).copied()
    };
    if let Some(to) = at("dnat") {
        let (ip, port) = address(to)?;
        return Some(Change::Dnat(ip, port));
    }
    if let Some(to) = at("snat") {
        return Some(Change::Snat(Some(address(to)?.0)));
    }
    words.contains(&"masquerade").then_some(Change::Snat(None))
}

/// `10.0.0.2`, `10.0.0.2:80`, `[fd00::2]:80`, `fd00::2`.
fn address(s: &str) -> Option<(IpAddr, Option<u16>)> {
    if let Ok(ip) = s.parse() {
        return Some((ip, None));
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, port) = rest.split_once(']')?;
        let port = port.strip_prefix(':').and_then(|p| p.parse().ok());
        return Some((ip.parse().ok()?, port));
    }
    let (ip, port) = s.rsplit_once(':')?;
    Some((ip.parse().ok()?, port.parse().ok()))
}

/// A walk that a DNAT sent to an address no namespace holds, and that
/// died for want of it (or ended where the trace cannot tell): the DNAT is
/// the cause, named where it happened, with its rule.
pub(super) fn nowhere(world: &super::World, end: super::End, hops: &[super::Hop]) -> super::End {
    use super::End;
    let lost = match &end {
        End::Died(d) => NOBODY_THERE.contains(&d.cause.as_str()),
        End::Inconclusive(_) => true,
        _ => false,
    };
    let Some(h) = hops.iter().rev().find(|h| h.decision.starts_with("dnat: ")) else {
        return end;
    };
    let to = h
        .decision
        .split_whitespace()
        .nth(3)
        .and_then(|a| a.parse::<IpAddr>().ok());
    let Some(to) = to.filter(|to| lost && world.owner(*to).is_none()) else {
        return end;
    };
    let mut d = super::Death::new(
        &h.namespace,
        "dnat-nowhere",
        &format!("dnat to {to}"),
        &format!(
            "{}: {to} is held by no namespace, so what the rule rewrites goes nowhere ({})",
            h.decision, h.evidence
        ),
    );
    // `ip natx pre: rule …` → its chain.
    let chain: Vec<&str> = h
        .evidence
        .split(':')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    d.check = match chain.as_slice() {
        [family, table, chain] => format!("nft -a list chain {family} {table} {chain}"),
        _ => "nft -a list ruleset".into(),
    };
    End::Died(Box::new(d))
}

/// The deaths of a packet sent to an address nobody holds.
const NOBODY_THERE: &[&str] = &[
    "address-missing",
    "wrong-next-hop",
    "no-route",
    "neighbour-failed",
    super::reasons::KERNEL_DROP,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_rules_are_read_as_the_rewrite_they_make() {
        let ip = |s: &str| s.parse::<IpAddr>().ok();
        assert_eq!(
            change("meta l4proto tcp dnat to 10.244.2.2:7777"),
            Some(Change::Dnat("10.244.2.2".parse().unwrap(), Some(7777)))
        );
        assert_eq!(
            change("dnat ip6 to [fd00::2]:80"),
            ip("fd00::2").map(|a| Change::Dnat(a, Some(80)))
        );
        assert_eq!(
            change("snat to 10.0.0.1"),
            Some(Change::Snat(ip("10.0.0.1")))
        );
        assert_eq!(
            change("ip saddr @pods4 ip daddr != { 10.244.0.0/16 } masquerade"),
            Some(Change::Snat(None))
        );
        assert_eq!(change("ip daddr 10.0.0.0/8 counter drop"), None);
    }

    /// Two probes went the same way when their DNATs agree, whatever the
    /// SNATs they met (the second may have gone further and met more).
    #[test]
    fn probes_to_one_backend_are_told_from_probes_to_another() {
        let rw = |ns: &str, text: &str| Rewrite {
            namespace: ns.into(),
            change: change(text).expect("a rewrite"),
            evidence: text.into(),
        };
        let to_a = [rw("node1", "dnat to 10.244.1.2:7777")];
        let to_b = [rw("node1", "dnat to 10.244.2.2:7777")];
        let masq = [rw("node1", "masquerade fully-random")];
        let elsewhere = [rw("node2", "dnat to 10.244.1.2:7777")];
        let to_a_masq = [to_a[0].clone(), masq[0].clone()];
        assert!(same_dnats(&to_a, &to_a_masq));
        assert!(!same_dnats(&to_a, &to_b));
        assert!(!same_dnats(&to_a, &masq));
        assert!(!same_dnats(&to_a, &elsewhere));
        assert!(same_dnats(&masq, &[]));
    }
}
