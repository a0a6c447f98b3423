//! Bug scenarios: a topology plus steps (check, inject a fault, expect a
//! failure with a named diagnosis, heal, expect a pass), saved as TOML under
//! `lab/scenarios/` and replayed by `cnilab scenario run`.

use super::build::{install_static_routes, nft, Lab, LabError, UpOptions};
use super::report::Report;
use super::topology::{line_prefix, NodeSpec, Seg, Topology};
use crate::netns::Netns;
use cnilab_net::{netns as plugin_netns, nl};
use ipnet::IpNet;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub summary: String,
    /// Where the bug was reported (projects, issues).
    #[serde(default)]
    pub seen_in: Vec<String>,
    pub topology: Topology,
    #[serde(rename = "step")]
    pub steps: Vec<Step>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    Pass,
    Fail,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "do", rename_all = "kebab-case")]
pub enum Step {
    /// Run the checks (optionally some groups) and compare.
    Check {
        expect: Expect,
        #[serde(default)]
        diagnosis: Option<String>,
        #[serde(default)]
        groups: Vec<String>,
    },
    /// Inject a fault.
    Fault {
        #[serde(flatten)]
        fault: Fault,
    },
    /// Undo every fault injected so far, newest first.
    Heal,
    /// Wait (for an agent to react).
    Sleep { ms: u64 },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "fault", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Fault {
    /// `node` loses its route to `peer`'s pod CIDR.
    DeleteRoute {
        node: String,
        peer: String,
    },
    /// `node` routes `peer`'s pod CIDR via a wrong address.
    StaleRoute {
        node: String,
        peer: String,
        via: IpAddr,
    },
    /// `net.ipv4.ip_forward = 0` on `node`.
    IpForwardOff {
        node: String,
    },
    /// `net.ipv6.conf.all.forwarding = 0` on `node` (dual-stack: IPv4 still works).
    Ipv6ForwardOff {
        node: String,
    },
    /// `iptables -P FORWARD DROP` on `node`, as Docker does.
    ForwardDrop {
        node: String,
    },
    /// The node's uplink gets a smaller MTU.
    Mtu {
        node: String,
        mtu: u32,
    },
    /// Every masquerade rule on `node` is flushed.
    FlushMasquerade {
        node: String,
    },
    /// `node` masquerades all pod traffic, the cluster's own included.
    MasqueradeTooBroad {
        node: String,
    },
    /// Strict reverse-path filtering on `node`.
    RpFilter {
        node: String,
    },
    /// `node` is re-created with `from`'s pod CIDR (a reused or overlapping CIDR).
    ReusePodCidr {
        node: String,
        from: String,
    },
    /// A new node joins.
    AddNode {
        name: String,
        address: IpAddr,
        pod_cidr: Vec<IpNet>,
        #[serde(default = "one")]
        pods: usize,
    },
    /// A node leaves.
    RemoveNode {
        node: String,
    },
    StopAgent {
        node: String,
    },
    StartAgent {
        node: String,
    },
    /// Routed underlay: flannel's host-gw instead of the router's routes
    /// (the router forgets the pod CIDRs; each node tries `podCIDR via nodeIP`).
    HostGw {},
    /// NAT underlay: every node's InternalIP becomes 10.0.2.15 in the node
    /// list the agents read (the Vagrant bug).
    NatInternalIp {},
    /// Every pod interface gets this MTU (an overlay whose pod MTU was not reduced).
    PodMtu {
        mtu: u32,
    },
    /// VXLAN: `node` leaves and re-joins with a new VTEP MAC; the nodes in
    /// `missed_by` miss the update and keep no FDB entry for it.
    VxlanRejoin {
        node: String,
        missed_by: Vec<String>,
    },
    /// kube-proxy's Service rules are gone from `node`.
    DnatMissing {
        node: String,
    },
    /// Hairpin mode off on the bridge port of `node`'s Service backend.
    HairpinOff {
        node: String,
    },
    /// `node`'s Service rules lack the hairpin masquerade.
    HairpinMasqueradeMissing {
        node: String,
    },
}

fn one() -> usize {
    1
}

/// How to undo a fault.
enum Undo {
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
    Shape(super::shape_faults::ShapeUndo),
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error(transparent)]
    Lab(#[from] LabError),
    #[error("step {step} ({what}): {reason}")]
    Step {
        step: usize,
        what: String,
        reason: String,
    },
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let read = |reason: String| ScenarioError::Read {
            path: path.to_path_buf(),
            reason,
        };
        let text = crate::assets::read_to_string(path).map_err(|e| read(e.to_string()))?;
        let mut scenario: Scenario = toml::from_str(&text)
            .map_err(|e| read(super::topology::explain_toml_error(&text, &e)))?;
        scenario
            .topology
            .resolve_paths(path.parent().unwrap_or(Path::new(".")));
        scenario
            .topology
            .validate_text(path, &text, &[Seg::Key("topology")])
            .map_err(|e| read(e.to_string()))?;
        scenario.check_steps(&text).map_err(read)?;
        Ok(scenario)
    }

