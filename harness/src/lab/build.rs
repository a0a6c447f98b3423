//! Building and tearing down a lab: an underlay switch (a bridge in its own
//! namespace), one namespace per node linked to it by a veth, an "external"
//! host, node routes (static or by an agent) and pods attached through the
//! harness `Runtime` with each node as the host namespace.

use super::topology::{Masquerade, NodeSpec, Routing, Topology};
use crate::netns::{Netns, NetnsError};
use crate::runtime::{NetworkConfig, Runtime, RuntimeConf, RuntimeError};
use cnilab_net::{netns as plugin_netns, nl};
use ipnet::IpNet;
use rtnetlink::LinkBridge;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The default plugin config template (cnilab-bridge).
pub const DEFAULT_TEMPLATE: &str = include_str!("../../../lab/configs/lab-cnilab.conflist.tmpl");

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("{0}")]
    Setup(String),
    /// A fault or check that cannot apply to this plugin (a scenario SKIPs).
    #[error("{0}")]
    Unsupported(String),
}

pub(super) fn setup(msg: impl Into<String>) -> LabError {
    LabError::Setup(msg.into())
}

/// In a node's run dir: the agent's pid and start time.
pub const AGENT_PIDFILE: &str = "agent.pid";
/// In a lab's run dir: the pid and start time of the process that made it.
pub const OWNER_PIDFILE: &str = "owner.pid";

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

/// Options that do not belong to the topology.
#[derive(Clone, Debug, Default)]
pub struct UpOptions {
    /// Overrides the topology's plugin dir.
    pub plugin_dir: Option<String>,
    /// Names namespaces `cnilab-lab-<name>-…` and keeps them after the
    /// process exits (`cnilab lab up`).
    pub persistent: Option<String>,
    /// Where configs, IPAM stores and agent files go.
    pub run_dir: PathBuf,
    /// How pods are attached (`--runtime`).
    pub runtime: super::cri::RuntimeKind,
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

/// The directory of the running `cnilab` binary (where cargo puts
/// `cnilab-bridge` and `cnilab-agent` too).
pub fn own_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()?
        .parent()
        .map(Path::to_path_buf)
}

/// The directory of the bundled `cnilab-bridge`: next to this binary
/// (cargo's target dir; `cargo install` puts both in the same bin dir), else
/// the first absolute `$PATH` directory that has it. The error says how to
/// install it or point at a plugin.
pub fn bundled_plugin_dir() -> Result<PathBuf, String> {
    const NAME: &str = "cnilab-bridge";
    let path = std::env::var_os("PATH").unwrap_or_default();
    own_dir()
        .into_iter()
        .chain(std::env::split_paths(&path))
        .find(|d| d.is_absolute() && d.join(NAME).is_file())
        .ok_or_else(|| {
            format!(
                "the bundled plugin {NAME} is neither next to this binary ({}) nor on $PATH: install it next to cnilab (`cargo install --path plugin` in the repository, or `cargo build --release --workspace`), or pass --plugin-dir DIR (and --config TEMPLATE for your own plugin)",
                own_dir().unwrap_or_default().display()
            )
        })
}

pub(super) fn make_ns(opts: &UpOptions, role: &str) -> Result<Netns, NetnsError> {
    make_ns_from(opts, role, None)
}

/// [`make_ns`]; with `from`, names an existing namespace (a CRI pod's).
pub(crate) fn make_ns_from(
    opts: &UpOptions,
    role: &str,
    from: Option<&Path>,
) -> Result<Netns, NetnsError> {
    match &opts.persistent {
        Some(lab) => {
            let ns =
                Netns::persistent_from(&format!("{}lab-{lab}-{role}", crate::netns::PREFIX), from)?;
            super::state::record_namespace(&opts.run_dir, ns.name()).map_err(|e| {
                NetnsError::Create {
                    name: ns.name().to_string(),
                    reason: format!("record it in {}: {e}", opts.run_dir.display()),
                }
            })?;
            Ok(ns)
        }
        None => {
            let label: String = role.chars().take(12).collect();
            Netns::with_label_from(&label, from)
        }
    }
}

/// Runs one netlink job in `ns`, mapping errors to a message naming `what`.
pub(super) fn netlink<F, Fut, R>(ns: &Netns, what: &str, job: F) -> Result<R, LabError>
where
    F: FnOnce(rtnetlink::Handle) -> Fut + Send,
    Fut: std::future::Future<Output = Result<R, rtnetlink::Error>>,
    R: Send,
{
    ns.netlink(job).map_err(|e| setup(format!("{what}: {e}")))
}

