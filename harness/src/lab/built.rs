//! What a built lab is made of: [`Lab`], its [`Node`]s and their [`Pod`]s,
//! the types every builder step (underlay, overlay, Services, runtimes)
//! and every check shares. The builder that makes them is `build.rs`.

use super::base::{setup, LabError, UpOptions};
use super::topology::{NodeSpec, Topology};
use crate::connectivity::Endpoint;
use crate::netns::Netns;
use crate::runtime::{NetworkConfig, Runtime};
use ipnet::IpNet;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

/// A pod: a namespace attached to its node's network.
pub struct Pod {
    pub name: String,
    pub container_id: String,
    pub ns: Netns,
    pub ips: Vec<IpNet>,
}

pub struct Node {
    pub spec: NodeSpec,
    pub ns: Netns,
    pub runtime: Runtime,
    pub net: NetworkConfig,
    pub pods: Vec<Pod>,
    pub agent: Option<Child>,
    /// `--runtime containerd`: the node's containerd (pods through the CRI).
    pub cri: Option<super::cri::Containerd>,
}

pub struct Lab {
    pub topo: Topology,
    pub opts: UpOptions,
    pub plugin_dir: String,
    pub switch: Netns,
    pub external: Option<Netns>,
    pub nodes: Vec<Node>,
    pub phases: Vec<(String, Duration)>,
    /// Namespaces of the underlay shape: routers, NAT boxes (`lab/underlay.rs`).
    pub extra: Vec<Netns>,
    /// `--runtime containerd`: what the installed containerd supports.
    pub containerd: Option<super::cri::Support>,
}

impl Lab {
    /// The node list the agents read (`routing = "agent"`).
    pub fn nodes_file_path(&self) -> PathBuf {
        self.opts.run_dir.join("nodes.json")
    }

    /// The index of node `name`.
    pub fn node_index(&self, name: &str) -> Result<usize, LabError> {
        self.nodes
            .iter()
            .position(|n| n.spec.name == name)
            .ok_or_else(|| setup(format!("no node {name:?} in this lab")))
    }

    /// Every pod that has an address of one family, node by node, at that
    /// address.
    pub fn pod_endpoints(&self, v6: bool) -> Vec<Endpoint> {
        (0..self.nodes.len())
            .flat_map(|n| (0..self.nodes[n].pods.len()).map(move |p| (n, p)))
            .filter_map(|(n, p)| self.pod_endpoint(n, p, v6))
            .collect()
    }

    /// Pod `p` of node `n` at its address of one family.
    pub fn pod_endpoint(&self, n: usize, p: usize, v6: bool) -> Option<Endpoint> {
        let node = &self.nodes[n];
        let pod = node.pods.get(p)?;
        let ip = pod.ips.iter().find(|ip| ip.addr().is_ipv6() == v6)?.addr();
        Some(Endpoint {
            name: format!("{}/{}", node.spec.name, pod.name),
            node: Some(n),
            pod: Some(p),
            ip,
            external: false,
        })
    }
}
