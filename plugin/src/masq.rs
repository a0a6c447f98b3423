//! Masquerade for `ipMasq`: traffic from a pod address that leaves the
//! pod's range is SNATed to the node.
//!
//! nftables: one table per network, `inet cnilab_<hash>`, holding a set of
//! pod addresses per family and a postrouting chain whose rules come from
//! the config. The table also holds an empty marker set named after a hash
//! of those rules (`rules_<hash>`): when it is there, the rules are the
//! config's and a pod's ADD only adds its address to the set, over netlink
//! (`cnilab_net::nftnl`, one atomic batch, no process); otherwise (the
//! node's first ADD, or a config with other rules) the whole ruleset is
//! (re)loaded with `nft -f -`, its chain flushed first so rules never pile
//! up. DEL removes the address over netlink (a missing table or set: nothing
//! to remove). Where `nft` is missing, iptables rules tagged with a comment.

use crate::error::{CniError, Result};
use cnilab_net::naming::fnv1a;
use cnilab_net::nftnl::{self, ElementOp, SetChange};
use ipnet::IpNet;
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};

/// The nftables table of a network (a hash, so the network name never
/// reaches the nft parser).
pub fn table_name(network: &str) -> String {
    format!("cnilab_{:08x}", fnv1a(network.as_bytes()) as u32)
}

fn nft_available() -> bool {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft", "/bin/nft"]
        .iter()
        .any(|p| Path::new(p).exists())
}

/// Which firewall tool is used here.
pub fn backend() -> &'static str {
    if use_nft() {
        "nft"
    } else {
        "iptables"
    }
}

fn set_decls(table: &str) -> String {
    format!(
        "add table inet {table}\n\
         add set inet {table} pods4 {{ type ipv4_addr; }}\n\
         add set inet {table} pods6 {{ type ipv6_addr; }}\n"
    )
}

fn elements(ips: &[IpAddr]) -> (String, String) {
    let join = |v4: bool| {
        ips.iter()
            .filter(|ip| ip.is_ipv4() == v4)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    (join(true), join(false))
}

/// The marker set whose presence says the table holds exactly the rules of
/// `subnets` (a hash of the rules' text).
pub fn rules_marker(network: &str, subnets: &[IpNet]) -> String {
    format!("rules_{:016x}", fnv1a(rules(network, subnets).as_bytes()))
}

/// The nft batch that masquerades `ips` (pods of `subnets`).
pub fn add_batch(network: &str, subnets: &[IpNet], ips: &[IpAddr]) -> String {
    let table = table_name(network);
    let mut s = rules(network, subnets);
    s.push_str(&format!(
        "add set inet {table} {} {{ type ipv4_addr; }}\n",
        rules_marker(network, subnets)
    ));
    let (e4, e6) = elements(ips);
    if !e4.is_empty() {
        s.push_str(&format!("add element inet {table} pods4 {{ {e4} }}\n"));
    }
    if !e6.is_empty() {
        s.push_str(&format!("add element inet {table} pods6 {{ {e6} }}\n"));
    }
    s
}

/// The table, its sets and its chain, flushed and refilled from `subnets`.
fn rules(network: &str, subnets: &[IpNet]) -> String {
    let table = table_name(network);
    let mut s = set_decls(&table);
    s.push_str(&format!(
        "add chain inet {table} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         flush chain inet {table} postrouting\n"
    ));
    for (v4, proto, set) in [(true, "ip", "pods4"), (false, "ip6", "pods6")] {
        let nets: Vec<String> = subnets
            .iter()
            .filter(|n| n.addr().is_ipv4() == v4)
            .map(|n| n.trunc().to_string())
            .collect();
        if nets.is_empty() {
            continue;
        }
        let multicast = if v4 { "224.0.0.0/4" } else { "ff00::/8" };
        s.push_str(&format!(
            "add rule inet {table} postrouting {proto} saddr @{set} {proto} daddr != {{ {} }} {proto} daddr != {multicast} masquerade\n",
            nets.join(", ")
        ));
    }
    s
}

/// The per-family changes of the pod sets: `ops` applied to each family's
/// addresses in `ips`.
fn set_changes<'a>(
    table: &'a str,
    v4: &'a [IpAddr],
    v6: &'a [IpAddr],
    ops: &[ElementOp],
) -> Vec<SetChange<'a>> {
    let mut changes = Vec::new();
    for (set, elements) in [("pods4", v4), ("pods6", v6)] {
        for &op in ops {
            changes.push(SetChange {
                table,
                set,
                op,
                elements,
            });
        }
    }
    changes
}

fn split_families(ips: &[IpAddr]) -> (Vec<IpAddr>, Vec<IpAddr>) {
    ips.iter().partition(|ip| ip.is_ipv4())
}

