//! Sysctls, nftables tables and iptables-save text, inside a namespace.

use super::{object_error, ApplyError, NotMade, Target};
use crate::model::firewall::iptables_nft_names;
use crate::model::{Backend, NftTable};
use cnilab_net::netns as plugin_netns;
use cnilab_net::nft::NftError;
use std::path::Path;

/// When a sysctl is written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Right after the namespace is made: global ones (`ip_forward`, `all`
    /// first), then `default` (which links made later inherit).
    Namespace,
    /// After the links: `net/ipv{4,6}/conf/<link>/…`.
    Links,
}

/// The link a `net/ipv{4,6}/conf/<link>/<key>` sysctl is about, if any
/// other than `all` and `default`.
fn link_of(key: &str) -> Option<&str> {
    let rest = key
        .strip_prefix("net/ipv4/conf/")
        .or_else(|| key.strip_prefix("net/ipv6/conf/"))?;
    let (link, _) = rest.split_once('/')?;
    (link != "all" && link != "default").then_some(link)
}

/// Whether apply writes `key`: only the per-namespace networking trees
/// (`net/ipv4`, `net/ipv6`, `net/bridge`), a plain path (no `..`, no empty
/// part). A model is outside input (a capture file): a key such as
/// `kernel/…` would change the machine, not the namespace.
pub(crate) fn sysctl_allowed(key: &str) -> bool {
    let plain = key
        .split('/')
        .all(|p| !p.is_empty() && p != "." && p != "..");
    plain
        && ["net/ipv4/", "net/ipv6/", "net/bridge/"]
            .iter()
            .any(|t| key.starts_with(t))
}

/// Writes the sysctls of `stage` on one thread inside the namespace; a key
/// this kernel does not have, or will not take, is not made. A key that
/// already has the value is not written.
pub(super) fn sysctls(t: &Target, stage: Stage) -> Vec<NotMade> {
    let mut keys: Vec<(&String, &String)> = t
        .model
        .sysctls
        .iter()
        .filter(|(k, _)| link_of(k).is_some() == (stage == Stage::Links))
        .collect();
    // `all` (and ip_forward, the same switch) resets every link's value:
    // first; `default` next.
    keys.sort_by_key(|(k, _)| match () {
        _ if k.contains("/all/") || k.as_str() == "net/ipv4/ip_forward" => 0,
        _ if k.contains("/default/") => 1,
        _ => 2,
    });
    if keys.is_empty() {
        return Vec::new();
    }
    let ns = t.model.name.clone();
    let not_made = |key: &str, reason: String| NotMade {
        namespace: ns.clone(),
        object: format!("sysctl {key}"),
        reason,
    };
    let written = plugin_netns::run_in(t.netns.file(), || {
        let mut out = Vec::new();
        let mut tree = crate::model::sysctl::Tree::new();
        for (key, value) in &keys {
            if !sysctl_allowed(key) {
                out.push(not_made(
                    key,
                    "not a namespace's networking sysctl (net/ipv4, net/ipv6, net/bridge): not written".into(),
                ));
                continue;
            }
            match tree.read(key) {
                Ok(v) if v == **value => {}
                Ok(_) => {
                    if let Err(e) = tree.write(key, value) {
                        out.push(not_made(key, format!("write {value:?}: {e}")));
                    }
                }
                Err(e) => out.push(not_made(
                    key,
                    format!("this kernel does not have it here: {e}"),
                )),
            }
        }
        out
    });
    written.unwrap_or_else(|e| vec![not_made("*", format!("enter the namespace: {e}"))])
}

