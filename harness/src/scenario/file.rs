//! A scenario file: a topology plus steps (check, inject a fault, expect a
//! failure with a named diagnosis, heal, expect a pass), saved as TOML under
//! `lab/scenarios/`; read and validated here, with every fault in words.
//! A scenario may start from captured nodes instead (`[capture] files`,
//! relative to the file; then only check and trace steps).

use crate::lab::topology::{line_prefix, Seg, Topology};
use crate::lab::LabError;
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub summary: String,
    /// Where the bug was reported (projects, issues): for the reader of the
    /// file; accepted, never acted on.
    #[serde(default)]
    #[allow(dead_code)]
    pub seen_in: Vec<String>,
    /// The lab's topology; a `[capture]` scenario has none (its nodes are
    /// the captured ones).
    #[serde(default = "no_topology")]
    pub topology: Topology,
    /// `[capture] files = [...]`: start from captured nodes (`cnilab
    /// capture`, paths relative to the scenario file) instead of a
    /// topology, so a captured bug becomes a regression test.
    #[serde(default)]
    pub capture: Option<CaptureSpec>,
    #[serde(rename = "step")]
    pub steps: Vec<Step>,
}

/// `[capture]`: the captured nodes a scenario starts from.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureSpec {
    pub files: Vec<PathBuf>,
}

/// The placeholder topology of a `[capture]` scenario (never built).
fn no_topology() -> Topology {
    let mut t = Topology::generated(1, 1).unwrap_or_else(|_| unreachable!("a 1x1 lab is valid"));
    t.nodes.clear();
    t
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
    /// Trace one packet (as `cnilab lab trace` does) and compare where it
    /// ends: `expect` arrived or died, and when it died, optionally the
    /// cause and the node. The kernel's drop reason is reported beside.
    Trace(TraceStep),
}

/// `do = "trace"`: FROM and TO are pods, nodes or addresses of the lab.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceStep {
    pub from: String,
    pub to: String,
    #[serde(default = "icmp")]
    pub proto: crate::trace::Proto,
    #[serde(default)]
    pub port: Option<u16>,
    pub expect: crate::trace::Verdict,
    /// The cause a death must name (`cnilab lab trace`'s ids).
    #[serde(default)]
    pub cause: Option<String>,
    /// The node it must die at.
    #[serde(default)]
    pub at: Option<String>,
}

fn icmp() -> crate::trace::Proto {
    crate::trace::Proto::Icmp
}

impl TraceStep {
    /// `trace node1-pod0 -> node2-pod0, expect died at node1 with
    /// vxlan-fdb-missing`.
    pub fn describe(&self) -> String {
        let expect = self.expect.word();
        let at = self.at.as_ref().map(|n| format!(" at {n}"));
        let cause = self.cause.as_ref().map(|c| format!(" with {c}"));
        format!(
            "trace {} -> {}{}, expect {expect}{}{}",
            self.from,
            self.to,
            crate::trace::probe_flags(self.proto, self.port, None),
            at.unwrap_or_default(),
            cause.unwrap_or_default()
        )
    }

