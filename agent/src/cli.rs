//! Command-line interface.

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "cnilab-agent",
    version,
    about = "cnilab node agent: routes to other nodes' pod CIDRs, CNI config, forwarding and masquerade",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent (the default when no subcommand is given).
    Run(Box<RunArgs>),
    /// Remove what the agent made: its routes, its nftables table, the
    /// conflist and the plugin binary. Forwarding sysctls are left as they are.
    Uninstall(UninstallArgs),
    /// Copy the plugin binary into the CNI bin dir (the DaemonSet's initContainer).
    InstallPlugin(InstallPluginArgs),
}

#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Network namespace to do the kernel work in (`/run/netns/NAME`);
    /// default: the agent's own. The API server is still reached from the
    /// agent's namespace.
    #[arg(long, value_name = "PATH")]
    pub netns: Option<PathBuf>,
    /// CNI configuration directory.
    #[arg(long, default_value = "/etc/cni/net.d", value_name = "DIR")]
    pub cni_conf_dir: PathBuf,
    /// File name of the conflist in the CNI conf dir (sorts first by default).
    #[arg(long, default_value = "10-cnilab.conflist", value_name = "NAME")]
    pub cni_conf_name: String,
    /// CNI plugin binary directory.
    #[arg(long, default_value = "/opt/cni/bin", value_name = "DIR")]
    pub cni_bin_dir: PathBuf,
    /// The nft binary.
    #[arg(long, default_value = "nft", value_name = "PATH")]
    pub nft: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// This node's name.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Read nodes from this JSON or TOML file (lab mode) instead of the
    /// Kubernetes API; it is polled for changes.
    #[arg(long, value_name = "FILE", conflicts_with = "kubeconfig")]
    pub nodes_file: Option<PathBuf>,
    /// Kubeconfig for the API server; default: in-cluster config, then $KUBECONFIG.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The cluster's pod CIDR(s), one per family (repeat or comma-separate).
    /// Traffic to them is forwarded and never masqueraded.
    #[arg(
        long = "cluster-cidr",
        env = "CNILAB_CLUSTER_CIDR",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub cluster_cidrs: Vec<IpNet>,
    /// Let the plugin masquerade (conflist ipMasq true) instead of the agent's nftables table.
    #[arg(long)]
    pub no_masquerade: bool,
    /// Install this plugin binary into the CNI bin dir at startup.
    #[arg(long, value_name = "PATH")]
    pub plugin_binary: Option<PathBuf>,
    /// CNI network name in the conflist.
    #[arg(long, default_value = "cnilab")]
    pub network_name: String,
    /// Bridge name in the conflist.
    #[arg(long, default_value = "cnilab0")]
    pub bridge: String,
    /// MTU in the conflist.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// cniVersion of the conflist (1.0.0 for containerd 1.6/1.7, which refuse 1.1.0 results).
    #[arg(long, default_value = "1.1.0", value_parser = ["0.4.0", "1.0.0", "1.1.0"])]
    pub cni_version: String,
    /// The plugin's IPAM store (`ipam.dataDir` of the conflist); left out,
    /// the plugin keeps its default, /var/lib/cni/networks.
    #[arg(long, value_name = "DIR")]
    pub ipam_data_dir: Option<std::path::PathBuf>,
    /// Chain the portmap plugin in the conflist (it must be in the CNI bin dir).
    #[arg(long)]
    pub portmap: bool,
    /// Periodic full reconcile, in seconds.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub resync_seconds: u64,
    /// How often the nodes file is checked, in milliseconds.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub poll_ms: u64,
    /// Address for /healthz and /metrics.
    #[arg(long, default_value = "127.0.0.1:9750", value_name = "ADDR")]
    pub metrics_addr: SocketAddr,
    /// Do not serve /healthz and /metrics.
    #[arg(long)]
    pub no_metrics: bool,
    /// Reconcile once and exit (non-zero on any error).
    #[arg(long)]
    pub once: bool,
    #[command(flatten)]
    pub node: NodeArgs,
}

#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub node: NodeArgs,
}

#[derive(Debug, Clone, Args)]
pub struct InstallPluginArgs {
    /// The plugin binary to copy.
    #[arg(long, value_name = "PATH")]
    pub plugin_binary: PathBuf,
    /// CNI plugin binary directory.
    #[arg(long, default_value = "/opt/cni/bin", value_name = "DIR")]
    pub cni_bin_dir: PathBuf,
}
