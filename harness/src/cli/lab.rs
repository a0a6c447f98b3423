//! `cnilab lab …`: simulated multi-node clusters in namespaces.

use super::args::{CheckOutputArgs, OutputArgs};
use super::CliResult;
use crate::lab::commands::{self as lab, Outputs, TopologyArgs};
use crate::lab::cri::RuntimeKind;
use clap::Subcommand;
use std::path::PathBuf;

/// Simulated multi-node clusters in namespaces: build, check, tear down.
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab lab run --nodes 3\n  \
    cnilab lab run --nodes 4 --pods-per-node 25 --vxlan --service\n  \
    cnilab lab run --shape routed\n  \
    cnilab lab up --name demo && cnilab lab check --name demo -o junit > lab.xml\n\n",
    crate::exit_codes_help!()))]
pub struct Lab {
    #[command(subcommand)]
    pub command: LabCmd,
}

#[derive(clap::Args)]
pub struct TopologyFlags {
    /// Topology file (TOML; examples in lab/topologies/).
    #[arg(long, conflicts_with = "nodes")]
    pub topology: Option<PathBuf>,
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
    pub shape: Option<crate::lab::underlay::Shape>,
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

impl TopologyFlags {
    fn args(&self, tune_host: bool) -> TopologyArgs {
        TopologyArgs {
            topology: self.topology.clone(),
            nodes: self.nodes,
            pods_per_node: self.pods_per_node,
            config: self.config.clone(),
            tune_host,
            shape: self.shape,
            vxlan: self.vxlan,
            service: self.service,
            runtime: self.runtime,
        }
    }
}

/// Where the check's report goes, and which checks run.
#[derive(clap::Args)]
pub struct ReportFlags {
    #[command(flatten)]
    pub output: CheckOutputArgs,
    /// Also write JUnit XML to this file.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Also write a self-contained HTML report to this file.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Only these check groups (prefixes, comma-separated), e.g. pod-to-pod,mtu;
    /// add @ipv4 or @ipv6 for one address family (pod-to-pod/cross-node@ipv6).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

impl ReportFlags {
    fn outputs(&self) -> Outputs {
        Outputs {
            format: self.output.output,
            junit: self.junit.clone(),
            report: self.report.clone(),
        }
    }
}

#[derive(Subcommand)]
pub enum LabCmd {
    /// Build a lab, run the connectivity checks, tear it down (exit 0 iff all passed).
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab run\n  \
        cnilab lab run --topology lab/topologies/agent.toml --only pod-to-pod -o json\n  \
        cnilab lab run --topology lab/topologies/dual-stack.toml\n  \
        cnilab lab run --plugin-dir /usr/lib/cni --config lab/configs/lab-ptp.conflist.tmpl\n  \
        cnilab lab run --nodes 10 --pods-per-node 100\n  \
        cnilab lab run --runtime containerd\n\n\
        Large labs: the host's neighbour tables (one per family for every namespace) hold\n\
        gc_thresh3 entries; a lab that needs more gets permanent entries for its bulk probe\n\
        paths (the first pod of each node still resolves through ARP/NDP), or is refused\n\
        up front with the numbers. A run that hits the limit anyway is INCONCLUSIVE (3).\n\n",
        crate::exit_codes_help!()))]
    Run {
        #[command(flatten)]
        topology: TopologyFlags,
        /// If the lab needs more neighbour entries than the host's tables
        /// hold, raise net.ipv4/ipv6.neigh.default.gc_thresh1/2/3 for the
        /// run; they are restored afterwards, also on Ctrl-C.
        #[arg(long)]
        tune_host: bool,
        #[command(flatten)]
        output: ReportFlags,
    },
    /// Build a lab and leave it standing (namespaces cnilab-lab-NAME-*).
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab up --name demo --nodes 3\n  \
        cnilab lab up --name demo --topology lab/topologies/agent.toml -o json\n  \
        cnilab lab up --name demo --runtime containerd\n\n",
        crate::exit_codes_help!()))]
    Up {
        #[command(flatten)]
        topology: TopologyFlags,
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Run the checks against a standing lab.
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab check --name demo\n  \
        cnilab lab check --name demo -o junit > lab.xml\n\n",
        crate::exit_codes_help!()))]
    Check {
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
        #[command(flatten)]
        output: ReportFlags,
    },
    /// Show standing labs.
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab status\n  \
        cnilab lab status --name demo -o json\n\n",
        crate::exit_codes_help!()))]
    Status {
        /// Only this lab (default: every standing lab).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Print a standing lab's network as read from its namespaces: links,
    /// addresses, routes, rules, neighbours, FDB, nftables tables, sysctls
    /// (the lab model; `-o json` for the model itself).
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab show --name demo\n  \
        cnilab lab show --name demo -o json\n\n",
        crate::exit_codes_help!()))]
    Show {
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Follow one packet from FROM to TO through every namespace it crosses
    /// and say where it died: the kernel's routing answer at each hop and
    /// nftables' own trace of one real probe (exit 0 arrived, 1 died,
    /// 3 inconclusive).
    #[command(after_help = concat!("FROM and TO are pods, nodes or addresses of the lab.\n\n\
        Examples:\n  \
        cnilab lab trace --name demo node1-pod0 node2-pod0\n  \
        cnilab lab trace --name demo node1-pod0 node2 --proto tcp --port 7777 -o json\n\n",
        crate::exit_codes_help!()))]
    Trace {
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
        /// Where the packet starts: a pod, a node or an address.
        from: String,
        /// Where it should arrive: a pod, a node or an address.
        to: String,
        /// The probe's protocol.
        #[arg(long, value_enum, default_value_t = crate::trace::Proto::Icmp)]
        proto: crate::trace::Proto,
        /// Destination port (tcp, udp; default the lab's probe port).
        #[arg(long)]
        port: Option<u16>,
        /// The probe's size in bytes, IP header included, sent with DF
        /// (icmp; default ping's 84, or 104 for IPv6): finds an MTU too small.
        #[arg(long, value_parser = clap::value_parser!(u32).range(48..=65535))]
        size: Option<u32>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Remove a standing lab.
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab down --name demo\n\n",
        crate::exit_codes_help!()))]
    Down {
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
    },
}