/// Links `ns` to the switch: veth `port` in the switch, `eth0` in `ns`,
/// with `addresses` on eth0 (one per underlay family).
fn plug(
    switch: &Netns,
    bridge: u32,
    ns: &Netns,
    port: &str,
    addresses: Vec<IpNet>,
    mtu: u32,
) -> Result<(), LabError> {
    // An IPv6 underlay address must be usable at once: no duplicate
    // address detection on the lab's own wires (each address is unique
    // by validation).
    plugin_netns::write_sysctl(Some(ns.file()), "net/ipv6/conf/default/accept_dad", "0")
        .map_err(|e| setup(format!("accept_dad in {}: {e}", ns.name())))?;
    let peer = ns.file();
    netlink(
        switch,
        &format!("veth {port} to {}", ns.name()),
        |h| async move {
            h.link()
                .add(nl::veth_message(
                    port,
                    "eth0",
                    peer,
                    Some(mtu),
                    Some(bridge),
                ))
                .execute()
                .await
        },
    )?;
    netlink(ns, &format!("eth0 of {}", ns.name()), |h| async move {
        let eth0 = nl::link_by_name(&h, "eth0")
            .await?
            .ok_or(rtnetlink::Error::RequestFailed)?;
        for address in addresses {
            nl::add_address(&h, eth0.index, address).await?;
        }
        nl::set_up(&h, eth0.index).await?;
        if let Some(lo) = nl::link_by_name(&h, "lo").await? {
            nl::set_up(&h, lo.index).await?;
        }
        Ok(())
    })
}

fn ranges_json(cidrs: &[IpNet]) -> String {
    let sets: Vec<String> = cidrs
        .iter()
        .map(|c| format!("[{{\"subnet\":\"{}\"}}]", c.trunc()))
        .collect();
    format!("[{}]", sets.join(","))
}

/// The placeholders a plugin config template may use, with what each
/// becomes (`cnilab lab run --help` and the README list the same).
pub const PLACEHOLDERS: &[(&str, &str)] = &[
    ("node", "the node's name"),
    ("pod_cidr", "the node's IPv4 pod CIDR"),
    ("pod_cidr6", "the node's IPv6 pod CIDR"),
    (
        "ranges",
        "host-local `ranges`: one range set per pod CIDR (JSON)",
    ),
    ("cluster_cidr", "the cluster CIDRs as a JSON list"),
    ("data_dir", "a per-node directory for IPAM state"),
    ("mtu", "the pods' MTU"),
    (
        "ip_masq",
        "true when the plugin is to masquerade (masquerade = \"plugin\")",
    ),
];

/// Refuses a template with a placeholder that is not in [`PLACEHOLDERS`],
/// or one that some node of `topo` has no value for (`{{pod_cidr6}}` on a
/// node without an IPv6 pod CIDR): the error names the line.
pub fn check_template(template: &str, topo: &Topology) -> Result<(), String> {
    for (n, line) in template.lines().enumerate() {
        let mut rest = line;
        while let Some(open) = rest.find("{{") {
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(format!(
                    "line {}: an unclosed placeholder: {}",
                    n + 1,
                    line.trim()
                ));
            };
            let name = after[..close].trim();
            if !PLACEHOLDERS.iter().any(|(p, _)| *p == name) {
                let known: Vec<String> = PLACEHOLDERS
                    .iter()
                    .map(|(p, _)| format!("{{{{{p}}}}}"))
                    .collect();
                return Err(format!(
                    "line {}: unknown placeholder {{{{{name}}}}}; the placeholders are {}",
                    n + 1,
                    known.join(", ")
                ));
            }
            for node in &topo.nodes {
                let v6 = match name {
                    "pod_cidr" => false,
                    "pod_cidr6" => true,
                    _ => continue,
                };
                if node.pod_cidr_of(v6).is_none() {
                    return Err(format!(
                        "line {}: {{{{{name}}}}} has no value on node {}: it has no {} pod CIDR",
                        n + 1,
                        node.name,
                        if v6 { "IPv6" } else { "IPv4" }
                    ));
                }
            }
            rest = &after[close + 2..];
        }
    }
    // Filled in, it must be JSON: said against the template's own lines
    // (no value spans lines), before anything is built.
    for node in &topo.nodes {
        let text = render_template(template, topo, node, Path::new("/var/lib/cni/cnilab"));
        if let Err(e) = serde_json::from_str::<serde_json::Value>(&text) {
            let what = e.to_string();
            let what = what.split(" at line ").next().unwrap_or(&what);
            return Err(format!(
                "line {} column {}: filled in for {}, it is not JSON: {what}",
                e.line(),
                e.column(),
                node.name
            ));
        }
    }
    Ok(())
}

/// The topology's config template (or the bundled one), checked with
/// [`check_template`]; the error names the file.
pub fn check_template_of(topo: &Topology) -> Result<(), LabError> {
    match topo.plugin.as_ref().and_then(|p| p.config.clone()) {
        Some(path) => {
            let text = crate::assets::read_to_string(&path)
                .map_err(|e| setup(format!("plugin config template {}: {e}", path.display())))?;
            check_template(&text, topo)
                .map_err(|e| setup(format!("plugin config template {}: {e}", path.display())))
        }
        None => check_template(DEFAULT_TEMPLATE, topo)
            .map_err(|e| setup(format!("the bundled config template: {e}"))),
    }
}