/// Loads the nftables tables (`nft -f -`) and the iptables-save text
/// (`ip[6]tables-<backend>-restore`) of the namespace. An iptables-nft
/// table that has iptables-save text is restored from that text (which
/// keeps its comments and matches nft cannot print), not from nft's.
pub(super) fn firewall(t: &Target) -> Result<Vec<NotMade>, ApplyError> {
    let ns = &t.model.name;
    let file = t.netns.file();
    let mut not_made = Vec::new();
    // The iptables-nft tables the iptables-save text holds (`*filter`); one
    // iptables-nft-save calls incompatible (made by nft itself) is not there.
    let restored: Vec<(String, Vec<String>)> = iptables_nft_names(&t.model.nftables)
        .into_iter()
        .map(|(family, names)| {
            let saved: Vec<String> = t
                .model
                .iptables
                .iter()
                .filter(|i| i.backend == Backend::Nft && i.family == family)
                .flat_map(|i| i.text.lines().filter_map(|l| l.strip_prefix('*')))
                .map(|n| n.trim().to_string())
                .filter(|n| names.contains(n))
                .collect();
            (family, saved)
        })
        .collect();
    let by_iptables = |table: &NftTable| {
        let family = if table.family == "ip6" {
            "ipv6"
        } else {
            "ipv4"
        };
        matches!(table.family.as_str(), "ip" | "ip6")
            && restored
                .iter()
                .any(|(f, names)| f == family && names.contains(&table.name))
    };
    for table in &t.model.nftables {
        if by_iptables(table) {
            continue;
        }
        let what = format!("nftables table {} {}", table.family, table.name);
        cnilab_net::nft::load(Path::new("nft"), Some(file), &table.text).map_err(|e| match e {
            NftError::Failed { stderr, .. } => {
                object_error(ns, &what, format!("nft refused it: {}", stderr.trim()))
            }
            other => object_error(ns, &what, format!("{other} (is nftables installed?)")),
        })?;
    }
    for save in &t.model.iptables {
        let v6 = if save.family == "ipv6" { "6" } else { "" };
        let tool = format!("ip{v6}tables-{}-restore", save.backend);
        let what = format!("{} {} iptables", save.backend, save.family);
        if !save.text.lines().any(|l| l.starts_with('*')) {
            continue;
        }
        let text = format!("{}\n", save.text.trim_end());
        match cnilab_net::nft::run(Path::new(&tool), Some(file), &[], Some(&text)) {
            Ok(_) => {}
            Err(NftError::Spawn { source, .. }) => not_made.push(NotMade {
                namespace: ns.clone(),
                object: what,
                reason: format!("{tool}: {source}"),
            }),
            Err(NftError::Failed { stderr, .. }) => {
                return Err(object_error(
                    ns,
                    what,
                    format!("{tool} refused it: {}", stderr.trim()),
                ))
            }
            Err(other) => return Err(object_error(ns, what, other)),
        }
    }
    for table in t.model.nftables.iter().filter(|t| by_iptables(t)) {
        drop_unused_builtin_chains(t, table)?;
    }
    Ok(not_made)
}

/// The chain names an nft table's text declares (`chain FORWARD {`).
fn chains(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("chain "))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// `ip[6]tables-nft-restore` makes every built-in chain of a table it
/// restores (the save text names them all), where iptables-nft made only
/// the ones used (`iptables -P FORWARD DROP` makes FORWARD alone): those
/// the captured table lacks are deleted again (they are empty, with policy
/// accept, since the save text had nothing for them), so the replay holds
/// the captured table.
fn drop_unused_builtin_chains(t: &Target, table: &NftTable) -> Result<(), ApplyError> {
    const BUILTIN: &[&str] = &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
    let file = t.netns.file();
    let what = format!("nftables table {} {}", table.family, table.name);
    let fail = |e: NftError| object_error(&t.model.name, &what, e);
    let listed = cnilab_net::nft::run(
        Path::new("nft"),
        Some(file),
        &["list", "table", &table.family, &table.name],
        None,
    )
    .map_err(fail)?;
    let wanted = chains(&table.text);
    for chain in chains(&listed) {
        if BUILTIN.contains(&chain) && !wanted.contains(&chain) {
            cnilab_net::nft::run(
                Path::new("nft"),
                Some(file),
                &["delete", "chain", &table.family, &table.name, chain],
                None,
            )
            .map_err(fail)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::sysctl_allowed;

    #[test]
    fn only_a_namespaces_networking_sysctls_are_written() {
        for key in [
            "net/ipv4/ip_forward",
            "net/ipv6/conf/all/forwarding",
            "net/ipv4/conf/cali1/proxy_arp",
            "net/bridge/bridge-nf-call-iptables",
        ] {
            assert!(sysctl_allowed(key), "{key}");
        }
        for key in [
            "kernel/hostname",
            "net/core/rmem_max",
            "net/ipv4/../../kernel/hostname",
            "net/ipv4//ip_forward",
            "/net/ipv4/ip_forward",
            "vm/overcommit_memory",
        ] {
            assert!(!sysctl_allowed(key), "{key}");
        }
    }
}
