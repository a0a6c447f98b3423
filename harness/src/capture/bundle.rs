//! A whole cluster's capture in one file (`cnilab capture --kubeconfig`):
//! every node's capture, and what only the API server knows.
//!
//! # The file (kind `CaptureBundle`, schemaVersion 1)
//! One JSON object:
//! - `kind`: `CaptureBundle`; `schemaVersion`: 1 (a reader refuses a newer
//!   one);
//! - `cluster`: the `context` and API `server` it came from, the `time`
//!   (RFC 3339, UTC), `cnilabVersion`, `redacted`;
//! - `nodes`: one per Kubernetes node captured: its `name`, `podCidrs` and
//!   `internalIps` (the Node object's), and either `capture` (a node's
//!   capture, as `cnilab capture` writes it, its node named for a replay:
//!   [`replay_name`]) or `error` (why that node could not be captured);
//! - `pods`: every pod the API lists (`name` as `<namespace>/<name>`,
//!   `node`, `ips`, `hostNetwork`);
//! - `services` and `endpointSlices`: what kube-proxy programs, as the API
//!   has it (a replay makes the node's own rules, which the captures hold);
//! - `warnings`.
//!
//! What the API adds to the captures (at collection, so each node's
//! capture in the bundle stands alone): the Node's pod CIDRs, and for each
//! captured pod that holds an address the API gives one of the node's
//! pods, that pod's name and the evidence (`evidence.rs`).

use super::{evidence, redact::Redactor, Capture};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