/// ADD over netlink when the marker says the rules are in place; `false`
/// when they are not (or netlink is not available): load them with nft.
fn add_over_netlink(network: &str, subnets: &[IpNet], ips: &[IpAddr]) -> Result<bool> {
    let Ok(socket) = nftnl::Socket::open() else {
        return Ok(false);
    };
    let table = table_name(network);
    let marker = rules_marker(network, subnets);
    match socket.set_exists(nftnl::FAMILY_INET, &table, &marker) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(e) => return Err(CniError::kernel("look up the masquerade rules", e)),
    }
    let (v4, v6) = split_families(ips);
    match socket.apply(
        nftnl::FAMILY_INET,
        &set_changes(&table, &v4, &v6, &[ElementOp::Add]),
    ) {
        Ok(()) => Ok(true),
        // The table went away meanwhile: load it all.
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => Ok(false),
        Err(e) => Err(CniError::kernel(
            format!("masquerade {ips:?} in table inet {table}"),
            e,
        )),
    }
}

/// Stops masquerading `ips` over netlink, in one batch. Adding before
/// deleting makes the delete succeed whether or not the element was there:
/// DEL is idempotent. No table or set: nothing to remove.
fn del_over_netlink(network: &str, ips: &[IpAddr]) -> Result<()> {
    let table = table_name(network);
    let socket = nftnl::Socket::open().map_err(|e| CniError::kernel("netfilter netlink", e))?;
    let (v4, v6) = split_families(ips);
    let changes = set_changes(&table, &v4, &v6, &[ElementOp::Add, ElementOp::Delete]);
    match socket.apply(nftnl::FAMILY_INET, &changes) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => Ok(()),
        Err(e) => Err(CniError::kernel(
            format!("unmasquerade {ips:?} in table inet {table}"),
            e,
        )),
    }
}

fn run_nft(batch: &str) -> Result<()> {
    use cnilab_net::nft::{self, NftError};
    nft::load(Path::new("nft"), None, batch).map_err(|e| match e {
        NftError::Spawn { source, .. } => CniError::kernel("run nft", source),
        NftError::Io { what, source } => CniError::kernel(what, source),
        e @ NftError::Deadline { .. } => CniError::kernel("run nft", e),
        NftError::Failed { stderr, .. } => {
            CniError::kernel("nft masquerade batch failed", stderr).with_details(batch.to_string())
        }
    })
}

fn iptables(v4: bool, args: &[&str]) -> std::io::Result<bool> {
    let bin = if v4 { "iptables" } else { "ip6tables" };
    Ok(Command::new(bin)
        .args(["-w", "5", "-t", "nat"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?
        .success())
}

/// The iptables chain of a network (same hash as the nft table).
pub fn chain_name(network: &str) -> String {
    format!("CNILAB-{:08X}", fnv1a(network.as_bytes()) as u32)
}

/// The `iptables-restore --noflush` input that (re)defines the network's
/// chain — RETURN for the pod range and the excluded destinations,
/// MASQUERADE for the rest — and jumps to it from POSTROUTING for `ips`.
/// Declaring the chain in the header flushes it, so the load is atomic and
/// its rules never pile up.
pub fn iptables_restore_input(
    network: &str,
    subnets: &[IpNet],
    ips: &[IpAddr],
    v4: bool,
) -> String {
    let chain = chain_name(network);
    let mut s = format!("*nat\n:{chain} - [0:0]\n");
    for net in subnets.iter().filter(|n| n.addr().is_ipv4() == v4) {
        s.push_str(&format!("-A {chain} -d {} -j RETURN\n", net.trunc()));
    }
    let multicast = if v4 { "224.0.0.0/4" } else { "ff00::/8" };
    s.push_str(&format!(
        "-A {chain} -d {multicast} -j RETURN\n-A {chain} -j MASQUERADE\n"
    ));
    for ip in ips.iter().filter(|ip| ip.is_ipv4() == v4) {
        let host = if v4 { 32 } else { 128 };
        s.push_str(&format!(
            "-A POSTROUTING -s {ip}/{host} -m comment --comment {chain} -j {chain}\n"
        ));
    }
    s.push_str("COMMIT\n");
    s
}

fn iptables_restore(v4: bool, input: &str) -> Result<()> {
    let bin = if v4 {
        "iptables-restore"
    } else {
        "ip6tables-restore"
    };
    let mut child = Command::new(bin)
        .args(["-w", "5", "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CniError::kernel(format!("run {bin}"), e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| CniError::kernel(format!("write {bin} input"), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::kernel(format!("wait for {bin}"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(CniError::kernel(
            format!("{bin} masquerade rules failed"),
            String::from_utf8_lossy(&out.stderr).trim(),
        )
        .with_details(input.to_string()))
    }
}

/// Which firewall backend to use: nft, unless it is missing or
/// `CNILAB_FIREWALL=iptables` asks for iptables.
fn use_nft() -> bool {
    match std::env::var("CNILAB_FIREWALL").as_deref() {
        Ok("iptables") => false,
        Ok("nft") => true,
        _ => nft_available(),
    }
}

/// Starts masquerading for `ips`.
pub fn add(network: &str, subnets: &[IpNet], ips: &[IpAddr]) -> Result<()> {
    if use_nft() {
        if add_over_netlink(network, subnets, ips)? {
            return Ok(());
        }
        return run_nft(&add_batch(network, subnets, ips));
    }
    for v4 in [true, false] {
        if ips.iter().any(|ip| ip.is_ipv4() == v4) {
            iptables_restore(v4, &iptables_restore_input(network, subnets, ips, v4))?;
        }
    }
    Ok(())
}

/// Stops masquerading for `ips`; absent rules are not an error.
pub fn del(network: &str, _subnets: &[IpNet], ips: &[IpAddr]) -> Result<()> {
    if ips.is_empty() {
        return Ok(());
    }
    if use_nft() {
        return del_over_netlink(network, ips);
    }
    let chain = chain_name(network);
    for ip in ips {
        let host = format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 });
        let args = [
            "-D",
            "POSTROUTING",
            "-s",
            &host,
            "-m",
            "comment",
            "--comment",
            &chain,
            "-j",
            &chain,
        ];
        // Repeat: a re-run ADD may have added the jump twice.
        while iptables(ip.is_ipv4(), &args).map_err(|e| CniError::kernel("run iptables", e))? {}
    }
    Ok(())
}