    /// Every group a check step names exists, and every node a fault names
    /// is in the topology (or joined in an earlier step).
    fn check_steps(&self, text: &str) -> Result<(), String> {
        let mut nodes: Vec<String> = self.topology.nodes.iter().map(|n| n.name.clone()).collect();
        for (i, step) in self.steps.iter().enumerate() {
            let at = |key: &'static str, message: String| {
                format!(
                    "{}step[{i}].{key}: {message}",
                    line_prefix(text, &[Seg::Key("step"), Seg::Index(i), Seg::Key(key)])
                )
            };
            match step {
                Step::Check { groups, .. } => {
                    super::checks::check_groups(groups).map_err(|e| at("groups", e))?;
                }
                Step::Fault { fault } => {
                    if let Fault::AddNode { name, .. } = fault {
                        nodes.push(name.clone());
                    }
                    for (key, node) in fault.nodes() {
                        if !nodes.iter().any(|n| n == node) {
                            return Err(at(
                                key,
                                format!("no node {node:?} in this scenario's topology"),
                            ));
                        }
                    }
                }
                Step::Heal | Step::Sleep { .. } => {}
            }
        }
        Ok(())
    }
}

impl Fault {
    /// The fault in words, for the step log (`delete node1's route to
    /// node2's pod CIDR`), never a debug dump.
    pub fn describe(&self) -> String {
        match self {
            Fault::DeleteRoute { node, peer } => {
                format!("delete {node}'s route to {peer}'s pod CIDR")
            }
            Fault::StaleRoute { node, peer, via } => {
                format!("route {peer}'s pod CIDR on {node} via {via} (a stale next hop)")
            }
            Fault::IpForwardOff { node } => format!("turn IP forwarding off on {node}"),
            Fault::ForwardDrop { node } => {
                format!("set the FORWARD policy to DROP on {node} (as Docker does)")
            }
            Fault::Mtu { node, mtu } => format!("lower {node}'s uplink MTU to {mtu}"),
            Fault::FlushMasquerade { node } => {
                format!("flush every masquerade rule on {node}")
            }
            Fault::MasqueradeTooBroad { node } => {
                format!("make {node} masquerade all pod traffic, the cluster's own included")
            }
            Fault::RpFilter { node } => {
                format!("turn on strict reverse-path filtering on {node}")
            }
            Fault::ReusePodCidr { node, from } => {
                format!("re-create {node} with {from}'s pod CIDR")
            }
            Fault::AddNode {
                name,
                address,
                pod_cidr,
                pods: count,
            } => {
                let cidrs: Vec<String> = pod_cidr.iter().map(|c| c.to_string()).collect();
                format!(
                    "add node {name} ({address}, pod CIDR {}) with {count} pod(s)",
                    cidrs.join(", ")
                )
            }
            Fault::RemoveNode { node } => format!("remove node {node}"),
            Fault::StopAgent { node } => format!("stop the agent on {node}"),
            Fault::StartAgent { node } => format!("start the agent on {node}"),
            Fault::Ipv6ForwardOff { node } => format!("turn IPv6 forwarding off on {node}"),
            Fault::HostGw {} => {
                "replace the router's pod routes with host-gw routes on every node".to_string()
            }
            Fault::NatInternalIp {} => {
                "give every node the NAT address 10.0.2.15 as its InternalIP".to_string()
            }
            Fault::PodMtu { mtu } => format!("set every pod interface's MTU to {mtu}"),
            Fault::VxlanRejoin { node, missed_by } => format!(
                "re-join {node} with a new VTEP MAC, unseen by {}",
                missed_by.join(", ")
            ),
            Fault::DnatMissing { node } => format!("remove the Service DNAT rules on {node}"),
            Fault::HairpinOff { node } => {
                format!("turn hairpin mode off on {node}'s Service backend port")
            }
            Fault::HairpinMasqueradeMissing { node } => {
                format!("remove the hairpin masquerade from {node}'s Service rules")
            }
        }
    }

