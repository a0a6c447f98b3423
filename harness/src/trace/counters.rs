//! Drops the kernel only counts: a qdisc's `drops` (netem loss, a tc filter
//! whose action is `drop`, a full queue) and legacy iptables (x_tables)
//! rules and chain policies, which nftables' trace does not see. Both are
//! read before and after the probe in every namespace it crosses
//! (`tc -s -j qdisc show`, `iptables-legacy-save -c` and its IPv6 twin,
//! inside the namespace); a counter of a dropping object that moved is
//! the evidence. A namespace without legacy tables, or a machine without
//! `iptables-legacy-save`, has nothing to compare.

use super::Death;
use cnilab_net::nft;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

/// The causes a moved counter names: what another probe passing at the same
/// time could have moved as well.
pub const CAUSES: &[&str] = &[
    "qdisc-drop",
    "iptables-legacy-drop",
    "iptables-legacy-policy",
];

/// One counted object: where, what, and its packet (or drop) count.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    namespace: String,
    /// `qdisc netem 8001: dev eth0`, `iptables-legacy filter FORWARD rule 2`, …
    object: String,
}

#[derive(Clone, Debug)]
struct Counted {
    count: u64,
    /// Dropping: a qdisc (all it counts are drops), a DROP or REJECT rule,
    /// a DROP policy.
    cause: &'static str,
    /// The rule's text or the policy, as the tool prints it.
    text: String,
    check: String,
}

/// Every counter of the crossed namespaces at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot(BTreeMap<Key, Counted>);

/// Reads the counters in each namespace (`(role, file)`).
pub fn take(files: &[(String, &File)]) -> Snapshot {
    let mut all = BTreeMap::new();
    for (ns, f) in files {
        qdiscs(ns, f, &mut all);
        for save in ["iptables-legacy-save", "ip6tables-legacy-save"] {
            legacy(ns, f, save, &mut all);
        }
    }
    Snapshot(all)
}

/// The dropping objects whose counter moved between `before` and `after`,
/// as deaths, in the order of `path` (namespace roles).
pub fn moved(before: &Snapshot, after: &Snapshot, path: &[String]) -> Vec<Death> {
    let mut found: Vec<(usize, Death)> = after
        .0
        .iter()
        .filter_map(|(k, a)| {
            let was = before.0.get(k).map(|b| b.count).unwrap_or(0);
            (a.count > was).then(|| {
                let mut d = Death::new(
                    &k.namespace,
                    a.cause,
                    &k.object,
                    &format!(
                        "{}: its counter moved from {was} to {} while the probe passed",
                        a.text, a.count
                    ),
                );
                d.check = a.check.clone();
                let at = path
                    .iter()
                    .position(|p| *p == k.namespace)
                    .unwrap_or(path.len());
                (at, d)
            })
        })
        .collect();
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, d)| d).collect()
}

/// A qdisc on one of `devs` of `ns` that has dropped packets (ever): its object
/// name and drop count. What keeps a neighbour unresolved when the ARP or
/// NDP requests themselves are dropped.
pub fn dropping_qdisc(ns: &str, f: &File, devs: &[String]) -> Option<(String, u64, String)> {
    let mut all = BTreeMap::new();
    qdiscs(ns, f, &mut all);
    all.into_iter()
        .find(|(k, c)| {
            c.count > 0
                && devs
                    .iter()
                    .any(|d| k.object.ends_with(&format!(" dev {d}")))
        })
        .map(|(k, c)| (k.object, c.count, c.check))
}

/// `tc -s -j qdisc show`: each qdisc's drops.
fn qdiscs(ns: &str, f: &File, all: &mut BTreeMap<Key, Counted>) {
    let Ok(out) = nft::run(
        Path::new("tc"),
        Some(f),
        &["-s", "-j", "qdisc", "show"],
        None,
    ) else {
        return;
    };
    let Ok(serde_json::Value::Array(list)) = serde_json::from_str::<serde_json::Value>(&out) else {
        return;
    };
    for q in list {
        let word = |k: &str| q[k].as_str().unwrap_or("?").to_string();
        let (kind, handle, dev) = (word("kind"), word("handle"), word("dev"));
        let drops = q["drops"].as_u64().unwrap_or(0);
        all.insert(
            Key {
                namespace: ns.to_string(),
                object: format!("qdisc {kind} {handle} dev {dev}"),
            },
            Counted {
                count: drops,
                cause: "qdisc-drop",
                text: format!("qdisc {kind} {handle} on {dev} dropped"),
                check: format!("tc -s qdisc show dev {dev}"),
            },
        );
    }
}

