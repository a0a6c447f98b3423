//! What the agent knows about a node: its name, its InternalIP(s) and its
//! pod CIDR(s). Both node sources (the Kubernetes API and the lab's nodes
//! file) reduce to this.

use crate::error::{AgentError, Result};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use std::net::IpAddr;
use std::path::Path;

/// Read from a nodes file by [`parse_nodes_file`] (fields `name`,
/// `internalIP`/`internalIPs`, `podCIDRs`/`podCIDR`, each one value or a list).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct NodeInfo {
    pub name: String,
    /// InternalIP addresses, at most one per family in practice.
    #[serde(rename = "internalIP")]
    pub internal_ips: Vec<IpAddr>,
    #[serde(rename = "podCIDRs")]
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

/// Parses a nodes file: TOML (`[[nodes]]` tables) when the path ends in
/// `.toml`, JSON otherwise (a list, or `{"nodes": [...]}`). Errors name the
/// node and the field at fault.
pub fn parse_nodes_file(path: &Path, text: &str) -> Result<Snapshot> {
    let parse_error = |message: String| AgentError::NodesFileParse {
        path: path.to_path_buf(),
        message,
    };
    let document: serde_json::Value = if path.extension().is_some_and(|e| e == "toml") {
        let table: toml::Table = toml::from_str(text).map_err(|e| parse_error(e.to_string()))?;
        serde_json::to_value(table).map_err(|e| parse_error(e.to_string()))?
    } else {
        serde_json::from_str(text).map_err(|e| parse_error(e.to_string()))?
    };
    let shape =
        "expected a JSON list of {\"name\", \"internalIP\", \"podCIDRs\"}, or {\"nodes\": [...]}";
    let list = match &document {
        serde_json::Value::Array(list) => list.as_slice(),
        serde_json::Value::Object(map) => match map.get("nodes") {
            Some(serde_json::Value::Array(list)) => list.as_slice(),
            None if path.extension().is_some_and(|e| e == "toml") => &[],
            _ => return Err(parse_error(format!("no list of nodes ({shape})"))),
        },
        _ => return Err(parse_error(format!("no list of nodes ({shape})"))),
    };
    let mut nodes = list
        .iter()
        .enumerate()
        .map(|(i, value)| node_from_value(i, value))
        .collect::<std::result::Result<Vec<NodeInfo>, String>>()
        .map_err(parse_error)?;
    nodes.sort();
    if let Some(pair) = nodes.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(parse_error(format!(
            "node {:?} is listed twice",
            pair[0].name
        )));
    }
    Ok(nodes)
}

/// One entry of a nodes file; the error names the node (or its position)
/// and the field.
fn node_from_value(
    index: usize,
    value: &serde_json::Value,
) -> std::result::Result<NodeInfo, String> {
    let entry = value.as_object().ok_or_else(|| {
        format!("node #{index}: expected an object with name, internalIP, podCIDRs")
    })?;
    let name = match entry.get("name") {
        Some(serde_json::Value::String(n)) if !n.is_empty() => n.clone(),
        Some(serde_json::Value::String(_)) => {
            return Err(format!("node #{index}: a node has an empty name"))
        }
        Some(other) => {
            return Err(format!(
                "node #{index}: field name: expected a string, found {other}"
            ))
        }
        None => return Err(format!("node #{index}: field name is missing")),
    };
    let internal_ips: Vec<IpAddr> = one_or_many_field(
        &name,
        entry,
        &["internalIP", "internalIPs"],
        "an IP address",
    )?;
    let pod_cidrs: Vec<IpNet> =
        one_or_many_field(&name, entry, &["podCIDRs", "podCIDR"], "a CIDR")?;
    Ok(NodeInfo::new(&name, &internal_ips, &pod_cidrs))
}

/// A field that holds one string or a list of strings, each parsed as `T`.
fn one_or_many_field<T: std::str::FromStr>(
    node: &str,
    entry: &serde_json::Map<String, serde_json::Value>,
    keys: &[&str],
    what: &str,
) -> std::result::Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    let Some((key, value)) = keys.iter().find_map(|k| entry.get(*k).map(|v| (*k, v))) else {
        return Ok(Vec::new());
    };
    let items: Vec<&serde_json::Value> = match value {
        serde_json::Value::Array(list) => list.iter().collect(),
        one => vec![one],
    };
    items
        .into_iter()
        .map(|item| {
            let text = item.as_str().ok_or_else(|| {
                format!("node {node:?}: field {key}: expected {what} as a string, found {item}")
            })?;
            text.parse::<T>()
                .map_err(|e| format!("node {node:?}: field {key}: {text:?} is not {what} ({e})"))
        })
        .collect()
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
    fn errors_name_the_node_and_the_field() {
        for (file, text, needles) in [
            (
                "n.json",
                r#"[{"name":"b","internalIP":"10.0.0.2","podCIDRs":["10.244.2.0/33"]}]"#,
                &["\"b\"", "podCIDRs", "10.244.2.0/33"][..],
            ),
            (
                "n.json",
                r#"{"nodes":[{"name":"c","internalIP":"10.0.0.300"}]}"#,
                &["\"c\"", "internalIP", "10.0.0.300"][..],
            ),
            (
                "n.json",
                r#"[{"name":"d","podCIDR":7}]"#,
                &["\"d\"", "podCIDR", "string"][..],
            ),
            (
                "n.toml",
                "[[nodes]]\nname = \"e\"\npodCIDRs = [\"x/24\"]\n",
                &["\"e\"", "podCIDRs", "x/24"][..],
            ),
            (
                "n.json",
                r#"[{"internalIP":"10.0.0.2"}]"#,
                &["node #0", "name"][..],
            ),
        ] {
            let msg = parse_nodes_file(Path::new(file), text)
                .expect_err("refused")
                .to_string();
            assert!(!msg.contains("untagged"), "{msg}");
            for needle in needles {
                assert!(msg.contains(needle), "{msg} should name {needle}");
            }
        }
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