impl Lab {
    pub fn run(self) -> CliResult {
        match self.command {
            LabCmd::Run {
                topology,
                tune_host,
                output,
            } => lab::run(
                &topology.args(tune_host),
                topology.plugin_dir.clone(),
                &output.only,
                &output.outputs(),
            ),
            LabCmd::Up {
                topology,
                name,
                output,
            } => lab::up(
                &topology.args(false),
                topology.plugin_dir.clone(),
                &name,
                output.output,
            ),
            LabCmd::Check { name, output } => lab::check(&name, &output.only, &output.outputs()),
            LabCmd::Status { name, output } => lab::status(name.as_deref(), output.output),
            LabCmd::Show { name, output } => show(&name, output.output),
            LabCmd::Trace {
                name,
                from,
                to,
                proto,
                port,
                size,
                output,
            } => trace(&name, &from, &to, (proto, port, size), output.output),
            LabCmd::Down { name } => lab::down(&name),
        }
    }
}

/// `cnilab lab trace`: one packet followed; the exit code is the verdict's.
fn trace(
    name: &str,
    from: &str,
    to: &str,
    (proto, port, size): (crate::trace::Proto, Option<u16>, Option<u32>),
    format: crate::report::Format,
) -> CliResult {
    if port.is_some() && proto == crate::trace::Proto::Icmp {
        return Err("--port needs --proto tcp or udp".into());
    }
    if size.is_some() && proto != crate::trace::Proto::Icmp {
        return Err("--size needs --proto icmp (the default)".into());
    }
    let t = crate::lab::trace::run(name, from, to, proto, port, size)?;
    if format == crate::report::Format::Table {
        print!("{}", crate::trace::render(&t));
    } else {
        println!("{}", serde_json::to_string_pretty(&t)?);
    }
    Ok(std::process::ExitCode::from(t.verdict.exit_code()))
}

/// `cnilab lab show`: the standing lab read back into the lab model.
fn show(name: &str, format: crate::report::Format) -> CliResult {
    let model = crate::lab::model::layout::standing(name)?;
    if format == crate::report::Format::Table {
        print!("{}", model.to_text());
    } else {
        // The model is its own document (versioned by its own
        // `schemaVersion`; captures will be files of it), not a report.
        println!("{}", serde_json::to_string_pretty(&model)?);
    }
    Ok(std::process::ExitCode::SUCCESS)
}