/// Fills a config template for `node`.
pub fn render_template(
    template: &str,
    topo: &Topology,
    node: &NodeSpec,
    data_dir: &Path,
) -> String {
    let v4 = node.pod_cidr.iter().find(|c| c.addr().is_ipv4());
    let v6 = node.pod_cidr.iter().find(|c| c.addr().is_ipv6());
    let cluster: Vec<String> = topo
        .cluster_cidr
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect();
    template
        .replace("{{node}}", &node.name)
        .replace(
            "{{pod_cidr}}",
            &v4.map(|c| c.trunc().to_string()).unwrap_or_default(),
        )
        .replace(
            "{{pod_cidr6}}",
            &v6.map(|c| c.trunc().to_string()).unwrap_or_default(),
        )
        .replace("{{ranges}}", &ranges_json(&node.pod_cidr))
        .replace("{{cluster_cidr}}", &format!("[{}]", cluster.join(",")))
        .replace("{{data_dir}}", &data_dir.display().to_string())
        .replace("{{mtu}}", &topo.pod_mtu().to_string())
        .replace(
            "{{ip_masq}}",
            if topo.masquerade == Masquerade::Plugin {
                "true"
            } else {
                "false"
            },
        )
}

/// The nftables ruleset of `masquerade = "node"`: pod traffic that leaves
/// the cluster CIDR is masqueraded to the node's address.
pub fn node_nat_ruleset(node: &NodeSpec, cluster: &[IpNet]) -> String {
    let mut rules = String::new();
    for (v4, fam) in [(true, "ip"), (false, "ip6")] {
        let pods: Vec<String> = node
            .pod_cidr
            .iter()
            .filter(|c| c.addr().is_ipv4() == v4)
            .map(|c| c.trunc().to_string())
            .collect();
        let clusters: Vec<String> = cluster
            .iter()
            .filter(|c| c.addr().is_ipv4() == v4)
            .map(|c| c.trunc().to_string())
            .collect();
        if pods.is_empty() || clusters.is_empty() {
            continue;
        }
        rules.push_str(&format!(
            "    {fam} saddr {{ {} }} {fam} daddr != {{ {} }} masquerade\n",
            pods.join(", "),
            clusters.join(", ")
        ));
    }
    format!(
        "table inet cnilab_lab_nat {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n{rules}  }}\n}}\n"
    )
}

/// Feeds a ruleset to `nft -f -` inside `ns`.
pub fn nft(ns: &Netns, ruleset: &str) -> Result<(), LabError> {
    use cnilab_net::nft::NftError;
    let program = std::path::Path::new("nft");
    cnilab_net::nft::load(program, Some(ns.file()), ruleset).map_err(|e| match e {
        NftError::Spawn { source, .. } => setup(format!(
            "run nft in {}: {source} (is nftables installed?)",
            ns.name()
        )),
        NftError::Io { what, source } => setup(format!("{what}: {source}")),
        NftError::Failed { stderr, .. } => {
            setup(format!("nft in {}: {stderr}\n{ruleset}", ns.name()))
        }
    })
}

/// The JSON node list the agent's file source reads.
pub fn nodes_file(nodes: &[NodeSpec]) -> String {
    let list: Vec<serde_json::Value> = nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "name": n.name,
                // One address, or both families' (the agent reads either).
                "internalIP": match n.addresses().as_slice() {
                    [one] => serde_json::json!(one),
                    all => serde_json::json!(all),
                },
                "podCIDRs": n.pod_cidr.iter().map(|c| c.trunc().to_string()).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::to_string_pretty(&list).unwrap_or_else(|_| "[]".into())
}

/// Each of `node`'s underlay addresses with the prefix of its underlay.
pub fn underlay_addresses(topo: &Topology, node: &NodeSpec) -> Result<Vec<IpNet>, LabError> {
    node.addresses()
        .into_iter()
        .map(|a| {
            // IPv4: the node's subnet (one per node in a routed underlay).
            let prefix = match topo.underlay6 {
                Some(u6) if a.is_ipv6() => u6.prefix_len(),
                _ => super::underlay::node_prefix(topo),
            };
            IpNet::new(a, prefix).map_err(|e| setup(e.to_string()))
        })
        .collect()
}

/// Installs `podCIDR via nodeIP` for every other node, in each family (the
/// next hop is the peer's underlay address of the pod CIDR's family).
pub fn install_static_routes(
    node: &Netns,
    me: &NodeSpec,
    all: &[NodeSpec],
) -> Result<(), LabError> {
    let others: Vec<(IpNet, IpAddr)> = all
        .iter()
        .filter(|n| n.name != me.name)
        .flat_map(|n| {
            n.pod_cidr
                .iter()
                .filter_map(move |c| n.address_of(c.addr().is_ipv6()).map(|via| (c.trunc(), via)))
        })
        .collect();
    netlink(node, &format!("routes on {}", me.name), |h| async move {
        for (dst, via) in others {
            let msg = nl::route_message(dst, Some(via), None, None)
                .map_err(|_| rtnetlink::Error::RequestFailed)?;
            nl::add_route(&h, msg, true).await?;
        }
        Ok(())
    })
}