/// The `kind` of a bundle file.
pub const KIND: &str = "CaptureBundle";
/// The version of the bundle file; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;
/// The largest bundle file read: a cluster of many nodes, each at most a
/// capture's [`super::MAX_BYTES`].
pub const MAX_BYTES: u64 = 512 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bundle {
    pub kind: String,
    pub schema_version: u32,
    pub cluster: ClusterFacts,
    pub nodes: Vec<BundleNode>,
    #[serde(default)]
    pub pods: Vec<ApiPod>,
    #[serde(default)]
    pub services: Vec<ServiceFact>,
    #[serde(default)]
    pub endpoint_slices: Vec<SliceFact>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterFacts {
    pub context: String,
    pub server: String,
    pub time: String,
    pub cnilab_version: String,
    pub redacted: bool,
}

/// One Kubernetes node: what its Node object says, and its capture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleNode {
    pub name: String,
    #[serde(default)]
    pub pod_cidrs: Vec<IpNet>,
    #[serde(default)]
    pub internal_ips: Vec<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<Capture>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A pod as the API lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiPod {
    /// `<namespace>/<name>`.
    pub name: String,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    #[serde(default)]
    pub host_network: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceFact {
    /// `<namespace>/<name>`.
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub cluster_ips: Vec<IpAddr>,
    #[serde(default)]
    pub ports: Vec<PortFact>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortFact {
    #[serde(default)]
    pub name: String,
    pub protocol: String,
    pub port: i32,
    /// A Service port's target (a number or a named port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceFact {
    /// `<namespace>/<name>`.
    pub name: String,
    /// The Service it belongs to (`kubernetes.io/service-name`), as
    /// `<namespace>/<name>`.
    #[serde(default)]
    pub service: String,
    pub address_type: String,
    #[serde(default)]
    pub endpoints: Vec<EndpointFact>,
    #[serde(default)]
    pub ports: Vec<PortFact>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointFact {
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The pod behind it, `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// A name a replay takes for Kubernetes node `name` (1-30 of
/// `[A-Za-z0-9-]`: a lab's namespaces are named after it), unique among
/// `taken`: other bytes become `-`, a long name is cut.
pub fn replay_name(name: &str, taken: &mut Vec<String>) -> String {
    let mapped: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(30)
        .collect();
    let base = match mapped.trim_matches('-') {
        "" => "node".to_string(),
        b => b.to_string(),
    };
    let mut out = base.clone();
    let mut n = 1;
    while taken.contains(&out) {
        n += 1;
        let suffix = format!("-{n}");
        let keep = 30usize.saturating_sub(suffix.len()).min(base.len());
        out = format!("{}{suffix}", base[..keep].trim_end_matches('-'));
    }
    taken.push(out.clone());
    out
}

/// Adds what the API says of `node` to its capture `c`: the Node's pod
/// CIDRs, and each captured pod that holds an address the API gives one of
/// the node's pods (not a host-network one) takes that pod's name, with the
/// evidence; a pod the API does not name gets the pod CIDR's evidence when
/// its address is in one. Every pod is judged again (`evidence::judge`).
pub fn merge_api(c: &mut Capture, node: &BundleNode, pods: &[ApiPod]) {
    if !node.pod_cidrs.is_empty() {
        c.node.pod_cidrs = node.pod_cidrs.clone();
    }
    let mine: Vec<&ApiPod> = pods
        .iter()
        .filter(|p| p.node == node.name && !p.host_network)
        .collect();
    let mut taken: Vec<String> = std::iter::once(c.node.net.name.clone())
        .chain(c.pods.iter().map(|s| s.name.clone()))
        .collect();
    let mut names = BTreeMap::new();
    for s in &mut c.pods {
        let Some(ns) = c.node.pods.iter().find(|p| p.name == s.name) else {
            continue;
        };
        let addrs = evidence::addresses(ns);
        let held = |ip: &IpAddr| addrs.iter().any(|a| a.addr() == *ip);
        let named = mine
            .iter()
            .find_map(|p| p.ips.iter().find(|ip| held(ip)).map(|ip| (p, ip)));
        let found = match named {
            Some((p, ip)) => {
                if s.name != p.name {
                    taken.retain(|t| *t != s.name);
                    let new = super::unique(&p.name, &mut taken);
                    names.insert(s.name.clone(), new.clone());
                    s.name = new;
                }
                format!(
                    "the Kubernetes API lists pod {} on this node with {ip}",
                    p.name
                )
            }
            None => {
                let within = node.pod_cidrs.iter().find_map(|cidr| {
                    addrs
                        .iter()
                        .find(|a| cidr.contains(&a.addr()))
                        .map(|a| (cidr, a.addr()))
                });
                let Some((cidr, a)) = within else {
                    continue;
                };
                format!("the node's podCIDR {cidr} (Kubernetes API) holds its address {a}")
            }
        };
        if !s.evidence.contains(&found) {
            s.evidence.push(found);
        }
    }
    c.node.rename_pods(&names);
    c.node.pods.sort_by(|a, b| a.name.cmp(&b.name));
    let node_model = &c.node;
    for s in &mut c.pods {
        if let Some(pod) = node_model.pods.iter().find(|p| p.name == s.name) {
            let judged = evidence::judge(node_model, pod, &s.evidence);
            s.evidence = judged.evidence;
            s.skipped = judged.skipped;
        }
    }
}

/// Redacts a whole bundle with one key: every node's capture as `cnilab
/// capture --redact` does, and the API's facts with the same mapping (so a
/// pod's name and address agree between the API's list and the captures).
pub fn redact(b: &mut Bundle, key: &[u8]) {
    let mut r = Redactor::new(key);
    for n in &mut b.nodes {
        if let Some(c) = n.capture.as_mut() {
            r.capture(c);
        }
    }
    b.cluster.server = "redacted".into();
    b.cluster.context = r.name("context", &b.cluster.context);
    b.cluster.redacted = true;
    let addrs = |r: &mut Redactor, v: &mut Vec<IpAddr>| {
        *v = v.iter().map(|a| r.addr(*a)).collect();
    };
    for n in &mut b.nodes {
        n.name = r.name("node", &n.name);
        n.pod_cidrs = n.pod_cidrs.iter().map(|c| r.net(*c)).collect();
        addrs(&mut r, &mut n.internal_ips);
        n.error = n.error.as_deref().map(|e| r.text(e));
    }
    for p in &mut b.pods {
        p.name = r.name("pod", &p.name);
        p.node = r.name("node", &p.node);
        addrs(&mut r, &mut p.ips);
    }
    for s in &mut b.services {
        s.name = r.name("svc", &s.name);
        addrs(&mut r, &mut s.cluster_ips);
    }
    for s in &mut b.endpoint_slices {
        s.name = r.name("slice", &s.name);
        s.service = r.name("svc", &s.service);
        for e in &mut s.endpoints {
            e.addresses = e.addresses.iter().map(|a| r.text(a)).collect();
            e.node = e.node.as_deref().map(|n| r.name("node", n));
            e.pod = e.pod.as_deref().map(|p| r.name("pod", p));
        }
    }
    b.warnings = b.warnings.iter().map(|w| r.text(w)).collect();
}

/// Only the fields that tell a bundle from a node's capture.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    schema_version: serde_json::Value,
}

/// Whether the JSON file at `path` is a bundle (its `kind`), read without
/// keeping anything else; `None` when it is not JSON at all.
pub(crate) fn is_bundle(path: &Path) -> Result<bool, String> {
    let probe: Result<Probe, _> = serde_json::from_reader(super::open_capped(path, MAX_BYTES)?);
    Ok(probe.is_ok_and(|p| p.kind.as_deref() == Some(KIND)))
}

/// Reads a bundle file: refuses a newer schema, checks every node's
/// capture (`check.rs`) and every name the API gave (printable, at most
/// 253 bytes).
pub fn load(path: &Path) -> Result<Bundle, String> {
    let shown = path.display();
    let parsed: Result<Bundle, _> = serde_json::from_reader(super::open_capped(path, MAX_BYTES)?);
    let b = match parsed {
        Ok(b) => b,
        Err(e) => {
            let probe: Option<Probe> =
                serde_json::from_reader(super::open_capped(path, MAX_BYTES)?).ok();
            let v = probe.and_then(|p| p.schema_version.as_u64()).unwrap_or(0);
            if v > u64::from(SCHEMA_VERSION) {
                return Err(newer(path, v));
            }
            return Err(format!("{shown}: {e}"));
        }
    };
    if b.schema_version > SCHEMA_VERSION {
        return Err(newer(path, u64::from(b.schema_version)));
    }
    check(&b).map_err(|e| format!("{shown}: {e}"))?;
    Ok(b)
}

fn newer(path: &Path, v: u64) -> String {
    format!(
        "{}: bundle schemaVersion {v} is newer than this cnilab's {SCHEMA_VERSION}; use a newer cnilab",
        path.display()
    )
}

fn check(b: &Bundle) -> Result<(), String> {
    let name_ok = |field: String, v: &str| {
        let ok = v.len() <= 253 && !v.chars().any(char::is_control);
        if ok {
            Ok(())
        } else {
            Err(format!("{field}: {v:?}: at most 253 printable bytes"))
        }
    };
    for (i, n) in b.nodes.iter().enumerate() {
        name_ok(format!("nodes[{i}].name"), &n.name)?;
        if let Some(c) = &n.capture {
            super::check::check(c).map_err(|e| format!("nodes[{i}].capture.{e}"))?;
        }
    }
    for (i, p) in b.pods.iter().enumerate() {
        name_ok(format!("pods[{i}].name"), &p.name)?;
        name_ok(format!("pods[{i}].node"), &p.node)?;
    }
    for (i, s) in b.services.iter().enumerate() {
        name_ok(format!("services[{i}].name"), &s.name)?;
    }
    for (i, s) in b.endpoint_slices.iter().enumerate() {
        name_ok(format!("endpointSlices[{i}].name"), &s.name)?;
    }
    Ok(())
}

/// The captures a bundle holds, each node's as it stands; a node that
/// could not be captured is said in a warning of the first capture.
pub fn captures(b: Bundle) -> Result<Vec<Capture>, String> {
    let missing: Vec<String> = b
        .nodes
        .iter()
        .filter(|n| n.capture.is_none())
        .map(|n| {
            format!(
                "node {} of the bundle was not captured ({}): it is not in the replay",
                n.name,
                n.error.as_deref().unwrap_or("no capture")
            )
        })
        .collect();
    let mut out: Vec<Capture> = b.nodes.into_iter().filter_map(|n| n.capture).collect();
    match out.first_mut() {
        Some(first) => first.warnings.extend(missing),
        None => return Err("the bundle holds no node's capture".into()),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_become_replay_names() {
        let mut taken = Vec::new();
        assert_eq!(replay_name("kind-worker", &mut taken), "kind-worker");
        assert_eq!(
            replay_name("ip-10-0-1-23.ec2.internal", &mut taken),
            "ip-10-0-1-23-ec2-internal"
        );
        assert_eq!(
            replay_name("aks-nodepool1-12345678-vmss000000", &mut taken),
            "aks-nodepool1-12345678-vmss000"
        );
        assert_eq!(
            replay_name("aks-nodepool1-12345678-vmss000001", &mut taken),
            "aks-nodepool1-12345678-vmss0-2"
        );
        assert_eq!(replay_name("kind-worker", &mut taken), "kind-worker-2");
        assert_eq!(replay_name("...", &mut taken), "node");
        for t in &taken {
            assert!(t.len() <= 30 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        }
    }
}
