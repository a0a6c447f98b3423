//! Injecting a scenario's faults into a running lab, each with its undo
//! (the shape, overlay and Service faults are in [`super::shape_faults`]).

use super::file::Fault;
use super::shape_faults::{self, ShapeUndo};
use crate::lab::topology::NodeSpec;
use crate::lab::LabError;
use crate::lab::{base::nft, built::Lab, routes::install_static_routes};
use crate::netns::Netns;
use cnilab_net::{netns as plugin_netns, nl};
use ipnet::IpNet;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

/// How to undo a fault.
pub(crate) enum Undo {
    Routes {
        node: String,
    },
    Sysctl {
        node: String,
        key: String,
        value: String,
    },
    ForwardAccept {
        node: String,
    },
    Mtu {
        node: String,
        mtu: u32,
    },
    Tables {
        node: String,
        saved: Vec<(String, String)>,
    },
    DeleteTable {
        node: String,
        table: String,
    },
    Respec {
        node: String,
        spec: NodeSpec,
        pods: usize,
    },
    RemoveNode {
        node: String,
    },
    AddNode {
        spec: NodeSpec,
        pods: usize,
    },
    StartAgent {
        node: String,
    },
    StopAgent {
        node: String,
    },
    Shape(ShapeUndo),
}

fn node_ns<'a>(lab: &'a Lab, node: &str) -> Result<&'a Netns, LabError> {
    Ok(&lab.nodes[lab.node_index(node)?].ns)
}

