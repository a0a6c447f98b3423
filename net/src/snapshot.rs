//! What a namespace holds, read at one moment and compared later: links,
//! addresses and routes ([`NetState`]), firewall rules ([`firewall_rules`]),
//! and the full picture of a host's network ([`HostNetwork`]: also the
//! whole ruleset text and forwarding sysctls), which root tests and the
//! harness compare before and after.

use crate::netns::{Netns, NetnsError};
use crate::nl::{self, Address, Link, Route};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Links, addresses and routes of one namespace at one moment.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NetState {
    pub links: Vec<Link>,
    pub addresses: Vec<Address>,
    pub routes: Vec<Route>,
}

impl NetState {
    /// Reads links, addresses and routes (every table, both families)
    /// through one netlink handle.
    pub async fn read(h: &rtnetlink::Handle) -> Result<NetState, rtnetlink::Error> {
        Ok(NetState {
            links: nl::links(h).await?,
            addresses: nl::addresses(h, None).await?,
            routes: nl::all_routes(h).await?,
        })
    }

    pub fn link(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.name == name)
    }

    pub fn link_by_index(&self, index: u32) -> Option<&Link> {
        self.links.iter().find(|l| l.index == index)
    }

    pub fn addresses_of(&self, index: u32) -> Vec<IpNet> {
        self.addresses
            .iter()
            .filter(|a| a.index == index)
            .map(|a| a.addr)
            .collect()
    }

    /// What is in `self` but was not in `before` (new links, addresses and
    /// routes), ignoring everything on links named in `ignore_links`.
    /// Links are compared by name and kind; an address or route by its
    /// link's name, so index reuse does not hide anything.
    pub fn added_since(&self, before: &NetState, ignore_links: &[String]) -> Vec<String> {
        let name_of = |state: &NetState, index: Option<u32>| -> String {
            index
                .and_then(|i| state.link_by_index(i))
                .map(|l| l.name.clone())
                .unwrap_or_default()
        };
        let ignored = |name: &str| ignore_links.iter().any(|n| n == name);
        let links = |s: &NetState| -> BTreeSet<(String, String)> {
            s.links
                .iter()
                .map(|l| (l.name.clone(), l.kind.clone().unwrap_or_default()))
                .collect()
        };
        let addrs = |s: &NetState| -> BTreeSet<(String, String)> {
            s.addresses
                .iter()
                .filter(|a| !a.addr.addr().is_ipv6() || !is_link_local(a.addr.addr()))
                .map(|a| (name_of(s, Some(a.index)), a.addr.to_string()))
                .collect()
        };
        // Local-table routes follow addresses (compared above), and IPv6
        // link-local/multicast routes appear on their own whenever a link
        // comes up, so neither says anything about the plugin.
        let routes = |s: &NetState| -> BTreeSet<(String, String)> {
            s.routes
                .iter()
                .filter(|r| {
                    r.table != 255 && !is_link_local(r.dst.addr()) && !r.dst.addr().is_multicast()
                })
                .map(|r| {
                    let mut text = r.dst.to_string();
                    if let Some(gw) = r.gateway {
                        text.push_str(&format!(" via {gw}"));
                    }
                    text.push_str(&format!(" table {}", r.table));
                    (name_of(s, r.oif), text)
                })
                .collect()
        };
        let mut out = Vec::new();
        let (old, new) = (links(before), links(self));
        for (name, kind) in new.difference(&old) {
            if !ignored(name) {
                out.push(format!("new link {name} ({kind})"));
            }
        }
        let (old, new) = (addrs(before), addrs(self));
        for (link, addr) in new.difference(&old) {
            if !ignored(link) {
                out.push(format!("new address {addr} on {link}"));
            }
        }
        let (old, new) = (routes(before), routes(self));
        for (link, route) in new.difference(&old) {
            if !ignored(link) {
                out.push(format!("new route {route} dev {link}"));
            }
        }
        out
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(v4) => v4.is_link_local(),
    }
}

/// Forwarding and filtering sysctls that a plugin, the agent or a lab node
/// sets in its own namespace, and must never set in the machine's.
const HOST_SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/forwarding",
    "net/ipv4/conf/all/rp_filter",
    "net/ipv4/conf/default/rp_filter",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv4/conf/all/proxy_arp",
    "net/ipv6/conf/all/disable_ipv6",
];

/// The machine's own network (the namespace the process started in) at one moment: links
/// with their MTU, state and controller; addresses; routes of every table,
/// both families (netlink); the whole nft ruleset and the iptables and
/// ip6tables rules with chain policies; and forwarding sysctls. Counters,
/// timestamps and expiry times are left out, so traffic does not count as
/// a change.
#[derive(Debug)]
pub struct HostNetwork {
    net: NetState,
    links: Vec<String>,
    firewall: Vec<String>,
    sysctls: Vec<String>,
}

