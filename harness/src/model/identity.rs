//! `read(build(t)) == compile(t)`: what the plugin made is checked by its
//! structure and taken out, the read model is normalised against the
//! compiled one (see the rules in `model/mod.rs`), and every difference is
//! named: namespace, object, field, compiled value, read value.

use super::{LabModel, Link, LinkKind, Namespace};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The compiled model ready to compare with `read`: its pod placeholders
/// bound to the addresses the plugin gave, its nftables tables as nft
/// prints them (root: loads each into a throwaway namespace).
pub fn expected(compiled: &LabModel, read: &LabModel) -> Result<LabModel, String> {
    let mut expected = compiled.clone();
    bind_pod_addresses(&mut expected, read)?;
    super::read::canonical_nft(&mut expected)?;
    Ok(expected)
}

/// Fills `{{pod:<pod>:ipv4}}` in compiled nftables tables with the IPv4
/// address the read pod has on `eth0`.
pub(crate) fn bind_pod_addresses(compiled: &mut LabModel, read: &LabModel) -> Result<(), String> {
    let addresses: BTreeMap<String, IpAddr> = read
        .nodes
        .iter()
        .flat_map(|n| n.pods.iter())
        .filter_map(|p| {
            let ip = p
                .link("eth0")?
                .addresses
                .iter()
                .find(|a| a.addr().is_ipv4())?
                .addr();
            Some((p.name.clone(), ip))
        })
        .collect();
    for ns in compiled.namespaces_mut() {
        for table in &mut ns.nftables {
            table.text = super::placeholder::bind_pod_placeholders(&table.text, &addresses)
                .map_err(|e| format!("{}: {e}", ns.name))?;
        }
    }
    Ok(())
}

/// Every difference between `expected` and `read` (empty: identical).
pub fn differences(expected: &LabModel, read: &LabModel) -> Vec<String> {
    let mut read = read.clone();
    let out = plugin_part(&mut read);
    compare(expected, read, out)
}

/// [`differences`] for a model applied as it is (`model::apply`): pods
/// hold only what the model gave them (no plugin ran), so nothing is
/// plugin-made and everything is compared.
pub fn differences_applied(expected: &LabModel, read: &LabModel) -> Vec<String> {
    // A read model given as the expected one: STP state is operational.
    let mut expected = expected.clone();
    for ns in expected.namespaces_mut() {
        for p in ns.links.iter_mut().filter_map(|l| l.port.as_mut()) {
            p.state = None;
        }
    }
    compare(&expected, read.clone(), Vec::new())
}

fn compare(expected: &LabModel, mut read: LabModel, mut out: Vec<String>) -> Vec<String> {
    normalise(&mut read, expected);
    let e: BTreeMap<&str, &Namespace> = expected
        .namespaces()
        .map(|n| (n.name.as_str(), n))
        .collect();
    let r: BTreeMap<&str, &Namespace> = read.namespaces().map(|n| (n.name.as_str(), n)).collect();
    for (name, ns) in &e {
        match r.get(name) {
            Some(got) => namespace(ns, got, &mut out),
            None => out.push(format!("{name}: namespace missing")),
        }
    }
    for name in r.keys().filter(|n| !e.contains_key(*n)) {
        out.push(format!("{name}: a namespace that was not compiled"));
    }
    out
}