/// The pod addresses currently in the network's masquerade sets (nft only).
pub fn listed(network: &str) -> Result<Vec<IpAddr>> {
    if !use_nft() {
        return Ok(Vec::new());
    }
    let table = table_name(network);
    let mut out = Vec::new();
    for set in ["pods4", "pods6"] {
        use cnilab_net::nft::{self, NftError};
        let args = ["list", "set", "inet", &table, set];
        let text = match nft::run(Path::new("nft"), None, &args, None) {
            Ok(text) => text,
            // No such table or set yet: nothing masqueraded.
            Err(NftError::Failed { .. }) => continue,
            Err(e) => return Err(CniError::kernel("run nft", e)),
        };
        if let Some(body) = text.split("elements = {").nth(1) {
            let body = body.split('}').next().unwrap_or("");
            out.extend(
                body.split(',')
                    .filter_map(|e| e.trim().parse::<IpAddr>().ok()),
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_built_from_parsed_values_only() {
        let subnets: Vec<IpNet> = vec![
            "10.1.0.0/24".parse().expect("net"),
            "fd00:1::/64".parse().expect("net"),
        ];
        let ips: Vec<IpAddr> = vec![
            "10.1.0.5".parse().expect("ip"),
            "fd00:1::5".parse().expect("ip"),
        ];
        let table = table_name("my \"net\"; flush ruleset");
        assert!(table.starts_with("cnilab_") && table.len() == 15);
        let add = add_batch("n", &subnets, &ips);
        assert!(add.contains("flush chain inet cnilab_"));
        assert!(add.contains("ip saddr @pods4 ip daddr != { 10.1.0.0/24 }"));
        assert!(add.contains("ip6 saddr @pods6 ip6 daddr != { fd00:1::/64 }"));
        assert!(add.contains("add element inet") && add.contains("{ 10.1.0.5 }"));
        let restore = iptables_restore_input("n", &subnets, &ips, true);
        let chain = chain_name("n");
        assert!(restore.starts_with(&format!("*nat\n:{chain} - [0:0]\n")));
        assert!(restore.contains(&format!("-A {chain} -d 10.1.0.0/24 -j RETURN")));
        assert!(restore.contains(&format!(
            "-A POSTROUTING -s 10.1.0.5/32 -m comment --comment {chain} -j {chain}"
        )));
        assert!(!restore.contains("fd00"), "v4 input has no v6 address");
        assert!(restore.ends_with("COMMIT\n"));
        let marker = rules_marker("n", &subnets);
        assert!(add.contains(&format!(
            "add set inet {table_n} {marker} ",
            table_n = table_name("n")
        )));
        assert_eq!(marker, rules_marker("n", &subnets), "stable");
        assert_ne!(
            marker,
            rules_marker("n", &subnets[..1]),
            "other rules, other marker"
        );
        assert_ne!(
            marker,
            rules_marker("m", &subnets),
            "other table, other marker"
        );
        let (v4, v6) = split_families(&ips);
        let changes = set_changes("t", &v4, &v6, &[ElementOp::Add, ElementOp::Delete]);
        let sets: Vec<(&str, ElementOp, usize)> = changes
            .iter()
            .map(|c| (c.set, c.op, c.elements.len()))
            .collect();
        assert_eq!(
            sets,
            [
                ("pods4", ElementOp::Add, 1),
                ("pods4", ElementOp::Delete, 1),
                ("pods6", ElementOp::Add, 1),
                ("pods6", ElementOp::Delete, 1)
            ]
        );
    }
}
