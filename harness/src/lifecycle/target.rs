//! The network under test ([`Target`]): the host's picture before a pod
//! (what leaked since), the IPAM store's reservations, and the judging of
//! released addresses.

use crate::accounting::{self, Release};
use crate::host_state::{self, Reservation};
use crate::netns::{NetState, Netns, NetnsError};
use crate::runtime::{NetworkConfig, Runtime};
use crate::verdict::Finding;
use cnilab_net::spec::CniResult;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;

/// The host-side picture taken before a pod is added.
#[derive(Clone, Debug)]
pub struct HostSnapshot {
    pub net: NetState,
    pub rules: Option<Vec<String>>,
    pub reservations: Vec<Reservation>,
}

/// The network under test, as a check drives it: the runtime, the host
/// namespace the plugins run in, the config and its IPAM store (what
/// `runtime::session::Session` sets up, borrowed).
pub struct Target<'a> {
    pub runtime: &'a Runtime,
    pub host: &'a Netns,
    pub net: &'a NetworkConfig,
    /// `<dataDir>/<network>` when the IPAM store is host-local style.
    pub store: Option<PathBuf>,
}

impl<'a> Target<'a> {
    pub fn new(runtime: &'a Runtime, host: &'a Netns, net: &'a NetworkConfig) -> Target<'a> {
        Target {
            runtime,
            host,
            net,
            store: net.ipam_store_dir(),
        }
    }

    pub fn reservations(&self) -> Vec<Reservation> {
        self.store
            .as_deref()
            .and_then(|d| host_state::reservations(d).ok())
            .unwrap_or_default()
    }

    pub fn reservations_of(&self, container_id: &str, ifname: &str) -> Vec<Reservation> {
        self.reservations()
            .into_iter()
            .filter(|r| {
                r.container_id == container_id && (r.ifname.is_empty() || r.ifname == ifname)
            })
            .collect()
    }

    /// Whether host-local's layout applies to this pod's store records.
    pub fn layout_applies(&self, container_id: &str, result: &CniResult) -> bool {
        let ips: Vec<IpAddr> = result.ips.iter().map(|i| i.address.addr()).collect();
        accounting::layout_applies(self.store.as_deref(), container_id, &ips)
    }

    /// Probes the network for `pending` released addresses and turns what
    /// comes back into findings (PASS released, FAIL held, SKIP when
    /// nothing can tell). Two probe pods with one address is an A12 FAIL.
    pub fn judge_releases(&self, ifname: &str, prefix: &str, pending: &[Pending]) -> Vec<Finding> {
        self.judge_releases_beside(ifname, prefix, pending, &BTreeMap::new())
    }

    /// [`Target::judge_releases`] while other pods are live (`live`: their
    /// addresses and IDs): handing one of those to a probe is an A12 FAIL.
    pub fn judge_releases_beside(
        &self,
        ifname: &str,
        prefix: &str,
        pending: &[Pending],
        live: &BTreeMap<IpAddr, String>,
    ) -> Vec<Finding> {
        // An address the config assigns by name (static IPAM) has no
        // allocation to release: nothing to judge.
        let (fixed, pending): (Vec<&Pending>, Vec<&Pending>) = pending
            .iter()
            .partition(|p| accounting::configured(self.net, p.ip));
        let mut out: Vec<Finding> = fixed
            .iter()
            .map(|p| {
                Finding::skip(
                    p.id,
                    format!(
                        "{}: not applicable: {} is assigned by the config (static IPAM), there is no allocation to release",
                        p.what, p.ip
                    ),
                )
            })
            .collect();
        if pending.is_empty() {
            return out;
        }
        let wanted: BTreeSet<IpAddr> = pending.iter().map(|p| p.ip).collect();
        let budget = accounting::capacity(self.net)
            .map(|c| c.min(64) as usize + 1)
            .unwrap_or(16);
        let probe = accounting::Probe {
            runtime: self.runtime,
            net: self.net,
            ifname,
            prefix: format!("{prefix}-probe"),
            budget,
        };
        let outcome = probe.run(&wanted, live);
        out.extend(outcome.duplicates.iter().map(|(ip, a, b)| {
            Finding::fail(
                "A12",
                format!("{ip} was handed to probe pod {b} while pod {a} still held it"),
            )
        }));
        for p in pending {
            out.push(release_finding(p, outcome.release_of(p.ip)));
        }
        out
    }

    pub fn snapshot(&self) -> Result<HostSnapshot, NetnsError> {
        Ok(HostSnapshot {
            net: self.host.snapshot()?,
            rules: host_state::firewall_rules(self.host),
            reservations: self.reservations(),
        })
    }

    /// What changed in the host namespace since `before`, ignoring the
    /// bridges a plugin keeps for later pods. Empty when nothing leaked.
    pub fn leaks_since(
        &self,
        before: &HostSnapshot,
        keep: &[String],
    ) -> Result<Vec<String>, NetnsError> {
        let now = self.snapshot()?;
        let mut out = now.net.added_since(&before.net, keep);
        if let (Some(b), Some(a)) = (&before.rules, &now.rules) {
            for rule in host_state::new_lines(b, a) {
                out.push(format!("new firewall rule: {rule}"));
            }
        }
        for r in &now.reservations {
            if !before.reservations.contains(r) {
                out.push(format!(
                    "new reservation {} for container {} ifname {}",
                    r.ip, r.container_id, r.ifname
                ));
            }
        }
        Ok(out)
    }

    /// Names of bridges (kind `bridge`) in the host that a result lists.
    pub fn bridges_in(&self, result: &CniResult) -> Vec<String> {
        let Ok(links) = self.host.links() else {
            return Vec::new();
        };
        links
            .into_iter()
            .filter(|l| l.kind.as_deref() == Some("bridge"))
            .filter(|l| {
                result
                    .interfaces
                    .iter()
                    .any(|i| i.sandbox.is_none() && i.name == l.name)
            })
            .map(|l| l.name)
            .collect()
    }

    /// Host-side veths a result lists (no sandbox, kind `veth` in the host).
    pub fn host_veths_in(&self, result: &CniResult) -> Vec<String> {
        let Ok(links) = self.host.links() else {
            return Vec::new();
        };
        result
            .interfaces
            .iter()
            .filter(|i| i.sandbox.is_none())
            .filter(|i| {
                links
                    .iter()
                    .any(|l| l.name == i.name && l.kind.as_deref() == Some("veth"))
            })
            .map(|i| i.name.clone())
            .collect()
    }
}

/// An address whose DEL exited 0 and whose release is still to be judged
/// (the store is not host-local's layout).
#[derive(Clone, Debug)]
pub struct Pending {
    pub id: &'static str,
    pub ip: IpAddr,
    /// What was deleted, e.g. "DEL with CNI_NETNS unset of cnilab-lc-nonetns".
    pub what: String,
}

/// The finding for a judged release.
pub fn release_finding(p: &Pending, release: Release) -> Finding {
    match release {
        Release::Released(why) => Finding::pass(
            p.id,
            format!("{}: address {} released ({why})", p.what, p.ip),
        ),
        Release::Held(why) => Finding::fail(
            p.id,
            format!(
                "{}: exited 0 but address {} was not released: {why}",
                p.what, p.ip
            ),
        ),
        Release::Unknown(why) => Finding::skip(
            p.id,
            format!(
                "{}: inconclusive whether address {} was released: {why}",
                p.what, p.ip
            ),
        ),
    }
}

/// The addresses of a result.
pub fn ips_of(result: &CniResult) -> Vec<IpAddr> {
    result.ips.iter().map(|i| i.address.addr()).collect()
}