/// Checks the plugin-made part of every node and pod by its structure,
/// then removes it from `read`. Returns what breaks the structure.
fn plugin_part(read: &mut LabModel) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<IpAddr, String> = BTreeMap::new();
    for node in &mut read.nodes {
        let mut host_links: BTreeSet<String> = BTreeSet::new();
        for pod in &mut node.pods {
            let what = |m: String| format!("{}: {m}", pod.name);
            let others: Vec<&Link> = pod.links.iter().filter(|l| l.name != "lo").collect();
            let [eth0] = others.as_slice() else {
                let names: Vec<&str> = others.iter().map(|l| l.name.as_str()).collect();
                out.push(what(format!(
                    "pod links besides lo are {names:?}, not [\"eth0\"]"
                )));
                continue;
            };
            let peer = eth0.veth.as_ref();
            if eth0.name != "eth0" || eth0.kind != LinkKind::Veth {
                out.push(what(format!(
                    "pod link {} is a {:?}, not veth eth0",
                    eth0.name, eth0.kind
                )));
            }
            match peer {
                Some(p) if p.namespace.as_deref() == Some(node.net.name.as_str()) => {
                    match node.net.link(&p.name) {
                        Some(host) if host.up && host.kind == LinkKind::Veth => {
                            host_links.insert(p.name.clone());
                        }
                        Some(_) => {
                            out.push(what(format!("host link {} is not an up veth", p.name)))
                        }
                        None => out.push(what(format!(
                            "{} has no host link {}",
                            node.net.name, p.name
                        ))),
                    }
                }
                _ => out.push(what(format!(
                    "eth0's peer {peer:?} is not in node {}",
                    node.net.name
                ))),
            }
            for cidr in &node.pod_cidrs {
                let inside = eth0
                    .addresses
                    .iter()
                    .filter(|a| cidr.contains(&a.addr()))
                    .count();
                if inside != 1 {
                    out.push(what(format!(
                        "{inside} addresses in pod CIDR {cidr} on eth0, not 1"
                    )));
                }
            }
            for a in &eth0.addresses {
                if !node.pod_cidrs.iter().any(|c| c.contains(&a.addr())) {
                    out.push(what(format!("address {a} is outside the node's pod CIDRs")));
                }
                if let Some(other) = seen.insert(a.addr(), pod.name.clone()) {
                    out.push(what(format!("address {} is also {other}'s", a.addr())));
                }
            }
            let keep = |l: &Link| l.name == "lo";
            pod.links.retain(keep);
            pod.routes.clear();
            pod.neighbours.clear();
            pod.fdb.clear();
            pod.nftables.clear();
            pod.qdiscs.clear();
        }
        // The plugin's bridge (or none, as with ptp): the hosts' controller.
        let controllers: BTreeSet<String> = node
            .net
            .links
            .iter()
            .filter(|l| host_links.contains(&l.name))
            .filter_map(|l| l.controller.clone())
            .collect();
        let ns = &mut node.net;
        let plugin = |name: &str| host_links.contains(name) || controllers.contains(name);
        ns.links.retain(|l| !plugin(&l.name));
        ns.routes.retain(|r| !r.dev.as_deref().is_some_and(plugin));
        ns.neighbours.retain(|n| !plugin(&n.dev));
        ns.fdb.retain(|f| !plugin(&f.dev));
        ns.qdiscs.retain(|q| !plugin(&q.dev));
    }
    out
}

/// The normalisation rules of `model/mod.rs`, applied to a read model.
fn normalise(read: &mut LabModel, expected: &LabModel) {
    let compiled: BTreeMap<&str, &Namespace> = expected
        .namespaces()
        .map(|n| (n.name.as_str(), n))
        .collect();
    let kernel_mac = |ns: &str, link: &str| {
        compiled
            .get(ns)
            .and_then(|n| n.link(link))
            .is_some_and(|l| l.mac.is_none())
    };
    let mut refs: BTreeMap<String, String> = BTreeMap::new();
    for ns in read.namespaces() {
        for l in &ns.links {
            if let Some(mac) = &l.mac {
                if kernel_mac(&ns.name, &l.name) && l.kind != LinkKind::Loopback {
                    refs.insert(mac.clone(), format!("@{}/{}", ns.name, l.name));
                }
            }
        }
    }
    for ns in read.namespaces_mut() {
        let names_kept = compiled.get(ns.name.as_str()).map(|c| c.sysctls.clone());
        for n in &mut ns.neighbours {
            if let Some(r) = n.mac.as_ref().and_then(|m| refs.get(m)) {
                n.mac = Some(r.clone());
            }
        }
        for f in &mut ns.fdb {
            if let Some(r) = refs.get(&f.mac) {
                f.mac = r.clone();
            }
        }
        for l in &mut ns.links {
            if kernel_mac(&ns.name, &l.name) {
                l.mac = None;
            }
            if let Some(p) = l.port.as_mut() {
                p.state = None;
            }
        }
        if let Some(kept) = names_kept {
            ns.sysctls.retain(|k, _| kept.contains_key(k));
        }
        // The plugin's and the agent's own tables are not the builder's.
        if let Some(c) = compiled.get(ns.name.as_str()) {
            ns.nftables.retain(|t| {
                c.nftables
                    .iter()
                    .any(|e| e.family == t.family && e.name == t.name)
            });
        }
    }
}