/// `iptables-legacy-save -c` (or the IPv6 one): every DROP/REJECT rule and
/// DROP policy with its packet count.
fn legacy(ns: &str, f: &File, save: &str, all: &mut BTreeMap<Key, Counted>) {
    let Ok(out) = nft::run(Path::new(save), Some(f), &["--counters"], None) else {
        return;
    };
    let tool = save.trim_end_matches("-save");
    let mut table = String::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for line in out.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_string();
            index.clear();
            continue;
        }
        let Some((count, chain, text, cause, object)) = legacy_line(line, &table, &mut index)
        else {
            continue;
        };
        all.insert(
            Key {
                namespace: ns.to_string(),
                object: format!("{tool} {object}"),
            },
            Counted {
                count,
                cause,
                text,
                check: format!("{tool} -t {table} -L {chain} -v -x -n --line-numbers"),
            },
        );
    }
}

/// One line of `iptables-save -c`: a chain's policy (`:FORWARD DROP
/// [3:252]`) or a rule (`[1:84] -A FORWARD -d 10.0.0.0/8 -j DROP`) that
/// drops; `index` numbers each chain's rules as `-L --line-numbers` does.
/// Returns (packets, chain, text, cause, object).
fn legacy_line(
    line: &str,
    table: &str,
    index: &mut BTreeMap<String, usize>,
) -> Option<(u64, String, String, &'static str, String)> {
    let packets = |c: &str| {
        c.trim_start_matches('[')
            .split(':')
            .next()
            .and_then(|p| p.parse::<u64>().ok())
    };
    if let Some(policy) = line.strip_prefix(':') {
        let mut w = policy.split_whitespace();
        let (chain, verdict, count) = (w.next()?, w.next()?, w.next()?);
        return (verdict == "DROP").then(|| {
            (
                packets(count).unwrap_or(0),
                chain.to_string(),
                format!("chain {chain} policy DROP: no rule accepted it"),
                "iptables-legacy-policy",
                format!("{table} {chain} policy DROP"),
            )
        });
    }
    let (count, rule) = line.split_once(' ')?;
    let chain = rule.strip_prefix("-A ")?.split_whitespace().next()?;
    let n = index.entry(chain.to_string()).or_insert(0);
    *n += 1;
    let target = rule.split(" -j ").nth(1)?.split_whitespace().next()?;
    matches!(target, "DROP" | "REJECT").then(|| {
        (
            packets(count).unwrap_or(0),
            chain.to_string(),
            format!("rule `{rule}`"),
            "iptables-legacy-drop",
            format!("{table} {chain} rule {n}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_lines_name_dropping_rules_and_policies_by_chain_and_number() {
        let mut index = BTreeMap::new();
        let policy = legacy_line(":FORWARD DROP [3:252]", "filter", &mut index);
        assert_eq!(
            policy.map(|p| (p.0, p.3, p.4)),
            Some((
                3,
                "iptables-legacy-policy",
                "filter FORWARD policy DROP".into()
            ))
        );
        assert!(legacy_line(":INPUT ACCEPT [9:9]", "filter", &mut index).is_none());
        let accept = legacy_line(
            "[5:420] -A FORWARD -s 10.0.0.0/8 -j ACCEPT",
            "filter",
            &mut index,
        );
        assert!(accept.is_none());
        let drop = legacy_line(
            "[1:84] -A FORWARD -d 10.244.2.0/24 -j DROP",
            "filter",
            &mut index,
        );
        assert_eq!(
            drop.map(|d| (d.0, d.3, d.4)),
            Some((1, "iptables-legacy-drop", "filter FORWARD rule 2".into()))
        );
    }
}
