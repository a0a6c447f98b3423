//! What a plugin leaves on the host side: address reservations in a
//! host-local style store and firewall rules.

use crate::netns::Netns;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

/// One reserved address in a host-local layout store
/// (`<dataDir>/<network>/<ip>` holding `containerID\r\nifname`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Reservation {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: String,
}

/// Reads the reservations of a network's store directory. A missing
/// directory is an empty store.
pub fn reservations(dir: &Path) -> std::io::Result<Vec<Reservation>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Files other than addresses (lock, last_reserved_ip.N) are not records.
        let Ok(ip) = name.parse::<IpAddr>() else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let mut lines = text.split(['\r', '\n']).filter(|l| !l.is_empty());
        out.push(Reservation {
            ip,
            container_id: lines.next().unwrap_or("").trim().to_string(),
            ifname: lines.next().unwrap_or("").trim().to_string(),
        });
    }
    out.sort();
    Ok(out)
}

/// Firewall rules of a namespace, one normalized line each (`nft -s list
/// ruleset`, else `iptables-save` + `ip6tables-save`). `None` when no tool
/// could be run. Tables and chains themselves are left out: an empty chain
/// a plugin keeps between pods is not a leak, a rule is.
pub fn firewall_rules(ns: &Netns) -> Option<Vec<String>> {
    if let Ok(out) = ns.command("nft").args(["-s", "list", "ruleset"]).output() {
        if out.status.success() {
            return Some(nft_rules(&String::from_utf8_lossy(&out.stdout)));
        }
    }
    let mut rules = Vec::new();
    let mut any = false;
    for tool in ["iptables-save", "ip6tables-save"] {
        if let Ok(out) = ns.command(tool).output() {
            if out.status.success() {
                any = true;
                let text = String::from_utf8_lossy(&out.stdout);
                let mut table = String::new();
                for line in text.lines() {
                    if let Some(t) = line.strip_prefix('*') {
                        table = t.to_string();
                    } else if line.starts_with("-A ") {
                        rules.push(format!("{tool} {table} {line}"));
                    }
                }
            }
        }
    }
    any.then(|| {
        rules.sort();
        rules
    })
}

fn nft_rules(text: &str) -> Vec<String> {
    // Track the enclosing blocks: rules live in chains, per-pod state also
    // in set/map elements, which may span several lines.
    let mut rules = Vec::new();
    let mut table = String::new();
    let mut block: Option<(String, String)> = None; // (kind, name)
    let mut elements: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(acc) = elements.as_mut() {
            acc.push(' ');
            acc.push_str(t);
            if t.contains('}') {
                let (kind, name) = block.clone().unwrap_or_default();
                let body = acc.clone();
                elements = None;
                push_elements(&mut rules, &table, &kind, &name, &body);
            }
            continue;
        }
        if let Some(rest) = t.strip_prefix("table ") {
            table = rest.trim_end_matches('{').trim().to_string();
            continue;
        }
        let opens = |kw: &str| {
            t.strip_prefix(kw)
                .map(|r| r.trim_end_matches('{').trim().to_string())
        };
        if let Some(name) = opens("chain ") {
            block = Some(("chain".into(), name));
            continue;
        }
        if let Some(name) = opens("set ").or_else(|| opens("map ")) {
            block = Some(("set".into(), name));
            continue;
        }
        if let Some(name) = opens("flowtable ") {
            block = Some(("flowtable".into(), name));
            continue;
        }
        if t == "}" {
            if block.is_some() {
                block = None;
            } else {
                table.clear();
            }
            continue;
        }
        let Some((kind, name)) = &block else { continue };
        if kind == "chain" {
            let structural = t.is_empty()
                || t.starts_with('#')
                || t.starts_with("type ")
                || t.starts_with("policy ");
            if !structural {
                rules.push(format!("{table} chain {name}: {t}"));
            }
        } else if kind == "set" {
            if let Some(rest) = t.strip_prefix("elements = ") {
                if rest.contains('}') {
                    push_elements(&mut rules, &table, kind, name, rest);
                } else {
                    elements = Some(rest.to_string());
                }
            }
        }
    }
    rules.sort();
    rules
}

fn push_elements(rules: &mut Vec<String>, table: &str, _kind: &str, name: &str, body: &str) {
    let inner = body.trim().trim_start_matches('{').trim_end_matches('}');
    for e in inner.split(',') {
        let e = e.trim();
        if !e.is_empty() {
            rules.push(format!("{table} set {name} element {e}"));
        }
    }
}

/// Lines in `after` that were not in `before` (multiset difference).
pub fn new_lines(before: &[String], after: &[String]) -> Vec<String> {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for l in before {
        *counts.entry(l).or_default() += 1;
    }
    let mut out = Vec::new();
    for l in after {
        let c = counts.entry(l).or_default();
        if *c > 0 {
            *c -= 1;
        } else {
            out.push(l.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_host_local_records_with_either_line_ending() {
        let dir = crate::util::ScratchDir::new("store-test").expect("scratch");
        std::fs::write(dir.path().join("10.0.0.2"), "c1\r\neth0").expect("write");
        std::fs::write(dir.path().join("fd00::2"), "c2\neth1\n").expect("write");
        std::fs::write(dir.path().join("lock"), "").expect("write");
        std::fs::write(dir.path().join("last_reserved_ip.0"), "10.0.0.2").expect("write");
        let r = reservations(dir.path()).expect("reads");
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].container_id, "c1");
        assert_eq!(r[0].ifname, "eth0");
        assert_eq!(r[1].ifname, "eth1");
        assert!(reservations(&dir.path().join("missing"))
            .expect("empty")
            .is_empty());
    }

    #[test]
    fn nft_rules_ignore_structure_but_keep_rules() {
        let text = "table ip nat {\n\tchain POSTROUTING {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip saddr 10.0.0.2 masquerade\n\t}\n}\n";
        assert_eq!(
            nft_rules(text),
            vec!["ip nat chain POSTROUTING: ip saddr 10.0.0.2 masquerade"]
        );
        let empty = "table ip nat {\n\tchain POSTROUTING {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t}\n}\n";
        assert!(nft_rules(empty).is_empty());
    }

    #[test]
    fn nft_set_elements_are_per_pod_state() {
        let text = "table inet t {\n\tset pods4 {\n\t\ttype ipv4_addr\n\t\telements = { 10.0.0.2, 10.0.0.3,\n\t\t\t     10.0.0.4 }\n\t}\n\tset pods6 {\n\t\ttype ipv6_addr\n\t}\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip saddr @pods4 masquerade\n\t}\n}\n";
        assert_eq!(
            nft_rules(text),
            vec![
                "inet t chain post: ip saddr @pods4 masquerade",
                "inet t set pods4 element 10.0.0.2",
                "inet t set pods4 element 10.0.0.3",
                "inet t set pods4 element 10.0.0.4",
            ]
        );
    }

    #[test]
    fn new_lines_is_a_multiset_difference() {
        let a = vec!["x".to_string(), "y".to_string()];
        let b = vec!["x".to_string(), "x".to_string(), "z".to_string()];
        assert_eq!(new_lines(&a, &b), vec!["x".to_string(), "z".to_string()]);
    }
}