    /// Why the step cannot be judged as written (a cause no trace names, a
    /// node not in the lab, a cause or node on a packet expected to
    /// arrive).
    fn check(&self, nodes: &[String]) -> Result<(), (&'static str, String)> {
        let dies = self.expect == crate::trace::Verdict::Died;
        if let Some(c) = &self.cause {
            if !crate::trace::CAUSES.contains(&c.as_str()) {
                return Err((
                    "cause",
                    format!(
                        "{c:?} is no cause a trace names (one of: {})",
                        crate::trace::CAUSES.join(", ")
                    ),
                ));
            }
            if !dies {
                return Err(("cause", "a cause needs expect = \"died\"".into()));
            }
        }
        if let Some(n) = &self.at {
            if !nodes.contains(n) {
                return Err(("at", format!("no node {n:?} in this scenario's topology")));
            }
            if !dies {
                return Err(("at", "a node to die at needs expect = \"died\"".into()));
            }
        }
        if self.port.is_some() && self.proto == crate::trace::Proto::Icmp {
            return Err(("port", "a port needs proto = \"tcp\" or \"udp\"".into()));
        }
        Ok(())
    }
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
            .map_err(|e| read(crate::lab::topology::explain_toml_error(&text, &e)))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if let Some(c) = scenario.capture.as_mut() {
            c.files = c.files.iter().map(|f| dir.join(f)).collect();
            scenario.check_capture(&text).map_err(read)?;
            return Ok(scenario);
        }
        scenario.topology.resolve_paths(dir);
        scenario
            .topology
            .validate_text(path, &text, &[Seg::Key("topology")])
            .map_err(|e| read(e.to_string()))?;
        scenario.check_steps(&text).map_err(read)?;
        Ok(scenario)
    }

    /// A `[capture]` scenario names files, has no `[topology]` and only
    /// check steps (the captures hold the fault).
    fn check_capture(&self, text: &str) -> Result<(), String> {
        let at = |segs: &[Seg], message: &str| format!("{}{message}", line_prefix(text, segs));
        let files = self.capture.as_ref().map(|c| c.files.len()).unwrap_or(0);
        if files == 0 {
            return Err(at(
                &[Seg::Key("capture"), Seg::Key("files")],
                "capture.files: name at least one capture file (cnilab capture -o FILE)",
            ));
        }
        if text
            .lines()
            .any(|l| l.trim_start().starts_with("[topology"))
        {
            return Err(at(
                &[Seg::Key("topology")],
                "topology: a [capture] scenario's nodes are the captured ones; remove [topology]",
            ));
        }
        for (i, step) in self.steps.iter().enumerate() {
            match step {
                Step::Check { groups, .. } => crate::lab::checks::check_groups(groups)
                    .map_err(|e| at(&[Seg::Key("step"), Seg::Index(i)], &e))?,
                // The captured nodes' names are known only once replayed:
                // a trace's `at` is judged then.
                Step::Trace(_) => {}
                _ => {
                    return Err(at(
                        &[Seg::Key("step"), Seg::Index(i), Seg::Key("do")],
                        &format!("step[{i}].do: a [capture] scenario holds its fault in the captures: use only check and trace steps"),
                    ))
                }
            }
        }
        Ok(())
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
                    crate::lab::checks::check_groups(groups).map_err(|e| at("groups", e))?;
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
                Step::Trace(t) => t.check(&nodes).map_err(|(key, e)| at(key, e))?,
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
    #[case::trace_cause(&format!("{HEAD}[[step]]\ndo = \"trace\"\nfrom = \"node1-pod0\"\nto = \"node1\"\nexpect = \"died\"\ncause = \"gremlins\"\n"), "no cause a trace names", 13)]
    #[case::trace_at(&format!("{HEAD}[[step]]\ndo = \"trace\"\nfrom = \"node1-pod0\"\nto = \"node1\"\nexpect = \"died\"\nat = \"node9\"\n"), "node9", 13)]
    #[case::trace_cause_on_arrival(&format!("{HEAD}[[step]]\ndo = \"trace\"\nfrom = \"node1-pod0\"\nto = \"node1\"\nexpect = \"arrived\"\ncause = \"no-route\"\n"), "expect = \"died\"", 13)]
    #[case::trace_port_on_icmp(&format!("{HEAD}[[step]]\ndo = \"trace\"\nfrom = \"node1-pod0\"\nto = \"node1\"\nexpect = \"arrived\"\nport = 80\n"), "proto", 13)]
    #[case::capture_with_a_fault("name = \"s\"\nsummary = \"x\"\n[capture]\nfiles = [\"n1.json\"]\n[[step]]\ndo = \"fault\"\nfault = \"ip-forward-off\"\nnode = \"node1\"\n", "only check and trace steps", 6)]
    #[case::capture_and_topology(&format!("{HEAD}[capture]\nfiles = [\"n1.json\"]\n[[step]]\ndo = \"heal\"\n"), "remove [topology]", 3)]
    #[case::capture_without_files("name = \"s\"\nsummary = \"x\"\n[capture]\nfiles = []\n[[step]]\ndo = \"check\"\nexpect = \"fail\"\n", "capture.files", 4)]
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

    /// The scenario files of `dir` (beside them: their captures' directory).
    fn shipped(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .expect("scenarios")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect()
    }

    #[test]
    fn shipped_scenarios_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/scenarios");
        for path in shipped(&dir) {
            Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Every fault of every shipped scenario reads as words naming its
    /// node, not as a Rust debug dump.
    #[test]
    fn faults_are_described_in_words() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/scenarios");
        let mut seen = 0;
        for path in shipped(&dir) {
            let s = Scenario::load(&path).expect("valid");
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

    #[test]
    fn a_capture_scenario_names_its_files_relative_to_itself() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("s.toml");
        let text = "name = \"s\"\nsummary = \"x\"\n[capture]\nfiles = [\"captures/n1.json\"]\n[[step]]\ndo = \"check\"\nexpect = \"fail\"\n";
        std::fs::write(&path, text).expect("write");
        let s = Scenario::load(&path).expect("a [capture] scenario loads");
        let files = s.capture.map(|c| c.files).unwrap_or_default();
        assert_eq!(files, vec![dir.path().join("captures/n1.json")]);
    }
}
