//! Why a namespace linked to a node is one of its pods: evidence, never
//! its name. A pod's name is whatever the node gave it (a CRI sandbox
//! `kube-system/coredns-5d78c9869d-x2x7k`, a runtime's `cni-<uuid>`, a
//! process `pid:4242`), so the name tells nothing; what does:
//! - the node's CRI listed it as a sandbox (recorded at capture);
//! - the node's CNI cache (`/var/lib/cni/results`) has an ADD result for one
//!   of its addresses (recorded at capture);
//! - its default route leads into the node;
//! - the node routes its address to it, or the node's side of its link (or
//!   the bridge that side is a port of) holds its subnet.
//!
//! And what says it is no pod: the node's default route goes through it (a
//! NAT box or a router beside the node). The network evidence is read from
//! the model, so a replay finds it in a capture that did not record it.

use crate::model::{LinkKind, Namespace, Node};
use ipnet::IpNet;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

/// The node's CNI cache, as libcni writes it (read by default only when
/// the capture is of the machine itself: another namespace's node has its
/// own, given with `--cni-cache`).
pub const CNI_CACHE: &str = "/var/lib/cni/results";

/// What the model says about `pod` (one of `node.pods`): the evidence that
/// it is a pod of `node`, or why it is none.
pub fn network(node: &Node, pod: &Namespace) -> Result<Vec<String>, String> {
    let me = &node.net.name;
    // The pod's links into the node, with the node's end.
    let into: Vec<(&str, &str)> = pod
        .links
        .iter()
        .filter_map(|l| {
            let peer = l.veth.as_ref().or(l.lower.as_ref().map(|x| &x.link))?;
            (peer.namespace.as_deref() == Some(me.as_str()))
                .then_some((l.name.as_str(), peer.name.as_str()))
        })
        .collect();
    let addrs = addresses(pod);
    let gateway_of_node = node.net.routes.iter().find(|r| {
        r.dst.prefix_len() == 0
            && r.gateway
                .is_some_and(|g| addrs.iter().any(|a| a.addr() == g))
    });
    if let Some(r) = gateway_of_node {
        let gw = r.gateway.map(|g| g.to_string()).unwrap_or_default();
        return Err(format!(
            "the node's default route goes through it (via {gw}): a gateway beside the node, not a pod"
        ));
    }
    let mut out = Vec::new();
    for r in pod.routes.iter().filter(|r| r.dst.prefix_len() == 0) {
        let dev = r.dev.as_deref();
        if into.iter().any(|(own, _)| Some(*own) == dev) {
            let via = r.gateway.map(|g| format!("via {g} ")).unwrap_or_default();
            out.push(format!(
                "its default route ({}) leads into the node ({via}dev {})",
                r.dst,
                dev.unwrap_or("?")
            ));
            break;
        }
    }
    // The node's ends of the links, and the bridges they are ports of.
    let ends: Vec<&str> = into
        .iter()
        .flat_map(|(_, end)| {
            let bridge = node.net.link(end).and_then(|l| l.controller.as_deref());
            std::iter::once(*end).chain(bridge)
        })
        .collect();
    for a in &addrs {
        let routed = node.net.routes.iter().find(|r| {
            r.dst.prefix_len() > 0
                && r.dst.contains(&a.addr())
                && r.dev.as_deref().is_some_and(|d| ends.contains(&d))
        });
        if let Some(r) = routed {
            out.push(format!(
                "the node routes {} to it ({} dev {})",
                a.addr(),
                r.dst,
                r.dev.as_deref().unwrap_or("?")
            ));
            continue;
        }
        let holder = ends.iter().find_map(|end| {
            let link = node.net.link(end)?;
            let own = link
                .addresses
                .iter()
                .find(|n| n.addr() != a.addr() && n.trunc().contains(&a.addr()))?;
            Some((link.name.as_str(), own))
        });
        if let Some((dev, own)) = holder {
            out.push(format!(
                "the node's {dev} ({own}) holds its address {}",
                a.addr()
            ));
        }
    }
    Ok(out)
}

/// What a replay makes of a namespace the capture linked to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged {
    /// What says it is a pod (recorded at capture, then read from the model).
    pub evidence: Vec<String>,
    /// Why it is not probed (no evidence, evidence against, no address).
    pub skipped: Option<String>,
}