impl HostNetwork {
    /// The same snapshot of any namespace (the machine's own through
    /// `Netns::machine`; tests of the snapshot itself use a throwaway one).
    /// Fails when links, addresses and routes cannot be read; a firewall
    /// tool that cannot run shows as a line saying so.
    pub fn of(ns: &Netns) -> Result<HostNetwork, NetnsError> {
        let net = ns.snapshot()?;
        let mut links: Vec<String> = net
            .links
            .iter()
            .map(|l| {
                let master = l
                    .controller
                    .and_then(|i| net.link_by_index(i))
                    .map(|m| m.name.as_str())
                    .unwrap_or("-");
                let mtu = l.mtu.map_or_else(|| "-".to_string(), |m| m.to_string());
                let state = if l.up { "up" } else { "down" };
                format!(
                    "link {} ({}) mtu {mtu} {state} master {master}",
                    l.name,
                    l.kind.as_deref().unwrap_or("-"),
                )
            })
            .collect();
        links.sort();
        let sysctls = HOST_SYSCTLS
            .iter()
            .map(|key| {
                let value = crate::netns::read_sysctl(Some(ns.file()), key)
                    .unwrap_or_else(|e| format!("unreadable ({})", e.kind()));
                format!("sysctl {key} = {value}")
            })
            .collect();
        Ok(HostNetwork {
            firewall: firewall_text(ns),
            net,
            links,
            sysctls,
        })
    }
}

/// `nft -s list ruleset`, `iptables-save` and `ip6tables-save`, one
/// normalized line each: no comments, no `[packets:bytes]`, no `expires`.
fn firewall_text(ns: &Netns) -> Vec<String> {
    let mut out = Vec::new();
    for (tool, args) in [
        ("nft", &["-s", "list", "ruleset"][..]),
        ("iptables-save", &[][..]),
        ("ip6tables-save", &[][..]),
    ] {
        let text = match ns.command(tool).args(args).output() {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            Ok(o) => {
                out.push(format!("{tool}: failed ({})", o.status));
                continue;
            }
            Err(e) => {
                out.push(format!("{tool}: not run ({})", e.kind()));
                continue;
            }
        };
        out.extend(
            firewall_lines(&text)
                .into_iter()
                .map(|line| format!("{tool}: {line}")),
        );
    }
    out
}

/// The lines of `nft list ruleset` or `iptables-save` text normalized as in
/// [`HostNetwork`]: trimmed, no empty lines, no `#` comments, no counters,
/// no expiry times.
pub fn firewall_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(normalize_firewall_line)
        .collect()
}

/// One table of `nft list ruleset` text: `(family, name, text)`, the text
/// being the table's lines normalized as in [`HostNetwork`] (trimmed, no
/// counters, no expiry times), one per line.
pub fn nft_tables(ruleset: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String, Vec<String>)> = None;
    for line in ruleset.lines() {
        if let Some(head) = line.strip_prefix("table ") {
            let mut words = head.trim_end_matches('{').split_whitespace();
            let (family, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            current = Some((
                family.to_string(),
                name.to_string(),
                vec![line.trim().to_string()],
            ));
            continue;
        }
        let Some((_, _, lines)) = current.as_mut() else {
            continue;
        };
        let t = line.trim();
        if !t.is_empty() && !t.starts_with('#') {
            lines.push(normalize_firewall_line(t));
        }
        if line == "}" {
            if let Some((family, name, lines)) = current.take() {
                out.push((family, name, lines.join("\n")));
            }
        }
    }
    out
}

fn normalize_firewall_line(line: &str) -> String {
    let mut words = Vec::new();
    let mut skip = 0;
    for w in line.split_whitespace() {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        match w {
            // nft: `expires 3s`, `counter packets 1 bytes 2`
            "expires" => skip = 1,
            "packets" | "bytes" => skip = 1,
            // iptables-save: `:INPUT ACCEPT [12:3456]`, `[0:0] -A ...`
            _ if w.starts_with('[') && w.ends_with(']') && w.contains(':') => {}
            _ => words.push(w),
        }
    }
    words.join(" ")
}

impl HostNetwork {
    /// Every difference from `before`: what appeared, what went, what
    /// changed. Empty when the machine's network is as it was.
    pub fn changes_since(&self, before: &HostNetwork) -> Vec<String> {
        let mut out = self.net.added_since(&before.net, &[]);
        out.extend(
            before
                .net
                .added_since(&self.net, &[])
                .into_iter()
                .map(|d| format!("gone: {}", d.trim_start_matches("new "))),
        );
        for (b, a) in [
            (&before.links, &self.links),
            (&before.firewall, &self.firewall),
            (&before.sysctls, &self.sysctls),
        ] {
            out.extend(new_lines(b, a).into_iter().map(|l| format!("now: {l}")));
            out.extend(new_lines(a, b).into_iter().map(|l| format!("was: {l}")));
        }
        out
    }
}

