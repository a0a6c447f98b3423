//! Masquerade for `ipMasq`: traffic from a pod address that leaves the
//! pod's range is SNATed to the node.
//!
//! nftables: one table per network, `inet cnilab_<hash>`, holding a set of
//! pod addresses per family and a postrouting chain whose rules are rebuilt
//! from the config on every ADD (so they never pile up). A pod's ADD adds its
//! address to the set, DEL removes it; the batch is atomic, fed to `nft -f -`
//! on stdin. Where `nft` is missing, iptables rules tagged with a comment.

use crate::error::{CniError, Result};
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

/// FNV-1a, 64-bit: stable names derived from input without an extra crate.
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn nft_available() -> bool {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft", "/bin/nft"]
        .iter()
        .any(|p| Path::new(p).exists())
}

/// Which firewall tool is used here.
pub fn backend() -> &'static str {
    if nft_available() {
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

/// The nft batch that masquerades `ips` (pods of `subnets`).
pub fn add_batch(network: &str, subnets: &[IpNet], ips: &[IpAddr]) -> String {
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
    let (e4, e6) = elements(ips);
    if !e4.is_empty() {
        s.push_str(&format!("add element inet {table} pods4 {{ {e4} }}\n"));
    }
    if !e6.is_empty() {
        s.push_str(&format!("add element inet {table} pods6 {{ {e6} }}\n"));
    }
    s
}

/// The nft batch that stops masquerading `ips`. Adding before deleting makes
/// the delete succeed whether or not the element was there: DEL is idempotent.
pub fn del_batch(network: &str, ips: &[IpAddr]) -> String {
    let table = table_name(network);
    let mut s = set_decls(&table);
    let (e4, e6) = elements(ips);
    for (set, e) in [("pods4", e4), ("pods6", e6)] {
        if !e.is_empty() {
            s.push_str(&format!(
                "add element inet {table} {set} {{ {e} }}\ndelete element inet {table} {set} {{ {e} }}\n"
            ));
        }
    }
    s
}

fn run_nft(batch: &str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CniError::kernel("run nft", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(batch.as_bytes())
            .map_err(|e| CniError::kernel("write nft batch", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::kernel("wait for nft", e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(CniError::kernel(
            "nft masquerade batch failed",
            String::from_utf8_lossy(&out.stderr).trim(),
        )
        .with_details(batch.to_string()))
    }
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

fn iptables_rule(network: &str, ip: IpAddr, subnets: &[IpNet]) -> Vec<String> {
    let v4 = ip.is_ipv4();
    let dst: Vec<String> = subnets
        .iter()
        .filter(|n| n.addr().is_ipv4() == v4)
        .map(|n| n.trunc().to_string())
        .collect();
    let mut rule = vec!["POSTROUTING".to_string(), "-s".into(), ip.to_string()];
    if let Some(d) = dst.first() {
        rule.extend(["!".into(), "-d".into(), d.clone()]);
    }
    rule.extend([
        "-m".into(),
        "comment".into(),
        "--comment".into(),
        table_name(network),
        "-j".into(),
        "MASQUERADE".into(),
    ]);
    rule
}

/// Starts masquerading for `ips`.
pub fn add(network: &str, subnets: &[IpNet], ips: &[IpAddr]) -> Result<()> {
    if nft_available() {
        return run_nft(&add_batch(network, subnets, ips));
    }
    for ip in ips {
        let rule = iptables_rule(network, *ip, subnets);
        let args: Vec<&str> = rule.iter().map(String::as_str).collect();
        let mut check = vec!["-C"];
        check.extend(&args);
        let exists =
            iptables(ip.is_ipv4(), &check).map_err(|e| CniError::kernel("run iptables", e))?;
        if !exists {
            let mut append = vec!["-A"];
            append.extend(&args);
            if !iptables(ip.is_ipv4(), &append).map_err(|e| CniError::kernel("run iptables", e))? {
                return Err(CniError::kernel(
                    format!("masquerade rule for {ip}"),
                    "iptables -A failed",
                ));
            }
        }
    }
    Ok(())
}

/// Stops masquerading for `ips`; absent rules are not an error.
pub fn del(network: &str, subnets: &[IpNet], ips: &[IpAddr]) -> Result<()> {
    if ips.is_empty() {
        return Ok(());
    }
    if nft_available() {
        return run_nft(&del_batch(network, ips));
    }
    for ip in ips {
        let rule = iptables_rule(network, *ip, subnets);
        let mut args = vec!["-D"];
        args.extend(rule.iter().map(String::as_str));
        // Repeat: an interrupted ADD may have appended twice.
        while iptables(ip.is_ipv4(), &args).map_err(|e| CniError::kernel("run iptables", e))? {}
    }
    Ok(())
}

/// The pod addresses currently in the network's masquerade sets (nft only).
pub fn listed(network: &str) -> Result<Vec<IpAddr>> {
    if !nft_available() {
        return Ok(Vec::new());
    }
    let table = table_name(network);
    let mut out = Vec::new();
    for set in ["pods4", "pods6"] {
        let o = Command::new("nft")
            .args(["list", "set", "inet", &table, set])
            .stderr(Stdio::null())
            .output()
            .map_err(|e| CniError::kernel("run nft", e))?;
        if !o.status.success() {
            continue;
        }
        let text = String::from_utf8_lossy(&o.stdout);
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
        let del = del_batch("n", &ips[..1]);
        assert!(del.contains("delete element inet"));
        assert!(
            !del.contains("fd00:1::5"),
            "no v6 element for a v4-only delete"
        );
    }
}
