//! Node-level diagnosis from the Node objects alone: every node needs a pod
//! CIDR per family, CIDRs must not overlap, and InternalIPs must be real,
//! distinct addresses (Vagrant's NAT address 10.0.2.15 on every VM is the
//! classic way to break routes, logs and exec).

use crate::connectivity::diagnosis::{self, Diagnosis, VIRTUALBOX_NAT};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// What the check knows about a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClusterNode {
    pub name: String,
    pub internal_ips: Vec<IpAddr>,
    pub pod_cidrs: Vec<IpNet>,
    /// `spec.podCIDRs` entries that do not parse.
    pub bad_cidrs: Vec<String>,
    pub ready: bool,
}

impl ClusterNode {
    pub fn from_node(node: &Node) -> ClusterNode {
        let name = node.metadata.name.clone().unwrap_or_default();
        let spec = node.spec.as_ref();
        let mut raw: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
        if raw.is_empty() {
            raw.extend(spec.and_then(|s| s.pod_cidr.clone()));
        }
        let mut pod_cidrs = Vec::new();
        let mut bad_cidrs = Vec::new();
        for c in raw {
            match c.parse::<IpNet>() {
                Ok(net) => pod_cidrs.push(net),
                Err(_) => bad_cidrs.push(c),
            }
        }
        let status = node.status.as_ref();
        let internal_ips = status
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ClusterNode {
            name,
            internal_ips,
            pod_cidrs,
            bad_cidrs,
            ready,
        }
    }

    pub fn internal_ip(&self, v6: bool) -> Option<IpAddr> {
        self.internal_ips
            .iter()
            .copied()
            .find(|ip| ip.is_ipv6() == v6)
    }

    pub fn pod_cidr(&self, v6: bool) -> Option<IpNet> {
        self.pod_cidrs
            .iter()
            .copied()
            .find(|c| matches!(c, IpNet::V6(_)) == v6)
    }
}

/// A problem with one or more nodes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NodeFinding {
    /// The nodes it concerns.
    pub nodes: Vec<String>,
    pub diagnosis: Diagnosis,
}

/// Checks pod CIDRs and InternalIPs for the families the cluster runs.
pub fn diagnose(nodes: &[ClusterNode], v4: bool, v6: bool) -> Vec<NodeFinding> {
    let mut out = Vec::new();
    let finding = |nodes: Vec<String>, id: &'static str, message: String| NodeFinding {
        nodes,
        diagnosis: Diagnosis { id, message },
    };
    for n in nodes {
        for bad in &n.bad_cidrs {
            out.push(finding(
                vec![n.name.clone()],
                "podcidr-missing",
                format!(
                    "node {}: spec.podCIDRs has {bad:?}, which is not a CIDR",
                    n.name
                ),
            ));
        }
        for (wanted, v6_family, family) in [(v4, false, "IPv4"), (v6, true, "IPv6")] {
            if wanted && n.pod_cidr(v6_family).is_none() {
                out.push(finding(
                    vec![n.name.clone()],
                    "podcidr-missing",
                    format!(
                        "node {} has no {family} podCIDR (spec.podCIDRs = [{}]): the controller-manager allocates them only with --allocate-node-cidrs and a --cluster-cidr (kubeadm: --pod-network-cidr); a CIDR mask too small for the node count also leaves nodes without one",
                        n.name,
                        n.pod_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        if n.internal_ips.is_empty() {
            out.push(finding(
                vec![n.name.clone()],
                "node-address-missing",
                format!(
                    "node {} reports no InternalIP: routes to its pods cannot name a next hop",
                    n.name
                ),
            ));
        }
    }
    let cidrs: Vec<(&str, &[IpNet])> = nodes
        .iter()
        .map(|n| (n.name.as_str(), n.pod_cidrs.as_slice()))
        .collect();
    for (a, ca, b, cb) in diagnosis::overlapping_cidrs(&cidrs) {
        out.push(finding(
            vec![a.to_string(), b.to_string()],
            "podcidr-overlap",
            format!(
                "podCIDRs overlap: {a} has {ca}, {b} has {cb}; pods on both nodes can get the same address and routes to one node capture the other's pods"
            ),
        ));
    }
    let mut by_ip: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for n in nodes {
        for ip in &n.internal_ips {
            by_ip.entry(*ip).or_default().push(n.name.clone());
        }
    }
    for (ip, names) in by_ip {
        if names.len() > 1 {
            let nat = if ip == VIRTUALBOX_NAT {
                " (VirtualBox's NAT address, the same on every VM: pin kubelet --node-ip to the private network address)"
            } else {
                " (pin kubelet --node-ip to each node's own address)"
            };
            out.push(finding(
                names.clone(),
                "node-address-shared",
                format!(
                    "nodes {} share the InternalIP {ip}{nat}; routes `podCIDR via {ip}` cannot tell them apart",
                    names.join(", ")
                ),
            ));
        } else if ip == VIRTUALBOX_NAT {
            out.push(finding(
                names.clone(),
                "node-address-nat",
                format!(
                    "node {} has InternalIP {ip}, VirtualBox's NAT address: other nodes cannot reach it there; pin kubelet --node-ip to the private network address",
                    names.join(", ")
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ips: &[&str], cidrs: &[&str]) -> ClusterNode {
        ClusterNode {
            name: name.into(),
            internal_ips: ips.iter().filter_map(|i| i.parse().ok()).collect(),
            pod_cidrs: cidrs.iter().filter_map(|c| c.parse().ok()).collect(),
            bad_cidrs: Vec::new(),
            ready: true,
        }
    }

    fn ids(f: &[NodeFinding]) -> Vec<&'static str> {
        f.iter().map(|f| f.diagnosis.id).collect()
    }

    #[test]
    fn healthy_cluster_has_no_findings() {
        let nodes = [
            node(
                "a",
                &["172.18.0.2", "fc00::2"],
                &["10.244.0.0/24", "fd00:10:244::/64"],
            ),
            node(
                "b",
                &["172.18.0.3", "fc00::3"],
                &["10.244.1.0/24", "fd00:10:244:1::/64"],
            ),
        ];
        assert!(diagnose(&nodes, true, true).is_empty());
    }

    #[test]
    fn dual_stack_node_without_ipv6_cidr() {
        let nodes = [node("a", &["172.18.0.2"], &["10.244.0.0/24"])];
        assert!(diagnose(&nodes, true, false).is_empty());
        let f = diagnose(&nodes, true, true);
        assert_eq!(ids(&f), ["podcidr-missing"]);
        assert!(f[0].diagnosis.message.contains("IPv6"));
    }
}