fn cmd(ns: &Netns, program: &str, args: &[&str]) -> Result<String, LabError> {
    let out = ns
        .command(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Setup(format!("{program}: {e}")))?;
    if !out.status.success() {
        return Err(LabError::Setup(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn set_uplink_mtu(ns: &Netns, mtu: u32) -> Result<(), LabError> {
    ns.netlink(|h| async move {
        let eth0 = nl::link_by_name(&h, "eth0")
            .await?
            .ok_or(rtnetlink::Error::RequestFailed)?;
        h.link()
            .set(
                rtnetlink::LinkUnspec::new_with_index(eth0.index)
                    .mtu(mtu)
                    .build(),
            )
            .execute()
            .await
    })
    .map_err(|e| LabError::Setup(format!("set mtu: {e}")))
}

fn spec_of(lab: &Lab, node: &str) -> Result<NodeSpec, LabError> {
    lab.topo
        .node(node)
        .cloned()
        .ok_or_else(|| LabError::Setup(format!("no node {node:?}")))
}

pub(crate) fn apply(lab: &mut Lab, fault: &Fault) -> Result<Undo, LabError> {
    Ok(match fault {
        Fault::DeleteRoute { node, peer } => {
            let cidrs: Vec<IpNet> = spec_of(lab, peer)?
                .pod_cidr
                .iter()
                .map(|c| c.trunc())
                .collect();
            let ns = node_ns(lab, node)?;
            ns.netlink(|h| async move {
                for c in cidrs {
                    nl::delete_routes(&h, c).await?;
                }
                Ok(())
            })
            .map_err(|e| LabError::Setup(e.to_string()))?;
            Undo::Routes { node: node.clone() }
        }
        Fault::StaleRoute { node, peer, via } => {
            let cidr = spec_of(lab, peer)?
                .pod_cidr
                .iter()
                .find(|c| c.addr().is_ipv4())
                .copied()
                .ok_or_else(|| LabError::Setup(format!("{peer} has no IPv4 pod CIDR")))?;
            let via = *via;
            node_ns(lab, node)?
                .netlink(|h| async move {
                    let msg = nl::route_message(cidr.trunc(), Some(via), None, None)
                        .map_err(|_| rtnetlink::Error::RequestFailed)?;
                    nl::add_route(&h, msg, true).await
                })
                .map_err(|e| LabError::Setup(e.to_string()))?;
            Undo::Routes { node: node.clone() }
        }
        Fault::IpForwardOff { node } => sysctl_fault(lab, node, "net/ipv4/ip_forward", "0")?,
        Fault::Ipv6ForwardOff { node } => {
            sysctl_fault(lab, node, "net/ipv6/conf/all/forwarding", "0")?
        }
        Fault::RpFilter { node } => {
            sysctl_fault(lab, node, "net/ipv4/conf/eth0/rp_filter", "1")?;
            sysctl_fault(lab, node, "net/ipv4/conf/all/rp_filter", "1")?
        }
        Fault::ForwardDrop { node } => {
            cmd(
                node_ns(lab, node)?,
                "iptables",
                &["-w", "5", "-P", "FORWARD", "DROP"],
            )?;
            Undo::ForwardAccept { node: node.clone() }
        }
        Fault::Mtu { node, mtu } => {
            let before = spec_of(lab, node)?.mtu.unwrap_or(lab.topo.mtu);
            set_uplink_mtu(node_ns(lab, node)?, *mtu)?;
            Undo::Mtu {
                node: node.clone(),
                mtu: before,
            }
        }
        Fault::FlushMasquerade { .. } | Fault::MasqueradeTooBroad { .. } => {
            masquerade_fault(lab, fault)?
        }
        Fault::ReusePodCidr { node, from } => {
            let original = spec_of(lab, node)?;
            let pods = lab.nodes[lab.node_index(node)?].pods.len();
            let mut reused = original.clone();
            reused.pod_cidr = spec_of(lab, from)?.pod_cidr;
            lab.remove_node(node)?;
            lab.add_node(reused, pods)?;
            Undo::Respec {
                node: node.clone(),
                spec: original,
                pods,
            }
        }
        Fault::AddNode {
            name,
            address,
            pod_cidr,
            pods,
        } => {
            let spec = NodeSpec {
                name: name.clone(),
                address: *address,
                address6: None,
                pod_cidr: pod_cidr.clone(),
                mtu: None,
                sysctls: BTreeMap::new(),
            };
            let mut topo = lab.topo.clone();
            topo.nodes.push(spec.clone());
            topo.validate(Path::new("add-node"))
                .map_err(|e| LabError::Setup(e.to_string()))?;
            lab.add_node(spec, *pods)?;
            Undo::RemoveNode { node: name.clone() }
        }
        Fault::RemoveNode { node } => {
            let spec = spec_of(lab, node)?;
            let pods = lab.nodes[lab.node_index(node)?].pods.len();
            lab.remove_node(node)?;
            Undo::AddNode { spec, pods }
        }
        Fault::StopAgent { node } => {
            let i = lab.node_index(node)?;
            lab.stop_agent(i);
            Undo::StartAgent { node: node.clone() }
        }
        Fault::StartAgent { node } => {
            let i = lab.node_index(node)?;
            lab.start_agent(i)?;
            Undo::StopAgent { node: node.clone() }
        }
        _ => Undo::Shape(shape_faults::apply(lab, fault)?),
    })
}

/// The masquerade faults: every masquerade rule on a node flushed (its
/// tables saved), or a table that masquerades the cluster's own traffic.
fn masquerade_fault(lab: &Lab, fault: &Fault) -> Result<Undo, LabError> {
    Ok(match fault {
        Fault::FlushMasquerade { node } => {
            let ns = node_ns(lab, node)?;
            let listing = cmd(ns, "nft", &["list", "tables"])?;
            let mut saved = Vec::new();
            for line in listing.lines() {
                let words: Vec<&str> = line.split_whitespace().collect();
                if let [_, family, table] = words[..] {
                    let text = cmd(ns, "nft", &["list", "table", family, table])?;
                    if text.contains("masquerade") {
                        for chain in chains_with_masquerade(&text) {
                            cmd(ns, "nft", &["flush", "chain", family, table, &chain])?;
                        }
                        saved.push((format!("{family} {table}"), text));
                    }
                }
            }
            Undo::Tables {
                node: node.clone(),
                saved,
            }
        }
        Fault::MasqueradeTooBroad { node } => {
            let cluster: Vec<String> = lab
                .topo
                .cluster_cidr
                .iter()
                .filter(|c| c.addr().is_ipv4())
                .map(|c| c.to_string())
                .collect();
            let rules = format!(
                "table ip cnilab_fault_masq {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat - 10; policy accept;\n    ip saddr {{ {} }} oifname \"eth0\" masquerade\n  }}\n}}\n",
                cluster.join(", ")
            );
            nft(node_ns(lab, node)?, &rules)?;
            Undo::DeleteTable {
                node: node.clone(),
                table: "ip cnilab_fault_masq".into(),
            }
        }
        other => {
            return Err(LabError::Setup(format!(
                "not a masquerade fault: {}",
                other.describe()
            )))
        }
    })
}

fn chains_with_masquerade(table_text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chain = None;
    for line in table_text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("chain ") {
            chain = Some(rest.trim_end_matches(" {").to_string());
        } else if line.contains("masquerade") {
            if let Some(c) = &chain {
                if !out.contains(c) {
                    out.push(c.clone());
                }
            }
        }
    }
    out
}

fn sysctl_fault(lab: &Lab, node: &str, key: &str, value: &str) -> Result<Undo, LabError> {
    let ns = node_ns(lab, node)?;
    let before = plugin_netns::read_sysctl(Some(ns.file()), key)
        .map_err(|e| LabError::Setup(format!("{key}: {e}")))?;
    plugin_netns::write_sysctl(Some(ns.file()), key, value)
        .map_err(|e| LabError::Setup(format!("{key}: {e}")))?;
    Ok(Undo::Sysctl {
        node: node.to_string(),
        key: key.to_string(),
        value: before,
    })
}

pub(crate) fn undo(lab: &mut Lab, u: Undo) -> Result<(), LabError> {
    match u {
        Undo::Routes { node } => {
            let specs = lab.topo.nodes.clone();
            let me = spec_of(lab, &node)?;
            install_static_routes(node_ns(lab, &node)?, &me, &specs)
        }
        Undo::Sysctl { node, key, value } => {
            plugin_netns::write_sysctl(Some(node_ns(lab, &node)?.file()), &key, &value)
                .map_err(|e| LabError::Setup(format!("{key}: {e}")))
        }
        Undo::ForwardAccept { node } => cmd(
            node_ns(lab, &node)?,
            "iptables",
            &["-w", "5", "-P", "FORWARD", "ACCEPT"],
        )
        .map(|_| ()),
        Undo::Mtu { node, mtu } => set_uplink_mtu(node_ns(lab, &node)?, mtu),
        Undo::Tables { node, saved } => {
            let ns = node_ns(lab, &node)?;
            for (table, text) in saved {
                let words: Vec<&str> = table.split_whitespace().collect();
                let mut args = vec!["delete", "table"];
                args.extend(words);
                cmd(ns, "nft", &args)?;
                nft(ns, &text)?;
            }
            Ok(())
        }
        Undo::DeleteTable { node, table } => {
            let mut args = vec!["delete", "table"];
            args.extend(table.split_whitespace());
            cmd(node_ns(lab, &node)?, "nft", &args).map(|_| ())
        }
        Undo::Respec { node, spec, pods } => {
            lab.remove_node(&node)?;
            lab.add_node(spec, pods)
        }
        Undo::RemoveNode { node } => lab.remove_node(&node),
        Undo::AddNode { spec, pods } => lab.add_node(spec, pods),
        Undo::StartAgent { node } => {
            let i = lab.node_index(&node)?;
            lab.start_agent(i)
        }
        Undo::StopAgent { node } => {
            let i = lab.node_index(&node)?;
            lab.stop_agent(i);
            Ok(())
        }
        Undo::Shape(u) => shape_faults::undo(lab, u),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_masquerade_chains() {
        let text = "table inet t {\n\tset pods4 {\n\t}\n\tchain postrouting {\n\t\tip saddr @pods4 masquerade\n\t}\n\tchain other {\n\t}\n}\n";
        assert_eq!(
            chains_with_masquerade(text),
            vec!["postrouting".to_string()]
        );
    }
}
