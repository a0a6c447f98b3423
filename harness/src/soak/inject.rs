//! `--inject-leaks N`: plants what a crashed runtime or plugin leaves
//! behind — N reservations with no pod in a host-local-layout store, and one
//! veth on the pods' bridge with no pod, named for the last reservation's
//! attachment — so that the account can show
//! whether the plugin's GC reclaims them (and that the account sees them
//! when it does not).

use super::{SoakError, SoakOptions};
use crate::netns::Netns;
use crate::runtime::NetworkConfig;
use ipnet::IpNet;
use serde_json::Value;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What was planted.
#[derive(Debug, Default)]
pub(super) struct Planted {
    pub records: Vec<IpAddr>,
    pub links: Vec<String>,
    pub container_ids: Vec<String>,
}

fn injected_id(i: usize) -> String {
    format!("soak-leak-{i}")
}

/// The first range's subnet and last address of the first plugin's IPAM
/// config (`ranges[0][0]` or the `subnet` shorthand).
fn first_range(net: &NetworkConfig) -> Option<(IpNet, Option<IpAddr>)> {
    let ipam = net.plugins.first()?.get("ipam")?;
    let range = ipam
        .get("ranges")
        .and_then(|r| r.get(0))
        .and_then(|s| s.get(0))
        .unwrap_or(ipam);
    let subnet: IpNet = range.get("subnet")?.as_str()?.parse().ok()?;
    let end = range
        .get("rangeEnd")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok());
    Some((subnet.trunc(), end))
}

/// Addresses counting down from the end of the range (where a round-robin
/// allocator arrives last), skipping any that already have a record.
fn leak_addresses(net: &NetworkConfig, dir: &Path, n: usize) -> Vec<IpAddr> {
    let Some((subnet, end)) = first_range(net) else {
        return Vec::new();
    };
    let last = match (end, subnet) {
        (Some(e), _) => e,
        (None, IpNet::V4(v4)) => IpAddr::V4((u32::from(v4.broadcast()).saturating_sub(1)).into()),
        (None, IpNet::V6(v6)) => IpAddr::V6(v6.broadcast()),
    };
    let first = cnilab_net::naming::to_u128(subnet.network());
    let mut out = Vec::new();
    let mut at = cnilab_net::naming::to_u128(last);
    while out.len() < n && at > first + 1 {
        let ip = cnilab_net::naming::from_u128(last.is_ipv4(), at);
        if !dir.join(ip.to_string()).exists() {
            out.push(ip);
        }
        at -= 1;
    }
    out
}

pub(super) fn plant(
    host: &Netns,
    net: &NetworkConfig,
    store_dir: Option<&Path>,
    opts: &SoakOptions,
) -> Result<Planted, SoakError> {
    let mut planted = Planted::default();
    let fail = |m: String| SoakError::Inject(m);
    let dir = store_dir.filter(|d| d.is_dir()).ok_or_else(|| {
        fail("the plugin keeps no host-local-layout store to plant records in".into())
    })?;
    let ips = leak_addresses(net, dir, opts.inject_leaks);
    if ips.len() < opts.inject_leaks {
        return Err(fail(format!(
            "found only {} free addresses in the first range of the config",
            ips.len()
        )));
    }
    for (i, ip) in ips.into_iter().enumerate() {
        let id = injected_id(i);
        let path = dir.join(ip.to_string());
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{id}\r\n{}", opts.ifname).as_bytes()))
            .map_err(|e| fail(format!("write {}: {e}", path.display())))?;
        planted.records.push(ip);
        planted.container_ids.push(id);
    }
    // One stray veth, named the way cnilab-bridge names host veths, for the
    // attachment of the last planted record (what a plugin killed after
    // its reservation and its veth leaves), and enslaved where the live
    // pods' host veths are (the bridge). A plugin may remove an unmarked
    // link only when its own store proves the link was its attachment's.
    let links = host.links()?;
    let bridge = links
        .iter()
        .filter(|l| l.kind.as_deref() == Some("veth"))
        .find_map(|l| l.controller)
        .or_else(|| {
            let name = net.plugins.first()?.get("bridge")?.as_str()?;
            links.iter().find(|l| l.name == name).map(|l| l.index)
        });
    let id = injected_id(opts.inject_leaks.saturating_sub(1));
    let name = cnilab_net::naming::host_veth_name(&id, &opts.ifname);
    let peer = "soakleakpeer";
    let msg = cnilab_net::nl::veth_message(&name, peer, host.file(), None, bridge);
    host.netlink(move |h| async move { h.link().add(msg).execute().await })?;
    planted.links.push(name);
    planted.links.push(peer.to_string());
    Ok(planted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn net(text: &str) -> NetworkConfig {
        NetworkConfig::parse(text, Path::new("t.conf")).expect("parses")
    }

    #[test]
    fn leak_addresses_come_from_the_end_of_the_first_range() {
        let dir = crate::util::ScratchDir::new("inject-test").expect("scratch");
        std::fs::write(dir.path().join("10.7.0.254"), "x\r\neth0").expect("write");
        let n = net(
            r#"{"cniVersion":"1.1.0","name":"n","type":"b","ipam":{"ranges":[[{"subnet":"10.7.0.0/24"}]]}}"#,
        );
        let got: Vec<String> = leak_addresses(&n, dir.path(), 2)
            .iter()
            .map(|i| i.to_string())
            .collect();
        assert_eq!(got, ["10.7.0.253", "10.7.0.252"]);
        let n = net(
            r#"{"cniVersion":"1.1.0","name":"n","type":"b","ipam":{"subnet":"10.8.0.0/16","rangeEnd":"10.8.1.9"}}"#,
        );
        assert_eq!(leak_addresses(&n, dir.path(), 1)[0].to_string(), "10.8.1.9");
        let n = net(r#"{"cniVersion":"1.1.0","name":"n","type":"b"}"#);
        assert!(leak_addresses(&n, dir.path(), 1).is_empty());
    }
}
