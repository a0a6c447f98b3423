//! Address accounting that does not depend on how a plugin stores its
//! leases. Shared by `conform`, `lifecycle` and `soak` (none of which
//! imports another for it).
//!
//! Whether a DEL released an address is decided, in this order, from:
//! 1. host-local's layout (`<dataDir>/<network>/<ip>` files naming the
//!    owner), but only when it applies: the ADD's own address showed up in
//!    it, owned by the pod. Then a record that stays is a leak, and a record
//!    that goes is a release.
//! 2. What later calls show: fresh probe pods are ADDed (and kept) until
//!    the released address is handed out again (released), or the range
//!    runs out without it (held), or a budget is spent (nothing can tell).
//!    Probes also prove that no address is handed out twice while in use.
//!
//! When nothing can tell, the answer says so with the reason; it is never
//! counted as released.

use crate::host_state::{self, Reservation};
use crate::netns::Netns;
use crate::runtime::{NetworkConfig, Runtime, RuntimeConf, RuntimeError};
use ipnet::IpNet;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

/// What is known about one address after its owner was deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// Released, with the evidence.
    Released(String),
    /// Still held, with the evidence.
    Held(String),
    /// Nothing could tell, with the reason.
    Unknown(String),
}

/// Whether host-local's store layout applies to this pod: the store holds
/// a record for one of the ADD's addresses, owned by the pod.
pub fn layout_applies(store: Option<&Path>, container_id: &str, ips: &[IpAddr]) -> bool {
    let Some(dir) = store else { return false };
    host_state::reservations(dir).is_ok_and(|rs| {
        rs.iter()
            .any(|r| r.container_id == container_id && ips.contains(&r.ip))
    })
}

/// The host-local-layout records of one attachment (an empty ifname in a
/// record matches any: old host-local wrote only the container ID).
pub fn held_in_store(store: Option<&Path>, container_id: &str, ifname: &str) -> Vec<Reservation> {
    store
        .and_then(|d| host_state::reservations(d).ok())
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.container_id == container_id && (r.ifname.is_empty() || r.ifname == ifname))
        .collect()
}

/// The store's answer for an attachment whose ADD the layout applied to.
pub fn store_release(store: &Path, container_id: &str, ifname: &str) -> Release {
    let left = held_in_store(Some(store), container_id, ifname);
    if left.is_empty() {
        Release::Released(format!(
            "its record left the host-local store {}",
            store.display()
        ))
    } else {
        Release::Held(format!(
            "{} still reserved for {container_id} in {}",
            left.iter()
                .map(|r| r.ip.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            store.display()
        ))
    }
}

/// The addresses the config's IPAM section can hand out, when it names its
/// ranges the usual ways (`ranges`, `subnet`, `addresses` of static IPAM).
/// Network, broadcast (IPv4) and the first address (gateway) are not counted.
pub fn capacity(net: &NetworkConfig) -> Option<u128> {
    let ipam = net.plugins.first()?.get("ipam")?;
    let mut subnets: Vec<IpNet> = Vec::new();
    if let Some(ranges) = ipam.get("ranges").and_then(Value::as_array) {
        for set in ranges.iter().filter_map(Value::as_array) {
            // A range set is one pool per family; its first range counts.
            if let Some(s) = set
                .first()
                .and_then(|r| r.get("subnet"))
                .and_then(Value::as_str)
            {
                subnets.push(s.parse().ok()?);
            }
        }
    }
    if let Some(s) = ipam.get("subnet").and_then(Value::as_str) {
        subnets.push(s.parse().ok()?);
    }
    let v4: Vec<&IpNet> = subnets.iter().filter(|s| s.addr().is_ipv4()).collect();
    let pick = if v4.is_empty() {
        subnets.iter().collect()
    } else {
        v4
    };
    pick.iter()
        .map(|s| {
            let bits = u32::from(s.max_prefix_len() - s.prefix_len());
            let n = 1u128.checked_shl(bits).unwrap_or(u128::MAX);
            n.saturating_sub(3)
        })
        .min()
}

/// Whether the config's IPAM section names `ip` itself (static IPAM's
/// `addresses`, an `ips`/`address` field): handing it out again, or to
/// several pods, is then by design.
pub fn configured(net: &NetworkConfig, ip: IpAddr) -> bool {
    fn walk(v: &Value, ip: &str) -> bool {
        match v {
            Value::String(t) => t == ip || t.split('/').next() == Some(ip),
            Value::Array(a) => a.iter().any(|x| walk(x, ip)),
            Value::Object(o) => o
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "gateway" | "gw" | "dst" | "subnet"))
                .any(|(_, x)| walk(x, ip)),
            _ => false,
        }
    }
    let ip = ip.to_string();
    net.plugins
        .first()
        .and_then(|p| p.get("ipam"))
        .is_some_and(|ipam| walk(ipam, &ip))
}

/// Whether an ADD error reads like a range that ran out.
pub fn looks_exhausted(msg: &str) -> bool {
    let m = msg.to_lowercase();
    m.contains("exhaust")
        || m.contains("no free")
        || (m.contains("no ") && m.contains("available"))
        || m.contains("range is full")
        || m.contains("out of addresses")
}

/// The outcome of a probe series.
#[derive(Clone, Debug, Default)]
pub struct ProbeOutcome {
    /// Every address handed out, in order, with the probe that got it.
    pub handed_out: Vec<(IpAddr, String)>,
    /// ADDs that succeeded.
    pub adds: usize,
    /// The first ADD failure, if any: (message, reads as exhaustion).
    pub failure: Option<(String, bool)>,
    /// An address handed to a probe while another live probe held it:
    /// (address, holder, second).
    pub duplicates: Vec<(IpAddr, String, String)>,
    /// The budget of ADDs.
    pub budget: usize,
}