    /// The nodes this fault names, with the field that names them.
    fn nodes(&self) -> Vec<(&'static str, &String)> {
        match self {
            Fault::DeleteRoute { node, peer } | Fault::StaleRoute { node, peer, .. } => {
                vec![("node", node), ("peer", peer)]
            }
            Fault::ReusePodCidr { node, from } => vec![("node", node), ("from", from)],
            Fault::IpForwardOff { node }
            | Fault::Ipv6ForwardOff { node }
            | Fault::ForwardDrop { node }
            | Fault::Mtu { node, .. }
            | Fault::FlushMasquerade { node }
            | Fault::MasqueradeTooBroad { node }
            | Fault::RpFilter { node }
            | Fault::RemoveNode { node }
            | Fault::StopAgent { node }
            | Fault::StartAgent { node } => vec![("node", node)],
            Fault::AddNode { .. }
            | Fault::HostGw {}
            | Fault::NatInternalIp {}
            | Fault::PodMtu { .. } => Vec::new(),
            Fault::VxlanRejoin { node, missed_by } => std::iter::once(("node", node))
                .chain(missed_by.iter().map(|m| ("missed_by", m)))
                .collect(),
            Fault::DnatMissing { node }
            | Fault::HairpinOff { node }
            | Fault::HairpinMasqueradeMissing { node } => vec![("node", node)],
        }
    }
}

/// One step's outcome, for the log.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepLog {
    pub step: usize,
    pub what: String,
    pub ok: bool,
    pub detail: String,
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

fn apply(lab: &mut Lab, fault: &Fault) -> Result<Undo, LabError> {
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
        _ => Undo::Shape(super::shape_faults::apply(lab, fault)?),
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

fn undo(lab: &mut Lab, u: Undo) -> Result<(), LabError> {
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
        Undo::Shape(u) => super::shape_faults::undo(lab, u),
    }
}

/// A failed check's diagnoses as text: each distinct diagnosis once, its id
/// and what it says (`missing-route: node1 has no route …`).
fn diagnoses_text(report: &Report) -> String {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for d in report.failures.iter().flat_map(|f| &f.diagnoses) {
        if !seen.contains(&(d.id, d.message.as_str())) {
            seen.push((d.id, d.message.as_str()));
        }
    }
    if seen.is_empty() {
        return "no diagnosis".into();
    }
    let lines: Vec<String> = seen
        .iter()
        .map(|(id, message)| format!("{id}: {message}"))
        .collect();
    format!("diagnoses: {}", lines.join("; "))
}

/// The whole replay's verdict.
#[derive(Debug, serde::Serialize)]
pub struct ScenarioResult {
    pub name: String,
    pub passed: bool,
    /// Why the scenario cannot apply to this plugin (a step needed what the
    /// plugin does not make); the steps before it are in `steps`.
    pub skipped: Option<String>,
    pub steps: Vec<StepLog>,
    #[serde(skip)]
    pub last_report: Option<Report>,
}