impl Lab {
    /// Builds the whole lab. On error, everything made so far is removed
    /// (the namespaces are dropped).
    pub fn up(topo: Topology, opts: UpOptions) -> Result<Lab, LabError> {
        let started = Instant::now();
        let containerd = match opts.runtime {
            super::cri::RuntimeKind::Containerd => Some(super::cri::detect()?),
            super::cri::RuntimeKind::Direct => None,
        };
        let plugin_dir = opts
            .plugin_dir
            .clone()
            .or_else(|| topo.plugin.as_ref().and_then(|p| p.dir.clone()))
            .map_or_else(|| bundled_plugin_dir().map(|d| d.display().to_string()), Ok)
            .map_err(setup)?;
        let template = match topo.plugin.as_ref().and_then(|p| p.config.clone()) {
            Some(path) => crate::assets::read_to_string(&path)
                .map_err(|e| setup(format!("plugin config template {}: {e}", path.display())))?,
            None => DEFAULT_TEMPLATE.to_string(),
        };
        check_template(&template, &topo)
            .map_err(|e| setup(format!("plugin config template: {e}")))?;
        std::fs::create_dir_all(&opts.run_dir)
            .map_err(|e| setup(format!("run dir {}: {e}", opts.run_dir.display())))?;
        // Who made this run dir: `cnilab sweep` removes it once that process is gone.
        if let Some(me) = super::pidfile::Identity::current() {
            let path = opts.run_dir.join(OWNER_PIDFILE);
            super::pidfile::write(&path, me)
                .map_err(|e| setup(format!("{}: {e}", path.display())))?;
        }

        let switch = make_ns(&opts, "switch")?;
        let bridge = netlink(&switch, "underlay bridge", |h| async move {
            h.link()
                .add(LinkBridge::new("underlay").build())
                .execute()
                .await?;
            nl::link_by_name(&h, "underlay")
                .await?
                .map(|l| l.index)
                .ok_or(rtnetlink::Error::RequestFailed)
        })?;
        let mut lab = Lab {
            topo: topo.clone(),
            opts: opts.clone(),
            plugin_dir,
            switch,
            external: None,
            nodes: Vec::new(),
            phases: Vec::new(),
            extra: Vec::new(),
            containerd,
        };
        if let Some(ext) = &topo.external {
            let ns = make_ns(&opts, "external")?;
            let as_node = NodeSpec {
                name: "external".into(),
                address: ext.address,
                address6: ext.address6,
                pod_cidr: Vec::new(),
                mtu: None,
                sysctls: Default::default(),
            };
            let addrs = underlay_addresses(&topo, &as_node)?;
            let ext_bridge = super::underlay::bridge_for(&lab, ext.address, bridge)?;
            plug(&lab.switch, ext_bridge, &ns, "p-external", addrs, topo.mtu)?;
            crate::lab::probe::allow_ping_sockets(ns.file())
                .map_err(|e| setup(format!("external: {e}")))?;
            lab.external = Some(ns);
            super::underlay::attach(
                &mut lab,
                super::underlay::NsRef::External,
                ext.address,
                bridge,
            )?;
        }
        for spec in &topo.nodes {
            let node = lab.add_node_ns(spec, bridge, &template)?;
            lab.nodes.push(node);
            let i = lab.nodes.len() - 1;
            super::underlay::attach(
                &mut lab,
                super::underlay::NsRef::Node(i),
                spec.address,
                bridge,
            )?;
        }
        lab.install_routing()?;
        lab.phases.push(("up".into(), started.elapsed()));

        let started = Instant::now();
        lab.start_all_containerd()?;
        lab.attach_pods()?;
        super::services::install(&lab)?;
        lab.phases.push(("attach".into(), started.elapsed()));
        Ok(lab)
    }

    fn underlay_bridge(&self) -> Result<u32, LabError> {
        netlink(&self.switch, "underlay bridge", |h| async move {
            nl::link_by_name(&h, "underlay")
                .await?
                .map(|l| l.index)
                .ok_or(rtnetlink::Error::RequestFailed)
        })
    }

    fn add_node_ns(&self, spec: &NodeSpec, bridge: u32, template: &str) -> Result<Node, LabError> {
        let topo = &self.topo;
        let ns = make_ns(&self.opts, &spec.name)?;
        // Announce the node's MAC when its uplink comes up (gratuitous ARP),
        // as a re-created node must: neighbours may still cache the old one.
        plugin_netns::write_sysctl(Some(ns.file()), "net/ipv4/conf/default/arp_notify", "1")
            .map_err(|e| setup(format!("arp_notify on {}: {e}", spec.name)))?;
        let addrs = underlay_addresses(topo, spec)?;
        let bridge = super::underlay::bridge_for(self, spec.address, bridge)?;
        plug(
            &self.switch,
            bridge,
            &ns,
            &format!("p-{}", spec.name),
            addrs,
            spec.mtu.unwrap_or(topo.mtu),
        )?;
        // A provisioned Kubernetes node forwards; scenarios turn it off.
        let mut sysctls: Vec<(String, String)> = vec![
            ("net/ipv4/ip_forward".into(), "1".into()),
            ("net/ipv6/conf/all/forwarding".into(), "1".into()),
        ];
        sysctls.extend(spec.sysctls.iter().map(|(k, v)| (k.clone(), v.clone())));
        for (key, value) in &sysctls {
            plugin_netns::write_sysctl(Some(ns.file()), key, value)
                .map_err(|e| setup(format!("sysctl {key} on {}: {e}", spec.name)))?;
        }
        crate::lab::probe::allow_ping_sockets(ns.file())
            .map_err(|e| setup(format!("{}: {e}", spec.name)))?;
        let node_dir = self.opts.run_dir.join(&spec.name);
        std::fs::create_dir_all(&node_dir)
            .map_err(|e| setup(format!("{}: {e}", node_dir.display())))?;
        let conf_text = render_template(template, topo, spec, &node_dir.join("ipam"));
        let conf_path = node_dir.join("net.conflist");
        std::fs::write(&conf_path, &conf_text)
            .map_err(|e| setup(format!("{}: {e}", conf_path.display())))?;
        let net = NetworkConfig::parse(&conf_text, &conf_path)?;
        let runtime = Runtime::new(&self.plugin_dir)
            .in_netns(&ns)?
            .with_cache_dir(&node_dir.join("results"));
        Ok(Node {
            spec: spec.clone(),
            ns,
            runtime,
            net,
            pods: Vec::new(),
            agent: None,
            cri: None,
        })
    }