impl ProbeOutcome {
    /// What the probes say about `ip`.
    pub fn release_of(&self, ip: IpAddr) -> Release {
        if let Some((n, (_, who))) = self
            .handed_out
            .iter()
            .enumerate()
            .find(|(_, (a, _))| *a == ip)
        {
            return Release::Released(format!(
                "{ip} was handed out again, to probe pod {who} (ADD {} after the DEL)",
                n + 1
            ));
        }
        match &self.failure {
            Some((msg, true)) => Release::Held(format!(
                "{ip} was never handed out again: the range ran out after {} more ADDs ({msg})",
                self.adds
            )),
            Some((msg, false)) => Release::Unknown(format!(
                "{ip} was not handed out again in {} probe ADDs, then an ADD failed with an error that does not read as a full range ({msg})",
                self.adds
            )),
            None => Release::Unknown(format!(
                "{ip} was not handed out again in {} probe ADDs (an allocator may go round the whole range first) and the store is not host-local's layout, so nothing can tell whether it was released",
                self.adds
            )),
        }
    }
}

/// Drives probe pods through a network to see which addresses come back.
pub struct Probe<'a> {
    pub runtime: &'a Runtime,
    pub net: &'a NetworkConfig,
    pub ifname: &'a str,
    /// Container IDs are `<prefix>-<n>`.
    pub prefix: String,
    pub budget: usize,
}

impl Probe<'_> {
    /// ADDs probe pods (keeping them) until every address in `wanted` has
    /// been handed out again, an ADD fails, or the budget is spent; then
    /// DELs them all. `live` are addresses other pods hold right now: one
    /// handed to a probe is a duplicate.
    pub fn run(&self, wanted: &BTreeSet<IpAddr>, live: &BTreeMap<IpAddr, String>) -> ProbeOutcome {
        let mut out = ProbeOutcome {
            budget: self.budget,
            ..ProbeOutcome::default()
        };
        let mut pods: Vec<(Netns, RuntimeConf)> = Vec::new();
        let mut holders: BTreeMap<IpAddr, String> = live.clone();
        let mut missing = wanted.clone();
        for n in 0..self.budget {
            if missing.is_empty() {
                break;
            }
            let ns = match Netns::with_label("probe") {
                Ok(ns) => ns,
                Err(e) => {
                    out.failure = Some((format!("harness: {e}"), false));
                    break;
                }
            };
            let id = format!("{}-{n}", self.prefix);
            let conf = RuntimeConf::new(&id, Some(ns.path()), self.ifname);
            let added = self.runtime.add(self.net, &conf);
            pods.push((ns, conf));
            match added {
                Ok(a) => {
                    out.adds += 1;
                    for ip in a.result.ips.iter().map(|i| i.address.addr()) {
                        if let Some(holder) = holders.get(&ip) {
                            out.duplicates.push((ip, holder.clone(), id.clone()));
                        }
                        holders.insert(ip, id.clone());
                        missing.remove(&ip);
                        out.handed_out.push((ip, id.clone()));
                    }
                }
                Err(e) => {
                    let msg = error_text(&e);
                    let full = looks_exhausted(&msg);
                    out.failure = Some((msg, full));
                    break;
                }
            }
        }
        for (_, conf) in pods.iter().rev() {
            let _ = self.runtime.del(self.net, conf);
        }
        out
    }
}

/// The plugin's message of a failed call, else the error's text.
pub fn error_text(e: &RuntimeError) -> String {
    match e.error_body() {
        Some(b) if !b.details.is_empty() => format!("code {}: {}: {}", b.code, b.msg, b.details),
        Some(b) => format!("code {}: {}", b.code, b.msg),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustion_messages_are_recognized() {
        assert!(looks_exhausted(
            "no IP addresses available in range set: 10.0.0.1-10.0.0.6"
        ));
        assert!(looks_exhausted(
            "no free address in range 10.77.0.0/24: all addresses are reserved"
        ));
        assert!(!looks_exhausted(
            "failed to add route: network is unreachable"
        ));
    }

    #[test]
    fn capacity_reads_ranges_and_subnet() {
        let net = |ipam: &str| {
            let text = format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"x","ipam":{ipam}}}"#);
            NetworkConfig::parse(&text, Path::new("t.conf")).expect("config")
        };
        assert_eq!(
            capacity(&net(r#"{"ranges":[[{"subnet":"10.0.0.0/28"}]]}"#)),
            Some(13)
        );
        assert_eq!(capacity(&net(r#"{"subnet":"10.0.0.0/29"}"#)), Some(5));
        assert_eq!(capacity(&net(r#"{"type":"dhcp"}"#)), None);
    }

    #[test]
    fn a_probe_decides_only_with_evidence() {
        let ip: IpAddr = "10.0.0.5".parse().expect("ip");
        let mut o = ProbeOutcome {
            budget: 4,
            adds: 4,
            ..ProbeOutcome::default()
        };
        assert!(matches!(o.release_of(ip), Release::Unknown(_)));
        o.failure = Some(("code 7: bad".into(), false));
        assert!(matches!(o.release_of(ip), Release::Unknown(_)));
        o.failure = Some(("code 11: no IP addresses available".into(), true));
        assert!(matches!(o.release_of(ip), Release::Held(_)));
        o.handed_out.push((ip, "p-1".into()));
        assert!(matches!(o.release_of(ip), Release::Released(_)));
    }
}