/// Firewall rules of a namespace, one normalized line each (`nft -s list
/// ruleset`, else `iptables-save` + `ip6tables-save`). `None` when no tool
/// could be run. Tables and chains themselves are left out: an empty chain
/// a plugin keeps between pods is not a leak, a rule is.
///
/// A namespace without any nftables table (one netlink dump says so) has
/// nothing for `nft` to print, so where `nft` runs at all no process is
/// started for it (`conform` snapshots before and after every plugin
/// call).
pub fn firewall_rules(ns: &Netns) -> Option<Vec<String>> {
    if nft_runs() && !crate::netns::run_in(ns.file(), crate::nftnl::any_table_here).unwrap_or(true)
    {
        return Some(Vec::new());
    }
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

/// Whether `nft` can be run at all (asked once a process): where it cannot,
/// [`firewall_rules`] reads `iptables-save`, which a table count says
/// nothing about.
fn nft_runs() -> bool {
    static RUNS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RUNS.get_or_init(|| {
        std::process::Command::new("nft")
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
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

    /// `nft` runs where the namespace has a table, and only there: a
    /// wrapper first on PATH logs each run with the namespace it ran in
    /// (other tests' runs log their own namespaces).
    #[test]
    fn firewall_rules_list_with_nft_only_where_a_table_exists() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if let Err(e) = crate::netns::require_root() {
            panic!("this test creates network namespaces and must run as root: {e}");
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let real = std::env::split_paths(&path)
            .map(|d| d.join("nft"))
            .find(|p| p.is_file())
            .expect("nft on PATH");
        let dir = std::env::temp_dir().join(format!("cnilab-nftwrap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("wrapper dir");
        let log = dir.join("log");
        let wrapper = dir.join("nft");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\necho \"$(readlink /proc/self/ns/net) $*\" >> {}\nexec {} \"$@\"\n",
                log.display(),
                real.display()
            ),
        )
        .expect("wrapper");
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut paths = vec![dir.clone()];
        paths.extend(std::env::split_paths(&path));
        std::env::set_var("PATH", std::env::join_paths(paths).expect("PATH"));

        let ns = Netns::with_label("nftwrap").expect("netns");
        let ino = std::fs::metadata(ns.path()).expect("netns inode").ino();
        let listed_here = || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with(&format!("net:[{ino}] ")) && l.contains("list ruleset"))
                .count()
        };
        assert_eq!(firewall_rules(&ns), Some(Vec::new()));
        assert_eq!(listed_here(), 0, "nft listed a namespace without tables");

        let mut load = ns.command("nft");
        load.args([
            "add table inet t ; add chain inet t c { type filter hook forward priority 0 ; } ; add rule inet t c ip saddr 10.9.0.1 drop",
        ]);
        assert!(load.status().expect("nft add").success());
        let rules = firewall_rules(&ns).expect("rules");
        assert!(
            rules.iter().any(|r| r.contains("ip saddr 10.9.0.1 drop")),
            "{rules:?}"
        );
        assert_eq!(listed_here(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn firewall_lines_lose_counters_and_expiry_only() {
        assert_eq!(
            normalize_firewall_line(":FORWARD DROP [12:3456]"),
            ":FORWARD DROP"
        );
        assert_eq!(
            normalize_firewall_line("[3:180] -A POSTROUTING -s 10.0.0.0/24 -j MASQUERADE"),
            "-A POSTROUTING -s 10.0.0.0/24 -j MASQUERADE"
        );
        assert_eq!(
            normalize_firewall_line("ip saddr 10.0.0.2 counter packets 5 bytes 300 masquerade"),
            "ip saddr 10.0.0.2 counter masquerade"
        );
        assert_eq!(
            normalize_firewall_line("elements = { 10.0.0.2 expires 9s }"),
            "elements = { 10.0.0.2 }"
        );
    }

    #[test]
    fn changes_name_what_appeared_and_what_went() {
        let state = |fw: &[&str], sysctl: &str| HostNetwork {
            net: Default::default(),
            links: vec!["link lo (-) mtu 65536 up master -".into()],
            firewall: fw.iter().map(|s| s.to_string()).collect(),
            sysctls: vec![format!("sysctl net/ipv4/ip_forward = {sysctl}")],
        };
        let before = state(&["nft: table ip nat {"], "0");
        assert!(state(&["nft: table ip nat {"], "0")
            .changes_since(&before)
            .is_empty());
        let after = state(&["nft: table ip nat {", "nft: masquerade"], "1");
        assert_eq!(
            after.changes_since(&before),
            vec![
                "now: nft: masquerade",
                "now: sysctl net/ipv4/ip_forward = 1",
                "was: sysctl net/ipv4/ip_forward = 0",
            ]
        );
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
    fn nft_tables_split_a_ruleset_and_drop_counters() {
        let text = "table ip a {\n\tchain c {\n\t\tcounter packets 3 bytes 9 accept\n\t}\n}\ntable inet b {\n}\n";
        assert_eq!(
            nft_tables(text),
            vec![
                (
                    "ip".into(),
                    "a".into(),
                    "table ip a {\nchain c {\ncounter accept\n}\n}".into()
                ),
                ("inet".into(), "b".into(), "table inet b {\n}".into()),
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