/// Judges `pod` of `node` on the evidence `recorded` at capture and what
/// the model says.
pub fn judge(node: &Node, pod: &Namespace, recorded: &[String]) -> Judged {
    let mut evidence: Vec<String> = recorded.to_vec();
    let read = network(node, pod);
    if let Ok(found) = &read {
        for e in found {
            if !evidence.contains(e) {
                evidence.push(e.clone());
            }
        }
    }
    let skipped = match read {
        Err(against) => Some(against),
        Ok(_) if evidence.is_empty() => Some(
            "nothing says it is a pod (no CRI sandbox, no CNI cache entry, no default route into the node, no route or subnet of the node's to it): beside the lab, not probed".to_string(),
        ),
        Ok(_) if addresses(pod).is_empty() => {
            Some("it has no address yet: listed, not probed".to_string())
        }
        Ok(_) => None,
    };
    Judged {
        evidence: capped(evidence, MAX_EVIDENCE),
        skipped,
    }
}

/// The pod's own addresses (not `lo`'s).
pub fn addresses(pod: &Namespace) -> Vec<IpNet> {
    pod.links
        .iter()
        .filter(|l| l.kind != LinkKind::Loopback)
        .flat_map(|l| l.addresses.iter().copied())
        .collect()
}

/// The most entries and bytes per entry read from a CNI cache: the cache is
/// the node's, so a file that is no cache entry or is huge is passed over.
const MAX_ENTRIES: usize = 20_000;
const MAX_ENTRY_BYTES: u64 = 1 << 20;

/// One ADD result in a CNI cache: its network, container and interface,
/// and the addresses it gave.
#[derive(Debug, PartialEq, Eq)]
pub struct CacheEntry {
    pub network: String,
    pub container: String,
    pub ifname: String,
    pub ips: Vec<IpAddr>,
}

impl CacheEntry {
    /// What the entry says of a pod that holds `ip`.
    pub fn evidence(&self, ip: IpAddr) -> String {
        let short: String = self.container.chars().take(12).collect();
        format!(
            "the node's CNI cache has network {}'s ADD result for container {short} ({} {ip})",
            self.network, self.ifname
        )
    }
}

/// The ADD results in the CNI cache `dir` (libcni's `cniCacheV1` files;
/// others, and unreadable ones, are passed over). A missing directory is
/// an empty cache.
pub fn cni_cache(dir: &Path, warnings: &mut Vec<String>) -> Vec<CacheEntry> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten().take(MAX_ENTRIES) {
        let regular = std::fs::symlink_metadata(entry.path())
            .is_ok_and(|m| m.is_file() && m.len() <= MAX_ENTRY_BYTES);
        if !regular {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        match parse_cache_entry(&text) {
            Some(e) => out.push(e),
            None => warnings.push(format!(
                "CNI cache {}: not a libcni cache entry; passed over",
                entry.path().display()
            )),
        }
    }
    out
}

/// A libcni cache file's network, container, interface and result IPs.
fn parse_cache_entry(text: &str) -> Option<CacheEntry> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    if v.get("kind")?.as_str()? != "cniCacheV1" {
        return None;
    }
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let ips = v
        .get("result")
        .and_then(|r| r.get("ips"))
        .and_then(|i| i.as_array())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.get("address")?.as_str()?.parse::<IpNet>().ok())
        .map(|n| n.addr())
        .collect();
    Some(CacheEntry {
        network: field("networkName")?,
        container: field("containerId")?,
        ifname: field("ifName").unwrap_or_default(),
        ips,
    })
}

/// The capture-time evidence of each pod (by name): its CRI sandbox, the
/// CNI cache entries that hold one of its addresses and the CNI configs
/// whose subnets do.
pub fn recorded(
    pods: &[(String, Option<String>, Vec<IpNet>)],
    cache: &[CacheEntry],
    confs: &[super::cni_conf::Conf],
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, cri, addrs) in pods {
        let mut ev = Vec::new();
        if let Some(sandbox) = cri {
            ev.push(format!("the node's CRI lists it as sandbox {sandbox}"));
        }
        for a in addrs {
            ev.extend(
                cache
                    .iter()
                    .filter(|e| e.ips.contains(&a.addr()))
                    .map(|e| e.evidence(a.addr())),
            );
            ev.extend(confs.iter().filter_map(|c| c.evidence(a.addr())));
        }
        out.insert(name.clone(), capped(ev, RECORDED));
    }
    out
}