/// Replays a scenario in a fresh lab; the lab is always torn down.
pub fn run(
    scenario: &Scenario,
    plugin_dir: Option<String>,
    log: &mut dyn FnMut(&StepLog),
) -> Result<ScenarioResult, ScenarioError> {
    run_with(scenario, plugin_dir, Default::default(), log)
}

/// [`run`] with the lab's runtime (`--runtime`).
pub fn run_with(
    scenario: &Scenario,
    plugin_dir: Option<String>,
    runtime: super::cri::RuntimeKind,
    log: &mut dyn FnMut(&StepLog),
) -> Result<ScenarioResult, ScenarioError> {
    let opts = UpOptions {
        plugin_dir,
        persistent: None,
        run_dir: super::scratch_run_dir().join(&scenario.name),
        runtime,
    };
    let mut lab = Lab::up(scenario.topology.clone(), opts)?;
    let mut undos: Vec<Undo> = Vec::new();
    let mut steps = Vec::new();
    let mut last_report = None;
    let mut error = None;
    let mut skipped = None;
    for (i, step) in scenario.steps.iter().enumerate() {
        let n = i + 1;
        let (what, outcome): (String, Result<(bool, String), LabError>) = match step {
            Step::Check {
                expect,
                diagnosis,
                groups,
            } => {
                let what = format!(
                    "check, expect {}{}",
                    if *expect == Expect::Pass {
                        "pass"
                    } else {
                        "fail"
                    },
                    diagnosis
                        .as_ref()
                        .map(|d| format!(" with {d}"))
                        .unwrap_or_default()
                );
                let outcome = super::check(&lab, groups, false).map(|report| {
                    let passed = report.passed();
                    let ids = report.diagnosis_ids();
                    let ok = match expect {
                        Expect::Pass => passed,
                        Expect::Fail => {
                            !passed
                                && diagnosis
                                    .as_ref()
                                    .is_none_or(|d| ids.iter().any(|id| id == d))
                        }
                    };
                    let detail = if passed {
                        format!("all {} probes passed", report.probes)
                    } else {
                        format!(
                            "{}/{} probes failed; {}",
                            report.failures.len(),
                            report.probes,
                            diagnoses_text(&report)
                        )
                    };
                    last_report = Some(report);
                    (ok, detail)
                });
                (what, outcome)
            }
            Step::Fault { fault } => {
                let what = format!("fault: {}", fault.describe());
                let outcome = apply(&mut lab, fault).map(|u| {
                    undos.push(u);
                    (true, "injected".to_string())
                });
                (what, outcome)
            }
            Step::Heal => {
                let mut result = Ok((true, format!("{} fault(s) undone", undos.len())));
                while let Some(u) = undos.pop() {
                    if let Err(e) = undo(&mut lab, u) {
                        result = Err(e);
                        break;
                    }
                }
                ("heal".to_string(), result)
            }
            Step::Sleep { ms } => {
                std::thread::sleep(std::time::Duration::from_millis(*ms));
                (format!("sleep {ms} ms"), Ok((true, String::new())))
            }
        };
        let entry = match outcome {
            Ok((ok, detail)) => StepLog {
                step: n,
                what,
                ok,
                detail,
            },
            Err(LabError::Unsupported(reason)) => {
                skipped = Some(reason.clone());
                StepLog {
                    step: n,
                    what,
                    ok: false,
                    detail: format!("cannot apply: {reason}"),
                }
            }
            Err(e) => {
                error = Some(ScenarioError::Step {
                    step: n,
                    what: what.clone(),
                    reason: e.to_string(),
                });
                StepLog {
                    step: n,
                    what,
                    ok: false,
                    detail: e.to_string(),
                }
            }
        };
        log(&entry);
        let stop = !entry.ok;
        steps.push(entry);
        if stop {
            break;
        }
    }
    let run_dir = lab.opts.run_dir.clone();
    lab.down();
    let _ = std::fs::remove_dir_all(&run_dir);
    if let Some(e) = error {
        return Err(e);
    }
    Ok(ScenarioResult {
        name: scenario.name.clone(),
        passed: steps.iter().all(|s| s.ok) && steps.len() == scenario.steps.len(),
        skipped,
        steps,
        last_report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "name = \"s\"\nsummary = \"x\"\n[topology]\n[[topology.node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n";

    fn load(text: &str) -> Result<Scenario, ScenarioError> {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("s.toml");
        std::fs::write(&path, text).expect("write");
        Scenario::load(&path)
    }

    #[rstest::rstest]
    #[case::unknown_group(&format!("{HEAD}[[step]]\ndo = \"check\"\nexpect = \"pass\"\ngroups = [\"pod-to-moon\"]\n"), "groups", 11)]
    #[case::unknown_node(&format!("{HEAD}[[step]]\ndo = \"fault\"\nfault = \"ip-forward-off\"\nnode = \"node9\"\n"), "node", 11)]
    #[case::unknown_peer(&format!("{HEAD}[[step]]\ndo = \"check\"\nexpect = \"pass\"\n[[step]]\ndo = \"fault\"\nfault = \"delete-route\"\nnode = \"node1\"\npeer = \"ghost\"\n"), "peer", 15)]
    #[case::topology_value(&format!("{}[[step]]\ndo = \"heal\"\n", HEAD.replace("10.250.0.1", "10.250.0.255")), "address", 6)]
    fn bad_steps_name_the_field_and_line(
        #[case] text: &str,
        #[case] field: &str,
        #[case] line: usize,
    ) {
        let msg = load(text).expect_err("refused").to_string();
        assert!(msg.contains("s.toml"), "{msg}");
        assert!(msg.contains(field), "{msg} should name {field}");
        assert!(
            msg.contains(&format!("line {line}:")),
            "{msg} should name line {line}"
        );
    }

    #[test]
    fn a_node_that_joined_can_be_named_later() {
        let text = format!("{HEAD}[[step]]\ndo = \"fault\"\nfault = \"add-node\"\nname = \"node3\"\naddress = \"10.250.0.3\"\npod_cidr = [\"10.244.3.0/24\"]\n[[step]]\ndo = \"fault\"\nfault = \"remove-node\"\nnode = \"node3\"\n");
        load(&text).expect("valid");
    }

    #[test]
    fn shipped_scenarios_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/scenarios");
        for entry in std::fs::read_dir(&dir).expect("scenarios") {
            let path = entry.expect("entry").path();
            Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Every fault of every shipped scenario reads as words naming its
    /// node, not as a Rust debug dump.
    #[test]
    fn faults_are_described_in_words() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/scenarios");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("scenarios") {
            let s = Scenario::load(&entry.expect("entry").path()).expect("valid");
            for step in &s.steps {
                if let Step::Fault { fault } = step {
                    let text = fault.describe();
                    assert!(!text.contains('{') && !text.contains("\""), "{text}");
                    for (_, node) in fault.nodes() {
                        assert!(text.contains(node.as_str()), "{text} names {node}");
                    }
                    seen += 1;
                }
            }
        }
        assert!(seen > 5, "faults seen: {seen}");
    }

    #[test]
    fn finds_masquerade_chains() {
        let text = "table inet t {\n\tset pods4 {\n\t}\n\tchain postrouting {\n\t\tip saddr @pods4 masquerade\n\t}\n\tchain other {\n\t}\n}\n";
        assert_eq!(
            chains_with_masquerade(text),
            vec!["postrouting".to_string()]
        );
    }

    #[test]
    fn scenario_files_parse() {
        let s: Scenario = toml::from_str(
            r#"
name = "x"
summary = "y"
[topology]
[[topology.node]]
name = "node1"
address = "10.250.0.1"
pod_cidr = ["10.244.1.0/24"]
[[step]]
do = "fault"
fault = "delete-route"
node = "node1"
peer = "node2"
[[step]]
do = "check"
expect = "fail"
diagnosis = "missing-route"
[[step]]
do = "heal"
"#,
        )
        .expect("parses");
        assert_eq!(s.steps.len(), 3);
        assert!(matches!(
            s.steps[0],
            Step::Fault {
                fault: Fault::DeleteRoute { .. }
            }
        ));
    }
}