    fn install_routing(&mut self) -> Result<(), LabError> {
        let specs: Vec<NodeSpec> = self.nodes.iter().map(|n| n.spec.clone()).collect();
        if self.topo.masquerade == Masquerade::Node {
            for node in &self.nodes {
                nft(
                    &node.ns,
                    &node_nat_ruleset(&node.spec, &self.topo.cluster_cidr),
                )?;
            }
        }
        match self.topo.routing {
            Routing::Static if super::underlay::routes_in_router(&self.topo) => {
                super::underlay::install_router_routes(self)
            }
            Routing::Static => {
                for node in &self.nodes {
                    install_static_routes(&node.ns, &node.spec, &specs)?;
                }
                Ok(())
            }
            Routing::Vxlan => super::vxlan::install(self),
            Routing::Agent => {
                self.write_nodes_file(&specs)?;
                for i in 0..self.nodes.len() {
                    self.start_agent(i)?;
                }
                self.wait_for_agent_routes(Duration::from_secs(15))
            }
        }
    }

    pub fn nodes_file_path(&self) -> PathBuf {
        self.opts.run_dir.join("nodes.json")
    }

    /// Publishes the node list to the agents (atomically: temp + rename).
    pub fn write_nodes_file(&self, specs: &[NodeSpec]) -> Result<(), LabError> {
        let path = self.nodes_file_path();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, nodes_file(specs))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| setup(format!("nodes file {}: {e}", path.display())))
    }

    /// Starts the agent command inside node `i`'s namespace.
    pub fn start_agent(&mut self, i: usize) -> Result<(), LabError> {
        let agent = self
            .topo
            .agent
            .clone()
            .ok_or_else(|| setup("routing = \"agent\" needs an [agent] command"))?;
        let node = &self.nodes[i];
        let node_dir = self.opts.run_dir.join(&node.spec.name);
        let cluster: Vec<String> = self
            .topo
            .cluster_cidr
            .iter()
            .map(|c| c.to_string())
            .collect();
        let fill = |word: &str| {
            word.replace("{{node}}", &node.spec.name)
                .replace(
                    "{{nodes_file}}",
                    &self.nodes_file_path().display().to_string(),
                )
                .replace("{{cluster_cidr}}", &cluster.join(","))
                .replace(
                    "{{conf_dir}}",
                    &node_dir.join("net.d").display().to_string(),
                )
                .replace("{{bin_dir}}", &node_dir.join("bin").display().to_string())
                .replace("{{run_dir}}", &node_dir.display().to_string())
        };
        let mut words: Vec<String> = agent.command.iter().map(|w| fill(w)).collect();
        let program = resolve_program(&words[0]);
        words.extend(super::cri::attach::agent_flags(
            &program,
            self.containerd.as_ref(),
        ));
        let log_path = node_dir.join("agent.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| setup(format!("{}: {e}", log_path.display())))?;
        let log2 = log.try_clone().map_err(|e| setup(e.to_string()))?;
        let mut command = node.ns.command(&program);
        // What proves the agent ours to `lab down` and `cnilab sweep`.
        command.env(super::pidfile::RUN_DIR_ENV, &node_dir);
        // The lab blocks SIGINT/SIGTERM for its Ctrl-C watcher; the agent must
        // get them (a blocked mask survives exec).
        // A throwaway lab's agents die with the lab process, however it dies
        // (SIGKILL included): the kernel sends them SIGKILL. A standing lab's
        // agents outlive `lab up` and are found again through their pidfiles.
        let die_with_parent = self.opts.persistent.is_none();
        let parent = std::process::id() as nix::libc::pid_t;
        // The agent writes its own pidfile (pid + start time) before exec,
        // so it is provably ours from its first instant, whenever the lab
        // process dies; `cnilab sweep` and `lab down` check it before they
        // signal.
        let pidfile_path = node_dir.join(AGENT_PIDFILE);
        let pidfile = super::pidfile::prepare(&pidfile_path)
            .map_err(|e| setup(format!("{}: {e}", pidfile_path.display())))?;
        let pidfile_fd = std::os::fd::AsRawFd::as_raw_fd(&pidfile);
        // SAFETY: only sigprocmask(2), prctl(2), getppid(2) and the
        // open/read/write/close of `write_own_identity`, which are
        // async-signal-safe; nothing is allocated.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                super::pidfile::write_own_identity(pidfile_fd)?;
                let mut set = nix::sys::signal::SigSet::empty();
                set.add(nix::sys::signal::Signal::SIGINT);
                set.add(nix::sys::signal::Signal::SIGTERM);
                set.thread_unblock().map_err(std::io::Error::from)?;
                if die_with_parent {
                    if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The parent died before prctl: nobody will send the signal.
                    if nix::libc::getppid() != parent {
                        return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
                    }
                }
                Ok(())
            });
        }
        if self.opts.persistent.is_some() {
            // A standing lab's agents must survive the terminal's Ctrl-C.
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let child = command
            .args(&words[1..])
            .env("NODE_NAME", &node.spec.name)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| {
                setup(format!(
                    "start agent {} on {}: {e}",
                    program.display(),
                    node.spec.name
                ))
            })?;
        drop(pidfile);
        crate::interrupt::register_child(child.id());
        self.nodes[i].agent = Some(child);
        Ok(())
    }

    /// Stops node `i`'s agent (SIGTERM, then SIGKILL).
    pub fn stop_agent(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].agent.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until every node has a route to every other node's pod CIDR.
    pub fn wait_for_agent_routes(&self, limit: Duration) -> Result<(), LabError> {
        let deadline = Instant::now() + limit;
        loop {
            let mut missing = Vec::new();
            for node in &self.nodes {
                let routes = node.ns.routes().map_err(|e| setup(e.to_string()))?;
                for other in self.nodes.iter().filter(|o| o.spec.name != node.spec.name) {
                    // Each pod CIDR via the peer's address of its family
                    // (a family the peer has no address of is not routed).
                    for cidr in &other.spec.pod_cidr {
                        let Some(via) = other.spec.address_of(cidr.addr().is_ipv6()) else {
                            continue;
                        };
                        if !routes
                            .iter()
                            .any(|r| r.dst == cidr.trunc() && r.gateway == Some(via))
                        {
                            missing.push(format!("{}: {} via {via}", node.spec.name, cidr));
                        }
                    }
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(setup(format!(
                    "the agents did not install these routes within {limit:?} (logs in {}): {}",
                    self.opts.run_dir.display(),
                    missing.join("; ")
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Creates and ADDs the pods of every node, in parallel.
    fn attach_pods(&mut self) -> Result<(), LabError> {
        let per_node = self.topo.pods_per_node;
        let bar = crate::report::progress::Progress::stderr();
        let total = self.nodes.len();
        let mut attached = Ok(());
        for i in 0..total {
            bar.status(&format!(
                "⌛ attaching {per_node} pods on node {}/{total}",
                i + 1
            ));
            attached = self.add_pods(i, per_node);
            if attached.is_err() {
                break;
            }
        }
        bar.clear();
        attached
    }

    /// Adds `count` pods to node `i`.
    pub fn add_pods(&mut self, i: usize, count: usize) -> Result<(), LabError> {
        let opts = &self.opts;
        let node = &self.nodes[i];
        let first = node.pods.len();
        let made: Vec<Result<Pod, LabError>> = crate::util::parallel_map(
            first..first + count,
            |k| -> Result<Pod, LabError> {
                let name = format!("{}-pod{k}", node.spec.name);
                if let Some(d) = &node.cri {
                    let named = |from: &Path| Ok(make_ns_from(opts, &name, Some(from))?);
                    return super::cri::attach::add_pod(d, &name, &named);
                }
                let ns = make_ns(opts, &name)?;
                ns.set_lo_up()?;
                crate::lab::probe::allow_ping_sockets(ns.file())
                    .map_err(|e| setup(format!("{name}: {e}")))?;
                let container_id = format!("cnilab-{name}");
                let rc = RuntimeConf::new(&container_id, Some(ns.path()), "eth0");
                let added = node.runtime.add(&node.net, &rc);
                let res = match added {
                    Ok(res) => res,
                    Err(e) => {
                        // Like a runtime: a failed ADD is followed by DEL.
                        let _ = node.runtime.del(&node.net, &rc);
                        return Err(setup(format!("ADD of {name} on {}: {e}", node.spec.name)));
                    }
                };
                let ips = res.result.ips.iter().map(|ip| ip.address).collect();
                Ok(Pod {
                    name,
                    container_id,
                    ns,
                    ips,
                })
            },
            || Err(setup("pod thread panicked")),
        );
        let mut first_error = None;
        for pod in made {
            match pod {
                Ok(p) => self.nodes[i].pods.push(p),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// DELs the pod and deletes its namespace.
    pub fn remove_pod(&mut self, i: usize, k: usize) -> Result<(), LabError> {
        let pod = self.nodes[i].pods.remove(k);
        let node = &self.nodes[i];
        if let Some(d) = &node.cri {
            d.cri.remove_pod(&pod.container_id).map_err(setup)?;
            drop(pod);
            return Ok(());
        }
        let rc = RuntimeConf::new(&pod.container_id, Some(pod.ns.path()), "eth0");
        node.runtime.del(&node.net, &rc)?;
        drop(pod);
        Ok(())
    }

    /// Adds a node to a running lab (routes of the others are updated by the
    /// agent, or by the lab in static routing).
    pub fn add_node(&mut self, spec: NodeSpec, pods: usize) -> Result<(), LabError> {
        let bridge = self.underlay_bridge()?;
        let template = match self.topo.plugin.as_ref().and_then(|p| p.config.clone()) {
            Some(path) => std::fs::read_to_string(&path)
                .map_err(|e| setup(format!("{}: {e}", path.display())))?,
            None => DEFAULT_TEMPLATE.to_string(),
        };
        let node = self.add_node_ns(&spec, bridge, &template)?;
        // A node that joins (or is re-created) may take an address that the
        // other namespaces still map to a previous node's MAC. Its
        // gratuitous ARP (arp_notify) is sent the moment eth0 goes up, and is
        // lost when the switch has not enabled the port yet (the kernel's
        // link watcher runs later, on a busy machine noticeably later); the
        // stale entry then sends the first packets to the old MAC. So: wait
        // until both ends of the uplink are operationally up, then make the
        // others forget the address, so that their next packet resolves it
        // (a broadcast ARP the new node answers).
        let port = format!("p-{}", spec.name);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(node.ns.oper_up("eth0")? && self.switch.oper_up(&port)?) {
            if Instant::now() >= deadline {
                return Err(setup(format!(
                    "node {}: its uplink did not come up within 5 s",
                    spec.name
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for other in self
            .nodes
            .iter()
            .map(|n| &n.ns)
            .chain(self.external.as_ref())
        {
            for address in spec.addresses() {
                other
                    .forget_neighbour(address)
                    .map_err(|e| setup(format!("forget {address} in {}: {e}", other.name())))?;
            }
        }
        let address = spec.address;
        self.topo.nodes.push(spec);
        self.nodes.push(node);
        let i = self.nodes.len() - 1;
        super::underlay::attach(self, super::underlay::NsRef::Node(i), address, bridge)?;
        if self.topo.masquerade == Masquerade::Node {
            nft(
                &self.nodes[i].ns,
                &node_nat_ruleset(&self.nodes[i].spec, &self.topo.cluster_cidr),
            )?;
        }
        let specs: Vec<NodeSpec> = self.topo.nodes.clone();
        match self.topo.routing {
            Routing::Static if super::underlay::routes_in_router(&self.topo) => {
                super::underlay::install_router_routes(self)?
            }
            Routing::Static => {
                install_static_routes(&self.nodes[i].ns, &self.nodes[i].spec, &specs)?
            }
            Routing::Agent => {
                self.write_nodes_file(&specs)?;
                self.start_agent(i)?;
            }
            Routing::Vxlan => super::vxlan::join(self, i)?,
        }
        self.start_containerd(i)?;
        self.add_pods(i, pods)?;
        super::services::install(self)
    }

    /// Removes a node: its pods, its agent, its namespace; the agents are
    /// told through the node list.
    pub fn remove_node(&mut self, name: &str) -> Result<(), LabError> {
        let i = self.node_index(name)?;
        self.stop_agent(i);
        if self.topo.routing == Routing::Vxlan {
            super::vxlan::leave(self, name)?;
        }
        super::underlay::detach(self, name);
        while !self.nodes[i].pods.is_empty() {
            let _ = self.remove_pod(i, 0);
        }
        if let Some(d) = self.nodes[i].cri.take() {
            d.stop();
        }
        // Namespace teardown is asynchronous in the kernel: remove the switch
        // port now, so a node of the same name can be plugged in at once.
        let port = format!("p-{name}");
        netlink(&self.switch, &format!("remove {port}"), |h| async move {
            nl::delete_link_by_name(&h, &port).await.map(|_| ())
        })?;
        self.nodes.remove(i);
        self.topo.nodes.retain(|n| n.name != name);
        if self.topo.routing == Routing::Agent {
            let specs = self.topo.nodes.clone();
            self.write_nodes_file(&specs)?;
        }
        Ok(())
    }

    pub fn node_index(&self, name: &str) -> Result<usize, LabError> {
        self.nodes
            .iter()
            .position(|n| n.spec.name == name)
            .ok_or_else(|| setup(format!("no node {name:?} in this lab")))
    }

    /// Tears everything down: agents, pods (DEL through the runtime), then
    /// every namespace. Returns how long it took.
    pub fn down(mut self) -> Duration {
        let started = Instant::now();
        for i in 0..self.nodes.len() {
            self.stop_agent(i);
        }
        // A large lab DELs a sample (the first pod of each node) through the
        // plugin; the other pods go with their namespaces, which the kernel
        // tears down in batches (a DEL per pod serialises on the kernel's
        // veth deletion: seconds for a thousand pods). Nothing is judged on
        // DEL here (`cnilab conform` and `soak` check it).
        let pods: usize = self.nodes.iter().map(|n| n.pods.len()).sum();
        let sample_only = pods > DEL_EVERY_POD_UP_TO;
        std::thread::scope(|s| {
            for node in &self.nodes {
                let del = if sample_only { 1 } else { node.pods.len() };
                for pod in node.pods.iter().take(del) {
                    s.spawn(move || {
                        if let Some(d) = &node.cri {
                            let _ = d.cri.remove_pod(&pod.container_id);
                            return;
                        }
                        let rc = RuntimeConf::new(&pod.container_id, Some(pod.ns.path()), "eth0");
                        let _ = node.runtime.del(&node.net, &rc);
                    });
                }
            }
        });
        // Then each containerd (and its shims) stops, in parallel.
        std::thread::scope(|s| {
            for node in &mut self.nodes {
                if let Some(d) = node.cri.take() {
                    s.spawn(move || d.stop());
                }
            }
        });
        drop(self.nodes);
        drop(self.extra);
        drop(self.external);
        drop(self.switch);
        started.elapsed()
    }
}

/// Labs up to this many pods DEL every pod on the way down; larger ones
/// DEL the first pod of each node (see [`Lab::down`]).
pub const DEL_EVERY_POD_UP_TO: usize = 200;

/// `name` next to the running binary if it is there, else as given (PATH).
pub fn resolve_program(name: &str) -> PathBuf {
    if !name.contains('/') {
        if let Some(dir) = own_dir() {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_template_renders_to_a_valid_config() {
        let topo = Topology::generated(2, 1).expect("topology");
        let text = render_template(DEFAULT_TEMPLATE, &topo, &topo.nodes[1], Path::new("/tmp/x"));
        let net = NetworkConfig::parse(&text, Path::new("t.conflist")).expect("valid conflist");
        assert_eq!(net.plugin_type(0), "cnilab-bridge");
        assert!(text.contains("10.244.2.0/24"));
        assert!(text.contains("\"ipMasq\":true") || text.contains("\"ipMasq\": true"));
        assert!(
            text.contains("10.244.0.0/16"),
            "cluster CIDR excluded from masquerade"
        );
    }

    #[test]
    fn unknown_or_unfilled_placeholders_are_refused_with_the_line() {
        let topo = Topology::generated(2, 1).expect("topology");
        let err =
            check_template("{\n  \"subnet\": \"{{podcidr}}\"\n}", &topo).expect_err("unknown");
        assert!(
            err.contains("line 2") && err.contains("{{podcidr}}"),
            "{err}"
        );
        assert!(err.contains("{{pod_cidr}}"), "lists the known ones: {err}");
        let err = check_template("\"{{pod_cidr6}}\"", &topo).expect_err("no IPv6 pod CIDR");
        assert!(err.contains("node1") && err.contains("IPv6"), "{err}");
        check_template(DEFAULT_TEMPLATE, &topo).expect("the bundled template is valid");
        let broken = DEFAULT_TEMPLATE.replacen("\"cniVersion\"", "cniVersion\"", 1);
        let line = 1 + DEFAULT_TEMPLATE
            [..DEFAULT_TEMPLATE.find("\"cniVersion\"").expect("cniVersion")]
            .matches('\n')
            .count();
        let err = check_template(&broken, &topo).expect_err("not JSON");
        assert!(
            err.starts_with(&format!("line {line} column")) && err.contains("not JSON"),
            "{err}"
        );
        let ptp = include_str!("../../../lab/configs/lab-ptp.conflist.tmpl");
        check_template(ptp, &topo).expect("the ptp template is valid");
    }

    /// `cnilab lab run --help` documents every placeholder the lab fills in.
    #[test]
    fn help_lists_every_placeholder() {
        use clap::CommandFactory;
        let mut cli = crate::cli::Cli::command();
        let help = cli
            .find_subcommand_mut("lab")
            .and_then(|l| l.find_subcommand_mut("run"))
            .map(|r| r.render_long_help().to_string())
            .expect("lab run");
        for (name, _) in PLACEHOLDERS {
            assert!(
                help.contains(&format!("{{{{{name}}}}}")),
                "{name} missing from:\n{help}"
            );
        }
    }

    #[test]
    fn nat_ruleset_excludes_the_cluster() {
        let topo = Topology::generated(1, 1).expect("topology");
        let rules = node_nat_ruleset(&topo.nodes[0], &topo.cluster_cidr);
        assert!(
            rules.contains("ip saddr { 10.244.1.0/24 } ip daddr != { 10.244.0.0/16 } masquerade"),
            "{rules}"
        );
    }

    #[test]
    fn nodes_file_has_the_agent_fields() {
        let topo = Topology::generated(2, 1).expect("topology");
        let v: serde_json::Value = serde_json::from_str(&nodes_file(&topo.nodes)).expect("json");
        assert_eq!(v[1]["internalIP"], "10.250.0.2");
        assert_eq!(v[1]["podCIDRs"][0], "10.244.2.0/24");
    }

    /// A dual-stack node publishes both underlay addresses, so an agent
    /// can route its IPv6 pod CIDR via its IPv6 address.
    #[test]
    fn nodes_file_names_both_families_of_a_dual_stack_node() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../lab/topologies/dual-stack.toml");
        let topo = Topology::load(&path).expect("topology");
        let v: serde_json::Value = serde_json::from_str(&nodes_file(&topo.nodes)).expect("json");
        assert_eq!(
            v[1]["internalIP"],
            serde_json::json!(["10.250.0.2", "fd00:10:250::2"])
        );
    }
}