/// The most evidence a pod's entry holds (what a capture file may hold).
pub const MAX_EVIDENCE: usize = 64;

/// The most evidence recorded at capture, leaving room for what the model
/// says of the pod ([`judge`] adds it).
const RECORDED: usize = MAX_EVIDENCE - 8;

/// At most `max` entries, the first ones kept (the CRI's word first); a
/// node whose CNI cache kept many stale entries for one address says how
/// many more there were in the last.
fn capped(mut ev: Vec<String>, max: usize) -> Vec<String> {
    if ev.len() > max {
        let more = ev.len() - (max - 1);
        ev.truncate(max - 1);
        ev.push(format!(
            "and {more} more entries (CNI cache entries or configs) that hold its address"
        ));
    }
    ev
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Link, Route, RouteType, VethPeer};

    fn route(dst: &str, gateway: Option<&str>, dev: &str) -> Route {
        Route {
            table: 254,
            kind: RouteType::Unicast,
            dst: dst.parse().expect("dst"),
            gateway: gateway.map(|g| g.parse().expect("gw")),
            dev: Some(dev.into()),
            onlink: false,
            scope: "universe".into(),
            proto: "boot".into(),
            metric: 0,
            src: None,
            nexthops: Vec::new(),
        }
    }

    /// A node with a bridge `cni0` 10.244.1.1/24, a pod `cni-1f0e…` on it
    /// through `veth1`, and a NAT box `vm-nat` its default route goes
    /// through.
    fn node() -> Node {
        let mut net = Namespace::new("node1");
        let mut cni0 = Link::new("cni0", LinkKind::Bridge, true);
        cni0.addresses = vec!["10.244.1.1/24".parse().expect("net")];
        let mut veth = Link::new("veth1", LinkKind::Veth, true);
        veth.controller = Some("cni0".into());
        let mut nat = Link::new("eth1", LinkKind::Veth, true);
        nat.addresses = vec!["10.0.2.15/24".parse().expect("net")];
        net.links = vec![cni0, veth, nat];
        net.routes = vec![route("0.0.0.0/0", Some("10.0.2.2"), "eth1")];
        let mut pod = Namespace::new("cni-1f0e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
        let mut eth0 = Link::new("eth0", LinkKind::Veth, true);
        eth0.addresses = vec!["10.244.1.5/24".parse().expect("net")];
        eth0.veth = Some(VethPeer {
            namespace: Some("node1".into()),
            name: "veth1".into(),
        });
        pod.links = vec![eth0];
        pod.routes = vec![route("0.0.0.0/0", Some("10.244.1.1"), "eth0")];
        let mut box_ = Namespace::new("vm-nat");
        let mut leg = Link::new("eth0", LinkKind::Veth, true);
        leg.addresses = vec!["10.0.2.2/24".parse().expect("net")];
        leg.veth = Some(VethPeer {
            namespace: Some("node1".into()),
            name: "eth1".into(),
        });
        box_.links = vec![leg];
        Node {
            net,
            pod_cidrs: Vec::new(),
            pods: vec![pod, box_],
        }
    }

    #[test]
    fn a_pod_is_known_by_its_routes_and_its_bridge_a_gateway_is_not() {
        let n = node();
        let ev = network(&n, &n.pods[0]).expect("a pod");
        assert_eq!(
            ev,
            vec![
                "its default route (0.0.0.0/0) leads into the node (via 10.244.1.1 dev eth0)",
                "the node's cni0 (10.244.1.1/24) holds its address 10.244.1.5",
            ]
        );
        let not = network(&n, &n.pods[1]).expect_err("a gateway");
        assert!(
            not.contains("default route goes through it (via 10.0.2.2)"),
            "{not}"
        );
    }

    #[test]
    fn a_calico_pod_is_known_by_the_route_to_its_veth() {
        let mut n = node();
        n.net.routes = vec![route("10.65.1.2/32", None, "cali12f00d")];
        n.net.links = vec![Link::new("cali12f00d", LinkKind::Veth, true)];
        let pod = &mut n.pods[0];
        pod.links[0].addresses = vec!["10.65.1.2/32".parse().expect("net")];
        pod.links[0].veth = Some(VethPeer {
            namespace: Some("node1".into()),
            name: "cali12f00d".into(),
        });
        pod.routes = vec![route("0.0.0.0/0", Some("169.254.1.1"), "eth0")];
        let n = n.clone();
        let ev = network(&n, &n.pods[0]).expect("a pod");
        assert!(
            ev.contains(&"the node routes 10.65.1.2 to it (10.65.1.2/32 dev cali12f00d)".into()),
            "{ev:?}"
        );
    }

    #[test]
    fn a_pod_without_an_address_is_listed_and_not_probed() {
        let mut n = node();
        n.pods[0].links[0].addresses.clear();
        let n = n.clone();
        let j = judge(
            &n,
            &n.pods[0],
            &["the node's CRI lists it as sandbox a/b".into()],
        );
        assert_eq!(j.evidence.len(), 2, "{j:?}");
        assert_eq!(
            j.skipped.as_deref(),
            Some("it has no address yet: listed, not probed")
        );
        let gw = judge(&n, &n.pods[1], &[]);
        assert!(
            gw.skipped.is_some_and(|s| s.contains("goes through it")),
            "the gateway's counter-evidence wins"
        );
        let healthy = node();
        assert_eq!(judge(&healthy, &healthy.pods[0], &[]).skipped, None);
    }

    /// A node whose CNI cache kept a hundred stale entries for one pod's
    /// address still makes a capture that loads: the evidence is capped.
    #[test]
    fn stale_cache_entries_are_capped_and_counted() {
        let ev: Vec<String> = (0..100).map(|i| format!("entry {i}")).collect();
        let kept = capped(ev, MAX_EVIDENCE);
        assert_eq!(kept.len(), MAX_EVIDENCE);
        assert_eq!(kept[0], "entry 0");
        assert!(
            kept[MAX_EVIDENCE - 1].starts_with("and 37 more"),
            "{:?}",
            kept.last()
        );
        assert_eq!(
            capped(vec!["one".into()], MAX_EVIDENCE),
            vec!["one".to_string()]
        );
    }

    #[test]
    fn a_namespace_without_evidence_has_none() {
        let mut n = node();
        n.net.links.retain(|l| l.name != "cni0");
        n.net.routes.clear();
        n.pods[0].routes.clear();
        let ev = network(&n, &n.pods[0]).expect("no counter-evidence either");
        assert!(ev.is_empty(), "{ev:?}");
    }

    #[test]
    fn libcni_cache_entries_are_read_and_others_passed_over() {
        let dir = tempfile::tempdir().expect("dir");
        // As libcni writes it: `<network>-<container>-<ifname>`.
        let entry = serde_json::json!({
            "kind": "cniCacheV1",
            "containerId": "5f1c0a9e8d7b6c5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a",
            "config": "eyJjbmlWZXJzaW9uIjoiMS4wLjAifQ==",
            "ifName": "eth0",
            "networkName": "cbr0",
            "cniArgs": [["K8S_POD_NAMESPACE", "kube-system"]],
            "result": {"cniVersion": "1.0.0", "ips": [{"address": "10.244.1.5/24", "gateway": "10.244.1.1"}]}
        });
        std::fs::write(dir.path().join("cbr0-5f1c0a9e8d7b-eth0"), entry.to_string())
            .expect("write");
        std::fs::write(dir.path().join("junk"), "not json").expect("write");
        let mut warnings = Vec::new();
        let cache = cni_cache(dir.path(), &mut warnings);
        assert_eq!(cache.len(), 1, "{cache:?}");
        assert_eq!(
            cache[0].ips,
            vec!["10.244.1.5".parse::<IpAddr>().expect("ip")]
        );
        assert!(warnings.iter().any(|w| w.contains("junk")), "{warnings:?}");
        let pods = vec![(
            "cni-1f0e".to_string(),
            None,
            vec!["10.244.1.5/24".parse().expect("net")],
        )];
        let ev = recorded(&pods, &cache, &[]);
        assert_eq!(
            ev["cni-1f0e"],
            vec!["the node's CNI cache has network cbr0's ADD result for container 5f1c0a9e8d7b (eth0 10.244.1.5)"]
        );
        assert!(cni_cache(&dir.path().join("absent"), &mut warnings).is_empty());
    }
}
