//! Building blocks for plugin tests in any Rust project's `cargo test`:
//! a host namespace, a pod namespace, a runtime bound to a plugin dir.
//!
//! They are plain functions so that the library does not depend on a test
//! framework; wrap them as rstest fixtures in your test crate:
//!
//! ```no_run
//! use cnilab_harness::netns::Netns;
//! use cnilab_harness::runtime::{NetworkConfig, Runtime, RuntimeConf};
//! use cnilab_harness::testing;
//! use rstest::{fixture, rstest};
//!
//! #[fixture]
//! fn host() -> Netns {
//!     testing::host_netns()
//! }
//!
//! #[fixture]
//! fn pod() -> Netns {
//!     testing::pod_netns()
//! }
//!
//! #[rstest]
//! fn bridge_adds_eth0(host: Netns, pod: Netns) {
//!     let runtime = testing::runtime(&host, "/usr/lib/cni");
//!     let store = tempfile::tempdir().unwrap();
//!     let mut net = NetworkConfig::load("my.conflist".as_ref()).unwrap();
//!     net.set_ipam_data_dir(store.path());
//!     let rt = RuntimeConf::new("c1", Some(pod.path()), "eth0");
//!     runtime.add(&net, &rt).expect("ADD");
//!     assert!(pod.links().unwrap().iter().any(|l| l.name == "eth0"));
//!     runtime.del(&net, &rt).expect("DEL");
//! }
//! ```
//!
//! Each function panics with a message that says what to fix (for example
//! "must run as root"): a root test must fail, never pass silently.

use crate::netns::{self, Netns};
use crate::runtime::Runtime;

/// Panics unless the process can create namespaces.
pub fn require_root() {
    if let Err(e) = netns::require_root() {
        panic!("this test creates network namespaces and must run as root: {e}");
    }
}

/// A throwaway namespace standing for the node, with `lo` up.
pub fn host_netns() -> Netns {
    require_root();
    let ns = Netns::with_label("t-host").unwrap_or_else(|e| panic!("host netns: {e}"));
    ns.set_lo_up()
        .unwrap_or_else(|e| panic!("lo up in {}: {e}", ns.name()));
    ns
}

/// A throwaway namespace standing for a pod.
pub fn pod_netns() -> Netns {
    require_root();
    Netns::with_label("t-pod").unwrap_or_else(|e| panic!("pod netns: {e}"))
}

/// A runtime that finds plugins on `cni_path` and runs them inside `host`.
pub fn runtime(host: &Netns, cni_path: &str) -> Runtime {
    Runtime::new(cni_path)
        .in_netns(host)
        .unwrap_or_else(|e| panic!("runtime in {}: {e}", host.name()))
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
    net: crate::netns::NetState,
    links: Vec<String>,
    firewall: Vec<String>,
    sysctls: Vec<String>,
}

/// Snapshots the machine's own network; panics with the reason when it
/// cannot be read (never passes without looking).
pub fn host_network() -> HostNetwork {
    require_root();
    network_of(&Netns::machine().unwrap_or_else(|e| panic!("{e}")))
}

/// The same snapshot of any namespace (tests of the snapshot itself use a
/// throwaway one).
pub fn network_of(ns: &Netns) -> HostNetwork {
    let net = ns
        .snapshot()
        .unwrap_or_else(|e| panic!("links, addresses, routes of {}: {e}", ns.name()));
    let mut links: Vec<String> = net
        .links
        .iter()
        .map(|l| {
            let master = l
                .master
                .and_then(|i| net.link_by_index(i))
                .map(|m| m.name.as_str())
                .unwrap_or("-");
            format!(
                "link {} ({}) mtu {:?} up {} master {master}",
                l.name,
                l.kind.as_deref().unwrap_or("-"),
                l.mtu,
                l.up
            )
        })
        .collect();
    links.sort();
    let sysctls = HOST_SYSCTLS
        .iter()
        .map(|key| {
            let value = cnilab_plugin::netns::read_sysctl(Some(ns.file()), key)
                .unwrap_or_else(|e| format!("unreadable ({})", e.kind()));
            format!("sysctl {key} = {value}")
        })
        .collect();
    HostNetwork {
        firewall: firewall_text(ns),
        net,
        links,
        sysctls,
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
        out.extend(text.lines().filter_map(|line| {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            Some(format!("{tool}: {}", normalize_firewall_line(line)))
        }));
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
        use crate::host_state::new_lines;
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

/// A guard for a root test: snapshots the machine's own network when made,
/// and when dropped at the end of the test compares again and fails the
/// test if anything differs (links, addresses, routes v4/v6, nft and
/// iptables rules, forwarding sysctls). Tests work only in namespaces they
/// create, so the machine's network must be exactly as before.
///
/// ```no_run
/// let _host = cnilab_harness::testing::host_untouched();
/// // ... the test ...
/// ```
#[must_use = "bind it (`let _host = ...`): dropped at once it checks nothing"]
pub struct HostUntouched {
    before: HostNetwork,
}

pub fn host_untouched() -> HostUntouched {
    HostUntouched {
        before: host_network(),
    }
}

impl HostUntouched {
    /// Panics with every difference since the guard was made.
    pub fn check(&self) {
        let changes = host_network().changes_since(&self.before);
        assert!(
            changes.is_empty(),
            "the machine's own network changed during this test:\n  {}",
            changes.join("\n  ")
        );
    }
}

impl Drop for HostUntouched {
    fn drop(&mut self) {
        // A test that already failed keeps its own message.
        if !std::thread::panicking() {
            self.check();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            links: vec!["link lo (-) mtu Some(65536) up true master -".into()],
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
}