fn namespace(e: &Namespace, r: &Namespace, out: &mut Vec<String>) {
    let ns = &e.name;
    let links = |n: &Namespace| -> BTreeMap<String, serde_json::Value> {
        n.links.iter().map(|l| (l.name.clone(), json(l))).collect()
    };
    keyed(ns, "link", &links(e), &links(r), out);
    for (what, a, b) in [
        ("route", set(&e.routes), set(&r.routes)),
        ("rule", set(&e.rules), set(&r.rules)),
        ("neighbour", set(&e.neighbours), set(&r.neighbours)),
        ("fdb entry", set(&e.fdb), set(&r.fdb)),
        ("qdisc", set(&e.qdiscs), set(&r.qdiscs)),
    ] {
        for x in a.difference(&b) {
            out.push(format!("{ns}: {what} missing: {x}"));
        }
        for x in b.difference(&a) {
            out.push(format!("{ns}: {what} not compiled: {x}"));
        }
    }
    let tables = |n: &Namespace| -> BTreeMap<String, serde_json::Value> {
        n.nftables
            .iter()
            .map(|t| {
                (
                    format!("{} {}", t.family, t.name),
                    serde_json::json!({"text": t.text}),
                )
            })
            .collect()
    };
    keyed(ns, "nftables table", &tables(e), &tables(r), out);
    for (k, v) in &e.sysctls {
        match r.sysctls.get(k) {
            Some(got) if got == v => {}
            got => out.push(format!("{ns}: sysctl {k}: compiled {v:?}, read {got:?}")),
        }
    }
}

fn json<T: Serialize>(x: &T) -> serde_json::Value {
    serde_json::to_value(x).unwrap_or(serde_json::Value::Null)
}

fn set<T: Serialize>(xs: &[T]) -> BTreeSet<String> {
    xs.iter().map(|x| json(x).to_string()).collect()
}

/// Objects by key: missing, not compiled, and field by field.
fn keyed(
    ns: &str,
    what: &str,
    e: &BTreeMap<String, serde_json::Value>,
    r: &BTreeMap<String, serde_json::Value>,
    out: &mut Vec<String>,
) {
    for (k, ev) in e {
        let Some(rv) = r.get(k) else {
            out.push(format!("{ns}: {what} {k} missing"));
            continue;
        };
        let (Some(eo), Some(ro)) = (ev.as_object(), rv.as_object()) else {
            continue;
        };
        let fields: BTreeSet<&String> = eo.keys().chain(ro.keys()).collect();
        for f in fields {
            let (a, b) = (eo.get(f), ro.get(f));
            if a != b {
                out.push(format!(
                    "{ns}: {what} {k}: {f}: compiled {}, read {}",
                    show(a),
                    show(b)
                ));
            }
        }
    }
    for k in r.keys().filter(|k| !e.contains_key(*k)) {
        out.push(format!("{ns}: {what} {k} not compiled: {}", r[k]));
    }
}

fn show(v: Option<&serde_json::Value>) -> String {
    match v {
        None => "(none)".into(),
        Some(serde_json::Value::String(s)) if s.contains('\n') => format!("\n{s}\n"),
        Some(v) => v.to_string(),
    }
}
