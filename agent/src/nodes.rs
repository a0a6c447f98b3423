//! What the agent knows about a node: its name, its InternalIP(s) and its
//! pod CIDR(s). Both node sources (the Kubernetes API and the lab's nodes
//! file) reduce to this.

use crate::error::{AgentError, Result};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// InternalIP addresses, at most one per family in practice.
    #[serde(
        rename = "internalIP",
        alias = "internalIPs",
        default,
        deserialize_with = "one_or_many"
    )]
    pub internal_ips: Vec<IpAddr>,
    #[serde(
        rename = "podCIDRs",
        alias = "podCIDR",
        default,
        deserialize_with = "one_or_many"
    )]
    pub pod_cidrs: Vec<IpNet>,
}

impl NodeInfo {
    pub fn new(name: &str, internal_ips: &[IpAddr], pod_cidrs: &[IpNet]) -> Self {
        NodeInfo {
            name: name.to_string(),
            internal_ips: internal_ips.to_vec(),
            pod_cidrs: pod_cidrs.iter().map(IpNet::trunc).collect(),
        }
    }

    /// Reads name, InternalIPs and podCIDRs from a Kubernetes Node. Values the
    /// API server should never return malformed are skipped with a warning.
    pub fn from_k8s(node: &Node) -> Option<NodeInfo> {
        let name = node.metadata.name.clone()?;
        let mut internal_ips = Vec::new();
        for address in node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
        {
            match address.address.parse::<IpAddr>() {
                Ok(ip) => internal_ips.push(ip),
                Err(_) => {
                    tracing::warn!(node = %name, address = %address.address, "ignoring unparsable InternalIP")
                }
            }
        }
        let spec = node.spec.as_ref();
        let mut raw: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
        if raw.is_empty() {
            raw.extend(spec.and_then(|s| s.pod_cidr.clone()));
        }
        let mut pod_cidrs = Vec::new();
        for cidr in raw {
            match cidr.parse::<IpNet>() {
                Ok(net) => pod_cidrs.push(net.trunc()),
                Err(_) => tracing::warn!(node = %name, cidr = %cidr, "ignoring unparsable podCIDR"),
            }
        }
        Some(NodeInfo {
            name,
            internal_ips,
            pod_cidrs,
        })
    }
}

/// A full view of the cluster's nodes, sorted by name.
pub type Snapshot = Vec<NodeInfo>;

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

fn one_or_many<'de, D, T>(deserializer: D) -> std::result::Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(match OneOrMany::<T>::deserialize(deserializer)? {
        OneOrMany::One(value) => vec![value],
        OneOrMany::Many(values) => values,
    })
}

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonNodesFile {
    List(Vec<NodeInfo>),
    Table { nodes: Vec<NodeInfo> },
}

#[derive(Deserialize)]
struct TomlNodesFile {
    #[serde(default)]
    nodes: Vec<NodeInfo>,
}

/// Parses a nodes file: TOML (`[[nodes]]` tables) when the path ends in
/// `.toml`, JSON otherwise (a list, or `{"nodes": [...]}`).
pub fn parse_nodes_file(path: &Path, text: &str) -> Result<Snapshot> {
    let parse_error = |message: String| AgentError::NodesFileParse {
        path: path.to_path_buf(),
        message,
    };
    let mut nodes = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str::<TomlNodesFile>(text)
            .map_err(|e| parse_error(e.to_string()))?
            .nodes
    } else {
        match serde_json::from_str::<JsonNodesFile>(text) {
            Ok(JsonNodesFile::List(nodes)) | Ok(JsonNodesFile::Table { nodes }) => nodes,
            Err(e) => {
                return Err(parse_error(format!(
                    "{e} (expected a JSON list of {{\"name\", \"internalIP\", \"podCIDRs\"}})"
                )))
            }
        }
    };
    for node in &mut nodes {
        if node.name.is_empty() {
            return Err(parse_error("a node has an empty name".into()));
        }
        node.pod_cidrs = node.pod_cidrs.iter().map(IpNet::trunc).collect();
    }
    nodes.sort();
    if let Some(pair) = nodes.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(parse_error(format!(
            "node {:?} is listed twice",
            pair[0].name
        )));
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};

    #[test]
    fn json_list_and_table_forms_parse() {
        let list = r#"[{"name":"b","internalIP":"10.0.0.2","podCIDRs":["10.244.2.0/24"]},
                       {"name":"a","internalIP":["10.0.0.1","fd00::1"],"podCIDRs":["10.244.1.0/24","fd00:10:244:1::/64"]}]"#;
        let nodes = parse_nodes_file(Path::new("n.json"), list).expect("parses");
        assert_eq!(nodes[0].name, "a");
        assert_eq!(nodes[0].internal_ips.len(), 2);
        let table =
            r#"{"nodes":[{"name":"a","internalIP":"10.0.0.1","podCIDRs":"10.244.1.5/24"}]}"#;
        let nodes = parse_nodes_file(Path::new("n"), table).expect("parses");
        assert_eq!(
            nodes[0].pod_cidrs,
            vec!["10.244.1.0/24".parse::<IpNet>().expect("net")]
        );
    }

    #[test]
    fn toml_parses() {
        let text =
            "[[nodes]]\nname = \"a\"\ninternalIP = \"10.0.0.1\"\npodCIDRs = [\"10.244.1.0/24\"]\n";
        let nodes = parse_nodes_file(Path::new("n.toml"), text).expect("parses");
        assert_eq!(nodes.len(), 1);
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(parse_nodes_file(Path::new("n.json"), "{").is_err());
        assert!(
            parse_nodes_file(Path::new("n.json"), r#"[{"name":"a","internalIP":"x"}]"#).is_err()
        );
        assert!(parse_nodes_file(Path::new("n.json"), r#"[{"name":"a"},{"name":"a"}]"#).is_err());
    }

    #[test]
    fn from_k8s_reads_internal_ips_and_pod_cidrs() {
        let node = Node {
            metadata: kube::api::ObjectMeta {
                name: Some("w1".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: Some("10.244.1.0/24".into()),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        address: "w1".into(),
                        type_: "Hostname".into(),
                    },
                    NodeAddress {
                        address: "172.18.0.3".into(),
                        type_: "InternalIP".into(),
                    },
                    NodeAddress {
                        address: "bogus".into(),
                        type_: "InternalIP".into(),
                    },
                ]),
                ..Default::default()
            }),
        };
        let info = NodeInfo::from_k8s(&node).expect("has a name");
        assert_eq!(
            info.internal_ips,
            vec!["172.18.0.3".parse::<IpAddr>().expect("ip")]
        );
        assert_eq!(info.pod_cidrs.len(), 1);
    }
}
