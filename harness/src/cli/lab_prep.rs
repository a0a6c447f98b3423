//! What `lab run`, `lab up` and `scenario run` do before a lab is built:
//! the topology of the flags, the plugin's config template made the
//! topology's, the plugin directory checked, the host's neighbour tables
//! fitted and the runtime said; [`prepare`] does it all in one call and
//! hands the builder a [`Recipe`] (plugin directory, template, pod MTU,
//! containerd: found and checked once), so that a command goes from here
//! down to the builder and not back.

use crate::lab::base::RuntimeKind;
use crate::lab::cri;
use crate::lab::neighbours::HostFit;
use crate::lab::recipe::Recipe;
use crate::lab::topology::Topology;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Clone, Default)]
pub struct TopologyFlags {
    /// Topology file (TOML; examples in lab/topologies/).
    #[arg(long, conflicts_with = "nodes")]
    pub topology: Option<PathBuf>,
    /// Replay captured nodes (`cnilab capture -o FILE` on each node): the
    /// lab's nodes and pods hold what the captures hold, joined by an
    /// underlay derived from their uplinks; no plugin runs.
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with_all = ["topology", "nodes"])]
    pub capture: Vec<PathBuf>,
    /// Number of nodes (instead of a topology file) [default: 2].
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Pods per node [default: 2, or the topology's].
    #[arg(long)]
    pub pods_per_node: Option<usize>,
    /// Plugin directory, or several joined by ':' (default: the topology's,
    /// else the bundled cnilab-bridge next to this binary). With your own
    /// plugin, pass --config too.
    #[arg(long, value_name = "DIR[:DIR]")]
    pub plugin_dir: Option<String>,
    /// Plugin config template (a conflist or conf), filled in per node.
    /// Placeholders: {{node}} the node's name; {{pod_cidr}} its IPv4 pod
    /// CIDR; {{pod_cidr6}} its IPv6 pod CIDR; {{ranges}} host-local
    /// `ranges`, one range set per pod CIDR (JSON); {{cluster_cidr}} the
    /// cluster CIDRs (JSON list); {{data_dir}} a per-node directory for IPAM
    /// state; {{mtu}} the pods' MTU; {{ip_masq}} true when the plugin is to
    /// masquerade. An unknown placeholder, or one a node has no value for,
    /// is an error.
    #[arg(long, value_name = "TEMPLATE")]
    pub config: Option<PathBuf>,
    /// Underlay shape of a --nodes lab: l2 (one switch), routed (a subnet per node, joined by a router), nat (VirtualBox NAT + host-only).
    #[arg(long, value_enum, conflicts_with = "topology")]
    pub shape: Option<crate::lab::topology::shapes::Shape>,
    /// Route pods over a kernel VXLAN overlay (flannel's vxlan backend; pod MTU = underlay − 50).
    #[arg(long)]
    pub vxlan: bool,
    /// Add a kube-proxy-like ClusterIP Service (nftables DNAT) and its checks.
    #[arg(long)]
    pub service: bool,
    /// How pods are attached: `direct` executes the plugin; `containerd` runs
    /// a containerd per node and makes pods through the CRI, like kubelet.
    #[arg(long, value_enum, default_value_t = RuntimeKind::Direct)]
    pub runtime: RuntimeKind,
}

/// A lab ready to be built: the flags' topology, checked, and how it will
/// fit the host's neighbour tables.
pub(super) struct Prepared {
    pub recipe: Recipe,
    pub host: HostFit,
}

/// What `lab run` and `lab up` do before the builder, in one call: the
/// topology of the flags, the plugin and its template checked ([`Recipe`]),
/// the header printed, the host's neighbour tables planned (`tune_host`:
/// they may be raised) and the runtime said. Nothing is built or changed.
/// Each step goes down to the floor that knows it and nothing calls back
/// into this file.
pub(super) fn prepare(
    args: &TopologyFlags,
    tune_host: bool,
) -> Result<Prepared, Box<dyn std::error::Error>> {
    let topo = topology(args)?;
    let recipe = Recipe::new(topo, args.plugin_dir.as_deref(), args.runtime)?;
    eprintln!("🔭 cnilab lab {}", recipe.describe());
    let counts = vec![recipe.topo.pods_per_node; recipe.topo.nodes.len()];
    if crate::connectivity::catalogue::sampled(&counts) {
        eprintln!("🎯 {}", crate::connectivity::catalogue::SAMPLED);
    }
    let host = crate::lab::neighbours::fit(&recipe.topo, tune_host)?;
    if host.pin || !host.tune.is_empty() || host.unchecked {
        eprintln!("🧮 {}", host.summary);
    }
    if let Some(support) = &recipe.containerd {
        eprintln!("🐳 runtime: {}", support.describe());
    }
    Ok(Prepared { recipe, host })
}

/// The lab the flags describe: a topology file or `--nodes`, with
/// `--pods-per-node`, `--config`, `--shape`, `--vxlan` and `--service` applied.
fn topology(args: &TopologyFlags) -> Result<Topology, Box<dyn std::error::Error>> {
    let mut topo = match (&args.topology, args.nodes) {
        (Some(_), Some(_)) => return Err("give either --topology or --nodes, not both".into()),
        (Some(path), None) => Topology::load(path)?,
        (None, nodes) => Topology::generated(nodes.unwrap_or(2), args.pods_per_node.unwrap_or(2))?,
    };
    if let (Some(p), Some(_)) = (args.pods_per_node, &args.topology) {
        topo.pods_per_node = p;
        topo.validate(Path::new("--pods-per-node"))?;
    }
    if let Some(config) = &args.config {
        topo.use_template(config, args.topology.is_none());
    }
    crate::lab::topology::shapes::apply_flags(&mut topo, args.shape, args.vxlan, args.service)?;
    Ok(topo)
}

/// The plugin directory (the flag's, else the topology's) and the
/// topology's template are sound ([`Recipe::new`]). Nothing is built.
pub(super) fn check_plugin(
    plugin_dir: &Option<String>,
    topo: &Topology,
) -> Result<(), Box<dyn std::error::Error>> {
    Recipe::new(topo.clone(), plugin_dir.as_deref(), RuntimeKind::Direct)?;
    Ok(())
}

/// With `--runtime containerd`: which containerd runs the pods and what it
/// supports; a missing or unusable containerd is an environment error (exit 2).
pub(super) fn runtime_header(runtime: RuntimeKind) -> Result<(), Box<dyn std::error::Error>> {
    if runtime == RuntimeKind::Containerd {
        let support = cri::detect()?;
        eprintln!("🐳 runtime: {}", support.describe());
    }
    Ok(())
}
